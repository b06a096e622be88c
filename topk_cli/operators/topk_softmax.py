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
from topk_cli.operators._logspace import exp_into
from topk_cli.operators.hard import largest_per_row
from topk_cli.references import BoolArray, ReferenceContext


def _hard_set(z: FloatArray, k: int) -> np.ndarray:
    """Boolean ``(B, n)`` mask of the ``k - 1`` largest entries of each row."""
    hard = np.zeros(z.shape, dtype=bool)
    if k > 1:
        top = np.argpartition(-z, k - 2, axis=1)[:, : k - 1]
        np.put_along_axis(hard, top, True, axis=1)
    return hard


def _kth_largest(z: FloatArray, k: int) -> tuple[FloatArray, np.ndarray, np.ndarray]:
    """``(s_k, tie, shared)``: the ``k``-th largest entry of each row; the rows where the
    ``(k-1)``-th largest equals it (there ``z > s_k`` holds fewer than ``k - 1`` entries); and the
    rows where the ``(k+1)``-th largest equals it (several soft entries at ``s_k``)."""
    n = z.shape[1]
    if min(n, k + 1) <= max(64, n // 8):
        # one partition and a sort of the k + 1 largest: about 4x cheaper than a partition at the
        # three positions below (0.5x against 2.2x np.exp at n = 1000, k = 10), the same values
        return _kth_largest_rows(z, np.full(z.shape[0], float(k)))
    kth = [j for j in (n - k - 1, n - k, n - k + 1) if 0 <= j < n]
    part = np.partition(z, kth, axis=1) if len(kth) > 1 or n > 1 else z
    s_k = part[:, n - k]
    tie = part[:, n - k + 1] == s_k if k > 1 else np.zeros(z.shape[0], dtype=bool)
    shared = part[:, n - k - 1] == s_k if k < n else np.zeros(z.shape[0], dtype=bool)
    return s_k, tie, shared


def _kth_largest_rows(z: FloatArray, k: FloatArray) -> tuple[FloatArray, np.ndarray, np.ndarray]:
    """:func:`_kth_largest` with one integer ``k`` per row (a ``(B,)`` float array of integer values),
    from the ``(k-1)``-th, ``k``-th and ``(k+1)``-th largest of each row in one selection."""
    n = z.shape[1]
    kk = k.astype(np.intp)
    below, s_k, above = largest_per_row(z, np.maximum(kk - 1, 1), kk, np.minimum(kk + 1, n))
    return s_k, (kk > 1) & (below == s_k), (kk < n) & (above == s_k)


def topk_softmax_forward(z: FloatArray, k: int | FloatArray) -> Forward:
    """``p = 1`` on the top ``k - 1`` entries, ``softmax`` over the others; ``sum p = k``.

    One ``np.partition`` gives ``s_k``, the ``k``-th largest entry, which is the largest soft
    entry: the hard set is ``z > s_k`` (by position among entries tied with ``s_k`` when the
    ``(k-1)``-th and ``k``-th largest are equal), and the soft weights are ``e / S`` with
    ``e = exp(z - s_k)`` on the soft entries (one ``exp`` pass; ``e <= 1``, so no overflow) and
    ``S = 1 + S'``, ``S'`` the sum over the soft entries but one at ``s_k``. ``q = 1 - p`` is
    ``1 - e / S`` (no cancellation: ``e <= S / 2`` on every soft entry but that one) and
    ``S' / S`` on the one at ``s_k`` (when it is the only one there), so a complement of 1e-20
    keeps its digits. Rows without a tie between the ``(k-1)``-th and ``k``-th largest are
    elementwise (equal entries get equal bits), so the API's tie averaging skips them.

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q (B, n)``; ``aux["soft"]`` (the softmax part,
    0 on the hard entries) and ``aux["hard"]`` (1.0 on the hard entries).

    >>> np.round(topk_softmax_forward(np.array([[0.0, -1.0, -2.0]]), 2).p, 4)
    array([[1.    , 0.7311, 0.2689]])
    """
    s_k, tie, shared = _kth_largest(z, k) if not isinstance(k, np.ndarray) else _kth_largest_rows(z, k)
    # shift by the largest soft entry first: at |z| ~ 1e20, log(sum) = max + log(2) rounds to max
    # and the soft weights came out 1 each (sum p = k + 1)
    t = np.subtract(z, s_k[:, None])
    hard = t > 0.0
    if tie.any():
        if isinstance(k, np.ndarray):  # rows cut by position, grouped by their k (rare)
            for value in np.unique(k[tie]):
                rows = np.flatnonzero(tie & (k == value))
                hard[rows] = _hard_set(z[rows], int(value))
        else:
            hard[tie] = _hard_set(z[tie], k)
    np.copyto(t, -np.inf, where=hard)
    with np.errstate(under="ignore"):  # far entries get weight 0, as they should
        e = exp_into(t, t)
    top = np.argmax(e, axis=1)[:, None]  # a soft entry at s_k: e = 1 exactly
    np.put_along_axis(e, top, 0.0, axis=1)
    rest = e.sum(axis=1)  # S'
    np.put_along_axis(e, top, 1.0, axis=1)
    total = (1.0 + rest)[:, None]  # S >= 1
    soft = np.divide(e, total)
    q = np.subtract(1.0, soft)  # within an ulp and a half relatively: soft <= 1/2 on these entries
    # a lone soft entry at s_k takes S' / S; where several share s_k, each has p <= 1/2 and keeps
    # 1 - e / S, so that equal entries get equal bits
    lone = np.flatnonzero(~shared)
    q[lone, top[lone, 0]] = rest[lone] / total[lone, 0]
    hard_f = hard.astype(np.float64)
    p = np.add(soft, hard_f)  # hard entries have soft = 0: exactly 1
    q -= hard_f  # and q = 1 - 0 there: exactly 0
    # p and q are functions of z_i and row quantities except where the hard set was cut by position
    return Forward(p=p, q=q, aux={"soft": soft, "hard": hard_f}, elementwise_rows=~tie)


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


#: ``row_k``: a k per row (integer values: the method is defined for an integer k only) in one call.
TOPK_SOFTMAX = Implementation(
    forward=topk_softmax_forward, jacobian=topk_softmax_jacobian, vjp=topk_softmax_vjp, elementwise=False,
    row_k=True,
)
