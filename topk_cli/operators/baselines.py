"""Two baselines of the field: ``k-softmax`` (the naive router) and ``straight-through`` hard top-k.

``k-softmax``: ``p = k softmax(z)``. It sums to k and is smooth, shift-invariant and strictly
monotone, but an entry exceeds 1 as soon as its softmax weight exceeds ``1 / k``, and its
``tau -> 0`` limit puts k on the largest entry: not a top-k. At ``k = 1`` it is softmax itself
(the alias ``softmax``). ``1 - p`` is ``1 - k e_i / S`` off the largest entry and ``(S' - (k - 1)) / S``
on it (``S'`` the sum of the other exponentials, ``S = 1 + S'``).

``straight-through``: the forward pass is hard top-k (:func:`~topk_cli.operators.hard.hard_topk`,
ties at the k-th value sharing the rest); the Jacobian and VJP are those of a soft method at the
same ``z`` (thre-sigmoid in the registry; :func:`straight_through` builds it for another
implementation), as a training loop uses the straight-through estimator (Bengio, Leonard &
Courville 2013, "Estimating or propagating gradients through stochastic neurons"). The Jacobian is
therefore not the derivative of the forward pass (which is 0 wherever it exists).
"""

from __future__ import annotations

import numpy as np

from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.operators.hard import hard_topk
from topk_cli.operators.threshold_sigmoid import THRE_SIGMOID
from topk_cli.references import BoolArray, ReferenceContext


def k_softmax_forward(z: FloatArray, k: int) -> Forward:
    """``p = k e^z / S``; rows with one largest entry are elementwise.

    >>> np.round(k_softmax_forward(np.array([[0.0, -1.0, -2.0]]), 2).p, 4)
    array([[1.3305, 0.4895, 0.1801]])
    """
    bsz = z.shape[0]
    rows = np.arange(bsz)
    with np.errstate(under="ignore"):
        e = np.exp(z)  # the largest is 0: e = 1 there; masked 0
    top = np.argmax(z, axis=1)
    e[rows, top] = 0.0
    rest = e.sum(axis=1)
    shared = (e == 1.0).any(axis=1)  # another entry at the largest value
    e[rows, top] = 1.0
    total = (1.0 + rest)[:, None]
    s = e / total
    p = k * s
    q = 1.0 - p
    lone = np.flatnonzero(~shared)
    q[lone, top[lone]] = (rest[lone] - (k - 1)) / total[lone, 0]
    return Forward(p=p, q=q, aux={"soft": s}, elementwise_rows=~shared)


def k_softmax_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """``k (diag(s) - s s^T)``, ``s = softmax(z)``."""
    s = fwd.aux["soft"]
    jac = -k * s[:, :, None] * s[:, None, :]
    idx = np.arange(s.shape[1])
    jac[:, idx, idx] += k * s
    return jac


def k_softmax_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """``k s (v - s . v)``, ``O(n)`` per row."""
    s = fwd.aux["soft"]
    return k * s * (v - (s * v).sum(axis=1, keepdims=True))


def k_softmax_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """``k softmax(z)`` in extended precision (every row trusted)."""
    with np.errstate(under="ignore"):
        e = np.exp(z.astype(np.longdouble))
    return (k * e / e.sum(axis=1, keepdims=True)).astype(np.float64), np.ones(z.shape[0], dtype=bool)


K_SOFTMAX = Implementation(forward=k_softmax_forward, jacobian=k_softmax_jacobian, vjp=k_softmax_vjp, elementwise=False)


def straight_through(soft: Implementation) -> Implementation:
    """Hard top-k forward, ``soft``'s Jacobian and VJP (evaluated on ``soft``'s own forward pass)."""

    def forward(z: FloatArray, k: int) -> Forward:
        return hard_topk(z, k)

    def jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
        return soft.jacobian(soft.forward(z, k), z, k)

    def vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
        return soft.vjp(soft.forward(z, k), z, k, v)

    return Implementation(forward=forward, jacobian=jacobian, vjp=vjp, elementwise=True, z_floor=soft.z_floor)



#: The registry's ``straight-through``: backward of thre-sigmoid.
STRAIGHT_THROUGH = straight_through(THRE_SIGMOID)
