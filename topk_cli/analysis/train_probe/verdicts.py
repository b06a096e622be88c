"""Verdicts: what a (task, level) table concludes about each method, from paired seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from topk_cli.analysis.train_probe.config import Level, ProbeConfig
from topk_cli.analysis.train_probe.gradcheck import GradQuality
from topk_cli.analysis.train_probe.results import Calibration, SummaryRow, has_gradient, is_baseline
from topk_cli.analysis.train_probe.tasks import Task
from topk_cli.analysis.train_probe.training import TrainOutcome, steps_to_target

#: 97.5 % quantiles of Student's t for 1 .. 30 degrees of freedom (two-sided 95 % intervals).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
#: Two methods tie when their paired AUC difference is below this or inside its 95 % CI.
TIE_FLOOR = 0.01


def _t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(kept)) if kept else None


def summarise(
    task: Task,
    level: Level,
    methods: Sequence[str],
    cal: dict[str, Calibration],
    outcomes: dict[str, TrainOutcome],
    checks: dict[str, list[GradQuality]],
    config: ProbeConfig,
) -> list[SummaryRow]:
    """Verdicts of every method at one (task, level): see the module docstring."""
    aucs = {m: np.mean(o.curves, axis=1) for m, o in outcomes.items()}
    rows: dict[str, dict[str, object]] = {}
    candidates = []
    for m in methods:
        c = cal[m]
        quality = checks.get(m, [])
        cos = _mean_or_none([q.cos_true for q in quality])
        cos_mb = _mean_or_none([q.cos_minibatch for q in quality])
        cos_self = _mean_or_none([q.cos_self for q in quality])
        norm = max((q.grad_norm for q in quality), default=None)
        base: dict[str, object] = {
            "tau": c.tau if c.status != "baseline" else None, "mass": c.mass, "cos_true_mean": cos,
            "cos_minibatch_mean": cos_mb, "grad_norm_max": norm, "cos_self_mean": cos_self,
        }
        o = outcomes.get(m)
        detail = c.reason if c.status == "approximate" else ""
        if o is None and not has_gradient(m):
            rows[m] = {**base, "verdict": "fails", "detail": "no gradient: the registry gives it no Jacobian", "reached": 0}
            continue
        if o is None:
            rows[m] = {**base, "verdict": "unreachable", "detail": c.reason, "reached": 0}
            continue
        finals = o.curves[:, -1]
        reach = [steps_to_target(o.steps, o.curves[s], config.target) for s in range(o.curves.shape[0])]
        reached = sum(r is not None for r in reach)
        hit = [r for r in reach if r is not None]
        base.update(
            final_mean=float(finals.mean()), final_sd=float(finals.std(ddof=1)) if finals.size > 1 else 0.0,
            auc_mean=float(aucs[m].mean()), steps_to_target_median=float(np.median(hit)) if hit else None,
            reached=reached, dead_rows=float(o.dead_rows.mean()), refused_rows=float(o.refused_rows.mean()),
            seconds=o.seconds,
        )
        if is_baseline(m):
            verdict, detail = "baseline", "no gradient: the no-learning reference"
        elif cos is not None and cos < 0:
            verdict = "anti-aligned"
            detail = _join(detail, f"cos(true) {cos:.2f}; {reached}/{config.seeds} seeds reach {config.target:g}")
        elif 2 * reached < config.seeds:
            verdict = "fails"
            detail = _join(detail, f"{reached}/{config.seeds} seeds reach {config.target:g} of the oracle")
        else:
            verdict = ""
            candidates.append(m)
        if o.nonfinite_steps.any():
            detail = _join(detail, f"{int(o.nonfinite_steps.max())} steps with a non-finite gradient skipped")
        rows[m] = {**base, "verdict": verdict, "detail": detail}
    if candidates:
        best = max(candidates, key=lambda m: (float(aucs[m].mean()), -candidates.index(m)))
        for m in candidates:
            diff = aucs[m] - aucs[best]
            mean = float(diff.mean())
            half = (
                _t975(diff.size - 1) * float(diff.std(ddof=1)) / math.sqrt(diff.size) if diff.size > 1 else math.inf
            )
            rows[m]["auc_diff_vs_best"] = mean
            rows[m]["auc_diff_ci95"] = half
            if m == best:
                rows[m]["verdict"], extra = "tied", "best mean AUC"
            elif abs(mean) < max(TIE_FLOOR, half):
                rows[m]["verdict"], extra = "tied", ""
            else:
                rows[m]["verdict"], extra = "worse", f"AUC {100 * mean:+.1f} ± {100 * half:.1f} points vs {best}"
            rows[m]["detail"] = _join(str(rows[m]["detail"]), extra)
    out = []
    for m in methods:
        r = rows[m]
        out.append(
            SummaryRow(
                task=task.name, method=m, label=level.label, tau=r.get("tau"),  # type: ignore[arg-type]
                mass=r.get("mass"), final_mean=r.get("final_mean"), final_sd=r.get("final_sd"),  # type: ignore[arg-type]
                auc_mean=r.get("auc_mean"), auc_diff_vs_best=r.get("auc_diff_vs_best"),  # type: ignore[arg-type]
                auc_diff_ci95=r.get("auc_diff_ci95"),  # type: ignore[arg-type]
                steps_to_target_median=r.get("steps_to_target_median"),  # type: ignore[arg-type]
                reached=int(r.get("reached", 0)), seeds=config.seeds,  # type: ignore[call-overload]
                cos_true_mean=r.get("cos_true_mean"), cos_minibatch_mean=r.get("cos_minibatch_mean"),  # type: ignore[arg-type]
                grad_norm_max=r.get("grad_norm_max"), dead_rows=r.get("dead_rows"),  # type: ignore[arg-type]
                refused_rows=r.get("refused_rows"), verdict=str(r["verdict"]), detail=str(r.get("detail", "")),  # type: ignore[arg-type]
                seconds=float(r.get("seconds", 0.0)),  # type: ignore[arg-type]
                cos_self_mean=r.get("cos_self_mean"),  # type: ignore[arg-type]
            )
        )
    return out


def _join(a: str, b: str) -> str:
    return "; ".join(part for part in (a, b) if part)
