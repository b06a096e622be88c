"""Threshold top-k operators: ``p_i = f(z_i - lambda)`` with ``lambda`` fixed by ``sum p = k``.

Axis convention: every function acts on a validated ``(B, n)`` batch ``z`` (see ``_base``): the
largest finite entry of each row is 0, masked entries are ``-inf``. For an increasing
``f: R -> [0, 1]`` the row function ``G(lambda) = sum_i f(z_i - lambda)`` decreases from ``n``
(finite entries) to 0, so ``G(lambda) = k`` has one root and ``p`` lies in the capped simplex
``D(n, k) = {0 <= p <= 1, sum p = k}``. Each method is the regularised argmax
``argmax_{p in D(n,k)} <p, z> - Omega(p)`` for a separable ``Omega`` (entropy for ``exp``, binary
entropy for ``sigmoid``). ``p_i`` depends on ``z_i`` and the row's ``lambda`` only, so equal
inputs give bitwise-equal outputs.

Three choices of ``f``:

* ``thre-exp``: ``f(t) = min(1, e^t)`` (closed form, C0: kink at ``t = 0``);
* ``thre-sigmoid``: ``f(t) = 1 / (1 + e^{-t})`` (safeguarded Newton, C-infinity; its solver is in
  :mod:`topk_cli.operators.threshold_sigmoid`, started from the ``thre-laplace`` threshold);
* ``thre-laplace``: ``f(t) = 1 - e^{-t}/2`` for ``t >= 0``, ``e^t/2`` for ``t < 0`` (closed form, C1).

The two closed forms share one principle. Writing ``f = min(U, L)`` (``U = 1``, ``L = e^t`` for
``exp``; ``U = 1 - e^{-t}/2``, ``L = e^t/2`` for ``laplace``), assigning the ``m`` largest
entries to ``U`` and the rest to ``L`` gives ``G_m >= G``, hence a root ``lambda_m >= lambda``,
with equality for the true ``m = #{z_i > lambda}``: ``lambda = min_m lambda_m``. Candidates are
screened in log space after a partial sort, then the best ones are recomputed relative to an
order statistic ``ref`` near ``lambda`` (``lambda = ref + delta``, ``t = (z - ref) - delta``), so
``t`` keeps full precision even when ``|z|`` is 1e7 or more.

Jacobian (implicit function theorem): ``dp/dz = diag(d) - d d^T / sum(d)`` with
``d_i = f'(z_i - lambda)``: symmetric, PSD, rows summing to 0; the VJP costs O(n).

``k`` may be real and differ per row (``row_k``: a ``(B,)`` float64 array, ``0 < k <= #finite``):
``G(lambda) = k`` has one root for any real ``k < #finite``. Rows are grouped by the size of their
partial sort (:func:`sort_size`), so each row's result is bitwise the one it has alone and an
integer-valued ``k`` gives bitwise the ``int`` path's. Differentiating ``G(lambda) = k`` in ``k``
gives ``dp/dk = d / sum(d)`` (:func:`threshold_dk`, in log space); :func:`threshold_log_weights`
returns ``(log p, log(1 - p))`` from ``z - lambda`` without underflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward, Implementation, ResidualFn
from topk_cli.operators._logspace import exp_into

# ---------------------------------------------------------------------------------------------
# shared helpers


def _split_top(z: FloatArray, size: int) -> tuple[FloatArray, FloatArray]:
    """The ``size`` largest entries of each row sorted descending, and the other entries."""
    n = z.shape[1]
    if size >= n:
        return -np.sort(-z, axis=1), z[:, :0]
    part = np.partition(z, n - size, axis=1)
    return -np.sort(-part[:, n - size :], axis=1), part[:, : n - size]


def _tail_mass(top: FloatArray, tail: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(s_M, T0)``: the smallest kept value and ``sum_tail exp(z - s_M)`` (0 when none).

    Overwrites ``tail`` (scratch space from :func:`_split_top`).
    """
    s_last = top[:, -1]
    if tail.shape[1] == 0:
        return s_last, np.zeros(top.shape[0])
    finite = np.isfinite(s_last)
    shift = np.where(finite, s_last, 0.0)
    # ``tail`` is scratch (a slice of the partitioned copy): work in place, one pass of exp
    np.subtract(tail, shift[:, None], out=tail)
    with np.errstate(under="ignore"):  # far tail entries underflow to 0: negligible, as intended
        exp_into(tail, tail)
    return s_last, np.where(finite, tail.sum(axis=1), 0.0)


def _take(a: FloatArray, idx: np.ndarray) -> FloatArray:
    """``a[b, idx[b]]`` for every row ``b``."""
    return np.take_along_axis(a, idx[:, None], axis=1)[:, 0]


def _kr(k: Any, rows: Any) -> Any:
    """``k`` of those rows: the ``int`` itself (every row shares it), or those rows of a per-row array."""
    return k[rows] if isinstance(k, np.ndarray) else k


def sort_size(need: np.ndarray, k: FloatArray, n: int) -> np.ndarray:
    """The partial-sort size of rows with per-row ``k`` that need at least ``need`` entries sorted:
    ``need`` itself where ``k`` is an integer (so those rows sort as with an ``int`` k, bit for bit),
    else ``need`` rounded up to 4 sizes per octave (at most 25% more), so that a batch of
    scattered real ``k`` forms a few groups (see :func:`_grouped`); at most ``n``.
    """
    need = np.maximum(need, 1)
    step = np.left_shift(1, np.maximum(np.floor(np.log2(need)).astype(np.int64) - 2, 0))
    coarse = -(-need // step) * step
    return np.minimum(np.where(k == np.floor(k), need, coarse), max(n, 1))


def _grouped(z: FloatArray, k: Any, keys: np.ndarray,
             solve: Callable[[FloatArray, Any, int], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """``solve(z, k, key)`` (per-row results, row first) on each group of rows sharing the integer
    ``keys[b]`` (the size of a method's partial sort, e.g. ``ceil(k)``), merged.

    A per-row ``k`` changes how many entries a row's solve sorts; grouping the rows by that size
    makes every row's result the one it has alone (the same sort, the same sums), whatever the
    other rows' k. One distinct size (the usual case) calls ``solve`` once on the whole batch.
    """
    values = np.unique(keys)
    if values.size == 1:
        return solve(z, k, int(values[0]))
    outs: tuple[np.ndarray, ...] = ()
    for v in values:
        rows = np.flatnonzero(keys == v)
        res = solve(z[rows], k[rows], int(v))
        if not outs:
            outs = tuple(np.empty((z.shape[0], *r.shape[1:]), dtype=r.dtype) for r in res)
        for full, part in zip(outs, res, strict=True):
            full[rows] = part
    return outs


def _select(mask: np.ndarray, a: FloatArray, b: FloatArray) -> FloatArray:
    """``np.where(mask, a, b)`` for finite ``a, b``, exactly (``a * 1 + b * 0 = a``).

    Arithmetic on the mask runs at memory speed, while a masked select on an unpredictable
    mask costs about half an ``exp`` per entry on a typical CPU.
    """
    out = np.multiply(a, mask)
    out += np.multiply(b, ~mask)
    return out


def _log_below(top: FloatArray, s_last: FloatArray, t0: FloatArray, m: np.ndarray) -> FloatArray:
    """``log sum_{i >= m} exp(s_i - s_m)`` over kept entries from position ``m`` on, plus the tail.

    Every term is at most 1 and the first is 1, so the result lies in ``[0, log n]``; rows
    with ``s_m = -inf`` (no finite entry below) give ``-inf``.
    """
    pos = np.arange(top.shape[1])
    ref = _take(top, np.minimum(m, top.shape[1] - 1))
    ok = np.isfinite(ref)
    shift = np.where(ok, ref, 0.0)
    keep = (pos[None, :] > m[:, None]) & np.isfinite(top)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):  # masked terms are excluded
        rest = np.exp(np.where(keep, top - shift[:, None], -np.inf)).sum(axis=1)
        rest = rest + t0 * np.exp(np.where(np.isfinite(s_last), s_last - shift, -np.inf))
    # The term i = m is exactly 1: log1p keeps the digits of a tiny remainder.
    return np.where(ok & (m < top.shape[1]), np.log1p(rest), -np.inf)


def _log_above(top: FloatArray, m: np.ndarray) -> FloatArray:
    """``log sum_{i < m} exp(s_{m-1} - s_i)`` (in ``[0, log m]``); ``-inf`` when ``m = 0``."""
    pos = np.arange(top.shape[1])
    ref = _take(top, np.maximum(m - 1, 0))
    keep = pos[None, :] < m[:, None] - 1
    with np.errstate(under="ignore", invalid="ignore"):  # entries far above are negligible
        rest = np.exp(np.where(keep, ref[:, None] - top, -np.inf)).sum(axis=1)
    # The term i = m - 1 is exactly 1 (log1p keeps a tiny remainder); m = 0 is an empty sum.
    return np.where(m > 0, np.log1p(rest), -np.inf)


def _saturated_rows(z: FloatArray, k: int) -> np.ndarray:
    """Rows with exactly ``k`` finite entries: every one of them gets weight 1, lambda = -inf."""
    return np.isfinite(z).sum(axis=1) == k


def _saturated_from_top(top: FloatArray, k: int) -> np.ndarray:
    """Rows with exactly ``k`` finite entries: every one of them gets weight 1, lambda = -inf.

    ``top`` holds the largest entries sorted (at least ``k``; all of them when ``n = k``). A row
    has at least ``k`` finite entries, so it has exactly ``k`` when the next one is ``-inf``.
    """
    if top.shape[1] <= k:
        return np.ones(top.shape[0], dtype=bool)
    return top[:, k] == -np.inf


def _fill_saturated(z: FloatArray, rows: np.ndarray, p: FloatArray, q: FloatArray, d: FloatArray,
                    lam: FloatArray) -> None:
    """Overwrite rows where ``k = #finite``: ``p = 1, q = 0`` exactly on finite entries."""
    if rows.any():
        fin = np.isfinite(z[rows])
        p[rows] = np.where(fin, 1.0, 0.0)
        q[rows] = np.where(fin, 0.0, 1.0)
        d[rows] = 0.0
        lam[rows] = -np.inf


# ---------------------------------------------------------------------------------------------
# the closed forms: choosing the branch m = #{z_i > lambda}


def _g_exp(top: FloatArray, s_last: FloatArray, t0: FloatArray, k: Any, j: np.ndarray) -> FloatArray:
    """``G(s_j)`` for ``f = min(1, e^t)``: ``j + sum_{i >= j} e^{s_i - s_j}`` (0-based ``j``)."""
    return j + np.exp(_log_below(top, s_last, t0, j))


def _g_laplace(top: FloatArray, s_last: FloatArray, t0: FloatArray, k: Any, j: np.ndarray) -> FloatArray:
    """``G(s_j)`` for the Laplace CDF: ``(j + 1) - X/2 + Y/2``, every term relative to ``s_j``.

    ``X = sum_{i <= j} e^{s_j - s_i}`` and ``Y = sum_{i > j} e^{s_i - s_j}``.
    """
    return _g_laplace_from(top, s_last, t0, j, _log_above(top, j + 1), _log_below(top, s_last, t0, j + 1))


def _g_laplace_from(top: FloatArray, s_last: FloatArray, t0: FloatArray, j: np.ndarray, la: FloatArray,
                    lb: FloatArray) -> FloatArray:
    """:func:`_g_laplace` given ``la = _log_above(top, j + 1)`` and ``lb = _log_below(top, .., j + 1)``."""
    x = np.exp(la)
    s_j = _take(top, j)
    s_next = _take(top, np.minimum(j + 1, top.shape[1] - 1))
    with np.errstate(under="ignore", invalid="ignore"):  # far entries below contribute 0
        gap = np.where((j + 1 < top.shape[1]) & np.isfinite(s_next), s_next - s_j, -np.inf)
        y = np.exp(gap + lb)
    y = np.where((j + 1 < top.shape[1]) | (t0 == 0), y, t0 * np.exp(s_last - s_j))
    return (j + 1) - 0.5 * x + 0.5 * y


GFn = Callable[[FloatArray, FloatArray, FloatArray, Any, np.ndarray], FloatArray]


def _branch(top: FloatArray, s_last: FloatArray, t0: FloatArray, k: Any, upper: np.ndarray,
            guess: np.ndarray, g: GFn, g_left: FloatArray | None = None) -> np.ndarray:
    """``m = #{j < upper : G(s_j) < k}`` per row (``G(s_j)`` increases with ``j``).

    The log-space ``guess`` (within ``[0, upper]``) is verified with two accurate evaluations of
    ``G``, the first of which, ``G(s_{max(guess - 1, 0)})``, may be given as ``g_left``; rows
    where it is wrong fall back to a vectorised binary search (``log2(upper)`` evaluations).
    """
    guess = np.clip(guess, 0, upper)
    if g_left is None:
        g_left = g(top, s_last, t0, k, np.maximum(guess - 1, 0))
    left_ok = (guess == 0) | (g_left < k)
    right_ok = (guess == upper) | (g(top, s_last, t0, k, np.minimum(guess, upper - 1)) >= k)
    lo = np.where(left_ok, np.where(right_ok, guess, guess + 1), 0)
    hi = np.where(left_ok, np.where(right_ok, guess, upper), guess - 1)
    rows = np.flatnonzero(lo < hi)
    while rows.size:
        mid = (lo[rows] + hi[rows]) // 2
        kr = _kr(k, rows)
        below_k = g(top[rows], s_last[rows], t0[rows], kr, mid) < kr
        lo[rows] = np.where(below_k, mid + 1, lo[rows])
        hi[rows] = np.where(below_k, hi[rows], mid)
        rows = rows[lo[rows] < hi[rows]]
    return lo


# ---------------------------------------------------------------------------------------------
# thre-exp


def _exp_branch(top: FloatArray, s_last: FloatArray, t0: FloatArray, k: Any,
                m: np.ndarray) -> tuple[FloatArray, FloatArray]:
    """``(ref, delta)`` of branch ``m`` (``m`` saturated): ``lambda = ref + delta``, ``ref = s_{m+1}``."""
    ref = _take(top, m)
    delta = _log_below(top, s_last, t0, m) - np.log(k - m)
    return ref, delta


def _exp_threshold(z: FloatArray, k: Any, size: int) -> tuple[FloatArray, FloatArray, np.ndarray]:
    """``(ref, delta, saturated_rows)`` of the ``thre-exp`` threshold ``lambda = ref + delta``.

    ``size >= ceil(k)`` (the same for every row; ``= k`` for an ``int``): fewer than ``k`` entries
    saturate, so the ``size`` largest entries, sorted, and the mass of the others decide every branch.
    """
    top, tail = _split_top(z, size)
    # exactly size finite entries <=> nothing finite outside the top size
    sat_rows = np.max(tail, axis=1) == -np.inf if tail.shape[1] else np.ones(z.shape[0], dtype=bool)
    if isinstance(k, np.ndarray):
        sat_rows &= k == size  # a real k below the number of entries leaves room for a threshold
    s_last, t0 = _tail_mass(top, tail)
    # Log-space guess: lambda_m = log S(m) - log(k - m), S(m) = sum of all but the top m.
    with np.errstate(divide="ignore"):  # empty tails give log 0 = -inf
        log_tail = np.where(t0 > 0, s_last + np.log(np.where(t0 > 0, t0, 1.0)), -np.inf)
    seq = np.concatenate([log_tail[:, None], top[:, ::-1]], axis=1)
    log_s = np.logaddexp.accumulate(seq, axis=1)[:, :0:-1]  # log S(m), m = 0..size-1
    if isinstance(k, np.ndarray):
        room = k[:, None] - np.arange(size)  # k - m: only m < k are branches
        with np.errstate(divide="ignore", invalid="ignore"):
            guess = np.argmin(np.where(room > 0, log_s - np.log(np.where(room > 0, room, 1.0)), np.inf), axis=1)
        upper = np.where(sat_rows, size, np.ceil(k).astype(np.int64) - 1)
    else:
        guess = np.argmin(log_s - np.log(k - np.arange(k))[None, :], axis=1)
        upper = np.where(sat_rows, size, size - 1)
    m = _branch(top, s_last, t0, k, upper, guess, _g_exp)
    ref, delta = _exp_branch(top, s_last, t0, k, np.minimum(m, size - 1))
    ref = np.where(sat_rows, 0.0, ref)
    delta = np.where(sat_rows, 0.0, delta)
    return ref, delta, sat_rows


def thre_exp_forward(z: FloatArray, k: Any) -> Forward:
    """``p = min(1, exp(z - lambda))`` with ``sum p = k``, in closed form after a partial sort.

    Solves ``max_{p in D(n,k)} <p, z> - sum p_i (log p_i - 1)``. Only the top k entries can
    saturate; with ``m`` of them saturated ``lambda = log sum_{i > m} e^{z_(i)} - log(k - m)``
    (the true ``m`` also gives the smallest such ``lambda``). At ``k = 1`` this is softmax.
    Cost: one ``np.partition``, a sort of the top k, one ``exp`` over the row.

    ``k``: an ``int``, or a ``(B,)`` array of real ``k`` per row (rows are grouped by the size of their
    partial sort, at least ``ceil(k)``, see :func:`sort_size`; ``lambda_m = log S(m) - log(k - m)`` holds for a real ``k``).

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q (B, n)``; ``aux["lambda"], aux["d"]`` and
    ``aux["t"] = min(z - lambda, 0)`` (``-inf`` on masked entries), from which
    :data:`THRE_EXP`'s ``dk`` and ``log_weights`` work in log space.
    ``q = -expm1(z - lambda)`` on unsaturated entries and exactly 0 on saturated ones.

    >>> np.round(thre_exp_forward(np.array([[0.0, -1.0, -2.0]]), 2).p, 4)
    array([[1.    , 0.7311, 0.2689]])
    """
    if isinstance(k, np.ndarray):
        ref, delta, sat_rows = _grouped(z, k, sort_size(np.ceil(k).astype(np.int64), k, z.shape[1]), _exp_threshold)
    else:
        ref, delta, sat_rows = _exp_threshold(z, k, k)
    t = np.subtract(z, ref[:, None])
    t -= delta[:, None]
    np.minimum(t, 0.0, out=t)  # the kink t = 0 counts as saturated: p = 1, q = 0, d = 0
    p = np.exp(t)  # exp of very negative t underflows to 0, the right answer
    # q = 1 - p is accurate to an ulp where p <= 1/2 (no cancellation); the few entries above
    # 1/2 (at most 2k per row, since sum p = k) take q = -expm1(t)
    q = np.subtract(1.0, p)
    near = np.flatnonzero(p > 0.5)
    if near.size:
        qf, tf = q.reshape(-1), t.reshape(-1)
        qf[near] = -np.expm1(tf[near])
    d = np.multiply(p, t < 0.0)
    lam = ref + delta
    _fill_saturated(z, sat_rows, p, q, d, lam)
    return Forward(p=p, q=q, aux={"lambda": lam, "d": d, "t": t})


#: Rows whose threshold lies this far below the row maximum (in ``z``) are refined by
#: :func:`thre_exp_refine`: there ``ulp(z)`` (1.4e-14 at 64) starts to exceed float64's resolution of
#: the differences that decide ``p``.
REFINE_BELOW = 64.0


def thre_exp_refine(fwd: Forward, z: FloatArray, k: Any, residual: ResidualFn) -> Forward:
    """``fwd`` recomputed on the rows whose threshold is at least :data:`REFINE_BELOW` below the row
    maximum, from the scores relative to the largest unsaturated one, corrected by the rounding error
    of ``z``.

    ``z = (x - max x) / tau`` is rounded to ``ulp(|z|)``: at ``x = 1e6 + N(0, 1)`` with an outlier
    at ``1e9`` and ``tau = 0.1`` the bulk sits at ``z = -1e10``, whose ulp ``1.9e-6`` is an absolute
    error in every ``z_i - lambda`` (thus a relative error of ``d`` and of the Jacobian), while ``x``
    itself determines those differences to ``1e-9``. Here the unsaturated entries (``p < 1``) are
    taken relative to the largest of them, ``r``: ``w_i = (z_i - z_r) + (lo_i - lo_r)`` (the first
    difference is exact near ``r``, ``lo`` restores the digits the rounding of ``z`` dropped), and
    ``lambda - z_r = log sum_unsat e^{w} - log(k - m)`` (``m`` saturated entries) is recomputed from
    them. The saturated entries keep ``p = 1``.
    """
    lam = fwd.aux["lambda"]
    p = fwd.p
    unsat = (p < 1.0) & np.isfinite(z)
    rows = np.flatnonzero(np.isfinite(lam) & (lam <= -REFINE_BELOW) & unsat.any(axis=1))
    if rows.size == 0:
        return fwd
    zr, un = z[rows], unsat[rows]
    lo = residual(rows)
    r = np.argmax(np.where(un, zr, -np.inf), axis=1)
    w = (zr - _take(zr, r)[:, None]) + (lo - _take(lo, r)[:, None])
    w = np.where(un, w, -np.inf)
    m = np.isfinite(zr).sum(axis=1) - un.sum(axis=1)  # saturated entries
    top = np.max(w, axis=1)
    with np.errstate(under="ignore", divide="ignore"):
        delta = top + np.log(np.exp(w - top[:, None]).sum(axis=1)) - np.log(_kr(k, rows) - m)
        t = np.minimum(w - delta[:, None], 0.0)
        pr = np.where(un, np.exp(t), p[rows])
        qr = np.where(un, np.where(pr > 0.5, -np.expm1(t), 1.0 - pr), fwd.q[rows])
    dr = np.where(un, pr * (t < 0.0), 0.0)
    out = Forward(p=p.copy(), q=fwd.q.copy(), aux={name: val.copy() for name, val in fwd.aux.items()})
    out.p[rows], out.q[rows], out.aux["d"][rows] = pr, qr, dr
    if "t" in out.aux:  # saturated entries keep t = 0, masked ones -inf
        out.aux["t"][rows] = np.where(un, t, np.where(np.isfinite(zr), 0.0, -np.inf))
    out.aux["lambda"][rows] = _take(zr, r) + delta
    return out


# ---------------------------------------------------------------------------------------------
# thre-laplace


def _laplace_branch(top: FloatArray, s_last: FloatArray, t0: FloatArray, k: Any, m: np.ndarray,
                    logs: tuple[FloatArray, FloatArray] | None = None) -> tuple[FloatArray, FloatArray]:
    """``(ref, delta)`` of branch ``m`` (``m`` entries above lambda), accurately.

    With ``A = sum_{i<=m} e^{-s_i}``, ``C = sum_{i>m} e^{s_i}``, ``K = k - m`` and
    ``u = e^lambda``: ``A u^2 + 2 K u - C = 0``. The root is taken in the form without
    cancellation: ``u = C / (K + sqrt(K^2 + AC))`` for ``K > 0``, ``u = (|K| + sqrt(K^2 + AC)) / A``
    for ``K < 0`` and ``u = sqrt(C / A)`` for ``K = 0``, all relative to ``s_m`` or ``s_{m+1}``.
    ``logs``: ``(_log_above(top, m), _log_below(top, s_last, t0, m))`` if already known.
    """
    m_hi = np.maximum(m - 1, 0)
    s_hi = _take(top, m_hi)  # s_m (1-based), the smallest entry above
    s_lo = _take(top, np.minimum(m, top.shape[1] - 1))  # s_{m+1}, the largest entry below
    # log(A e^{s_m}) and log(C e^{-s_{m+1}})
    la, lc = logs if logs is not None else (_log_above(top, m), _log_below(top, s_last, t0, m))
    with np.errstate(invalid="ignore"):  # -inf - -inf only in branches without entries above/below
        gap = np.where((m > 0) & np.isfinite(s_lo) & (m < top.shape[1]), s_lo - s_hi, -np.inf)
        log_ac = np.where(np.isfinite(la) & np.isfinite(lc), gap + la + lc, -np.inf)  # <= log(m n)
    kk = (k - m).astype(np.float64)
    root = np.sqrt(kk * kk + np.exp(log_ac))
    with np.errstate(divide="ignore", invalid="ignore"):  # each branch is selected by np.where
        d_pos = lc - np.log(kk + root)  # K > 0: lambda = s_{m+1} + d_pos
        d_neg = np.log(-kk + root) - la  # K < 0: lambda = s_m + d_neg
        d_zero = (gap + lc - la) / 2  # K = 0: lambda = s_m + d_zero
    ref = np.where(kk > 0, s_lo, s_hi)
    delta = np.where(kk > 0, d_pos, np.where(kk < 0, d_neg, d_zero))
    return ref, delta


def thre_laplace_forward(z: FloatArray, k: Any) -> Forward:
    """``p = F(z - lambda)``, ``F`` the Laplace CDF, ``sum p = k``: closed form after a partial sort.

    ``F(t) = 1 - e^{-t}/2`` for ``t >= 0`` and ``e^t/2`` for ``t < 0``. With ``m`` entries above
    lambda, ``k = m - (1/2) e^lambda sum_{i<=m} e^{-z_(i)} + (1/2) e^{-lambda} sum_{i>m} e^{z_(i)}``,
    a quadratic in ``e^lambda``. Entries above lambda have ``p > 1/2``, so ``m < 2k``: only the
    top ``2k`` entries are sorted. The stable root (no cancellation) of the right branch is used;
    ``q = 1 - p`` is ``e^{-t}/2`` above lambda. C1: ``F'(t) = e^{-|t|}/2`` is continuous.
    At ``k = 1`` it equals softmax only while every softmax weight is < 1/2.

    ``k``: an ``int``, or a ``(B,)`` array of real ``k`` per row (``m < 2k`` still: the rows are
    grouped by the size of their partial sort, at least ``ceil(2k)``: :func:`sort_size`).

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q (B, n)``; ``aux["lambda"], aux["d"]`` and
    ``aux["t"] = z - lambda`` (``-inf`` on masked entries) for ``dk`` and ``log_weights``.

    >>> np.round(thre_laplace_forward(np.array([[0.0, -1.0, -2.0]]), 1).p, 4)
    array([[0.6453, 0.2593, 0.0954]])
    """
    ref, delta, sat_rows = _laplace_threshold(z, k)
    t = np.subtract(z, ref[:, None])
    t -= delta[:, None]
    above = t >= 0
    d = np.abs(t)
    np.negative(d, out=d)
    with np.errstate(under="ignore"):  # far entries: e^{-|t|} = 0 exactly
        np.exp(d, out=d)
    d *= 0.5  # F'(t) = e^{-|t|} / 2, also the smaller of p and q
    # p = 1 - d above lambda, d below; q the other one (|1 - d| and |0 - d|: exact selects)
    p = np.subtract(above, d)
    np.abs(p, out=p)
    q = np.subtract(~above, d)
    np.abs(q, out=q)
    lam = ref + delta
    _fill_saturated(z, sat_rows, p, q, d, lam)
    return Forward(p=p, q=q, aux={"lambda": lam, "d": d, "t": t})


def _laplace_guess_log(top: FloatArray, s_last: FloatArray, t0: FloatArray) -> FloatArray:
    """``G(s_j)`` from ``a = log sum_{i<=j} e^{-s_i}`` and ``c = log sum_{i>j} e^{s_i}``, any spread."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):  # empty sums
        log_tail = np.where(t0 > 0, s_last + np.log(np.where(t0 > 0, t0, 1.0)), -np.inf)
        neg = np.where(np.isfinite(top), -top, -np.inf)
        a = np.logaddexp.accumulate(neg, axis=1)
        seq = np.concatenate([log_tail[:, None], top[:, ::-1]], axis=1)
        c = np.logaddexp.accumulate(seq, axis=1)[:, -2::-1]  # c[:, j] = log sum_{i > j}
        return np.arange(1, top.shape[1] + 1) - 0.5 * np.exp(top + a) + 0.5 * np.exp(c - top)


def _laplace_guess_linear(top: FloatArray, s_last: FloatArray, t0: FloatArray) -> FloatArray:
    """As :func:`_laplace_guess_log` with plain sums: for rows whose kept entries are >= -600."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):  # masked: -inf
        e = np.exp(top)  # top <= 0: the row maximum is 0
        a = np.cumsum(np.reciprocal(e), axis=1)  # sum_{i<=j} e^{-s_i}
        c = np.empty_like(e)  # sum_{i>j} e^{s_i}, plus the tail
        c[:, -1] = 0.0
        np.cumsum(e[:, :0:-1], axis=1, out=c[:, -2::-1])
        c += (t0 * np.exp(s_last))[:, None]
        g = np.multiply(e, a, out=a)
        g *= -0.5
        np.divide(c, e, out=c)
        c *= 0.5
        g += c
        g += np.arange(1, top.shape[1] + 1)
        return g


class LaplaceStart(NamedTuple):
    """The Laplace threshold ``lambda = ref + delta`` and the partial sort it came from.

    ``top`` holds the ``min(n, 2k)`` largest entries of each row sorted descending, ``s_last``
    its last column; ``tail_exp`` the other entries as ``e^{z - shift}`` (``shift = s_last``,
    0 where ``s_last = -inf``; masked or underflowed entries give 0, any column order) and
    ``t0`` its row sums; ``saturated`` the rows with exactly ``k`` finite entries.
    """

    ref: FloatArray
    delta: FloatArray
    saturated: np.ndarray
    top: FloatArray
    s_last: FloatArray
    tail_exp: FloatArray
    t0: FloatArray


def laplace_sort_size(k: Any) -> Any:
    """How many of a row's largest entries the Laplace and sigmoid solves sort: ``ceil(2k)``
    (entries above the threshold have ``p > 1/2``, so fewer than ``2k`` of them), per row for a
    ``(B,)`` array."""
    return np.ceil(2.0 * k).astype(np.int64) if isinstance(k, np.ndarray) else 2 * k


def _laplace_start(z: FloatArray, k: Any, size: int | None = None) -> LaplaceStart:
    """The Laplace threshold of ``z`` with the partial sort and tail mass it used.

    ``k``: an ``int``, or a ``(B,)`` array of real ``k`` per row whose :func:`laplace_sort_size` is at
    most ``size`` for every row (see :func:`sort_size`).
    """
    n = z.shape[1]
    size = min(n, 2 * k if size is None else size)
    top, tail = _split_top(z, size)
    if isinstance(k, np.ndarray):
        # exactly k finite entries (k <= #finite): the top holds min(#finite, ceil(2k)) >= k of them
        sat_rows = np.isfinite(top).sum(axis=1) == k
    else:
        sat_rows = _saturated_from_top(top, k)
    n_fin = np.isfinite(top).sum(axis=1)  # min(#finite, size): what ``upper`` needs
    s_last, t0 = _tail_mass(top, tail)  # ``tail`` now holds e^{z - shift}
    # A guess of G(s_j) from prefix sums (``_branch`` verifies it, so it only has to be close).
    # Rows whose kept entries all lie within 600 of the row maximum 0 take linear space (no
    # overflow: e^{-s_i} <= e^600), the others log space.
    far = ((top < -600.0) & np.isfinite(top)).any(axis=1)
    g_guess = _laplace_guess_linear(top, s_last, t0)
    if far.any():
        g_guess[far] = _laplace_guess_log(top[far], s_last[far], t0[far])
    upper = np.minimum(n_fin, size)
    k_col = k[:, None] if isinstance(k, np.ndarray) else k
    guess = np.clip(np.sum((g_guess < k_col) & np.isfinite(top), axis=1), 0, upper)
    # The branch check's first evaluation, G(s_{j}) with j = max(guess - 1, 0), needs the two
    # log-sums at j + 1; where the check confirms m = j + 1 (the usual case), the closed form
    # below reuses them (the same values, so the same bits as evaluating them again).
    j_left = np.maximum(guess - 1, 0)
    la = _log_above(top, j_left + 1)
    lc = _log_below(top, s_last, t0, j_left + 1)
    g_left = _g_laplace_from(top, s_last, t0, j_left, la, lc)
    m = _branch(top, s_last, t0, k, upper, guess, _g_laplace, g_left)
    redo = np.flatnonzero(m != j_left + 1)
    if redo.size:
        la[redo] = _log_above(top[redo], m[redo])
        lc[redo] = _log_below(top[redo], s_last[redo], t0[redo], m[redo])
    ref, delta = _laplace_branch(top, s_last, t0, k, m, (la, lc))
    ref = np.where(sat_rows, 0.0, ref)
    delta = np.where(sat_rows, 0.0, delta)
    return LaplaceStart(ref, delta, sat_rows, top, s_last, tail, t0)


def _laplace_threshold(z: FloatArray, k: Any) -> tuple[FloatArray, FloatArray, np.ndarray]:
    """``(ref, delta, saturated_rows)`` of the Laplace threshold ``lambda = ref + delta``.

    A per-row ``k`` groups the rows by :func:`laplace_sort_size`."""
    if not isinstance(k, np.ndarray):
        start = _laplace_start(z, k)
        return start.ref, start.delta, start.saturated

    def solve(zz: FloatArray, kk: Any, size: int) -> tuple[np.ndarray, ...]:
        start = _laplace_start(zz, kk, size)
        return start.ref, start.delta, start.saturated

    ref, delta, sat = _grouped(z, k, sort_size(laplace_sort_size(k), k, z.shape[1]), solve)
    return ref, delta, sat


# ---------------------------------------------------------------------------------------------
# Jacobian and VJP (shared)


def threshold_jacobian(fwd: Forward, z: FloatArray, k: Any) -> FloatArray:
    """``dp/dz = diag(d) - (d / sum d) d^T``, ``d_i = f'(z_i - lambda)``, shape ``(B, n, n)``.

    Symmetric PSD with zero row sums; masked entries have ``d = 0`` (zero rows and columns).
    For ``thre-exp`` ``d_i = p_i`` below lambda and 0 at or above it: at the kink
    ``z_i = lambda`` the saturated (one-sided) derivative is taken. When every ``d_i`` underflows
    to 0 (an extremely hard selection) the result is the zero matrix, its limit.

    >>> fwd = thre_exp_forward(np.array([[0.0, 0.0]]), 1)
    >>> threshold_jacobian(fwd, np.array([[0.0, 0.0]]), 1)
    array([[[ 0.25, -0.25],
            [-0.25,  0.25]]])
    """
    d = fwd.aux["d"]
    total = d.sum(axis=1, keepdims=True)
    w = np.divide(d, total, out=np.zeros_like(d), where=total > 0)
    jac = -w[:, :, None] * d[:, None, :]
    idx = np.arange(d.shape[1])
    jac[:, idx, idx] += d
    rows, top, rest = _dominant(d)
    if rows.size:  # d_i (1 - w_i) with 1 - w_i summed from the other entries (see _dominant)
        jac[rows, top, top] = d[rows, top] * rest / total[rows, 0]
    return jac


def _dominant(d: FloatArray) -> tuple[NDArray[np.intp], NDArray[np.intp], FloatArray]:
    """``(rows, top, rest)``: the rows where one entry holds more than half of ``sum d``, that entry
    and ``sum_{j != top} d_j``, summed without it.

    ``v_i - (d . v) / sum d = sum_{j != i} d_j (v_i - v_j) / sum d`` (and ``1 - w_i``) is the small
    difference of two nearly equal numbers at an entry whose ``d_i`` dominates, so its rounding
    (``eps |v|``) is large relative to it (1e-9 of a VJP entry was seen at ``w_i = 1 - 1e-8``); the
    other entries' differences are not cancellations of that kind (their ``w_j < 1/2``).
    """
    total = d.sum(axis=1)
    top = np.argmax(d, axis=1)
    rows = np.flatnonzero(d[np.arange(d.shape[0]), top] > total / 2)
    top = top[rows]
    others = d[rows].copy()
    others[np.arange(rows.size), top] = 0.0
    return rows, top, others.sum(axis=1)


def threshold_vjp(fwd: Forward, z: FloatArray, k: Any, v: FloatArray) -> FloatArray:
    """``v^T dp/dz = d * (v - (d . v) / sum d)`` in O(n) per row, shape ``(B, n)``.

    >>> fwd = thre_exp_forward(np.array([[0.0, 0.0]]), 1)
    >>> threshold_vjp(fwd, np.array([[0.0, 0.0]]), 1, np.array([[1.0, 0.0]]))
    array([[ 0.25, -0.25]])
    """
    d = fwd.aux["d"]
    total = d.sum(axis=1)
    mean = np.divide(np.einsum("bi,bi->b", d, v), total, out=np.zeros_like(total), where=total > 0)
    # d * (v - mean), mean = (d . v) / sum d: four passes over the batch (the dot product without
    # a temporary), no cancellation beyond that of v - mean itself
    out = np.subtract(v, mean[:, None])
    out *= d
    rows, top, rest = _dominant(d)
    if rows.size:  # the dominant entry's v_i - mean summed from the others' differences (see _dominant)
        dv = d[rows] * v[rows]
        dv[np.arange(rows.size), top] = 0.0
        v_top = v[rows, top]
        out[rows, top] = d[rows, top] * (v_top * rest - dv.sum(axis=1)) / total[rows]
    return out


# ---------------------------------------------------------------------------------------------
# derivative in k and log-weights (shared)

_LN2 = float(np.log(2.0))


class ThresholdLink(NamedTuple):
    """What :func:`threshold_dk` and :func:`threshold_log_weights` need of one method ``p = f(z - lambda)``.

    ``t(fwd, z)``: ``z - lambda`` as the forward computed its weights (``-inf`` on masked entries;
    rows with ``k = #finite`` are ignored). ``log_d(t)``: ``log f'(t)`` up to a constant per row
    (``-inf`` where ``f' = 0``). ``log_pq(t)``: ``(log f(t), log(1 - f(t)))`` without underflow.
    ``full``: the limit of ``dp/dk`` as ``k`` rises to ``#finite`` (see :func:`threshold_dk`):
    ``"lowest"`` (uniform over the smallest finite entries) or ``"softmin"`` (``e^{-z}`` normalised).
    """

    t: Callable[[Forward, FloatArray], FloatArray]
    log_d: Callable[[FloatArray], FloatArray]
    log_pq: Callable[[FloatArray], tuple[FloatArray, FloatArray]]
    full: str


def _full_rows(z: FloatArray, mode: str) -> FloatArray:
    """``dp/dk`` of rows with ``k = #finite`` as the limit from below (``mode`` as ``ThresholdLink.full``)."""
    fin = np.isfinite(z)
    low = np.min(np.where(fin, z, np.inf), axis=1, keepdims=True)
    if mode == "lowest":
        w = (fin & (z == low)).astype(np.float64)
    else:
        with np.errstate(under="ignore", invalid="ignore"):  # far entries: e^{-|z - low|} = 0
            w = np.where(fin, np.exp(np.where(fin, low - z, 0.0)), 0.0)
    return w / w.sum(axis=1, keepdims=True)


def threshold_dk(fwd: Forward, z: FloatArray, k: Any, link: ThresholdLink) -> FloatArray:
    """``dp/dk = d / sum(d)``, ``d_i = f'(z_i - lambda)`` (from ``sum_i f(z_i - lambda) = k``), shape ``(B, n)``.

    Computed as ``exp(log d - max log d)`` normalised, so it stays accurate where every ``d_i``
    underflows (an extremely hard selection: then it concentrates on the entries nearest
    ``lambda``). Masked entries get 0. Two rows have no two-sided derivative:

    * ``k = #finite`` (every weight 1, ``lambda = -inf``): the one-sided derivative from below is
      returned, the limit of ``d / sum d`` as ``k`` rises to ``#finite``: uniform over the smallest
      finite entries for ``thre-exp``, ``thre-clip`` and ``thre-cube`` (only they stay below 1
      near the end), ``e^{-z_i} / sum_j e^{-z_j}`` for ``thre-sigmoid`` and ``thre-laplace``
      (``f'(t) ~ e^{-t}`` as ``t -> inf``);
    * an integer ``k`` where no entry is strictly inside ``0 < f < 1`` (``thre-clip``/``thre-cube``
      with every weight exactly 0 or 1, ``d = 0``): ``dp/dk`` jumps there; zeros are returned, as
      :func:`threshold_jacobian` returns the zero matrix.
    """
    t = link.t(fwd, z)
    with np.errstate(under="ignore", divide="ignore", invalid="ignore"):  # log 0 = -inf: f' = 0
        log_d = link.log_d(t)
        top = np.max(log_d, axis=1)
        ok = np.isfinite(top)
        w = np.exp(log_d - np.where(ok, top, 0.0)[:, None])
    total = w.sum(axis=1, keepdims=True)
    out = np.divide(w, total, out=np.zeros_like(w), where=ok[:, None] & (total > 0))
    full = np.flatnonzero(fwd.aux["lambda"] == -np.inf)
    if full.size:
        out[full] = _full_rows(z[full], link.full)
    return out


def threshold_log_weights(fwd: Forward, z: FloatArray, k: Any, link: ThresholdLink) -> tuple[FloatArray, FloatArray]:
    """``(log p, log(1 - p))`` from ``t = z - lambda``, accurate where ``p`` or ``1 - p`` is far below
    the smallest float64; ``(-inf, 0)`` on masked entries, ``(0, -inf)`` on the finite entries of a
    row with ``k = #finite`` (and wherever ``p`` is exactly 1)."""
    t = link.t(fwd, z)
    with np.errstate(under="ignore", divide="ignore", invalid="ignore", over="ignore"):
        log_p, log_q = link.log_pq(t)
    fin = np.isfinite(z)
    log_p = np.where(fin, log_p, -np.inf)
    log_q = np.where(fin, log_q, 0.0)
    full = np.flatnonzero(fwd.aux["lambda"] == -np.inf)
    if full.size:
        fr = fin[full]
        log_p[full] = np.where(fr, 0.0, -np.inf)
        log_q[full] = np.where(fr, -np.inf, 0.0)
    return log_p, log_q


def _stored_t(fwd: Forward, z: FloatArray) -> FloatArray:
    return fwd.aux["t"]


def _log_d_exp(t: FloatArray) -> FloatArray:
    return np.where(t < 0.0, t, -np.inf)  # the kink t = 0 counts as saturated (d = 0)


def _log_pq_exp(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    # t = min(z - lambda, 0): log p = t; log q = log(-expm1(t)) near 0, log1p(-e^t) below -log 2
    log_q = np.where(t > -_LN2, np.log(-np.expm1(t)), np.log1p(-np.exp(t)))
    return t.copy(), np.where(t < 0.0, log_q, -np.inf)


def _log_d_laplace(t: FloatArray) -> FloatArray:
    return -np.abs(t)  # log(e^{-|t|} / 2) up to the constant log 2


def _log_pq_laplace(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    above = t >= 0.0
    big = np.log1p(-0.5 * np.exp(-np.abs(t)))  # log of the larger of p and q (>= 1/2)
    small = -np.abs(t) - _LN2  # log of the smaller: e^{-|t|} / 2
    return np.where(above, big, small), np.where(above, small, big)


EXP_LINK = ThresholdLink(t=_stored_t, log_d=_log_d_exp, log_pq=_log_pq_exp, full="lowest")
LAPLACE_LINK = ThresholdLink(t=_stored_t, log_d=_log_d_laplace, log_pq=_log_pq_laplace, full="softmin")


def threshold_hooks(link: ThresholdLink) -> tuple[Callable[[Forward, FloatArray, Any], FloatArray],
                                                  Callable[[Forward, FloatArray, Any], tuple[FloatArray, FloatArray]]]:
    """``(dk, log_weights)`` of the :class:`Implementation` of a method with this link."""

    def dk(fwd: Forward, z: FloatArray, k: Any) -> FloatArray:
        return threshold_dk(fwd, z, k, link)

    def log_weights(fwd: Forward, z: FloatArray, k: Any) -> tuple[FloatArray, FloatArray]:
        return threshold_log_weights(fwd, z, k, link)

    return dk, log_weights


def threshold_vjp_k(
    dk: Callable[[Forward, FloatArray, Any], FloatArray], exact_from: float = 1e-280
) -> Callable[[Forward, FloatArray, Any, FloatArray], FloatArray]:
    """The ``vjp_k`` hook of a threshold method: ``sum_i v_i dp_i/dk = (d . v) / sum d`` per row from
    the forward's ``d`` (two reductions, no transcendental function), on the rows where that is
    what ``dk`` computes: ``sum d >= exact_from`` and ``lambda`` finite. The other rows (every ``d``
    near underflow, ``k = #finite``, and for ``thre-exp`` a threshold rounded onto an entry, where
    ``sum d < 1/2`` at an integer k) take ``dk`` itself."""

    def vjp_k(fwd: Forward, z: FloatArray, k: Any, v: FloatArray) -> FloatArray:
        d = fwd.aux["d"]
        total = d.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.einsum("bi,bi->b", d, v) / total
        slow = ~(total >= exact_from) | (fwd.aux["lambda"] == -np.inf)
        if slow.any():
            rows = np.flatnonzero(slow)
            sub = Forward(p=fwd.p[rows], q=fwd.q[rows], aux={name: a[rows] for name, a in fwd.aux.items()})
            kk = k if isinstance(k, (int, np.integer)) else np.asarray(k)[rows]
            out[rows] = np.einsum("bi,bi->b", v[rows], dk(sub, z[rows], kk))
        return out

    return vjp_k


_EXP_DK_PLAIN, _EXP_LOG_PLAIN = threshold_hooks(EXP_LINK)


def _exp_kinks(fwd: Forward, z: FloatArray, k: Any) -> tuple[np.ndarray, np.ndarray, FloatArray]:
    """``(rows, group, log_rest)``: ``thre-exp`` rows whose threshold rounded onto an entry.

    With an integer ``k`` and the mass below the ``k`` largest entries under ``e^-708`` relative,
    ``lambda = z_(k) + log1p(rest)`` rounds to ``z_(k)`` itself: its group (the smallest of the ``k``
    entries with ``t = 0``, ties included, ``g`` of them) looks saturated, while in fact
    ``q = rest / g`` there (``sum p = k``) and ``dp/dk`` sits on it. ``group`` marks those entries
    and ``log_rest = log sum_{t<0} e^t - log g`` per row.
    """
    t = fwd.aux["t"]
    kk = np.broadcast_to(np.asarray(k, dtype=np.float64), (z.shape[0],))
    at_zero = (t == 0.0) & np.isfinite(z)
    rows = np.flatnonzero((fwd.aux["lambda"] > -np.inf) & (kk == np.floor(kk)) & (at_zero.sum(axis=1) == kk))
    if rows.size == 0:
        return rows, np.zeros((0, z.shape[1]), dtype=bool), np.zeros(0)
    zr, zero = z[rows], at_zero[rows]
    low = np.min(np.where(zero, zr, np.inf), axis=1, keepdims=True)
    group = zero & (zr == low)
    below = np.where(t[rows] < 0.0, t[rows], -np.inf)
    top = np.max(below, axis=1, keepdims=True)
    with np.errstate(under="ignore", divide="ignore", invalid="ignore"):
        log_rest = (top[:, 0] + np.log(np.exp(below - np.where(np.isfinite(top), top, 0.0)).sum(axis=1))
                    - np.log(group.sum(axis=1)))
    return rows, group, log_rest


def _exp_dk(fwd: Forward, z: FloatArray, k: Any) -> FloatArray:
    """:func:`threshold_dk` for ``thre-exp``, with the rows of :func:`_exp_kinks` taken as they are
    (the group that rounded onto the threshold carries ``dp/dk``, ``d = p ~ 1`` there)."""
    out = _EXP_DK_PLAIN(fwd, z, k)
    rows, group, _ = _exp_kinks(fwd, z, k)
    if rows.size:
        t = fwd.aux["t"][rows]
        with np.errstate(under="ignore"):
            w = np.where(group, 1.0, np.where(t < 0.0, np.exp(t), 0.0))
        out[rows] = w / w.sum(axis=1, keepdims=True)
    return out


def _exp_log_weights(fwd: Forward, z: FloatArray, k: Any) -> tuple[FloatArray, FloatArray]:
    """:func:`threshold_log_weights` for ``thre-exp``; on the rows of :func:`_exp_kinks` the group at
    the threshold gets ``log q = log(rest / g)`` (far below the smallest float64) and
    ``log p = log1p(-q)``."""
    log_p, log_q = _EXP_LOG_PLAIN(fwd, z, k)
    rows, group, log_rest = _exp_kinks(fwd, z, k)
    if rows.size:
        with np.errstate(under="ignore"):
            lq = np.broadcast_to(log_rest[:, None], group.shape)
            log_q[rows] = np.where(group, lq, log_q[rows])
            log_p[rows] = np.where(group, np.log1p(-np.exp(lq)), log_p[rows])
    return log_p, log_q


_EXP_DK, _EXP_LOG = _exp_dk, _exp_log_weights
_LAPLACE_DK, _LAPLACE_LOG = threshold_hooks(LAPLACE_LINK)

THRE_EXP = Implementation(
    forward=thre_exp_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True,
    refine=thre_exp_refine, row_k=True, dk=_EXP_DK, log_weights=_EXP_LOG,
    vjp_k=threshold_vjp_k(_EXP_DK, exact_from=0.5),  # sum d = k - #saturated >= 1 at an integer k
)
THRE_LAPLACE = Implementation(
    forward=thre_laplace_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True,
    row_k=True, dk=_LAPLACE_DK, log_weights=_LAPLACE_LOG, vjp_k=threshold_vjp_k(_LAPLACE_DK),
)
