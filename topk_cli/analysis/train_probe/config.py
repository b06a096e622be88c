"""The probe's configuration: every option of ``softtopk train-probe``, its defaults and validation."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from topk_cli.analysis.train_probe.tasks import DEFAULT_TASKS, TASKS, Task
from topk_cli.api import check_tau, get_method
from topk_cli.errors import InvalidArgumentError
from topk_cli.registry import METHODS


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
    #: Override every task's number of items ``n`` and selection size ``k`` (None: the task's own).
    n: int | None = None
    k: int | None = None
    #: ``fixed``: the operator sees row z-scores and the parameters keep unit norm (tau means a
    #: fraction of the row's score sd); ``free``: raw scores, the model may sharpen itself.
    scale: str = "fixed"

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return 0.05 if self.optimizer == "adam" else 1.0


#: What ``--quick`` sets (CI smoke runs).
QUICK: dict[str, Any] = {"tasks": ("select",), "steps": 30, "seeds": 2, "grad_check": False}


@dataclass(frozen=True)
class Level:
    """A trained or checked temperature: a target hardness or a fixed tau."""

    label: str
    hardness: float | None = None
    tau: float | None = None


def probe_levels(config: ProbeConfig) -> tuple[Level, ...]:
    out = [Level(f"mass {h:g}", hardness=h) for h in config.hardness]
    out += [Level(f"tau {t:g}", tau=t) for t in config.taus]
    return tuple(out)


def resolve_task(name: str, config: ProbeConfig) -> Task:
    """Task ``name`` with the configuration's ``n`` and ``k`` overrides applied."""
    task = TASKS[name]
    changes = {key: value for key, value in (("n", config.n), ("k", config.k)) if value is not None}
    return dataclasses.replace(task, **changes) if changes else task  # type: ignore[type-var]


def validate(config: ProbeConfig) -> None:
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
    if config.n is not None and config.n < 2:
        raise InvalidArgumentError(f"-n must be an integer >= 2, got {config.n}")
    for name in config.tasks:
        task = resolve_task(name, config)
        if not 1 <= task.k < task.n:
            raise InvalidArgumentError(f"-k must satisfy 1 <= k < n (n={task.n}) for task {name}, got {task.k}")
        low = task.k / task.n
        for h in (*config.hardness, *config.grad_check_hardness):
            if not (math.isfinite(h) and low < h < 1):
                raise InvalidArgumentError(
                    f"hardness must be a top-k mass in (k/n, 1) = ({low:g}, 1) for task {name}, got {h:g}"
                )
    for t in config.taus:
        check_tau(t, name="--taus: tau")
    checks = {
        "--seeds": (config.seeds, 1), "--steps": (config.steps, 1), "--batch": (config.batch, 1),
        "eval_every": (config.eval_every, 1), "eval_instances": (config.eval_instances, 1),
        "calibration_rows": (config.calibration_rows, 1), "grad_check_instances": (config.grad_check_instances, 32),
        "grad_check_pairs": (config.grad_check_pairs, 2), "--samples": (config.mc_samples, 2),
    }
    for name, (value, low_int) in checks.items():
        if value < low_int:
            raise InvalidArgumentError(f"{name} must be >= {low_int}, got {value}")
    if config.scale not in ("fixed", "free"):
        raise InvalidArgumentError(f"--scale must be fixed or free, got {config.scale!r}")
    if config.optimizer not in ("adam", "sgd"):
        raise InvalidArgumentError(f"--optimizer must be adam or sgd, got {config.optimizer!r}")
    if not (math.isfinite(config.learning_rate) and config.learning_rate > 0):
        raise InvalidArgumentError(f"--lr must be a finite number > 0, got {config.learning_rate:g}")
    if not 0 < config.target <= 1.5:
        raise InvalidArgumentError(f"--target must be a share of the oracle's metric in (0, 1.5], got {config.target:g}")
    if not 0 < config.grad_check_sigma < 1:
        raise InvalidArgumentError(f"grad_check_sigma must be in (0, 1), got {config.grad_check_sigma:g}")


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
    """The configuration of a CLI call: ``--quick`` sets select only, 30 steps, 2 seeds and no
    gradient check, for whatever the user did not give explicitly."""
    levels = parse_hardness(hardness) if hardness is not None else (() if taus else (0.8,))
    return ProbeConfig(
        tasks=parse_tasks(tasks, quick=quick), methods=tuple(methods), hardness=levels, taus=tuple(taus),
        seeds=seeds if seeds is not None else (int(QUICK["seeds"]) if quick else ProbeConfig.seeds),
        steps=steps if steps is not None else (int(QUICK["steps"]) if quick else ProbeConfig.steps),
        grad_check=grad_check if grad_check is not None else not quick,
        **options,
    )
