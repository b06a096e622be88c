"""Potentials whose gradient is the operator: the smooth "sum of the k largest scores".

For a method that is the gradient of a convex potential ``Phi`` (``p = grad_z Phi(z)``), ``Phi``
is the natural smooth approximation of ``sum of the k largest z``; it tends to it as the
selection hardens. Each function here takes the :class:`~topk_cli.operators._base.Forward` of
the method on a prepared ``(B, n)`` batch ``z`` (see ``_base``) and returns ``Phi(z)`` per row
``(B,)``, in units of ``z``; :func:`topk_cli.api.evaluate_sum` converts to units of ``x``
(``tau * Phi(z) + k * max x``, since every ``p`` sums to ``k``).

* GradTopK: ``Phi(z) = log e_k(e^z)`` (Su 2024), computed from ``grad``'s own program by
  deflation (``m`` unmasked entries): ``e_k(w) = e_k(w without i) + w_i e_{k-1}(w without i)``
  and ``p_i = w_i e_{k-1}(w without i) / e_k(w)``, so removing the largest entry gives
  ``log e_k(w) = z_i - log p_i + log e_{k-1}(w without i)`` (k steps down to ``e_0 = 1``) and
  removing the smallest gives ``log e_k(w) = log e_k(w without i) - log(1 - p_i)`` (``m - k``
  steps down to the k largest, whose ``e_k`` is ``exp(sum z)``). The shorter way is taken:
  ``min(k, m - k)`` forward passes over the whole batch, O(n min(k, n - k)^2) per row.
* threshold operators ``p = f(z - lambda)``: the regularised maximum over the capped simplex
  ``Phi(z) = max_{p in D(n,k)} <p, z> - sum_i r(p_i)`` with ``r' = f^{-1}`` and ``r(0) = r(1) = 0``
  where possible, so that ``Phi`` of a k-hot selection is the hard top-k sum (Blondel, Martins &
  Niculae 2020, Fenchel-Young losses). Its gradient is ``p`` (Danskin's theorem):
  ``r(p) = p log p`` (``thre-exp``: entropy), ``p log p + (1-p) log(1-p)`` (``thre-sigmoid``:
  binary entropy), ``m log(2m) - m`` with ``m = min(p, 1-p)`` (``thre-laplace``),
  ``(p^2 - p)/2`` (``clip(z - lambda, 0, 1)``), ``(3/4)(p^{4/3} - p)`` (its cube), 0 (``hard``:
  ``Phi`` is the hard top-k sum itself). A term linear in ``p`` only shifts ``Phi`` by a constant
  (``sum p = k``); it is chosen so that ``r(0) = r(1) = 0``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from topk_cli.operators._base import FloatArray, Forward
from topk_cli.operators.gradtopk import GRAD

#: ``potential(fwd, z, k) -> (B,)``: the potential of a method in units of ``z``.
PotentialFn = Callable[[Forward, FloatArray, int], FloatArray]


def _xlogx(a: FloatArray) -> FloatArray:
    """``a log a`` with ``0 log 0 = 0``."""
    with np.errstate(divide="ignore", invalid="ignore"):  # a = 0 is handled by the where
        return np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)


def _linear(fwd: Forward, z: FloatArray) -> FloatArray:
    """``<p, z>`` over the unmasked entries (masked entries have ``p = 0`` and ``z = -inf``)."""
    finite = np.isfinite(z)
    return np.sum(np.where(finite, fwd.p * np.where(finite, z, 0.0), 0.0), axis=-1)


def regularised_max(r: Callable[[FloatArray, FloatArray], FloatArray]) -> PotentialFn:
    """The potential ``<p, z> - sum_i r(p_i)`` of a threshold operator; ``r(p, q)`` gets ``q = 1 - p``."""

    def potential(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
        finite = np.isfinite(z)
        reg = np.where(finite, r(fwd.p, fwd.q), 0.0)
        return _linear(fwd, z) - np.sum(reg, axis=-1)

    return potential


def entropy(p: FloatArray, q: FloatArray) -> FloatArray:
    """``p log p`` (thre-exp)."""
    return _xlogx(p)


def binary_entropy(p: FloatArray, q: FloatArray) -> FloatArray:
    """``p log p + q log q`` (thre-sigmoid)."""
    return _xlogx(p) + _xlogx(q)


def laplace_regulariser(p: FloatArray, q: FloatArray) -> FloatArray:
    """``m log(2m) - m``, ``m = min(p, q)`` (thre-laplace: its derivative is the Laplace quantile)."""
    m = np.minimum(p, q)
    return _xlogx(2.0 * m) / 2.0 - m


def clip_regulariser(p: FloatArray, q: FloatArray) -> FloatArray:
    """``(p^2 - p) / 2`` (``p = clip(z - lambda, 0, 1)``: Euclidean projection onto the capped simplex)."""
    return -0.5 * p * q


def cube_regulariser(p: FloatArray, q: FloatArray) -> FloatArray:
    """``(3/4)(p^{4/3} - p)`` (``p = clip(z - lambda, 0, 1)^3``: its derivative is ``p^{1/3}`` up to a constant)."""
    return 0.75 * (np.cbrt(p) * p - p)


def no_regulariser(p: FloatArray, q: FloatArray) -> FloatArray:
    """0 (hard top-k: the potential is the sum of the k largest entries)."""
    return np.zeros_like(p)


def log_esp(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """``log e_k(e^z)`` per row, by deflation through ``grad``'s program (see the module docstring)."""
    rows = z.shape[0]
    out = np.empty(rows)
    m = np.isfinite(z).sum(axis=-1)
    for size in np.unique(m):  # rows with the same number of unmasked entries deflate together
        idx = np.flatnonzero(m == size)
        out[idx] = _deflate(z[idx], k, int(size))
    return out


def _deflate(z: FloatArray, k: int, m: int) -> FloatArray:
    """``log e_k(e^z)`` of rows with ``m`` unmasked entries each, in ``min(k, m - k)`` forward passes.

    ``k <= m - k``: remove the largest entry ``i`` and lower k, since
    ``e_k(w) = w_i e_{k-1}(w without i) / p_i``; otherwise remove the smallest entry at fixed k,
    since ``e_k(w) = e_k(w without i) / (1 - p_i)``. The removed entry's factor is the larger of
    ``p_i`` and ``1 - p_i`` (at least ``1 - k/m`` or ``k/m``), and ``grad`` gives both to full
    relative accuracy, so no step cancels.
    """
    cur = z.copy()
    every = np.arange(z.shape[0])
    total = np.zeros(z.shape[0])
    if k <= m - k:
        for kk in range(k, 0, -1):
            i = np.argmax(cur, axis=-1)
            top = cur[every, i]
            fwd = GRAD.forward(cur - top[:, None], kk)
            p, q = fwd.p[every, i], fwd.q[every, i]
            total += top - np.where(p > 0.5, np.log1p(-q), np.log(p))
            cur[every, i] = -np.inf
        return total
    for _ in range(m - k):
        i = np.argmin(np.where(np.isfinite(cur), cur, np.inf), axis=-1)
        fwd = GRAD.forward(cur - np.max(cur, axis=-1, keepdims=True), k)
        q = fwd.q[every, i]
        total -= np.log(q)  # q >= 1 - k/m: no cancellation
        cur[every, i] = -np.inf
    return total + np.sum(np.where(np.isfinite(cur), cur, 0.0), axis=-1)
