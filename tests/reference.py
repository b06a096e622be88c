"""Independent high-precision reference for every softtopk method (mpmath, >= 50 digits).

Written from the operators' mathematical definitions only (the README's method table and their
sources), without looking at the library's operators, so
that the accuracy tests compare two independent computations. Every function takes a plain
sequence of floats ``x`` (float64 values are converted exactly with ``mpf``; ``-inf`` masks an
entry), an integer ``k`` and a temperature ``tau``, works on ``z = (x - max x) / tau`` computed
in mpmath (no float64 rounding of the quotient), and returns a list of ``mpf`` of length ``n``
(masked entries re-inserted as exact zeros). Everything is evaluated under ``mp.workdps(dps)``.

How each method is computed (deliberately *not* the library's algorithms where there is a choice):

* ``hard``: sort; the entries tied with the k-th value share the remaining mass equally.
* ``iterative``: the direct recurrence ``z <- z - min z; p += softmax((1 - p) z)``. ``1 - p``
  only enters multiplied by ``z``, so absolute accuracy of ``1 - p`` suffices: the working
  precision is raised by ``log10(max z)`` digits.
* ``weighted-softmax``: ``p += w e^z / sum(w e^z)`` with ``w = 1 - p``. Here ``w`` must be
  *relatively* accurate (``w_max e^{z_max}`` competes with the others even when ``w_max`` is
  ``e^{-1e6}``), so ``q = 1 - p`` is carried as ``q_i <- q_i (sum_{j != i} q_j e^{z_j}) / S``, a
  sum of positive terms. :func:`weighted_softmax_direct` runs the naive recurrence at the
  precision that ``min q`` demands, to check that rewrite.
* ``grad``: exact enumeration of the k-subsets for ``n <= 12``; otherwise
  ``p_i = w_i e_{k-1}(w without i) / e_k(w)``, ``w = e^z``, with prefix/suffix tables of the
  elementary symmetric polynomials (sums of positive terms) and the complement identity
  ``p(z, k) = 1 - p(-z, n - k)`` to keep ``k <= n/2``.
* ``thre-*``: ``sum f(z - lambda) = k`` solved by bisection, then safeguarded Newton, at the
  working precision; the residual is checked.

Jacobians (with respect to ``x``, so including ``1/tau``): closed forms for the threshold
methods (:func:`jacobian_threshold`) and for ``grad`` by enumeration
(:func:`jacobian_grad_enumerate`), and central finite differences of any reference function
at a tiny step and raised precision (:func:`jacobian_fd`).

>>> [round(float(v), 4) for v in grad([0.3, 0.6, 0.5, 0.2], 2, 1.0)]
[0.4665, 0.5663, 0.5335, 0.4337]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import mpmath
from mpmath import mp, mpf

DPS = 50

RefFn = Callable[..., list[Any]]


def _split(x: Sequence[Any], tau: Any) -> tuple[list[Any], list[int], int]:
    """Unmasked ``z = (x - max) / tau`` in mpmath, their indices, and ``n``."""
    vals = [mpf(v) for v in x]
    idx = [i for i, v in enumerate(vals) if v != mpmath.ninf]
    if any(mpmath.isnan(v) or v == mpmath.inf for v in vals):
        raise ValueError("reference: NaN or +inf in x")
    top = max(vals[i] for i in idx)
    t = mpf(tau)
    return [(vals[i] - top) / t for i in idx], idx, len(vals)


def _dps(x: Sequence[Any], tau: Any, dps: int) -> int:
    """``dps`` plus the decimal magnitude of the largest ``|z|``, ``z = (x - max x) / tau``.

    ``z`` enters exponents, so an absolute error ``10**-dps * |z|`` of ``z`` is a relative error
    of that size in ``e^z``: at ``|z| >= 1e17`` and 30 digits the reference would be wrong in the
    14th digit and call a correct row wrong. Raising the precision by ``log10 max |z|`` digits
    keeps ``dps`` digits in every weight whatever the magnitude of the input.
    """
    with mp.workdps(30):
        vals = [mpf(v) for v in x if mpf(v) not in (mpmath.ninf, mpmath.inf) and not mpmath.isnan(mpf(v))]
        if not vals:
            return dps
        top, low = max(vals), min(vals)
        big = max(abs(top - low) / abs(mpf(tau)), abs(top) / abs(mpf(tau)), mpf(1))
        return dps + int(mpmath.ceil(mpmath.log10(big)))


def _scatter(values: Sequence[Any], idx: Sequence[int], n: int) -> list[Any]:
    out = [mpf(0)] * n
    for i, v in zip(idx, values, strict=True):
        out[i] = +v
    return out


def _check_k(k: int, m: int) -> None:
    if not 1 <= k <= m:
        raise ValueError(f"reference: k={k} with {m} unmasked entries")


# ---------------------------------------------------------------------------------------------
# hard


def hard(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """T_k(x): 1 on entries above the k-th value; entries equal to it share what is left."""
    with mp.workdps(dps):
        vals = [mpf(v) for v in x]
        idx = [i for i, v in enumerate(vals) if v != mpmath.ninf]
        _check_k(k, len(idx))
        ordered = sorted((vals[i] for i in idx), reverse=True)
        kth = ordered[k - 1]
        above = sum(1 for i in idx if vals[i] > kth)
        tied = sum(1 for i in idx if vals[i] == kth)
        share = mpf(k - above) / tied
        out = [mpf(0)] * len(vals)
        for i in idx:
            out[i] = mpf(1) if vals[i] > kth else (share if vals[i] == kth else mpf(0))
        return out


# ---------------------------------------------------------------------------------------------
# iterative and weighted-softmax


def _softmax(a: Sequence[Any]) -> list[Any]:
    top = max(a)
    e = [mpmath.exp(v - top) for v in a]
    s = mpmath.fsum(e)
    return [v / s for v in e]


def iterative(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """Su (2019): ``z <- z - min z``; k times ``p <- p + softmax((1 - p) z)`` (direct recurrence)."""
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
        low = min(z)
        z = [v - low for v in z]
        # 1 - p multiplies z: an absolute error e in 1 - p moves an exponent by e * max z.
        extra = int(mpmath.log10(max(z) + 1)) + 5
    with mp.workdps(dps + extra):
        p = [mpf(0)] * len(z)
        for _ in range(k):
            s = _softmax([(1 - pi) * zi for pi, zi in zip(p, z, strict=True)])
            p = [pi + si for pi, si in zip(p, s, strict=True)]
    with mp.workdps(dps):
        return _scatter(p, idx, n)


def _ws_run(z: Sequence[Any], k: int) -> tuple[list[Any], list[Any]]:
    """One weighted-softmax pass at the current precision, carrying ``p`` and ``q = 1 - p``.

    ``q_i <- q_i (S - e_i) / S`` with ``S - e_i = sum_{j != i} q_j e_j - p_i e_i`` (prefix and
    suffix sums of the terms): exact algebra, no ``1 - p`` subtraction; the remaining
    cancellations are caught by :func:`weighted_softmax_with_complement` (precision doubling).
    """
    e = [mpmath.exp(v) for v in z]
    m = len(z)
    p = [mpf(0)] * m
    q = [mpf(1)] * m
    for _ in range(k):
        terms = [qi * ei for qi, ei in zip(q, e, strict=True)]
        s = mpmath.fsum(terms)
        prefix = [mpf(0)]
        for t in terms:
            prefix.append(prefix[-1] + t)
        suffix = [mpf(0)]
        for t in reversed(terms):
            suffix.append(suffix[-1] + t)
        new_p, new_q = [], []
        for i, t in enumerate(terms):
            rest = prefix[i] + suffix[m - 1 - i]  # sum_{j != i} q_j e_j
            new_p.append(p[i] + t / s)
            new_q.append(q[i] * (rest - p[i] * e[i]) / s)
        p, q = new_p, new_q
    return p, q


def _agree(a: Sequence[Any], b: Sequence[Any], digits: int) -> bool:
    tol = mpf(10) ** (-digits)
    return all(abs(u - v) <= tol * max(1, abs(v)) for u, v in zip(a, b, strict=True))


def weighted_softmax_with_complement(
    x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS, max_dps: int = 20000
) -> tuple[list[Any], list[Any]]:
    """``(p, q = 1 - p)`` of weighted-softmax, ``p`` certified to ``dps`` digits.

    Runs :func:`_ws_run` at precisions ``P`` and ``2P`` (``P`` starting at ``dps + 20``) and
    doubles ``P`` until every ``p_i`` agrees to ``10**-dps * max(1, |p_i|)``. (Inside the
    recurrence ``q`` needs relative accuracy, which is what the doubling guards; the final
    ``q`` is returned as computed at ``2P``.)

    Raises:
        RuntimeError: no agreement below ``max_dps`` digits.
    """
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
    prec = dps + 20
    while True:
        with mp.workdps(prec):
            p1, _q1 = _ws_run(z, k)
        with mp.workdps(2 * prec):
            p2, q2 = _ws_run(z, k)
            ok = _agree(p1, p2, dps)
        if ok:
            break
        prec *= 2
        if prec > max_dps:
            raise RuntimeError(f"reference weighted-softmax not certified below {max_dps} digits")
    with mp.workdps(dps):
        qs = [mpf(1)] * n
        for i, v in zip(idx, q2, strict=True):
            qs[i] = +v
        return _scatter(p2, idx, n), qs


def weighted_softmax(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """k rounds of ``p <- p + w e^z / sum(w e^z)``, ``w = 1 - p`` carried accurately."""
    return weighted_softmax_with_complement(x, k, tau, dps=dps)[0]


def weighted_softmax_direct(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """The naive weighted-softmax recurrence (``w = 1 - p`` by subtraction) at precision ``dps``.

    Faithful only when ``dps`` exceeds ``-log10(min q)`` by the wanted number of digits; used to
    check :func:`weighted_softmax`.
    """
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
        e = [mpmath.exp(v) for v in z]
        p = [mpf(0)] * len(z)
        for _ in range(k):
            terms = [(1 - pi) * ei for pi, ei in zip(p, e, strict=True)]
            s = mpmath.fsum(terms)
            p = [pi + t / s for pi, t in zip(p, terms, strict=True)]
        return _scatter(p, idx, n)


# ---------------------------------------------------------------------------------------------
# grad (GradTopK)


def _subsets(m: int, k: int) -> list[tuple[int, ...]]:
    return list(itertools.combinations(range(m), k))


def _subset_weights(z: Sequence[Any], k: int) -> tuple[list[tuple[int, ...]], list[Any], Any]:
    subsets = _subsets(len(z), k)
    sums = [mpmath.fsum(z[i] for i in s) for s in subsets]
    top = max(sums)
    w = [mpmath.exp(s - top) for s in sums]
    return subsets, w, mpmath.fsum(w)


def grad_enumerate(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """GradTopK marginals ``P(i in S)``, ``P(S) ∝ exp(sum_{i in S} z_i)``, by enumerating subsets."""
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
        subsets, w, total = _subset_weights(z, k)
        p = [mpf(0)] * len(z)
        for s, ws in zip(subsets, w, strict=True):
            for i in s:
                p[i] += ws
        return _scatter([v / total for v in p], idx, n)


def _esp_marginals(z: Sequence[Any], k: int) -> list[Any]:
    """``w_i e_{k-1}(w without i) / e_k(w)``, ``w = e^z``, via prefix/suffix ESP tables."""
    m = len(z)
    w = [mpmath.exp(v) for v in z]
    zero = mpf(0)
    # suffix[i][j] = e_j(w_i, ..., w_{m-1}) for j < k (e_0 = 1), standard O(mk) recurrence
    suffix = [[zero] * k for _ in range(m + 1)]
    suffix[m][0] = mpf(1)
    for i in range(m - 1, -1, -1):
        nxt, cur = suffix[i + 1], suffix[i]
        cur[0] = mpf(1)
        for j in range(1, k):
            cur[j] = nxt[j] + w[i] * nxt[j - 1]
    prefix = [mpf(1)] + [zero] * k  # e_j(w_0..w_{i-1}), j = 0..k
    p = []
    for i in range(m):
        suf = suffix[i + 1]
        without = mpmath.fsum(prefix[j] * suf[k - 1 - j] for j in range(k))
        p.append(w[i] * without)
        prefix = [prefix[0]] + [prefix[j] + w[i] * prefix[j - 1] for j in range(1, k + 1)]
    ek = prefix[k]
    return [v / ek for v in p]


def grad_esp(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """GradTopK by elementary symmetric polynomials (any n); ``k > n/2`` via the complement."""
    return grad_with_complement_esp(x, k, tau, dps=dps)[0]


def grad_with_complement_esp(
    x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS
) -> tuple[list[Any], list[Any]]:
    """``(p, 1 - p)`` of GradTopK, the smaller of the two computed directly (relative accuracy)."""
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        m = len(z)
        _check_k(k, m)
        if k == m:
            p, q = [mpf(1)] * m, [mpf(0)] * m
        elif 2 * k <= m:
            p = _esp_marginals(z, k)
            q = [1 - v for v in p]
        else:  # complement subsets: P(i not in S) for k is P(i in T) for n - k on -z
            neg = [-v for v in z]
            top = max(neg)
            q = _esp_marginals([v - top for v in neg], m - k)
            p = [1 - v for v in q]
        qs = _scatter(q, idx, n)
        for i in range(n):
            if i not in idx:
                qs[i] = mpf(1)
        return _scatter(p, idx, n), qs


def grad(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """GradTopK marginals: enumeration when at most 12 entries are unmasked, else ESP tables."""
    unmasked = sum(1 for v in x if mpf(v) != mpmath.ninf)
    if unmasked <= 12:
        return grad_enumerate(x, k, tau, dps=dps)
    return grad_esp(x, k, tau, dps=dps)


# ---------------------------------------------------------------------------------------------
# threshold methods: p = f(z - lambda), sum p = k


def _f_exp(t: Any) -> Any:
    return mpf(1) if t >= 0 else mpmath.exp(t)


def _df_exp(t: Any) -> Any:
    return mpf(0) if t >= 0 else mpmath.exp(t)  # saturated side at the kink


def _f_sigmoid(t: Any) -> Any:
    return 1 / (1 + mpmath.exp(-t))


def _df_sigmoid(t: Any) -> Any:
    e = mpmath.exp(-abs(t))
    return e / (1 + e) ** 2


def _f_laplace(t: Any) -> Any:
    return 1 - mpmath.exp(-t) / 2 if t >= 0 else mpmath.exp(t) / 2


def _df_laplace(t: Any) -> Any:
    return mpmath.exp(-abs(t)) / 2


def _fc_exp(t: Any) -> Any:
    return mpf(0) if t >= 0 else -mpmath.expm1(t)


def _fc_sigmoid(t: Any) -> Any:
    return 1 / (1 + mpmath.exp(t))


def _fc_laplace(t: Any) -> Any:
    return mpmath.exp(-t) / 2 if t >= 0 else 1 - mpmath.exp(t) / 2


#: ``1 - f(t)`` written without cancellation, per threshold method.
THRESHOLD_FC: dict[str, Callable[[Any], Any]] = {
    "thre-exp": _fc_exp,
    "thre-sigmoid": _fc_sigmoid,
    "thre-laplace": _fc_laplace,
}

THRESHOLD_F: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "thre-exp": (_f_exp, _df_exp),
    "thre-sigmoid": (_f_sigmoid, _df_sigmoid),
    "thre-laplace": (_f_laplace, _df_laplace),
}


def _float_lambda(z: Sequence[Any], k: Any, method: str) -> float:
    """A float64 estimate of the threshold by bisection (a starting point only).

    The sign of ``g`` is decided as ``log sum_{i not in top j} f(z_i - lambda)`` versus
    ``log (sum_{i in top j} (1 - f(z_i - lambda)) + (k - j))``, ``j = floor(k)`` (log-sum-exp of
    log-terms written without ``1 - f`` cancellation or underflow), so it is right even where every
    ``f`` rounds to 0 or 1 in float64 (e.g. ``lambda`` thousands of units below the top k).
    ``k`` may be real.
    """
    import numpy as np

    zf = np.sort(np.array([float(v) for v in z]))[::-1]
    j = int(mpmath.floor(k))
    frac = float(k - j)
    top, rest = zf[:j], zf[j:]
    log2 = math.log(2.0)

    def log_f(t: np.ndarray) -> np.ndarray:
        if method == "thre-exp":
            return np.minimum(t, 0.0)
        if method == "thre-sigmoid":
            return -np.logaddexp(0.0, -t)
        return np.where(t >= 0, np.log1p(-np.exp(-np.abs(t)) / 2), -np.abs(t) - log2)

    def log_fc(t: np.ndarray) -> np.ndarray:
        if method == "thre-exp":
            return np.where(t >= 0, -np.inf, np.log(-np.expm1(-np.abs(t))))
        if method == "thre-sigmoid":
            return -np.logaddexp(0.0, t)
        return np.where(t >= 0, -np.abs(t) - log2, np.log1p(-np.exp(-np.abs(t)) / 2))

    def positive(lam: float) -> bool:  # g(lam) > 0
        with np.errstate(divide="ignore"):  # log 0 = -inf for saturated entries is intended
            a = np.logaddexp.reduce(log_f(rest - lam))
            b = np.logaddexp.reduce(log_fc(top - lam))
            if frac > 0:
                b = np.logaddexp(b, math.log(frac))
        return bool(a > b)

    lo, hi = float(zf.min()) - 1, float(zf.max()) + 1
    while not positive(lo):
        lo -= 2 * (hi - lo)
    while positive(hi):
        hi += 2 * (hi - lo)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if positive(mid):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def threshold_lambda(z: Sequence[Any], k: Any, method: str) -> Any:
    """Root of ``sum f(z - lambda) = k`` (``0 < k < len(z)``, ``k`` may be real) at the working precision.

    ``g(lambda) = sum f(z - lambda) - k`` is continuous and non-increasing; it is evaluated as
    ``sum_{rest} f - sum_{top j} (1 - f) - (k - j)`` with ``j = floor(k)``, so that (for an
    integer k) its sign is right even when ``|g|`` is far below the working precision's ulp of
    ``k``. A float64 estimate
    gives a bracket ``[lo, hi]`` with ``g(lo) > 0 >= g(hi)``, verified in mpmath (widened until
    it holds); safeguarded Newton (bisection whenever a step leaves the bracket or ``|g|``
    stalls, e.g. at the kink of ``min(1, e^t)``) shrinks it until the weights it implies are
    fixed to the working precision: ``(hi - lo) * max f' <= 10**-(dps - 3)``.
    The residual is checked at the end.
    """
    f, df = THRESHOLD_F[method]
    fc = THRESHOLD_FC[method]
    ordered = sorted(z, reverse=True)
    j = int(mpmath.floor(k))
    frac = mpf(k) - j
    top, rest = ordered[:j], ordered[j:]

    def g(lam: Any) -> Any:
        # sum f - k = sum_{rest} f - sum_{top j} (1 - f) - frac: accurate even when g is e^-12000
        return mpmath.fsum(f(v - lam) for v in rest) - mpmath.fsum(fc(v - lam) for v in top) - frac

    guess = mpf(_float_lambda(z, k, method))
    width = mpf(10) ** -9 * (1 + abs(guess))
    lo, hi = guess - width, guess + width
    while g(lo) <= 0:
        lo -= width
        width *= 4
    width = mpf(10) ** -9 * (1 + abs(guess))
    while g(hi) > 0:
        hi += width
        width *= 4
    eps = mpf(10) ** (-(mp.dps - 3))
    lam = guess if lo < guess < hi else (lo + hi) / 2
    last = None
    for _ in range(20 * mp.prec):
        val = g(lam)
        if val > 0:
            lo = lam
        else:
            hi = lam
        slopes = [df(v - lam) for v in z]
        slope = mpmath.fsum(slopes)
        if hi - lo < mpf(1) / 8:
            # over a bracket this narrow f' varies by < 15%, except across the kink of thre-exp
            steepest = 2 * max(slopes) + (1 if any(lo <= v <= hi for v in z) else 0)
            if (hi - lo) * steepest <= eps:
                break
        if hi - lo <= eps * (1 + abs(lam)):
            break
        new = lam + val / slope if slope > 0 else (lo + hi) / 2
        # safeguard (rtsafe): bisect when Newton leaves the bracket or |g| stalls (kinks)
        # (only a genuine Newton step: where every f' is 0, e.g. all of thre-exp's entries
        # saturated, the fallback midpoint is no evidence of convergence; nor is a step across
        # the kink of thre-exp at some z_i, where f' jumps and the slopes at lam say nothing)
        if (slope > 0 and lo < new < hi and abs(new - lam) * max(slopes) <= eps / 16
                and not any(min(lam, new) <= v <= max(lam, new) for v in z)):
            lam = new  # a converged Newton step: the error is below the step's size
            break
        if not lo < new < hi or (last is not None and abs(val) > abs(last) / 2):
            new = (lo + hi) / 2
        last = val
        lam = new
    else:  # pragma: no cover - would mean the solver is broken
        raise RuntimeError("reference threshold solver did not converge")
    resid = abs(g(lam))
    if resid > mpf(10) ** (-(mp.dps - 8)) * (1 + k) * (1 + max(abs(v) for v in z)):
        raise RuntimeError(f"reference threshold residual too large: {resid}")
    return lam


def threshold(x: Sequence[Any], k: Any, tau: Any = 1.0, *, method: str, dps: int = DPS) -> list[Any]:
    """``p = f(z - lambda)`` with ``sum p = k`` (``k`` may be real, ``0 < k <= #unmasked``); all
    ones when ``k`` equals the unmasked count."""
    f, _ = THRESHOLD_F[method]
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        if isinstance(k, int):
            _check_k(k, len(z))
        elif not 0 < k <= len(z):
            raise ValueError(f"reference: k={k} with {len(z)} unmasked entries")
        if k == len(z):
            return _scatter([mpf(1)] * k, idx, n)
        lam = threshold_lambda(z, k, method)
        return _scatter([f(v - lam) for v in z], idx, n)


def thre_exp(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """``p = min(1, exp(z - lambda))``, ``sum p = k``."""
    return threshold(x, k, tau, method="thre-exp", dps=dps)


def thre_sigmoid(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """``p = sigmoid(z - lambda)``, ``sum p = k``."""
    return threshold(x, k, tau, method="thre-sigmoid", dps=dps)


def thre_laplace(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """``p = F(z - lambda)`` with the Laplace CDF ``F``, ``sum p = k``."""
    return threshold(x, k, tau, method="thre-laplace", dps=dps)


#: Reference function of every registered method (grad-recursive computes GradTopK too).
REFERENCES: dict[str, RefFn] = {
    "hard": hard,
    "iterative": iterative,
    "weighted-softmax": weighted_softmax,
    "grad": grad,
    "grad-recursive": grad,
    "thre-exp": thre_exp,
    "thre-sigmoid": thre_sigmoid,
    "thre-laplace": thre_laplace,
}


def all_references() -> dict[str, RefFn]:
    """Every registered method's reference: this module's, the wider field's from
    ``reference_wider.py`` (thre-clip, thre-cube, topk-softmax, ot-sinkhorn, perturbed), the
    relaxed-sorting methods' from ``reference_sorting.py`` (neuralsort, softsort, sorting-network) and
    ``reference_more.py`` (gumbel-topk, coordinate-descent, dftopk, scaled-sigmoid, k-softmax,
    straight-through)."""
    import reference_more
    import reference_sorting
    import reference_wider

    return {**REFERENCES, **reference_wider.REFERENCES, **reference_sorting.REFERENCES, **reference_more.REFERENCES}


def reference(method: str, x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """The reference weights of ``method`` (a registered name)."""
    return REFERENCES[method](x, k, tau, dps=dps)


# ---------------------------------------------------------------------------------------------
# Jacobians d p / d x (including 1/tau)


def _zero_matrix(n: int) -> list[list[Any]]:
    return [[mpf(0)] * n for _ in range(n)]


def jacobian_threshold(
    x: Sequence[Any], k: int, tau: Any = 1.0, *, method: str, dps: int = DPS
) -> list[list[Any]]:
    """Implicit-function Jacobian ``(diag(d) - d d^T / sum d) / tau``, ``d_i = f'(z_i - lambda)``."""
    _, df = THRESHOLD_F[method]
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        _check_k(k, len(z))
        out = _zero_matrix(n)
        if k == len(z):
            return out
        lam = threshold_lambda(z, k, method)
        d = [df(v - lam) for v in z]
        s = mpmath.fsum(d)
        t = mpf(tau)
        for a, i in enumerate(idx):
            for b, j in enumerate(idx):
                out[i][j] = ((d[a] if a == b else 0) - d[a] * d[b] / s) / t
        return out


def jacobian_grad_enumerate(x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = DPS) -> list[list[Any]]:
    """GradTopK Jacobian as the subset covariance ``(P(i, j in S) - p_i p_j) / tau`` (n <= 12)."""
    dps = _dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = _split(x, tau)
        m = len(z)
        _check_k(k, m)
        subsets, w, total = _subset_weights(z, k)
        pair = [[mpf(0)] * m for _ in range(m)]
        for s, ws in zip(subsets, w, strict=True):
            for i in s:
                for j in s:
                    pair[i][j] += ws
        p = [pair[i][i] / total for i in range(m)]
        out = _zero_matrix(n)
        t = mpf(tau)
        for a, i in enumerate(idx):
            for b, j in enumerate(idx):
                out[i][j] = (pair[a][b] / total - p[a] * p[b]) / t
        return out


def jacobian_fd(
    fn: RefFn, x: Sequence[Any], k: int, tau: Any = 1.0, *, dps: int = 90, step_digits: int = 25
) -> list[list[Any]]:
    """Central finite differences of a reference function: ``J[i][j] = d p_i / d x_j``.

    The step is ``h = 10**-step_digits`` and the evaluation uses ``dps`` digits, so the
    truncation error O(h^2) and the rounding error ``10**-(dps - step_digits)`` are both far
    below float64 resolution. Masked entries are not perturbed (zero columns).
    """
    with mp.workdps(dps):
        xs = [mpf(v) for v in x]
        n = len(xs)
        h = mpf(10) ** (-step_digits)
        out = _zero_matrix(n)
        for j in range(n):
            if xs[j] == mpmath.ninf:
                continue
            up, down = list(xs), list(xs)
            up[j] += h
            down[j] -= h
            pu = fn(up, k, tau, dps=dps)
            pd = fn(down, k, tau, dps=dps)
            for i in range(n):
                out[i][j] = (pu[i] - pd[i]) / (2 * h)
        return out


def to_floats(values: Sequence[Any]) -> list[float]:
    """Round mpf values to the nearest float64."""
    return [float(v) for v in values]


def max_abs_diff(a: Sequence[Any], b: Sequence[Any]) -> float:
    """``max |a_i - b_i|`` as a float (inputs may mix floats and mpf)."""
    with mp.workdps(DPS):
        return max((float(abs(mpf(u) - mpf(v))) for u, v in zip(a, b, strict=True)), default=0.0)


def digits_of(values: Sequence[Any]) -> float:
    """``log10`` of the largest magnitude in ``values`` (``-inf`` for all zeros); for reports."""
    big = max((abs(float(v)) for v in values), default=0.0)
    return math.log10(big) if big > 0 else -math.inf


# ---------------------------------------------------------------------------------------------
# real k (one real 0 < k <= m per row): hard, ot-sinkhorn, perturbed


def hard_real(x: Sequence[Any], k: Any, tau: Any = 1.0, *, dps: int = DPS) -> list[Any]:
    """T_k(x) for a real k: with c = ceil(k), 1 on entries above the c-th value; the entries equal
    to it share k - #above equally (for an integer k, :func:`hard`)."""
    with mp.workdps(dps):
        kk = mpf(k)
        vals = [mpf(v) for v in x]
        idx = [i for i, v in enumerate(vals) if v != mpmath.ninf]
        if not 0 < kk <= len(idx):
            raise ValueError(f"reference: k={k} with {len(idx)} unmasked entries")
        c = int(mpmath.ceil(kk))
        kth = sorted((vals[i] for i in idx), reverse=True)[c - 1]
        above = sum(1 for i in idx if vals[i] > kth)
        tied = sum(1 for i in idx if vals[i] == kth)
        share = (kk - above) / tied
        out = [mpf(0)] * len(vals)
        for i in idx:
            out[i] = mpf(1) if vals[i] > kth else (share if vals[i] == kth else mpf(0))
        return out


def sinkhorn_real(x: Sequence[Any], k: Any, tau: Any = 1.0, *, dps: int = 40, max_iter: int = 100_000) -> list[Any]:
    """Converged entropic OT top-k for a real k: ``reference_wider.sinkhorn`` (log-domain Sinkhorn on
    two anchors {0, 1}, full squared cost, eps = 1) with masses ``(m - k)/m`` and ``k/m`` at the
    anchors computed from k exactly (an mpf), iterated until ``max |m rowmass - 1| < 10^-(dps - 10)``."""
    import reference_wider

    with mp.workdps(dps):
        return reference_wider.sinkhorn(x, mpf(k), tau, dps=dps, max_iter=max_iter)[0]


def sinkhorn_real_dk(x: Sequence[Any], k: Any, tau: Any = 1.0, *, dps: int = 40) -> list[Any]:
    """``dp/dk`` of the converged entropic OT top-k: central differences in k of the converged plan
    (``reference_wider.sinkhorn_fixed_point``, an mpmath root of ``sum p = k``) at step 1e-15 and 40
    digits (error ~1e-30); ``k < m``."""
    import reference_wider

    with mp.workdps(dps):
        kk, h = mpf(k), mpf(10) ** -15
        if not kk < sum(1 for v in x if v != float("-inf")):
            raise ValueError("reference: dp/dk needs k < m (the fixed point is slow to bracket near k = m)")
        up = reference_wider.sinkhorn_fixed_point(x, kk + h, tau, dps=dps)
        dn = reference_wider.sinkhorn_fixed_point(x, kk - h, tau, dps=dps)
        return [(u - v) / (2 * h) for u, v in zip(up, dn)]


def perturbed_real(x: Sequence[Any], k: Any, tau: Any = 1.0, *, dps: int = 25) -> list[Any]:
    """Exact ``E[T_k(x + tau Z)]`` for a real k, T_k the real-k hard top-k: a sample's c-th largest
    entry (c = ceil(k)) gets ``k - c + 1``, so the expectation is ``(c - k) E[T_{c-1}] + (k - c + 1)
    E[T_c]`` (``T_0 = 0``), each by ``reference_wider.perturbed_masked`` (quadrature)."""
    import reference_wider

    with mp.workdps(dps):
        kk = mpf(k)
        c = int(mpmath.ceil(kk))
        frac = kk - c + 1
        upper = reference_wider.perturbed_masked(x, c, tau, dps=dps)
        lower = reference_wider.perturbed_masked(x, c - 1, tau, dps=dps) if c > 1 else [mpf(0)] * len(x)
        return [(1 - frac) * a + frac * b for a, b in zip(lower, upper)]
