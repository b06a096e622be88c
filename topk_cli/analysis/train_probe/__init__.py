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

import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from topk_cli.analysis.hardness import calibrate_hardness, topk_mass
from topk_cli.analysis.train_probe.config import (
    QUICK,
    Level,
    ProbeConfig,
    parse_hardness,
    parse_tasks,
    probe_config,
    probe_levels,
    resolve_task,
    validate,
)
from topk_cli.analysis.train_probe.gradcheck import (
    GradQuality,
    TrueGradient,
    gradient_quality,
    probe_points,
    true_gradient,
)
from topk_cli.analysis.train_probe.results import (
    MAX_REFUSED,
    Calibration,
    GradCheckRow,
    RunRow,
    SummaryRow,
    TaskInfo,
    TrainProbeResult,
    has_gradient,
    is_baseline,
    is_stochastic,
    method_params,
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
from topk_cli.analysis.train_probe.verdicts import summarise

__all__ = [
    "DEFAULT_TASKS",
    "MAX_REFUSED",
    "QUICK",
    "TASKS",
    "Calibration",
    "GradCheckRow",
    "Level",
    "ProbeConfig",
    "RunRow",
    "SummaryRow",
    "TaskInfo",
    "TrainProbeResult",
    "parse_hardness",
    "parse_tasks",
    "probe_config",
    "train_probe",
]

#: Warn when the Monte Carlo true gradient's split-half cosine is below this.
SPLIT_HALF_WARNING = 0.8
_PURPOSE = {"truth": 0, "stream": 1, "held_out": 2, "calibration": 3, "check": 4, "perturb": 5}


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



def _calibrate(
    task: Task, config: ProbeConfig, data: SeedData, method: str, levels: Sequence[Level]
) -> list[Calibration]:
    """Tau per level on the initial score distribution of the first seed (shared grid)."""
    if is_baseline(method):  # no gradient whatever tau: trained once, at tau = 1, as the baseline
        return [Calibration(task.name, method, lv.label, 1.0, None, None, "baseline") for lv in levels]
    rng = _rng(config.seed, task.name, 0, "calibration")
    _, hidden = task.truth(_rng(config.seed, task.name, 0, "truth"))
    inst = {key: value[None] for key, value in task.instances(rng, hidden, config.calibration_rows).items()}
    s = task.scores(data.theta0[:1], inst)
    x = s if config.scale == "free" else standardise(s)[0]
    x = x.reshape(-1, task.n)
    targets = [lv.hardness for lv in levels if lv.hardness is not None]
    params = method_params(method, config)
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



def train_probe(
    config: ProbeConfig | None = None, *, progress: Callable[[int, int], None] | None = None
) -> TrainProbeResult:
    """Calibrate, train, check gradients and judge every (task, method, level) of ``config``.

    Raises:
        InvalidArgumentError: an unknown task or method, a hardness outside ``(k/n, 1)``, a
            non-positive tau, count, learning rate or target.
    """
    config = config or ProbeConfig()
    validate(config)
    start = time.perf_counter()
    levels = probe_levels(config)
    check_levels = levels
    if config.grad_check:
        extra = [Level(f"mass {h:g}", hardness=h) for h in config.grad_check_hardness if h not in config.hardness]
        check_levels = tuple(sorted([*levels, *extra], key=lambda lv: (lv.hardness is None, lv.hardness or 0.0)))
    train_config = TrainConfig(
        steps=config.steps, batch=config.batch, optimizer=config.optimizer, lr=config.learning_rate,
        eval_every=config.eval_every, target=config.target, straight_through=config.straight_through,
        free_scale=config.scale == "free",
    )
    tasks = [resolve_task(name, config) for name in config.tasks]
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
                    if c.tau is None or not has_gradient(m):
                        continue
                    qs = [
                        gradient_quality(
                            task, t, inst, m, c.tau,
                            seeds=(step_seed(config.seed, 10**9 + i), step_seed(config.seed, 2 * 10**9 + i))
                            if is_stochastic(m) else None,
                            params=method_params(m, config), free_scale=config.scale == "free",
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
                if c.tau is not None and has_gradient(m):
                    o = train(
                        task, data, m, c.tau, train_config, reseed=config.seed if is_stochastic(m) else None,
                        params=method_params(m, config),
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
                summarise(
                    task, lv, config.methods, {m: cal[(m, lv.label)] for m in config.methods}, outcomes,
                    {m: quality.get((m, lv.label), []) for m in config.methods}, config,
                )
            )
    return TrainProbeResult(
        config=config, tasks=tuple(infos), levels=levels, check_levels=check_levels,
        calibrations=tuple(calibrations), runs=tuple(runs), grad_check=tuple(checks_out), summary=tuple(summary),
        warnings=tuple(warnings), elapsed_s=time.perf_counter() - start, curves=curves,
    )
