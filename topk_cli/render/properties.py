"""What ``softtopk verify-properties`` shows: the property matrix, counterexamples, CSV, JSON.

Never prints: every function returns text or rich renderables.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from topk_cli.properties import PropertyResult, VerifyReport
from topk_cli.properties.user import USER_PROPERTIES
from topk_cli.render.common import (
    Command,
    OutputFormat,
    format_float,
    render_csv,
    render_json,
    renderables_to_text,
)

CSV_COLUMNS = (
    "method", "property", "expected", "holds", "agrees", "worst", "smoothness", "expected_smoothness",
    "checked", "skipped", "violations", "counterexample", "detail",
)

_SHORT_CLASS = {"C-infinity": "C-inf", "C1": "C1", "C0": "C0", "discontinuous": "discont."}


def result_dict(r: PropertyResult) -> dict[str, Any]:
    """One result as the documented JSON object (plus counts, class and agreement)."""
    return {
        "method": r.method,
        "property": r.property,
        "expected": r.expected,
        "holds": r.holds,
        "agrees": r.agrees,
        "worst": r.worst,
        "counterexample": r.counterexample.as_dict() if r.counterexample else None,
        "smoothness": r.smoothness,
        "expected_smoothness": r.expected_smoothness,
        "checked": r.checked,
        "skipped": r.skipped,
        "violations": r.violations,
        "detail": r.detail,
    } | ({"within_stderr": r.within_stderr} if r.within_stderr is not None else {}) | (
        {"dtype": r.dtype, "tolerance": r.tolerance} if r.dtype is not None else {}
    )


def render_properties_json(report: VerifyReport, *, k: float | None = None) -> str:
    """``{"results": [...], ...}`` as documented in the README, with the suite description and disagreements."""
    return render_json(
        {
            "source": report.source,
            "cases": report.cases,
            "seed": report.seed,
            "trials": report.trials,
            "k": k,
            "reference": report.reference,
            "dtype": report.dtype,
            "results": [result_dict(r) for r in report.results],
            "disagreements": len(report.disagreements),
            "claim_failures": len(report.claim_failures),
        }
    )


def render_properties_csv(report: VerifyReport) -> str:
    """Tidy CSV: one row per (method, property); the counterexample as its command line."""
    rows = []
    for r in report.results:
        d = result_dict(r)
        d["counterexample"] = r.counterexample.command if r.counterexample else None
        rows.append(d)
    user = any(r.dtype is not None for r in report.results)
    return render_csv(rows, CSV_COLUMNS + (("dtype", "tolerance") if user else ()))


def _cell(r: PropertyResult | None, unclaimed: bool = False) -> Text:
    if r is None:
        return Text("")
    if r.holds is None:
        text, style = "n/a", "dim"
    elif r.property == "smooth" and r.smoothness:
        text, style = _SHORT_CLASS.get(r.smoothness, r.smoothness), "green" if r.holds else "red"
    else:
        text, style = ("yes", "green") if r.holds else ("no", "red")
    if not r.agrees and not unclaimed:
        if r.property == "smooth":
            claim = r.expected_smoothness or ("C1" if r.expected else "C0")
            text += f" (claim {_SHORT_CLASS.get(claim, claim)})"
        else:
            text += " !"
        style += " bold reverse" if r.claim_violated else " bold"
    return Text(text, style=style)


def properties_matrix(report: VerifyReport) -> Table:
    """Methods x properties: yes / no / n/a (smooth shows the measured class); ``!`` = disagrees with the claim."""
    table = Table(title="Measured properties (! = contradicts the registry's claim)", title_justify="left")
    table.add_column("method", no_wrap=True)
    for prop in report.properties:
        table.add_column(prop, no_wrap=True)
    by_key = {(r.method, r.property): r for r in report.results}
    for method in report.methods:
        unclaimed = method in report.unclaimed
        table.add_row(method, *[_cell(by_key.get((method, p)), unclaimed) for p in report.properties])
    return table


def user_operator_table(report: VerifyReport, method: str) -> Table | None:
    """A user's operator's own rows: verdict, worst, tolerance, cases checked (None without them)."""
    rows = [r for r in report.results if r.method == method and r.property in USER_PROPERTIES]
    if not rows:
        return None
    against = f" against {report.reference}" if report.reference else ""
    at = f", scores in {report.dtype}" if report.dtype != "float64" else ""
    table = Table(title=f"{method}{against}{at}", title_justify="left")
    for col in ("property", "claimed", "holds", "worst", "tolerance", "checked", "skipped"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("worst", "tolerance", "checked", "skipped") else "left")
    for r in rows:
        worst = "-" if r.worst is None else format_float(r.worst, 3)
        tol = "-" if r.tolerance is None else format_float(r.tolerance, 2)
        table.add_row(r.property, "yes" if r.expected else "no", _cell(r), worst, tol, str(r.checked), str(r.skipped))
    return table


def counterexample_table(report: VerifyReport) -> Table | None:
    """One line per failing (method, property): worst violation, what fails, and the number of
    the command that reproduces it (:func:`counterexample_commands` lists them under the table)."""
    failing = [r for r in report.results if r.holds is False]
    if not failing:
        return None
    table = Table(title="Failures: worst violation and a shrunk counterexample", title_justify="left")
    for col in ("method", "property", "claimed", "worst", "counterexample", "command"):
        table.add_column(col, overflow="fold", justify="right" if col == "worst" else "left")
    number = 0
    for r in failing:
        cex = r.counterexample
        text = cex.detail if cex else r.detail
        if cex:
            number += 1
        worst = "failed" if r.worst is None or r.worst == float("inf") else format_float(r.worst, 4)
        table.add_row(r.method, r.property, "yes" if r.expected else "no", worst, text, f"cmd {number}" if cex else "-")
    return table


def counterexample_commands(report: VerifyReport) -> list[Any]:
    """The commands that reproduce the counterexamples, each on a line of its own (never wrapped)."""
    lines: list[Any] = []
    number = 0
    for r in report.results:
        if r.holds is False and r.counterexample is not None:
            number += 1
            lines.append(Text(f"cmd {number} ({r.method}, {r.property}):"))
            lines.append(Command("  " + r.counterexample.command))
    if lines:
        lines.insert(0, Text("Commands that reproduce each counterexample:"))
    return lines


def render_properties_table(report: VerifyReport, *, color: bool = False) -> str:
    """The matrix, the counterexamples and one summary line."""
    source = (
        f"default suite ({report.cases} cases, trials={report.trials}, seed={report.seed})"
        if report.source == "suite"
        else f"{report.cases} input cases"
    )
    renderables: list[Any] = [properties_matrix(report)]
    for method in report.methods:
        own = user_operator_table(report, method)
        if own is not None:
            renderables.append(own)
    cex = counterexample_table(report)
    if cex is not None:
        renderables.append(cex)
        renderables.extend(counterexample_commands(report))
    n_dis, n_claim = len(report.disagreements), len(report.claim_failures)
    renderables.append(
        Text(
            f"Measured on the {source}. {n_dis} disagreement(s) with the registry, "
            f"{n_claim} claimed propert{'y' if n_claim == 1 else 'ies'} violated. "
            "C-inf = no discontinuity detected up to the 2nd derivative."
        )
    )
    for method in report.methods:
        if method in report.unclaimed:
            renderables.append(Text(f"{method} is a user's operator: it claims nothing (--reference METHOD holds it to "
                                    "METHOD's claims); only input-unchanged, dtype-preserved and deterministic fail --strict."))
        elif any(r.method == method and r.dtype is not None for r in report.results):
            renderables.append(Text(f"{method} is a user's operator held to the claims of {report.reference} "
                                    f"(the ! marks of its row are against {report.reference}'s claims)."))
    stochastic = sorted({(r.method, r.within_stderr) for r in report.results if r.within_stderr is not None})
    for method, within in stochastic:
        renderables.append(
            Text(
                f"{method} is a Monte-Carlo estimate: its verdicts allow {within:g} standard errors of the estimate "
                "(reported by the method) on every weight; smooth and jacobian are not measured on it."
            )
        )
    return renderables_to_text(renderables, color=color)


def render_properties(report: VerifyReport, fmt: OutputFormat, *, color: bool = False, k: float | None = None) -> str:
    """The report in ``fmt``."""
    if fmt is OutputFormat.json:
        return render_properties_json(report, k=k)
    if fmt is OutputFormat.csv:
        return render_properties_csv(report)
    return render_properties_table(report, color=color)


def strict_properties_summary(report: VerifyReport) -> str:
    """The last stderr line of a ``--strict`` failure: each method and the claims it broke.

    e.g. ``strict: thre-exp failed monotone-strict (3/40 cases); iterative failed sum (2/40 cases)``.
    """
    parts = [
        f"{r.method} failed {r.property} ({r.violations}/{r.checked} cases)" for r in report.claim_failures
    ]
    return "strict: " + "; ".join(parts)
