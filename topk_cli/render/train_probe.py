"""What ``softtopk train-probe`` shows: a table per task, learning-curve sparklines, the gradient
check by hardness, tidy CSV (one row per run), one JSON document, and a PNG plot.

Never prints. matplotlib is imported only inside :func:`render_train_probe_png` (an optional extra).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text

from topk_cli.analysis.train_probe import GradCheckRow, SummaryRow, TrainProbeResult
from topk_cli.errors import InvalidArgumentError
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

CSV_COLUMNS = (
    "task", "method", "label", "tau", "seed", "final", "auc", "steps_to_target", "grad_norm_median",
    "dead_rows", "refused_rows", "nonfinite_steps", "data_hash", "seconds",
)
#: Keys that hold wall-clock timings (the only ones that differ between two runs with one seed).
TIMING_KEYS = ("seconds", "elapsed_s")
_BARS = "▁▂▃▄▅▆▇█"
_STYLE = {
    "tied": "green", "worse": "yellow", "fails": "red", "anti-aligned": "bold red", "unreachable": "red",
    "baseline": "dim",
}


def train_probe_document(result: TrainProbeResult) -> dict[str, Any]:
    """The JSON document: config, tasks, temperatures, runs, grad_check, summary, warnings."""
    c = result.config
    return {
        "config": {
            "tasks": list(c.tasks), "methods": list(c.methods), "hardness": list(c.hardness), "taus": list(c.taus),
            "seeds": c.seeds, "steps": c.steps, "batch": c.batch, "optimizer": c.optimizer, "lr": c.learning_rate,
            "scale": c.scale, "straight_through": c.straight_through, "target": c.target, "seed": c.seed,
            "eval_every": c.eval_every, "eval_instances": c.eval_instances, "calibration_rows": c.calibration_rows,
            "mc_samples": c.mc_samples, "n": c.n, "k": c.k,
            "grad_check": (
                {
                    "hardness": [lv.hardness for lv in result.check_levels if lv.hardness is not None],
                    "taus": [lv.tau for lv in result.check_levels if lv.tau is not None],
                    "points": list(c.grad_check_points), "instances": c.grad_check_instances,
                    "pairs": c.grad_check_pairs, "sigma": c.grad_check_sigma,
                }
                if c.grad_check
                else None
            ),
        },
        "tasks": [dataclasses.asdict(t) for t in result.tasks],
        "temperatures": [dataclasses.asdict(cal) for cal in result.calibrations],
        "runs": [dataclasses.asdict(r) for r in result.runs],
        "grad_check": [dataclasses.asdict(g) for g in result.grad_check],
        "summary": [dataclasses.asdict(s) for s in result.summary],
        "warnings": list(result.warnings),
        "elapsed_s": result.elapsed_s,
    }


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _share(v: float | None) -> str:
    if v is None:
        return "-"
    return "0%" if v == 0 else ("<1%" if v < 0.005 else f"{v:.0%}")


def _tau(v: float | None) -> str:
    return "-" if v is None else format_float(v, 4) if v >= 1e-3 else f"{v:.2e}"


def _curve_line(steps: tuple[int, ...], curves: np.ndarray) -> str:
    mean = curves.mean(axis=0)
    return "".join(_BARS[min(7, max(0, round(float(v) * 7)))] for v in np.clip(mean, 0.0, 1.0))


def task_table(result: TrainProbeResult, task: str, label: str) -> Table:
    """One row per method: tau, mass, final, AUC, paired difference, speed, gradient, verdict."""
    info = next(t for t in result.tasks if t.name == task)
    c = result.config
    oracle = float(np.mean(info.oracle))
    title = (
        f"{task}: {info.description}; {label}; metric {info.metric} / oracle "
        f"(oracle {oracle:.2f}, chance {info.chance:.2f})"
    )
    table = Table(title=title, title_justify="left")
    columns = (
        "method", "tau", "mass", "final", "AUC", "AUC vs best (95% CI)", f"to {c.target:.0%}", "cos(true)",
        "minibatch cos", "dead rows", "refused", "curve", "verdict",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("method", "verdict", "curve") else "right", no_wrap=True)
    for s in (row for row in result.summary if row.task == task and row.label == label):
        curve = result.curves.get((task, s.method, label))
        diff = (
            f"{100 * s.auc_diff_vs_best:+.1f} ± {100 * s.auc_diff_ci95:.1f}"
            if s.auc_diff_vs_best is not None and s.auc_diff_ci95 is not None and np.isfinite(s.auc_diff_ci95)
            else "-"
        )
        final = "-" if s.final_mean is None else f"{s.final_mean:.2f} ± {s.final_sd or 0:.2f}"
        reach = "-" if s.final_mean is None else (
            "never" if s.steps_to_target_median is None else f"{s.steps_to_target_median:.0f} ({s.reached}/{s.seeds})"
        )
        best = s.verdict == "tied" and "best mean AUC" in s.detail
        verdict = Text(s.verdict + (" (best)" if best else ""), style=_STYLE.get(s.verdict, ""))
        table.add_row(
            s.method, _tau(s.tau), _num(s.mass, 3), final, _num(s.auc_mean), diff, reach, _num(s.cos_true_mean),
            _num(s.cos_minibatch_mean), _share(s.dead_rows), _share(s.refused_rows),
            _curve_line(*curve) if curve is not None else "", verdict,
        )
    return table


def task_notes(result: TrainProbeResult, task: str, label: str) -> Text | None:
    """The reasons behind the verdicts of one table (one line per method that has one)."""
    lines = [
        f"  {s.method}: {s.detail}"
        for s in result.summary
        if s.task == task and s.label == label and s.detail and s.detail != "best mean AUC"
    ]
    return Text("\n".join(lines)) if lines else None


def grad_check_table(result: TrainProbeResult, task: str) -> Table:
    """cos(true) (full batch; minibatch in parentheses) per method and checked level."""
    labels = [lv.label for lv in result.check_levels]
    split = [g.mc_split_half for g in result.grad_check if g.task == task]
    table = Table(
        title=(
            f"{task}: gradient check, cos(true) full batch (minibatch of 32); true-gradient split-half cosine "
            f"{min(split, default=float('nan')):.2f}-{max(split, default=float('nan')):.2f}"
        ),
        title_justify="left",
    )
    table.add_column("method", no_wrap=True)
    for label in labels:
        table.add_column(label, justify="right", no_wrap=True)
    table.add_column("max |grad|", justify="right", no_wrap=True)
    by_key: dict[tuple[str, str], list[GradCheckRow]] = {}
    for g in result.grad_check:
        if g.task == task:
            by_key.setdefault((g.method, g.label), []).append(g)
    for method in result.config.methods:
        cells = []
        norms: list[float] = []
        for label in labels:
            rows = by_key.get((method, label))
            if not rows:
                cal = next((c for c in result.calibrations if (c.task, c.method, c.label) == (task, method, label)), None)
                cells.append("unreachable" if cal is not None and cal.status == "unreachable" else "-")
                continue
            norms.extend(g.grad_norm for g in rows)
            full = [g.cos_true for g in rows if g.cos_true is not None]
            mini = [g.cos_true_minibatch for g in rows if g.cos_true_minibatch is not None]
            if not full:
                cells.append("zero grad")
                continue
            cell = f"{np.mean(full):.2f} ({np.mean(mini):.2f})" if mini else f"{np.mean(full):.2f}"
            selfs = [g.cos_self for g in rows if g.cos_self is not None]
            if selfs:  # a Monte Carlo operator: how well two noise seeds agree
                cell += f" self {np.mean(selfs):.2f}"
            dead = np.mean([g.dead_rows for g in rows])
            if dead >= 0.005:
                cell += f" dead {dead:.0%}"
            cells.append(cell)
        table.add_row(method, *cells, format_float(max(norms), 2) if norms else "-")
    return table


def _header(result: TrainProbeResult) -> Text:
    c = result.config
    methods = len(c.methods)
    levels = ", ".join(lv.label for lv in result.levels)
    opt = f"{c.steps} {'Adam' if c.optimizer == 'adam' else 'SGD'} steps (lr {c.learning_rate:g}), batch {c.batch}"
    text = Text(
        f"softtopk train-probe: {len(c.tasks)} task(s) x {methods} methods x {levels} x {c.seeds} paired seeds, "
        f"{opt}{', straight-through' if c.straight_through else ''}; {result.elapsed_s:.1f} s\n"
    )
    scale = (
        "scores standardised per row: tau is in units of the row's score sd" if c.scale == "fixed"
        else "free scale: raw scores, calibrated on the initial ones; the model can sharpen itself"
    )
    text.append(
        "tau is set per method and task so that the mean share of the soft mass on the true top-k equals the target\n"
        f"({scale}); metrics use the hard top-k on held-out data."
    )
    return text


def _notes(result: TrainProbeResult) -> Text:
    c = result.config
    lines = [
        f"final, AUC: hard metric / oracle at the last step, and averaged over the learning curve (every {c.eval_every} steps)."
        f" to {c.target:.0%}: median steps to {c.target:.0%} of the oracle (seeds that got there / seeds).",
        "AUC vs best: paired difference over seeds, in AUC points, with its 95% t-interval half-width.",
        "  tied = within max(1 point, the interval): the probe cannot tell the methods apart (not: they are equal).",
        "verdicts: baseline = no gradient (reference); unreachable = no tau gives the target mass with <= 1% of rows refused;",
        "  anti-aligned = mean cos(true) < 0; fails = fewer than half the seeds reach the target.",
    ]
    if c.grad_check:
        points = ", ".join(f"{p:g}" for p in c.grad_check_points)
        lines.append(
            "gradient check: cosine of each operator's gradient with the gradient of the expected hard-top-k loss "
            f"(Gaussian smoothing, sigma {c.grad_check_sigma:g} |theta|, {c.grad_check_pairs} antithetic pairs,"
        )
        lines.append(
            f"  {c.grad_check_instances} instances), mean over the points {points} of the way from the "
            "initialisation to the oracle; dead = rows with no gradient; self = cosine between two noise seeds"
            " of a Monte Carlo operator."
        )
    else:
        lines.append("gradient check skipped (--no-grad-check or --quick): 'anti-aligned' cannot be detected.")
    lines.extend(f"warning: {w}" for w in result.warnings)
    return Text("\n".join(lines))


def render_train_probe_table(result: TrainProbeResult, *, color: bool = False) -> str:
    """The header, one table per task and level, the gradient check per task, and notes."""
    renderables: list[Any] = [_header(result)]
    for task in result.config.tasks:
        for lv in result.levels:
            renderables.append(task_table(result, task, lv.label))
            notes = task_notes(result, task, lv.label)
            if notes is not None:
                renderables.append(notes)
        if result.config.grad_check:
            renderables.append(grad_check_table(result, task))
    renderables.append(_notes(result))
    return renderables_to_text(renderables, color=color)


def render_train_probe(result: TrainProbeResult, fmt: OutputFormat, *, color: bool = False) -> str:
    """The probe in ``fmt``."""
    if fmt is OutputFormat.json:
        return render_json(train_probe_document(result))
    if fmt is OutputFormat.csv:
        return render_csv(train_probe_document(result)["runs"], CSV_COLUMNS)
    return render_train_probe_table(result, color=color)


def _summary_for(result: TrainProbeResult, task: str) -> Sequence[SummaryRow]:
    return [s for s in result.summary if s.task == task]


def train_probe_figure(result: TrainProbeResult) -> Any:
    """A matplotlib ``Figure``: per task, learning curves (mean over seeds, min-max band) and,
    when the gradient check ran, cos(true) against mass; one style per method
    (:mod:`topk_cli.render.styles`), the verdict in the legend.

    Without a gradient check (``--no-grad-check``, ``--quick``) the figure has the learning
    curves only (no empty panel).

    Raises:
        InvalidArgumentError: matplotlib is not installed (``pip install 'softtopk[plot]'``).
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
    except ImportError:
        raise InvalidArgumentError(
            "--plot needs matplotlib, which is not installed: pip install 'softtopk[plot]' (or pip install matplotlib)"
        ) from None
    from topk_cli.render.styles import method_styles

    tasks = list(result.config.tasks)
    methods = list(result.config.methods)
    styles = method_styles(methods)
    label = result.levels[0].label

    def cos_points(task: str, m: str) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for cal in result.calibrations:
            if (cal.task, cal.method) != (task, m) or cal.mass is None:
                continue
            cos = [g.cos_true for g in result.grad_check if (g.task, g.method, g.label) == (task, m, cal.label)]
            kept = [v for v in cos if v is not None]
            if kept:
                xs.append(cal.mass)
                ys.append(float(np.mean(kept)))
        order = np.argsort(xs)
        return [xs[i] for i in order], [ys[i] for i in order]

    with_cos = {task: {m: cos_points(task, m) for m in methods} for task in tasks} if result.grad_check else {}
    columns = 2 if any(xs for per in with_cos.values() for xs, _ in per.values()) else 1
    fig = Figure(figsize=(6.5 * columns, 4.2 * len(tasks)), layout="constrained")
    axes = fig.subplots(len(tasks), columns, squeeze=False)
    for row, task in enumerate(tasks):
        ax_curve = axes[row][0]
        info = next(t for t in result.tasks if t.name == task)
        for m in methods:
            entry = result.curves.get((task, m, label))
            if entry is None:
                continue
            steps, curves = entry
            summary = next(s for s in _summary_for(result, task) if s.method == m and s.label == label)
            style = styles[m]
            every = max(1, len(steps) // 8)
            ax_curve.plot(
                steps, curves.mean(axis=0), color=style.color, marker=style.marker, markevery=every, markersize=5,
                linestyle=style.linestyle, label=f"{m} ({summary.verdict})",
            )
            ax_curve.fill_between(steps, curves.min(axis=0), curves.max(axis=0), color=style.color, alpha=0.10)
        ax_curve.axhline(result.config.target, color="grey", lw=0.8, ls=":")
        ax_curve.set(
            xlabel="Adam step" if result.config.optimizer == "adam" else "SGD step",
            ylabel=f"{info.metric} / oracle (held out, hard top-k)",
            title=f"{task}: learning curves at {label}\n(mean over {result.config.seeds} seeds, min-max band)",
        )
        ax_curve.legend(fontsize=7, loc="lower right")
        if columns == 2:
            ax_cos = axes[row][1]
            drawn = 0
            for m in methods:
                xs, ys = with_cos.get(task, {}).get(m, ([], []))
                if xs:
                    ax_cos.plot(xs, ys, markersize=5, label=m, **styles[m].kwargs())
                    drawn += 1
            if not drawn:
                ax_cos.remove()
                continue
            ax_cos.axhline(0.0, color="grey", lw=0.8)
            ax_cos.set(
                xlabel="top-k mass (hardness)", ylabel="cos(operator gradient, true gradient)",
                title=f"{task}: gradient alignment against hardness", ylim=(-1.05, 1.05),
            )
            ax_cos.legend(fontsize=7, loc="best")
    return fig


def render_train_probe_png(result: TrainProbeResult, image_format: str = "png") -> bytes:
    """The bytes of :func:`train_probe_figure` as ``image_format`` (png, svg or pdf).

    Raises:
        InvalidArgumentError: matplotlib is not installed (``pip install 'softtopk[plot]'``).
    """
    fig = train_probe_figure(result)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=image_format, dpi=110)  # png, svg or pdf (the --plot suffix)
    return buffer.getvalue()
