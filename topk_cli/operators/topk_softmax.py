"""The pseudo-smooth top-k of the source article's comments: hard top-(k-1), softmax over the rest.

Axis convention: every function acts on a validated ``(B, n)`` batch ``z`` (see ``_base``): the
largest finite entry of each row is 0, masked entries are ``-inf``.

``p_i = 1`` on the ``k - 1`` largest entries and ``p = softmax(z_R)`` over the other ``n - k + 1``
entries ``R``, so ``p`` lies in the capped simplex and sums to ``k``. At ``k = 1`` it is softmax; at
``k = n`` it is all ones. It is discontinuous wherever the ``(k-1)``-th and ``k``-th largest
entries swap: the entry leaving the hard set drops from 1 to its softmax weight. It is kept to
show what such a discontinuity looks like in the property matrix, the sweep and the probe.
Suggested in the comments of J. Su, "Softmax sequel: finding smooth approximations of Top-K"
(kexue.fm, 2024).

Ties between the ``(k-1)``-th and ``k``-th entries are resolved by position here; the public API
then averages ``p`` over groups of equal entries (the method is not elementwise), so equal
inputs get equal weights. The Jacobian is that of the selection made: 0 on the hard rows and
columns, the softmax Jacobian ``diag(s) - s s^T`` on ``R``. At a swap (a tie) no derivative
exists; the one returned belongs to the positional choice.
"""

from __future__ import annotations

import numpy as np

from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.operators._logspace import logsumexp, logsumexp_exclusive
from topk_cli.references import BoolArray, ReferenceContext


def _hard_set(z: FloatArray, k: int) -> np.ndarray:
    """Boolean ``(B, n)`` mask of the ``k - 1`` largest entries of each row."""
    hard = np.zeros(z.shape, dtype=bool)
    if k > 1:
        top = np.argpartition(-z, k - 2, axis=1)[:, : k - 1]
        np.put_along_axis(hard, top, True, axis=1)
    return hard


def topk_softmax_forward(z: FloatArray, k: int) -> Forward:
    """``p = 1`` on the top ``k - 1`` entries, ``softmax`` over the others; ``sum p = k``.

    ``q = 1 - p`` is the softmax mass of the *other* soft entries, summed in log space (no
    cancellation when one soft entry dominates).

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q (B, n)``; ``aux["soft"]`` (the softmax part,
    0 on the hard entries) and ``aux["hard"]`` (1.0 on the hard entries).

    >>> np.round(topk_softmax_forward(np.array([[0.0, -1.0, -2.0]]), 2).p, 4)
    array([[1.    , 0.7311, 0.2689]])
    """
    hard = _hard_set(z, k)
    rest = np.where(hard, -np.inf, z)
    # shift by the largest soft entry first: at |z| ~ 1e20, log(sum) = max + log(2) rounds to max
    # and the soft weights came out 1 each (sum p = k + 1)
    rest = rest - rest.max(axis=1, keepdims=True)  # finite max: at least one unmasked entry is soft
    total = logsumexp(rest)[:, None]
    with np.errstate(under="ignore"):  # far entries get weight 0, as they should
        soft = np.exp(rest - total)
        others = np.exp(logsumexp_exclusive(rest) - total)
    p = np.where(hard, 1.0, soft)
    q = np.where(hard, 0.0, np.where(np.isfinite(z), others, 1.0))
    return Forward(p=p, q=q, aux={"soft": np.where(hard, 0.0, soft), "hard": hard.astype(np.float64)})


def topk_softmax_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """``dp/dz``: ``diag(s) - s s^T`` on the soft entries, zero rows and columns on the hard ones.

    >>> fwd = topk_softmax_forward(np.array([[0.0, 0.0, 0.0]]), 2)
    >>> topk_softmax_jacobian(fwd, np.array([[0.0, 0.0, 0.0]]), 2)[0] + 0.0  # + 0.0 prints -0 as 0
    array([[ 0.  ,  0.  ,  0.  ],
           [ 0.  ,  0.25, -0.25],
           [ 0.  , -0.25,  0.25]])
    """
    s = fwd.aux["soft"]
    jac = -s[:, :, None] * s[:, None, :]
    idx = np.arange(s.shape[1])
    jac[:, idx, idx] += s
    return jac


def topk_softmax_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """``v^T dp/dz = s * (v - s . v)`` in O(n) per row (0 on the hard entries)."""
    s = fwd.aux["soft"]
    return s * (v - (s * v).sum(axis=1, keepdims=True))


def topk_softmax_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The closed form by a full sort and a softmax in extended precision (``np.longdouble``).

    Rows where the ``(k-1)``-th and ``k``-th largest entries tie are not trusted: the operator
    is discontinuous there and its value depends on the tie rule.
    """
    b, n = z.shape
    order = np.argsort(-z, axis=1, kind="stable")
    s = np.take_along_axis(z, order, axis=1).astype(np.longdouble)
    soft = s.copy()
    soft[:, : k - 1] = -np.inf
    with np.errstate(under="ignore", invalid="ignore"):  # masked entries stay -inf, weight 0
        e = np.exp(soft - soft[:, k - 1 : k])
        w = e / e.sum(axis=1, keepdims=True)
    w[:, : k - 1] = 1.0
    out = np.empty((b, n))
    np.put_along_axis(out, order, w.astype(np.float64), axis=1)
    trusted = np.ones(b, dtype=bool) if k == 1 else s[:, k - 2] != s[:, k - 1]
    return out, trusted


TOPK_SOFTMAX = Implementation(
    forward=topk_softmax_forward, jacobian=topk_softmax_jacobian, vjp=topk_softmax_vjp, elementwise=False
)
