"""Sparse threshold top-k: ``p = clip(z - lambda, 0, 1) ** r`` with ``sum p = k`` (``r`` = 1 or 3).

Axis convention: every function acts on a validated ``(B, n)`` batch ``z`` (see ``_base``): the
largest finite entry of each row is 0, masked entries are ``-inf``.

Both methods solve a regularised linear program over the capped simplex
``D(n, k) = {0 <= p <= 1, sum p = k}``::

    p = argmax_{p in D(n,k)}  <p, z> - (1/q) sum_i p_i^q

* ``thre-clip`` (``q = 2``, ``r = 1``): the Euclidean projection of ``z`` onto ``D(n, k)``,
  ``p = clip(z - lambda, 0, 1)``. At ``k = 1`` it is sparsemax (Martins & Astudillo 2016); it is
  entmax's ``budget_bisect`` and Sander et al. (2023)'s top-k mask with ``p = 2``.
* ``thre-cube`` (``q = 4/3``, ``r = 1/(q - 1) = 3``): ``p = clip(z - lambda, 0, 1)^3``, the
  ``p = 4/3`` member of Sander et al. (2023)'s p-norm family (their default). The KKT conditions
  of the problem above give ``p_i^{q-1} = z_i - lambda`` on the free set with no constant factor;
  a regulariser written ``||p||_q^q`` instead of ``(1/q) ||p||_q^q`` is the same map at the
  temperature ``tau * q``.

Both are exactly sparse (``p_i = 0`` once ``z_i <= lambda``). ``thre-clip`` is piecewise linear
(C0); ``thre-cube`` is C1 where entries leave 0 (``d/dt t^3 = 0`` at ``t = 0``) but has a kink
where an entry saturates at 1 (the derivative of ``t^3`` is 3 there, that of the cap 0), so it is
C0 as soon as an entry saturates while others are free.

Algorithm (exact, no tolerance): ``G(lambda) = sum_i clip(z_i - lambda, 0, 1)^r`` is continuous and
non-increasing, with breakpoints at ``z_i`` (entry ``i`` leaves 0) and ``z_i - 1`` (it reaches 1).
Only the candidates take part in the search: ``lambda > s_{k+1} - 1`` (``s_{k+1}`` the (k+1)-th
largest entry), so an entry at or below ``s_{k+1} - 1`` weighs 0 and has no breakpoint at or above
the root's interval; one ``np.partition`` keeps the largest ``m`` entries (``m = max(2k + 2, k + 32)``,
quadrupled for a row where that may miss one). Their breakpoints are sorted and a vectorised binary
search finds the interval holding the root (``log2(2m)`` evaluations of ``G``). On that interval the free and saturated sets are fixed:
``thre-clip`` has the closed form ``lambda = ref + (sum_free (z_i - ref) + #sat - k) / #free``; for
``thre-cube`` ``sum_free (z_i - lambda)^3 = k - #sat`` is convex and decreasing in ``lambda`` and
Newton from the interval's left end increases monotonically to the root (quadratic convergence,
stopped at the ulp level). Everything is computed relative to ``ref``, the interval's left end,
so ``t = z - lambda`` keeps full precision for any offset or spread. The weights then take a
few elementwise passes over the whole batch (``c * c * c`` for the cube: within an ulp of ``c**3``,
whose libm ``pow`` cost more than an ``exp`` per entry).

Jacobian: the threshold form ``dp/dz = diag(d) - d d^T / sum(d)`` with ``d_i = r t_i^{r-1}`` on the
open free set ``0 < t_i < 1`` and ``d_i = 0`` elsewhere. At a kink (``t_i`` exactly 0 or 1) the
one-sided derivative of the clipped side is returned (the entry counts as clipped), the same
convention as ``thre-exp``'s saturated side; the zero matrix when no entry is free.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from topk_cli.operators._base import OK, FloatArray, Forward, Implementation
from topk_cli.operators.threshold import (
    ThresholdLink,
    _fill_saturated,
    _grouped,
    _kr,
    threshold_hooks,
    threshold_jacobian,
    threshold_vjp,
    threshold_vjp_k,
)

_EPS = float(np.finfo(np.float64).eps)

#: Cap on the Newton steps of ``thre-cube`` on its interval (it needs about 6 from the left end).
CUBE_MAX_ITER = 60


def _take(a: FloatArray, idx: np.ndarray) -> FloatArray:
    """``a[b, idx[b]]`` for every row ``b``."""
    return np.take_along_axis(a, idx[:, None], axis=1)[:, 0]


def _g(u: FloatArray, power: int) -> FloatArray:
    """``sum_i clip(u_i, 0, 1)^power`` per row, ``u = z - t`` (masked entries contribute 0)."""
    c = np.clip(u, 0.0, 1.0)
    return (c**power if power != 1 else c).sum(axis=1)


def _breakpoints(z: FloatArray) -> tuple[np.ndarray, np.ndarray]:
    """``(idx, off)`` of the breakpoints ``z_idx - off`` (``off`` 0 or 1), sorted descending exactly.

    ``z_i - 1`` is not representable for ``|z_i| >= 2^53`` (it rounds to ``z_i``): the breakpoints
    are kept as (entry, offset) pairs and ordered by the exact value of ``z_i - off``, written as the
    unevaluated sum ``s + e`` of TwoSum (Knuth) and sorted lexicographically on ``(s, e)``.
    """
    n = z.shape[1]
    zz = np.concatenate([z, z], axis=1)
    off = np.concatenate([np.zeros_like(z), np.ones_like(z)], axis=1)
    with np.errstate(invalid="ignore"):  # masked entries: -inf - (-inf)
        s = zz - off
        bb = s - zz
        e = (zz - (s - bb)) + (-off - bb)
    e = np.where(np.isfinite(s), e, 0.0)
    order = np.lexsort((-e, -s), axis=1)  # descending on s, then on e
    return order % n, np.take_along_axis(off, order, axis=1)


def _relative(z: FloatArray, idx: np.ndarray, off: np.ndarray) -> FloatArray:
    """``z - (z_idx - off)`` per row, computed as ``(z - z_idx) + off`` (no rounding of the breakpoint)."""
    with np.errstate(invalid="ignore"):  # masked entries: -inf
        return (z - _take(z, idx)[:, None]) + off[:, None]


def _root_interval(z: FloatArray, k: Any, power: int
                   ) -> tuple[FloatArray, FloatArray, FloatArray, np.ndarray, FloatArray, FloatArray]:
    """``(lo, u, width, exact, z_lo, o_lo)``: ``lambda`` lies in ``[lo, lo + width)``; ``exact`` rows have
    ``lambda = lo``.

    ``lo`` and ``hi`` are consecutive breakpoints (``z_i`` or ``z_i - 1``, sorted descending):
    ``G(hi) < k <= G(lo)``. The first breakpoint is the row maximum 0, where ``G = 0 < k``.
    ``u = z - lo`` and ``width = hi - lo`` are computed from the breakpoints' entries and offsets, so
    they keep full precision even where ``lo`` itself is rounded (``lo`` is returned only for
    ``lambda``); ``lo`` is the breakpoint ``z_lo - o_lo`` of entry value ``z_lo`` and offset ``o_lo``.
    """
    n_fin = np.isfinite(z).sum(axis=1)
    bidx, boff = _breakpoints(z)
    lo_idx = np.ones(z.shape[0], dtype=np.int64)  # smallest j with G(bp_j) >= k lies in [1, 2 n_fin - 1]
    hi_idx = 2 * n_fin - 1
    rows = np.flatnonzero(lo_idx < hi_idx)
    while rows.size:
        mid = (lo_idx[rows] + hi_idx[rows]) // 2
        u_mid = _relative(z[rows], _take(bidx[rows], mid), _take(boff[rows], mid))
        below = _g(u_mid, power) < _kr(k, rows)
        lo_idx[rows] = np.where(below, mid + 1, lo_idx[rows])
        hi_idx[rows] = np.where(below, hi_idx[rows], mid)
        rows = rows[lo_idx[rows] < hi_idx[rows]]
    i_lo, o_lo = _take(bidx, lo_idx), _take(boff, lo_idx)
    i_hi, o_hi = _take(bidx, lo_idx - 1), _take(boff, lo_idx - 1)
    u = _relative(z, i_lo, o_lo)
    z_lo = _take(z, i_lo)
    with np.errstate(invalid="ignore"):
        width = (_take(z, i_hi) - z_lo) - (o_hi - o_lo)
        lo = z_lo - o_lo
    exact = _g(u, power) == k
    return lo, u, width, exact, z_lo, o_lo


def _candidates(z: FloatArray, k: int) -> list[tuple[np.ndarray | None, FloatArray]]:
    """``(rows, top)`` groups: ``top`` holds, for those rows, a set of entries containing every
    entry that can be nonzero at the solution (``rows`` None: every row).

    With ``s_{k+1}`` the (k+1)-th largest entry, ``lambda > s_{k+1} - 1`` (else the k + 1 largest
    would all weigh 1 and ``G(lambda) >= k + 1``), so an entry ``<= s_{k+1} - 1`` weighs 0 and
    none of its breakpoints lies at or above the root's interval: dropping it changes neither
    ``lambda`` nor any other weight. One ``np.partition`` keeps the ``m`` largest entries; a row
    whose ``m``-th largest is not certainly below ``s_{k+1} - 1`` is tried again with ``4 m``
    (``m = n`` at the end: the whole row). ``k`` here is an integer: for a real ``k`` its floor
    (``lambda > s_{floor(k)+1} - 1`` likewise, since ``floor(k) + 1 > k``).
    """
    b, n = z.shape
    m = min(n, max(2 * k + 2, k + 32))
    rows: np.ndarray | None = None
    groups: list[tuple[np.ndarray | None, FloatArray]] = []
    while True:
        zr = z if rows is None else z[rows]
        if m >= n:
            groups.append((rows, zr))
            return groups
        top = np.partition(zr, n - m, axis=1)[:, n - m :]  # top[:, 0] is the m-th largest
        s_k1 = np.partition(top, m - k - 1, axis=1)[:, m - k - 1]
        s_m = top[:, 0]
        with np.errstate(invalid="ignore"):  # -inf - (-inf): rows with fewer than m finite entries
            # the computed gap is within half an ulp of the true one: > 1 + 4 eps means > 1
            ok = (s_m == -np.inf) | (s_k1 - s_m > 1.0 + 4 * _EPS)
        all_rows = np.arange(b) if rows is None else rows
        if ok.all():
            groups.append((rows, top))
            return groups
        if ok.any():
            groups.append((all_rows[ok], top[ok]))
        rows = all_rows[~ok]
        m = min(n, 4 * m)


def _solve(z: FloatArray, k: Any, power: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``(z_lo, o_lo, delta, lambda)`` of each row of ``z`` (or of its candidates, see :func:`_candidates`):
    ``t = ((z - z_lo) + o_lo) - delta`` for every entry."""
    lo, u, width, exact, z_lo, o_lo = _root_interval(z, k, power)
    width = np.where(exact | ~np.isfinite(width), 0.0, width)
    # t = u - delta, delta = lambda - lo in [0, width]
    mid = 0.5 * width
    with np.errstate(invalid="ignore"):  # masked entries: -inf compares False
        free = (u > mid[:, None]) & (u - mid[:, None] < 1.0)
        n_sat = (u - mid[:, None] >= 1.0).sum(axis=1)
    n_free = free.sum(axis=1)
    need = k - n_sat  # mass the free entries carry
    uf = np.where(free, u, 0.0)
    if power == 1:
        with np.errstate(divide="ignore", invalid="ignore"):  # exact rows have no free entry
            delta = (uf.sum(axis=1) - need) / n_free
    else:
        delta = np.zeros_like(lo)
        active = np.flatnonzero(~exact & (n_free > 0))
        for _ in range(CUBE_MAX_ITER):
            if active.size == 0:
                break
            s = np.where(free[active], uf[active] - delta[active, None], 0.0)
            resid = (s**3).sum(axis=1) - need[active]
            slope = 3.0 * (s * s).sum(axis=1)
            step = np.divide(resid, slope, out=np.zeros_like(resid), where=slope > 0)
            cur = delta[active]
            new = np.minimum(cur + np.maximum(step, 0.0), width[active])
            delta[active] = new
            moving = (new - cur) > 2 * _EPS * (1.0 + np.abs(new))
            active = active[moving]
    delta = np.clip(np.where(exact | ~np.isfinite(delta), 0.0, delta), 0.0, width)
    return z_lo, o_lo, delta, lo + delta


def _weights(z: FloatArray, z_lo: FloatArray, o_lo: FloatArray, delta: FloatArray,
             power: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(p, q, d)`` from the threshold, elementwise, in place where possible."""
    with np.errstate(invalid="ignore"):  # rows with exactly k finite entries: overwritten later
        t = np.subtract(z, z_lo[:, None])
        t += o_lo[:, None]
        t -= delta[:, None]
        inside = t > 0.0
        inside &= t < 1.0  # masked entries: t = -inf, outside
    c = np.clip(t, 0.0, 1.0, out=t)
    if power == 1:
        p = c
        q = np.subtract(1.0, c)
        d = inside.astype(np.float64)
    else:
        c2 = np.multiply(c, c)
        p = np.multiply(c2, c)  # c * c * c: within an ulp of c**3, which costs a libm pow per entry
        q = np.add(c2, c)
        q += 1.0
        one_minus = np.subtract(1.0, c)
        q *= one_minus  # 1 - c^3 = (1 - c)(1 + c + c^2) without cancellation near c = 1
        d = np.multiply(c, 3.0, out=c2)  # (3 c) c, the order of the derivative's earlier formula
        d *= c
        d *= inside
    return p, q, d


def _projection_threshold(z: FloatArray, k: Any, k_floor: int, power: int) -> tuple[np.ndarray, ...]:
    """``(z_lo, o_lo, delta, lambda, total, saturated_rows)`` of every row (``total``: the sum of
    the weights over the candidates); ``k_floor = floor(k)`` for every row."""
    b = z.shape[0]
    z_lo = np.empty(b)
    o_lo = np.empty(b)
    delta = np.empty(b)
    lam = np.empty(b)
    total = np.empty(b)  # sum of the weights, from the candidates (every other entry weighs 0)
    sat_rows = np.empty(b, dtype=bool)
    for rows, top in _candidates(z, k_floor):
        sel = slice(None) if rows is None else rows
        kr = k if rows is None else _kr(k, rows)
        zl, ol, de, la = _solve(top, kr, power)
        z_lo[sel], o_lo[sel], delta[sel], lam[sel] = zl, ol, de, la
        pt = _weights(top, zl, ol, de, power)[0]
        fin = np.isfinite(top)
        total[sel] = np.where(fin, pt, 0.0).sum(axis=1)
        # exactly k finite entries: the candidates hold the k + 1 largest, so all of them
        sat_rows[sel] = fin.sum(axis=1) == kr
    return z_lo, o_lo, delta, lam, total, sat_rows


def _projection_forward(z: FloatArray, k: Any, power: int) -> Forward:
    """Shared forward of ``thre-clip`` (``power = 1``) and ``thre-cube`` (``power = 3``).

    The threshold is solved on the candidates only (:func:`_candidates`: one partial sort); the
    weights then take a few elementwise passes over the batch. ``k``: an ``int``, or a ``(B,)``
    array of real ``k`` per row (rows grouped by ``floor(k)``, which sizes their candidates).
    ``aux`` holds ``lambda``, ``d`` and, per row, ``z_lo``, ``o_lo``, ``delta`` with
    ``z - lambda = ((z - z_lo) + o_lo) - delta`` as the weights were computed.
    """
    n = z.shape[1]
    if isinstance(k, np.ndarray):
        def solve(zz: FloatArray, kk: Any, k_floor: int) -> tuple[np.ndarray, ...]:
            return _projection_threshold(zz, kk, k_floor, power)

        z_lo, o_lo, delta, lam, total, sat_rows = _grouped(z, k, np.floor(k).astype(np.int64), solve)
    else:
        z_lo, o_lo, delta, lam, total, sat_rows = _projection_threshold(z, k, k, power)
    p, q, d = _weights(z, z_lo, o_lo, delta, power)
    _fill_saturated(z, sat_rows, p, q, d, lam)
    aux = {"lambda": lam, "d": d, "z_lo": z_lo, "o_lo": o_lo, "delta": delta}
    # a row whose weights miss sum p = k (beyond the rounding of the sum) is never returned "ok"
    slack = 8.0 * _EPS * k * max(n, 1)
    with np.errstate(invalid="ignore"):
        bad = ~sat_rows & ~(np.abs(total - k) <= slack)
    if not bad.any():
        return Forward(p=p, q=q, aux=aux)
    code = np.where(bad, "no-convergence", OK).astype("<U16")
    messages = {int(r): f"the weights sum to {p[r].sum()!r}, not k = {_kr(k, r)}" for r in np.flatnonzero(bad)}
    return Forward(p=p, q=q, code=code, messages=messages, aux=aux)


def thre_clip_forward(z: FloatArray, k: Any) -> Forward:
    """``p = clip(z - lambda, 0, 1)`` with ``sum p = k``: the Euclidean projection onto ``D(n, k)``.

    Solves ``max_{p in D(n,k)} <p, z> - ||p||^2 / 2``; exact (sorted breakpoints, then a closed
    form on the root's interval). At ``k = 1`` it is sparsemax.

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q = 1 - p (B, n)``; ``aux["lambda"], aux["d"]``.

    >>> thre_clip_forward(np.array([[0.0, -0.5, -3.0]]), 1).p
    array([[0.75, 0.25, 0.  ]])
    """
    return _projection_forward(z, k, 1)


def thre_cube_forward(z: FloatArray, k: Any) -> Forward:
    """``p = clip(z - lambda, 0, 1)^3`` with ``sum p = k``: Sander et al.'s p = 4/3 top-k mask.

    Solves ``max_{p in D(n,k)} <p, z> - (3/4) sum p_i^{4/3}``; exact interval search, then
    monotone Newton on the root's interval to the ulp level.

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q = 1 - p (B, n)``; ``aux["lambda"], aux["d"]``.

    >>> np.round(thre_cube_forward(np.array([[0.0, -0.5, -3.0]]), 1).p, 4)
    array([[0.8993, 0.1007, 0.    ]])
    """
    return _projection_forward(z, k, 3)


def f_clip(t: FloatArray) -> FloatArray:
    """``clip(t, 0, 1)``, the link of ``thre-clip`` (for references that bisect on lambda)."""
    return np.clip(t, 0.0, 1.0)


def f_cube(t: FloatArray) -> FloatArray:
    """``clip(t, 0, 1)^3``, the link of ``thre-cube``."""
    return np.clip(t, 0.0, 1.0) ** 3


def _projection_t(fwd: Forward, z: FloatArray) -> FloatArray:
    """``z - lambda`` as :func:`_weights` computed it (before clipping)."""
    with np.errstate(invalid="ignore"):  # masked entries: -inf
        t = np.subtract(z, fwd.aux["z_lo"][:, None])
        t += fwd.aux["o_lo"][:, None]
        t -= fwd.aux["delta"][:, None]
    return t


def _log_d_clip(t: FloatArray) -> FloatArray:
    return np.where((t > 0.0) & (t < 1.0), 0.0, -np.inf)  # d = 1 on the open free set


def _log_d_cube(t: FloatArray) -> FloatArray:
    return np.where((t > 0.0) & (t < 1.0), 2.0 * np.log(np.clip(t, 0.0, 1.0)), -np.inf)  # 3 t^2 up to log 3


def _log_pq_clip(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    c = np.clip(t, 0.0, 1.0)
    return np.log(c), np.log1p(-c)  # exact zeros give -inf


def _log_pq_cube(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    c = np.clip(t, 0.0, 1.0)
    # p = c^3 (below the smallest float64 already at c = 1e-103); 1 - c^3 = (1 - c)(1 + c + c^2)
    return 3.0 * np.log(c), np.log1p(-c) + np.log1p(c + c * c)


CLIP_LINK = ThresholdLink(t=_projection_t, log_d=_log_d_clip, log_pq=_log_pq_clip, full="lowest")
CUBE_LINK = ThresholdLink(t=_projection_t, log_d=_log_d_cube, log_pq=_log_pq_cube, full="lowest")
_CLIP_DK, _CLIP_LOG = threshold_hooks(CLIP_LINK)
_CUBE_DK, _CUBE_LOG = threshold_hooks(CUBE_LINK)

THRE_CLIP = Implementation(
    forward=thre_clip_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True,
    row_k=True, dk=_CLIP_DK, log_weights=_CLIP_LOG, vjp_k=threshold_vjp_k(_CLIP_DK),
)
THRE_CUBE = Implementation(
    forward=thre_cube_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True,
    row_k=True, dk=_CUBE_DK, log_weights=_CUBE_LOG, vjp_k=threshold_vjp_k(_CUBE_DK),
)
