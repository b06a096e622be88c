"""The violation of one property on one case: ``_v_<property>(ev, method, x, k, tau) -> _Measure``.

Each returns None when the property does not apply to the case, a failed measure when the
method refused the case, else the size of the violation (0 = fine) and a sentence. A
Monte-Carlo method's measures carry a ``slack`` (its standard errors) that the driver adds to
the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from topk_cli.api import get_method, jacobian
from topk_cli.errors import NumericalFailureError
from topk_cli.operators._base import FloatArray
from topk_cli.properties.evaluator import Evaluator, _failed, _hard, _softmax, _z
from topk_cli.properties.results import (
    _FD_STEP,
    HARD_LIMIT_TAU_OVER_GAP,
    TOL_JACOBIAN,
    UNDERFLOW_SPAN,
    _fmt,
    _Measure,
    _vec,
)

_Violation = Callable[[Evaluator, str, FloatArray, Any, float], "_Measure | None"]


def _v_range(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    r = ev.row(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p, q = r.weights[0], r.complement[0]
    below, above = -float(p.min()), max(float(p.max()) - 1.0, -float(q.min()))
    if below >= above:
        value = max(0.0, below)
        i = int(np.argmin(p))
        detail = f"p[{i}] = {p[i]:.6g} < 0" if value > 0 else ""
        return _Measure(value, detail=detail, slack=ev.slack(method, r))
    value = max(0.0, above)
    detail = ""
    if value > 0:  # the sentence is only read for a violation (value > tolerance + slack >= 0)
        i = int(np.argmax(p - 1.0)) if float(p.max()) - 1.0 >= -float(q.min()) else int(np.argmin(q))
        detail = f"p[{i}] = {p[i]:.6g} > 1 (p = {_vec(p)})"
    return _Measure(value, detail=detail, slack=ev.slack(method, r))


def _v_sum(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    r = ev.row(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    s = float(r.weights[0].sum())
    slack = ev.slack(method, r) * x.shape[-1] / k  # relative to k, like the value
    value = abs(s - k) / k
    return _Measure(value, detail=f"sum p = {s:.17g}, not k = {k}" if value > 0 else "", slack=slack)


def _ordered_pairs(z: FloatArray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) with z_i > z_j resolvable in float64 (finite entries only)."""
    idx = np.flatnonzero(np.isfinite(z))
    zi, zj = z[idx][:, None], z[idx][None, :]
    scale = np.maximum(1.0, np.maximum(np.abs(zi), np.abs(zj)))
    i, j = np.nonzero(zi - zj > 1e-9 * scale)
    return idx[i], idx[j]


def _v_monotone_weak(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    n = x.shape[-1]
    if n < 2:
        return None
    r = ev.row(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p = np.asarray(r.weights[0], dtype=np.float64)
    z = _z(x, tau)
    finite = np.isfinite(z)
    if finite.all():  # the common case: the same pairs without the gathers
        idx = np.arange(n)
        zf, pf = z, p
    else:
        idx = np.flatnonzero(finite)
        zf, pf = z[idx], p[idx]
    drop = np.where(zf[:, None] > zf[None, :], pf[None, :] - pf[:, None], -np.inf)
    if not np.isfinite(drop).any():
        return None
    a, b = np.unravel_index(int(np.argmax(drop)), drop.shape)
    value = max(0.0, float(drop[a, b]))
    if not value > 0:  # the sentence is only read for a violation (value > tolerance + slack >= 0)
        return _Measure(value, slack=2 * ev.slack(method, r))
    i, j = int(idx[a]), int(idx[b])
    return _Measure(
        value,
        slack=2 * ev.slack(method, r),
        detail=f"x[{i}] = {_fmt(x[i])} > x[{j}] = {_fmt(x[j])} but p[{i}] = {p[i]:.6g} < p[{j}] = {p[j]:.6g}",
    )


def _strict_pairs(x: FloatArray, k: int | float, tau: float) -> tuple[FloatArray, np.ndarray, np.ndarray] | None:
    """``(z, i, j)``, the pairs strict monotonicity is checked on, or None (it does not apply)."""
    n = int(np.isfinite(x).sum())
    if n < 2 or k >= n:
        return None
    z = _z(x, tau)
    i_idx, j_idx = _ordered_pairs(z)
    if i_idx.size == 0:
        return None
    return z, i_idx, j_idx


#: Below this complement ``1 - p`` (8 ulps of 1) a user's operator, which gives p only, may round
#: two strictly ordered weights to the same float: a tie there is saturation, not a violation.
_USER_SATURATION = 8 * 2.0**-53


def _v_monotone_strict(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    pairs = ev.memo(_strict_pairs, x, k, tau)
    if pairs is None:
        return None
    z, i_idx, j_idx = pairs
    r = ev.row(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p = r.weights[0].astype(np.float64)
    q = r.complement[0]
    pi, pj, qi, qj = p[i_idx], p[j_idx], q[i_idx], q[j_idx]
    separated = (pi > pj) | (qi < qj)
    equal = (pi == pj) & (qi == qj)
    finite_z = z[np.isfinite(z)]
    span = float(finite_z.max() - finite_z.min())
    saturated = (pi == 0.0) | (qi == 0.0)
    unresolvable = equal & saturated & (span >= UNDERFLOW_SPAN)
    if get_method(method).family == "user":
        # a user's operator gives p only: its 1 - p cannot tell apart two weights within a few ulps
        # of 1 (exact complements below 8 ulps differ by less than the operator's own rounding of p)
        unresolvable |= equal & (qi <= _USER_SATURATION)
    bad = ~separated & ~unresolvable
    if not bad.any():
        return _Measure(0.0)
    gaps = np.where(bad, x[i_idx] - x[j_idx], -np.inf)
    w = int(np.argmax(gaps))
    i, j = int(i_idx[w]), int(j_idx[w])
    if p[i] == p[j]:
        detail = f"x[{i}] = {_fmt(x[i])} > x[{j}] = {_fmt(x[j])} but p[{i}] = p[{j}] = {p[i]:.17g}"
        detail += f" and 1 - p[{i}] = {q[i]:.6g} >= 1 - p[{j}] = {q[j]:.6g}"
    else:
        detail = f"x[{i}] = {_fmt(x[i])} > x[{j}] = {_fmt(x[j])} but p[{i}] = {p[i]:.17g} < p[{j}] = {p[j]:.17g}"
    return _Measure(float(gaps[w]), detail=detail)


def _exact_shift(x: FloatArray) -> tuple[FloatArray, FloatArray, float]:
    """``(x + c, the x that float64 actually shifted, c)`` for a large c."""
    finite = np.isfinite(x)
    mag = float(np.abs(x[finite]).max()) if finite.any() else 0.0
    c = 1e6 if mag < 1e5 else -0.75 * mag
    with np.errstate(invalid="ignore"):  # -inf + c stays -inf
        y = x + c
        x_back = y - c
    return y, np.where(finite, x_back, -np.inf), c


def _shift_rows(x: FloatArray, k: int | float, tau: float) -> tuple[FloatArray, FloatArray, float]:
    """:func:`_exact_shift` in the ``(x, k, tau)`` form of :meth:`Evaluator.memo`."""
    return _exact_shift(x)


def _v_shift(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    y, x_back, c = ev.memo(_shift_rows, x, k, tau)
    r0, r1 = ev.row(method, x_back, k, tau), ev.row(method, y, k, tau)
    if r0.failures or r1.failures:
        return _failed(r0 if r0.failures else r1, tau)
    d = max(
        float(np.abs(r0.weights - r1.weights).max()), float(np.abs(r0.complement - r1.complement).max())
    ) / max(1.0, float(np.abs(r0.weights).max()))
    return _Measure(
        d, detail=f"adding c = {_fmt(c)} changes p by up to {d:.3g} (relative to max(1, |p|))" if d > 0 else "",
        slack=2 * ev.slack(method, r0, r1),
    )


def _permutations(n: int) -> list[np.ndarray]:
    """The reversal and the rotation by one, ``[n-1, 0, 1, ..., n-2]`` (what ``np.roll`` by 1 gives)."""
    rotation = np.arange(-1, n - 1)
    rotation[0] = n - 1
    return [np.arange(n)[::-1], rotation]


def _v_permutation(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    n = x.shape[-1]
    if n < 2:
        return None
    r = ev.row(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    worst = 0.0
    detail = ""
    scale = max(1.0, float(np.abs(r.weights[0]).max()))
    for perm in _permutations(n):
        rp = ev.row(method, x[perm], k, tau)
        if rp.failures:
            return _failed(rp, tau)
        d = max(
            float(np.abs(rp.weights[0] - r.weights[0][perm]).max()),
            float(np.abs(rp.complement[0] - r.complement[0][perm]).max()),
        ) / scale
        if d > worst:
            worst = d
            detail = f"permuting x by {perm.tolist()} changes the permuted p by up to {d:.3g} (relative to max(1, |p|))"
    return _Measure(worst, detail=detail, slack=2 * ev.slack(method, r))


def _kth_gap(x: FloatArray, k: int | float) -> float | None:
    """The smallest positive gap between distinct finite values when ``x_(k) > x_(k+1)``, else None.

    For a non-integer k the limit puts ``k - floor(k)`` on the ``ceil(k)``-th largest entry: it
    must stand apart from both neighbours, ``x_(j-1) > x_(j) > x_(j+1)`` with ``j = ceil(k)``.
    """
    finite = np.sort(x[np.isfinite(x)])[::-1]
    if k >= finite.size and float(k).is_integer():
        return None
    j = math.ceil(k)
    boundaries = [int(k)] if float(k).is_integer() else [b for b in (j - 1, j) if 1 <= b < finite.size]
    if not boundaries:
        return None  # a single entry: its weight is k whatever the temperature
    finite = finite - finite[0]  # the gaps the API sees after its shift
    for b in boundaries:
        gap = float(finite[b - 1] - finite[b])
        scale = max(abs(float(finite[b - 1])), abs(float(finite[b])), 1e-300)
        if gap <= 1e-12 * scale:
            return None
    gaps = -np.diff(finite)
    smallest = float(gaps[gaps > 0].min())
    small_tau = HARD_LIMIT_TAU_OVER_GAP * smallest
    if not (small_tau > 0 and math.isfinite(float(finite[-1]) / small_tau)):
        return None  # the limit's tau underflows, or z = x / tau overflows: not measurable in float64
    return smallest


def _limit_row(x: FloatArray, k: int | float, tau: float) -> tuple[float, FloatArray] | None:
    """``(small tau, the z the API computes for (x, small tau))`` of the hard-limit check, None
    where it does not apply (the ``(x, k, tau)`` form of :meth:`Evaluator.memo`; tau is unused)."""
    gap = _kth_gap(x, k)
    if gap is None:
        return None
    small = HARD_LIMIT_TAU_OVER_GAP * gap
    return small, _z(x, small)


def _v_hard_limit(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    limit = ev.memo(_limit_row, x, k, tau)
    if limit is None:
        return None
    small, z_small = limit
    r = ev.row(method, z_small, k, 1.0)  # bitwise the z the API computes for (x, small)
    if r.failures:
        f = r.failures[0]
        return _Measure(
            math.inf, detail=f"the method fails at tau = {small:.3g} ({f.code}): it cannot deliver the limit", tau=small
        )
    p = r.weights[0].astype(np.float64)
    hard = np.where(np.isfinite(x), _hard(np.where(np.isfinite(x), x, -np.inf), k), 0.0)
    err = float(np.abs(p - hard).max())
    if not err > 0:  # the sentence is only read for a violation (err > tolerance + slack >= 0)
        return _Measure(err, tau=small, slack=ev.slack(method, r))
    return _Measure(
        err,
        detail=f"at tau = {small:.3g} (1e-3 x the smallest gap) p = {_vec(np.round(p, 4))}, hard top-k = {_vec(hard)}",
        tau=small,
        extra={"limit": np.round(p, 4).tolist()},
        slack=ev.slack(method, r),
    )


def _v_softmax_k1(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    if k != 1:
        return None
    r = ev.row(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    p = r.weights[0].astype(np.float64)
    s = _softmax(_z(x, tau))
    d = float(np.abs(p - s).max())
    if not d > 0:  # the sentence is only read for a violation (d > tolerance + slack >= 0)
        return _Measure(d, slack=ev.slack(method, r))
    return _Measure(
        d, detail=f"p = {_vec(p, 6)}, softmax = {_vec(s, 6)} (max softmax weight {s.max():.4g})",
        slack=ev.slack(method, r),
    )


def _v_finite(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    r = ev.row(method, x, k, tau)
    if r.failures:
        f = r.failures[0]
        return _Measure(1.0, detail=f"{f.code}: {f.detail}")
    ok = bool(np.isfinite(r.weights).all())
    return _Measure(0.0 if ok else 1.0, detail="" if ok else "non-finite weights returned with status ok")


def _fd_stencil(x: FloatArray, tau: float) -> tuple[float, FloatArray] | None:
    """``(h, rows)`` of :func:`_v_jacobian`'s finite differences, ``rows[j, s] = x + step_s e_j``
    for the steps ``h, 2h, -h, -2h``; None where they cannot be taken exactly or safely."""
    n = x.shape[-1]
    if not _FD_STEP * tau >= 1e-300:
        return None  # tau so small that no finite-difference step is representable
    h = 2.0 ** round(math.log2(_FD_STEP * tau))  # a power of two: x_j +- h is exact
    gaps = np.diff(np.sort(x))
    if ((gaps > 0) & (gaps < 8 * h)).any():
        return None  # near-ties inside the stencil: several kinks could sit under it
    offsets = np.array([h, 2 * h, -h, -2 * h])
    rows = x[None, None, :] + offsets[None, :, None] * np.eye(n)[:, None, :]  # (n, 4, n)
    taken = np.einsum("jsj->js", rows - x[None, None, :])
    if not np.array_equal(taken, np.tile(offsets, (n, 1))):
        return None  # |x| too large for an exact step
    return h, rows


def _v_jacobian(ev: Evaluator, method: str, x: FloatArray, k: int, tau: float) -> _Measure | None:
    """Analytic Jacobian against finite differences along each coordinate ``e_j``.

    Where p is smooth along ``e_j`` (the one-sided derivatives agree) the column is compared with
    the central difference; at a kink (they disagree) with the nearer one-sided derivative,
    since the analytic Jacobian takes one side. Where p jumps along any coordinate, x is a point of
    discontinuity, p has no derivative there, and the case is not judged.
    """
    if not np.isfinite(x).all() or get_method(method).capabilities.monte_carlo:
        return None  # a Monte-Carlo estimate is not differentiated by finite differences of one seed
    r = ev.row(method, x, k, tau)
    if r.failures:
        return _failed(r, tau)
    n = x.shape[-1]
    stencil = _fd_stencil(x, tau)
    if stencil is None:
        return None
    h, rows = stencil
    fd = [ev.row(method, row, k, tau) for row in rows.reshape(4 * n, n)]
    if any(f.failures for f in fd):
        return None
    g = np.vstack([f.weights for f in fd]).astype(np.float64).reshape(n, 4, n)  # g[j, s, i] = p_i(x + step_s e_j)
    p0 = r.weights[0]
    d1p, d2p, d1m, d2m = (g[:, s, :] - p0[None, :] for s in range(4))
    jump = (np.abs(d2p - 2 * d1p) > 0.5 * np.abs(d1p) + 1e-9) | (np.abs(d2m - 2 * d1m) > 0.5 * np.abs(d1m) + 1e-9)
    jumps = jump.any(axis=1)
    if jumps.any():
        # p jumps along some coordinate: x is a point of discontinuity, where p has no derivative
        # (a tie straddling the rank where the method switches branch, e.g. the (k-1)-th and k-th
        # scores of a method that puts a hard 1 on the top k - 1). The other columns would compare
        # a one-branch Jacobian with finite differences of the tie-averaged value, neither of which
        # is a derivative of p there: not judged.
        return None
    right = (4 * d1p - d2p) / (2 * h)  # second-order one-sided differences, [j, i]
    left = -(4 * d1m - d2m) / (2 * h)
    central_h = (g[:, 0, :] - g[:, 2, :]) / (2 * h)
    central_2h = (g[:, 1, :] - g[:, 3, :]) / (4 * h)
    central = (4 * central_h - central_2h) / 3  # Richardson: O(h^4)
    uncertainty = 4 * np.abs(central_h - central_2h)  # what the differences themselves cannot resolve
    try:
        analytic = jacobian(x, k, method, tau=tau).astype(np.float64).T  # [j, i] = d p_i / d x_j
    except NumericalFailureError as exc:
        return _Measure(math.nan, failed=True, detail=f"the Jacobian failed: {exc}", tau=tau)
    scale = max(1.0, float(np.max(np.abs(analytic))) * tau)  # the tolerance is relative to max(1, |J| tau)
    kink = np.max(np.abs(right - left) - uncertainty, axis=1) * tau > TOL_JACOBIAN * scale
    err_right = np.max(np.abs(analytic - right), axis=1)
    err_left = np.max(np.abs(analytic - left), axis=1)
    ref = np.where((kink & (err_right <= err_left))[:, None], right, np.where(kink[:, None], left, central))
    excess = np.maximum(np.abs(analytic - ref) - np.where(kink[:, None], 0.0, uncertainty), 0.0)
    q0 = r.complement[0]
    near_edge = (q0 > 0) & (q0 < 8 * h / tau)  # a saturation kink (thre-exp) may sit under the stencil
    err = np.where(near_edge, 0.0, np.max(excess, axis=1) * tau / scale)
    j = int(np.argmax(err))
    i = int(np.argmax(excess[j]))
    side = " (one-sided, at a kink)" if kink[j] else ""
    return _Measure(
        float(err[j]),
        detail=f"dp[{i}]/dx[{j}]: analytic {analytic[j, i]:.6g}, finite differences{side} {ref[j, i]:.6g}",
    )
