"""The probe's synthetic training tasks: a planted ground truth, a model, a loss, a hard metric.

Every task works on a leading *seed* axis ``S`` so that all seeds train in one operator call:
parameters ``theta`` are ``(S, P)``, instance arrays ``(S, m, ...)`` and scores ``(S, m, n)``.
Scores are standardised per row (z-score over the n items) before the operator sees them, so
tau is in units of the row's score standard deviation and the loss does not depend on the norm
of ``theta`` (the trainer keeps it at 1).

* ``select``: n = 20 items with features ``f in R^8``; a planted unit ``w*`` and the target
  ``y`` = k-hot of the top-3 of ``F w*``; scores ``F theta``; loss ``||p - y||^2 / k``;
  metric precision@k of the hard top-k of the scores (oracle 1 at ``theta = w*``).
* ``topk-sum``: the same items plus values ``v_i ~ N(0, 1)``; only ``y = sum of v`` over the
  planted top-3 is observed; prediction ``p . v``; loss ``(p . v - y)^2 / k``; metric as
  ``select``: weak supervision (one number per instance).
* ``knn``: a query and 20 labelled candidates in R^6 (4 classes on a circle in a hidden plane,
  4 nuisance directions with sd 3, all rotated at random); scores ``-||A (q - c_j)||^2`` with
  ``A in R^{2x6}``; loss minus the share of the soft top-5 mass on candidates of the query's
  class; metric the accuracy of the majority vote of the hard top-5 (oracle: ``A`` = the
  projection on the hidden plane, about 0.7; chance about 0.25).

Differentiable kNN as a training task follows Grover et al. (2019, NeuralSort) and Xie et al.
(2020, Differentiable Top-k with Optimal Transport); planted-subset tasks follow the synthetic
k-subset benchmarks of Niepert et al. (2021, I-MLE) and Ahmed et al. (2023, SIMPLE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from topk_cli.operators._base import FloatArray
from topk_cli.operators.hard import hard_topk_weights

Instances = dict[str, np.ndarray]


def standardise(s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Row z-scores ``x = (s - mean) / sd`` over the last axis, and ``sd`` (keepdims)."""
    centred = s - s.mean(axis=-1, keepdims=True)
    sd = np.sqrt(np.mean(centred**2, axis=-1, keepdims=True))
    sd = np.where(sd > 0, sd, 1.0)
    return centred / sd, sd


def standardise_backward(x: FloatArray, sd: FloatArray, g: FloatArray) -> FloatArray:
    """``dL/ds`` from ``g = dL/dx`` for ``x = standardise(s)``."""
    return (g - g.mean(axis=-1, keepdims=True) - x * np.mean(g * x, axis=-1, keepdims=True)) / sd


def unit(theta: FloatArray) -> FloatArray:
    """Rows of ``theta`` scaled to unit norm."""
    return theta / np.linalg.norm(theta, axis=-1, keepdims=True)


class Task(Protocol):
    """What the trainer and the gradient check need from a task (arrays carry a seed axis)."""

    @property
    def name(self) -> str: ...
    @property
    def n(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def params(self) -> int:
        """Number of trained parameters P."""

    @property
    def metric(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def chance(self) -> float:
        """Expected metric of a random scorer."""

    def truth(self, rng: np.random.Generator) -> tuple[FloatArray, Instances]:
        """The oracle parameter ``(P,)`` and the hidden structure that generates instances."""

    def instances(self, rng: np.random.Generator, hidden: Instances, count: int) -> Instances:
        """``count`` instances (arrays with a leading instance axis)."""

    def scores(self, theta: FloatArray, inst: Instances) -> FloatArray:
        """Raw scores ``(S, m, n)`` for ``theta (S, P)``."""

    def scores_backward(self, theta: FloatArray, inst: Instances, g: FloatArray) -> FloatArray:
        """Per-instance gradients ``(S, m, P)`` from ``g = dL/ds (S, m, n)``."""

    def loss(self, p: FloatArray, inst: Instances) -> tuple[FloatArray, FloatArray]:
        """Per-instance loss ``(S, m)`` and ``dL/dp (S, m, n)`` for weights ``p``."""

    def metric_value(self, hard: FloatArray, inst: Instances) -> FloatArray:
        """Per-instance hard metric ``(S, m)`` from the hard top-k weights of the scores."""


@dataclass(frozen=True)
class SelectTask:
    """Learn a linear scorer that picks a planted k-of-n subset (direct supervision)."""

    name: str = "select"
    n: int = 20
    k: int = 3
    dim: int = 8
    metric: str = "precision@k"
    description: str = "learn a linear scorer to pick a planted {k}-of-{n} subset"

    @property
    def params(self) -> int:
        return self.dim

    @property
    def chance(self) -> float:
        return self.k / self.n

    def truth(self, rng: np.random.Generator) -> tuple[FloatArray, Instances]:
        w = unit(rng.standard_normal(self.dim))
        return w, {"w": w}

    def instances(self, rng: np.random.Generator, hidden: Instances, count: int) -> Instances:
        f = rng.standard_normal((count, self.n, self.dim))
        s = f @ hidden["w"]
        y = hard_topk_weights(s, self.k)  # continuous scores: no ties, a 0/1 k-hot target
        return {"f": f, "y": y}

    def scores(self, theta: FloatArray, inst: Instances) -> FloatArray:
        return np.asarray((inst["f"] @ theta[:, None, :, None])[..., 0], dtype=np.float64)

    def scores_backward(self, theta: FloatArray, inst: Instances, g: FloatArray) -> FloatArray:
        return np.asarray(np.einsum("smnd,smn->smd", inst["f"], g), dtype=np.float64)

    def loss(self, p: FloatArray, inst: Instances) -> tuple[FloatArray, FloatArray]:
        r = p - inst["y"]
        return np.sum(r * r, axis=-1) / self.k, 2.0 * r / self.k

    def metric_value(self, hard: FloatArray, inst: Instances) -> FloatArray:
        return np.asarray(np.sum(hard * inst["y"], axis=-1) / self.k, dtype=np.float64)


@dataclass(frozen=True)
class TopkSumTask(SelectTask):
    """The planted subset observed only through the sum of its values (weak supervision)."""

    name: str = "topk-sum"
    description: str = "learn the scorer from the sum of values over a planted {k}-of-{n} subset"

    def instances(self, rng: np.random.Generator, hidden: Instances, count: int) -> Instances:
        inst = super().instances(rng, hidden, count)
        v = rng.standard_normal((count, self.n))
        inst["v"] = v
        inst["target"] = np.sum(v * inst["y"], axis=-1)
        return inst

    def loss(self, p: FloatArray, inst: Instances) -> tuple[FloatArray, FloatArray]:
        r = np.sum(p * inst["v"], axis=-1) - inst["target"]
        return r * r / self.k, (2.0 * r / self.k)[..., None] * inst["v"]


@dataclass(frozen=True)
class KnnTask:
    """Learn a 2-D projection for k-nearest-neighbour classification (a downstream loss)."""

    name: str = "knn"
    n: int = 20
    k: int = 5
    dim: int = 6
    classes: int = 4
    radius: float = 1.0
    spread: float = 0.5
    nuisance_sd: float = 3.0
    metric: str = "kNN accuracy"
    description: str = "learn a 2-D projection for {k}-NN among {n} candidates"

    @property
    def params(self) -> int:
        return 2 * self.dim

    @property
    def chance(self) -> float:
        return 1.0 / self.classes

    def truth(self, rng: np.random.Generator) -> tuple[FloatArray, Instances]:
        rotation, _ = np.linalg.qr(rng.standard_normal((self.dim, self.dim)))
        oracle = rotation[:, :2].T.reshape(-1)  # projection on the hidden plane, unit Frobenius norm / sqrt 2
        return unit(oracle), {"rotation": rotation}

    def _points(self, rng: np.random.Generator, labels: np.ndarray, rotation: FloatArray) -> FloatArray:
        angle = 2 * np.pi * labels / self.classes
        plane = self.radius * np.stack([np.cos(angle), np.sin(angle)], axis=-1)
        plane = plane + self.spread * rng.standard_normal(plane.shape)
        nuisance = self.nuisance_sd * rng.standard_normal((*labels.shape, self.dim - 2))
        return np.asarray(np.concatenate([plane, nuisance], axis=-1) @ rotation.T, dtype=np.float64)

    def instances(self, rng: np.random.Generator, hidden: Instances, count: int) -> Instances:
        rotation = hidden["rotation"]
        q_label = rng.integers(0, self.classes, size=count)
        c_label = rng.integers(0, self.classes, size=(count, self.n))
        q = self._points(rng, q_label, rotation)
        c = self._points(rng, c_label, rotation)
        same = (c_label == q_label[:, None]).astype(np.float64)
        onehot = (c_label[..., None] == np.arange(self.classes)).astype(np.float64)
        return {"u": q[:, None, :] - c, "same": same, "onehot": onehot, "label": q_label.astype(np.float64)}

    def scores(self, theta: FloatArray, inst: Instances) -> FloatArray:
        a = theta.reshape(theta.shape[0], 1, 2, self.dim)
        au = inst["u"] @ np.swapaxes(a, -1, -2)  # (S, m, n, 2)
        return np.asarray(-np.sum(au * au, axis=-1), dtype=np.float64)

    def scores_backward(self, theta: FloatArray, inst: Instances, g: FloatArray) -> FloatArray:
        a = theta.reshape(theta.shape[0], 1, 2, self.dim)
        au = inst["u"] @ np.swapaxes(a, -1, -2)
        grad = -2.0 * np.einsum("smn,smni,smnj->smij", g, au, inst["u"])
        return np.asarray(grad.reshape(*g.shape[:2], -1), dtype=np.float64)

    def loss(self, p: FloatArray, inst: Instances) -> tuple[FloatArray, FloatArray]:
        same = np.broadcast_to(inst["same"], p.shape)
        return -np.sum(p * same, axis=-1) / self.k, -same / self.k

    def metric_value(self, hard: FloatArray, inst: Instances) -> FloatArray:
        votes = np.einsum("smn,smnc->smc", hard, np.broadcast_to(inst["onehot"], (*hard.shape, self.classes)))
        votes = votes + 1e-9 * np.arange(self.classes, 0, -1)  # exact vote ties: the lowest class wins
        return np.asarray(np.argmax(votes, axis=-1) == inst["label"], dtype=np.float64)


TASKS: dict[str, Task] = {t.name: t for t in (SelectTask(), TopkSumTask(), KnnTask())}
DEFAULT_TASKS = ("select", "knn")
