"""What ``softtopk bench --framework torch|jax`` shows: a table, tidy CSV (one row per operator) or one
JSON document. Never prints."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from topk_cli.frameworks.dropin_bench import DropinBenchReport, DropinTiming, dropin_bench_document
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

CSV_COLUMNS = (
    "framework", "batch", "n", "k", "tau", "dtype", "repeats", "operator", "forward_ms", "forward_backward_ms",
    "backward_ms", "numpy_forward_ms", "numpy_forward_backward_ms", "forward_vs_numpy", "forward_vs_softmax",
    "backward_vs_forward",
)


def _cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else format_float(value, digits)


def _rows(report: DropinBenchReport) -> list[dict[str, Any]]:
    shared = {"framework": report.framework, "batch": report.batch, "n": report.n, "k": report.k, "tau": report.tau,
              "dtype": report.dtype, "repeats": report.repeats}
    rows = []
    for r in report.results:
        rows.append({**shared, "operator": r.method, "forward_ms": r.framework.forward_ms,
                     "forward_backward_ms": r.framework.forward_backward_ms, "backward_ms": r.framework.backward_ms,
                     "numpy_forward_ms": r.numpy.forward_ms, "numpy_forward_backward_ms": r.numpy.forward_backward_ms,
                     "forward_vs_numpy": r.forward_vs_numpy, "forward_vs_softmax": r.forward_vs_softmax,
                     "backward_vs_forward": r.backward_vs_forward})
    for t in (report.topk, report.softmax):
        bwd = t.backward_ms
        rows.append({**shared, "operator": f"{report.framework} {t.name}", "forward_ms": t.forward_ms,
                     "forward_backward_ms": t.forward_backward_ms, "backward_ms": bwd,
                     "forward_vs_softmax": t.forward_ms / report.softmax.forward_ms,
                     "backward_vs_forward": None if bwd is None else bwd / t.forward_ms})
    return rows


def _baseline_row(table: Table, report: DropinBenchReport, t: DropinTiming) -> None:
    bwd = t.backward_ms
    table.add_row(f"{report.framework} {t.name}", _cell(t.forward_ms), _cell(t.forward_backward_ms),
                  _cell(None if bwd is None else bwd / t.forward_ms, 2), "-", "-", "-",
                  _cell(t.forward_ms / report.softmax.forward_ms, 2))


def dropin_bench_table(report: DropinBenchReport) -> Table:
    """One row per drop-in method, then the framework's topk and softmax."""
    threads = f", {report.threads} threads" if report.threads is not None else ""
    how = "eager" if report.framework == "torch" else "jax.jit"
    title = (
        f"{report.framework} {report.version} ({report.device}{threads}, {how}), {report.batch} x {report.n}, "
        f"k = {report.k}, {report.dtype}, tau = {format_float(report.tau)}: median of {report.repeats}"
    )
    table = Table(title=title, title_justify="left")
    for name in ("operator", "fwd ms", "fwd+bwd ms", "bwd / fwd", "numpy fwd ms", "numpy fwd+VJP ms",
                 "fwd / numpy", "fwd / softmax"):
        table.add_column(name, justify="left" if name == "operator" else "right")
    for r in report.results:
        table.add_row(r.method, _cell(r.framework.forward_ms), _cell(r.framework.forward_backward_ms),
                      _cell(r.backward_vs_forward, 2), _cell(r.numpy.forward_ms), _cell(r.numpy.forward_backward_ms),
                      _cell(r.forward_vs_numpy, 2), _cell(r.forward_vs_softmax, 2))
    _baseline_row(table, report, report.topk)
    _baseline_row(table, report, report.softmax)
    return table


def render_dropin_bench(report: DropinBenchReport, fmt: OutputFormat, *, color: bool = False) -> str:
    """The report as text in ``fmt``."""
    if fmt is OutputFormat.json:
        return render_json(dropin_bench_document(report))
    if fmt is OutputFormat.csv:
        return render_csv(_rows(report), CSV_COLUMNS)
    note = Text(
        f"Input {report.source}. fwd: soft_topk; fwd+bwd: the gradient of sum(p * v) with respect to x; "
        f"bwd = fwd+bwd - fwd. numpy: topk_cli.evaluate and topk_cli.vjp on the same array in this run. "
        f"topk at ceil(k), backward through its values; softmax along the last axis."
    )
    if any(t.forward_backward_ms is not None and t.forward_backward_ms < t.forward_ms
           for t in (*(r.framework for r in report.results), report.topk, report.softmax)):
        note.append(
            " Where fwd+bwd is below fwd (bwd / fwd shown as 0), that is the timings' noise"
            + (", or XLA leaving out a forward the gradient does not read (hard: its gradient with respect "
               "to x is 0)." if report.framework == "jax" else ".")
        )
    return renderables_to_text([dropin_bench_table(report), note], color=color)
