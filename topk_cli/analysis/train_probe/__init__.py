"""``train_probe``: which smooth top-k operator trains, at equal hardness, on tasks with a known answer.

For every task, method and *level* (a target hardness, i.e. mean top-k mass, or a fixed tau) the
probe

1. **calibrates** tau on the initial score distribution so that the mean top-k mass equals the
   target (:mod:`topk_cli.analysis.hardness`), allowing at most 1 % refused rows;
2. **trains** every seed at once with Adam (or SGD) through :func:`topk_cli.evaluate` and
   :func:`topk_cli.vjp`, with *paired* seeds: for a given seed every method sees the same planted
   truth, initialisation, minibatches and held-out set; the metric is computed with the **hard**
   top-k on held-out instances and normalised by the oracle's;
3. **checks the gradient**: its cosine with the smoothed true gradient of the hard loss at probe
   points between the initialisation and the oracle (full batch, and mean over minibatches of
   32), its norm, dead rows (no gradient) and refused rows;
4. gives a **verdict** per task, method and level: ``baseline`` (a method of the registry's
   baseline family: no gradient), ``unreachable`` (no tau reaches the target hardness),
   ``anti-aligned`` (mean cosine to the true gradient below 0), ``fails`` (fewer than half the
   seeds reach the target share of the oracle), else ``tied`` or ``worse`` against the method with
   the best mean learning-curve AUC: tied when the paired AUC difference is within
   ``max(1 AUC point, its 95 % confidence half-width)``.

Everything is deterministic for a given ``seed``; methods come from the registry.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topk_cli.analysis.hardness import calibrate_hardness, topk_mass
from topk_cli.analysis.train_probe.gradcheck import (
    GradQuality,
    TrueGradient,
    gradient_quality,
    probe_points,
    true_gradient,
)
from topk_cli.analysis.train_probe.tasks import DEFAULT_TASKS, TASKS, Instances, Task, standardise, unit
from topk_cli.analysis.train_probe.training import (
    SeedData,
    TrainConfig,
    TrainOutcome,
    auc,
    hard_topk,
    step_seed,
    steps_to_target,
    train,
)
from topk_cli.api import get_method
from topk_cli.errors import InvalidArgumentError
from topk_cli.registry import METHODS

__all__ = [
    "DEFAULT_TASKS",
    "TASKS",
    "Calibration",
    "GradCheckRow",
    "Level",
    "ProbeConfig",
    "RunRow",
    "SummaryRow",
    "TrainProbeResult",
    "parse_hardness",
    "parse_tasks",
    "probe_config",
    "train_probe",
]

#: 97.5 % quantiles of Student's t for 1 .. 30 degrees of freedom (two-sided 95 % intervals).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
#: Two methods tie when their paired AUC difference is below this or inside its 95 % CI.
TIE_FLOOR = 0.01
#: A refused-row share above this marks a failure under ``--strict``.
MAX_REFUSED = 0.01
#: Warn when the Monte Carlo true gradient's split-half cosine is below this.
SPLIT_HALF_WARNING = 0.8
_PURPOSE = {"truth": 0, "stream": 1, "held_out": 2, "calibration": 3, "check": 4, "perturb": 5}


@dataclass(frozen=True)
class ProbeConfig:
    """Every knob of the probe (the CLI's options); see ``softtopk train-probe --help``."""

    tasks: tuple[str, ...] = DEFAULT_TASKS
    methods: tuple[str, ...] = tuple(METHODS)
    hardness: tuple[float, ...] = (0.8,)
    taus: tuple[float, ...] = ()
    seeds: int = 3
    steps: int = 100
    batch: int = 32
    optimizer: str = "adam"
    lr: float | None = None  # None: 0.05 for Adam, 1.0 for SGD
    target: float = 0.9
    seed: int = 0
    straight_through: bool = False
    eval_every: int = 5
    eval_instances: int = 500
    calibration_rows: int = 200
    grad_check: bool = True
    grad_check_hardness: tuple[float, ...] = (0.6, 0.8, 0.95)
    grad_check_points: tuple[float, ...] = (0.0, 0.5, 0.8)
    grad_check_instances: int = 500
    grad_check_pairs: int = 128
    grad_check_sigma: float = 0.05
    #: Samples per call of a Monte Carlo operator (a method with a ``samples`` parameter).
    mc_samples: int = 32

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return 0.05 if self.optimizer == "adam" else 1.0


#: What ``--quick`` sets (CI smoke runs).
QUICK: dict[str, Any] = {"tasks": ("select",), "steps": 60, "seeds": 2, "grad_check": False}


@dataclass(frozen=True)
class Level:
    """A trained or checked temperature: a target hardness or a fixed tau."""

    label: str
    hardness: float | None = None
    tau: float | None = None


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
            if _is_baseline(g.method) or g.cos_true is None or g.cos_true >= 0:
                continue
            out.append(
                f"{g.method} on {g.task} at {g.label}: gradient anti-aligned (cos {g.cos_true:.2f}) at probe point {g.point:g}"
            )
        return list(dict.fromkeys(out))


def _is_baseline(method: str) -> bool:
    return get_method(method).family == "baseline"


def _is_stochastic(method: str) -> bool:
    """A method whose result depends on a ``seed`` parameter (a Monte Carlo estimate)."""
    return any(getattr(p, "name", None) == "seed" for p in getattr(get_method(method), "parameters", ()))


def _method_params(method: str, config: ProbeConfig) -> dict[str, int]:
    """Extra parameters the probe sets: ``samples`` of a Monte Carlo operator (``--samples``)."""
    names = {getattr(p, "name", None) for p in getattr(get_method(method), "parameters", ())}
    return {"samples": config.mc_samples} if "samples" in names else {}


def _has_gradient(method: str) -> bool:
    """False for a method the registry says has no Jacobian / VJP."""
    return bool(getattr(getattr(get_method(method), "capabilities", None), "jacobian", True))


def _rng(seed: int, task: str, s: int, purpose: str) -> np.random.Generator:
    code = zlib.crc32(task.encode())
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(code, s, _PURPOSE[purpose])))


def _stack(parts: list[Instances]) -> Instances:
    return {key: np.stack([p[key] for p in parts]) for key in parts[0]}


def _seed_data(task: Task, config: ProbeConfig) -> SeedData:
    thetas, oracles, streams, helds, oracle_metrics = [], [], [], [], []
    for s in range(config.seeds):
        rng = _rng(config.seed, task.name, s, "truth")
        oracle, hidden = task.truth(rng)
        theta0 = unit(rng.standard_normal(task.params))
        stream = task.instances(_rng(config.seed, task.name, s, "stream"), hidden, config.steps * config.batch)
        held = task.instances(_rng(config.seed, task.name, s, "held_out"), hidden, config.eval_instances)
        thetas.append(theta0)
        oracles.append(oracle)
        streams.append(stream)
        helds.append(held)
        one = {key: value[None] for key, value in held.items()}
        hard = hard_topk(task.scores(oracle[None], one), task.k)
        oracle_metrics.append(float(task.metric_value(hard, one).mean()))
    return SeedData(
        theta0=np.stack(thetas), oracle=np.stack(oracles), stream=_stack(streams), held_out=_stack(helds),
        oracle_metric=np.array(oracle_metrics),
    )


def _levels(config: ProbeConfig) -> tuple[Level, ...]:
    out = [Level(f"mass {h:g}", hardness=h) for h in config.hardness]
    out += [Level(f"tau {t:g}", tau=t) for t in config.taus]
    return tuple(out)


def _validate(config: ProbeConfig) -> None:
    if not config.tasks:
        raise InvalidArgumentError("--task: give at least one task")
    for name in config.tasks:
        if name not in TASKS:
            raise InvalidArgumentError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}, or 'all'")
    if not config.methods:
        raise InvalidArgumentError("-m: give at least one method")
    for name in config.methods:
        get_method(name)
    if not config.hardness and not config.taus:
        raise InvalidArgumentError("give at least one --hardness level or --taus value")
    for name in config.tasks:
        task = TASKS[name]
        low = task.k / task.n
        for h in (*config.hardness, *config.grad_check_hardness):
            if not (math.isfinite(h) and low < h < 1):
                raise InvalidArgumentError(
                    f"hardness must be a top-k mass in (k/n, 1) = ({low:g}, 1) for task {name}, got {h:g}"
                )
    for t in config.taus:
        if not (math.isfinite(t) and t > 0):
            raise InvalidArgumentError(f"every tau must be a finite number > 0, got {t:g}")
    checks = {
        "--seeds": (config.seeds, 1), "--steps": (config.steps, 1), "--batch": (config.batch, 1),
        "eval_every": (config.eval_every, 1), "eval_instances": (config.eval_instances, 1),
        "calibration_rows": (config.calibration_rows, 1), "grad_check_instances": (config.grad_check_instances, 32),
        "grad_check_pairs": (config.grad_check_pairs, 2), "--samples": (config.mc_samples, 2),
    }
    for name, (value, low_int) in checks.items():
        if value < low_int:
            raise InvalidArgumentError(f"{name} must be >= {low_int}, got {value}")
    if config.optimizer not in ("adam", "sgd"):
        raise InvalidArgumentError(f"--optimizer must be adam or sgd, got {config.optimizer!r}")
    if not (math.isfinite(config.learning_rate) and config.learning_rate > 0):
        raise InvalidArgumentError(f"--lr must be a finite number > 0, got {config.learning_rate:g}")
    if not 0 < config.target <= 1.5:
        raise InvalidArgumentError(f"--target must be a share of the oracle's metric in (0, 1.5], got {config.target:g}")
    if not 0 < config.grad_check_sigma < 1:
        raise InvalidArgumentError(f"grad_check_sigma must be in (0, 1), got {config.grad_check_sigma:g}")


def _calibrate(
    task: Task, config: ProbeConfig, data: SeedData, method: str, levels: Sequence[Level]
) -> list[Calibration]:
    """Tau per level on the initial score distribution of the first seed (shared grid)."""
    if _is_baseline(method):  # no gradient whatever tau: trained once, at tau = 1, as the baseline
        return [Calibration(task.name, method, lv.label, 1.0, None, None, "baseline") for lv in levels]
    rng = _rng(config.seed, task.name, 0, "calibration")
    _, hidden = task.truth(_rng(config.seed, task.name, 0, "truth"))
    inst = {key: value[None] for key, value in task.instances(rng, hidden, config.calibration_rows).items()}
    x, _ = standardise(task.scores(data.theta0[:1], inst))
    x = x.reshape(-1, task.n)
    targets = [lv.hardness for lv in levels if lv.hardness is not None]
    params = _method_params(method, config)
    matches = iter(calibrate_hardness(x, task.k, method, targets, params=params) if targets else ())
    out = []
    for lv in levels:
        if lv.hardness is None:
            assert lv.tau is not None
            mass, refused = topk_mass(x, task.k, method, lv.tau, **params)
            out.append(Calibration(task.name, method, lv.label, lv.tau, mass, refused, "fixed"))
            continue
        m = next(matches)
        out.append(Calibration(task.name, method, lv.label, m.tau, m.mass, m.refused, m.status, m.reason))
    return out


def _check_instances(task: Task, config: ProbeConfig) -> Instances:
    _, hidden = task.truth(_rng(config.seed, task.name, 0, "truth"))
    rng = _rng(config.seed, task.name, 0, "check")
    return {key: value[None] for key, value in task.instances(rng, hidden, config.grad_check_instances).items()}


def _true_gradients(task: Task, config: ProbeConfig, data: SeedData, inst: Instances) -> list[TrueGradient]:
    rng = _rng(config.seed, task.name, 0, "perturb")
    one = {key: value[:1] for key, value in inst.items()}
    return [
        true_gradient(
            task, theta, one, point=a, pairs=config.grad_check_pairs, sigma=config.grad_check_sigma, rng=rng,
            oracle_metric=float(data.oracle_metric[0]),
        )
        for a, theta in zip(
            config.grad_check_points,
            probe_points(data.theta0[0], data.oracle[0], config.grad_check_points),
            strict=True,
        )
    ]


def _t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(kept)) if kept else None


def _summaries(
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
        if o is None and not _has_gradient(m):
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
        if _is_baseline(m):
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


def train_probe(
    config: ProbeConfig | None = None, *, progress: Callable[[int, int], None] | None = None
) -> TrainProbeResult:
    """Calibrate, train, check gradients and judge every (task, method, level) of ``config``.

    Raises:
        InvalidArgumentError: an unknown task or method, a hardness outside ``(k/n, 1)``, a
            non-positive tau, count, learning rate or target.
    """
    config = config or ProbeConfig()
    _validate(config)
    start = time.perf_counter()
    levels = _levels(config)
    check_levels = levels
    if config.grad_check:
        extra = [Level(f"mass {h:g}", hardness=h) for h in config.grad_check_hardness if h not in config.hardness]
        check_levels = tuple(sorted([*levels, *extra], key=lambda lv: (lv.hardness is None, lv.hardness or 0.0)))
    train_config = TrainConfig(
        steps=config.steps, batch=config.batch, optimizer=config.optimizer, lr=config.learning_rate,
        eval_every=config.eval_every, target=config.target, straight_through=config.straight_through,
    )
    tasks = [TASKS[name] for name in config.tasks]
    total = len(tasks) * len(config.methods) * (1 + len(levels) + (1 if config.grad_check else 0))
    done = 0
    infos: list[TaskInfo] = []
    calibrations: list[Calibration] = []
    runs: list[RunRow] = []
    checks_out: list[GradCheckRow] = []
    summary: list[SummaryRow] = []
    warnings: list[str] = []
    curves: dict[tuple[str, str, str], tuple[tuple[int, ...], np.ndarray]] = {}
    for task in tasks:
        data = _seed_data(task, config)
        infos.append(
            TaskInfo(
                task.name, task.n, task.k, task.params, task.metric,
                task.description.format(k=task.k, n=task.n), task.chance,
                tuple(float(v) for v in data.oracle_metric),
            )
        )
        cal: dict[tuple[str, str], Calibration] = {}
        for m in config.methods:
            for c in _calibrate(task, config, data, m, check_levels):
                cal[(m, c.label)] = c
            done += 1
            if progress:
                progress(done, total)
        calibrations.extend(cal[(m, lv.label)] for m in config.methods for lv in check_levels)
        quality: dict[tuple[str, str], list[GradQuality]] = {}
        if config.grad_check:
            inst = _check_instances(task, config)
            truths = _true_gradients(task, config, data, inst)
            for t in truths:
                if t.split_half < SPLIT_HALF_WARNING:
                    warnings.append(
                        f"{task.name}: the true gradient's Monte Carlo split-half cosine is {t.split_half:.2f} at "
                        f"probe point {t.point:g} (below {SPLIT_HALF_WARNING}): its cosines are noisy"
                    )
            for m in config.methods:
                for lv in check_levels:
                    c = cal[(m, lv.label)]
                    if c.tau is None or not _has_gradient(m):
                        continue
                    qs = [
                        gradient_quality(
                            task, t, inst, m, c.tau,
                            seeds=(step_seed(config.seed, 10**9 + i), step_seed(config.seed, 2 * 10**9 + i))
                            if _is_stochastic(m) else None,
                            params=_method_params(m, config),
                        )
                        for i, t in enumerate(truths)
                    ]
                    quality[(m, lv.label)] = qs
                    checks_out.extend(
                        GradCheckRow(
                            task.name, m, lv.label, c.tau, t.point, t.metric, q.cos_true, q.cos_minibatch,
                            q.grad_norm, q.dead_rows, q.refused_rows, t.split_half, q.cos_self,
                        )
                        for t, q in zip(truths, qs, strict=True)
                    )
                done += 1
                if progress:
                    progress(done, total)
        for lv in levels:
            outcomes: dict[str, TrainOutcome] = {}
            for m in config.methods:
                c = cal[(m, lv.label)]
                if c.tau is not None and _has_gradient(m):
                    o = train(
                        task, data, m, c.tau, train_config, reseed=config.seed if _is_stochastic(m) else None,
                        params=_method_params(m, config),
                    )
                    outcomes[m] = o
                    curves[(task.name, m, lv.label)] = (o.steps, o.curves)
                    for s in range(config.seeds):
                        reach = steps_to_target(o.steps, o.curves[s], config.target)
                        runs.append(
                            RunRow(
                                task.name, m, lv.label, c.tau, s, float(o.curves[s, -1]), auc(o.curves[s]), reach,
                                tuple((int(a), float(b)) for a, b in zip(o.steps, o.curves[s], strict=True)),
                                float(o.grad_norm_median[s]), float(o.dead_rows[s]), float(o.refused_rows[s]),
                                int(o.nonfinite_steps[s]), o.data_hash[s], o.seconds / config.seeds,
                            )
                        )
                done += 1
                if progress:
                    progress(done, total)
            summary.extend(
                _summaries(
                    task, lv, config.methods, {m: cal[(m, lv.label)] for m in config.methods}, outcomes,
                    {m: quality.get((m, lv.label), []) for m in config.methods}, config,
                )
            )
    return TrainProbeResult(
        config=config, tasks=tuple(infos), levels=levels, check_levels=check_levels,
        calibrations=tuple(calibrations), runs=tuple(runs), grad_check=tuple(checks_out), summary=tuple(summary),
        warnings=tuple(warnings), elapsed_s=time.perf_counter() - start, curves=curves,
    )


def parse_hardness(text: str) -> tuple[float, ...]:
    """``--hardness``: a comma-separated list of top-k masses (``0.6,0.8,0.95``).

    >>> parse_hardness("0.6, 0.8")
    (0.6, 0.8)
    """
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InvalidArgumentError(f"--hardness must be top-k masses separated by commas (e.g. 0.8 or 0.6,0.8), got {text!r}") from None
    if not values:
        raise InvalidArgumentError(f"--hardness is empty: {text!r}")
    return values


def parse_tasks(names: Sequence[str] | None, *, quick: bool = False) -> tuple[str, ...]:
    """``--task`` values (repeatable, comma-separated, or ``all``); default ``select,knn`` (``select`` with quick)."""
    requested = [part.strip() for name in (names or []) for part in name.split(",") if part.strip()]
    if not requested:
        return tuple(QUICK["tasks"]) if quick else DEFAULT_TASKS
    out: list[str] = []
    for name in requested:
        chosen = list(TASKS) if name == "all" else [name]
        for t in chosen:
            if t not in TASKS:
                raise InvalidArgumentError(f"unknown task {t!r}; valid tasks: {', '.join(TASKS)}, or 'all'")
            if t not in out:
                out.append(t)
    return tuple(out)


def probe_config(
    *,
    tasks: Sequence[str] | None,
    methods: Sequence[str],
    hardness: str | None,
    taus: Sequence[float],
    seeds: int | None,
    steps: int | None,
    quick: bool,
    grad_check: bool | None,
    **options: Any,
) -> ProbeConfig:
    """The configuration of a CLI call: ``--quick`` sets select only, 60 steps, 2 seeds and no
    gradient check, for whatever the user did not give explicitly."""
    levels = parse_hardness(hardness) if hardness is not None else (() if taus else (0.8,))
    return ProbeConfig(
        tasks=parse_tasks(tasks, quick=quick), methods=tuple(methods), hardness=levels, taus=tuple(taus),
        seeds=seeds if seeds is not None else (int(QUICK["seeds"]) if quick else 3),
        steps=steps if steps is not None else (int(QUICK["steps"]) if quick else 100),
        grad_check=grad_check if grad_check is not None else not quick,
        **options,
    )
