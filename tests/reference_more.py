"""Independent mpmath references of gumbel-topk, coordinate-descent, dftopk, scaled-sigmoid,
k-softmax and straight-through, written from the definitions (README method table and sources).

Same conventions as ``reference.py``: floats ``x`` converted exactly, ``-inf`` masks an entry
(dropped, then re-inserted as an exact 0), ``z = (x - max x) / tau`` in mpmath, the working
precision raised by the magnitude of ``z``; the two methods defined on raw scores (coordinate-descent,
scaled-sigmoid: not shift-invariant) take ``z = x / tau``, not shifted, as their sources do. Deliberately plain: every weight is the formula of its
definition, with the complements taken as sums of positive terms where a subtraction would cancel
(``1 - a = sum_{j != i} e_j / S``), never the library's algorithms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mpmath
from mpmath import mp, mpf
from reference import DPS, _check_k, _dps, _scatter, _split, hard


def _split_raw(x: Sequence[Any], tau: Any) -> tuple[list[Any], list[int], int]:
    """Unmasked ``z = x / tau`` (not shifted) in mpmath, their indices, and ``n``."""
    vals = [mpf(v) for v in x]
    if any(mpmath.isnan(v) or v == mpmath.inf for v in vals):
        raise ValueError("reference: NaN or +inf in x")
    idx = [i for i, v in enumerate(vals) if v != mpmath.ninf]
    t = mpf(tau)
    return [vals[i] / t for i in idx], idx, len(vals)


def _softmax_and_complement(w: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    top = max(w)
    e = [mpmath.exp(v - top) for v in w]
    total = mpmath.fsum(e)
    return [v / total for v in e], [mpmath.fsum(e[:i] + e[i + 1:]) / total for i in range(len(e))]


def gumbel_topk(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """k rounds: ``a = softmax(w)``, ``p += a``, ``w += log(1 - a)`` from ``w = z`` (no floor)."""
    with mp.workdps(_dps(x, tau, dps)):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
        w, p = list(z), [mpf(0)] * len(z)
        for j in range(k):
            a, c = _softmax_and_complement(w)
            p = [pi + ai for pi, ai in zip(p, a, strict=True)]
            if j < k - 1:
                w = [wi + mpmath.log(ci) for wi, ci in zip(w, c, strict=True)]
        return _scatter(p, idx, n)


def coordinate_descent(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS, iterations: int = 20) -> list[Any]:
    """``coor_descent`` of CoLT5-attention on ``z = x / tau`` with eps = 1: ``a = log k - logsumexp(z + b)``,
    ``b = -relu(z + a)``, ``p = exp(z + a + b)``, from ``b = -z``."""
    with mp.workdps(_dps(x, tau, dps) + 10):
        z, idx, n = _split_raw(x, tau)
        _check_k(k, len(z))
        b = [-v for v in z]
        a = mpf(0)
        for _ in range(iterations):
            a = mpmath.log(k) - mpmath.log(mpmath.fsum(mpmath.exp(zi + bi) for zi, bi in zip(z, b, strict=True)))
            b = [-max(zi + a, mpf(0)) for zi in z]
        return _scatter([mpmath.exp(zi + a + bi) for zi, bi in zip(z, b, strict=True)], idx, n)


def dftopk(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """``sigmoid(z - m)``, ``m`` the midpoint of the k-th and (k+1)-th largest (``-inf`` at k = n)."""
    with mp.workdps(_dps(x, tau, dps)):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
        ordered = sorted(z, reverse=True)
        if k == len(z):
            return _scatter([mpf(1)] * len(z), idx, n)
        m = (ordered[k - 1] + ordered[k]) / 2
        return _scatter([1 / (1 + mpmath.exp(m - v)) for v in z], idx, n)


def scaled_sigmoid(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """``k s / S`` when ``k <= S``, else ``1 - (n - k)(1 - s) / (n - S)``, ``s = sigmoid(z)``, ``z = x / tau``."""
    with mp.workdps(_dps(x, tau, dps) + 20):
        z, idx, n = _split_raw(x, tau)
        _check_k(k, len(z))
        s = [1 / (1 + mpmath.exp(-v)) for v in z]
        t = [1 / (1 + mpmath.exp(v)) for v in z]
        total = mpmath.fsum(s)
        if k <= total:
            p = [k * v / total for v in s]
        else:
            p = [1 - (len(z) - k) * v / mpmath.fsum(t) for v in t]
        return _scatter(p, idx, n)


def k_softmax(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """``k softmax(z)``."""
    with mp.workdps(_dps(x, tau, dps)):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
        a, _ = _softmax_and_complement(z)
        return _scatter([k * v for v in a], idx, n)


def straight_through(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """The forward pass: hard top-k."""
    return hard(x, k, tau, dps=dps)


#: The reference of each method of this module, by CLI name (same signature as ``reference.py``).
REFERENCES = {
    "gumbel-topk": gumbel_topk,
    "coordinate-descent": coordinate_descent,
    "dftopk": dftopk,
    "scaled-sigmoid": scaled_sigmoid,
    "k-softmax": k_softmax,
    "straight-through": straight_through,
}
