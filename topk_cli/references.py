"""Independent references of the operators, computed another way than the operators themselves.

``stability-probe`` measures each method against the reference its registry entry names
(:attr:`topk_cli.registry.MethodSpec.probe`). A reference is a function
``reference(z, k, ctx) -> (weights, trusted)`` on a prepared ``(B, n)`` batch ``z`` (see
``topk_cli.operators._base``): ``weights`` ``(B, n)`` and the rows where the reference itself is
accurate enough to judge the method. ``ctx`` (:class:`ReferenceContext`) shares work between
references on the same batch (the tables of GradTopK serve every ``k``).

The builders here are generic: :func:`threshold_bisection` (any ``p = f(z - lambda)``),
:func:`extended_precision` (a definition run in ``np.longdouble``) and :func:`grad_reference`
(an exact forward/backward program in linear space, independent of
``topk_cli.operators.gradtopk``).

Axis convention: the last axis holds the ``n`` scores; leading axes are a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray
from topk_cli.operators._logspace import exp_new, logsumexp

LongArray = NDArray[np.longdouble]
AnyFloat = NDArray[np.floating[Any]]
BoolArray = NDArray[np.bool_]


# ---------------------------------------------------------------------------------------------
# exact programs for GradTopK at every level (log space; linear space below)


@dataclass(frozen=True)
class EspTables:
    """Log elementary symmetric polynomials of ``w = exp(z)`` for rows sorted decreasingly."""

    s: LongArray  # (B, n) sorted scores, decreasing
    order: NDArray[np.intp]  # (B, n) original index of each sorted position
    prefix: LongArray  # (m + 1, B, K + 1): log e_j(w_1..w_i), i = 0..m
    suffix: LongArray  # (n + 1, B, K + 1): log e_j(w_{i+1}..w_n), i = 0..n (all i)
    total: LongArray  # (B, K + 1): log e_j(w)
    memo: dict[int, FloatArray] = field(default_factory=dict)  # reference weights by k


# GradTopK's p_i = w_i e_{k-1}(w_-i) / e_k(w) of an entry outside the k largest is at most
# k w_i / w_(k) (k e_k(w_-i) >= w_(k) e_{k-1}(w_-i): each (k-1)-subset of w_-i leaves one of the k
# largest out); below e^-751 it rounds to 0 in float64 (half the smallest subnormal is e^-745.13),
# so such entries need neither the forward table nor the leave-one-out sums
_NEGLIGIBLE = 751.0


def weights_len(s: LongArray, k: int) -> int:
    """Sorted positions ``< weights_len(s, k)`` are the only ones whose weight at ``k`` can be
    nonzero in float64, on any row of ``s`` (sorted decreasingly); nondecreasing in ``k``."""
    rows, n = s.shape
    if k >= n or rows == 0:
        return n
    with np.errstate(invalid="ignore"):  # a masked k-th entry: -inf - c is -inf, nothing is cut
        keep = ~(s < (s[:, k - 1] - (math.log(k) + _NEGLIGIBLE))[:, None])  # NaN is kept
    last = n - np.argmax(keep[:, ::-1], axis=1)  # one past the last kept position (k - 1 is kept)
    return max(k, int(last.max()))


def _sorted(z: FloatArray) -> tuple[NDArray[np.intp], LongArray]:
    order = np.argsort(-z, axis=-1, kind="stable")
    return order, np.take_along_axis(z, order, axis=-1).astype(np.longdouble)


def log_esp_tables(z: FloatArray, kmax: int, prefix_len: int | None = None) -> EspTables:
    """Forward (first ``prefix_len`` positions) and backward log-space tables up to degree ``kmax``.

    ``prefix_len=None``: the positions :func:`esp_weights` reads for every ``k <= kmax`` and
    the ``2 kmax`` the recursion outlook reads."""
    # extended precision (where the platform has it): logs of e_j reach |k * spread|, and
    # differences of such logs lose their magnitude's worth of float64 digits
    order, s = _sorted(z)
    rows, n = s.shape
    if prefix_len is None:
        prefix_len = max(min(n, 2 * kmax), weights_len(s, kmax))
    empty = np.full((rows, kmax + 1), -np.inf, dtype=np.longdouble)
    empty[:, 0] = 0.0
    term = np.empty((rows, kmax), dtype=np.longdouble)
    suffix = np.empty((n + 1, rows, kmax + 1), dtype=np.longdouble)
    suffix[n] = empty
    # logaddexp(-inf, -inf) is -inf: empty sums of masked entries are exact
    for i in range(n - 1, -1, -1):
        suffix[i, :, 0] = 0.0
        np.add(s[:, i, None], suffix[i + 1, :, :-1], out=term)
        np.logaddexp(suffix[i + 1, :, 1:], term, out=suffix[i, :, 1:])
    prefix = np.empty((prefix_len + 1, rows, kmax + 1), dtype=np.longdouble)
    prefix[0] = empty
    for i in range(prefix_len):
        prefix[i + 1, :, 0] = 0.0
        np.add(s[:, i, None], prefix[i, :, :-1], out=term)
        np.logaddexp(prefix[i, :, 1:], term, out=prefix[i + 1, :, 1:])
    return EspTables(s=s, order=order, prefix=prefix, suffix=suffix, total=suffix[0])


def esp_weights(tab: Esp, k: int) -> FloatArray:
    """GradTopK ``p_i = w_i e_{k-1}(w_-i) / e_k(w)`` from the tables (degree >= k, forward table
    over at least ``weights_len(tab.s, k)`` positions, as ``esp_tables(z, kmax)`` builds it);
    NaN on rows with fewer than ``k`` finite scores."""
    if k in tab.memo:
        return tab.memo[k]
    rows, n = tab.s.shape
    if k == n:
        return tab.memo.setdefault(k, np.ones((rows, n)))
    m = weights_len(tab.s, k)
    if forward_len(tab) < m:
        raise InvalidArgumentError(f"the forward table does not cover the {m} positions k={k} needs")
    if isinstance(tab, LinearEsp):
        return tab.memo.setdefault(k, _linear_weights(tab, k, m))
    # log e_{k-1}(w without i), i < m: (m, B), from the terms log e_j(before i) + log e_{k-1-j}(after i)
    terms = cast(FloatArray, tab.prefix[:m, :, :k] + tab.suffix[1 : m + 1, :, k - 1 :: -1])  # longdouble: logsumexp is dtype-generic
    loo = logsumexp(terms, axis=-1, buf=terms)
    p_sorted = np.zeros((rows, n))  # the weights of positions >= m round to 0
    with np.errstate(invalid="ignore"):  # masked entries: -inf + finite is -inf, exp gives 0
        p_sorted[:, :m] = np.exp(tab.s[:, :m] + loo.T - tab.total[:, k, None])
    p = np.empty_like(p_sorted)
    np.put_along_axis(p, tab.order, np.minimum(p_sorted, 1.0), axis=-1)
    return tab.memo.setdefault(k, p)


# ---------------------------------------------------------------------------------------------
# the same quantities in linear space: every term positive, no logs


@dataclass(frozen=True)
class LinearEsp:
    """Elementary symmetric polynomials of ``w = exp(z)``, rows sorted decreasingly, each divided
    by its largest product (so the values lie in ``[1, C(n, j)]``, or are 0 for empty sums).

    The scale factors are ratios ``w_t / w_u <= 1`` formed from one ``exp`` of a nonpositive score
    difference, or products of at most ``K`` of them; a factor that underflows multiplies a value
    at most ``C(n, K)`` times smaller than the value it is added to, so it cannot matter. All
    sums have positive terms: each entry has a relative error of a few ``n u`` (``u`` of
    ``np.longdouble``), whatever the spread of the scores, where the log-space tables carry an
    absolute error of ``u`` times their logs' magnitude, up to ``k`` times the spread.
    """

    s: LongArray  # (B, n) sorted scores, decreasing (masked entries, -inf, last)
    order: NDArray[np.intp]  # (B, n) original index of each sorted position
    st: LongArray  # (n, B) the sorted scores, positions first
    prefix: LongArray  # (K + 1, L + 1, B): e_j(w_0..w_{i-1}) / (w_0 ... w_{j-1}), i = 0..L
    suffix: LongArray  # (n + 1, K + 1, B): e_j(w_i..w_{n-1}) / (w_i ... w_{i+j-1}), i = 0..n
    memo: dict[int, FloatArray] = field(default_factory=dict)  # reference weights by k


Esp = EspTables | LinearEsp

_LD = np.finfo(np.longdouble)
# the binomial bound on the scaled values must stay far from both ends of the exponent range
_MAX_LOG_BINOMIAL = float(min(np.log(_LD.max), -np.log(_LD.tiny))) - 100.0


def _log_binomial_max(n: int, kmax: int) -> float:
    j = min(kmax, n // 2)
    return math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)


def esp_tables(z: FloatArray, kmax: int, prefix_len: int | None = None) -> Esp:
    """The tables of the GradTopK reference up to degree ``kmax``: in linear space
    (:class:`LinearEsp`) unless ``C(n, kmax)`` approaches the range of ``np.longdouble``, then
    in log space (:func:`log_esp_tables`). ``prefix_len`` as in :func:`log_esp_tables`."""
    n = z.shape[-1]
    if _log_binomial_max(n, kmax) > _MAX_LOG_BINOMIAL:
        return log_esp_tables(z, kmax, prefix_len)
    order, s = _sorted(z)
    rows = s.shape[0]
    if prefix_len is None:
        prefix_len = max(min(n, 2 * kmax), weights_len(s, kmax))
    st = np.ascontiguousarray(s.T)
    fin = np.isfinite(st)
    # d[t] = w_t / w_{t-1} = exp(s_t - s_{t-1}) in [0, 1]; 0 at masked positions and past n
    d = np.zeros((n + kmax + 1, rows), dtype=np.longdouble)
    with np.errstate(invalid="ignore"):  # -inf - -inf: masked, replaced by 0
        d[1:n] = np.where(fin[1:], np.exp(st[1:] - st[:-1]), 0.0)
    # backward: S_i[j] = (w_{i+j} / w_i) S_{i+1}[j] + S_{i+1}[j-1] (0 for a masked w_i)
    suffix = np.zeros((n + 1, kmax + 1, rows), dtype=np.longdouble)
    suffix[:, 0] = 1.0
    finite = fin.astype(np.longdouble)
    ratio = np.empty((kmax, rows), dtype=np.longdouble)
    for i in range(n - 1, -1, -1):
        np.cumprod(d[i + 1 : i + kmax + 1], axis=0, out=ratio)  # w_{i+j} / w_i, j = 1..kmax
        np.multiply(ratio, suffix[i + 1, 1:], out=ratio)
        np.multiply(finite[i], suffix[i + 1, :-1], out=suffix[i, 1:])
        suffix[i, 1:] += ratio
    # forward, one degree at a time: P_{i+1}[j] = P_i[j] + (w_i / w_{j-1}) P_i[j-1], a running sum
    # over i; w_i / w_{j-1} = (w_i / w_a) (w_a / w_{j-1}) with w_a the smallest of the kmax largest
    # (both <= 1 for i >= kmax - 1), directly for the first kmax - 1 positions
    big = np.minimum(kmax, fin.sum(axis=0)) - 1
    anchor = np.where(big >= 0, st[np.maximum(big, 0), np.arange(rows)], 0.0)
    head = min(kmax - 1, prefix_len)
    with np.errstate(invalid="ignore"):
        tail = np.exp(st[head:prefix_len] - anchor)
    prefix = np.zeros((kmax + 1, prefix_len + 1, rows), dtype=np.longdouble)
    prefix[0] = 1.0
    f = np.empty((prefix_len, rows), dtype=np.longdouble)
    for j in range(1, min(kmax, n) + 1):
        sj = st[j - 1]
        with np.errstate(invalid="ignore", over="ignore"):  # rows with fewer than j entries: zeroed
            np.multiply(tail, np.exp(anchor - sj), out=f[head:])
            if j - 1 < head:
                f[j - 1 : head] = np.exp(st[j - 1 : head] - sj)
        f[: min(j - 1, prefix_len)] = 0.0
        f[:, ~np.isfinite(sj)] = 0.0
        f *= prefix[j - 1, :-1]
        np.cumsum(f, axis=0, out=prefix[j, 1:])
    return LinearEsp(s=s, order=order, st=st, prefix=prefix, suffix=suffix)


def _linear_weights(tab: LinearEsp, k: int, m: int) -> FloatArray:
    """:func:`esp_weights` of the first ``m`` sorted positions (the others are 0), ``k < n``.

    ``p_i = sum_l P_i[l] S_{i+1}[k-1-l] r_il / S_0[k]`` with ``r_il = prod_{u <= k-1-l}
    w_{i+u} / w_{l+u} <= 1`` (``l <= i``), formed from ``r_i,k-1 = w_i / w_{k-1}`` (1 at
    ``l = i``) by ``r_i,l-1 = r_il (w_{i+k-l} / w_{k-1}) (w_{k-1} / w_{l-1})``."""
    rows, n = tab.s.shape
    st, sk = tab.st, tab.st[k - 1]
    ratio = np.zeros((m + k, rows), dtype=np.longdouble)  # w_t / w_{k-1} for k - 1 <= t < n, else 0
    top = min(n, m + k)
    with np.errstate(invalid="ignore"):  # rows with fewer than k entries: NaN below
        ratio[k - 1 : top] = np.exp(st[k - 1 : top] - sk)
        up = np.exp(sk - st[:k])  # w_{k-1} / w_l, l < k
    r = np.ones((m, rows), dtype=np.longdouble)
    r[k - 1 :] = ratio[k - 1 : m]
    acc = np.zeros((m, rows), dtype=np.longdouble)
    term = np.empty((m, rows), dtype=np.longdouble)
    for deg in range(k - 1, -1, -1):  # l in the formula above
        np.multiply(tab.prefix[deg, :m], tab.suffix[1 : m + 1, k - 1 - deg], out=term)
        term *= r
        acc += term
        if deg > 0:
            r[deg:] *= ratio[k : k + m - deg] * up[deg - 1]
    p_sorted = np.zeros((rows, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        p_sorted[:, :m] = (acc / tab.suffix[0, k]).T
    p_sorted[~np.isfinite(sk)] = np.nan  # as the log-space program: 0 / 0
    p = np.empty_like(p_sorted)
    np.put_along_axis(p, tab.order, np.minimum(p_sorted, 1.0), axis=-1)
    return p


def forward_len(tab: Esp) -> int:
    """Positions covered by the forward tables."""
    return tab.prefix.shape[1 if isinstance(tab, LinearEsp) else 0] - 1


def esp_logs(tab: Esp, m: int, degree: int) -> tuple[AnyFloat, AnyFloat, AnyFloat]:
    """``log e_j``, ``j <= degree``, of the forward tables of the first ``m`` positions
    ``(m, B, degree + 1)``, of the backward tables after positions ``0..m-1`` (same shape) and of
    all of ``w`` ``(B, degree + 1)``: extended precision from log-space tables, float64 from
    linear ones when their values fit it."""
    if isinstance(tab, EspTables):
        return tab.prefix[:m, :, : degree + 1], tab.suffix[1 : m + 1, :, : degree + 1], tab.total[:, : degree + 1]
    st = tab.st
    rows = st.shape[1]
    pad = np.full((m + degree + 1, rows), -np.inf, dtype=np.longdouble)
    top = min(st.shape[0], m + degree + 1)
    pad[:top] = st[:top]
    lead = np.zeros((degree + 1, rows), dtype=np.longdouble)  # log(w_0 ... w_{j-1})
    window = np.zeros((degree + 1, m + 1, rows), dtype=np.longdouble)  # log(w_i ... w_{i+j-1})
    for j in range(1, degree + 1):
        lead[j] = lead[j - 1] + pad[j - 1]
        window[j] = window[j - 1] + pad[j - 1 : j + m]
    # the scaled values are at most C(n, degree)
    dtype = np.float64 if _log_binomial_max(st.shape[0], degree) < 700.0 else np.longdouble
    with np.errstate(divide="ignore"):  # empty sums: log 0 = -inf
        prefix = np.log(tab.prefix[: degree + 1, :m].astype(dtype)) + lead[:, None, :].astype(dtype)
        suffix = np.log(tab.suffix[: m + 1, : degree + 1].transpose(1, 0, 2).astype(dtype)) + window.astype(dtype)
    return prefix.transpose(1, 2, 0), suffix[:, 1:].transpose(1, 2, 0), suffix[:, 0].T


class ReferenceContext:
    """Work shared by the references evaluated on one batch ``z`` (every ``k`` up to ``kmax``).

    The GradTopK tables cost O(n kmax) per row and are built once, on first use; so are the
    steps of a sequential definition (step ``j`` does not depend on ``k``). :meth:`reference`
    remembers each reference's result per ``k``, for methods judged against the same one.
    """

    def __init__(self, z: FloatArray, kmax: int) -> None:
        self.z = z
        self.kmax = max(int(kmax), 1)
        self._esp: Esp | None = None
        self._steps: dict[object, list[LongArray]] = {}
        self._results: dict[tuple[object, int], tuple[FloatArray, BoolArray]] = {}

    def reference(self, fn: ReferenceFn, k: int) -> tuple[FloatArray, BoolArray]:
        """``fn(z, k, self)``, computed once per ``(fn, k)`` (the arrays are shared: read only)."""
        key = (fn, int(k))
        if key not in self._results:
            self._results[key] = fn(self.z, k, self)
        return self._results[key]

    def steps(self, definition: Definition, zl: LongArray) -> list[LongArray]:
        """The ``kmax`` steps of ``definition`` on ``zl`` (this context's ``z`` in extended
        precision), computed once: the first ``k`` of them are the steps for ``k``."""
        if definition not in self._steps:
            self._steps[definition] = definition(zl, self.kmax)
        return self._steps[definition]

    def esp(self) -> Esp:
        """Log-space tables of ``exp(z)`` up to degree ``kmax`` (forward table: the positions
        every ``k <= kmax`` reads)."""
        if self._esp is None:
            self._esp = esp_tables(self.z, self.kmax)
        return self._esp


ReferenceFn = Callable[[FloatArray, int, ReferenceContext], tuple[FloatArray, BoolArray]]


def grad_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """GradTopK by an exact forward/backward program in extended precision (every row trusted):
    within float64 rounding of the exact weights on adversarial rows (tests, against mpmath)."""
    tab = ctx.esp() if ctx.z is z and k <= ctx.kmax else esp_tables(z, k)
    return esp_weights(tab, k), np.ones(z.shape[0], dtype=bool)


# ---------------------------------------------------------------------------------------------
# threshold operators: bisection on lambda


_BISECTIONS: dict[Callable[[FloatArray], FloatArray], ReferenceFn] = {}


def threshold_bisection(f: Callable[[FloatArray], FloatArray]) -> ReferenceFn:
    """Reference of ``p = f(z - lambda)``, ``sum p = k``, by bisection on lambda.

    The same ``f`` gives the same function (methods judged against it share its results).

    A row stops as soon as the float64 total at the midpoint is exactly ``k`` (``lambda`` is that
    midpoint, its weights sum to ``k``); otherwise when the bracket is two adjacent floats ``lo <
    hi`` with ``sum f(z - lo) > k >= sum f(z - hi)`` (``lambda = (lo + hi) / 2``). At large
    spreads the k largest ``f`` round to 1 and the rest to almost 0, so the float64 total is
    exactly ``k`` over a wide range of lambda: every point of it is an equally good answer, and
    the edge of the range is set by rounding alone. ``f`` is evaluated only on the rows still
    moving (a row's total does not depend on the other rows).

    ``f`` must be elementwise, nondecreasing with ``f(t) ~ 1`` for ``t >= 40`` and ``n f(-log n - 1)
    < 1`` (true of exp, sigmoid, the Laplace CDF and clipped powers). Rows are trusted where
    float64 resolves lambda to 1e-11 (|lambda| below ~1e4), since ``f(z_i - lambda)`` cannot be
    more accurate than the spacing of floats there.
    """

    def reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
        n = z.shape[1]
        if k == n:
            return np.ones_like(z), np.ones(z.shape[0], dtype=bool)
        lo = np.min(np.where(np.isfinite(z), z, np.inf), axis=-1) - math.log(n) - 40.0  # sum f > k
        hi = np.max(z, axis=-1) + math.log(n) + 1.0  # sum f < 1 <= k
        lam = 0.5 * (lo + hi)
        p = np.empty_like(z)
        hit = np.zeros(z.shape[0], dtype=bool)  # rows whose weights were kept from an exact total
        rows, zr = np.arange(z.shape[0]), z  # the rows still moving
        for _ in range(2200):  # a row stops within ~64 halvings (adjacent floats) or earlier
            mid = 0.5 * (lo + hi)
            moving = (mid > lo) & (mid < hi)
            if not moving.all():
                lam[rows[~moving]] = mid[~moving]  # the midpoint of two adjacent floats
                rows, zr, lo, hi, mid = rows[moving], zr[moving], lo[moving], hi[moving], mid[moving]
            if rows.size == 0:
                break
            v = f(zr - mid[:, None])
            total = np.sum(v, axis=-1)
            exact = total == k
            if exact.any():
                done = rows[exact]
                lam[done], p[done], hit[done] = mid[exact], v[exact], True
                rest = ~exact
                rows, zr, lo, hi, mid, total = rows[rest], zr[rest], lo[rest], hi[rest], mid[rest], total[rest]
            above = total > k
            lo = np.where(above, mid, lo)
            hi = np.where(above, hi, mid)
        else:  # the cap (never reached on finite brackets): as far as the brackets got
            lam[rows] = 0.5 * (lo + hi)
        rest = np.flatnonzero(~hit)
        p[rest] = f(z[rest] - lam[rest, None])
        return p, np.spacing(np.abs(lam)) <= 1e-11

    return _BISECTIONS.setdefault(f, reference)


def f_exp(t: FloatArray) -> FloatArray:
    """``min(1, e^t)``."""
    return exp_new(np.minimum(t, 0.0))


def f_sigmoid(t: FloatArray) -> FloatArray:
    """The logistic sigmoid, without overflow."""
    e = exp_new(np.copysign(t, -1.0))  # e^{-|t|}
    d = e + 1.0
    return np.where(t >= 0, 1.0 / d, np.divide(e, d, out=e))


def f_laplace(t: FloatArray) -> FloatArray:
    """The Laplace CDF ``1 - e^{-t}/2`` (t >= 0), ``e^t/2`` (t < 0)."""
    half = exp_new(np.copysign(t, -1.0))  # e^{-|t|}
    half *= 0.5
    return np.where(t >= 0, 1.0 - half, half)


# ---------------------------------------------------------------------------------------------
# sequential operators: the definition in extended precision

#: A definition on ``np.longdouble`` rows ``(B, n)`` (max 0, masked -inf) and ``k``: returns the
#: weights after each of the k steps, one array per step.
Definition = Callable[[LongArray, int], list[LongArray]]


def extended_precision(definition: Definition) -> ReferenceFn:
    """Reference running ``definition`` in ``np.longdouble``; rows trusted where ``1 - p`` stays above 1e-6.

    ``1 - p`` near 0 amplifies rounding errors of the extended type too, so such rows (and rows
    that became NaN) are not used to judge the method.
    """

    def reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
        zl = z.astype(np.longdouble)
        trusted = np.ones(z.shape[0], dtype=bool)
        with np.errstate(invalid="ignore", over="ignore"):  # rows that saturate become NaN: untrusted
            shared = ctx.z is z and k <= ctx.kmax
            steps = ctx.steps(definition, zl)[:k] if shared else definition(zl, k)
            for p in steps:
                trusted &= np.min(np.abs(1 - p), axis=-1) > 1e-6
            p = steps[-1]
            return p.astype(np.float64), trusted & np.isfinite(p).all(axis=-1)

    return reference


def iterative_definition(zl: LongArray, k: int) -> list[LongArray]:
    """Su's soft-k-max: ``z <- z - min z``; k times ``p <- p + softmax((1 - p) z)``."""
    d = zl - np.min(zl, axis=-1, keepdims=True)
    p = np.zeros_like(zl)
    out = []
    for _ in range(k):
        a = (1 - p) * d
        e = np.exp(a - np.max(a, axis=-1, keepdims=True))
        p = p + e / np.sum(e, axis=-1, keepdims=True)
        out.append(p)
    return out


def weighted_softmax_definition(zl: LongArray, k: int) -> list[LongArray]:
    """k times ``w = 1 - p``, ``p <- p + w e^z / sum(w e^z)``."""
    e = np.exp(zl)  # z <= 0: no overflow
    p = np.zeros_like(zl)
    out = []
    for _ in range(k):
        w = (1 - p) * e
        p = p + w / np.sum(w, axis=-1, keepdims=True)
        out.append(p)
    return out
