"""``scaled-sigmoid``: sigmoids rescaled to sum to k, with a complementary form (no solve).

From public code citing Pervez et al. (2023), "Neural conditional Poisson sampling" (its
``scaled_sigmoid(theta, k)``): with ``s_i = sigmoid(z_i)`` and ``S = sum s``, ``p = k s / S`` when
``k <= S``, else ``1 - p = (n - k)(1 - s) / (n - S)``. Both forms sum to k; the first stays below
``s <= 1`` because ``k / S <= 1``, the second's complement below ``1 - s`` because ``(n - k) / (n - S)
< 1``: ``p`` lies in ``[0, 1]`` without a threshold to solve. The two agree at ``S = k`` (both give
``s``), so the map is continuous; its derivative jumps there. The public code takes raw logits
``theta`` and is not shift-invariant (a shift changes every sigmoid), so here ``theta = z = x / tau``,
uncentred (``Implementation.centred`` False): centring would change the map (the largest sigmoid
would always be 1/2, so it could never become hard).

Accuracy: ``1 - s = sigmoid(-z)`` exactly; ``n - S`` is the sum of those; ``S - k`` is computed as
``sum_{j not in top k} s_j - sum_{j in top k} (1 - s_j)`` (small terms, no cancellation of k), and
``1 - p = (S - k + k (1 - s)) / S`` in the first form, ``p = ((n - k) s - (S - k)) / (n - S)`` in the
second: sums of non-negative terms. Masked entries have ``s = 0``, are left out of ``n`` and get 0.

Jacobian: ``diag(alpha) - beta gamma^T`` with ``gamma = s (1 - s)`` and, in the first form,
``alpha = p (1 - s)``, ``beta = p / S``; in the second, ``alpha = (1 - p) s``, ``beta = (1 - p) / (n - S)``;
no centring to go through (the implementation receives ``x / tau`` itself).
"""

from __future__ import annotations

import numpy as np

from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.references import BoolArray, ReferenceContext


def _sigmoids(z: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sigmoid(z), 1 - sigmoid(z))`` from one ``exp(-|z|)`` (no overflow, no subtraction), 0 and 0
    on masked entries (``z = -inf``: 1 - s is set to 0 there, left out of ``n - S``)."""
    with np.errstate(under="ignore", invalid="ignore"):
        e = np.exp(-np.abs(z))
    r = 1.0 / (1.0 + e)
    fin = np.isfinite(z)
    s = np.where(z >= 0.0, r, np.where(fin, e * r, 0.0))
    t = np.where(z >= 0.0, e * r, np.where(fin, r, 0.0))
    return s, t


def _parts(z: FloatArray, k: int) -> dict[str, FloatArray]:
    fin = np.isfinite(z)
    s, t = _sigmoids(z)
    m = fin.sum(axis=1).astype(np.float64)
    top = np.zeros(z.shape, dtype=bool)
    np.put_along_axis(top, np.argpartition(-z, k - 1, axis=1)[:, :k], True, axis=1)
    d = np.where(top, 0.0, s).sum(axis=1) - np.where(top, t, 0.0).sum(axis=1)  # S - k
    total_s = s.sum(axis=1)
    total_t = t.sum(axis=1)  # n - S
    return {"s": s, "t": t, "m": m, "d": d, "S": total_s, "T": total_t, "first": (d >= 0).astype(np.float64)}


def scaled_sigmoid_forward(z: FloatArray, k: int) -> Forward:
    """``p = k s / S`` where ``k <= S``, else ``1 - (n - k)(1 - s) / (n - S)``.

    >>> np.round(scaled_sigmoid_forward(np.array([[0.0, -1.0, -2.0]]), 1).p, 4)
    array([[0.5265, 0.3077, 0.1659]])
    """
    a = _parts(z, k)
    s, t, d = a["s"], a["t"], a["d"][:, None]
    first = a["first"][:, None] > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        p1 = k * s / a["S"][:, None]
        q1 = (d + k * t) / a["S"][:, None]
        q2 = (a["m"][:, None] - k) * t / a["T"][:, None]
        p2 = ((a["m"][:, None] - k) * s - d) / a["T"][:, None]
    fin = np.isfinite(z)
    p = np.where(fin, np.where(first, p1, p2), 0.0)
    q = np.where(fin, np.where(first, q1, q2), 1.0)
    return Forward(p=p, q=q, aux={"first": a["first"], "S": a["S"], "T": a["T"]})


def _factors(fwd: Forward, z: FloatArray, k: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    s, t = _sigmoids(z)
    first = fwd.aux["first"][:, None] > 0
    alpha = np.where(first, fwd.p * t, fwd.q * s)
    beta = np.where(first, fwd.p / fwd.aux["S"][:, None], fwd.q / fwd.aux["T"][:, None])
    return alpha, np.where(np.isfinite(z), beta, 0.0), s * t  # masked: q = 1 but no dependence


def scaled_sigmoid_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """``dp/dz``, ``(B, n, n)``."""
    alpha, beta, gamma = _factors(fwd, z, k)
    n = z.shape[1]
    jac = -beta[:, :, None] * gamma[:, None, :]
    idx = np.arange(n)
    jac[:, idx, idx] += alpha
    return jac


def scaled_sigmoid_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """``v^T dp/dz = alpha v - gamma (beta . v)``, ``O(n)`` per row."""
    alpha, beta, gamma = _factors(fwd, z, k)
    return alpha * v - gamma * (beta * v).sum(axis=1, keepdims=True)


def scaled_sigmoid_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The public formula in extended precision (``np.longdouble``; ``1 - s`` by subtraction), every
    row trusted except where ``S`` is within 1e-9 of k (the branch taken is a rounding decision)."""
    fin = np.isfinite(z)
    zl = z.astype(np.longdouble)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        s = np.where(fin, 1 / (1 + np.exp(-zl)), 0)
    n = fin.sum(axis=1, keepdims=True)
    total = s.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(k <= total, k * s / total, 1 - (n - k) * (1 - s) / (n - total))
    p = np.where(fin, p, 0)
    return p.astype(np.float64), np.abs(total[:, 0] - k) > 1e-9


SCALED_SIGMOID = Implementation(
    forward=scaled_sigmoid_forward, jacobian=scaled_sigmoid_jacobian, vjp=scaled_sigmoid_vjp, elementwise=True,
    centred=False,
)
