"""Independent high-precision references for the relaxed-sorting top-k methods (mpmath).

Written from the sources' formulas, with other algorithms than the library's:

* ``neuralsort``: Grover et al. (2019), eq. 5, literally: ``P[i, :] = softmax((n + 1 - 2i) z -
  A_z 1)`` with ``A_z[j, l] = |z_j - z_l|`` (the library instead sums the sorted gaps); top-k =
  the sum of rows ``i = 1..k``. The logits are of size ``n max |z|``, so the working precision is
  raised by ``log10(n max |z|)`` digits.
* ``softsort``: Prillo & Eisenschlos (2020): ``P[i, j] = softmax_j(-|sort(z)_i - z_j|)``, sorted
  decreasingly; top-k = the sum of rows ``1..k``.
* ``sorting-network``: diffsort's ``execute_sort`` (Petersen et al. 2021) on the ``odd_even``
  network with ``distribution='logistic'``, ``steepness = 1``: the full ``n x n`` matrix ``X`` is
  propagated (``sort(z) = z X``, ascending), ``alpha = 1 / (1 + exp(a - b))`` and ``1 - alpha``
  by subtraction; top-k = the sum of the last ``k`` columns of ``X`` (the library instead runs
  a vector backward through the comparators), then averaged over exactly tied entries (the
  network gives them different weights; the tool's rule is that equal inputs get equal weights).

Every function takes floats ``x`` (``-inf`` masks an entry: the method runs on the others),
``k`` and ``tau``, works on ``z = (x - max x) / tau`` in mpmath and returns a list of ``mpf``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mpmath
from mpmath import mp, mpf
from reference import DPS, _check_k, _dps, _scatter, _split


def _softmax(a: Sequence[Any]) -> list[Any]:
    top = max(a)
    e = [mpmath.exp(v - top) for v in a]
    total = mpmath.fsum(e)
    return [v / total for v in e]


def neuralsort(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """Sum of the first k rows of NeuralSort's ``P_hat`` (Grover et al. 2019, eq. 5)."""
    n_all = len(x)
    dps = _dps(x, tau, dps) + len(str(n_all))
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        m = len(z)
        _check_k(k, m)
        a1 = [mpmath.fsum(abs(zj - zl) for zl in z) for zj in z]
        p = [mpf(0)] * m
        for i in range(1, k + 1):
            row = _softmax([(m + 1 - 2 * i) * zj - a1[j] for j, zj in enumerate(z)])
            p = [u + v for u, v in zip(p, row, strict=True)]
        return _scatter(p, idx, n)


def softsort(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """Sum of the first k rows of SoftSort's ``P`` with ``d = |.|`` (Prillo & Eisenschlos 2020)."""
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        m = len(z)
        _check_k(k, m)
        ordered = sorted(z, reverse=True)
        p = [mpf(0)] * m
        for i in range(k):
            row = _softmax([-abs(ordered[i] - zj) for zj in z])
            p = [u + v for u, v in zip(p, row, strict=True)]
        return _scatter(p, idx, n)


def _odd_even_layers(m: int) -> list[list[tuple[int, int]]]:
    """diffsort's ``odd_even_network(m)``: m layers of comparators (i, i + 1), i = 0, 2, ... then 1, 3, ..."""
    return [[(i, i + 1) for i in range(layer % 2, m - 1, 2)] for layer in range(m)]


def sorting_network(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """Sum of the top ``k`` (last) wires of diffsort's relaxed permutation matrix, ties averaged."""
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        m = len(z)
        _check_k(k, m)
        vals = list(z)
        X = [[mpf(1) if r == c else mpf(0) for c in range(m)] for r in range(m)]  # X[input][wire]
        for layer in _odd_even_layers(m):
            for a, b in layer:
                alpha = 1 / (1 + mpmath.exp(vals[a] - vals[b]))
                va, vb = vals[a], vals[b]
                vals[a] = alpha * va + (1 - alpha) * vb
                vals[b] = (1 - alpha) * va + alpha * vb
                for row in X:
                    ca, cb = row[a], row[b]
                    row[a] = alpha * ca + (1 - alpha) * cb
                    row[b] = (1 - alpha) * ca + alpha * cb
        p = [mpmath.fsum(row[m - k :]) for row in X]
        # the tool's rule, equal inputs get equal weights: the network's tied entries are averaged
        p = [mpmath.fsum(p[j] for j in range(m) if z[j] == z[i]) / sum(1 for v in z if v == z[i]) for i in range(m)]
        return _scatter(p, idx, n)


#: Reference function of each relaxed-sorting method.
REFERENCES = {
    "neuralsort": neuralsort,
    "softsort": softsort,
    "sorting-network": sorting_network,
}
