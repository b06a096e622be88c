"""``iterative`` (Su 2019): ``k`` rounds of ``p <- p + softmax((1 - p) (z - min z))`` with ``1 - p``
accurate, and the running error estimate of :mod:`~topk_cli.operators._logsigned` (see
:mod:`~topk_cli.operators.sequential` for the method and its failure modes)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import OK, FloatArray, Forward, Implementation, _combine_rows, average_ties
from topk_cli.operators._iterative_fast import _FAST_BLOCK, _it_fast, _it_fast_block
from topk_cli.operators._logsigned import (
    _NEG_INF,
    _UNIT,
    _checked,
    _exclusive_sum,
    _lse_added,
    _rnd_log,
    _RoundingErrors,
)
from topk_cli.operators._logspace import exp_new, logsumexp


def iterative_topk(z: FloatArray, k: int) -> Forward:
    """Su's ``k`` rounds of ``p <- p + softmax((1 - p) * (z - min z))``, with ``1 - p`` accurate.

    Shapes: ``z`` is ``(B, n)`` (see ``_base``); ``p`` and ``q`` are ``(B, n)``, ``sum p = k``.
    ``p`` can exceed 1 (``k = n``); masked entries get 0. Round one is ``softmax(z)`` exactly
    (``softmax`` is shift-invariant). Rows whose estimated error exceeds
    :data:`ILL_CONDITIONED_TOLERANCE` get code ``"ill-conditioned"``.

    Rows without masked entries first go through :func:`_it_fast` (plain float64 rounds with a
    rigorous error bound); the rows it cannot certify, and rows with masked entries, are computed
    by :func:`_it_faithful`. ``aux["fast"]`` is 1.0 on the rows the fast path returned.

    The rounds (``k`` arrays of ``n`` per row) are not kept: a forward pass needs ``O(B n)``
    memory, and the Jacobian and VJP recompute them (:func:`_it_forward`, one more forward pass;
    the API's VJP runs :func:`_it_forward_vjp`, one pass for both).

    >>> iterative_topk(np.array([[0.0, -1.0]]), 2).p.round(4)
    array([[1.2979, 0.7021]])
    """
    return _it_forward(z, k, store=False)


def _it_forward(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """:func:`iterative_topk`, with the rounds the derivatives read in ``aux`` when ``store``
    (else only ``aux["fast"]`` and ``aux["error_estimate"]``)."""
    eligible = np.isfinite(z).all(axis=-1)
    if not eligible.any():
        return _it_faithful(z, k, store=store)
    rows = np.flatnonzero(eligible)
    fast = _it_fast(z if eligible.all() else z[rows], k, store=store)
    rescue = np.flatnonzero(~eligible)
    rescue = np.concatenate([rescue, rows[fast.aux["fast"] == 0]])
    if rescue.size == 0:
        return fast
    slow = _it_faithful(z[rescue], k, store=store)
    if store:
        fast.aux["q"] = _replayed_q(fast.aux["s"])
    return _combine_rows(z.shape[0], [(rows, fast), (rescue, slow)])


def _it_forward_vjp(z: FloatArray, k: int, v: FloatArray) -> tuple[Forward, FloatArray]:
    """:func:`iterative_topk` and :func:`_it_vjp` in one pass. Without masked entries, each block
    of rows runs the fast rounds into one reused buffer of the block's rounds and then the reverse
    pass, so the ``k`` rounds are never held for the whole batch; the rows the fast path cannot
    certify are recomputed faithfully (forward and VJP). With failed rows the API reports the
    forward's failure, so no derivative is computed for them."""
    if not np.isfinite(z).all():
        fwd = _it_forward(z, k)
        if (fwd.codes() != OK).any() or not np.isfinite(fwd.p).all():
            return fwd, np.zeros_like(z)
        return fwd, _it_vjp(fwd, z, k, v)
    bsz, n = z.shape
    argmin = np.argmin(z, axis=-1)
    d = z - z[np.arange(bsz), argmin][:, None]
    step = max(1, _FAST_BLOCK // n)
    width = min(step, bsz)
    s_blk, ctop_blk, top_blk = np.empty((width, k, n)), np.empty((width, k)), np.empty((width, k))
    p, q, out = np.zeros_like(z), np.empty_like(z), np.empty_like(z)
    ep, certified = np.empty(bsz), np.empty(bsz, dtype=bool)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # blown-up bounds: not certified
        for lo in range(0, bsz, step):
            b = slice(lo, lo + step)
            nb = p[b].shape[0]
            ep[b], certified[b] = _it_fast_block(z[b], d[b], k, s_blk[:nb], ctop_blk[:nb], top_blk[:nb], p[b], q[b])
            aux = {"s": s_blk[:nb], "ctop": ctop_blk[:nb], "top": top_blk[:nb], "qlast": q[b], "d": d[b],
                   "argmin": argmin[b].astype(np.float64)}
            out[b] = _it_vjp_dense(aux, k, v[b])
    fwd = Forward(p=p, q=q)
    fwd.aux = {"error_estimate": ep, "fast": certified.astype(np.float64)}
    rescue = np.flatnonzero(~certified)
    if rescue.size == 0:
        return fwd, _checked(out, "iterative")
    slow = _it_faithful(z[rescue], k)
    if (slow.codes() != OK).any() or not np.isfinite(slow.p).all():
        out[rescue] = 0.0
    else:
        out[rescue] = _it_vjp(slow, z[rescue], k, v[rescue])
    slow.aux = {name: slow.aux[name] for name in fwd.aux}
    return _combine_rows(bsz, [(np.arange(bsz), fwd), (rescue, slow)]), _checked(out, "iterative")


def _it_faithful(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """The faithful computation (``1 - p`` from exclusive log-sums, running error estimate).

    With ``store`` the rounds the derivatives read (``s`` and ``q`` before each round, ``(B, k, n)``
    each) are kept in ``aux``; without it only ``aux["fast"]`` and ``aux["error_estimate"]``, and
    the memory is ``O(B n)`` whatever ``k``."""
    rows = np.arange(z.shape[0])
    masked = np.isneginf(z)
    any_masked = bool(masked.any())
    z_up = np.where(masked, np.inf, z) if any_masked else z
    d = z - z_up.min(axis=-1, keepdims=True)  # z - min z, 0 on masked entries
    if any_masked:
        d[masked] = 0.0
    p, q = np.zeros_like(z), np.ones_like(z)
    s_steps, ctop_steps, top_steps, q_steps = [], [], [], []
    err = _RoundingErrors(z)
    # -inf - -inf and log 0 on masked entries, empty sums and saturated rows (handled by the wheres);
    # overflow and NaN in the error arrays of a row that blew up (its estimate is inf: refused)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for t in range(k):
            if t == 0:
                y = z
            else:
                y = q * d
                if any_masked:
                    y[masked] = _NEG_INF
            s, c, local = _it_softmax(y, masked)
            if store:
                s_steps.append(s)
                top = s.argmax(axis=-1)
                top_steps.append(top)
                ctop_steps.append(c[rows, top])
                q_steps.append(q)
            # q - s and c - p are equal in exact arithmetic; keep the one with the smaller error bound
            bound_q, bound_c = np.abs(q), np.abs(p)
            bound_q += s
            bound_c += c
            direct = bound_q <= bound_c
            q_before = q
            q = np.subtract(c, p, out=bound_c)
            np.subtract(q_before, s, out=q, where=direct)
            p += s
            err.iterative_round(t, d, s, c, local, direct, p, q)
            slope = s * c
            slope *= d  # d s_i / d q_i
            err.close_round(t, {"slope": slope.max(axis=-1), "entry": slope.argmax(axis=-1).astype(np.float64)})
    fwd = Forward(p=np.where(masked, 0.0, p), q=np.where(masked, 1.0, q)) if any_masked else Forward(p=p, q=q)
    fwd.aux = {"fast": np.zeros(z.shape[0])}
    if store:
        fwd.aux.update({
            "s": np.stack(s_steps, axis=1), "q": np.stack(q_steps, axis=1),
            "ctop": np.stack(ctop_steps, axis=1), "top": np.stack(top_steps, axis=1).astype(np.float64),
            "d": d, "qlast": fwd.q, "argmin": np.argmin(z_up, axis=-1).astype(np.float64),
        })
        del s_steps, q_steps  # the stacks hold the rounds now
    err.report(fwd, z, "iterative", lambda b: (
        f"the round's slope d s_i / d(1 - p_i) = s_i (1 - s_i) (z_i - min z) reached {err.cause['slope'][b]:.3g} "
        f"(entry {int(err.cause['entry'][b])})"
    ), floor=_tie_split(z, fwd.p, fwd.q))
    return fwd


def _lse_exclusive_symmetric(a: FloatArray, total: FloatArray) -> tuple[FloatArray, NDArray[np.bool_]]:
    """``log sum_{j != i} e^{a_j}`` along the last axis, and the entries summed directly;
    ``total`` is ``logsumexp(a)`` with a trailing axis of 1 (the caller has it already).

    Like :func:`~topk_cli.operators._logspace.logsumexp_exclusive` (``total + log1p(-ratio)``),
    but the exclusive sum is summed directly only for an entry holding more than 3/4 of the total
    (there the subtraction would cancel), never for the argmax as such. At most one entry can hold
    that much, even after rounding, so it is never one of tied entries: exactly equal ``a_i`` get bitwise equal
    results. (Picking the argmax among tied maxima gave that one entry a differently rounded
    ``1 - s``, which split exact ties; see :func:`_it_softmax`.) The caller ignores the divide and
    invalid warnings of ``-inf`` entries and empty rows.
    """
    finite = np.isfinite(total)
    every = finite.all()
    ratio = exp_new(a - total if every else a - np.where(finite, total, 0.0))
    out = np.minimum(ratio, 1.0)
    np.negative(out, out=out)
    np.log1p(out, out=out)
    out += total
    # 3/4, not 1/2: two tied maxima each hold half of the total, and the rounded ratio can exceed
    # 1/2 for both; above 3/4 only one entry fits, by a wide margin (below it, log1p(-ratio) is
    # conditioned by at most 4)
    dom = ratio > 0.75
    if dom.any():  # such an entry's sum without it, summed directly
        np.copyto(out, logsumexp(np.where(dom, _NEG_INF, a))[..., None], where=dom)
    if not every:
        dom &= finite
        out[~finite[..., 0]] = _NEG_INF
    return out, dom


def _it_softmax(
    y: FloatArray, masked: NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, tuple[FloatArray, FloatArray, FloatArray, NDArray[np.bool_]]]:
    """``s = softmax(y) = exp(y - T)`` and ``c = 1 - s = exp(lc - T)`` without cancellation
    (``T = logsumexp(y)``, ``lc`` the exclusive log-sum), with their local rounding errors.
    ``y`` is ``-inf`` on the masked entries.

    Exactly equal ``y`` give bitwise equal ``s`` and ``c``, hence equal ``p``, ``q`` and next
    ``y``: every operation is elementwise or row-wide, and the exclusive sum is summed directly
    only for an entry holding more than 3/4 of the total, which is never tied. This matters:
    tied entries stay tied in exact arithmetic, and the old choice of the argmax among tied maxima
    for the direct sum gave that entry a ``1 - s`` rounded differently (by ``u |T|``, 1.5e-10 at
    ``y ~ 3e6``), then the other branch of the ``q - s`` / ``c - p`` choice; the split, multiplied
    by ``z_i - min z`` in later rounds, grew into O(1) errors (``x = (4e6, 4e6, 4e6, 0)``,
    ``k = 4``: 0.25) that the error model, which gives tied entries equal rounding errors, could
    not see.
    """
    total = logsumexp(y)[:, None]
    s = exp_new(y - total)
    lc, dom = _lse_exclusive_symmetric(y, total)
    c = np.exp(lc - total)
    return s, c, _it_local_errors(y, total, lc, s, c, masked, dom)


def _it_local_errors(
    y: FloatArray, total: FloatArray, lc: FloatArray, s: FloatArray, c: FloatArray, masked: NDArray[np.bool_],
    dom: NDArray[np.bool_],
) -> tuple[FloatArray, FloatArray, FloatArray, NDArray[np.bool_]]:
    """Rounding errors of ``s = exp(y - T)`` and ``c = exp(lc - T)``, ``T = logsumexp(y)``
    (``y`` is ``-inf`` on the masked entries, whose errors are 0).

    Returns the relative errors of ``s`` and ``c`` of each entry, the error of ``T`` (common to
    the row: it scales every ``s_i`` by ``1 - dT``) and, as True, the entry whose exclusive sum
    was summed directly (``dom``: more than 3/4 of the total; none when the maximum is tied).
    ``T = max y + L`` is rounded by ``min(u |T|, L)`` (``L = -log s_top``, exact from
    ``c_top``); ``lc_i = T + log(1 - s_i)`` by ``min(u |T|, |log(1 - s_i)|)``, so that
    ``c_i = 1 - s_i`` inherits the error of ``s_i`` but not ``dT`` itself, except for the ``dom``
    entry, whose exclusive sum is summed directly around the second largest ``y``; each
    exponential adds ``u (1 + |argument|)``. The caller ignores the warnings of masked entries
    and of ``s = 1`` (``log 0``, bounded by the min below).
    """
    rows = np.arange(y.shape[0])
    top = y.argmax(axis=-1)
    lead = np.negative(c[rows, top])
    np.log1p(lead, out=lead)
    np.negative(lead, out=lead)
    u_total = np.abs(total)
    u_total *= _UNIT
    err_total = np.minimum(u_total, lead[:, None])
    err_s = y - total
    np.abs(err_s, out=err_s)
    err_s += 1.0
    err_s *= _UNIT
    err_lc = np.minimum(s, 1.0)
    np.negative(err_lc, out=err_lc)
    np.log1p(err_lc, out=err_lc)
    np.abs(err_lc, out=err_lc)
    np.minimum(u_total, err_lc, out=err_lc)
    if dom.any():  # the top entry was summed directly (in the rows that have such an entry)
        rest = y.copy()
        rest[rows, top] = _NEG_INF
        np.copyto(err_lc, _rnd_log(lc, _lse_added(rest)[1]), where=dom)
    err_c = np.isfinite(lc)
    err_c = np.where(err_c, lc, 0.0)
    err_c -= total
    np.abs(err_c, out=err_c)
    err_c += 1.0
    err_c *= _UNIT
    err_c += err_lc
    if masked.any():
        err_s[masked] = 0.0
        err_c[masked] = 0.0
    return err_s, err_c, err_total, dom


def _tie_split(z: FloatArray, p: FloatArray, q: FloatArray) -> FloatArray:
    """Per row, the largest difference of ``p`` (or of ``q = 1 - p``) between exactly tied entries.

    Exact ties stay tied in every round of exact arithmetic, so any difference is error, and the
    error model cannot see it (it gives tied entries equal rounding errors, and the API averages
    ``p`` over ties). :func:`_it_softmax` keeps ties bitwise equal, so this is 0; it guards that
    property (a split that later rounds amplified cannot be hidden by the final averaging).
    """
    pq = np.stack([p, q], axis=-1)
    with np.errstate(invalid="ignore"):  # inf - inf: reported as inf below
        dev = np.abs(pq - average_ties(z, pq)[0]).max(axis=(1, 2))
    return np.where(np.isnan(dev), np.inf, 2.0 * dev)


def _it_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """Forward mode: ``dy = dq d + q dd``; ``ds = s (c dy - X)``, ``X_i = sum_{j != i} s_j dy_j``."""
    if "s" not in fwd.aux:  # the forward pass did not keep the rounds
        fwd = _it_forward(z, k)
    bsz, n = z.shape
    live = np.isfinite(z)
    aux = fwd.aux
    d = aux["d"][:, :, None]
    eye = np.broadcast_to(np.eye(n), (bsz, n, n)) * live[:, :, None] * live[:, None, :]
    m = aux["argmin"].astype(np.int64)
    dd = eye - eye[np.arange(bsz), m][:, None, :] * live[:, :, None]  # d(z_i - z_m)
    dq = np.zeros((bsz, n, n))
    q_run = np.ones((bsz, n))
    for t in range(k):
        s = aux["s"][:, t, :, None]
        q = (aux["q"][:, t] if "q" in aux else q_run)[:, :, None]
        q_run = q_run - aux["s"][:, t]
        c = _complement(aux, t)[:, :, None]
        dy = eye if t == 0 else dq * d + q * dd  # round one is softmax(z): no reference shift
        ds = s * (c * dy - _exclusive_sum(s * dy))
        dq = np.where(live[:, :, None], dq - ds, 0.0)
    return _checked(-dq, "iterative")


def _it_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """Reverse mode through the stored rounds, ``O(k n)`` time per row."""
    if "s" not in fwd.aux:  # the forward pass did not keep the rounds: recompute them
        if np.isfinite(z).all() and (fwd.codes() == OK).all():
            return _it_forward_vjp(z, k, v)[1]
        fwd = _it_forward(z, k)
    bsz = z.shape[0]
    live = np.isfinite(z)
    aux = fwd.aux
    if live.all():
        return _checked(_it_vjp_dense(aux, k, v), "iterative")
    d = aux["d"]
    qbar = np.where(live, -v, 0.0)
    dbar = np.zeros_like(z)
    q_run = aux["qlast"]
    for t in reversed(range(k)):
        s = np.where(live, aux["s"][:, t], 0.0)
        if "q" in aux:
            q = np.where(live, aux["q"][:, t], 0.0)
        else:  # only fast rows, no masked entries: q before round t is q after it plus s
            q = q_run = q_run + s
        c = np.where(live, _complement(aux, t), 0.0)
        g = -s * qbar  # cotangent of (c dy - X)
        ybar = c * g - s * _exclusive_sum(g[:, :, None])[:, :, 0]
        if t == 0:
            zbar = ybar  # round one is softmax(z): no reference shift
        else:
            dbar += q * ybar
            qbar = qbar + d * ybar
    dbar = np.where(live, dbar, 0.0)
    m = aux["argmin"].astype(np.int64)
    dbar[np.arange(bsz), m] -= dbar.sum(axis=-1)
    zbar = np.where(live, zbar + dbar, 0.0)
    return _checked(zbar, "iterative")


def _it_vjp_dense(aux: dict[str, FloatArray], k: int, v: FloatArray) -> FloatArray:
    """:func:`_it_vjp` for batches without masked entries, the same operations (the exclusive sum
    of the entry of largest magnitude summed directly, as :func:`_exclusive_sum` does) with
    preallocated buffers, on blocks of rows that stay in cache (the rows are independent)."""
    bsz, n = v.shape
    out = np.empty_like(v)
    step = max(1, _FAST_BLOCK // n)
    for lo in range(0, bsz, step):
        b = slice(lo, lo + step)
        rows = np.arange(out[b].shape[0])
        d, s_st = aux["d"][b], aux["s"][b]
        top, ctop = aux["top"][b].astype(np.int64), aux["ctop"][b]
        qbar = -v[b]
        dbar = np.zeros_like(qbar)
        q = None if "q" in aux else aux["qlast"][b].copy()
        c, g, e = np.empty_like(qbar), np.empty_like(qbar), np.empty_like(qbar)
        for t in reversed(range(k)):
            s = s_st[:, t]
            if q is None:
                q_t = aux["q"][b, t]
            else:  # only fast rows: q before round t is q after it plus s
                q += s
                q_t = q
            np.subtract(1.0, s, out=c)
            c[rows, top[:, t]] = ctop[:, t]
            np.multiply(s, qbar, out=g)  # minus the cotangent of (c dy - X)
            np.subtract(g.sum(axis=-1)[:, None], g, out=e)  # sum_{j != i} g_j ...
            hi, lo_ = np.argmax(g, axis=-1), np.argmin(g, axis=-1)
            big = np.where(np.abs(g[rows, hi]) >= np.abs(g[rows, lo_]), hi, lo_)
            kept = g[rows, big]
            g[rows, big] = 0.0
            e[rows, big] = g.sum(axis=-1)  # ... summed directly for the entry of largest magnitude
            g[rows, big] = kept
            c *= g
            e *= s
            c -= e  # minus ybar
            if t == 0:
                ybar_0 = c  # round one is softmax(z): no reference shift
            else:
                np.multiply(q_t, c, out=e)
                dbar -= e
                np.multiply(d, c, out=e)
                qbar -= e
        m = aux["argmin"][b].astype(np.int64)
        dbar[rows, m] -= dbar.sum(axis=-1)
        np.subtract(dbar, ybar_0, out=out[b])
    return out


def _replayed_q(s: FloatArray) -> FloatArray:
    """The stack of ``q = 1 - p`` before each round, ``(B, k, n)``, replayed from the stored
    ``s`` exactly as the fast path computed it (``q <- q - s`` from 1: the same bits)."""
    q = np.empty_like(s)
    q[:, 0] = 1.0
    for t in range(1, s.shape[1]):
        np.subtract(q[:, t - 1], s[:, t - 1], out=q[:, t])
    return q


def _complement(aux: dict[str, FloatArray], t: int) -> FloatArray:
    """``c = 1 - s`` of round ``t`` from the stored rounds: ``1 - s_i`` in float64 is relatively
    accurate wherever ``s_i <= 1/2`` (every entry but the round's largest ``s``, and any ``s_i``
    tied with it), and the largest one's ``c`` is stored (``aux["ctop"]``, computed without
    cancellation: ``rest / (1 + rest)`` on the fast path, an exclusive log-sum on the faithful one).
    Storing one ``c`` per round instead of ``n`` saves a third of the rounds' memory."""
    c = 1.0 - aux["s"][:, t]
    np.put_along_axis(c, aux["top"][:, t, None].astype(np.int64), aux["ctop"][:, t, None], axis=-1)
    return c


#: ``elementwise``: every round computes ``s_i`` from ``z_i``, ``q_i`` and row-wide quantities
#: (``min z``, the round's maximum and normaliser), so exactly tied entries get bitwise equal
#: ``p`` and ``q`` by construction, on both paths (the faithful one also measures any split of
#: ties, :func:`_tie_split`, and refuses the row if it mattered): the API's averaging over ties,
#: a sort of every row, would change nothing.
#: The largest ``n k`` per row :data:`ITERATIVE` runs: k rounds over the row cost O(n k), measured
#: (one core, machine loaded) at 0.1-0.2 us per ``n k`` on rows the fast path certifies and 1.3-2.4 us
#: on the others (n = 8000, k = 2000: 28 s; n = 20000, k = 2500: 119 s).
ITERATIVE_MAX_ROW_WORK = 2.5e7

ITERATIVE = Implementation(
    forward=iterative_topk, jacobian=_it_jacobian, vjp=_it_vjp, elementwise=True, forward_vjp=_it_forward_vjp,
    max_row_work=ITERATIVE_MAX_ROW_WORK,
)
