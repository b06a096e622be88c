"""The hard top-k operator ``T_k``: the baseline every smooth operator approximates.

``T_k(z)`` puts weight 1 on the k largest entries of each row (last axis). When the k-th and
(k+1)-th largest values tie, the tied entries share the remaining mass equally, so the result
is permutation-equivariant and still sums to k. It is piecewise constant: its Jacobian is 0
wherever it is defined (it is discontinuous where the k-th and (k+1)-th values cross).
"""

from __future__ import annotations

import numpy as np

from topk_cli.operators._base import FloatArray, Forward, Implementation


def hard_topk_weights(x: FloatArray, k: int) -> FloatArray:
    """``T_k(x)`` along the last axis of any array (``-inf`` entries get 0; each slice needs at
    least ``k`` finite entries): the one hard top-k of the package, for every caller that needs the
    k-hot target (the API's ``hard`` method, properties, sweeps, training probes).

    >>> hard_topk_weights(np.array([3.0, 1.0, 2.0, 2.0]), 2)
    array([1. , 0. , 0.5, 0.5])
    """
    n = x.shape[-1]
    return hard_topk(np.asarray(x, dtype=np.float64).reshape(-1, n), k).p.reshape(x.shape)


def hard_topk(z: FloatArray, k: int) -> Forward:
    """``T_k(z)`` on a ``(B, n)`` batch, ties at the k-th value sharing the remaining mass.

    >>> hard_topk(np.array([[3.0, 1.0, 2.0, 2.0]]), 2).p
    array([[1. , 0. , 0.5, 0.5]])
    """
    n = z.shape[-1]
    kth = np.partition(z, n - k, axis=-1)[..., n - k : n - k + 1]  # the k-th largest
    above = z > kth
    at = z == kth
    share = (k - above.sum(axis=-1, keepdims=True)) / at.sum(axis=-1, keepdims=True)
    # arithmetic on the masks instead of selects (exact: each sum meets a 0, share > 0)
    at_share = np.multiply(at, share)
    p = np.add(above, at_share)  # 1 above, share at the k-th value, 0 below
    q = np.subtract(~above, at_share)  # 0 above, 1 - share at the k-th value, 1 below
    return Forward(p=p, q=q)


def _hard_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    return np.zeros(z.shape + z.shape[-1:])


def _hard_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    return np.zeros_like(z)


HARD = Implementation(forward=hard_topk, jacobian=_hard_jacobian, vjp=_hard_vjp, elementwise=True)
