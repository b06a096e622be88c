"""A verbatim copy of ``iterative``'s faithful path as it was before it was made cheaper (commit
69d3ac8): :func:`_it_faithful`, the iterative-specific helpers it calls and
``_RoundingErrors.iterative_round`` (as a function of the error model). The shared helpers are
imported, not copied: they are not what changed. ``tests/test_iterative_faithful_bits.py`` checks
that the current path gives the same bits."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward, average_ties
from topk_cli.operators._logsigned import (
    _NEG_INF,
    _SQRT2_UNIT,
    _UNIT,
    _finite,
    _lse_added,
    _rnd_log,
    _RoundingErrors,
)
from topk_cli.operators._logspace import logsumexp


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
