"""The gradient check: how well an operator's gradient points along the true one.

The *true gradient* is the gradient of the expected **hard**-top-k loss, smoothed in parameter
space as in Berthet et al. (2020, Learning with differentiable perturbed optimizers):

    g_true = grad_theta E_eps[ L_hard(theta + sigma eps) ],  eps ~ N(0, I),

estimated with antithetic pairs, ``(L(theta + sigma eps) - L(theta - sigma eps)) eps / (2 sigma)``,
on a fixed set of instances. Its Monte Carlo noise is reported as the *split-half* cosine (the
cosine between the estimates of the two halves of the pairs). Cosines to it follow the gradient
quality metrics of Niepert et al. (2021, I-MLE), Minervini et al. (2023, AIMLE) and Ahmed et al.
(2023, SIMPLE). Both gradients are projected on the tangent space of the unit sphere (the loss
does not depend on the norm of ``theta``).

It is evaluated at *probe points* ``theta(a) = unit((1 - a) theta0 + a theta*)`` between the
initialisation and the oracle, shared by every method and temperature (a paired comparison).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topk_cli.analysis.train_probe.tasks import Instances, Task, unit
from topk_cli.analysis.train_probe.training import backward, hard_topk, tangent
from topk_cli.operators._base import FloatArray

MINIBATCH = 32


@dataclass(frozen=True)
class TrueGradient:
    """The smoothed hard-loss gradient at one probe point, with its split-half noise check."""

    point: float
    theta: FloatArray  # (1, P)
    gradient: FloatArray  # (P,)
    split_half: float
    metric: float  # hard metric / oracle at the point


@dataclass(frozen=True)
class GradQuality:
    """One method at one temperature at one probe point."""

    cos_true: float | None  # full-batch cosine (None when the gradient is zero or not finite)
    cos_minibatch: float | None  # mean over minibatches of 32 of the minibatch gradient's cosine
    grad_norm: float
    dead_rows: float
    refused_rows: float
    #: Monte Carlo operators: cosine between the full-batch gradients of two independent noise
    #: seeds (1 = no estimator noise); None for deterministic operators.
    cos_self: float | None = None


def cosine(a: FloatArray, b: FloatArray) -> float | None:
    """Cosine of two vectors; None when either is zero or not finite."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if not (np.isfinite(na) and np.isfinite(nb)) or na == 0 or nb == 0:
        return None
    return float(np.dot(a, b) / (na * nb))


def _hard_loss(task: Task, thetas: FloatArray, inst: Instances) -> FloatArray:
    hard = hard_topk(task.scores(thetas, inst), task.k)
    loss, _ = task.loss(hard, inst)
    return np.asarray(loss.mean(axis=-1))


def true_gradient(
    task: Task,
    theta: FloatArray,
    inst: Instances,
    *,
    point: float,
    pairs: int,
    sigma: float,
    rng: np.random.Generator,
    oracle_metric: float,
) -> TrueGradient:
    """Antithetic estimate of the smoothed hard-loss gradient at ``theta (1, P)`` on ``inst``.

    ``inst`` arrays have a leading axis of size 1; ``sigma`` is relative to ``||theta|| = 1``.
    """
    eps = rng.standard_normal((pairs, task.params))
    plus = _hard_loss(task, theta + sigma * eps, inst)
    minus = _hard_loss(task, theta - sigma * eps, inst)
    contrib = ((plus - minus) / (2.0 * sigma))[:, None] * eps
    half = pairs // 2
    g = tangent(theta, contrib.mean(axis=0)[None])[0]
    g1 = tangent(theta, contrib[:half].mean(axis=0)[None])[0]
    g2 = tangent(theta, contrib[half:].mean(axis=0)[None])[0]
    split = cosine(g1, g2)
    metric = float(task.metric_value(hard_topk(task.scores(theta, inst), task.k), inst).mean()) / oracle_metric
    return TrueGradient(point, theta, g, split if split is not None else float("nan"), metric)


def probe_points(theta0: FloatArray, oracle: FloatArray, points: tuple[float, ...]) -> list[FloatArray]:
    """``unit((1 - a) theta0 + a oracle)`` for each ``a`` (arrays ``(1, P)``)."""
    return [unit(((1 - a) * theta0 + a * oracle)[None]) for a in points]


def gradient_quality(
    task: Task,
    truth: TrueGradient,
    inst: Instances,
    method: str,
    tau: float,
    *,
    seeds: tuple[int, int] | None = None,
    params: dict[str, int] | None = None,
    free_scale: bool = False,
) -> GradQuality:
    """Full-batch and minibatch cosines of ``method``'s gradient with the true gradient.

    ``seeds``: for a Monte Carlo operator, two noise seeds; the gradient of the first is
    judged, and ``cos_self`` compares it with the second's. ``params`` go to the method. Only the
    tangent part of the gradient is compared (the hard loss does not depend on the norm of
    ``theta``), also with ``free_scale``.
    """
    base = dict(params or {})
    out = backward(
        task, truth.theta, inst, method, tau, params={**base, **({"seed": seeds[0]} if seeds else {})},
        free_scale=free_scale,
    )
    rows = out.grad_theta[0]  # (m, P)
    m = rows.shape[0]
    full = tangent(truth.theta, rows.mean(axis=0)[None])[0]
    batches = m // MINIBATCH
    mini = [
        cosine(tangent(truth.theta, rows[b * MINIBATCH : (b + 1) * MINIBATCH].mean(axis=0)[None])[0], truth.gradient)
        for b in range(batches)
    ]
    # a zero minibatch gradient carries no direction: it counts as cosine 0
    mini_values = [c if c is not None else 0.0 for c in mini]
    norm = float(np.linalg.norm(full))
    cos_self = None
    if seeds is not None:
        other = backward(task, truth.theta, inst, method, tau, params={**base, "seed": seeds[1]}, free_scale=free_scale)
        cos_self = cosine(full, tangent(truth.theta, other.grad_theta[0].mean(axis=0)[None])[0])
    return GradQuality(
        cos_true=cosine(full, truth.gradient),
        cos_minibatch=float(np.mean(mini_values)) if mini_values and norm > 0 else None,
        grad_norm=norm if np.isfinite(norm) else float("inf"),
        dead_rows=float(out.dead.mean()),
        refused_rows=float(out.refused.mean()),
        cos_self=cos_self,
    )
