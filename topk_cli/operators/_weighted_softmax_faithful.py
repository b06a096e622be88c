"""``weighted-softmax``'s faithful path: ``k`` rounds of ``p <- p + q e^z / sum_j q_j e^{z_j}`` in signed
log space, with the running rounding-error model of :mod:`~topk_cli.operators._logsigned` (see
:mod:`~topk_cli.operators.sequential` for the method and its failure modes).

It runs on the rows the certified fast path cannot take, often one row at a time (the property
checker's shrinker asks for one small row after another), so a round is written for few numpy
calls: every intermediate the error model needs is taken from the round that formed it (the
exclusive log-sums' max, sum and ratio, the gap of a log-difference), one ``np.errstate`` covers
the loop, and rows are indexed directly. The arithmetic, hence every bit, is that of the plain
formulation (each helper of ``_logsigned`` called on its own), which ``tests/`` keeps as an oracle.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward
from topk_cli.operators._logsigned import (
    _LOG_NOISE,
    _NEG_INF,
    _SAFETY,
    _SAMPLES,
    _UNIT,
    _failed,
    _log_diff,
    _nan_to_num,
    _rnd_log,
    _RoundingErrors,
    _to_linear,
)
from topk_cli.operators._logspace import exp_into, exp_new

#: (1, -1) against a (B, n) array: ``_SIGNS * x > 0`` is ``(x > 0, x < 0)`` stacked, in one operation
_SIGNS = np.array([1.0, -1.0])[:, None, None]


def _rnd_abs(abs_result: FloatArray, finite: FloatArray, *abs_operands: FloatArray) -> FloatArray:
    """Rounding error of a float64 sum, from the magnitudes of the result and its operands and whether
    the result is finite: at most ``u |result|``, and never more than the smallest operand (each operand
    is a float as close to the sum as that); 0 if the result is infinite."""
    bound = _UNIT * abs_result
    for x in abs_operands:
        np.minimum(bound, x, out=bound)
    return np.where(finite, bound, 0.0)


def _times(factor: FloatArray, err: FloatArray) -> FloatArray:
    """``factor * err`` with ``inf * 0 = 0`` (a huge factor applied to no error at all)."""
    return np.where(err == 0, 0.0, factor * err)


def _log1pexp_added(gap: FloatArray) -> FloatArray:
    """The term ``log(1 + e^{-gap})`` that ``logaddexp`` of two logs ``gap = |x - other|`` apart adds to the
    larger; 0 if one is empty."""
    fin = np.isfinite(gap)
    return np.where(fin, np.log1p(exp_new(-np.where(fin, gap, 0.0))), 0.0)


def _log_diff_added(gap: FloatArray) -> FloatArray:
    """The term ``log(1 - e^{-gap})`` that :func:`~topk_cli.operators._logsigned._log_diff` of two logs
    ``gap = |lpos - lneg|`` apart adds to the larger; 0 if one is empty (or they are equal: an exact zero,
    no error)."""
    fin = np.isfinite(gap)
    added = np.log(-np.expm1(-np.where(fin, gap, 1.0)))
    return np.where(fin & np.isfinite(added), added, 0.0)


def _log_diff_with_added(lpos: FloatArray, lneg: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """:func:`~topk_cli.operators._logsigned._log_diff` ``(sign, log|e^lpos - e^lneg|)`` and the term
    ``log(1 - e^{-gap})`` it adds (:func:`_log_diff_added`), sharing the gap and, where the gap is
    below ``log 2``, the ``log(-expm1(-gap))`` both form."""
    hi = np.maximum(lpos, lneg)
    gap = -np.abs(lpos - lneg)
    fin = np.isfinite(gap)
    both = np.log(-np.expm1(np.where(fin, gap, -1.0)))  # = log(-expm1(where(near, gap, -1))) where near
    added = np.where(fin & np.isfinite(both), both, 0.0)
    near = gap > -np.log(2.0)
    tail = np.where(near, both, np.log1p(-exp_new(gap)))
    fin_hi = np.isfinite(hi)
    sign = np.sign(lpos - np.where(fin_hi, lneg, lpos))
    sign = np.where((lpos == _NEG_INF) & np.isfinite(lneg), -1.0, sign)
    sign = np.where(np.isnan(sign), 0.0, sign)
    out = np.where(sign == 0, _NEG_INF, hi + np.where(fin_hi, tail, 0.0))
    return sign, out, added


def _lse_exclusive(a: FloatArray, rows: NDArray[np.intp]) -> tuple[FloatArray, FloatArray]:
    """:func:`~topk_cli.operators._logspace.logsumexp_exclusive` of ``a`` (2-D) and the rounding error
    charged to it (``total + log1p(-ratio)`` for every entry but the largest, whose exclusive sum is
    summed directly around the second largest), from one pass: the error model's terms (``log sum exp(a - max)``, ``log1p(-ratio)``, the same for the row without its largest
    entry) are the very ones the log-sums add. ``rows`` is ``arange(B)``."""
    bsz = a.shape[0]
    big = a.argmax(axis=-1)
    both = np.concatenate((a, a))  # the rows, then the rows without their largest entry: one pass for both sums
    both[bsz + rows, big] = _NEG_INF
    top = both.max(axis=-1, keepdims=True)
    top_fin = np.isfinite(top)
    top_safe = np.where(top_fin, top, 0.0)
    shifted = both - top_safe
    lse = np.log(exp_into(shifted, shifted).sum(axis=-1, keepdims=True))
    sums = lse + top_safe
    added = np.where(top_fin, lse, 0.0)
    total = sums[:bsz]
    total_fin = np.isfinite(total)
    added_out = np.log1p(-np.minimum(exp_new(a - np.where(total_fin, total, 0.0)), 1.0))
    out = total + added_out
    out[rows, big] = sums[bsz:, 0]
    out = np.where(total_fin, out, _NEG_INF)
    err = _rnd_log(total, added[:bsz]) + _rnd_log(out, added_out)
    err[rows, big] = _rnd_log(out[rows, big], added[bsz:, 0])
    return out, err


def _ws_faithful(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """``k`` rounds of ``p <- p + q e^z / sum(q e^z)`` with ``q = 1 - p``, in signed log space.

    Shapes: ``z`` is ``(B, n)`` (see ``_base``); ``p`` and ``q`` are ``(B, n)``, ``sum p = k``.
    ``p`` is not confined to [0, 1]; as ``tau -> 0`` with ``k = 2`` it tends to
    ``(1.5, 0.5, 0, ...)``. Rows where the normaliser ``S`` vanishes (a pole) get code ``"inf"``,
    rows whose estimated error exceeds :data:`~topk_cli.operators._logsigned.ILL_CONDITIONED_TOLERANCE`
    ``"ill-conditioned"``. Without ``store`` the rounds the derivatives read are neither formed nor
    kept (``aux`` holds only ``fast`` and ``error_estimate``; ``p``, ``q`` and the codes are the same bits).

    >>> _ws_faithful(np.array([[0.0, -3000.0, -6000.0]]), 2).p.round(4)
    array([[1.5, 0.5, 0. ]])
    """
    bsz = z.shape[0]
    rows2 = np.arange(2 * bsz)
    abs_z = np.abs(z)
    masked = np.isneginf(z)
    any_masked, live_z = masked.any(), ~masked
    sq, lq = np.ones_like(z), np.zeros_like(z)  # q = 1
    sp, lp = np.zeros_like(z), np.full_like(z, _NEG_INF)  # p = 0
    p_lin = np.zeros_like(z)  # p in linear space
    steps: dict[str, list[FloatArray]] = {"s": [], "f": [], "rho": [], "c": [], "lf": [], "sf": [], "lrho": [], "ls": [], "ss": [],
                                         "lc": [], "sc": []}
    fwd = Forward(p=np.zeros_like(z), q=np.ones_like(z))
    err = _RoundingErrors(z)
    # Expected floating-point events, all handled where they occur: log 0 = -inf (empty log-sums, exact
    # zeros of V_i or S), -inf - -inf = NaN on masked entries (excluded by np.where), inf * 0 in the
    # error terms (replaced by 0), exp overflow of e^{z_i} / V_i and of the error model's factors at an
    # exact zero of V_i or near a pole (an infinite estimate: the row is reported ill-conditioned).
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for t in range(k):
            a = np.where(masked, _NEG_INF, lq + z) if any_masked else lq + z  # log|u|, u = q e^z
            q_zero = sq == 0
            # log|u| of the u_i > 0 and of the u_i < 0, stacked (2, B, n): the two go through the same operations
            a2 = np.where(_SIGNS * sq > 0, a, _NEG_INF)
            # S in the frame of the row's largest |u| (linear, so that the s_i sum to 1 exactly up to
            # rounding: log S itself would carry an absolute error of ulp(|z|) at large |z|)
            m = a.max(axis=-1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            am = a - m
            e = np.where(q_zero, 0.0, sq * exp_new(am))
            s_lin = e.sum(axis=-1, keepdims=True)
            pole = s_lin[:, 0] == 0
            if pole.any():
                sentence = f"the normaliser sum_j (1 - p_j) e^{{z_j}} is exactly 0 at round {t + 1} (a pole)"
                _failed(fwd, "inf", pole, np.full(bsz, t + 1), sentence)
            s_lin = np.where(pole[:, None], 1.0, s_lin)
            s_sign = np.sign(s_lin)
            log_s = np.log(np.abs(s_lin))  # log|S| = m + log_s; differences subtract m first
            # sum_{j != i} u_j by sign, with the rounding errors of those log-sums
            x2, excl2 = (b.reshape(a2.shape) for b in _lse_exclusive(a2.reshape(2 * bsz, z.shape[1]), rows2))
            lpe = lp + z  # log|p_i e^{z_i}|
            p_parts = _SIGNS * sp > 0  # (p_i > 0, p_i < 0)
            # log|p_i e^{z_i}| of the p_i < 0 (added to the positive part of V_i) and of the p_i > 0
            other2 = np.where(p_parts[::-1], lpe, _NEG_INF)
            l_step = am - log_s  # log|s_i|
            # V_i = S - e^{z_i} = sum_{j != i} u_j - p_i e^{z_i} = P_i - N_i, and the new p = p + s (signed
            # add), each a difference of two log-sums: (log P, log N, log p+s > 0 part, log p+s < 0 part)
            # from one logaddexp, the two differences from one _log_diff_with_added
            sums = np.logaddexp(np.concatenate((x2, np.where(p_parts, lp, _NEG_INF))),
                                np.concatenate((other2, np.where(_SIGNS * (sq * s_sign) > 0, l_step, _NEG_INF))))
            v2 = sums[:2]  # log P_i, log N_i
            vpos, vneg = v2
            sign2, log2, added2 = _log_diff_with_added(sums[0::2], sums[1::2])
            (v_sign, sp_new), (lv, lp_new), v_added = sign2, log2, added2[0]
            # V_i is a difference of positive sums; where it cancels to rounding noise (or to exactly 0)
            # before the last round, float64 has dropped the small terms that keep 1 - p_i away from 0,
            # and the next rounds multiply that noise by e^{z_i} / S (tied maxima at small tau:
            # x = 1,1,0, k = 3, tau = 0.01 would return 1,1,1 instead of 1.3,1.3,0.4). Exactly 0 is right
            # only at the last round (all-equal entries saturating together), so that round is exempt.
            if t < k - 1:
                noise = (lv - np.logaddexp(vpos, vneg)) < _LOG_NOISE  # NaN on masked entries: excluded
                lost = (noise & ~q_zero & live_z).any(axis=-1)
                if lost.any():
                    sentence = (
                        f"weighted-softmax: round {t + 1}: S - e^{{z_i}} = sum_{{j != i}} (1 - p_j) e^{{z_j}} - p_i e^{{z_i}} "
                        "cancelled to float64 rounding noise, losing the small terms that keep 1 - p_i > 0 for the "
                        "rounds left (typically tied maxima at small tau); the operator is ill-conditioned at this "
                        "input in float64 (use a larger tau or a threshold method)"
                    )
                    _failed(fwd, "ill-conditioned", lost, np.full(bsz, t + 1), sentence)
            lvm = lv - m
            l_f = lvm - log_s  # log|f_i|, f_i = 1 - e^{z_i}/S = q_new_i / q_i
            s_val = e / s_lin
            if store:
                _ws_store(steps, x2[0], x2[1], s_val, v_sign, s_sign, l_f, z, m, log_s, masked, sq, l_step)
            p_new = _to_linear(sp_new, lp_new)
            lq_new = lq + l_f

            # Local rounding errors of the round: the relative error of u_i = q_i e^{z_i} as the round
            # forms it (log u = log q + z, then - m); the relative error of the new q_i (the log-sums
            # making V_i = P_i - N_i, amplified by the cancellation (P_i + N_i) / |V_i|, then
            # log f = log V - log S and log q + log f); the absolute error of the new p_i (log s_i, the
            # signed add). Every log-space operation is charged by _rnd_abs or _rnd_log: u times the
            # magnitude of the log, unless what was added is smaller (then the sum is nearly exact).
            # (Each |.| is formed once: _rnd_abs takes magnitudes.)
            fin_a = np.isfinite(a)
            live = fin_a & ~q_zero
            abs_a, abs_am, abs_lq, abs_m, abs_lv, abs_lvm, abs_l_f, abs_log_s = (
                np.abs(x) for x in (a, am, lq, m, lv, lvm, l_f, log_s))
            err_u = _rnd_abs(abs_a, fin_a, abs_lq, abs_z) + _rnd_abs(abs_am, np.isfinite(am), abs_a, abs_m) + _UNIT
            lpe_err = _rnd_abs(np.abs(lpe), np.isfinite(lpe), np.abs(lp), abs_z)
            err_part = (_times(exp_new(x2 - v2), excl2) + _times(exp_new(other2 - v2), lpe_err)
                        + _rnd_log(v2, _log1pexp_added(np.abs(x2 - other2))))
            gain = exp_new(v2 - lv)  # P_i / |V_i|, N_i / |V_i|: the cancellation of V_i
            err_part = _times(gain, err_part)
            err_v = (_UNIT + err_part[0]) + err_part[1] + _rnd_log(lv, v_added)
            err_q = (err_v + _rnd_abs(abs_lvm, np.isfinite(lvm), abs_lv, abs_m)
                     + _rnd_abs(abs_l_f, np.isfinite(l_f), abs_lvm, abs_log_s)
                     + _rnd_abs(np.abs(lq_new), np.isfinite(lq_new), abs_lq, abs_l_f))
            err_q = np.where(live, _nan_to_num(err_q, np.inf), 0.0)
            s_abs = np.abs(s_val)
            same = sp * sq * np.sign(s_val) > 0  # p and the step s_i have one sign: a sum, else a difference
            gap_p = np.abs(lp - l_step)
            added_p = np.where(same, _log1pexp_added(gap_p), _log_diff_added(gap_p))
            err_p = (np.abs(p_new) * _rnd_log(lp_new, added_p) + _UNIT * np.maximum(np.abs(p_lin), s_abs)
                     + s_abs * _rnd_abs(np.abs(l_step), np.isfinite(l_step), abs_am, abs_log_s))

            e_over_v = np.where(v_sign == 0, 0.0, v_sign * exp_new(z - lv))  # V_i = 0: an infinite factor
            kappa_s = np.abs(e).sum(axis=-1) / np.abs(s_lin[:, 0])
            err.weighted_softmax_round(s_val, e_over_v, np.where(live, err_u, 0.0), err_q, _UNIT * kappa_s[:, None],
                                       np.where(fin_a, err_p, 0.0))
            err.close_round(t, _ws_cause(kappa_s, s_abs, vpos, vneg, gain, e_over_v))
            sp, lp, p_lin = sp_new, lp_new, p_new
            sq, lq = sq * v_sign * s_sign, lq_new
            lq = np.where(sq == 0, _NEG_INF, lq)
    fwd.p = np.where(masked, 0.0, p_lin)
    fwd.aux = {name: np.stack(vals, axis=1) for name, vals in steps.items()} if store else {}  # (B, k, n)
    fwd.aux["fast"] = np.zeros(bsz)
    err.report(fwd, z, "weighted-softmax", lambda b: _ws_explain(err.cause, b))
    fwd.q = np.where(masked, 1.0, _ws_complement(fwd.p, sq, lq, err))
    return fwd


def _ws_store(
    steps: dict[str, list[FloatArray]], xpos: FloatArray, xneg: FloatArray, s_val: FloatArray, v_sign: FloatArray,
    s_sign: FloatArray, l_f: FloatArray, z: FloatArray, m: FloatArray, log_s: FloatArray, masked: NDArray[np.bool_],
    sq: FloatArray, l_step: FloatArray,
) -> None:
    """Append one round's arrays the derivatives read (``c = X / S`` with ``X_i = sum_{j != i} u_j``)."""
    t_sign, lt = _log_diff(xpos, xneg)
    l_c = (lt - m) - log_s
    l_rho = (z - m) - log_s
    steps["s"].append(s_val)
    steps["f"].append(_to_linear(v_sign * s_sign, l_f))
    steps["c"].append(_to_linear(t_sign * s_sign, l_c))
    steps["rho"].append(_to_linear(s_sign * np.ones_like(z), l_rho))
    # log-space copies of the factors that overflow beyond gaps of ~709 (signed rho = sign(S) e^lrho)
    steps["lf"].append(l_f)
    steps["sf"].append(v_sign * s_sign)
    steps["lrho"].append(np.where(masked, _NEG_INF, l_rho))
    steps["ls"].append(np.where(sq == 0, _NEG_INF, l_step))
    steps["ss"].append(sq * s_sign)
    steps["lc"].append(np.where(t_sign == 0, _NEG_INF, l_c))
    steps["sc"].append(t_sign * s_sign)


def _ws_complement(p: FloatArray, sq: FloatArray, lq: FloatArray, err: _RoundingErrors) -> FloatArray:
    """``1 - p`` per entry: the carried log-space ``q`` or ``1 - p`` by subtraction, whichever has
    the smaller estimated error.

    The carried ``q`` is relatively accurate while ``|log q|`` is moderate, but its last update
    ``log q + log|V| - m - log S`` adds ``O(1)`` terms to logs of size ``|z|``, which ulps of
    ``1e17`` swallow (``x = 0, 1``, ``k = 2``, ``tau = 1e-17``: ``q_2 = -0.5`` came out ``-1``
    while ``p_2 = 1.5`` was right: the last round's ``q`` feeds no later round, so the row's estimate,
    which is of ``p``, did not see it). ``1 - p`` is as accurate as ``p`` in absolute terms, so it
    wins wherever ``|q|`` is not small.
    """
    q_log = _to_linear(sq, lq)
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up estimate is inf
        rel = _SAFETY * np.sqrt(np.einsum("bic,bic->bi", err.dq, err.dq) / _SAMPLES)
        err_log = _nan_to_num(rel * np.abs(q_log), np.inf)
    q_sub = 1.0 - p
    err_sub = err.estimate[:, None] + _UNIT * np.maximum(1.0, np.abs(p))
    # a log-space exact 0 (V_i cancelled exactly) is kept only where 1 - p agrees with 0
    err_log = np.where(q_log == 0, np.where(np.abs(q_sub) <= err_sub, 0.0, np.inf), err_log)
    return np.where(err_sub < err_log, q_sub, q_log)


def _ws_cause(
    kappa_s: FloatArray, s_abs: FloatArray, vpos: FloatArray, vneg: FloatArray, gain: FloatArray,
    e_over_v: FloatArray,
) -> dict[str, FloatArray]:
    """What a round does to errors: the cancellation of ``S`` and of the worst ``V_i`` (``gain`` holds
    ``P_i / |V_i|`` and ``N_i / |V_i|``), the largest ``|s_i|`` and the largest ``|e^{z_i} / V_i|`` (the
    gain from an error of ``p_i`` to ``1 - p_i``)."""
    kappa_v = _nan_to_num(gain[0] + gain[1], np.inf)  # V_i = 0: infinite cancellation
    kappa_v = np.where(np.isfinite(vpos) | np.isfinite(vneg), kappa_v, 1.0)
    amp = np.abs(e_over_v)
    return {
        "kappa_s": kappa_s,
        "kappa_v": kappa_v.max(axis=-1),
        "entry": kappa_v.argmax(axis=-1).astype(np.float64),
        "s_max": s_abs.max(axis=-1),
        "gain": amp.max(axis=-1),
        "gain_entry": amp.argmax(axis=-1).astype(np.float64),
    }


def _ws_explain(cause: dict[str, FloatArray], b: int) -> str:
    kappa_s, kappa_v, entry, s_max = (float(cause[name][b]) for name in ("kappa_s", "kappa_v", "entry", "s_max"))
    parts = []
    if kappa_s >= 10:
        parts.append(f"the normaliser S = sum_j (1 - p_j) e^{{z_j}} cancelled to {1 / kappa_s:.1e} of its terms "
                     "(near a pole of the operator)")
    if kappa_v >= 10:
        parts.append(f"S - e^{{z_i}} = sum_{{j != i}} (1 - p_j) e^{{z_j}} - p_i e^{{z_i}} of entry {int(entry)} "
                     f"cancelled to {1 / kappa_v:.1e} of its terms (1 - p_i crosses 0 there)")
    gain, gain_entry = float(cause["gain"][b]), int(cause["gain_entry"][b])
    if gain >= 1e3:
        parts.append(f"|e^{{z_i}} / (S - e^{{z_i}})| of entry {gain_entry} reached {gain:.1e} (an error of p_i "
                     "is magnified that much in 1 - p_i)")
    if not parts:
        parts.append(f"no sum cancelled but the round is unstable (|(1 - p_i) e^{{z_i}} / S| reached {s_max:.3g})")
    return " and ".join(parts)
