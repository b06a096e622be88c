"""A rigorous running bound on the error of GradTopK's recursion, carried level by level.

The recursion (``grad-recursive``) computes, in float64, ``l_{1,i} = z_i``, ``l_1 = lse(z)``
and for ``j >= 2``

    x_i = l_{j-1,i} - l_{j-1},  p_i = exp(x_i),  a_i = 1 - p_i,
    l_{j,i} = (z_i + l_{j-1}) + log a_i,  l_j = lse(l_{j,.}) - log j,

approximating ``log Z_{j,i}`` and ``log Z_j`` (``Z_{j,i} = w_i Z_{j-1} (1 - P_i^(j-1))`` exactly,
``P^(j) = Z_{j,.} / Z_j`` the marginals at size j, ``w = e^z``). Write ``e_{j,i}`` and ``e_j`` for the
errors of ``l_{j,i}`` and ``l_j``, and ``d_i = e_{j,i} - e_j``: the computed ``p_i`` is
``P_i e^{d_i}`` up to the rounding of one subtraction and one ``exp``. This module carries, per
row and with row scalars only (no pass over the entries), two numbers:

* ``W_j >= max_i e_{j,i} - min_i e_{j,i}`` (the spread of the errors over the unmasked entries);
* ``Psi_j >= |e_j - (lse of the exact sums, weighted by the computed l_{j,i})|``, the rounding of
  ``lse``. Since ``lse(l_{j,.}) - log sum_i Z_{j,i}`` is a weighted mean of the ``e_{j,i}``, every
  ``d_i`` lies in one interval ``[x, x + W_j]`` with ``-W_j - Psi_j <= x <= Psi_j``, so
  ``|d_i| <= E_j = W_j + Psi_j``.

**One level.** ``a_i = A_i (1 - o_i eta_i)(1 + theta)``, where ``A_i = 1 - P_i``,
``o_i = P_i / A_i`` is the odds (the deflation ``Z_{j-1} - Z_{j-1,i}`` multiplies the relative
error of ``p_i`` by it) and ``eta_i = d_i + xi_i`` (``xi_i``: the rounding of ``x_i`` and of ``exp``).
Hence ``e_{j,i} = e_{j-1} - o_i d_i + r_i`` with ``r_i`` gathering ``o_i xi_i``, the second-order
term of ``log(1 - o eta)``, and the roundings of ``1 - p``, ``log``, and the two additions. The
spread of ``-o_i d_i`` over ``i`` is at most ``o_max E_{j-1}`` (all ``d_i`` share the interval above
and ``0 <= o_i <= o_max``), so

    W_j <= o_max E_{j-1} + 2 max_i |r_i|.

The odds compound: this is the growth the recursion suffers, not an artefact of the bound. The
bound of ``o_max`` comes from the computed arguments, ``o_max <= (1 / min_i a_i - 1 + u)`` times
``1.001`` (valid while ``o_max (E + c u) <= 1e-4``; rows beyond that are not certified), and
``|r_i|`` is bounded with ``o_i |log P_i| <= 1``, ``|log a_i| <= -log min a`` and
``|z_i| <= max |z|``.

**lse.** ``lse(l) = m + log(sum exp(l - m))``: the shifts cost ``u |l_i - m|`` relative per term,
at most ``u log n`` for the sum (an entropy bound), ``exp`` ``c u``, the sum ``(log2 n + 30) u``
(numpy sums a contiguous last axis pairwise, in blocks of 8 and 128), then one ``log`` and two
additions.

**Result.** ``|p_i - P_i| <= 1.001 (E_k + c u) + 0.37 u`` (``P |log P| <= 1/e``), and ``1 - p``
taken as ``fl(1 - p_i)`` has relative error at most ``1.001 o_max (E_k + c u) + 2.01 u`` plus a
second-order term. ``u = 2^-53``; ``c = 8`` (4 ulp) for ``exp`` and ``log``: the largest error
of the AVX-512 (SVML) kernels numpy uses where the CPU has them (numpy pull request 19478; glibc's
are within 1 ulp). The summation bound assumes numpy's pairwise summation of a contiguous last
axis (what its implementation does; its documentation promises it only without an axis, so a
test checks it), not plain left-to-right addition, whose ``(n - 1) u`` would not certify rows
of 1,000 entries. Subnormal results are absolute errors below ``1e-300``
and are ignored. Rows whose arguments reach 0 (the recursion failed) get an infinite
bound.
"""

from __future__ import annotations

import math

import numpy as np

from topk_cli.operators._base import FloatArray

_U = 2.0**-53
#: Relative error of float64 ``exp`` and ``log``, in units of ``u`` (4 ulp).
_C = 8.0
#: Largest ``o_max (E + c u)`` for which the first-order expansions above hold with the slack used.
_SMALL = 1e-4


def _largest_finite_magnitude(z: FloatArray) -> FloatArray:
    """``max |z_i|`` over the finite entries of each row (0 for none): from the row's minimum and
    maximum where both are finite, entry by entry on the other rows (masked, or not numbers)."""
    low = np.min(z, axis=-1)
    high = np.max(z, axis=-1)
    out = np.maximum(np.abs(low), np.abs(high))
    other = np.flatnonzero(~(np.isfinite(low) & np.isfinite(high)))
    if other.size:
        sub = z[other]
        out[other] = np.max(np.abs(sub), axis=-1, where=np.isfinite(sub), initial=0.0)
    return out


class RunningBound:
    """The running bound of one batch of rows; call :meth:`level` and :meth:`lse` as the
    recursion computes each level, then :meth:`result` with the smallest final complement."""

    def __init__(self, z: FloatArray, log_z1: FloatArray) -> None:
        n = z.shape[-1]
        self._log_n = math.log(max(n, 1))
        self._sum = (math.log2(max(n, 1)) + 30.0) * _U  # pairwise summation of n positive terms
        self._zmax = _largest_finite_magnitude(z)
        self.spread = np.zeros(z.shape[0])  # W
        self.lse_error = self._lse(log_z1, 1)  # Psi

    def _lse(self, out: FloatArray, j: int) -> FloatArray:
        """Bound on the rounding error of ``l_j = lse(l_{j,.}) - log j`` (``out`` = ``l_j``)."""
        log_j = math.log(j)
        terms = 1.01 * (self._log_n + _C) * _U + self._sum  # relative error of the sum
        return 1.01 * (1.01 * terms + _U * (_C * self._log_n + 2.0 * (np.abs(out) + log_j) + _C * log_j + 1.0))

    def _odds(self, low: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``(o_max, E, y)``: the odds bound, ``|d| <= E``, and ``y >= max_i |o_i eta_i|``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            odds = (1.0 / low - 1.0 + _U) * 1.001
        err = self.spread + self.lse_error
        y = odds * (err + _C * _U) + 1.01 * _U
        y[~(y <= _SMALL) | ~(low > 0)] = np.inf  # NaN (failed rows) too
        return odds, err, y

    def level(self, low: FloatArray, log_z_prev: FloatArray) -> None:
        """Account for level ``j`` computed from level ``j - 1``: ``low`` is ``min_i a_i`` of the
        row and ``log_z_prev`` is ``l_{j-1}``."""
        odds, err, y = self._odds(low)
        with np.errstate(divide="ignore", invalid="ignore"):
            big_log = -np.log(low)  # max_i |log a_i|
            xi = _U * (1.0 + odds * err) + odds * (_C * _U + 2.0 * err * (err + _U)) + 2.0 * y * y
            shift = self._zmax + np.abs(log_z_prev)  # >= |z_i + l_{j-1}|
            rounding = 1.01 * _U * (1.01 + _C * big_log + 2.0 * shift + big_log)
            self.spread = odds * err + 2.0 * (xi + y * y + rounding)
        self.spread[~np.isfinite(y)] = np.inf

    def lse(self, log_z: FloatArray, j: int) -> None:
        """Account for ``l_j = lse(l_{j,.}) - log j``."""
        self.lse_error = self._lse(log_z, j)

    def result(self, low: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(absolute bound on p, relative bound on fl(1 - p))`` per row; ``low`` is the row's
        smallest ``fl(1 - p_i)`` of the final marginals."""
        _, err, y = self._odds(low)
        p_bound = 1.001 * (err + _C * _U) + 0.37 * _U
        q_bound = 1.001 * y + 2.01 * _U + y * y
        p_bound[~np.isfinite(y)] = np.inf
        return p_bound, q_bound
