"""Backprop through an operator with per-row refusals, and the seed-vectorised trainer.

The forward pass is :func:`topk_cli.evaluate`'s (its preparation and per-row diagnosis); rows it
refuses get zero gradient and are counted (never averaged in as NaN). When every row succeeded,
the backward pass applies the method's VJP to that same forward pass, which is what
:func:`topk_cli.vjp` computes after recomputing it (methods with a fused forward-and-VJP pass
still go through ``vjp``). Otherwise it calls :func:`topk_cli.vjp` on the rows that succeeded;
rows whose backward alone fails are dropped, counted as refused, and the call is retried
without them.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from topk_cli.analysis.train_probe.tasks import Instances, Task, standardise, standardise_backward, unit
from topk_cli.api import _forward, _prepare, _Prepared, _vjp_of, vjp
from topk_cli.errors import NumericalFailureError
from topk_cli.operators._base import OK, FloatArray
from topk_cli.operators.hard import hard_topk_weights

#: A row whose gradient with respect to the scores has a norm below this is *dead*.
DEAD_ROW = 1e-8
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class Backward:
    """Per-row results of one forward + backward pass on ``(S, m, n)`` scores."""

    loss: FloatArray  # (S, m), NaN on refused rows
    grad_theta: FloatArray  # (S, m, P) per-row gradients, 0 on refused rows
    refused: np.ndarray  # (S, m) bool
    dead: np.ndarray  # (S, m) bool: refused, or ||dL/dx|| < DEAD_ROW


def hard_topk(s: FloatArray, k: int) -> FloatArray:
    """The hard top-k of the last axis of finite scores (ties at the k-th value share the rest)."""
    return hard_topk_weights(s, k)


def backward(
    task: Task,
    theta: FloatArray,
    inst: Instances,
    method: str,
    tau: float,
    *,
    straight_through: bool = False,
    params: Mapping[str, int] | None = None,
    free_scale: bool = False,
) -> Backward:
    """Loss and per-row parameter gradients of ``task`` through ``method`` at temperature ``tau``.

    With ``straight_through`` the loss is taken at the hard top-k and its gradient is passed
    back through the operator's vector-Jacobian product. ``params`` are the method's extra
    parameters (e.g. the ``seed`` of a Monte Carlo method's noise), passed to both calls. With
    ``free_scale`` the operator sees the raw scores instead of their row z-scores.
    """
    kw: dict[str, Any] = {"tau": tau, **(params or {})}
    s = task.scores(theta, inst)
    shape = s.shape
    x, sd = (s, np.ones((*shape[:-1], 1))) if free_scale else standardise(s)
    flat = x.reshape(-1, shape[-1])
    # what evaluate() does, keeping its forward pass for the VJP below
    prep = _prepare(flat, task.k, method, tau, params)
    fwd, _ = _forward(prep)
    ok = fwd.codes() == OK
    weights = fwd.p.astype(prep.out_dtype, copy=False)
    p = np.where(ok[:, None], np.asarray(weights, dtype=np.float64), 0.0).reshape(shape)
    if straight_through:
        p = np.where(ok.reshape(shape[:-1])[..., None], hard_topk(x, task.k), 0.0)
    loss, g_p = task.loss(p, inst)
    g_p = np.where(ok.reshape(shape[:-1])[..., None], g_p, 0.0).reshape(flat.shape)
    g_x = np.zeros_like(flat)
    rows = np.flatnonzero(ok)
    if _reuse_forward(prep, rows, g_p):  # every row succeeded: no second forward pass
        g_x = _vjp_of(prep, fwd, g_p, g_p)  # a new array (rows are zeroed below), never a view of g_p
        rows = rows[:0]
    while rows.size:
        try:
            g_x[rows] = vjp(flat[rows], task.k, g_p[rows], method, **kw)
            break
        except NumericalFailureError as exc:  # backward-only failure: drop those rows, retry
            failed = {f.row[0] for f in exc.failures if f.row}
            if not failed:
                rows = rows[:0]
                break
            keep = np.array([i not in failed for i in range(rows.size)])
            ok[rows[~keep]] = False
            rows = rows[keep]
    finite = np.isfinite(g_x).all(axis=-1)
    ok &= finite
    g_x[~ok] = 0.0
    dead = ~ok | (np.linalg.norm(g_x, axis=-1) < DEAD_ROW)
    g_s = g_x.reshape(shape) if free_scale else standardise_backward(x, sd, g_x.reshape(shape))
    grad = task.scores_backward(theta, inst, g_s)
    refused = ~ok.reshape(shape[:-1])
    return Backward(
        loss=np.where(refused, np.nan, loss), grad_theta=grad, refused=refused, dead=dead.reshape(shape[:-1])
    )


def _reuse_forward(prep: _Prepared, rows: np.ndarray, v: FloatArray) -> bool:
    """True when :func:`topk_cli.vjp` on ``rows`` would recompute exactly the forward pass
    already in hand and then apply the method's VJP to it: every row succeeded, ``v`` is finite,
    and the method has no fused forward-and-VJP pass that ``vjp`` would run instead."""
    fused = prep.impl.forward_vjp is not None and not prep.params
    return 0 < rows.size == prep.z.shape[0] and not fused and bool(np.isfinite(v).all())


def tangent(theta: FloatArray, g: FloatArray) -> FloatArray:
    """``g`` projected on the tangent space of the unit sphere at each row of ``theta``."""
    return g - np.sum(g * theta, axis=-1, keepdims=True) * theta


@dataclass(frozen=True)
class TrainConfig:
    """How to train: steps, minibatch, optimiser, learning rate, evaluation cadence, target."""

    steps: int
    batch: int
    optimizer: str
    lr: float
    eval_every: int
    target: float
    straight_through: bool = False
    free_scale: bool = False  # raw scores, parameters free to grow (else z-scores, unit norm)


@dataclass(frozen=True)
class SeedData:
    """Everything a task needs for all seeds, stacked on a leading seed axis (shared by methods)."""

    theta0: FloatArray  # (S, P) unit
    oracle: FloatArray  # (S, P) unit
    stream: Instances  # (S, steps * batch, ...)
    held_out: Instances  # (S, m_eval, ...)
    oracle_metric: FloatArray  # (S,) metric of the oracle on the held-out set


@dataclass(frozen=True)
class TrainOutcome:
    """One (task, method, tau) trained for every seed: curves normalised by each seed's oracle."""

    steps: tuple[int, ...]
    curves: FloatArray  # (S, evaluations) metric / oracle
    grad_norm_median: FloatArray  # (S,) median tangent gradient norm over steps
    dead_rows: FloatArray  # (S,) mean share over steps
    refused_rows: FloatArray  # (S,)
    nonfinite_steps: np.ndarray  # (S,) steps whose gradient was not finite (skipped)
    data_hash: tuple[str, ...]  # (S,) sha256 of every minibatch and held-out set consumed
    seconds: float


def _take(inst: Instances, start: int, stop: int) -> Instances:
    return {key: value[:, start:stop] for key, value in inst.items()}


def _evaluate_metric(task: Task, theta: FloatArray, data: SeedData) -> FloatArray:
    hard = hard_topk(task.scores(theta, data.held_out), task.k)
    return np.asarray(task.metric_value(hard, data.held_out).mean(axis=-1) / data.oracle_metric)


def step_seed(seed: int, step: int) -> int:
    """The noise seed of a Monte Carlo operator at one training step (fresh noise every step,
    the same for every method and seed of the probe: common random numbers)."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0] >> 1)


def train(
    task: Task,
    data: SeedData,
    method: str,
    tau: float,
    config: TrainConfig,
    *,
    reseed: int | None = None,
    params: Mapping[str, int] | None = None,
) -> TrainOutcome:
    """Train ``task`` through ``method`` at ``tau`` for every seed at once (one call per step).

    With ``reseed`` (the probe's seed), a method with a ``seed`` parameter gets fresh noise at
    every step (:func:`step_seed`), as a stochastic operator would in real training. ``params``
    go to the method at every step (e.g. ``samples``).
    """
    start = time.perf_counter()
    theta = data.theta0.copy()
    seeds = theta.shape[0]
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    hashers = [hashlib.sha256() for _ in range(seeds)]
    for s in range(seeds):
        for key in sorted(data.held_out):
            hashers[s].update(np.ascontiguousarray(data.held_out[key][s]).tobytes())
    evals = [0]
    curve = [_evaluate_metric(task, theta, data)]
    norms = np.zeros((config.steps, seeds))
    dead = np.zeros(seeds)
    refused = np.zeros(seeds)
    nonfinite = np.zeros(seeds, dtype=np.int64)
    b1, b2 = ADAM_BETAS
    for step in range(config.steps):
        batch = _take(data.stream, step * config.batch, (step + 1) * config.batch)
        for s in range(seeds):
            for key in sorted(batch):
                hashers[s].update(np.ascontiguousarray(batch[key][s]).tobytes())
        step_params = {**(params or {}), **({"seed": step_seed(reseed, step)} if reseed is not None else {})}
        out = backward(
            task, theta, batch, method, tau, straight_through=config.straight_through, params=step_params,
            free_scale=config.free_scale,
        )
        g = out.grad_theta.mean(axis=1)
        if not config.free_scale:  # the loss does not depend on the norm: keep the tangent part
            g = tangent(theta, g)
        bad = ~np.isfinite(g).all(axis=-1)
        nonfinite += bad
        g[bad] = 0.0
        norms[step] = np.linalg.norm(g, axis=-1)
        dead += out.dead.mean(axis=1)
        refused += out.refused.mean(axis=1)
        if config.optimizer == "adam":
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            m_hat = m / (1 - b1 ** (step + 1))
            v_hat = v / (1 - b2 ** (step + 1))
            update = config.lr * m_hat / (np.sqrt(v_hat) + ADAM_EPS)
        else:
            update = config.lr * g
        theta = theta - update if config.free_scale else unit(theta - update)
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            evals.append(step + 1)
            curve.append(_evaluate_metric(task, theta, data))
    steps = max(config.steps, 1)
    return TrainOutcome(
        steps=tuple(evals),
        curves=np.stack(curve, axis=1),
        grad_norm_median=np.median(norms, axis=0) if config.steps else np.zeros(seeds),
        dead_rows=dead / steps,
        refused_rows=refused / steps,
        nonfinite_steps=nonfinite,
        data_hash=tuple(h.hexdigest()[:16] for h in hashers),
        seconds=time.perf_counter() - start,
    )


def steps_to_target(steps: tuple[int, ...], curve: FloatArray, target: float) -> int | None:
    """The first evaluated step at which ``curve >= target`` (None if never)."""
    hit = np.flatnonzero(curve >= target - 1e-12)
    return int(steps[hit[0]]) if hit.size else None


def auc(curve: FloatArray) -> float:
    """Mean of the normalised metric over the evaluation points (speed and level together)."""
    return float(np.mean(curve)) if curve.size else math.nan
