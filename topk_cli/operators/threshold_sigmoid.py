"""The ``thre-sigmoid`` operator: ``p = sigmoid(z - lambda)`` with ``sum p = k`` (LML).

Axis convention and the shared threshold machinery (partial sort, closed-form ``thre-laplace``
threshold used as the start, Jacobian and VJP) are in :mod:`topk_cli.operators.threshold`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.operators.threshold import (
    ThresholdLink,
    _fill_saturated,
    _grouped,
    _kr,
    _laplace_start,
    _select,
    laplace_sort_size,
    sort_size,
    threshold_hooks,
    threshold_jacobian,
    threshold_vjp,
    threshold_vjp_k,
)

_LOG2 = float(np.log(2.0))
_EPS = float(np.finfo(np.float64).eps)

#: Iteration cap of the sigmoid solver (bisection alone needs ~60 steps on its bracket).
SIGMOID_MAX_ITER = 100


def _sigmoid_parts(t: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(sigmoid(t), sigmoid(-t), sigmoid'(t))`` without overflow, from one ``exp(-|t|)``."""
    with np.errstate(under="ignore", invalid="ignore"):  # e = 0 far from lambda; t = -inf masked
        e = np.abs(t)
        np.negative(e, out=e)
        np.exp(e, out=e)
        r = np.add(e, 1.0)
        np.reciprocal(r, out=r)  # 1 / (1 + e)
        small = np.multiply(e, r, out=e)
        d = small * r
    pos = t >= 0
    return _select(pos, r, small), _select(pos, small, r), d


def _sigmoid_residual(a: FloatArray, zr: FloatArray, delta: FloatArray, delta0: FloatArray,
                      direct: np.ndarray, rows: np.ndarray, k: Any) -> tuple[FloatArray, FloatArray]:
    """``(sum p - k, sum p q)`` over the top ``2k`` of ``rows`` at ``delta`` (see
    :func:`thre_sigmoid_forward`): ``a = e^{zr - delta0}`` on rows not ``direct``, ``zr - delta``
    on direct ones.

    The residual ``(#{t >= 0} - k) + sum_{t<0} p - sum_{t>=0} q`` adds only terms below 1/2,
    so it does not cancel when many ``p`` are close to 1.
    """
    resid = np.empty(rows.size)
    slope = np.empty(rows.size)
    fast = ~direct[rows]
    if fast.any():
        sel = rows[fast]
        a_sel = a if sel.size == a.shape[0] else a[sel]
        u = np.exp(delta[sel] - delta0[sel])[:, None]
        # w = min(p, q) = min(a, u) / (a + u) <= 1/2 on every entry: q where t >= 0, p below.
        w = np.minimum(a_sel, u)
        den = np.add(a_sel, u)
        np.divide(w, den, out=w)
        up = a_sel >= u
        total = w.sum(axis=1)
        w_up = np.multiply(w, up, out=den).sum(axis=1)
        # (#{t >= 0} - k) + sum_{t<0} p - sum_{t>=0} q, every term below 1/2 in size
        resid[fast] = (np.count_nonzero(up, axis=1) - _kr(k, sel)) + ((total - w_up) - w_up)
        # p q = w (1 - w) on every entry; w <= 1/2 keeps the difference within a factor 2
        slope[fast] = total - np.einsum("ij,ij->i", w, w)
    if not fast.all():
        sel = rows[~fast]
        t = zr[sel] - delta[sel, None]
        pa, qa, da = _sigmoid_parts(t)
        up = t >= 0
        resid[~fast] = (up.sum(axis=1) - _kr(k, sel)) + (np.where(up, 0.0, pa).sum(axis=1)
                                                        - np.where(up, qa, 0.0).sum(axis=1))
        slope[~fast] = da.sum(axis=1)
    return resid, slope


def _tail_sums(y: FloatArray, gap: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sum w, sum w^2)`` per row of ``w = y / (y + e^gap)`` (``y >= 0``).

    Rows with ``gap > 700`` (``e^gap`` near overflow) take ``w = m / (1 + m)``, ``m = y e^-gap``.
    """
    big = gap > 700.0
    with np.errstate(under="ignore"):
        if not big.any():
            w = np.add(y, np.exp(gap)[:, None])
            np.divide(y, w, out=w)
        else:
            w = np.multiply(y, np.exp(-gap)[:, None])
            w /= w + 1.0
            rows = np.flatnonzero(~big)
            if rows.size:
                w_small = np.add(y[rows], np.exp(gap[rows])[:, None])
                np.divide(y[rows], w_small, out=w_small)
                w[rows] = w_small
    return w.sum(axis=1), np.einsum("ij,ij->i", w, w)


#: Newton steps on the tail model before the exact solve (the model root is reached in 3-5).
MODEL_MAX_ITER = 6


def _tail_model(y: FloatArray, t0: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(w0, w1, y1)``: ``sum_i y_i / (y_i + v) ~ w0 / v + w1 / (y1 + v)`` for every ``v > 0``.

    The two-node Gauss-Radau rule (one node fixed at 0) for the measure with mass ``y_i`` at
    ``y_i``: it matches ``T0 = sum y``, ``T1 = sum y^2``, ``T2 = sum y^3``, so the error is of
    order ``(y / v)^3`` relative. ``w0 = T0 - T1^2 / T2 >= 0`` (Cauchy-Schwarz), ``y1 = T2 / T1``.
    """
    y2 = np.multiply(y, y)
    t1 = y2.sum(axis=1)
    t2 = np.einsum("ij,ij->i", y2, y)
    ok = t2 > 0
    w1 = np.where(ok, t1 * t1 / np.where(ok, t2, 1.0), 0.0)
    y1 = np.where(ok, t2 / np.where(t1 > 0, t1, 1.0), 1.0)
    return np.maximum(t0 - w1, 0.0), w1, y1


def thre_sigmoid_forward(z: FloatArray, k: Any) -> Forward:
    """``p = sigmoid(z - lambda)`` with ``sum p = k``, lambda by safeguarded Newton (LML).

    Solves ``max_{p in D(n,k)} <p, z> + sum H(p_i)`` (binary entropy ``H``). The Laplace CDF
    ``F`` brackets the sigmoid: ``F(t - log 2) <= sigmoid(t) <= F(t + log 2)``, so the
    ``thre-laplace`` threshold ``lambda_F`` (closed form) gives the start and a bracket
    ``lambda in [lambda_F - log 2, lambda_F + log 2]`` for any spread. Newton runs on
    ``delta = lambda - ref`` (``ref`` an entry of ``z`` next to ``lambda_F``), every row at once;
    a step leaving the bracket is replaced by bisection. The residual
    ``sum p - k = (#{t >= 0} - k) + sum_{t<0} p - sum_{t>=0} q`` adds only terms below 1/2, so it
    does not cancel when many ``p`` are close to 1. Iteration stops after taking a step
    below ``8 eps (1 + |delta|)`` (or at a zero residual, or a bracket of width 0), so
    ``delta`` is accurate to a few ulps, ``p`` to a few ulps relatively, and ``|sum p - k|`` is a
    few ulps of ``k``. The iteration starts at the root of a cheap model (the top ``2k`` exactly,
    the others by a Gauss-Radau rule, :func:`_tail_model`), which only moves the first iterate
    inside the bracket. Typical: 1-2 exact evaluations; cap :data:`SIGMOID_MAX_ITER`.

    Cost: the Laplace start (a partial sort of the top ``2k`` and one ``exp`` pass over the
    others, ``y = e^{z - s_2k}``), a few divisions per entry and step, one ``exp`` pass for the
    weights. The root is at or above the ``2k``-th largest entry ``s_2k`` (below it the top
    ``2k`` alone would sum to more than ``k``), so every entry outside the top ``2k`` has
    ``t <= 1/2`` on the bracket and takes ``p = y / (y + e^{lambda - s_2k})`` from the Laplace
    start's own ``exp`` pass: one addition, one division and two sums per step.

    ``k``: an ``int``, or a ``(B,)`` array of real ``k`` per row (rows grouped by the size of their
    partial sort, at least ``ceil(2k)``: ``sort_size``; the residual takes each row's own ``k``).

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q = sigmoid(lambda - z) (B, n)``;
    ``aux["lambda"], aux["d"], aux["iterations"]``, ``aux["ref"], aux["delta"]`` (per row:
    ``z - lambda = (z - ref) - delta``, as the weights were computed).

    >>> np.round(thre_sigmoid_forward(np.array([[0.0, 0.0, -1.0]]), 2).p, 4)
    array([[0.7426, 0.7426, 0.5148]])
    """
    if isinstance(k, np.ndarray):
        sizes = sort_size(laplace_sort_size(k), k, z.shape[1])
        ref, delta, sat_rows, iters = _grouped(z, k, sizes, _sigmoid_solve)
    else:
        ref, delta, sat_rows, iters = _sigmoid_solve(z, k, None)
    return _sigmoid_weights(z, ref, delta, sat_rows, iters)


def _sigmoid_solve(z: FloatArray, k: Any, size: int | None) -> tuple[FloatArray, FloatArray, np.ndarray, FloatArray]:
    """``(ref, delta, saturated_rows, iterations)`` of :func:`thre_sigmoid_forward`'s threshold."""
    b = z.shape[0]
    start = _laplace_start(z, k, size)
    sat_rows = start.saturated
    ref = np.where(np.isfinite(start.ref), start.ref, 0.0)
    delta0 = np.where(np.isfinite(start.delta), start.delta, 0.0)
    half_width = _LOG2 + 0.01 + 1e-12 * np.abs(delta0)
    lo, hi = delta0 - half_width, delta0 + half_width
    delta = delta0.copy()
    top, y = start.top, start.tail_exp
    has_tail = y.shape[1] > 0
    # The entries outside the top 2k: y = e^{z - shift} with shift = s_2k (0 for rows whose
    # top holds masked entries: then y = 0 and v = 1 below gives w = 0).
    tail_rows = np.isfinite(start.s_last)
    shift = np.where(tail_rows, start.s_last, 0.0)
    gap = ref - shift
    if has_tail:
        # lambda >= s_2k: a bracket end half a unit below keeps every tail term w <= 0.63
        with np.errstate(invalid="ignore"):
            lo = np.where(tail_rows, np.maximum(lo, -gap - 0.5), lo)
    zr = top - ref[:, None]  # exact for entries within a factor 2 of ref (Sterbenz)
    # One exp pass over the top 2k for the whole solve: with a_i = e^{zr_i - delta0} and
    # u = e^{delta - delta0} (in [0.49, 2.04] on the bracket), sigmoid(zr_i - delta) = a_i / (a_i + u)
    # and its complement u / (a_i + u): each Newton step costs divisions, not exponentials.
    # Every term is evaluated to full precision (down to underflow), in the top and in the tail
    # alike, so the residual stays consistent when every term is as small as e^-700. Rows
    # where a top entry lies more than 700 above lambda_F (a_i would overflow) and rows whose
    # bracket is wide (|delta0| > 1e11, spreads beyond float64's relative resolution) take
    # sigmoid(zr - delta) from e^{-|t|} at each step, on their top 2k only.
    #
    # Rows where every term is below e^-700 at lambda_F (|z_i - lambda_F| > 700 for every
    # entry) keep lambda_F: there the sigmoid's equation sum_{t<0} e^t (1 + O(e^t)) =
    # sum_{t>0} e^-t (1 + O(e^-t)) is the Laplace one up to a relative e^-700, and its terms
    # would be subnormal numbers.
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        a = np.subtract(zr, delta0[:, None])
        direct = (half_width > 1.0) | (np.max(a, axis=1) > 700.0)
        all_far = (np.min(np.abs(a), axis=1) > 700.0) & ~sat_rows
        np.exp(a, out=a)  # inf only on direct rows, which do not read it
    if all_far.any() and has_tail:
        rows = np.flatnonzero(all_far & tail_rows)  # the tail's terms are y_i e^{-(lambda_F - s_2k)}
        with np.errstate(under="ignore", over="ignore"):
            all_far[rows] = np.max(y[rows], axis=1) < np.exp(gap[rows] + delta0[rows] - 700.0)
    active = np.flatnonzero(~(sat_rows | all_far))
    if has_tail:
        # A start near the root: Newton on the exact top 2k plus a model of the tail built from
        # three more sums over it. Its root is typically 1e-4 or closer to the true one, so the
        # exact solve below needs 2-3 evaluations instead of 5-6. The model only moves the
        # start within the bracket; the exact solve and its stopping rule are unchanged.
        w0, w1, y1 = _tail_model(y, start.t0)
        rows = active
        for _ in range(MODEL_MAX_ITER):
            if rows.size == 0:
                break
            resid, slope = _sigmoid_residual(a, zr, delta, delta0, direct, rows, k)
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # v = inf: 0
                v = np.where(tail_rows[rows], np.exp(gap[rows] + delta[rows]), 1.0)
                w_far = w1[rows] / (y1[rows] + v)
                resid += w0[rows] / v + w_far
                slope += w0[rows] / v + w_far / (1.0 + y1[rows] / v)
                step = resid / slope
            cur = delta[rows]
            new = cur + step
            inside = np.isfinite(new) & (new > lo[rows]) & (new < hi[rows])
            delta[rows] = np.where(inside, new, cur)
            rows = rows[inside & (np.abs(step) > 1e-4 * (1.0 + np.abs(cur)))]  # then ~1e-8 from its root
    iters = np.where(all_far, 1.0, 0.0)  # a zero residual at the start counts as one evaluation
    for it in range(1, SIGMOID_MAX_ITER + 1):
        if active.size == 0:
            break
        resid, slope = _sigmoid_residual(a, zr, delta, delta0, direct, active, k)
        if has_tail:
            # rows without tail (y = 0) take e^0 = 1
            s1, s2 = _tail_sums(y if active.size == b else y[active],
                                np.where(tail_rows[active], gap[active] + delta[active], 0.0))
            resid += s1
            slope += s1 - s2  # p q = w (1 - w)
        iters[active] = it
        lo[active] = np.where(resid > 0, delta[active], lo[active])
        hi[active] = np.where(resid < 0, delta[active], hi[active])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # slope 0: bisect
            step = resid / slope
        cur = delta[active]
        new = cur + step
        tol = 8 * _EPS * (1.0 + np.abs(cur))
        # Certified last step: |G''| <= |G'| for the sigmoid and G' changes by at most a factor
        # e^h over a distance h, so the Newton point cur + step is within ~step^2 / 2 of the root;
        # step^2 <= tol / 4 puts it within tol / 8, and no further evaluation is needed.
        small = step * step <= 0.25 * tol
        inside = np.isfinite(new) & (new > lo[active]) & (new < hi[active])
        new = np.where(inside | small, new, 0.5 * (lo[active] + hi[active]))
        # a step at the ulp level is taken and ends the solve: the weights are evaluated once,
        # at the final delta, after the loop
        done = (resid == 0) | small | (new == cur) | (hi[active] - lo[active] <= tol)
        delta[active] = np.where(done & ~small, cur, new)
        active = active[~done]
    return ref, delta, sat_rows, iters


def _sigmoid_weights(z: FloatArray, ref: FloatArray, delta: FloatArray, sat_rows: np.ndarray,
                     iters: FloatArray) -> Forward:
    """The weights at the solution from ``t = (z - ref) - delta``: ``a = e^t``, ``q = 1 / (1 + a)``,
    ``p = a q`` (relative accuracy of a few ulps for both). Rows where some ``t`` exceeds 700 (``a``
    would overflow) take ``sigmoid(t)`` from ``e^{-|t|}``. The choice is made per row, so a row's
    weights do not depend on the other rows of its batch."""
    t = np.subtract(z, ref[:, None])
    t -= delta[:, None]
    wide = np.flatnonzero(-ref - delta > 700.0)  # t of the row maximum (0) is -ref - delta
    if wide.size:
        p_w, q_w, d_w = _sigmoid_parts(t[wide])
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):  # wide rows are replaced
        np.exp(t, out=t)
        q = np.add(t, 1.0)
        np.reciprocal(q, out=q)
        p = np.multiply(t, q, out=t)
        d = p * q
    if wide.size:
        p[wide], q[wide], d[wide] = p_w, q_w, d_w
    lam = ref + delta
    _fill_saturated(z, sat_rows, p, q, d, lam)
    return Forward(p=p, q=q, aux={"lambda": lam, "d": d, "iterations": iters, "ref": ref, "delta": delta})


def _sigmoid_t(fwd: Forward, z: FloatArray) -> FloatArray:
    """``z - lambda`` as :func:`_sigmoid_weights` computed it."""
    t = np.subtract(z, fwd.aux["ref"][:, None])
    t -= fwd.aux["delta"][:, None]
    return t


def _log_d_sigmoid(t: FloatArray) -> FloatArray:
    a = -np.abs(t)
    return a - 2.0 * np.log1p(np.exp(a))  # log(e^{-|t|} / (1 + e^{-|t|})^2)


def _log_pq_sigmoid(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    return -np.logaddexp(0.0, -t), -np.logaddexp(0.0, t)  # -log(1 + e^{-t}), -log(1 + e^t)


SIGMOID_LINK = ThresholdLink(t=_sigmoid_t, log_d=_log_d_sigmoid, log_pq=_log_pq_sigmoid, full="softmin")
_SIGMOID_DK, _SIGMOID_LOG = threshold_hooks(SIGMOID_LINK)

THRE_SIGMOID = Implementation(
    forward=thre_sigmoid_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True,
    row_k=True, dk=_SIGMOID_DK, log_weights=_SIGMOID_LOG, vjp_k=threshold_vjp_k(_SIGMOID_DK),
)
