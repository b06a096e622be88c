"""What the probe measured: calibrations, runs, gradient checks, verdicts; and what the registry
says about a method that matters to the probe (baseline, Monte Carlo, gradient)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from topk_cli.analysis.train_probe.config import Level, ProbeConfig
from topk_cli.api import get_method

#: A refused-row share above this marks a failure under ``--strict``.
MAX_REFUSED = 0.01


@dataclass(frozen=True)
class Calibration:
    """The tau of one method at one level of one task (``status`` as in ``HardnessMatch``)."""

    task: str
    method: str
    label: str
    tau: float | None
    mass: float | None
    refused: float | None
    status: str
    reason: str = ""


@dataclass(frozen=True)
class RunRow:
    """One seed of one trained (task, method, level)."""

    task: str
    method: str
    label: str
    tau: float
    seed: int
    final: float
    auc: float
    steps_to_target: int | None
    curve: tuple[tuple[int, float], ...]
    grad_norm_median: float
    dead_rows: float
    refused_rows: float
    nonfinite_steps: int
    data_hash: str
    seconds: float


@dataclass(frozen=True)
class GradCheckRow:
    """One method at one level at one probe point of one task."""

    task: str
    method: str
    label: str
    tau: float
    point: float
    metric_at_point: float
    cos_true: float | None
    cos_true_minibatch: float | None
    grad_norm: float
    dead_rows: float
    refused_rows: float
    mc_split_half: float
    cos_self: float | None = None  # Monte Carlo operators: agreement of two noise seeds


@dataclass(frozen=True)
class SummaryRow:
    """The verdict of one (task, method, level), with what it rests on."""

    task: str
    method: str
    label: str
    tau: float | None
    mass: float | None
    final_mean: float | None
    final_sd: float | None
    auc_mean: float | None
    auc_diff_vs_best: float | None
    auc_diff_ci95: float | None
    steps_to_target_median: float | None
    reached: int
    seeds: int
    cos_true_mean: float | None
    cos_minibatch_mean: float | None
    grad_norm_max: float | None
    dead_rows: float | None
    refused_rows: float | None
    verdict: str
    detail: str = ""
    seconds: float = 0.0
    cos_self_mean: float | None = None  # Monte Carlo operators: agreement of two noise seeds


@dataclass(frozen=True)
class TaskInfo:
    name: str
    n: int
    k: int
    params: int
    metric: str
    description: str
    chance: float
    oracle: tuple[float, ...]


@dataclass(frozen=True)
class TrainProbeResult:
    """Everything ``train-probe`` measured."""

    config: ProbeConfig
    tasks: tuple[TaskInfo, ...]
    levels: tuple[Level, ...]
    check_levels: tuple[Level, ...]
    calibrations: tuple[Calibration, ...]
    runs: tuple[RunRow, ...]
    grad_check: tuple[GradCheckRow, ...]
    summary: tuple[SummaryRow, ...]
    warnings: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    curves: dict[tuple[str, str, str], tuple[tuple[int, ...], np.ndarray]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """True when a selected non-baseline method failed somewhere (``--strict`` exits 1)."""
        return bool(self.failures)

    @property
    def failures(self) -> list[str]:
        """One line per failure that ``--strict`` counts."""
        out = []
        for row in self.summary:
            if row.verdict in ("fails", "anti-aligned", "unreachable"):
                out.append(f"{row.method} on {row.task} at {row.label}: {row.verdict}" + (f" ({row.detail})" if row.detail else ""))
            elif row.verdict != "baseline" and row.refused_rows is not None and row.refused_rows > MAX_REFUSED:
                out.append(f"{row.method} on {row.task} at {row.label}: refused {row.refused_rows:.1%} of the rows")
        for g in self.grad_check:
            if is_baseline(g.method) or g.cos_true is None or g.cos_true >= 0:
                continue
            out.append(
                f"{g.method} on {g.task} at {g.label}: gradient anti-aligned (cos {g.cos_true:.2f}) at probe point {g.point:g}"
            )
        return list(dict.fromkeys(out))


def is_baseline(method: str) -> bool:
    return get_method(method).family == "baseline"


def is_stochastic(method: str) -> bool:
    """A method whose result depends on a ``seed`` parameter (a Monte Carlo estimate)."""
    return any(getattr(p, "name", None) == "seed" for p in getattr(get_method(method), "parameters", ()))


def method_params(method: str, config: ProbeConfig) -> dict[str, int]:
    """Extra parameters the probe sets: ``samples`` of a Monte Carlo operator (``--samples``)."""
    names = {getattr(p, "name", None) for p in getattr(get_method(method), "parameters", ())}
    return {"samples": config.mc_samples} if "samples" in names else {}


def has_gradient(method: str) -> bool:
    """False for a method the registry says has no Jacobian / VJP."""
    return bool(getattr(getattr(get_method(method), "capabilities", None), "jacobian", True))
