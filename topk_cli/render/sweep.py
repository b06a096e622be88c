"""What ``softtopk temperature-sweep`` shows: tables, a terminal chart, CSV, JSON, a PNG plot.

Never prints. matplotlib is imported only inside :func:`render_plot_png` (an optional extra).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from topk_cli.analysis.sweep import SweepResult
from topk_cli.errors import InvalidArgumentError
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

POINT_KEYS = (
    "l1_to_hard", "topk_mass", "max_entry_error", "entropy", "jacobian_norm", "small_gradient_fraction",
)
CSV_COLUMNS = ("method", "tau", *POINT_KEYS, "status", "jacobian_status")
_BARS = " ▁▂▃▄▅▆▇█"


def _vector(v: Sequence[float] | None) -> str:
    return "-" if v is None else "[" + ", ".join(format_float(x, 4) for x in v) + "]"


def sweep_document(result: SweepResult) -> dict[str, Any]:
    """The documented JSON document (``results``, ``limits``) plus input, grid and matches."""
    return {
        "k": result.k,
        "x": list(result.x),
        "hard": list(result.hard),
        "taus": list(result.taus),
        "results": [
            {
                "method": p.method, "tau": p.tau, **{key: getattr(p, key) for key in POINT_KEYS},
                "status": p.status, "jacobian_status": p.jacobian_status,
            }
            for p in result.points
        ],
        "limits": [
            {
                "method": lim.method,
                "converges": lim.converges,
                "limit": list(lim.limit) if lim.limit is not None else None,
                "limit_tau": lim.limit_tau,
                "limit_status": lim.limit_status,
                "limit_error": lim.limit_error,
                "infinity_limit": list(lim.infinity_limit) if lim.infinity_limit is not None else None,
                "infinity_tau": lim.infinity_tau,
                "uniform_at_infinity": lim.uniform_at_infinity,
            }
            for lim in result.limits
        ],
        "matches": [
            {"method": m.method, "target": m.target, "tau": m.tau, "topk_mass": m.topk_mass} for m in result.matches
        ],
        "hardness": [
            {
                "method": hm.method, "target": hm.target, "tau": hm.tau, "hardness_status": hm.status,
                "reason": hm.reason, "topk_mass": hm.mass,
                **{key: getattr(p, key) if p is not None else None for key in POINT_KEYS if key != "topk_mass"},
                "status": p.status if p is not None else hm.status,
            }
            for hm, p in result.at_hardness
        ],
    }


def render_sweep_json(result: SweepResult) -> str:
    """One strict JSON document."""
    return render_json(sweep_document(result))


def render_sweep_csv(result: SweepResult) -> str:
    """Tidy CSV: one row per (method, tau)."""
    return render_csv(sweep_document(result)["results"], CSV_COLUMNS)


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else format_float(v, digits)


def points_table(result: SweepResult) -> Table:
    """One row per (method, tau)."""
    table = Table(title=f"Temperature sweep, k = {result.k}, x = {_vector(result.x)}", title_justify="left")
    for col in ("method", "tau", "L1 to hard", "top-k mass", "max entry err", "entropy", "||J||_F", "dead grad", "status"):
        table.add_column(col, justify="left" if col in ("method", "status") else "right", no_wrap=True)
    previous = None
    for p in result.points:
        table.add_row(
            p.method if p.method != previous else "",
            format_float(p.tau, 4),
            _num(p.l1_to_hard), _num(p.topk_mass), _num(p.max_entry_error), _num(p.entropy),
            _num(p.jacobian_norm), _num(p.small_gradient_fraction, 2),
            Text(
                p.status if p.jacobian_status in ("ok", p.status) else f"{p.status} (J: {p.jacobian_status})",
                style="green" if p.status == "ok" and p.jacobian_status == "ok" else "red",
            ),
            end_section=False,
        )
        previous = p.method
    return table


def limits_table(result: SweepResult) -> Table:
    """tau -> 0 and tau -> infinity limits per method."""
    table = Table(title=f"Limits (hard top-k = {_vector(result.hard)})", title_justify="left")
    for col in ("method", "-> hard top-k", "limit as tau -> 0", "limit as tau -> inf", "k/n at inf"):
        table.add_column(col, no_wrap=True)
    for lim in result.limits:
        if lim.converges is None:
            conv = Text(f"failed ({lim.limit_status})", style="red")
        else:
            conv = Text("yes" if lim.converges else "NO", style="green" if lim.converges else "bold red")
        uniform = "-" if lim.uniform_at_infinity is None else ("yes" if lim.uniform_at_infinity else "no")
        table.add_row(lim.method, conv, _vector(lim.limit), _vector(lim.infinity_limit), uniform)
    return table


def matches_table(result: SweepResult) -> Table | None:
    """``--match``: the tau of each method at the target top-k mass."""
    if not result.matches:
        return None
    target = result.matches[0].target
    table = Table(title=f"Temperature reaching top-k mass {target:g}", title_justify="left")
    table.add_column("method")
    table.add_column("tau", justify="right")
    table.add_column("top-k mass", justify="right")
    for m in result.matches:
        table.add_row(m.method, _num(m.tau, 6) if m.tau is not None else "unreachable", _num(m.topk_mass, 6))
    return table


def hardness_table(result: SweepResult) -> Table | None:
    """``--hardness``: each method at its own tau of equal top-k mass (or why it cannot get there)."""
    if not result.at_hardness:
        return None
    target = result.at_hardness[0][0].target
    table = Table(title=f"At equal hardness: the largest tau giving top-k mass {target:g}", title_justify="left")
    for col in ("method", "tau", "top-k mass", "L1 to hard", "entropy", "||J||_F", "dead grad", "note"):
        table.add_column(col, justify="left" if col in ("method", "note") else "right", no_wrap=True)
    for hm, p in result.at_hardness:
        if p is None:
            table.add_row(hm.method, "-", _num(hm.mass), "-", "-", "-", "-", Text(hm.reason, style="red" if hm.status == "unreachable" else ""))
            continue
        note = hm.reason if hm.status != "ok" else ("" if p.status == "ok" else p.status)
        table.add_row(
            hm.method, _num(hm.tau, 6), _num(p.topk_mass, 6), _num(p.l1_to_hard), _num(p.entropy),
            _num(p.jacobian_norm), _num(p.small_gradient_fraction, 2), note,
        )
    return table


def sparkline(values: Sequence[float | None], lo: float, hi: float) -> str:
    """One character per value on a log scale between ``lo`` and ``hi``; ``x`` = failed, `` `` = 0.

    >>> sparkline([1e-3, 1e-2, 1e-1, None, 0.0], 1e-3, 1e-1)
    '▁▅█x '
    """
    out = []
    span = math.log10(hi) - math.log10(lo) if hi > lo > 0 else 0.0
    for v in values:
        if v is None:
            out.append("x")
        elif v <= 0 or not math.isfinite(v):
            out.append(" ")
        elif span == 0:
            out.append(_BARS[-1])
        else:
            level = (math.log10(max(min(v, hi), lo)) - math.log10(lo)) / span
            out.append(_BARS[1 + min(7, int(level * 7 + 0.5))])
    return "".join(out)


def chart_table(result: SweepResult) -> Table:
    """Sparklines of L1-to-hard and Jacobian norm against tau (log scales shared by all methods)."""
    taus = result.taus
    table = Table(
        title=f"Trade-off across tau = {format_float(taus[0], 3)} .. {format_float(taus[-1], 3)} (log scales over 12 decades at most; x = failed, blank = 0)",
        title_justify="left",
    )
    table.add_column("method", no_wrap=True)
    keys = ("l1_to_hard", "jacobian_norm")
    bounds = {}
    for key in keys:
        vals = [v for m in _methods(result) for v in result.series(m, key) if v is not None and v > 0]
        bounds[key] = (max(min(vals), max(vals) * 1e-12), max(vals)) if vals else (1.0, 1.0)  # 12 decades
        lo, hi = bounds[key]
        name = "L1 to hard (approximation error)" if key == "l1_to_hard" else "||J||_F (gradient signal)"
        table.add_column(f"{name}\n{format_float(lo, 2)} .. {format_float(hi, 2)}", no_wrap=True)
    for m in _methods(result):
        table.add_row(m, *[sparkline(result.series(m, key), *bounds[key]) for key in keys])
    return table


def _methods(result: SweepResult) -> list[str]:
    return list(dict.fromkeys(p.method for p in result.points))


def render_sweep_table(result: SweepResult, *, color: bool = False) -> str:
    """Points, limits, matches and the terminal chart."""
    renderables: list[Any] = [points_table(result), limits_table(result)]
    match = matches_table(result)
    if match is not None:
        renderables.append(match)
    at_hardness = hardness_table(result)
    if at_hardness is not None:
        renderables.append(at_hardness)
    renderables.append(chart_table(result))
    renderables.append(
        Text("dead grad = share of inputs whose Jacobian column has norm < 1e-8 (they receive no gradient).")
    )
    return renderables_to_text(renderables, color=color)


def render_sweep(result: SweepResult, fmt: OutputFormat, *, color: bool = False) -> str:
    """The sweep in ``fmt``."""
    if fmt is OutputFormat.json:
        return render_sweep_json(result)
    if fmt is OutputFormat.csv:
        return render_sweep_csv(result)
    return render_sweep_table(result, color=color)


def render_plot_png(result: SweepResult, image_format: str = "png") -> bytes:
    """PNG bytes: approximation error against gradient signal (one curve per method, tau as
    the curve parameter), and both against tau.

    Raises:
        InvalidArgumentError: matplotlib is not installed (``pip install 'softtopk[plot]'``).
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
    except ImportError:
        raise InvalidArgumentError(
            "--plot needs matplotlib, which is not installed: pip install 'softtopk[plot]' (or pip install matplotlib)"
        ) from None
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax_trade, ax_err, ax_grad = fig.subplots(1, 3)
    for m in _methods(result):
        pts = [p for p in result.points if p.method == m and p.l1_to_hard is not None and p.jacobian_norm is not None]
        if not pts:
            continue
        taus = [p.tau for p in pts]
        err = [max(p.l1_to_hard or 0.0, 1e-17) for p in pts]
        grad = [max(p.jacobian_norm or 0.0, 1e-17) for p in pts]
        (line,) = ax_trade.loglog(err, grad, marker="o", markersize=3, label=m)
        ax_err.loglog(taus, err, marker="o", markersize=3, color=line.get_color(), label=m)
        ax_grad.loglog(taus, grad, marker="o", markersize=3, color=line.get_color(), label=m)
    ax_trade.set(xlabel="L1 distance to hard top-k", ylabel="||dp/dx||_F", title="error vs gradient signal")
    ax_err.set(xlabel="tau", ylabel="L1 distance to hard top-k", title="approximation error")
    ax_grad.set(xlabel="tau", ylabel="||dp/dx||_F", title="gradient signal")
    ax_trade.legend(fontsize=7)
    fig.suptitle(f"softtopk temperature-sweep, k = {result.k}, n = {len(result.x)}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format=image_format, dpi=120)  # png, svg or pdf (the --plot suffix)
    return buffer.getvalue()
