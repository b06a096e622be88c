"""The hard top-k operator ``T_k``: the baseline every smooth operator approximates.

``T_k(z)`` puts weight 1 on the k largest entries of each row (last axis). When the k-th and
(k+1)-th largest values tie, the tied entries share the remaining mass equally, so the result
is permutation-equivariant and still sums to k. It is piecewise constant: its Jacobian is 0
wherever it is defined (it is discontinuous where the k-th and (k+1)-th values cross).

Real k (one per row, ``0 < k <= m`` unmasked entries): with ``c = ceil(k)``, weight 1 on the
entries above the c-th largest value, and the entries equal to it (the at-group) share the
remaining mass ``k - #above`` equally: the same formula as the ties of an integer k, which it is
when k is an integer. ``T_k`` is piecewise linear in k: ``dT_k/dk = 1 / #at`` on the at-group and
0 elsewhere. At an integer k (a kink, where the at-group changes) this is the derivative from
below, that of the k-th largest entry's group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward, Implementation


def _is_int(k: Any) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def hard_topk_weights(x: FloatArray, k: Any) -> FloatArray:
    """``T_k(x)`` along the last axis of any array (``-inf`` entries get 0; each slice needs at
    least ``k`` finite entries): the one hard top-k of the package, for every caller that needs the
    k-hot target (the API's ``hard`` method, properties, sweeps, training probes).

    ``k``: an ``int`` (every slice), or real values broadcastable to ``x.shape[:-1]`` (one k per
    slice, ``0 < k <= #finite``).

    >>> hard_topk_weights(np.array([3.0, 1.0, 2.0, 2.0]), 2)
    array([1. , 0. , 0.5, 0.5])
    >>> hard_topk_weights(np.array([[3.0, 1.0, 2.0], [3.0, 1.0, 2.0]]), np.array([1.5, 0.25]))
    array([[1.  , 0.  , 0.5 ],
           [0.25, 0.  , 0.  ]])
    """
    n = x.shape[-1]
    flat = np.asarray(x, dtype=np.float64).reshape(-1, n)
    if not _is_int(k):
        k = np.broadcast_to(np.asarray(k, dtype=np.float64), x.shape[:-1]).reshape(-1)
    return hard_topk(flat, k).p.reshape(x.shape)


def largest_per_row(z: FloatArray, *ranks: NDArray[np.intp]) -> list[FloatArray]:
    """For each ``(B,)`` array of ranks ``j`` (``1 <= j <= n``), the ``j[b]``-th largest entry of each
    row ``b`` of ``z``, with no loop over rows: one partition at the largest rank and a sort of the
    entries above it when they are few (a scalar k's cost), else one partition at every position
    the batch needs.

    >>> largest_per_row(np.array([[3.0, 1.0, 2.0], [5.0, 4.0, 6.0]]), np.array([1, 3]))[0]
    array([3., 4.])
    """
    n = z.shape[-1]
    c_max = max((int(j.max()) for j in ranks if j.size), default=1)
    if c_max <= max(64, n // 8):
        top = np.sort(np.partition(z, n - c_max, axis=-1)[:, n - c_max :], axis=-1)
        return [np.take_along_axis(top, (c_max - j)[:, None], axis=-1)[:, 0] for j in ranks]
    pos = np.unique(np.concatenate([n - j for j in ranks]))  # ascending positions
    part = np.partition(z, pos, axis=-1)
    return [np.take_along_axis(part, (n - j)[:, None], axis=-1)[:, 0] for j in ranks]


def _kth_real(z: FloatArray, k: FloatArray) -> FloatArray:
    """The ``ceil(k[b])``-th largest entry of each row, ``(B, 1)``."""
    return largest_per_row(z, np.ceil(k).astype(np.intp))[0][:, None]


def hard_topk(z: FloatArray, k: Any) -> Forward:
    """``T_k(z)`` on a ``(B, n)`` batch, ties at the k-th value sharing the remaining mass.

    ``k``: an ``int`` for every row, or a ``(B,)`` float array with one real ``k`` per row
    (see the module docstring; an integer value gives bitwise the ``int`` result).

    >>> hard_topk(np.array([[3.0, 1.0, 2.0, 2.0]]), 2).p
    array([[1. , 0. , 0.5, 0.5]])
    >>> hard_topk(np.array([[3.0, 1.0, 2.0, 2.0]]), np.array([2.5])).p
    array([[1.  , 0.  , 0.75, 0.75]])
    """
    n = z.shape[-1]
    if _is_int(k):
        kth = np.partition(z, n - k, axis=-1)[..., n - k : n - k + 1]  # the k-th largest
        kk: Any = k
    else:
        kk = np.broadcast_to(np.asarray(k, dtype=np.float64).reshape(-1), z.shape[:1])[:, None]
        kth = _kth_real(z, kk[:, 0])
    above = z > kth
    at = z == kth
    share = (kk - above.sum(axis=-1, keepdims=True)) / at.sum(axis=-1, keepdims=True)
    # arithmetic on the masks instead of selects (exact: each sum meets a 0, share > 0)
    at_share = np.multiply(at, share)
    p = np.add(above, at_share)  # 1 above, share at the k-th value, 0 below
    q = np.subtract(~above, at_share)  # 0 above, 1 - share at the k-th value, 1 below
    return Forward(p=p, q=q, aux={"kth": kth})


def hard_topk_dk(fwd: Forward | None, z: FloatArray, k: Any) -> FloatArray:
    """``dT_k/dk``, ``(B, n)``: ``1 / #at`` on the entries equal to the ``ceil(k)``-th largest (those
    sharing the fractional mass), 0 elsewhere; at an integer k the derivative from below.

    >>> hard_topk_dk(None, np.array([[3.0, 1.0, 2.0, 2.0]]), np.array([2.5]))
    array([[0. , 0. , 0.5, 0.5]])
    """
    n = z.shape[-1]
    if fwd is not None and "kth" in fwd.aux:  # the forward's own (B, 1) ceil(k)-th largest values
        kth = fwd.aux["kth"]
    elif _is_int(k):
        kth = np.partition(z, n - k, axis=-1)[..., n - k : n - k + 1]
    else:
        kth = _kth_real(z, np.broadcast_to(np.asarray(k, dtype=np.float64).reshape(-1), z.shape[:1]))
    at = z == kth
    return np.divide(at, at.sum(axis=-1, keepdims=True))


def _hard_jacobian(fwd: Forward, z: FloatArray, k: Any) -> FloatArray:
    return np.zeros(z.shape + z.shape[-1:])


def _hard_vjp(fwd: Forward, z: FloatArray, k: Any, v: FloatArray) -> FloatArray:
    return np.zeros_like(z)


#: Takes a real k per row; ``log p`` and ``log(1 - p)`` are exact from ``p`` and ``q`` themselves.
HARD = Implementation(
    forward=hard_topk, jacobian=_hard_jacobian, vjp=_hard_vjp, elementwise=True, row_k=True, dk=hard_topk_dk
)
