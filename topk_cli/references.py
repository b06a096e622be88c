"""Independent references of the operators, computed another way than the operators themselves.

``stability-probe`` measures each method against the reference its registry entry names
(:attr:`topk_cli.registry.MethodSpec.probe`). A reference is a function
``reference(z, k, ctx) -> (weights, trusted)`` on a prepared ``(B, n)`` batch ``z`` (see
``topk_cli.operators._base``): ``weights`` ``(B, n)`` and the rows where the reference itself is
accurate enough to judge the method. ``ctx`` (:class:`ReferenceContext`) shares work between
references on the same batch (the log-space tables of GradTopK serve every ``k``).

The builders here are generic: :func:`threshold_bisection` (any ``p = f(z - lambda)``),
:func:`extended_precision` (a definition run in ``np.longdouble``) and :func:`grad_reference`
(an exact log-space program, independent of ``topk_cli.operators.gradtopk``).

Axis convention: the last axis holds the ``n`` scores; leading axes are a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray
from topk_cli.operators._logspace import logsumexp

LongArray = NDArray[np.longdouble]
BoolArray = NDArray[np.bool_]


# ---------------------------------------------------------------------------------------------
# exact log-space program for GradTopK at every level


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


def esp_tables(z: FloatArray, kmax: int, prefix_len: int | None = None) -> EspTables:
    """Forward (first ``prefix_len`` positions) and backward log-space tables up to degree ``kmax``.

    ``prefix_len=None``: the positions :func:`esp_weights` reads for every ``k <= kmax`` and
    the ``2 kmax`` the recursion outlook reads."""
    order = np.argsort(-z, axis=-1, kind="stable")
    # extended precision (where the platform has it): logs of e_j reach |k * spread|, and
    # differences of such logs lose their magnitude's worth of float64 digits
    s = np.take_along_axis(z, order, axis=-1).astype(np.longdouble)
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


def esp_weights(tab: EspTables, k: int) -> FloatArray:
    """GradTopK ``p_i = w_i e_{k-1}(w_-i) / e_k(w)`` from the tables (degree >= k, forward table
    over at least ``weights_len(tab.s, k)`` positions, as ``esp_tables(z, kmax)`` builds it)."""
    if k in tab.memo:
        return tab.memo[k]
    rows, n = tab.s.shape
    if k == n:
        return tab.memo.setdefault(k, np.ones((rows, n)))
    m = weights_len(tab.s, k)
    if tab.prefix.shape[0] <= m:
        raise InvalidArgumentError(f"the forward table covers {tab.prefix.shape[0] - 1} positions, k={k} needs {m}")
    # log e_{k-1}(w without i), i < m: (m, B), from the terms log e_j(before i) + log e_{k-1-j}(after i)
    terms = cast(FloatArray, tab.prefix[:m, :, :k] + tab.suffix[1 : m + 1, :, k - 1 :: -1])  # longdouble: logsumexp is dtype-generic
    loo = logsumexp(terms, axis=-1, buf=terms)
    p_sorted = np.zeros((rows, n))  # the weights of positions >= m round to 0
    with np.errstate(invalid="ignore"):  # masked entries: -inf + finite is -inf, exp gives 0
        p_sorted[:, :m] = np.exp(tab.s[:, :m] + loo.T - tab.total[:, k, None])
    p = np.empty_like(p_sorted)
    np.put_along_axis(p, tab.order, np.minimum(p_sorted, 1.0), axis=-1)
    return tab.memo.setdefault(k, p)


class ReferenceContext:
    """Work shared by the references evaluated on one batch ``z`` (every ``k`` up to ``kmax``).

    The GradTopK tables cost O(n kmax) per row and are built once, on first use; so are the
    steps of a sequential definition (step ``j`` does not depend on ``k``). :meth:`reference`
    remembers each reference's result per ``k``, for methods judged against the same one.
    """

    def __init__(self, z: FloatArray, kmax: int) -> None:
        self.z = z
        self.kmax = max(int(kmax), 1)
        self._esp: EspTables | None = None
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

    def esp(self) -> EspTables:
        """Log-space tables of ``exp(z)`` up to degree ``kmax`` (forward table: the positions
        every ``k <= kmax`` reads)."""
        if self._esp is None:
            self._esp = esp_tables(self.z, self.kmax)
        return self._esp


ReferenceFn = Callable[[FloatArray, int, ReferenceContext], tuple[FloatArray, BoolArray]]


def grad_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """GradTopK by an exact log-space forward/backward program in extended precision (every row trusted)."""
    tab = ctx.esp() if ctx.z is z and k <= ctx.kmax else esp_tables(z, k)
    return esp_weights(tab, k), np.ones(z.shape[0], dtype=bool)


# ---------------------------------------------------------------------------------------------
# threshold operators: bisection on lambda


_BISECTIONS: dict[Callable[[FloatArray], FloatArray], ReferenceFn] = {}


def threshold_bisection(f: Callable[[FloatArray], FloatArray]) -> ReferenceFn:
    """Reference of ``p = f(z - lambda)``, ``sum p = k``, by bisection on lambda until the bracket stalls.

    The same ``f`` gives the same function (methods judged against it share its results).

    ``f`` must be nondecreasing with ``f(t) ~ 1`` for ``t >= 40`` and ``n f(-log n - 1) < 1``
    (true of exp, sigmoid, the Laplace CDF and clipped powers). Rows are trusted where float64
    resolves lambda to 1e-11 (|lambda| below ~1e4), since ``f(z_i - lambda)`` cannot be more
    accurate than the spacing of floats there.
    """

    def reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
        n = z.shape[1]
        if k == n:
            return np.ones_like(z), np.ones(z.shape[0], dtype=bool)
        lo = np.min(np.where(np.isfinite(z), z, np.inf), axis=-1) - math.log(n) - 40.0  # sum f > k
        hi = np.max(z, axis=-1) + math.log(n) + 1.0  # sum f < 1 <= k
        for _ in range(2200):  # stops when every bracket is two adjacent floats (~64 halvings)
            mid = 0.5 * (lo + hi)
            moving = (mid > lo) & (mid < hi)
            if not moving.any():
                break
            total = np.sum(f(z - mid[:, None]), axis=-1)
            above = total > k
            lo = np.where(moving & above, mid, lo)
            hi = np.where(moving & ~above, mid, hi)
        lam = 0.5 * (lo + hi)
        return f(z - lam[:, None]), np.spacing(np.abs(lam)) <= 1e-11

    return _BISECTIONS.setdefault(f, reference)


def f_exp(t: FloatArray) -> FloatArray:
    """``min(1, e^t)``."""
    return np.exp(np.minimum(t, 0.0))


def f_sigmoid(t: FloatArray) -> FloatArray:
    """The logistic sigmoid, without overflow."""
    e = np.exp(-np.abs(t))
    return np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def f_laplace(t: FloatArray) -> FloatArray:
    """The Laplace CDF ``1 - e^{-t}/2`` (t >= 0), ``e^t/2`` (t < 0)."""
    half = 0.5 * np.exp(-np.abs(t))
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
