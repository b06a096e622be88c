"""Renderers of ``stability-probe``: failure-rate heatmaps, boundaries table, CSV and JSON."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from topk_cli.analysis.probe import REFERENCES, Boundary, CellResult, ProbeReport
from topk_cli.registry import resolve
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

#: Heatmap glyphs by failure rate: none, (0, 25%], (25%, 50%], (50%, 75%], (75%, 100%].
GLYPHS = (".", "░", "▒", "▓", "█")
_STYLES = ("green", "yellow", "dark_orange", "red", "bold red")

CSV_COLUMNS = (
    "method", "n", "k", "scale", "trials", "failures", "kinds", "unclaimed", "max_error",
    "broken", "failed_levels", "predicted", "saturation_predicted", "agreement", "level_agreement",
    "near_failures", "min_complement", "predicted_digits_lost", "max_digits_lost",
)


def _glyph(rate: float) -> int:
    return 0 if rate <= 0 else min(4, 1 + int(math.ceil(rate * 4) - 1))


def _kinds_text(kinds: dict[str, int] | Any, sep: str = ";") -> str:
    return sep.join(f"{name}={count}" for name, count in kinds.items())


def _digits(value: float) -> str:
    return f"{value:.1f}" if value < 1e6 else f"{value:.2e}"


def _scale(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _heatmap(report: ProbeReport, method: str) -> RenderableType | None:
    cells = {(c.n, c.k, c.scale): c for c in report.cells if c.method == method}
    if not cells:
        return None
    columns = sorted({(n, k) for n, k, _ in cells})
    table = Table(box=None, pad_edge=False)
    table.add_column("scale", justify="right")
    for n, k in columns:
        table.add_column(f"n={n}\nk={k}", justify="right")
    for scale in report.scales:
        row: list[RenderableType] = [f"{scale:.3g}"]
        for n, k in columns:
            cell = cells.get((n, k, scale))
            if cell is None:
                row.append("")
                continue
            level = _glyph(cell.failure_rate)
            row.append(Text(f"{GLYPHS[level] * 2}{cell.failures:>3d}", style=_STYLES[level]))
        table.add_row(*row)
    title = Text(f"\n{method}: failed trials out of {report.trials} (rows: scale; columns: n / k)", style="bold")
    return Group(title, table)


def _boundaries_table(report: ProbeReport) -> Table:
    table = Table(title="Boundaries: first failing scale per (method, n, k)", title_justify="left")
    for name in ("method", "n", "k", "first failing", "log0/log<0 seen", "predicted", "saturation model"):
        table.add_column(name, justify="left" if name == "method" else "right")
    quiet = [m for m in report.methods if all(b.first_failing_scale is None for b in report.boundaries if b.method == m)]
    for b in report.boundaries:
        if b.method in quiet:
            continue
        recursive = resolve(b.method).stability is not None
        table.add_row(
            b.method, str(b.n), str(b.k), _scale(b.first_failing_scale),
            _scale(b.first_breaking_scale) if recursive else "",
            _scale(b.predicted_scale) if recursive else "",
            _scale(b.saturation_scale) if recursive else "",
        )
    if quiet:
        table.caption = f"no failure anywhere on the grid: {', '.join(quiet)}"
        table.caption_justify = "left"
    return table


def _detection_table(report: ProbeReport) -> Table | None:
    rows = []
    for n in report.ns:  # per (n, k): from the first eventful scale to the first fully broken one
        for k in sorted({c.k for c in report.cells if c.n == n}):
            for c in (c for c in report.cells if c.detection is not None and c.n == n and c.k == k):
                d = c.detection
                if d is None or not (d.broken or d.predicted or d.near_failures):
                    continue
                rows.append(c)
                if d.broken == d.predicted == c.trials:
                    break
    if not rows:
        return None
    table = Table(
        title=(
            f"{', '.join(sorted({c.method for c in rows}))} near its boundary: observed breaks (trace) vs "
            "predicted (exact program, no recursion); levels = level:trials"
        ),
        title_justify="left",
    )
    for name in ("n", "k", "scale", "broke", "levels", "arg. before", "predicted", "agree",
                 "same level", "near", "min 1-p", "digits lost (pred.)"):
        table.add_column(name, justify="right")
    for c in rows:
        d = c.detection
        if d is None:  # filtered above; keeps the type checker informed
            continue
        levels = " ".join(f"{lvl}:{cnt}" for lvl, cnt in sorted(d.levels.items()))
        before = "-" if math.isnan(d.value_before[0]) else f"{d.value_before[0]:.1e}..{d.value_before[1]:.1e}"
        table.add_row(
            str(c.n), str(c.k), f"{c.scale:g}", f"{d.broken}/{c.trials}", levels or "-", before,
            str(d.predicted), f"{d.agreement}/{c.trials}", f"{d.level_agreement}/{d.broken}" if d.broken else "-",
            str(d.near_failures), f"{d.min_complement:.1e}", _digits(d.predicted_digits_lost),
        )
    return table


def _summary(report: ProbeReport) -> Table:
    table = Table(title="Per method: failures by kind over the grid, worst error vs reference", title_justify="left")
    for name in ("method", "failed trials", "kinds", "not claimed (not failures)", "max error", "reference"):
        table.add_column(name, justify="right" if name in ("failed trials", "max error") else "left")
    for method in report.methods:
        cells = [c for c in report.cells if c.method == method]
        kinds: dict[str, int] = {}
        unclaimed: dict[str, int] = {}
        for c in cells:
            for key, value in c.kinds.items():
                kinds[key] = kinds.get(key, 0) + value
            for key, value in c.unclaimed.items():
                unclaimed[key] = unclaimed.get(key, 0) + value
        errors = [c.max_error for c in cells if not math.isnan(c.max_error)]
        table.add_row(
            method, f"{sum(c.failures for c in cells)}/{sum(c.trials for c in cells)}",
            _kinds_text(kinds, " ") or "-", _kinds_text(unclaimed, " ") or "-",
            format_float(max(errors), 3) if errors else "-", REFERENCES.get(method, "none"),
        )
    return table


def render_probe_table(report: ProbeReport) -> list[RenderableType]:
    """Heatmaps (one per method and n), the per-method summary, detection and boundaries."""
    header = Text(
        f"stability-probe: x = {report.offset:g} + scale * {report.dist} draw (unit variance), "
        f"tau = {report.tau:g}, {report.trials} trials per cell, seed {report.seed}, "
        f"tolerance {report.tolerance:g}.\nLegend: "
        + "  ".join(f"{g} {lab}" for g, lab in zip(GLYPHS, ("0%", "<=25%", "<=50%", "<=75%", "<=100%"), strict=True))
        + "  (number = failed trials)"
    )
    parts: list[RenderableType] = [header]
    for method in report.methods:
        heat = _heatmap(report, method)
        if heat is not None:
            parts.append(heat)
    parts.append(_summary(report))
    detection = _detection_table(report)
    if detection is not None:
        parts.append(detection)
    parts.append(_boundaries_table(report))
    examples = _examples(report)
    if examples:
        parts.append(Text("First message per failure kind:\n" + "\n".join(examples)))
    parts.append(Text(
        "first failing: any failure (incl. the method's own 'cancellation' refusals); log0/log<0 seen: "
        "the recursion broke; predicted: error-amplification model; saturation model: some 1 - p < 2^-53 "
        "(float64's unit roundoff). '-' = nothing on the grid."
    ))
    return [Group(*parts)]


def _examples(report: ProbeReport) -> list[str]:
    """``method: kind: message`` for the first message of each (method, failure kind) on the grid."""
    seen: dict[tuple[str, str], str] = {}
    for c in report.cells:
        for code, message in c.examples.items():
            seen.setdefault((c.method, code), message)
    return [f"  {method}: {code}: {message}" for (method, code), message in seen.items()]


def _cell_dict(c: CellResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "method": c.method, "n": c.n, "k": c.k, "scale": c.scale, "trials": c.trials,
        "failures": c.failures, "kinds": dict(c.kinds), "unclaimed": dict(c.unclaimed),
        "max_error": None if math.isnan(c.max_error) else c.max_error,
    }
    if c.examples:
        out["examples"] = dict(c.examples)
    d = c.detection
    if d is not None:
        out["detection"] = {
            "broken": d.broken, "levels": {str(k): v for k, v in sorted(d.levels.items())},
            "value_before": None if math.isnan(d.value_before[0]) else list(d.value_before),
            "max_digits_lost": d.max_digits_lost, "near_failures": d.near_failures,
            "predicted": d.predicted, "saturation_predicted": d.saturation_predicted,
            "agreement": d.agreement, "level_agreement": d.level_agreement,
            "min_complement": d.min_complement, "predicted_digits_lost": d.predicted_digits_lost,
        }
    return out


def _boundary_dict(b: Boundary) -> dict[str, Any]:
    out: dict[str, Any] = {
        "method": b.method, "n": b.n, "k": b.k, "first_failing_scale": b.first_failing_scale,
        "predicted_scale": b.predicted_scale,
    }
    if resolve(b.method).stability is not None:
        out["first_breaking_scale"] = b.first_breaking_scale
        out["saturation_scale"] = b.saturation_scale
    return out


def probe_document(report: ProbeReport) -> dict[str, Any]:
    """The documented JSON document (``results``, ``boundaries``) plus the grid and references."""
    return {
        "grid": {
            "methods": list(report.methods), "n": list(report.ns), "k": list(report.k_specs),
            "scales": list(report.scales), "dist": report.dist, "offset": report.offset,
            "trials": report.trials, "seed": report.seed, "tau": report.tau, "tolerance": report.tolerance,
        },
        "references": {m: REFERENCES.get(m) for m in report.methods},
        "results": [_cell_dict(c) for c in report.cells],
        "boundaries": [_boundary_dict(b) for b in report.boundaries],
    }


def render_probe_json(report: ProbeReport) -> str:
    """One strict JSON document."""
    return render_json(probe_document(report))


def render_probe_csv(report: ProbeReport) -> str:
    """Tidy CSV: one row per (method, n, k, scale); kinds as ``kind=count;...``."""
    rows = []
    for c in report.cells:
        row: dict[str, Any] = {
            "method": c.method, "n": c.n, "k": c.k, "scale": c.scale, "trials": c.trials,
            "failures": c.failures, "kinds": _kinds_text(c.kinds), "unclaimed": _kinds_text(c.unclaimed),
            "max_error": None if math.isnan(c.max_error) else c.max_error,
        }
        d = c.detection
        if d is not None:
            row.update(
                broken=d.broken, failed_levels=" ".join(f"{k}:{v}" for k, v in sorted(d.levels.items())),
                predicted=d.predicted, saturation_predicted=d.saturation_predicted, agreement=d.agreement,
                level_agreement=d.level_agreement, near_failures=d.near_failures,
                min_complement=d.min_complement, predicted_digits_lost=d.predicted_digits_lost,
                max_digits_lost=None if math.isnan(d.max_digits_lost) else d.max_digits_lost,
            )
        rows.append(row)
    return render_csv(rows, CSV_COLUMNS)


def render_probe(report: ProbeReport, fmt: OutputFormat, *, color: bool) -> str:
    """The text of ``stability-probe`` in ``fmt`` (plain text without ANSI codes unless ``color``)."""
    if fmt == OutputFormat.json:
        return render_probe_json(report)
    if fmt == OutputFormat.csv:
        return render_probe_csv(report)
    return renderables_to_text(render_probe_table(report), color=color)


def strict_probe_summary(report: ProbeReport) -> str:
    """The last stderr line of a ``--strict`` failure: failed trials per method over the grid.

    e.g. ``strict: grad-recursive failed 2073/3640 trials; iterative 199/3640``.
    """
    parts: list[str] = []
    for method in report.methods:
        cells = [c for c in report.cells if c.method == method]
        failed = sum(c.failures for c in cells)
        if failed:
            total = sum(c.trials for c in cells)
            parts.append(f"{method} failed {failed}/{total} trials" if not parts else f"{method} {failed}/{total}")
    return "strict: " + "; ".join(parts)
