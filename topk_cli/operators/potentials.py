"""Potentials whose gradient is the operator: the smooth "sum of the k largest scores".

For a method that is the gradient of a convex potential ``Phi`` (``p = grad_z Phi(z)``), ``Phi``
is the natural smooth approximation of ``sum of the k largest z``; it tends to it as the
selection hardens. Each function here takes the :class:`~topk_cli.operators._base.Forward` of
the method on a prepared ``(B, n)`` batch ``z`` (see ``_base``) and returns ``Phi(z)`` per row
``(B,)``, in units of ``z``; :func:`topk_cli.api.evaluate_sum` converts to units of ``x``
(``tau * Phi(z) + k * max x``, since every ``p`` sums to ``k``).

* GradTopK: ``Phi(z) = log e_k(e^z)`` (Su 2024), computed from ``grad``'s own program by
  deflation: removing entry ``i`` gives ``e_k(w without i) = e_k(w) (1 - p_i)``, so removing the
  ``m - k`` smallest entries one at a time (``m`` unmasked entries) leaves the ``k`` largest,
  whose ``e_k`` is ``exp(sum z)``: ``log e_k(e^z) = sum of the k largest z - sum log(1 - p_i)``,
  each ``1 - p_i`` being the accurate complement of the program. Cost: ``m - k`` forward passes
  on shrinking sets, O(n^2 min(k, n - k)) per row.
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
    for b in range(rows):
        row = z[b]
        finite = np.flatnonzero(np.isfinite(row))
        order = finite[np.argsort(row[finite], kind="stable")]  # increasing: smallest removed first
        steps = order.size - k
        top = float(np.sum(row[order[steps:]]))
        if steps == 0:
            out[b] = top
            continue
        batch = np.tile(row, (steps, 1))
        for s in range(1, steps):  # step s has removed the s smallest entries
            batch[s:, order[s - 1]] = -np.inf
        batch -= np.max(batch, axis=-1, keepdims=True)  # the program's input has max 0
        q = GRAD.forward(batch, k).q
        removed = q[np.arange(steps), order[:steps]]
        out[b] = top - float(np.sum(np.log(removed)))
    return out
