"""What ``softtopk compute`` and ``softtopk methods`` show: the report, tables, tidy CSV, JSON.

:func:`build_compute_report` runs the library (``evaluate`` per method, the hard top-k, and the
Jacobian of the rows that succeeded) and returns a :class:`ComputeReport`; the ``render_*``
functions turn it into text and never print. Big inputs are streamed into the CSV and JSON
text chunk by chunk (no Python object per value beyond one chunk); tables are capped.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.table import Table
from rich.text import Text

from topk_cli.comparison import BOUNDARY_WARNING_DIGITS, ComputeReport, MethodRun, row_label, row_title
from topk_cli.errors import InvalidArgumentError
from topk_cli.registry import ALIASES, METHODS, resolve
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

#: Tables show at most this many vectors (blocks) and entries per vector.
TABLE_MAX_BLOCKS = 20
TABLE_MAX_ENTRIES = 100
#: Tables show the Jacobian for n up to this.
TABLE_MAX_JACOBIAN_N = 8
#: At most this many per-row failure warnings; the rest are counted.
MAX_WARNINGS = 10

CSV_COLUMNS = ("row", "row_name", "entry", "label", "value", "hard", "method", "weight", "status")


def compute_warnings(report: ComputeReport) -> list[str]:
    """One line per failed (method, row), capped at :data:`MAX_WARNINGS` with a count of the rest."""
    lines: list[str] = []
    failures = [f for run in report.runs for f in run.failures]
    for failure in failures[:MAX_WARNINGS]:
        row = failure.row[0] if failure.row else 0
        level = f" at recursion level {failure.level}" if failure.level is not None else ""
        if "level" in failure.detail:
            level = ""
        hint = ""
        equivalent = resolve(failure.method).stable_equivalent
        if equivalent is not None and f"'{equivalent}'" not in failure.detail:
            hint = f"; use -m {equivalent} (the same operator, computed stably)"
        lines.append(
            f"{failure.method} failed on {row_label(report.data, row)}: {failure.code}{level}: "
            f"{failure.detail}{hint}"
        )
    if len(failures) > MAX_WARNINGS:
        lines.append(f"... and {len(failures) - MAX_WARNINGS} more failed rows (see 'status' in the output)")
    return lines + [line for run in report.runs for line in _boundary_warnings(report, run)]


def _boundary_warnings(report: ComputeReport, run: MethodRun) -> list[str]:
    """Rows on which a method with a stability model succeeded but lies at or beyond its boundary."""
    outlook = run.outlook
    if outlook is None:
        return []
    equivalent = resolve(run.method).stable_equivalent
    advice = f"; use -m {equivalent}" if equivalent else ""
    near = (run.status == "ok") & (outlook.fails | (outlook.digits_lost >= BOUNDARY_WARNING_DIGITS))
    lines = []
    for row in np.flatnonzero(near)[:MAX_WARNINGS]:
        level = int(outlook.predicted_level[row])
        where = (
            f"beyond its stability boundary (the log argument is predicted to vanish at level {level})"
            if level >= 0
            else f"close to its stability boundary (about {outlook.digits_lost[row]:.0f} of 16 digits lost)"
        )
        lines.append(
            f"{run.method} on {row_label(report.data, int(row))} is {where}; smallest 1 - p = "
            f"{outlook.min_complement[row]:.1e}{advice}"
        )
    if near.sum() > MAX_WARNINGS:
        lines.append(f"... and {int(near.sum()) - MAX_WARNINGS} more rows near {run.method}'s boundary")
    return lines


def hardness_lines(report: ComputeReport) -> list[str]:
    """Under ``--hardness``: the tau chosen for each method, or why it cannot reach the mass."""
    lines = []
    for run in report.runs:
        m = run.match
        if m is None:
            continue
        if m.status == "constant":
            lines.append(f"{run.method}: does not depend on tau ({m.reason})")
        elif m.tau is None:
            lines.append(f"{run.method}: cannot reach top-k mass {m.target:g}: {m.reason}")
        else:
            note = f" ({m.reason})" if m.status != "ok" and m.reason else ""
            lines.append(f"{run.method}: tau = {m.tau:.6g} gives mean top-k mass {m.mass:.4f}{note}")
    return lines


# ---- table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    """Text for stdout and notes for stderr (e.g. what a capped table left out)."""

    text: str
    notes: tuple[str, ...] = ()


def render_compute(report: ComputeReport, fmt: OutputFormat, *, color: bool = False) -> Rendered:
    """The report in ``fmt``: a table (capped, with notes), tidy CSV or one JSON document.

    Raises:
        InvalidArgumentError: ``--jacobian`` with CSV output.
    """
    if fmt is OutputFormat.json:
        return Rendered(render_compute_json(report))
    if fmt is OutputFormat.csv:
        if any(run.jacobian is not None for run in report.runs):
            raise InvalidArgumentError("--jacobian is available with --format json or table, not csv")
        return Rendered(render_compute_csv(report))
    return render_compute_table(report, color=color)


def render_compute_table(
    report: ComputeReport,
    *,
    color: bool = False,
    max_blocks: int = TABLE_MAX_BLOCKS,
    max_entries: int = TABLE_MAX_ENTRIES,
) -> Rendered:
    """One block per vector: label, value, hard top-k, one column per method, a sum footer."""
    data = report.data
    rows, n = data.values.shape
    notes: list[str] = []
    renderables: list[Any] = []
    shown_rows = min(rows, max_blocks)
    for r in range(shown_rows):
        renderables.append(_block(report, r, max_entries))
        if any(run.jacobian is not None for run in report.runs):
            renderables.extend(_jacobian_tables(report, r))
    if rows > shown_rows:
        notes.append(
            f"the table shows the first {shown_rows} of {rows} vectors; use --format csv or json for all"
        )
    if n > max_entries:
        notes.append(
            f"the table shows the first {max_entries} of {n} entries per vector (the sums cover all); "
            "use --format csv or json for all"
        )
    if any(run.jacobian is not None for run in report.runs) and n > TABLE_MAX_JACOBIAN_N:
        notes.append(f"the table omits Jacobians for n > {TABLE_MAX_JACOBIAN_N}; use --format json")
    notes.extend(run.jacobian_note for run in report.runs if run.jacobian_note)
    temperature = f"tau={format_float(report.tau)}" if report.hardness is None else f"top-k mass {report.hardness:g}"
    header = Text(
        f"soft top-k of {data.source}: {_k_header(report)}, {temperature}, n={n}"
        + (f", {rows} vectors" if rows > 1 else "")
    )
    if report.hardness is not None:
        header.append("\n" + "\n".join(hardness_lines(report)))
    return Rendered(_tidy(renderables_to_text([header, *renderables], color=color), color), tuple(notes))


def row_ks(report: ComputeReport) -> NDArray[np.float64] | None:
    """One k per row when the rows' k differ (``--k-column``), else None (one k, ``report.k``)."""
    return report.k if isinstance(report.k, np.ndarray) else None


def _k_text(k: float) -> str:
    return str(int(k)) if float(k).is_integer() else repr(float(k))


def _k_header(report: ComputeReport) -> str:
    ks = row_ks(report)
    if ks is None:
        return f"k={report.k}"
    column = f", column {report.data.k_column!r}" if report.data.k_column else ""
    return f"k per row ({_k_text(float(ks.min()))} to {_k_text(float(ks.max()))}{column})"


def _block(report: ComputeReport, r: int, max_entries: int) -> Table:
    data = report.data
    n = data.values.shape[1]
    title = None if data.single else row_title(data, r)
    ks = row_ks(report)
    if ks is not None:
        title = f"{title or 'the vector'}, k={_k_text(float(ks[r]))}"
    table = Table(title=title, title_justify="left", show_footer=True, header_style="bold")
    hard_sum = report.hard[r].sum()
    table.add_column("entry", footer="sum")
    table.add_column("value", justify="right")
    table.add_column("top-k", justify="right", footer=format_float(float(hard_sum)))
    for run in report.runs:
        status = str(run.status[r])
        footer = format_float(float(run.weights[r].sum())) if status == "ok" else status
        table.add_column(run.method, justify="right", footer=footer)
        if run.stderr is not None:
            table.add_column("s.e.", justify="right", footer="")
    width = sum(2 if run.stderr is not None else 1 for run in report.runs)
    for i in range(min(n, max_entries)):
        hard = report.hard[r, i]
        style = "bold" if hard > 0 else None
        cells = [data.labels[i], format_float(float(data.values[r, i])), format_float(float(hard))]
        for run in report.runs:
            cells.append(format_float(float(run.weights[r, i])))
            if run.stderr is not None:
                se = float(run.stderr[r, i])  # two significant digits: 0.002 is not 0
                cells.append(f"{se:.2g}" if math.isfinite(se) and se != 0 else format_float(se))
        table.add_row(*cells, style=style)
    if n > max_entries:
        table.add_row(f"... {n - max_entries} more", *([""] * (2 + width)))
    if report.with_sum:
        hard_top = format_float(float(np.sum(np.where(report.hard[r] > 0, report.hard[r] * data.values[r], 0.0))))
        for label, key in (("sum p*x", "sums"), ("potential", "potential")):
            cells = [label, "", hard_top]
            for run in report.runs:
                values = getattr(run, key)
                cells.append("-" if values is None else format_float(float(values[r])))
                if run.stderr is not None:
                    cells.append("")
            table.add_row(*cells, style="italic")
    return table


def _jacobian_tables(report: ComputeReport, r: int) -> list[Table]:
    data = report.data
    n = data.values.shape[1]
    if n > TABLE_MAX_JACOBIAN_N:
        return []
    tables = []
    for run in report.runs:
        if run.jacobian is None or run.status[r] != "ok":
            continue
        where = "" if data.single else f", {row_title(data, r)}"
        table = Table(title=f"Jacobian d p_i / d x_j of {run.method}{where}", title_justify="left")
        table.add_column("i \\ j")
        for j in range(n):
            table.add_column(data.labels[j], justify="right")
        for i in range(n):
            table.add_row(data.labels[i], *(format_float(float(v)) for v in run.jacobian[r, i]))
        tables.append(table)
    return tables


# ---- CSV and JSON --------------------------------------------------------------------------


def render_compute_csv(report: ComputeReport, *, with_k: bool | None = None) -> str:
    """Tidy CSV: one line per (row, method, entry) with the columns of :data:`CSV_COLUMNS`.

    A ``k`` column (each row's k) follows when the rows' k differ (``with_k`` None), or when
    ``with_k`` is True (several inputs, some with a k per row); ``stderr`` and the ``--sum``
    columns follow it.
    """
    data = report.data
    rows, n = data.values.shape
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    with_stderr = any(run.stderr is not None for run in report.runs)
    ks = row_ks(report) if with_k is None else (
        np.broadcast_to(np.asarray(report.k, dtype=np.float64), (rows,)) if with_k else None)
    extra = (("k",) if ks is not None else ()) + (("stderr",) if with_stderr else ()) + (
        ("topk_sum", "potential") if report.with_sum else ())
    writer.writerow(CSV_COLUMNS + extra)
    entries = range(n)
    chunk = 65536
    for r in range(rows):
        row_name = data.row_names[r]
        k_cell: tuple[Any, ...] = () if ks is None else (_k_cell(float(ks[r])),)
        for run in report.runs:
            status = str(run.status[r])
            tail: tuple[Any, ...] = ()
            if report.with_sum:
                tail = (
                    float(run.sums[r]) if run.sums is not None else "",
                    float(run.potential[r]) if run.potential is not None else "",
                )
            for start in range(0, n, chunk):  # chunks: Python floats for one chunk at a time
                stop = min(start + chunk, n)
                errors = run.stderr[r, start:stop].tolist() if run.stderr is not None else [""] * (stop - start)
                writer.writerows(
                    (r, row_name, i, data.labels[i], value, hard, run.method, weight, status,
                     *k_cell, *((se,) if with_stderr else ()), *tail)
                    for i, value, hard, weight, se in zip(
                        entries[start:stop],
                        data.values[r, start:stop].tolist(),
                        report.hard[r, start:stop].tolist(),
                        run.weights[r, start:stop].tolist(),
                        errors,
                        strict=True,
                    )
                )
    return buffer.getvalue()


def _k_cell(k: float) -> int | float:
    return int(k) if k.is_integer() else k


def _json_floats(values: NDArray[np.float64]) -> str:
    """A JSON array of floats (shortest round-trip repr; NaN and inf -> null), built by chunks."""
    parts = []
    finite = bool(np.isfinite(values).all())
    for start in range(0, values.size, 65536):
        chunk = values[start : start + 65536].tolist()
        if finite:
            parts.append(",".join(map(repr, chunk)))
        else:
            parts.append(",".join(repr(v) if np.isfinite(v) else "null" for v in chunk))
    return "[" + ",".join(parts) + "]"


def _json_strings(names: Sequence[str]) -> str:
    """A JSON array of strings, built by chunks (lazy index names are never all materialised)."""
    chunk = 65536
    parts = [json.dumps(list(names[start : start + chunk]))[1:-1] for start in range(0, len(names), chunk)]
    return "[" + ", ".join(parts) + "]"


def _json_matrix(values: NDArray[np.float64]) -> str:
    return "[" + ", ".join(_json_floats(row) for row in values) + "]"


def render_compute_json(report: ComputeReport) -> str:
    """One JSON document: ``{"k", "tau", "labels", "results": [{"method", "weights", "status"}]}``.

    Extra keys: ``source``, ``n``, ``rows``, ``row_names``, ``hard`` (the hard top-k), per result
    ``sums`` (of the weights) and ``failures`` (row, code, level, value, detail), ``parameters``
    (the method's extra parameters, when it has some), ``stderr`` (standard errors of a
    Monte-Carlo method), ``jacobian`` (a list per row, ``null`` for failed rows) under
    ``--jacobian``, and ``topk_sum`` (``sum_i p_i x_i`` per row) and ``potential`` (per row, or
    ``null`` for a method without one) under ``--sum``. Weights of failed rows are ``null``.
    """
    data = report.data
    rows, n = data.values.shape
    arrays: list[str] = []

    def big(text: str) -> str:  # arrays are spliced in after json.dumps of the small skeleton
        arrays.append(text)
        return f"\x00ARRAY{len(arrays) - 1}\x00"

    results = []
    for run in report.runs:
        entry: dict[str, Any] = {
            "method": run.method,
            "weights": big(_json_matrix(run.weights)),
            "status": big(json.dumps(run.status.tolist())),
            "sums": big(_json_floats(np.where(run.status == "ok", run.weights.sum(axis=1), np.nan))),
            "failures": [
                {
                    "row": f.row[0] if f.row else 0, "code": f.code, "level": f.level,
                    "value": f.value, "detail": f.detail,
                }
                for f in run.failures
            ],
        }
        if run.params:
            entry["parameters"] = dict(run.params)
        if run.stderr is not None:
            entry["stderr"] = big(_json_matrix(run.stderr))
        if report.with_sum and run.sums is not None:
            entry["topk_sum"] = big(_json_floats(run.sums))
            entry["potential"] = None if run.potential is None else big(_json_floats(run.potential))
        if run.match is not None:  # --hardness: this method's own tau
            entry.update(
                tau=run.tau, topk_mass=run.match.mass, hardness_status=run.match.status,
                hardness_reason=run.match.reason,
            )
        if run.jacobian_note is not None:
            entry["jacobian"] = None
            entry["jacobian_note"] = run.jacobian_note
        if run.jacobian is not None:
            entry["jacobian"] = [
                big(_json_matrix(run.jacobian[r])) if run.status[r] == "ok" else None for r in range(rows)
            ]
        results.append(entry)
    ks = row_ks(report)
    document = {
        "k": report.k if ks is None else [_k_cell(float(v)) for v in ks],
        "tau": report.tau if report.hardness is None else None,
        **({"hardness": report.hardness} if report.hardness is not None else {}),
        "source": data.source,
        "n": n,
        "rows": rows,
        "labels": big(_json_strings(data.labels)),
        "row_names": big(_json_strings(data.row_names)),
        "hard": big(_json_matrix(report.hard)),
        "results": results,
    }
    skeleton = render_json(document)
    pieces = skeleton.split('"\\u0000ARRAY')
    out = [pieces[0]]
    for piece in pieces[1:]:
        index, rest = piece.split('\\u0000"', 1)
        out.append(arrays[int(index)])
        out.append(rest)
    return "".join(out)


# ---- methods -------------------------------------------------------------------------------


def methods_document() -> dict[str, Any]:
    """Every registered method with its summary, family, claims, smoothness, reference, notes."""
    return {
        "methods": [
            {
                "name": spec.name,
                "summary": spec.summary,
                "family": spec.family,
                "smoothness": spec.guarantees.smoothness,
                "sparse": spec.guarantees.sparse,
                "guarantees": spec.guarantees.as_dict(),
                "reference": spec.reference,
                "notes": spec.notes,
                "evaluation": spec.capabilities.evaluation.value,
                "jacobian_available": spec.capabilities.jacobian,
                "potential": spec.capabilities.potential is not None,
                "real_k": not spec.capabilities.integer_k,
                "k_per_row": True,
                "derivative_k": not spec.capabilities.integer_k and spec.implementation.dk is not None,
                "derivative_tau": spec.capabilities.jacobian,
                "aliases": [{"name": a.name, "reference": a.reference} for a in spec.aliases],
                "parameters": [
                    {"name": p.name, "option": p.option, "type": p.kind.__name__, "default": p.default,
                     "minimum": p.minimum, "maximum": p.maximum, "help": p.help}
                    for p in spec.parameters
                ],
                "failure_codes": [{"code": f.code, "meaning": f.meaning} for f in spec.failures],
                "probe_reference": spec.probe.description,
            }
            for spec in METHODS.values()
        ],
        "aliases": dict(ALIASES),
    }


def render_methods(fmt: OutputFormat, *, color: bool = False) -> str:
    """``softtopk methods`` in ``fmt``: overview and claims tables, JSON, or one CSV line per method."""
    doc = methods_document()
    if fmt is OutputFormat.json:
        return render_json(doc)
    properties = list(doc["methods"][0]["guarantees"])
    if fmt is OutputFormat.csv:
        columns = ["name", "family", "smoothness", "sparse", *properties, "evaluation", "real_k", "derivative_k",
                   "aliases", "parameters",
                   "summary", "reference", "notes"]
        rows = [
            {**m, **m["guarantees"], "aliases": " ".join(a["name"] for a in m["aliases"]),
             "parameters": " ".join(f"{p['name']}={p['default']}" for p in m["parameters"])}
            for m in doc["methods"]
        ]
        return render_csv(rows, columns)
    overview = Table(title="Methods (softtopk compute -m NAME)", title_justify="left", header_style="bold")
    for name in ("method", "family", "smoothness", "k", "summary"):
        overview.add_column(name, overflow="fold")
    claims = Table(
        title="Claimed guarantees (checked by softtopk verify-properties)", title_justify="left",
        header_style="bold",
    )
    claims.add_column("method")
    for prop in properties:
        claims.add_column(prop, justify="center")
    sources = Table(title="References and notes", title_justify="left", header_style="bold")
    sources.add_column("method")
    sources.add_column("reference and notes", overflow="fold")
    for m in doc["methods"]:
        extras = []
        if m["evaluation"] != "exact":
            extras.append(f"({m['evaluation']})")
        if m["parameters"]:
            extras.append("options: " + ", ".join(f"{p['option']} (default {p['default']})" for p in m["parameters"]))
        summary = " ".join([m["summary"], *extras])
        k_kind = ("real" + (", d/dk" if m["derivative_k"] else "")) if m["real_k"] else "integer"
        overview.add_row(m["name"], m["family"], m["smoothness"], k_kind, summary)
        claims.add_row(m["name"], *("yes" if m["guarantees"][p] else "no" for p in properties))
        text = m["reference"]
        for alias in m["aliases"]:
            text += f"\nAlso known as {alias['name']!r} (-m {alias['name']}): {alias['reference']}"
        if m["notes"]:
            text += f"\nNote: {m['notes']}"
        sources.add_row(m["name"], text)
    return _tidy(renderables_to_text([overview, claims, sources], color=color), color)


def _tidy(text: str, color: bool) -> str:
    """Drop the trailing spaces rich pads titles with (plain text only: ANSI codes are kept as is)."""
    if color:
        return text
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


# ---- several inputs ------------------------------------------------------------------------


def compute_failure_summary(reports: Sequence[ComputeReport]) -> str:
    """The last stderr line when a method failed: each failing method and its failed rows.

    e.g. ``failed: grad-recursive on 2/6 rows; iterative on 1/6 rows`` (rows of every input).
    """
    counts: dict[str, list[int]] = {}
    for report in reports:
        for run in report.runs:
            failed, total = counts.setdefault(run.method, [0, 0])
            counts[run.method] = [failed + int((run.status != "ok").sum()), total + len(run.status)]
    parts = [f"{method} on {failed}/{total} rows" for method, (failed, total) in counts.items() if failed]
    return "failed: " + "; ".join(parts)


def render_compute_many(reports: Sequence[ComputeReport], fmt: OutputFormat, *, color: bool = False) -> Rendered:
    """Several inputs, each labelled by its source; one input renders exactly as :func:`render_compute`.

    Table: one titled section per input. CSV: a leading ``source`` column (and a ``k`` column in
    every part when some input has a k per row). JSON: ``{"k", "tau", "inputs": [<the one-input
    document of each source>]}``, the top-level ``"k"`` null unless every input has the same one k.
    """
    if len(reports) == 1:
        return render_compute(reports[0], fmt, color=color)
    parts = [render_compute(report, fmt, color=color) for report in reports]
    notes = tuple(f"{r.data.source}: {note}" for r, part in zip(reports, parts, strict=True) for note in part.notes)
    varying = any(row_ks(r) is not None for r in reports)
    if fmt is OutputFormat.csv and varying:  # one header for all: a k column in every part
        parts = [Rendered(render_compute_csv(report, with_k=True), part.notes) for report, part in zip(reports, parts, strict=True)]
    if fmt is OutputFormat.json:
        shared = reports[0].k if not varying and all(r.k == reports[0].k for r in reports) else None
        head = json.dumps({"k": shared, "tau": reports[0].tau})[:-1]
        return Rendered(head + ', "inputs": [\n' + ",\n".join(p.text.rstrip("\n") for p in parts) + "\n]}\n", notes)
    if fmt is OutputFormat.csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(("source", *next(csv.reader([parts[0].text.splitlines()[0]]))))
        for report, part in zip(reports, parts, strict=True):
            prefix = io.StringIO()
            csv.writer(prefix, lineterminator="").writerow([report.data.source])
            cell = prefix.getvalue() + ","
            out.write("".join(cell + line + "\n" for line in part.text.splitlines()[1:]))
        return Rendered(out.getvalue(), notes)
    return Rendered("\n".join(p.text for p in parts), notes)
