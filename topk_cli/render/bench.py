"""What ``softtopk bench`` shows: a table, tidy CSV (one row per method) or one JSON document.

Never prints.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text

from topk_cli.analysis.bench import BenchReport, BenchResult
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

RESULT_KEYS = (
    "method", "forward_ms", "forward_vs_exp", "forward_vs_sort", "vjp_ms", "vjp_vs_exp", "vjp_vs_forward",
    "peak_forward_mib", "peak_vjp_mib", "failed_rows", "status", "parameters", "operator_ms", "overhead_ms",
)
CSV_COLUMNS = (
    "batch", "n", "k", "tau", "dtype", "repeats", *RESULT_KEYS, "exp_ms", "sort_ms", "partition_ms", "memory_method",
)
_MIB = float(1 << 20)


def _mib(value: int | None) -> float | None:
    return None if value is None else value / _MIB


def _result_dict(r: BenchResult) -> dict[str, Any]:
    return {
        "method": r.method, "forward_ms": r.forward_ms, "forward_vs_exp": r.forward_vs_exp,
        "forward_vs_sort": r.forward_vs_sort, "vjp_ms": r.vjp_ms, "vjp_vs_exp": r.vjp_vs_exp,
        "vjp_vs_forward": r.vjp_vs_forward, "peak_forward_mib": _mib(r.peak_forward_bytes),
        "peak_vjp_mib": _mib(r.peak_vjp_bytes), "failed_rows": r.failed_rows, "status": r.status,
        "parameters": dict(r.parameters),
        "operator_ms": r.operator_ms, "overhead_ms": r.overhead_ms,
    }


def bench_document(report: BenchReport) -> dict[str, Any]:
    """The JSON document: shape, baselines (ms) and one result per method."""
    b = report.baselines
    return {
        "batch": report.batch, "n": report.n, "k": _k_json(report.k), "tau": report.tau, "dtype": report.dtype,
        "repeats": report.repeats, "seed": report.seed, "source": report.source,
        "input_mib": report.input_bytes / _MIB, "memory_method": report.memory_method,
        "baselines": {"exp_ms": b.exp_ms, "sort_ms": b.sort_ms, "partition_ms": b.partition_ms},
        "results": [_result_dict(r) for r in report.results],
    }


def _k_json(k: Any) -> Any:
    """One k as given, or one k per row (a list)."""
    if isinstance(k, np.ndarray):
        return [int(v) if float(v).is_integer() else float(v) for v in k.tolist()]
    return k


def _k_title(k: Any) -> str:
    if isinstance(k, np.ndarray):
        low, high = float(k.min()), float(k.max())
        return f"k per row ({low:g} to {high:g})"
    return f"k = {k}"


def _cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else format_float(value, digits)


def bench_table(report: BenchReport) -> Table:
    """One row per method: milliseconds, ratios to the numpy baselines, peak memory."""
    b = report.baselines
    title = (
        f"{report.batch} x {report.n}, {_k_title(report.k)}, {report.dtype}, tau = {format_float(report.tau)}: "
        f"median of {report.repeats}; np.exp {format_float(b.exp_ms, 3)} ms, np.sort {format_float(b.sort_ms, 3)} ms"
    )
    table = Table(title=title, title_justify="left")
    for name in ("method", "forward ms", "x exp", "x sort", "VJP ms", "VJP / fwd", "peak fwd MiB",
                 "peak VJP MiB", "status"):
        table.add_column(name, justify="left" if name in ("method", "status") else "right")
    for r in report.results:
        table.add_row(
            r.method, _cell(r.forward_ms), _cell(r.forward_vs_exp, 2), _cell(r.forward_vs_sort, 2),
            _cell(r.vjp_ms), _cell(r.vjp_vs_forward, 2), _cell(_mib(r.peak_forward_bytes), 2),
            _cell(_mib(r.peak_vjp_bytes), 2), r.status,
        )
    return table


def render_bench(report: BenchReport, fmt: OutputFormat, *, color: bool = False) -> str:
    """The bench report as text in ``fmt``."""
    if fmt is OutputFormat.json:
        return render_json(bench_document(report))
    if fmt is OutputFormat.csv:
        doc = bench_document(report)
        shared = {key: doc[key] for key in ("batch", "n", "k", "tau", "dtype", "repeats", "memory_method")}
        rows = [{**shared, **res, **doc["baselines"],
                 "parameters": ";".join(f"{key}={value}" for key, value in res["parameters"].items())}
                for res in doc["results"]]
        return render_csv(rows, CSV_COLUMNS)
    notes = "".join(f" {r.note}." for r in report.results if r.note)
    notes += "".join(
        f" {r.method}: {format_float(r.operator_ms, 3)} ms per forward call inside its own code, "
        f"{format_float(r.overhead_ms, 3)} ms the tool's overhead (validation, conversion, checks)."
        for r in report.results if r.operator_ms is not None and r.overhead_ms is not None
    )
    note = Text(
        f"Input {report.source}: {report.input_bytes / _MIB:.2f} MiB. x exp, x sort: time / the numpy baseline on "
        f"the same array in this run. Peak = largest extra memory traced by {report.memory_method} during one call."
        f"{notes}"
    )
    return renderables_to_text([bench_table(report), note], color=color)
