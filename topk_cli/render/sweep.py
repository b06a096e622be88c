"""What ``softtopk temperature-sweep`` shows: tables, a terminal chart, CSV, JSON, a PNG plot.

Never prints. matplotlib is imported only inside :func:`render_plot_png` (an optional extra).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from topk_cli.analysis.sweep import SweepPoint, SweepResult
from topk_cli.errors import InvalidArgumentError
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

POINT_KEYS = (
    "l1_to_hard", "topk_mass", "max_entry_error", "entropy", "jacobian_norm", "small_gradient_fraction",
)
#: The tidy CSV: one row per measurement, ``kind`` saying which: ``point`` (a method at a grid
#: tau), ``limit`` (its limits; ``tau`` is the tau of the tau -> 0 limit, the vectors are JSON
#: text), ``match`` (``--match``) and ``hardness`` (``--hardness``: the measurements at that tau).
#: The first columns are those of the points, in their original order.
CSV_COLUMNS = (
    "method", "tau", *POINT_KEYS, "status", "jacobian_status", "kind", "failed_rows", "target",
    "hardness_status", "reason", "converges", "limit_error", "uniform_at_infinity", "infinity_tau",
    "limit", "infinity_limit",
)
#: How a batch is aggregated (stated in the table and the JSON document).
AGGREGATE = (
    "mean over rows of each row's value (max entry err: max over rows and entries); "
    "rows a method cannot compute are left out and counted in failed_rows"
)
_BARS = " ▁▂▃▄▅▆▇█"



def k_title(result: SweepResult) -> str:
    """``k = 2``, or ``k per row (1 to 3)`` for a batch with one k per row."""
    if isinstance(result.k, tuple):
        return f"k per row ({min(result.k):g} to {max(result.k):g})"
    return f"k = {result.k}"

def _vector(v: Sequence[float] | None) -> str:
    return "-" if v is None else "[" + ", ".join(format_float(x, 4) for x in v) + "]"


def _rows(rows: Sequence[Sequence[float] | None]) -> list[list[float] | None]:
    return [list(r) if r is not None else None for r in rows]


def _limit_vectors(result: SweepResult, single: Sequence[float] | None, rows: Sequence[Sequence[float] | None]) -> Any:
    """The vector of a single-vector sweep; one vector per row (None where failed) for a batch."""
    if result.batch:
        return _rows(rows)
    return list(single) if single is not None else None


def sweep_document(result: SweepResult) -> dict[str, Any]:
    """The documented JSON document (``results``, ``limits``) plus input, grid and matches.

    For a batch, ``x`` and ``hard`` (and each limit vector) are lists of rows, and ``aggregate``
    says how the measurements combine the rows.
    """
    return {
        "k": list(result.k) if isinstance(result.k, tuple) else result.k,
        "x": _rows(result.rows) if result.batch else list(result.x),
        "hard": _rows(result.hard_rows) if result.batch else list(result.hard),
        "rows": len(result.rows) if result.rows else 1,
        "aggregate": AGGREGATE if result.batch else None,
        "taus": list(result.taus),
        "results": [
            {
                "method": p.method, "tau": p.tau, **{key: getattr(p, key) for key in POINT_KEYS},
                "status": p.status, "jacobian_status": p.jacobian_status, "failed_rows": p.failed_rows,
            }
            for p in result.points
        ],
        "limits": [
            {
                "method": lim.method,
                "converges": lim.converges,
                "limit": _limit_vectors(result, lim.limit, lim.limit_rows),
                "limit_tau": lim.limit_tau,
                "limit_status": lim.limit_status,
                "limit_error": lim.limit_error,
                "infinity_limit": _limit_vectors(result, lim.infinity_limit, lim.infinity_rows),
                "infinity_tau": lim.infinity_tau,
                "uniform_at_infinity": lim.uniform_at_infinity,
            }
            for lim in result.limits
        ],
        "matches": [
            {
                "method": m.method, "target": m.target, "tau": m.tau, "topk_mass": m.topk_mass,
                "status": m.status, "reason": m.reason,
            }
            for m in result.matches
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
    """Tidy CSV: one row per measurement (see :data:`CSV_COLUMNS`): the grid, limits, matches."""
    doc = sweep_document(result)
    rows: list[dict[str, Any]] = [{**r, "kind": "point"} for r in doc["results"]]
    for lim in doc["limits"]:
        rows.append({
            "kind": "limit", "method": lim["method"], "tau": lim["limit_tau"], "status": lim["limit_status"],
            "converges": lim["converges"], "limit_error": lim["limit_error"],
            "uniform_at_infinity": lim["uniform_at_infinity"], "infinity_tau": lim["infinity_tau"],
            "limit": json.dumps(lim["limit"]), "infinity_limit": json.dumps(lim["infinity_limit"]),
        })
    for m in doc["matches"]:
        rows.append({
            "kind": "match", "method": m["method"], "tau": m["tau"], "topk_mass": m["topk_mass"],
            "target": m["target"], "hardness_status": m["status"], "reason": m["reason"],
        })
    for h in doc["hardness"]:
        rows.append({**h, "kind": "hardness"})
    return render_csv(rows, CSV_COLUMNS)


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else format_float(v, digits)


def _input(result: SweepResult) -> str:
    if result.batch:
        return f"{len(result.rows)} rows x n = {len(result.rows[0])}, means over rows"
    return f"x = {_vector(result.x)}"


def _point_status(result: SweepResult, p: SweepPoint) -> str:
    text = p.status if p.jacobian_status in ("ok", p.status) else f"{p.status} (J: {p.jacobian_status})"
    if result.batch and p.failed_rows:
        text += f" ({p.failed_rows}/{len(result.rows)} rows)"
    return text


def points_table(result: SweepResult) -> Table:
    """One row per (method, tau)."""
    table = Table(title=f"Temperature sweep, {k_title(result)}, {_input(result)}", title_justify="left")
    for col in ("method", "tau", "L1 to hard", "top-k mass", "max entry err", "entropy", "||J||_F", "dead grad", "status"):
        table.add_column(col, justify="left" if col in ("method", "status") else "right", no_wrap=True)
    previous = None
    for p in result.points:
        table.add_row(
            p.method if p.method != previous else "",
            format_float(p.tau, 4),
            _num(p.l1_to_hard), _num(p.topk_mass), _num(p.max_entry_error), _num(p.entropy),
            _num(p.jacobian_norm), _num(p.small_gradient_fraction, 2),
            Text(_point_status(result, p), style="green" if p.status == "ok" and p.jacobian_status == "ok" else "red"),
            end_section=False,
        )
        previous = p.method
    return table


def limits_table(result: SweepResult) -> Table:
    """tau -> 0 and tau -> infinity limits per method."""
    if result.batch:
        title = f"Limits over all {len(result.rows)} rows (the vectors per row: --format json)"
        columns: tuple[str, ...] = ("method", "-> hard top-k", "max error at tau -> 0", "k/n at inf")
    else:
        title = f"Limits (hard top-k = {_vector(result.hard)})"
        columns = ("method", "-> hard top-k", "limit as tau -> 0", "limit as tau -> inf", "k/n at inf")
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, no_wrap=True, justify="right" if col.startswith("max error") else "left")
    for lim in result.limits:
        if lim.converges is None:
            conv = Text(f"failed ({lim.limit_status})", style="red")
        else:
            conv = Text("yes" if lim.converges else "NO", style="green" if lim.converges else "bold red")
        uniform = "-" if lim.uniform_at_infinity is None else ("yes" if lim.uniform_at_infinity else "no")
        if result.batch:
            table.add_row(lim.method, conv, _num(lim.limit_error, 2), uniform)
        else:
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
    table.add_column("note")
    for m in result.matches:
        tau = _num(m.tau, 6) if m.tau is not None else ("-" if m.status == "constant" else "unreachable")
        table.add_row(m.method, tau, _num(m.topk_mass, 6), m.reason if m.status != "ok" else "")
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


#: A log axis of the PNG spans at most this many decades below its largest value.
PLOT_DECADES = 16


def _floor(values: Sequence[float]) -> float:
    """The bottom of a log axis: a decade below the smallest positive value, but at most
    :data:`PLOT_DECADES` below the largest; exact zeros and smaller values are drawn on it."""
    positive = [v for v in values if v > 0]
    if not positive:
        return 1e-17
    return max(min(positive) / 10.0, max(positive) * 10.0 ** -PLOT_DECADES)


def _is_constant(values: Sequence[float]) -> bool:
    return len(values) > 1 and max(values) == min(values)


def sweep_figure(result: SweepResult) -> Any:
    """A matplotlib ``Figure``: error against gradient signal (tau the curve parameter), and both
    against tau; one style per method (:mod:`topk_cli.render.styles`).

    A method whose measurement does not change with tau (the hard top-k: error 0, Jacobian 0)
    is not drawn in that panel (a footnote names it); a panel with nothing to draw is left out.
    Exact zeros, which a log axis cannot show, and values more than :data:`PLOT_DECADES` decades
    below the largest are drawn on a labelled floor line. Under
    ``--hardness`` each method's point at its own tau is ringed; under ``--match`` a tick on the
    tau axes marks each method's tau.

    Raises:
        InvalidArgumentError: matplotlib is not installed (``pip install 'softtopk[plot]'``).
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
        from matplotlib.lines import Line2D
    except ImportError:
        raise InvalidArgumentError(
            "--plot needs matplotlib, which is not installed: pip install 'softtopk[plot]' (or pip install matplotlib)"
        ) from None
    from topk_cli.render.styles import method_styles

    methods = _methods(result)
    styles = method_styles(methods)
    series: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for m in methods:
        pts = [p for p in result.points if p.method == m and p.l1_to_hard is not None and p.jacobian_norm is not None]
        series[m] = ([p.tau for p in pts], [p.l1_to_hard or 0.0 for p in pts], [p.jacobian_norm or 0.0 for p in pts])
    err_all = [v for _, e, _ in series.values() for v in e]
    grad_all = [v for _, _, g in series.values() for v in g]
    hardness = [(hm, p) for hm, p in result.at_hardness if p is not None and p.l1_to_hard is not None and p.jacobian_norm is not None]
    err_all += [p.l1_to_hard or 0.0 for _, p in hardness]
    grad_all += [p.jacobian_norm or 0.0 for _, p in hardness]
    err_floor, grad_floor = _floor(err_all), _floor(grad_all)
    # per panel: the methods drawn (a measurement constant in tau says nothing about the trade-off)
    draw_err = [m for m in methods if series[m][0] and not _is_constant(series[m][1])]
    draw_grad = [m for m in methods if series[m][0] and not _is_constant(series[m][2])]
    draw_trade = [m for m in methods if m in draw_err or m in draw_grad]
    panels = [(name, ms) for name, ms in (("trade", draw_trade), ("err", draw_err), ("jac", draw_grad)) if ms]
    fig = Figure(figsize=(4.3 * max(len(panels), 1) + 2.2, 4.6), layout="constrained")
    if not panels:  # nothing varies with tau: say so instead of drawing empty axes
        fig.text(0.5, 0.5, "no method's measurements change across this tau grid", ha="center", va="center")
    axes = fig.subplots(1, len(panels), squeeze=False)[0] if panels else []

    def pos(values: Sequence[float], floor: float) -> list[float]:
        return [max(v, floor) for v in values]

    used_floor = {"err": False, "jac": False}
    for ax, (name, drawn) in zip(axes, panels, strict=True):
        for m in drawn:
            taus, err, grad = series[m]
            style = styles[m].kwargs()
            if name == "trade":
                ax.plot(pos(err, err_floor), pos(grad, grad_floor), markersize=4, label=m, **style)
                used_floor["err"] |= any(v <= err_floor for v in err)
                used_floor["jac"] |= any(v <= grad_floor for v in grad)
            else:
                values = err if name == "err" else grad
                ax.plot(taus, pos(values, err_floor if name == "err" else grad_floor), markersize=4, label=m, **style)
                used_floor[name] |= any(v <= (err_floor if name == "err" else grad_floor) for v in values)
        for hm, p in hardness:
            if hm.method not in drawn:
                continue
            e, g = p.l1_to_hard or 0.0, p.jacobian_norm or 0.0
            xy = {
                "trade": (max(e, err_floor), max(g, grad_floor)),
                "err": (p.tau, max(e, err_floor)),
                "jac": (p.tau, max(g, grad_floor)),
            }[name]
            ax.plot(*xy, marker="o", markersize=11, markerfacecolor="none", markeredgewidth=1.6,
                    color=styles[hm.method].color, linestyle="none")
        if name != "trade":
            for mt in result.matches:
                if mt.tau is not None and mt.method in drawn:
                    ax.plot(mt.tau, 0.0, marker="|", markersize=14, markeredgewidth=2, color=styles[mt.method].color,
                            transform=ax.get_xaxis_transform(), clip_on=False, linestyle="none")
        ax.set_xscale("log")
        ax.set_yscale("log")
        if name == "trade":
            ax.set(xlabel="L1 distance to hard top-k", ylabel="||dp/dx||_F", title="error vs gradient signal")
        elif name == "err":
            ax.set(xlabel="tau", ylabel="L1 distance to hard top-k", title="approximation error")
        else:
            ax.set(xlabel="tau", ylabel="||dp/dx||_F", title="gradient signal")
        floors = []
        if name in ("trade", "err") and used_floor["err"]:
            floors.append(("x" if name == "trade" else "y", err_floor))
        if name in ("trade", "jac") and used_floor["jac"]:
            floors.append(("y", grad_floor))
        for axis, floor in floors:
            line = ax.axvline if axis == "x" else ax.axhline
            line(floor, color="grey", lw=0.8, ls=":")
            label = f"<= {floor:.0e} (incl. exact 0)"
            if axis == "y":
                ax.annotate(label, (0.01, floor), xycoords=("axes fraction", "data"), xytext=(0, 2),
                            textcoords="offset points", fontsize=7, color="grey", va="bottom")
            else:
                ax.annotate(label, (floor, 0.99), xycoords=("data", "axes fraction"), xytext=(2, 0),
                            textcoords="offset points", fontsize=7, color="grey", rotation=90, va="top")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    handles = [Line2D([], [], markersize=5, label=m, **styles[m].kwargs()) for m in methods if any(m in d for _, d in panels)]
    if hardness:
        handles.append(Line2D([], [], marker="o", markersize=9, markerfacecolor="none", color="black", linestyle="none",
                              label=f"at top-k mass {hardness[0][0].target:g}"))
    if any(mt.tau is not None for mt in result.matches):
        handles.append(Line2D([], [], marker="|", markersize=10, markeredgewidth=2, color="black", linestyle="none",
                              label=f"tau of top-k mass {result.matches[0].target:g}"))
    if handles:
        fig.legend(handles=handles, loc="outside right center", fontsize=8)
    skipped = [m for m in methods if series[m][0] and not any(m in d for _, d in panels)]
    partly = [m for m in methods if series[m][0] and m not in skipped and not all(m in d for _, d in panels)]
    notes = []
    if skipped:
        notes.append(f"not drawn (constant in tau): {', '.join(skipped)}")
    if partly:
        notes.append(f"drawn only where they vary with tau: {', '.join(partly)}")
    failed = [m for m in methods if not series[m][0]]
    if failed:
        notes.append(f"failed at every tau: {', '.join(failed)}")
    gaps = [m for m in methods if series[m][0] and len(series[m][0]) < len(result.taus)]
    if gaps:
        notes.append(f"not drawn where they fail: {', '.join(gaps)}")
    shape = f"{len(result.rows)} rows x n = {len(result.rows[0])}, means over rows" if result.batch else f"n = {len(result.x)}"
    fig.suptitle(f"softtopk temperature-sweep, {k_title(result)}, {shape}" + ("\n" + "; ".join(notes) if notes else ""),
                 fontsize=10)
    return fig


def render_plot_png(result: SweepResult, image_format: str = "png") -> bytes:
    """The bytes of :func:`sweep_figure` as ``image_format`` (png, svg or pdf).

    Raises:
        InvalidArgumentError: matplotlib is not installed (``pip install 'softtopk[plot]'``).
    """
    fig = sweep_figure(result)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=image_format, dpi=120)  # png, svg or pdf (the --plot suffix)
    return buffer.getvalue()
