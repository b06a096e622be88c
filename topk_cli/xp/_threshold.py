"""The threshold operators ``p_i = f(z_i - lambda)``, ``sum p = k``, on any array-API namespace.

``z = (x - max x) / tau`` row by row, sorted once; ``lambda`` is found in two stages, both with
iteration counts fixed by the shapes (so ``jax.jit`` traces them):

1. the interval between consecutive breakpoints of ``f`` (entries ``z_j``, and ``z_j - 1`` for the
   clipped links) that holds ``lambda``: ``G(lambda) = sum_i f(z_i - lambda)`` decreases, so it is
   the number of breakpoints where ``G < k``; for ``exp`` and ``laplace`` (and ``sigmoid``'s start)
   ``G`` at every entry comes from two cumulative sums (:func:`_branch_count`: one ``exp`` pass),
   for the clipped links from a binary search over the sorted breakpoints
   (``ceil(log2(#breakpoints + 1))`` evaluations of ``G``);
2. ``lambda`` on that interval: closed forms for ``exp`` (the smallest of the branch roots
   ``lambda_m`` of the branches next to the interval: ``lambda = min_m lambda_m`` since
   ``f = min(1, e^t)``) and ``laplace`` (the root of the interval's branch), the
   linear root for ``clip``, Newton for ``cube`` (on ``(sum_F (z_i - lambda)^3)^{1/3}``, convex on the
   interval, from its left end) and for ``sigmoid`` (from the ``laplace`` threshold, within ``log 2``
   of it, with a residual split by sides so that it keeps its digits where every ``f'`` underflows).

Every ``t = z - lambda`` is formed relative to an entry near ``lambda`` (``t = (z - z_r) + shift``),
so it keeps full precision at large ``|z|``. The VJP (implicit function theorem) uses ``d = f'(t)``:
``g_z = d (g - w . g)``, ``g_k = w . g`` with ``w = dp/dk = d / sum d`` computed as ``d / max d``
normalised, ``d / max d`` from the same ``exp`` pass as ``p`` and ``d`` (finite where every ``d``
underflows), ``g_x = g_z / tau`` and
``g_tau = -(g_z . z) / tau``. Rows with ``k = #unmasked`` (every weight 1) have ``d = 0`` and the
one-sided ``dp/dk`` from below of the numpy engine (:func:`topk_cli.operators.threshold.threshold_dk`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from topk_cli.xp._common import (
    Array,
    branch,
    count,
    decides_cheaply,
    index_dtype,
    positions,
    search,
    set_entries,
    sort_descending,
    take,
    top_entries,
)

_LN2 = math.log(2.0)


#: The limit of ``dp/dk`` on rows with ``k = #unmasked`` (every weight 1), as the numpy engine's
#: :func:`topk_cli.operators.threshold.threshold_dk`: ``"lowest"`` (uniform over the smallest
#: entries) or ``"softmin"`` (``e^{-z}`` normalised).
FULL: dict[str, str] = {
    "thre-exp": "lowest",
    "thre-laplace": "softmin",
    "thre-sigmoid": "softmin",
    "thre-clip": "lowest",
    "thre-cube": "lowest",
}


def _neg_inf(xp: Any, t: Array) -> Array:
    return xp.full_like(t, -math.inf)


def _step(xp: Any, t: Array) -> Array:
    """``1.0`` where ``t > 0`` (``+inf`` included), ``0.0`` where ``t <= 0``: a float mask from cheap
    elementwise operations (comparisons, ``sign`` and ``where`` cost several times more per element
    in PyTorch on CPU, and the weights are a handful of passes over the batch). ``t`` is multiplied
    twice by the largest float, so that the smallest positive (subnormal) ``t`` reaches 1, each
    product of a number at most 1 (nothing overflows) and a minimum between them (a compiler may
    not fold the two into one product by ``inf``). Under XLA on CPU subnormals are flushed to 0.
    Not for ties: ``t`` must be computed as compared (see :func:`_rows`)."""
    big = float(xp.finfo(t.dtype).max)
    return xp.clip(xp.minimum(xp.clip(t, 0.0, 1.0) * big, 1.0) * big, 0.0, 1.0)


def _below(xp: Any, t: Array) -> Array:
    """``1.0`` where ``t < 0`` (``-inf`` included), ``0.0`` where ``t >= 0``."""
    return _step(xp, -t)


@dataclass
class _Rows:
    """What every solver needs of the batch: the ``M`` largest ``z`` sorted descending (``s``; the
    whole row, ``M = n``, unless a prefix is asked for) and ``sum_{i > M - 1} e^{s_i - s_{M-1}}`` over
    the entries left out (``tail``, 0 when ``M = n``), counts, ``k``."""

    xp: Any
    z: Array  # (B, n), -inf masked
    fin: Array  # (B, n) bool
    s: Array  # (B, M) the M largest z, sorted descending (masked last)
    tail: Array  # (B,) float: the left-out entries' e^{z - s_{M-1}} summed (each term <= 1)
    nfin: Array  # (B,) index dtype: unmasked entries
    last: Array  # (B,) index dtype: min(#unmasked, M) - 1 (>= 0), the smallest unmasked entry of s
    k: Array  # (B,) float
    pos: Array  # (1, M) index positions
    #: (B,) bool, for a clipped link's prefix: whether s holds every entry its threshold reads
    #: (``None``: s always does)
    complete: Array | None = None


#: thre-clip and thre-cube: the partial selection's size, in multiples of ``ceil(k_max)`` (see
#: :func:`prefix_size`).
CLIPPED_PREFIX = 16

#: The clipped links.
CLIPPED = ("thre-clip", "thre-cube")


def prefix_size(method: str, k_max: float | None, n: int) -> int | None:
    """How many of the largest entries a row's threshold depends on individually, when every row's
    ``k <= k_max``; ``None`` where that is the whole row (or a prefix would not be cheaper).

    The others enter only through ``sum e^{z_i}`` (:attr:`_Rows.tail`): for ``thre-exp`` fewer than k
    entries saturate, and the branch search and roots read ``s_0 .. s_{ceil(k)-1}``; for
    ``thre-laplace`` (and the start of ``thre-sigmoid``'s Newton, which then runs over every entry)
    an entry above the threshold weighs more than 1/2, so at most ``2k`` are, and
    ``G(s_j) >= (j + 1) / 2 > k + 1/2`` at ``j = floor(2k) + 1``: the branch is found among the first
    ``floor(2k) + 2`` with a margin rounding cannot cross. ``thre-sigmoid`` takes ``floor(4k) + 2``:
    its Newton sums the entries above each trial threshold on the prefix (see :func:`solve_sigmoid`).

    The clipped links' threshold lies in ``[s_{c-1} - 1, s_{c-1})`` (``c = ceil(k)``: the c largest
    saturate at ``s_{c-1} - 1``, so ``G >= c >= k`` there), so an entry at most ``s_{c-1} - 1`` has
    weight and derivative 0 and its breakpoints lie below the interval's: how many entries matter
    depends on the values. They select :data:`CLIPPED_PREFIX` ``ceil(k_max)`` entries and the caller
    checks that the prefix holds every entry that matters (:attr:`_Rows.complete`), else sorts.
    """
    if k_max is None:
        return None
    if method == "thre-exp":
        m = math.ceil(k_max)
    elif method == "thre-laplace":
        m = math.floor(2 * k_max) + 2
    elif method == "thre-sigmoid":
        # the Newton's trial thresholds stay within log 2 below the Laplace one, where an entry
        # above weighs at least F(-log 2) = 1/4 under the Laplace CDF: at most 4k of them
        m = math.floor(4 * k_max) + 2
    elif method in CLIPPED:
        m = CLIPPED_PREFIX * math.ceil(k_max)
    else:
        return None
    # a partial selection of m is cheaper than a full sort while m is a small part of the row
    return m if 4 * m <= n else None


def _rows(xp: Any, z: Array, fin: Array, k: Array, prefix: int | None = None, clipped: bool = False) -> _Rows:
    idx = index_dtype(xp, z)
    n = z.shape[1]
    nfin = count(xp, fin, idx)
    complete = None
    if prefix is None or prefix >= n:
        s = sort_descending(xp, z)
        tail = xp.zeros_like(z[:, 0])
    elif clipped:
        s, _ = top_entries(xp, z, prefix)
        tail = xp.zeros_like(z[:, 0])
        # every entry that matters is in s: the row has at most M unmasked entries, or
        # s_{M-1} < s_{c-1} - 1 (see prefix_size)
        c = xp.clip(xp.astype(xp.ceil(k), idx) - 1, 0, prefix - 1)
        complete = (nfin <= prefix) | (s[:, -1] < take(xp, s, c) - 1)
        nfin = xp.minimum(nfin, xp.full_like(nfin, prefix))  # the breakpoints searched: those in s
    else:
        s, _ = top_entries(xp, z, prefix)
        held = xp.isfinite(s[:, -1])  # else the row has fewer than M unmasked entries, all in s: tail 0
        low = xp.where(held, s[:, -1], xp.zeros_like(s[:, -1]))
        # the left-out entries: those below s_{M-1}, and the entries equal to it that the selection
        # left out (a tie at the M-th value), each e^0 = 1. Every entry above s_{M-1} is in s, so
        # sum_i e^{min(z_i - s_{M-1}, 0)} over the whole row is M plus the left-out entries' sum:
        # one exp pass and no mask (the difference carries an absolute rounding of about M eps,
        # against terms that are compared with 1 or added to sums of at least 1). Not by writing
        # -inf over the selected positions: XLA on CPU fuses such a scatter into the exp pass and
        # runs it thirty times slower. (Under XLA a tied entry's z - s_{M-1} may come out of a
        # fused multiply-add as -1 ulp instead of 0: its term is then 1 - 1 ulp, a rounding.)
        total = xp.sum(xp.exp(xp.minimum(z - low[:, None], 0.0)), axis=1)
        tail = xp.where(held, xp.maximum(total - float(prefix), xp.zeros_like(total)), xp.zeros_like(total))
    m = s.shape[1]
    last = xp.clip(xp.minimum(nfin, xp.full_like(nfin, m)) - 1, 0, m - 1)
    return _Rows(xp, z, fin, s, tail, nfin, last, k, positions(xp, z, m), complete)


def _tail_at(r: _Rows, ref: Array) -> Array:
    """``sum`` over the left-out entries of ``e^{z_i - ref}`` (``ref >= s_{M-1}``: 0 when none is left out)."""
    xp = r.xp
    gap = xp.minimum(r.s[:, -1] - ref, xp.zeros_like(ref))  # -inf where s_{M-1} is masked (tail 0)
    return r.tail * xp.exp(gap)


def _as_float(xp: Any, a: Array, like: Array) -> Array:
    return xp.astype(a, like.dtype)


def _exclusive_cumsum(xp: Any, a: Array, reverse: bool) -> Array:
    """``sum_{i < j} a_i`` (or ``sum_{i > j} a_i`` with ``reverse``) for every position ``j`` of a row."""
    if reverse:
        inc = xp.flip(xp.cumulative_sum(xp.flip(a, axis=1), axis=1), axis=1)
    else:
        inc = xp.cumulative_sum(a, axis=1)
    # the inclusive sum less the own term: where that term dominates, the difference keeps its
    # absolute accuracy (eps times the term), all that G(s_j) = j + ... + (difference) / term needs
    return inc - a


def _branch_count(r: _Rows, laplace: bool) -> Array:
    """``j* = #{j : G(s_j) < k}`` for ``thre-exp`` (``laplace=False``) or ``thre-laplace``, every ``j``
    at once from two cumulative sums (no search): with ``X_j = sum_{i<j} e^{s_j - s_i}`` and
    ``Y_j = sum_{i>j} e^{s_i - s_j}``, ``G(s_j) = j + 1 + Y_j`` (exp) or ``j + 1/2 - X_j/2 + Y_j/2``
    (laplace).

    The sums are taken relative to the ``ceil(k)``-th largest entry ``r`` (``u = s - r``), their
    exponents clipped to ``[-2V, 2V]`` with ``n e^{3V}`` below the largest float, so nothing
    overflows. Entries with ``|u_j| <= V`` get ``G(s_j)`` to rounding (a clipped term is below
    ``e^-V`` of it); the others are decided by bounds: ``u_j > V`` (``j`` under ``ceil(k) - 1``) gives
    ``G(s_j) <= ceil(k) - 1/2 + n e^-V < k`` and ``u_j < -V`` gives ``G(s_j) >= ceil(k) + 1/2 > k``.
    Where ``G(s_j)`` is within rounding of ``k`` (a threshold on an entry, ties) ``j*`` may be off by
    one or more inside a tie: the callers' branch formulas are exact there (see them).
    """
    xp = r.xp
    s = r.s
    n = s.shape[1]
    idx = r.nfin.dtype
    zero_i = xp.zeros_like(r.nfin)
    c = xp.clip(xp.astype(xp.ceil(r.k), idx) - 1, zero_i, r.last)
    ref = take(xp, s, c)
    big = (math.log(float(xp.finfo(s.dtype).max)) - math.log(max(n, 1)) - 1.0) / 3.0
    u = s - ref[:, None]  # -inf on masked entries (the last positions)
    # one exp pass: e^{u} and, where it matters (|u| <= V), e^{-u} = 1 / e^{u}
    e = xp.exp(xp.minimum(u, 2 * big))  # 0 on masked entries
    em = xp.clip(e, math.exp(-big), math.exp(big))  # the factor e^{u_j} (clipped: <= n e^{3V} in all)
    # the left-out entries (all below s_{M-1} <= ref) add sum e^{z_i - ref} to every Y_j's numerator
    y = (_exclusive_cumsum(xp, e, True) + _tail_at(r, ref)[:, None]) / em
    j = _as_float(xp, r.pos, s)
    kk = r.k[:, None]
    if laplace:
        # 1 / e^{u} clipped; a masked position (u = -inf) follows every unmasked one, so it enters
        # no prefix sum that is read
        x = _exclusive_cumsum(xp, 1 / xp.maximum(e, math.exp(-2 * big)), False) * em
        below = (u > big) | ((u >= -big) & ((j + 0.5) + (y - x) / 2 < kk))
    else:
        # u_j < -V: j > ceil(k) - 1 and G(s_j) >= j + 1 > k, as computed (y >= 0); masked
        # positions j >= #unmasked: j + 1 > k likewise
        below = (u > big) | ((j + 1) + y < kk)
    return count(xp, below, idx)


def _below_sum(r: _Rows, m: Array, ref: Array) -> Array:
    """``sum_{i > m} exp(s_i - ref)`` per row (sorted positions after ``m``, the left-out entries
    included; terms at most 1 when ``ref = s_m``)."""
    xp = r.xp
    after = r.pos > m[:, None]
    return xp.sum(xp.exp(xp.where(after, r.s - ref[:, None], _neg_inf(xp, r.s))), axis=1) + _tail_at(r, ref)


def _laplace_branch(r: _Rows, m: Array) -> tuple[Array, Array]:
    """``(ref, delta)`` of the Laplace branch with ``m`` entries above ``lambda`` (``0 <= m <= #unmasked``).

    With ``A = sum_{i<m} e^{-s_i}``, ``C = sum_{i>=m} e^{s_i}``, ``K = k - m`` and ``u = e^lambda``:
    ``A u^2 + 2 K u - C = 0``, solved without cancellation relative to ``s_{m-1}`` (``K <= 0``) or
    ``s_m`` (``K > 0``), as the numpy engine does.
    """
    xp = r.xp
    zero = xp.zeros_like(m)
    last = r.last
    has_above = m > 0
    has_below = m < r.nfin
    s_hi = take(xp, r.s, xp.clip(m - 1, zero, last))  # s_{m-1}, the smallest entry above
    s_lo = take(xp, r.s, xp.clip(m, zero, last))  # s_m, the largest entry below
    ninf = xp.full_like(s_hi, -math.inf)
    # log(A e^{s_{m-1}}) and log(C e^{-s_m}), each a log-sum whose first term is exactly 1; the
    # other terms, e^{s_{m-1} - s_i} above and e^{s_i - s_m} below (each <= 1), from one exp pass
    before = r.pos < (m - 1)[:, None]
    after = r.pos > m[:, None]
    v = xp.where(before, s_hi[:, None] - r.s, xp.where(after, r.s - s_lo[:, None], _neg_inf(xp, r.s)))
    e = xp.exp(v)
    above = xp.sum(e * xp.astype(before, e.dtype), axis=1)
    below = xp.sum(e * xp.astype(after, e.dtype), axis=1) + _tail_at(r, s_lo)
    la = xp.where(has_above, xp.log1p(above), ninf)
    lc = xp.where(has_below, xp.log1p(below), ninf)
    both = has_above & has_below
    gap = xp.where(both, s_lo - s_hi, ninf)
    log_ac = xp.where(both, gap + xp.where(both, la + lc, xp.zeros_like(la)), ninf)
    kk = r.k - _as_float(xp, m, r.k)
    root = xp.sqrt(kk * kk + xp.exp(log_ac))
    pos_k = kk > 0
    neg_k = kk < 0
    one = xp.ones_like(kk)
    d_pos = lc - xp.log(xp.where(pos_k, kk + root, one))
    d_neg = xp.log(xp.where(neg_k, root - kk, one)) - la
    d_zero = xp.where(both, gap + xp.where(both, lc - la, xp.zeros_like(la)), ninf) / 2
    ref = xp.where(pos_k, s_lo, s_hi)
    delta = xp.where(pos_k, d_pos, xp.where(neg_k, d_neg, d_zero))
    return ref, delta


def _full_rows(r: _Rows) -> Array:
    return r.k >= _as_float(r.xp, r.nfin, r.k)


def solve_exp(r: _Rows) -> tuple[Array, Array]:
    """``(ref, shift)`` with ``t = (z - ref) + shift`` for ``thre-exp``: ``lambda = min_m lambda_m`` over
    the branches ``m = j* - 1, j*, j* + 1`` next to :func:`_branch_count`'s ``j*`` (exact when the true
    branch is among them: ``lambda_m >= lambda`` for every ``m < k``), from one pass: with
    ``R_m = sum_{i>m} e^{s_i - s_m}``, ``R_{m-1} = e^{s_m - s_{m-1}} (1 + R_m)`` (positive terms only)."""
    xp = r.xp
    j = _branch_count(r, laplace=False)
    zero = xp.zeros_like(j)
    kk = xp.astype(xp.ceil(r.k), r.nfin.dtype)
    high = xp.minimum(xp.maximum(xp.minimum(r.nfin, kk) - 1, zero), r.last)  # fewer than k saturate
    b = xp.clip(j + 1, zero, high)
    s_b = take(xp, r.s, b)
    rest = _below_sum(r, b, s_b)
    best_ref, best_delta = s_b, xp.log1p(rest) - xp.log(r.k - _as_float(xp, b, r.k))
    m, s_m = b, s_b
    for _ in range(2):
        up = m > 0
        m = xp.where(up, m - 1, m)
        s_up = take(xp, r.s, m)
        rest = xp.where(up, xp.exp(s_m - s_up) * (1 + rest), rest)
        s_m = s_up
        delta = xp.log1p(rest) - xp.log(r.k - _as_float(xp, m, r.k))
        better = (s_m + delta) < (best_ref + best_delta)
        best_ref = xp.where(better, s_m, best_ref)
        best_delta = xp.where(better, delta, best_delta)
    return best_ref, -best_delta


def solve_laplace(r: _Rows) -> tuple[Array, Array]:
    """``(ref, shift)`` with ``t = (z - ref) + shift`` for ``thre-laplace`` (rows with ``k = #unmasked``
    get a finite placeholder: the caller overwrites them)."""
    xp = r.xp
    # the branch of the count's interval: the Laplace CDF is C1, so where rounding at a
    # breakpoint picks a neighbouring branch (within a tie: any of the tied), the roots agree to
    # second order
    j = _branch_count(r, laplace=True)
    ref, delta = _laplace_branch(r, xp.clip(j, xp.zeros_like(j), xp.minimum(r.nfin, r.last + 1)))
    full = _full_rows(r)
    ok = xp.isfinite(ref + delta) & ~full
    return xp.where(ok, ref, xp.zeros_like(ref)), xp.where(ok, -delta, xp.zeros_like(delta))


#: Newton steps of ``thre-sigmoid`` from the ``thre-laplace`` threshold (within ``log 2`` of the
#: root): quadratic convergence reaches float64's resolution in 5 on the adversarial suite of
#: tests/test_xp_core.py (4 leave 2e-10); one more is a margin (a converged step changes nothing).
#: In float32 4 (2e-10 is far below its resolution, 6e-8).
SIGMOID_STEPS = 6
SIGMOID_STEPS_FLOAT32 = 4
#: Newton steps of ``thre-cube`` on its interval, from the left end, on the convex
#: ``(sum_F (z_i - lambda)^3)^{1/3}``: monotone, exact in one step when the free entries tie.
CUBE_STEPS = 12


def solve_sigmoid(r: _Rows) -> tuple[Array, Array]:
    """``(ref, shift)`` for ``thre-sigmoid``: safeguarded Newton from the Laplace threshold.

    ``e^t/2 <= sigmoid(t + log 2)`` and ``sigmoid(t - log 2) <= F(t)`` for the Laplace CDF ``F``
    give the bracket ``lambda_F +- log 2``. The residual ``G - k`` is summed by sides,
    ``sum_{t <= 0} sigmoid(t) - sum_{t > 0} sigmoid(-t) - (k - #{t > 0})``, so that it keeps its digits
    relative to ``sum f'`` where the weights are within an ulp of 0 and 1; a step that is not
    finite (every ``f'`` underflows: then the Laplace root is the sigmoid's to the last digit,
    both balancing ``sum e^{t}`` below against ``sum e^{-t}`` above) keeps the iterate.

    One exp pass for the whole solve (as the numpy engine): with ``x = z - lambda_F`` and
    ``E = e^{-|x|}``, an entry is ``(A, B) = (1, E)`` where ``x >= 0`` and ``(E, 1)`` below, and at
    ``lambda = lambda_F + delta`` (``u = e^delta``) ``min(p, q) = min(A, u B) / (A + u B)``, ``p >= 1/2``
    where ``A >= u B`` (``x >= delta``): every step costs products and divisions of numbers in ``[0, 2]``.
    """
    xp = r.xp
    ref, shift = solve_laplace(r)

    def sides(v: Array) -> tuple[Array, Array, Array]:
        """``(x, A, B)`` of entries ``v``: ``x = v - lambda_F`` (-inf masked), and ``(A, B) = (1, E)``
        where ``x >= 0``, ``(E, 1)`` below, ``E = e^{-|x|}`` (a side misread at |x| of an ulp changes
        E by an ulp): ``A = max(E, [x >= 0])``, ``B = max(E, [x < 0])``."""
        x = (v - ref[:, None]) + shift[:, None]
        e = xp.exp(-xp.abs(x))  # 0 on masked entries
        pos = xp.astype(x >= 0, x.dtype)
        return x, xp.maximum(e, pos), xp.maximum(e, 1 - pos)

    _, big_a, big_b = sides(r.z)  # every entry, in any order
    # the entries above a trial threshold (p >= 1/2) are among the prefix s: trial thresholds stay
    # within log 2 below lambda_F (the bracket), where at most 4k entries are above (prefix_size)
    x_s, a_s, b_s = sides(r.s)
    delta0 = -shift
    delta = delta0
    lo = delta - _LN2
    hi = delta + _LN2
    steps = SIGMOID_STEPS if big_a.dtype == xp.float64 else SIGMOID_STEPS_FLOAT32
    for _ in range(steps):
        u = xp.exp(delta - delta0)[:, None]
        ub = u * big_b
        w = xp.minimum(big_a, ub) / (big_a + ub)  # min(p, q); 0 on masked entries
        total = xp.sum(w, axis=1)
        # p >= 1/2, i.e. A >= u B, is x >= delta - delta0 (to rounding, where w is 1/2 either way and
        # the side it is counted on changes nothing): one comparison with a per-row value, on s
        above = xp.astype(x_s >= (delta - delta0)[:, None], x_s.dtype)  # masked entries: -inf, below
        ub_s = u * b_s
        w_up = xp.sum(xp.minimum(a_s, ub_s) / (a_s + ub_s) * above, axis=1)
        res = (total - w_up) - w_up - (r.k - xp.sum(above, axis=1))
        slope = total - xp.sum(w * w, axis=1)  # sum p q = sum w (1 - w)
        lo = xp.where(res > 0, delta, lo)
        hi = xp.where(res < 0, delta, hi)
        step = delta + res / xp.where(slope > 0, slope, xp.ones_like(slope))
        inside = (slope > 0) & (step >= lo) & (step <= hi)
        delta = xp.where(inside, step, xp.where(slope > 0, (lo + hi) / 2, delta))
    return ref, -delta


def _g_clipped(r: _Rows, ref: Array, off: Array, power: int) -> Array:
    """``G(lambda) = sum_i clip(z_i - lambda, 0, 1)^power`` at ``lambda = ref - off`` per row."""
    xp = r.xp
    c = xp.clip((r.s - ref[:, None]) + off[:, None], 0.0, 1.0)  # masked entries: 0
    return xp.sum(c if power == 1 else c * c * c, axis=1)


def _clipped_interval(r: _Rows, power: int) -> tuple[Array, Array, Array, Array, Array, Array]:
    """``(ref, off, t_lo, free, sat, flat)`` of the interval ``[lo, hi]`` of breakpoints holding
    ``lambda``: ``lo = ref - off``, ``t_lo = z - lo`` (sorted entries), ``free`` the entries with
    ``0 < z - lambda < 1`` inside it, ``sat`` those at 1; ``flat`` (per row): ``G = k`` on the whole
    interval below ``lo`` (an integer ``k`` with no entry strictly inside, e.g. a hard selection),
    where ``flat`` holds ``lambda``'s offset from ``lo`` to the middle of that interval (else 0), so
    that no entry sits on a kink (whose one-sided derivative a rounding of ``z`` would flip).

    The breakpoints are the entries ``s_j`` (``off = 0``) and ``s_j - 1`` (``off = 1``): two sorted
    sequences, each searched on its own (``G`` decreases, so ``#{j : G(b_j) < k}`` in each), the
    interval's ends then the nearest of the two sequences' candidates: no sort of the ``2n`` merged
    breakpoints."""
    xp = r.xp
    zero = xp.zeros_like(r.k)
    one = xp.ones_like(r.k)
    zero_i = xp.zeros_like(r.nfin)
    last = xp.maximum(r.nfin - 1, zero_i)
    size = r.s.shape[1]

    def count(off: Array) -> Array:
        # (the search also evaluates rows that have finished, at any j: read an unmasked entry there)
        return search(xp, r.nfin, size, lambda jj: _g_clipped(r, take(xp, r.s, xp.minimum(jj, last)), off, power) < r.k,
                      r.nfin)

    def candidate(j: Array, off: Array, missing: float) -> tuple[Array, Array]:
        """``(ref, value)`` of breakpoint ``j`` of a sequence; ``value = missing`` where ``j`` is out of range."""
        ref = take(xp, r.s, xp.clip(j, zero_i, last))
        ok = (j >= 0) & (j < r.nfin)
        return ref, xp.where(ok, ref - off, xp.full_like(ref, missing))

    j0, j1 = count(zero), count(one)
    # lo: the largest breakpoint with G >= k, of either sequence
    ref0, v0 = candidate(j0, zero, -math.inf)
    ref1, v1 = candidate(j1, one, -math.inf)
    lo_is0 = v0 >= v1
    ref_lo, off_lo = xp.where(lo_is0, ref0, ref1), xp.where(lo_is0, zero, one)
    # hi: the smallest breakpoint with G < k
    ref0, v0 = candidate(j0 - 1, zero, math.inf)
    ref1, v1 = candidate(j1 - 1, one, math.inf)
    hi_is0 = v0 <= v1
    ref_hi, off_hi = xp.where(hi_is0, ref0, ref1), xp.where(hi_is0, zero, one)
    # nx: the breakpoint after lo (the next of lo's sequence, or the other sequence's candidate)
    step0 = xp.astype(lo_is0, j0.dtype)
    ref0, v0 = candidate(j0 + step0, zero, -math.inf)
    ref1, v1 = candidate(j1 + (1 - step0), one, -math.inf)
    nx_is0 = v0 >= v1
    ref_nx, off_nx = xp.where(nx_is0, ref0, ref1), xp.where(nx_is0, zero, one)
    has_nx = xp.isfinite(xp.maximum(v0, v1))
    fin = xp.isfinite(r.s)
    t_lo = (r.s - ref_lo[:, None]) + off_lo[:, None]
    t_hi = (r.s - ref_hi[:, None]) + off_hi[:, None]
    free = fin & (t_hi >= 0) & (t_lo <= 1)
    sat = fin & (t_hi >= 1)
    g_lo = xp.sum(xp.where(fin, xp.clip(t_lo, 0.0, 1.0), xp.zeros_like(t_lo)) ** power, axis=1)
    is_flat = (g_lo == r.k) & has_nx & (_g_clipped(r, ref_nx, off_nx, power) == r.k)
    gap = xp.where(is_flat, (ref_nx - ref_lo) - (off_nx - off_lo), xp.zeros_like(ref_lo))
    return ref_lo, off_lo, t_lo, free, sat, gap / 2


def solve_clip(r: _Rows) -> tuple[Array, Array]:
    """``(ref, shift)`` for ``thre-clip``: on its interval ``G`` is linear, ``lambda = lo + (G(lo) - k) / #free``."""
    xp = r.xp
    ref, off, t_lo, free, _, flat = _clipped_interval(r, 1)
    g_lo = xp.sum(xp.where(xp.isfinite(t_lo), xp.clip(t_lo, 0.0, 1.0), xp.zeros_like(t_lo)), axis=1)
    nfree = xp.sum(xp.astype(free, t_lo.dtype), axis=1)
    delta = xp.where(nfree > 0, (g_lo - r.k) / xp.where(nfree > 0, nfree, xp.ones_like(nfree)), xp.zeros_like(nfree))
    return ref, off - (delta + flat)


def solve_cube(r: _Rows) -> tuple[Array, Array]:
    """``(ref, shift)`` for ``thre-cube``: on its interval ``G = #sat + sum_F (z_i - lambda)^3``;
    Newton on ``psi = (sum_F (z_i - lambda)^3)^{1/3} = (k - #sat)^{1/3}`` from the left end."""
    xp = r.xp
    ref, off, t_lo, free, sat, flat = _clipped_interval(r, 3)
    on = xp.astype(free, t_lo.dtype)
    u = xp.where(free, t_lo, xp.zeros_like(t_lo))  # z_i - lo on the free entries, in [0, 1]
    need = r.k - xp.sum(xp.astype(sat, r.k.dtype), axis=1)
    target = xp.pow(xp.maximum(need, xp.zeros_like(need)), 1.0 / 3.0)
    delta = xp.zeros_like(r.k)
    for _ in range(CUBE_STEPS):
        v = (u - delta[:, None]) * on
        v2 = v * v
        s3 = xp.sum(v2 * v, axis=1)
        s2 = xp.sum(v2, axis=1)
        psi = xp.pow(xp.maximum(s3, xp.zeros_like(s3)), 1.0 / 3.0)
        # no step once the cubes sum to the need exactly (a root on a breakpoint)
        ok = (s2 > 0) & (s3 > need)
        step = delta + (psi - target) * psi * psi / xp.where(ok, s2, xp.ones_like(s2))
        delta = xp.where(ok, xp.maximum(step, delta), delta)
    return ref, off - (delta + flat)


SOLVERS: dict[str, Callable[[_Rows], tuple[Array, Array]]] = {
    "thre-exp": solve_exp,
    "thre-laplace": solve_laplace,
    "thre-sigmoid": solve_sigmoid,
    "thre-clip": solve_clip,
    "thre-cube": solve_cube,
}


def _weights_exp(xp: Any, t: Array, t_s: Array | None) -> tuple[Array, Array, Array]:
    """``(p, d, w)`` for ``f = min(1, e^t)``: ``w = d / max d`` (finite where every ``d`` underflows),
    one ``exp`` pass: ``d = w e^{max t}`` (the kink ``t = 0`` counts as saturated, ``d = 0``). The
    largest ``t < 0`` is read on ``t_s``, the sorted prefix (fewer than k entries saturate)."""
    assert t_s is not None
    below = _below(xp, t)  # masked entries (t = -inf) too: d = p = 0 there
    top = xp.max(xp.where(t_s < 0, t_s, xp.full_like(t_s, -math.inf)), axis=1)
    top = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
    # t - top <= 0 where t < 0; elsewhere the minimum keeps exp finite and the mask makes it 0
    w = xp.exp(xp.minimum(xp.minimum(t, 0.0) - top[:, None], 0.0)) * below
    d = w * xp.exp(top)[:, None]
    return d + (1 - below), d, w


def _weights_laplace(xp: Any, t: Array, t_s: Array | None) -> tuple[Array, Array, Array]:
    """``(p, d, w)`` for the Laplace CDF from one ``exp`` pass: ``w = e^{-(|t| - min |t|)}``,
    ``e^{-|t|} = w e^{-min |t|}``."""
    a = xp.abs(t)  # inf on masked entries: w = e = 0 there
    low = xp.min(a, axis=1)
    w = xp.exp(low[:, None] - a)
    e = w * xp.exp(-low)[:, None]
    half = e / 2
    return half + (1 - _below(xp, t)) * (1 - e), half, w


def _weights_sigmoid(xp: Any, t: Array, t_s: Array | None) -> tuple[Array, Array, Array]:
    """``(p, d, w)`` for the sigmoid from one ``exp`` pass, as :func:`_weights_laplace`:
    ``d = e / (1 + e)^2`` with ``e = e^{-|t|}``, ``w = d e^{min |t|}``."""
    a = xp.abs(t)  # inf on masked entries: v = e = 0 there
    low = xp.min(a, axis=1)
    v = xp.exp(low[:, None] - a)
    e = v * xp.exp(-low)[:, None]
    r = 1 / (1 + e)
    er = e * r
    return er + (1 - _below(xp, t)) * (r - er), er * r, v * r * r


def _free_mask(xp: Any, t: Array) -> Array:
    """``1.0`` where ``0 < t < 1``, else ``0.0`` (``-inf`` included), as :func:`_step`."""
    return _step(xp, t) * _step(xp, 1 - t)


def _weights_clip(xp: Any, t: Array, t_s: Array | None) -> tuple[Array, Array, Array]:
    d = _free_mask(xp, t)
    return xp.clip(t, 0.0, 1.0), d, d


def _weights_cube(xp: Any, t: Array, t_s: Array | None) -> tuple[Array, Array, Array]:
    free = _free_mask(xp, t)
    c = xp.clip(t, 0.0, 1.0)
    v = c * free  # t on the free entries, 0 elsewhere
    top = xp.max(v, axis=1)
    v = v / xp.where(top > 0, top, xp.ones_like(top))[:, None]
    c2 = c * c
    return c2 * c, 3 * c2 * free, v * v


#: ``(p, d, w)`` of each method from ``t = z - lambda`` (``-inf`` masked) and ``t_s``, the same on the
#: sorted prefix ``s`` (read by ``thre-exp`` only; ``None`` for the others): the weights ``f(t)``, their derivatives ``f'(t)`` and ``w``, ``f'(t)`` up to a
#: positive factor per row, finite and not all 0 where the ``f'`` underflow (``w / sum w = dp/dk``).
WEIGHTS: dict[str, Callable[[Any, Array, Array | None], tuple[Array, Array, Array]]] = {
    "thre-exp": _weights_exp,
    "thre-laplace": _weights_laplace,
    "thre-sigmoid": _weights_sigmoid,
    "thre-clip": _weights_clip,
    "thre-cube": _weights_cube,
}


def threshold_forward(xp: Any, method: str, z: Array, fin: Array, k: Array,
                      tau: Array, k_max: float | None = None) -> tuple[Array, tuple[Array, ...]]:
    """``p`` and the residuals ``(d, w, t, tau)`` of a threshold method (see the module doc;
    ``t = z - lambda``, ``-inf`` on masked entries). ``k_max``: a bound on every row's ``k`` known without reading ``k`` (see
    :func:`prefix_size`), else ``None``.

    Rows with ``k = #unmasked`` (every weight 1) are computed at ``t = (z - low) + S`` (``low`` the
    smallest unmasked entry, ``S = 2 - log(eps)``): every link gives ``p = 1`` there to rounding,
    and for the ``softmin`` links ``w`` is the limit of ``dp/dk`` (``|t| - min |t| = z - low``); their
    ``d`` is set to 0 and the ``lowest`` links' ``w`` to the smallest entries. The few
    per-row cases are blended with float masks (``a + m (b - a)``, every term finite).
    """
    full_mode = FULL[method]
    cheap = decides_cheaply(xp, z)
    prefix = prefix_size(method, k_max, z.shape[1])
    if method in CLIPPED and not cheap:
        prefix = None
    r = _rows(xp, z, fin, k, prefix, method in CLIPPED)
    if r.complete is None:
        ref, shift = SOLVERS[method](r)
    else:  # the prefix, where it holds every entry that matters on every row; else the sorted rows
        ref, shift = branch(xp, xp.all(r.complete), lambda: SOLVERS[method](r),
                            lambda: SOLVERS[method](_rows(xp, z, fin, k)))
    full = _full_rows(r)
    # the smallest unmasked entry, read on rows with k = #unmasked (all of them are in s there)
    low = take(xp, r.s, r.last)
    big = 2.0 - math.log(float(xp.finfo(z.dtype).eps))
    ref = xp.where(full, low, ref)
    shift = xp.where(full, xp.full_like(shift, big), shift)
    t = (z - ref[:, None]) + shift[:, None]  # -inf on masked entries
    # t on the sorted prefix: thre-exp reads its largest negative value and its saturated count there
    t_s = (r.s - ref[:, None]) + shift[:, None] if method == "thre-exp" else None
    p, d, w = WEIGHTS[method](xp, t, t_s)  # 0 on masked entries (t = -inf)
    full_f = xp.astype(full, z.dtype)[:, None]
    keep = 1 - full_f

    def rare(rows: Array, amend: Callable[[], Array], current: Array) -> Array:
        """``amend()``, a correction that only some rows need (``rows``), skipped where no row does
        (every pass over the batch counts; see :func:`branch`)."""
        return branch(xp, xp.any(rows), amend, lambda: current) if cheap else amend()

    if method == "thre-exp":
        # an integer k whose threshold rounded onto an entry (the mass below the k largest under
        # the smallest float): the group at the threshold carries dp/dk (the numpy engine's rule);
        # the saturated entries are the largest (fewer than k: all in s), so the group is the one
        # equal to s_{#sat - 1}
        assert t_s is not None
        nsat = xp.sum(xp.astype(t_s >= 0, t.dtype), axis=1)
        kink = (r.k == xp.floor(r.k)) & (nsat == r.k) & ~full
        least = take(xp, r.s, xp.clip(xp.astype(nsat, r.nfin.dtype) - 1, xp.zeros_like(r.nfin), r.last))

        def at_kink() -> Array:
            group = xp.astype(z == least[:, None], t.dtype)  # d = 0 there (saturated)
            return w + xp.astype(kink, t.dtype)[:, None] * ((d + group) - w)

        w = rare(kink, at_kink, w)
    if full_mode == "lowest":
        w = rare(full, lambda: w * keep + full_f * xp.astype(z == low[:, None], t.dtype), w)
    total = xp.sum(w, axis=1)
    w = w * (1 / xp.where(total > 0, total, xp.ones_like(total)))[:, None]  # w = 0 where total = 0
    d = rare(full, lambda: d * keep, d)
    return p, (d, w, t, tau)


def threshold_backward(xp: Any, residuals: tuple[Array, ...], g: Array) -> tuple[Array, Array, Array]:
    """``(g_x, g_k, g_tau)`` from the residuals of :func:`threshold_forward`."""
    d, w, t, tau = residuals
    gk = xp.sum(w * g, axis=1)
    gz = d * (g - gk[:, None])
    # at the entry of largest w, g_i - gk is the small difference of nearly equal numbers when w_i is
    # near 1: sum_{j != i} w_j (g_i - g_j) instead, from the other entries (as the numpy engine's
    # threshold_vjp; its rounding is then that of the terms, not eps |g| of gk)
    top = xp.argmax(w, axis=1)
    others = set_entries(xp, w, top, xp.zeros_like(gk))
    g_top = take(xp, g, top)
    exact = take(xp, d, top) * (g_top * xp.sum(others, axis=1) - xp.sum(others * g, axis=1))
    gz = set_entries(xp, gz, top, exact)
    gx = gz / tau[:, None]
    # g_tau = -(g_z . z) / tau, and g_z sums to 0, so any c may replace z by z - c. The rounding e
    # of the mean w . g in g_z = d (g - w . g) is common to every entry: it adds e sum d_i (z_i - c)
    # to g_z . (z - c), which vanishes at c = the d-weighted mean of z (with z - lambda = t in place
    # of z, the terms near the threshold stay O(1) and far entries, whose d is tiny, do not cancel).
    # Masked entries (t = -inf, d = w = 0) and rows with every weight 1 (d = 0) add nothing: t is
    # clamped to a finite value there.
    t0 = xp.maximum(t, -xp.finfo(t.dtype).max)
    t0 = t0 - xp.sum(w * t0, axis=1)[:, None]
    gtau = -xp.sum(gz * t0, axis=1) / tau
    return gx, gk, gtau
