"""A verbatim copy of weighted-softmax's faithful path as it was before its rounds were fused (the
round helpers of ``_logsigned`` and ``_logspace`` included), kept as the bit-for-bit oracle of
``test_weighted_softmax_faithful_bits.py``. Docstrings trimmed; code unchanged."""

# ruff: noqa
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from topk_cli.operators._base import OK, FloatArray, Forward, average_ties
from topk_cli.operators._logsigned import _failed

_NEG_INF = -np.inf
ILL_CONDITIONED_TOLERANCE = 1e-9
_LOG_NOISE = math.log(64 * np.finfo(np.float64).eps)
_UNIT = float(np.finfo(np.float64).eps) / 2
_SAMPLES = 3
_SAFETY = 3.0
_SEED = 20240611
_GROWTH_FLOOR = 1e3 * _UNIT
_FIX = "the operator is ill-conditioned at this input (use a larger tau or a threshold method)"



def logsumexp(a: FloatArray, axis: int = -1, *, buf: FloatArray | None = None) -> FloatArray:
    """(copied verbatim)"""
    m = np.max(a, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    shifted = np.subtract(a, m_safe, out=buf)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the right answer for empty sums
        out = np.log(np.sum(np.exp(shifted, out=shifted), axis=axis, keepdims=True)) + m_safe
    return np.squeeze(out, axis=axis)


def logsumexp_exclusive(a: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    total = logsumexp(a)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):  # -inf entries and empty rows
        ratio = np.exp(a - np.where(np.isfinite(total), total, 0.0))
        out = total + np.log1p(-np.minimum(ratio, 1.0))
    top = np.argmax(a, axis=-1)[..., None]
    without_top = a.copy()
    np.put_along_axis(without_top, top, -np.inf, axis=-1)
    np.put_along_axis(out, top, logsumexp(without_top)[..., None], axis=-1)
    return np.where(np.isfinite(total), out, -np.inf)


def _log_diff(lpos: FloatArray, lneg: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(copied verbatim)"""
    hi = np.maximum(lpos, lneg)
    gap = -np.abs(lpos - lneg)
    with np.errstate(divide="ignore", invalid="ignore"):  # equal terms: log 0 = -inf; -inf - -inf
        near = gap > -np.log(2.0)
        tail = np.where(near, np.log(-np.expm1(np.where(near, gap, -1.0))), np.log1p(-np.exp(gap)))
    sign = np.sign(lpos - np.where(np.isfinite(hi), lneg, lpos))
    sign = np.where(np.isneginf(lpos) & np.isfinite(lneg), -1.0, sign)
    sign = np.nan_to_num(sign, nan=0.0)
    out = np.where(sign == 0, _NEG_INF, hi + np.where(np.isfinite(hi), tail, 0.0))
    return sign, out


def _parts(sign: FloatArray, log_abs: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(copied verbatim)"""
    return np.where(sign > 0, log_abs, _NEG_INF), np.where(sign < 0, log_abs, _NEG_INF)


def _signed_add(
    s1: FloatArray, l1: FloatArray, s2: FloatArray, l2: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """(copied verbatim)"""
    p1, n1 = _parts(s1, l1)
    p2, n2 = _parts(s2, l2)
    return _log_diff(np.logaddexp(p1, p2), np.logaddexp(n1, n2))


def _to_linear(sign: FloatArray, log_abs: FloatArray) -> FloatArray:
    with np.errstate(over="ignore"):  # a pole (S -> 0) overflows: reported by the caller
        return np.where(sign == 0, 0.0, sign * np.exp(log_abs))


def _exclusive_sum(x: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    total = x.sum(axis=1, keepdims=True)
    out = total - x
    top = np.argmax(np.abs(x), axis=1)[:, None]
    without = x.copy()
    np.put_along_axis(without, top, 0.0, axis=1)
    np.put_along_axis(out, top, without.sum(axis=1, keepdims=True), axis=1)
    return out


def _times(factor: FloatArray, err: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    with np.errstate(invalid="ignore", over="ignore"):  # the 0 * inf products are replaced below
        out = factor * err
    return np.where(err == 0, 0.0, out)


def _estimate(dp: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up estimate is inf or NaN
        est = _SAFETY * np.sqrt(np.max(np.einsum("bic,bic->bi", dp, dp), axis=-1) / _SAMPLES)
    return np.where(np.isnan(est), np.inf, est)


class _RoundingErrors:
    """Rounding errors of the rounds, propagated to first order (the same linearisation as the
    Jacobian), driven by random local errors the size of each operation's rounding bound.

    ``dq`` is the error of ``q`` (relative for ``weighted-softmax``, absolute for ``iterative``)
    and ``dp`` the absolute error of ``p``, each ``(B, n, _SAMPLES)``: ``O(B n)`` memory, ``O(n)``
    work per round and row. ``estimate`` is ``_SAFETY`` times the largest RMS of ``dp``; the
    rows also keep the round where it first exceeded the tolerance and the round where it grew
    most, with what the family reports about that round (``cause``).
    """

    def __init__(self, z: FloatArray) -> None:
        bsz, n = z.shape
        self._rng = np.random.default_rng(_SEED)
        order = np.argsort(z, axis=-1, kind="stable")
        zs = np.take_along_axis(z, order, axis=-1)
        first = np.where(np.concatenate([np.ones((bsz, 1), dtype=bool), zs[:, 1:] != zs[:, :-1]], axis=-1),
                         np.arange(n), 0)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.maximum.accumulate(first, axis=-1), axis=-1)  # ties: same rank
        # Rows without ties draw by column, rows with ties by rank: each row draws what it would
        # draw alone, whatever the other rows of its batch hold.
        tied = (first[:, 1:] == 0).any(axis=-1)
        self._rank = np.where(tied[:, None], rank, np.arange(n)) if tied.any() else None
        self.dq = np.zeros((bsz, n, _SAMPLES))
        self.dp = np.zeros((bsz, n, _SAMPLES))
        self.estimate = np.zeros(bsz)
        self.crossed = np.full(bsz, -1, dtype=np.int64)
        self.growth = np.zeros(bsz)
        self.worst = np.full(bsz, -1, dtype=np.int64)
        self.cause: dict[str, FloatArray] = {}

    def noise(self, size: FloatArray) -> FloatArray:
        """Random local errors of standard deviation ``size`` (``(B, n)``, or ``(B, 1)`` for a row).

        The pattern is drawn per column (per rank in the row when the batch has ties) and shared
        by the rows, so a row's estimate does not depend on the batch it is in. Equal entries get
        equal errors: they go through identical operations, and an independent error for each
        would excite the unstable split between exact ties that rounding never does.
        """
        table = self._rng.standard_normal((size.shape[1], _SAMPLES))
        return size[:, :, None] * (table[self._rank] if self._rank is not None and size.shape[1] > 1 else table)

    def close_round(self, t: int, cause: dict[str, FloatArray]) -> None:
        est = _estimate(self.dp)
        with np.errstate(invalid="ignore"):  # inf / inf: no growth
            growth = np.nan_to_num(est / np.maximum(self.estimate, _GROWTH_FLOOR), nan=1.0)
        worse = growth > self.growth
        self.growth = np.where(worse, growth, self.growth)
        self.worst = np.where(worse, t + 1, self.worst)
        for name, val in cause.items():
            self.cause[name] = np.where(worse, val, self.cause.get(name, val))
        self.crossed = np.where((self.crossed < 0) & (est > ILL_CONDITIONED_TOLERANCE), t + 1, self.crossed)
        self.estimate = est

    def report(
        self, fwd: Forward, z: FloatArray, method: str, explain: Callable[[int], str], floor: FloatArray | None = None,
    ) -> None:
        """Mark the rows whose final estimate exceeds the tolerance ``"ill-conditioned"``.

        The public API averages ``p`` over exactly tied entries, which removes the part of the
        error that differs between them: the final estimate is of the averaged ``p``. ``floor``
        (per row) is a measured lower bound on the error the model cannot see (the split of exact
        ties, see :func:`_tie_split`); the estimate is at least that.
        """
        (dp,) = average_ties(z, self.dp)
        if dp is not self.dp:
            self.estimate = _estimate(dp)
        if floor is not None:
            self.estimate = np.maximum(self.estimate, floor)
            self.crossed = np.where((self.crossed < 0) & (floor > ILL_CONDITIONED_TOLERANCE), self.worst, self.crossed)
        bad = self.estimate > ILL_CONDITIONED_TOLERANCE
        fwd.aux["error_estimate"] = self.estimate
        if not bad.any():
            return

        def message(b: int) -> str:
            return (
                f"{method}: step {int(self.crossed[b])}: estimated error {self.estimate[b]:.1e} of p exceeds "
                f"{ILL_CONDITIONED_TOLERANCE:g}; rounding errors are amplified from round to round, most at "
                f"step {int(self.worst[b])} (x{self.growth[b]:.2g}), where {explain(b)}; {_FIX}"
            )

        _failed(fwd, "ill-conditioned", bad, self.crossed, message, self.estimate)

    def weighted_softmax_round(
        self, s: FloatArray, e_over_v: FloatArray, err_u: FloatArray, err_q: FloatArray, err_sum: FloatArray,
        err_p: FloatArray,
    ) -> None:
        """One round: ``q_i <- q_i V_i / S``, ``p_i <- p_i + s_i`` with ``V_i = S - e^{z_i}``.

        With ``dq`` relative: ``dq_i <- (1 - s_i) dq_i + (e^{z_i} / V_i)(X_i - dp_i)`` and
        ``dp_i <- dp_i + s_i ((1 - s_i) dq_i - X_i)``, ``X_i = sum_{j != i} s_j dq_j``, plus local
        errors of these sizes: ``err_u`` (relative, of ``u_i = q_i e^{z_i}`` as the round forms it),
        ``err_sum`` (relative, of ``S``), ``err_q`` (relative, of the new ``q``), ``err_p`` (absolute).
        """
        dq = self.dq + self.noise(err_u)
        dp = self.dp
        s3 = s[:, :, None]
        x = _exclusive_sum(s3 * dq)
        d_sum = self.noise(err_sum)
        self.dq = (1.0 - s3) * dq + _times(e_over_v[:, :, None], x - dp) - d_sum + self.noise(err_q)
        self.dp = dp + s3 * ((1.0 - s3) * dq - x - d_sum) + self.noise(err_p)




def _rnd(result: FloatArray, *operands: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    bound = _UNIT * np.abs(result)
    for x in operands:
        bound = np.minimum(bound, np.abs(x))
    return np.where(np.isfinite(result), bound, 0.0)


def _rnd_log(result: FloatArray, added: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    with np.errstate(invalid="ignore"):  # inf added to an empty sum: masked by isfinite
        bound = np.minimum(_UNIT * np.abs(result), np.abs(np.where(np.isfinite(added), added, 0.0))) + _UNIT
    return np.where(np.isfinite(result), bound, 0.0)


def _lse_added(parts: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(copied verbatim)"""
    top = np.max(parts, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # empty sums: log 0
        added = np.log(np.sum(np.exp(parts - safe), axis=-1, keepdims=True))
    return top, np.where(np.isfinite(top), added, 0.0)


def _log1pexp_added(x: FloatArray, other: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    with np.errstate(invalid="ignore"):  # -inf - -inf: both empty
        gap = np.abs(x - other)
    return np.where(np.isfinite(gap), np.log1p(np.exp(-np.where(np.isfinite(gap), gap, 0.0))), 0.0)


def _log_diff_added(lpos: FloatArray, lneg: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    with np.errstate(invalid="ignore", divide="ignore"):  # equal terms: log 0 (an exact zero, no error)
        gap = np.abs(lpos - lneg)
        added = np.log(-np.expm1(-np.where(np.isfinite(gap), gap, 1.0)))
    return np.where(np.isfinite(gap) & np.isfinite(added), added, 0.0)


def _lse_exclusive_error(parts: FloatArray, out: FloatArray) -> FloatArray:
    """(copied verbatim)"""
    _, added_total = _lse_added(parts)
    total = logsumexp(parts)[:, None]
    top = np.argmax(parts, axis=-1)[:, None]
    rest = parts.copy()
    np.put_along_axis(rest, top, _NEG_INF, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):  # masked entries and empty rows
        ratio = np.exp(parts - np.where(np.isfinite(total), total, 0.0))
        added_out = np.log1p(-np.minimum(ratio, 1.0))
    err = _rnd_log(total, added_total) + _rnd_log(out, added_out)
    _, added_rest = _lse_added(rest)
    np.put_along_axis(err, top, _rnd_log(np.take_along_axis(out, top, axis=-1), added_rest), axis=-1)
    return err


def _ws_faithful(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """(copied verbatim)"""
    bsz = z.shape[0]
    masked = np.isneginf(z)
    sq, lq = np.ones_like(z), np.zeros_like(z)  # q = 1
    sp, lp = np.zeros_like(z), np.full_like(z, _NEG_INF)  # p = 0
    steps: dict[str, list[FloatArray]] = {"s": [], "f": [], "rho": [], "c": [], "lf": [], "sf": [], "lrho": [], "ls": [], "ss": [],
                                         "lc": [], "sc": []}
    fwd = Forward(p=np.zeros_like(z), q=np.ones_like(z))
    err = _RoundingErrors(z)
    for t in range(k):
        a = np.where(masked, _NEG_INF, lq + z)  # log|u|, u = q e^z
        apos, aneg = _parts(sq, a)
        # S in the frame of the row's largest |u| (linear, so that the s_i sum to 1 exactly up to
        # rounding: log S itself would carry an absolute error of ulp(|z|) at large |z|)
        m = np.max(a, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.where(sq == 0, 0.0, sq * np.exp(a - m))
        s_lin = np.sum(e, axis=-1, keepdims=True)
        pole = s_lin[:, 0] == 0
        if pole.any():
            sentence = f"the normaliser sum_j (1 - p_j) e^{{z_j}} is exactly 0 at round {t + 1} (a pole)"
            _failed(fwd, "inf", pole, np.full(bsz, t + 1), sentence)
        s_lin = np.where(pole[:, None], 1.0, s_lin)
        s_sign = np.sign(s_lin)
        log_s = np.log(np.abs(s_lin))  # log|S| = m + log_s; differences subtract m first
        xpos, xneg = logsumexp_exclusive(apos), logsumexp_exclusive(aneg)  # sum_{j != i} u_j, by sign
        if store:  # X_i = sum_{j != i} u_j, for c = X / S (the derivatives only)
            t_sign, lt = _log_diff(xpos, xneg)
        lpe = lp + z  # log|p_i e^{z_i}|
        ppos, pneg = _parts(sp, lpe)
        vpos, vneg = np.logaddexp(xpos, pneg), np.logaddexp(xneg, ppos)
        v_sign, lv = _log_diff(vpos, vneg)  # V_i = S - e^{z_i} = sum_{j != i} u_j - p_i e^{z_i}
        # V_i is a difference of positive sums; where it cancels to rounding noise (or to exactly 0)
        # before the last round, float64 has dropped the small terms that keep 1 - p_i away from 0,
        # and the next rounds multiply that noise by e^{z_i} / S (tied maxima at small tau:
        # x = 1,1,0, k = 3, tau = 0.01 would return 1,1,1 instead of 1.3,1.3,0.4). Exactly 0 is right
        # only at the last round (all-equal entries saturating together), so that round is exempt.
        with np.errstate(invalid="ignore"):  # -inf - -inf on masked entries: excluded below
            noise = (lv - np.logaddexp(vpos, vneg)) < _LOG_NOISE
        lost = (noise & (sq != 0) & ~masked).any(axis=-1) if t < k - 1 else np.zeros(bsz, bool)
        if lost.any():
            sentence = (
                f"weighted-softmax: round {t + 1}: S - e^{{z_i}} = sum_{{j != i}} (1 - p_j) e^{{z_j}} - p_i e^{{z_i}} "
                "cancelled to float64 rounding noise, losing the small terms that keep 1 - p_i > 0 for the "
                "rounds left (typically tied maxima at small tau); the operator is ill-conditioned at this "
                "input in float64 (use a larger tau or a threshold method)"
            )
            _failed(fwd, "ill-conditioned", lost, np.full(bsz, t + 1), sentence)
        l_step = (a - m) - log_s  # log|s_i|
        l_f = (lv - m) - log_s  # log|f_i|, f_i = 1 - e^{z_i}/S = q_new_i / q_i
        s_val = e / s_lin
        if store:
            steps["s"].append(s_val)
            steps["f"].append(_to_linear(v_sign * s_sign, l_f))
            steps["c"].append(_to_linear(t_sign * s_sign, (lt - m) - log_s))
            steps["rho"].append(_to_linear(s_sign * np.ones_like(z), (z - m) - log_s))
            # log-space copies of the factors that overflow beyond gaps of ~709 (signed rho = sign(S) e^lrho)
            steps["lf"].append(l_f)
            steps["sf"].append(v_sign * s_sign)
            steps["lrho"].append(np.where(masked, _NEG_INF, (z - m) - log_s))
            steps["ls"].append(np.where(sq == 0, _NEG_INF, l_step))
            steps["ss"].append(sq * s_sign)
            steps["lc"].append(np.where(t_sign == 0, _NEG_INF, (lt - m) - log_s))
            steps["sc"].append(t_sign * s_sign)
        sp_new, lp_new = _signed_add(sp, lp, sq * s_sign, l_step)
        err_u, err_q, err_p = _ws_local_errors({
            "a": a, "m": m, "lq": lq, "z": z, "lv": lv, "sq": sq, "lpe": lpe, "lp": lp, "sp": sp, "apos": apos,
            "aneg": aneg, "xpos": xpos, "xneg": xneg, "vpos": vpos, "vneg": vneg, "l_f": l_f, "log_s": log_s,
            "sp_new": sp_new, "lp_new": lp_new, "s": s_val, "p": _to_linear(sp, lp), "l_step": l_step,
        })
        with np.errstate(over="ignore", invalid="ignore"):  # V_i = 0: an infinite factor (on a zero error)
            e_over_v = np.where(v_sign == 0, 0.0, v_sign * np.exp(z - lv))
        kappa_s = np.sum(np.abs(e), axis=-1) / np.abs(s_lin[:, 0])
        err.weighted_softmax_round(s_val, e_over_v, err_u, err_q, _UNIT * kappa_s[:, None], err_p)
        err.close_round(t, _ws_cause(kappa_s, s_val, vpos, vneg, lv, e_over_v))
        sp, lp = sp_new, lp_new
        sq, lq = sq * v_sign * s_sign, lq + l_f
        lq = np.where(sq == 0, _NEG_INF, lq)
    fwd.p = np.where(masked, 0.0, _to_linear(sp, lp))
    fwd.aux = {name: np.stack(vals, axis=1) for name, vals in steps.items()} if store else {}  # (B, k, n)
    fwd.aux["fast"] = np.zeros(bsz)
    err.report(fwd, z, "weighted-softmax", lambda b: _ws_explain(err.cause, b))
    fwd.q = np.where(masked, 1.0, _ws_complement(fwd.p, sq, lq, err))
    return fwd


def _ws_complement(p: FloatArray, sq: FloatArray, lq: FloatArray, err: _RoundingErrors) -> FloatArray:
    """(copied verbatim)"""
    q_log = _to_linear(sq, lq)
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up estimate is inf
        rel = _SAFETY * np.sqrt(np.einsum("bic,bic->bi", err.dq, err.dq) / _SAMPLES)
        err_log = np.nan_to_num(rel * np.abs(q_log), nan=np.inf)
    q_sub = 1.0 - p
    err_sub = err.estimate[:, None] + _UNIT * np.maximum(1.0, np.abs(p))
    # a log-space exact 0 (V_i cancelled exactly) is kept only where 1 - p agrees with 0
    err_log = np.where(q_log == 0, np.where(np.abs(q_sub) <= err_sub, 0.0, np.inf), err_log)
    return np.where(err_sub < err_log, q_sub, q_log)


def _ws_local_errors(r: dict[str, FloatArray]) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(copied verbatim)"""
    a, m, lq, z, lv = r["a"], r["m"], r["lq"], r["z"], r["lv"]
    live = np.isfinite(a) & (r["sq"] != 0)
    err_u = _rnd(a, lq, z) + _rnd(a - m, a, m) + _UNIT
    lpe_err = _rnd(r["lpe"], r["lp"], z)
    pneg, ppos = np.where(r["sp"] < 0, r["lpe"], _NEG_INF), np.where(r["sp"] > 0, r["lpe"], _NEG_INF)
    with np.errstate(over="ignore", invalid="ignore"):  # V_i = 0 (an exact zero of q_i): infinite error
        err_v = np.full_like(lv, _UNIT)
        for x, excl, other, v in (
            (r["xpos"], _lse_exclusive_error(r["apos"], r["xpos"]), pneg, r["vpos"]),
            (r["xneg"], _lse_exclusive_error(r["aneg"], r["xneg"]), ppos, r["vneg"]),
        ):
            err_part = (_times(np.exp(x - v), excl) + _times(np.exp(other - v), lpe_err)
                        + _rnd_log(v, _log1pexp_added(x, other)))
            err_v = err_v + _times(np.exp(v - lv), err_part)
        err_v = err_v + _rnd_log(lv, _log_diff_added(r["vpos"], r["vneg"]))
    lvm = lv - m
    err_q = err_v + _rnd(lvm, lv, m) + _rnd(r["l_f"], lvm, r["log_s"]) + _rnd(lq + r["l_f"], lq, r["l_f"])
    err_q = np.where(live, np.nan_to_num(err_q, nan=np.inf), 0.0)
    p_new = np.abs(_to_linear(r["sp_new"], r["lp_new"]))
    s_abs = np.abs(r["s"])
    same = r["sp"] * r["sq"] * np.sign(r["s"]) > 0  # p and the step s_i have one sign: a sum, else a difference
    added_p = np.where(same, _log1pexp_added(r["lp"], r["l_step"]), _log_diff_added(r["lp"], r["l_step"]))
    err_p = (p_new * _rnd_log(r["lp_new"], added_p) + _UNIT * np.maximum(np.abs(r["p"]), s_abs)
             + s_abs * _rnd(r["l_step"], a - m, r["log_s"]))
    return np.where(live, err_u, 0.0), err_q, np.where(np.isfinite(a), err_p, 0.0)


def _ws_cause(
    kappa_s: FloatArray, s: FloatArray, vpos: FloatArray, vneg: FloatArray, lv: FloatArray, e_over_v: FloatArray
) -> dict[str, FloatArray]:
    """(copied verbatim)"""
    with np.errstate(over="ignore", invalid="ignore"):  # V_i = 0: infinite cancellation
        kappa_v = np.nan_to_num(np.exp(vpos - lv) + np.exp(vneg - lv), nan=np.inf)
    kappa_v = np.where(np.isfinite(vpos) | np.isfinite(vneg), kappa_v, 1.0)
    return {
        "kappa_s": kappa_s,
        "kappa_v": np.max(kappa_v, axis=-1),
        "entry": np.argmax(kappa_v, axis=-1).astype(np.float64),
        "s_max": np.max(np.abs(s), axis=-1),
        "gain": np.max(np.abs(e_over_v), axis=-1),
        "gain_entry": np.argmax(np.abs(e_over_v), axis=-1).astype(np.float64),
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
