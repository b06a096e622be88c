"""A verbatim copy of ``iterative``'s faithful path as it was before it was made cheaper (commit
69d3ac8): :func:`_it_faithful`, the iterative-specific helpers it calls and
``_RoundingErrors.iterative_round`` (as a function of the error model); and of the fast path's
rounds, :func:`_it_fast_block`. The shared helpers are imported, not copied: they are not what
changed. ``tests/test_iterative_faithful_bits.py`` checks that the current paths give the same bits."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward, average_ties
from topk_cli.operators._iterative_fast import (
    _EXP_ERR,
    _FAST_P_BOUND,
    _FAST_Q_BOUND,
    _blocked_sum,
    _blocked_sum_depth,
)
from topk_cli.operators._logsigned import (
    _NEG_INF,
    _SQRT2_UNIT,
    _UNIT,
    _lse_added,
    _rnd_log,
    _RoundingErrors,
)
from topk_cli.operators._logspace import logsumexp


def _finite(x: FloatArray) -> FloatArray:
    """``x`` with the infinite entries (masked entries, empty log-sums) replaced by 0 (copied verbatim)."""
    return np.where(np.isfinite(x), x, 0.0)


def _it_faithful(z: FloatArray, k: int) -> Forward:
    """The faithful computation (``1 - p`` from exclusive log-sums, running error estimate)."""
    masked = np.isneginf(z)
    zmin = np.min(np.where(masked, np.inf, z), axis=-1, keepdims=True)
    d = np.where(masked, _NEG_INF, z - zmin)
    p, q = np.zeros_like(z), np.ones_like(z)
    s_steps, ctop_steps, top_steps, q_steps = [], [], [], []
    err = _RoundingErrors(z)
    d_live = np.where(masked, 0.0, d)
    for t in range(k):
        y = z if t == 0 else np.where(masked, _NEG_INF, q * d)
        s, c, local = _it_softmax(y, masked)
        s_steps.append(s)
        top = np.argmax(s, axis=-1)
        top_steps.append(top)
        ctop_steps.append(c[np.arange(z.shape[0]), top])
        q_steps.append(q)
        # q - s and c - p are equal in exact arithmetic; keep the one with the smaller error bound
        direct = np.abs(q) + s <= c + np.abs(p)
        q = np.where(direct, q - s, c - p)
        p = p + s
        _iterative_round(err, t, d_live, s, c, local, direct, p, q)
        slope = s * c * d_live  # d s_i / d q_i
        err.close_round(t, {"slope": np.max(slope, axis=-1), "entry": np.argmax(slope, axis=-1).astype(np.float64)})
    fwd = Forward(p=np.where(masked, 0.0, p), q=np.where(masked, 1.0, q))
    fwd.aux = {
        "s": np.stack(s_steps, axis=1), "q": np.stack(q_steps, axis=1),
        "ctop": np.stack(ctop_steps, axis=1), "top": np.stack(top_steps, axis=1).astype(np.float64),
        "d": np.where(masked, 0.0, d), "qlast": fwd.q,
        "argmin": np.argmin(np.where(masked, np.inf, z), axis=-1).astype(np.float64),
        "fast": np.zeros(z.shape[0]),
    }
    err.report(fwd, z, "iterative", lambda b: (
        f"the round's slope d s_i / d(1 - p_i) = s_i (1 - s_i) (z_i - min z) reached {err.cause['slope'][b]:.3g} "
        f"(entry {int(err.cause['entry'][b])})"
    ), floor=_tie_split(z, np.where(masked, 0.0, p), np.where(masked, 1.0, q)))
    return fwd


def _lse_exclusive_symmetric(a: FloatArray) -> tuple[FloatArray, NDArray[np.bool_]]:
    """``log sum_{j != i} e^{a_j}`` along the last axis, and the entries summed directly.

    Like :func:`~topk_cli.operators._logspace.logsumexp_exclusive` (``total + log1p(-ratio)``),
    but the exclusive sum is summed directly only for an entry holding more than 3/4 of the total
    (there the subtraction would cancel), never for the argmax as such. At most one entry can hold
    that much, even after rounding, so it is never one of tied entries: exactly equal ``a_i`` get bitwise equal
    results. (Picking the argmax among tied maxima gave that one entry a differently rounded
    ``1 - s``, which split exact ties; see :func:`_it_softmax`.)
    """
    total = logsumexp(a)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):  # -inf entries and empty rows
        ratio = np.exp(a - np.where(np.isfinite(total), total, 0.0))
        out = total + np.log1p(-np.minimum(ratio, 1.0))
    # 3/4, not 1/2: two tied maxima each hold half of the total, and the rounded ratio can exceed
    # 1/2 for both; above 3/4 only one entry fits, by a wide margin (below it, log1p(-ratio) is
    # conditioned by at most 4)
    dom = ratio > 0.75
    rest = logsumexp(np.where(dom, _NEG_INF, a))[..., None]
    out = np.where(dom, rest, out)
    return np.where(np.isfinite(total), out, _NEG_INF), dom & np.isfinite(total)


def _it_softmax(
    y: FloatArray, masked: NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, tuple[FloatArray, FloatArray, FloatArray, FloatArray]]:
    """``s = softmax(y) = exp(y - T)`` and ``c = 1 - s = exp(lc - T)`` without cancellation
    (``T = logsumexp(y)``, ``lc`` the exclusive log-sum), with their local rounding errors.

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
    s = np.exp(y - total)
    lc, dom = _lse_exclusive_symmetric(y)
    c = np.exp(lc - total)
    y_live = np.where(masked, 0.0, y)
    return s, c, _it_local_errors(y_live, total, lc, s, c, masked, dom)


def _it_local_errors(
    y: FloatArray, total: FloatArray, lc: FloatArray, s: FloatArray, c: FloatArray, masked: NDArray[np.bool_],
    dom: NDArray[np.bool_],
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Rounding errors of ``s = exp(y - T)`` and ``c = exp(lc - T)``, ``T = logsumexp(y)``.

    Returns the relative errors of ``s`` and ``c`` of each entry, the error of ``T`` (common to
    the row: it scales every ``s_i`` by ``1 - dT``) and, as 1.0, the entry whose exclusive sum
    was summed directly (``dom``: more than 3/4 of the total; none when the maximum is tied).
    ``T = max y + L`` is rounded by ``min(u |T|, L)`` (``L = -log s_top``, exact from
    ``c_top``); ``lc_i = T + log(1 - s_i)`` by ``min(u |T|, |log(1 - s_i)|)``, so that
    ``c_i = 1 - s_i`` inherits the error of ``s_i`` but not ``dT`` itself, except for the ``dom``
    entry, whose exclusive sum is summed directly around the second largest ``y``; each
    exponential adds ``u (1 + |argument|)``.
    """
    y_max = np.where(masked, _NEG_INF, y)
    top = np.argmax(y_max, axis=-1)[:, None]
    lead = -np.log1p(-np.take_along_axis(c, top, axis=-1))
    err_total = np.minimum(_UNIT * np.abs(total), lead)
    err_s = _UNIT * (1.0 + np.abs(y - total))
    with np.errstate(divide="ignore"):  # s = 1: log 0 (bounded by the min below)
        l1p = np.abs(np.log1p(-np.minimum(s, 1.0)))
    err_lc = np.minimum(_UNIT * np.abs(total), l1p)
    np.put_along_axis(y_max, top, _NEG_INF, axis=-1)
    _, added_rest = _lse_added(y_max)
    err_lc = np.where(dom, _rnd_log(lc, added_rest), err_lc)
    err_c = _UNIT * (1.0 + np.abs(np.where(masked, 0.0, _finite(lc) - total))) + err_lc
    return np.where(masked, 0.0, err_s), np.where(masked, 0.0, err_c), err_total, dom.astype(np.float64)


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


def _iterative_round(
    self: _RoundingErrors, t: int, d: FloatArray, s: FloatArray, c: FloatArray,
    local: tuple[FloatArray, FloatArray, FloatArray, FloatArray], direct: NDArray[np.bool_], p: FloatArray,
    q: FloatArray,
) -> None:
    """One round: ``y = q d``, ``s = softmax(y)``, ``p <- p + s``, ``q <- q - s`` or ``c - p``.

    ``dy = d dq``, ``ds = s (dy - sum_j s_j dy_j)``, plus the local errors of ``s`` and
    ``c = 1 - s`` (computed separately) from :func:`_it_local_errors`, ``u |p|`` of ``p`` and
    ``sqrt(2) u |q|`` of ``q`` (its own rounding and, one round later, that of ``y = q d``).
    """
    err_s, err_c, err_total, is_top = local
    dq, dp = self.dq, self.dp
    s3 = s[:, :, None]
    if t > 0:  # round one is softmax(z): z is exact
        dy = d[:, :, None] * dq
        ds = s3 * (dy - np.sum(s3 * dy, axis=1, keepdims=True))
    else:
        ds = np.zeros_like(dq)
    d_total = self.noise(err_total)
    loc_s = self.noise(s * err_s) - s3 * d_total
    loc_c = self.noise(c * err_c) + np.where(is_top > 0, -c, s)[:, :, None] * d_total
    self.dp = dp + ds + loc_s + self.noise(_UNIT * np.abs(p))
    ds += self.noise(_SQRT2_UNIT * np.abs(q))
    self.dq = np.where(direct[:, :, None], dq - loc_s, loc_c - dp) - ds


def _it_fast_block(
    z: FloatArray, d: FloatArray, k: int, s_st: FloatArray, ctop_st: FloatArray, top_st: FloatArray,
    p: FloatArray, q: FloatArray,
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """The rounds of :func:`_it_fast` on a block of rows; fills ``s_st``, ``ctop_st``, ``top_st``, ``p`` and ``q``
    and returns the bound on the error of ``p`` and whether each row is certified.

    Per round, with ``y = q d`` (round one ``y = z``), ``e = exp(y - max y)`` (the top entry is 1
    and is left out of ``rest = sum e``, so that ``c_top = rest / (1 + rest)`` is relatively
    accurate: it is ``1 - s_top``), ``s = e / (1 + rest)``, ``c = 1 - s``, ``p <- p + s``,
    ``q <- q - s``. The bound is forward error analysis, each float64 operation contributing at
    most ``u = 2^-53`` relative; ``h_i`` bounds the error of ``q_i`` against the exact rounds:

    * computing the softmax of the computed ``y``: each ``e_j`` is off by
      ``eta_1 = u (max y - min y) + exp_err`` (shift, ``exp``; the top one exact), the normaliser
      ``1 + rest`` by ``eta_n = ((e^{eta_1} - 1) + gamma) c_top + 2 u`` (the summed terms only make
      up ``c_top`` of it, which keeps a saturated ``s_top`` accurate to ``O(u)``), so the computed
      ``s_i`` is within a factor ``e^{+-eta_i}`` (``eta_top = eta_n``, ``eta_i = eta_1 + eta_n``):
      an error ``s_i (e^{eta_i} - 1) e^{eta_i}``; ``gamma = (2 sqrt(n) + 2) u`` bounds the
      rounding of the sum, taken in two levels of about ``sqrt(n)`` terms (:func:`_blocked_sum`;
      ``(m - 1) u`` holds for ``m`` terms in any order). ``min y`` is not scanned: ``q_i <= 1``
      always (``s >= 0``), so ``y`` lies in ``[min(0, min q) max d, max d]`` (``min q`` is one row
      reduction per round);
    * the error of ``y`` itself, ``dy_i = d_i dq_i + rho_i`` (``dq_i`` the error of ``q_i``,
      ``|rho_i| <= 2 u |q_i| d_i`` the rounding of ``d`` and of the product). By the mean value
      theorem for each ``s_i`` (at a point ``xi`` between the exact and the computed ``y``,
      ``sigma = softmax(xi)``), the next ``q_i - s_i`` is off by
      ``dq_i (1 - sigma_i (1 - sigma_i) d_i) - sigma_i (1 - sigma_i) rho_i
      + sigma_i sum_{j != i} sigma_j dy_j`` plus the local error above. The first term keeps its
      sign: an error of ``q_i`` and the error it causes in ``s_i`` cancel (the round contracts
      errors where ``s_i (1 - s_i) d_i < 2``); adding their absolute values instead made the old
      bound grow by ``1 + s_i d_i`` per round. ``sigma`` is within ``e^{+-(2 D + eta)}`` of the
      computed ``s`` (and ``1 - sigma`` of the computed ``c``), ``D = max |dy|``, so
      ``|1 - sigma_i (1 - sigma_i) d_i| <= |1 - s_i c_i d_i| + eps max d`` with
      ``eps = e^{4 D + 2 eta} - 1`` plus the rounding of ``s_i c_i d_i``, and the other terms are
      at most ``F s_i (W + 2 u max|q| max d)`` with ``F = e^{6 D + 2 eta + (n + 16) u}`` and
      ``W = sum_j s_j d_j (h_j + 2 u |q_j|)`` (for the top entry: the sum without it, and its own
      ``rho`` term with its small ``c_top``, so that a saturated ``1 - p_top`` stays relatively
      accurate);
    * ``p + s`` and ``q - s`` add their own rounding, ``u |p| <= u (t + 1)`` and ``u |q|``; since
      ``p + q = 1`` in exact arithmetic, the error of ``p`` is at most ``h`` plus those roundings.

    The bounds are sums and products of non-negative terms (the one subtraction, ``1 - s c d``,
    has its rounding charged in ``eps``), so their own rounding only lowers them by a factor
    ``(1 + u)^{O(k)}``, which the final ``1 + 64 k u`` covers. Exact ties stay bitwise equal in
    ``p`` and ``q``: every operation on them is elementwise or row-wide (the top entry's ``s`` is
    ``1 / (1 + rest)``, as for its tied peers).
    """
    bsz, n = z.shape
    u = _UNIT
    rows = np.arange(bsz)
    gamma_n = 1.01 * (_blocked_sum_depth(n) + 1) * u
    dmax = 1.01 * np.max(d, axis=-1)  # >= the exact max(z) - min(z) and the computed max d
    q_lo = np.ones(bsz)  # the smallest computed q_i
    h = np.zeros((bsz, n))  # bound on the error of q, per entry
    y, tmp, c = np.empty((bsz, n)), np.empty((bsz, n)), np.empty((bsz, n))
    q[...] = 1.0
    ep_add = np.zeros(bsz)  # the roundings of p + s and q - s, summed
    for t in range(k):
        s = s_st[:, t % s_st.shape[1]]  # one buffer when the rounds are not kept
        aq_max = np.maximum(1.0, -q_lo)  # >= max |q_i|: q_i <= 1 always
        if t == 0:  # round one is softmax(z): z is exact
            top = np.argmax(z, axis=-1)
            m = z[rows, top]
            np.subtract(z, m[:, None], out=y)
        else:
            np.multiply(q, d, out=y)
            top = np.argmax(y, axis=-1)
            m = y[rows, top]
            y -= m[:, None]
        np.exp(y, out=y)  # in the contiguous buffer: the blocked sum reshapes it without a copy
        y[rows, top] = 0.0
        rest = _blocked_sum(y)
        total = 1.0 + rest
        np.divide(y, total[:, None], out=s)
        s_top = 1.0 / total
        s[rows, top] = s_top
        np.subtract(1.0, s, out=c)
        c_top = rest / total
        c[rows, top] = c_top
        ctop_st[:, t] = c_top
        top_st[:, t] = top
        # the local error of the softmax of the computed y
        spread = dmax if t == 0 else m - np.minimum(0.0, q_lo) * dmax
        eta_1 = 1.01 * (u * spread + _EXP_ERR * u)
        eta_n = 1.01 * (np.expm1(eta_1) + gamma_n) * c_top + 2.02 * u
        loc = np.expm1(eta_1 + eta_n) * np.exp(eta_1 + eta_n)
        loc_top = np.expm1(eta_n) * np.exp(eta_n)
        eta = eta_1 + eta_n + gamma_n + 2.02 * u  # the log-error of every s_i and c_i
        h_top = h[rows, top]
        if t == 0:
            np.multiply(s, loc[:, None], out=h)
            h[rows, top] = s_top * loc_top
        else:
            big_d = 1.01 * dmax * (np.max(h, axis=-1) + 2.02 * u * aq_max)  # >= max |dy|
            f = np.exp(6.0 * big_d + 2.0 * eta + 1.01 * (n + 16) * u)
            eps = 1.01 * np.expm1(4.0 * big_d + 2.0 * eta) + 4.0 * u
            v = np.multiply(s, d, out=tmp)  # s_i d_i
            w_h = np.einsum("ij,ij->i", v, h)  # sum_j s_j d_j h_j
            v_top = v[rows, top]
            w_h_rest = np.maximum(0.0, (w_h * (1.0 + 1.01 * (n + 2) * u) - v_top * h_top * (1.0 - 3.0 * u))
                                  * (1.0 + 4.0 * u))
            rho = 2.02 * u * aq_max * dmax  # >= 2 u |q_j| d_j
            w_all = w_h + rho * np.exp(eta)  # sum_j s_j <= e^eta
            w_rest = w_h_rest + rho * c_top * np.exp(2.0 * eta)  # sum_{j != top} s_j <= c_top e^{2 eta}
            # non-top entries: h (|1 - s c d| + eps max d) + s (loc + F (W + rho))
            v *= c
            np.subtract(1.0, v, out=v)
            np.abs(v, out=v)
            v += (eps * dmax)[:, None]
            h *= v
            np.multiply(s, (loc + f * (w_all + rho))[:, None], out=v)
            h += v
            # the top entry: its own rho (scaled by c_top) and the sum without it
            w1_top = s_top * c_top * d[rows, top]
            h[rows, top] = (h_top * (np.abs(1.0 - w1_top) + eps * dmax) + s_top * loc_top
                            + f * s_top * (c_top * 2.02 * u * np.abs(q[rows, top]) * dmax + w_rest))
        q -= s
        p += s
        q_lo = np.min(q, axis=-1)
        np.abs(q, out=tmp)
        tmp *= u
        h += tmp
        ep_add += 1.01 * u * ((t + 1) + np.maximum(1.0, -q_lo))
    slack = 1.0 + 64.0 * k * u
    ep = slack * (np.max(h, axis=-1) + ep_add)
    h *= slack
    np.abs(q, out=tmp)
    tmp *= _FAST_Q_BOUND
    certified = (ep <= _FAST_P_BOUND) & np.all(h <= tmp, axis=-1)
    return ep, certified
