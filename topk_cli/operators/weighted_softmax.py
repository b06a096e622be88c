"""``weighted-softmax``: ``k`` rounds of ``p <- p + q e^z / sum_j q_j e^{z_j}`` (``q = 1 - p``) in signed
log space, with the running error estimate of :mod:`~topk_cli.operators._logsigned` (see
:mod:`~topk_cli.operators.sequential` for the method and its failure modes)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import OK, FloatArray, Forward, Implementation, _combine_rows
from topk_cli.operators._logsigned import (
    _LOG_NOISE,
    _NEG_INF,
    _SAFETY,
    _SAMPLES,
    _UNIT,
    ILL_CONDITIONED_TOLERANCE,
    _checked,
    _exclusive_sum,
    _failed,
    _log1pexp_added,
    _log_diff,
    _log_diff_added,
    _lse_exclusive_error,
    _parts,
    _rnd,
    _rnd_log,
    _RoundingErrors,
    _signed_add,
    _slog_sum,
    _times,
    _to_linear,
    _total_without_largest,
)
from topk_cli.operators._logspace import logsumexp_exclusive
from topk_cli.operators._weighted_softmax_fast import (
    FAST_MAX_GAP,
    _ws_expand,
    _ws_expand_rows,
    _ws_rounds,
    _ws_vjp_compact,
    _ws_w,
    ws_fast,
    ws_fast_vjp,
)


def weighted_softmax_topk(z: FloatArray, k: int) -> Forward:
    """``k`` rounds of ``p <- p + q e^z / sum(q e^z)`` with ``q = 1 - p``, certified fast or faithful.

    Rows without masked entries whose gap ``max z - min z`` is at most
    :data:`~topk_cli.operators._weighted_softmax_fast.FAST_MAX_GAP` first go through
    :func:`~topk_cli.operators._weighted_softmax_fast.ws_fast` (plain float64 rounds with a rigorous
    error bound); the rows it cannot certify, and the others, are computed by :func:`_ws_faithful`.
    ``aux["fast"]`` is 1.0 on the rows the fast path returned.

    The rounds (``k`` arrays of ``n`` per row) are not kept: a forward pass needs ``O(B n)`` memory on
    the fast rows, and the Jacobian and VJP recompute them (:func:`_ws_forward`; the API's VJP runs
    :func:`_ws_forward_vjp`, one pass for both).

    >>> weighted_softmax_topk(np.array([[0.0, -1.0]]), 1).p.round(4)
    array([[0.7311, 0.2689]])
    """
    return _ws_forward(z, k, store=False)


def _eligible(z: FloatArray) -> NDArray[np.bool_]:
    """The rows the fast path takes: no masked entry, ``max z = 0`` and a gap of at most
    :data:`~topk_cli.operators._weighted_softmax_fast.FAST_MAX_GAP`."""
    with np.errstate(invalid="ignore"):  # -inf - -inf on fully masked input: not eligible
        return np.asarray(np.isfinite(z).all(axis=-1) & (np.max(z, axis=-1) == 0.0)
                          & (np.min(z, axis=-1) >= -FAST_MAX_GAP), dtype=bool)


def _ws_forward(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """:func:`weighted_softmax_topk`, with the rounds the derivatives read in ``aux`` when ``store``
    (else only ``aux["fast"]`` and ``aux["error_estimate"]``; the same ``p``, ``q`` and codes).

    Stored, the fast rows' ``aux`` has no log-space copies (:func:`_ws_log_aux` derives them) and, when
    every row is fast, keeps ``rho`` and ``c`` compactly
    (:func:`~topk_cli.operators._weighted_softmax_fast._ws_rounds` forms them); a mixed batch gets them
    stored (:func:`~topk_cli.operators._weighted_softmax_fast._ws_expand`)."""
    eligible = _eligible(z)
    if not eligible.any():
        return _ws_faithful(z, k, store=store)
    rows = np.flatnonzero(eligible)
    fast = ws_fast(z if eligible.all() else z[rows], k, store=store)
    rescue = np.concatenate([np.flatnonzero(~eligible), rows[fast.aux["fast"] == 0]])
    if rescue.size == 0:
        return fast
    slow = _ws_faithful(z[rescue], k, store=store)
    if not store:
        slow.aux = {name: slow.aux[name] for name in fast.aux}
        return _combine_rows(z.shape[0], [(rows, fast), (rescue, slow)])
    _ws_expand(fast, z if eligible.all() else z[rows], k)
    # the faithful part first, as it carries every aux key (the log-space copies stay 0 on fast rows),
    # then the fast part, then the faithful part again over the fast path's uncertified rows
    return _combine_rows(z.shape[0], [(rescue, slow), (rows, fast), (rescue, slow)])


def _ws_forward_vjp(z: FloatArray, k: int, v: FloatArray) -> tuple[Forward, FloatArray]:
    """:func:`weighted_softmax_topk` and :func:`_ws_vjp` in one pass: the fast rows by
    :func:`~topk_cli.operators._weighted_softmax_fast.ws_fast_vjp` (rounds held for one block of rows
    at a time), the others faithfully (forward and VJP). With failed rows the API reports the
    forward's failure, so no derivative is computed for them."""
    eligible = _eligible(z)
    out = np.zeros_like(z)
    if not eligible.any():
        fwd = _ws_faithful(z, k)
        if (fwd.codes() == OK).all() and np.isfinite(fwd.p).all():
            out = _ws_vjp(fwd, z, k, v)
        return _ws_without_rounds(fwd), out
    rows = np.flatnonzero(eligible)
    every = eligible.all()
    fast, out_fast = ws_fast_vjp(z if every else z[rows], k, v if every else v[rows])
    rescue = np.concatenate([np.flatnonzero(~eligible), rows[fast.aux["fast"] == 0]])
    if rescue.size == 0:
        return fast, _checked(out_fast, "weighted-softmax")
    out[rows] = out_fast
    slow = _ws_faithful(z[rescue], k)
    failed = (slow.codes() != OK).any() or not np.isfinite(slow.p).all()
    out[rescue] = 0.0 if failed else _ws_vjp(slow, z[rescue], k, v[rescue])
    slow.aux = {name: slow.aux[name] for name in fast.aux}
    whole = _combine_rows(z.shape[0], [(rows, fast), (rescue, slow)])
    return whole, out if failed else _checked(out, "weighted-softmax")


def _ws_without_rounds(fwd: Forward) -> Forward:
    """``fwd`` with only the ``aux`` of a forward pass that keeps no rounds."""
    fwd.aux = {name: fwd.aux[name] for name in ("error_estimate", "fast") if name in fwd.aux}
    return fwd


def _ws_stored(fwd: Forward, z: FloatArray, k: int) -> Forward:
    """``fwd``, or the forward pass with its rounds stored when ``fwd`` kept none (recomputed: the
    same bits; quietly, as the forward pass it repeats ran)."""
    if "s" in fwd.aux:
        return fwd
    with np.errstate(all="ignore"):
        return _ws_forward(z, k)


def _ws_faithful(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """``k`` rounds of ``p <- p + q e^z / sum(q e^z)`` with ``q = 1 - p``, in signed log space.

    Shapes: ``z`` is ``(B, n)`` (see ``_base``); ``p`` and ``q`` are ``(B, n)``, ``sum p = k``.
    ``p`` is not confined to [0, 1]; as ``tau -> 0`` with ``k = 2`` it tends to
    ``(1.5, 0.5, 0, ...)``. Rows where the normaliser ``S`` vanishes (a pole) get code ``"inf"``,
    rows whose estimated error exceeds :data:`ILL_CONDITIONED_TOLERANCE` ``"ill-conditioned"``.
    Without ``store`` the rounds the derivatives read are neither formed nor kept (``aux`` holds only
    ``fast`` and ``error_estimate``; ``p``, ``q`` and the codes are the same bits).

    >>> _ws_faithful(np.array([[0.0, -3000.0, -6000.0]]), 2).p.round(4)
    array([[1.5, 0.5, 0. ]])
    """
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
        err_log = np.nan_to_num(rel * np.abs(q_log), nan=np.inf)
    q_sub = 1.0 - p
    err_sub = err.estimate[:, None] + _UNIT * np.maximum(1.0, np.abs(p))
    # a log-space exact 0 (V_i cancelled exactly) is kept only where 1 - p agrees with 0
    err_log = np.where(q_log == 0, np.where(np.abs(q_sub) <= err_sub, 0.0, np.inf), err_log)
    return np.where(err_sub < err_log, q_sub, q_log)


def _ws_local_errors(r: dict[str, FloatArray]) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Local rounding errors of one ``weighted-softmax`` round (named quantities of the loop).

    Returns the relative error of ``u_i = q_i e^{z_i}`` as the round forms it (``log u = log q + z``,
    then ``- m``), the relative error of the new ``q_i`` (the log-sums making ``V_i = P_i - N_i``,
    amplified by the cancellation ``(P_i + N_i) / |V_i|``, then ``log f = log V - log S`` and
    ``log q + log f``), and the absolute error of the new ``p_i`` (``log s_i``, the signed add).
    Every log-space operation is charged by :func:`_rnd` or :func:`_rnd_log`: ``u`` times the
    magnitude of the log, unless what was added is smaller (then the sum is nearly exact).
    """
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
    """What a round does to errors: the cancellation of ``S`` and of the worst ``V_i``, the largest
    ``|s_i|`` and the largest ``|e^{z_i} / V_i|`` (the gain from an error of ``p_i`` to ``1 - p_i``)."""
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


def _ws_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """Forward mode: ``dq <- f dq - s (c dz - X - Y)``, ``X_i = sum_{j != i} s_j dz_j``,
    ``Y = sum_j rho_j dq_j``, ``dp = -dq``; all ``n`` directions at once.

    In linear float64 first; the rows where that overflowed (``f`` and ``rho = e^{z}/S`` pass
    ``e^709`` once a gap in ``z`` exceeds ~709, while ``dq`` is as small as ``q``) are recomputed in
    signed log space (:func:`_ws_jacobian_log`), where those products are representable.
    """
    fwd = _ws_stored(fwd, z, k)
    out = _ws_jacobian_linear(fwd, z, k)
    bad = np.asarray(~np.isfinite(out.reshape(out.shape[0], -1)).all(axis=-1), dtype=bool)
    if bad.any():
        out[bad] = _ws_jacobian_log(fwd, z, k, bad)
    return _checked(out, "weighted-softmax")


#: The log-space derivative multiplies factors ``e^L`` whose logs ``L`` (of size up to the largest
#: gap in ``z``) carry absolute rounding errors ``u |L|`` per operation; over ``k`` rounds the
#: derivative's error (in units of ``1/tau``) is about this factor times ``k u max |L|``.
_LOG_JACOBIAN_GROWTH = 16.0


def _ws_log_jacobian_error(fwd: Forward, z: FloatArray, k: int, rows: NDArray[np.bool_]) -> FloatArray:
    """Per row, the error bound of :func:`_ws_jacobian_log` (in units of ``1/tau``)."""
    fwd = _ws_stored(fwd, z, k)
    big = np.zeros(int(rows.sum()))
    aux = _ws_log_aux(fwd, z, rows)
    for name in ("lf", "lrho", "ls", "lc"):
        vals = aux[name]
        big = np.maximum(big, np.max(np.where(np.isfinite(vals), np.abs(vals), 0.0), axis=(1, 2)))
    return _LOG_JACOBIAN_GROWTH * k * _UNIT * big


def _ws_log_aux(fwd: Forward, z: FloatArray, rows: NDArray[np.bool_]) -> dict[str, FloatArray]:
    """The log-space copies of the rounds (``lf``, ``sf``, ``lrho``, ``ls``, ``ss``, ``lc``, ``sc``, with
    ``rho``) on ``rows``: as stored by the faithful path, derived from the linear ``f``, ``rho``, ``s``,
    ``c`` on the fast path's rows (those are relatively accurate and finite there, so their logs are as
    good as the faithful ones)."""
    fast = fwd.aux.get("fast", np.zeros(fwd.p.shape[0]))[rows] > 0
    if not fast.any():
        return {name: fwd.aux[name][rows] for name in ("lf", "sf", "lrho", "rho", "ls", "ss", "lc", "sc")}
    sub = _ws_expand_rows(fwd, z, rows)
    out = {"rho": sub["rho"]}
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # log 0 = -inf: an exact zero
        for lname, sname, lin in (("lf", "sf", "f"), ("lrho", "", "rho"), ("ls", "ss", "s"), ("lc", "sc", "c")):
            vals = sub[lin]
            out[lname] = np.log(np.abs(vals))
            if sname:
                out[sname] = np.sign(vals)
    if not fast.all():
        for name in ("lf", "sf", "lrho", "ls", "ss", "lc", "sc"):
            out[name] = np.where(fast[:, None, None], out[name], fwd.aux[name][rows])
    return out


def _ws_jacobian_log(fwd: Forward, z: FloatArray, k: int, rows: NDArray[np.bool_]) -> FloatArray:
    """The forward mode of :func:`_ws_jacobian` on ``rows``, with ``dq``, ``f dq`` and
    ``Y = sum_j rho_j dq_j`` in signed log space: ``f`` and ``rho`` may overflow and ``dq``
    underflow while their products are moderate. ``O(k n^2)`` exponentials and logs per row."""
    fwd = _ws_stored(fwd, z, k)
    zr = z[rows]
    bsz, n = zr.shape
    live = np.isfinite(zr)
    eye = np.broadcast_to(np.eye(n), (bsz, n, n)) * live[:, :, None] * live[:, None, :]
    off = (1.0 - np.eye(n)) * live[:, :, None] * live[:, None, :]
    sdq, ldq = np.zeros((bsz, n, n)), np.full((bsz, n, n), _NEG_INF)
    # rows whose logs are too large for float64 to give the derivative to the tolerance are NaN
    # (refused by the caller) rather than returned wrong
    unresolved = _ws_log_jacobian_error(fwd, z, k, rows) > ILL_CONDITIONED_TOLERANCE
    aux = _ws_log_aux(fwd, z, rows)
    diag = eye > 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # -inf logs are exact zeros
        for t in range(k):
            lf, sf, lrho = aux["lf"][:, t], aux["sf"][:, t], aux["lrho"][:, t]
            srho = np.sign(aux["rho"][:, t])
            s_s, s_l, c_s, c_l = (aux[name][:, t] for name in ("ss", "ls", "sc", "lc"))
            sy, ly = _slog_sum(srho[:, :, None] * sdq, lrho[:, :, None] + ldq, axis=1)  # Y_d, (B, n)
            # s_i (c_i [i = d] - s_d [i != d] - Y_d): diagonal and off-diagonal terms, then s_i Y_d
            b_s = np.where(diag, (s_s * c_s)[:, :, None], -s_s[:, :, None] * s_s[:, None, :] * off)
            b_l = np.where(diag, (s_l + c_l)[:, :, None], s_l[:, :, None] + s_l[:, None, :])
            b_l = np.where(b_s == 0, _NEG_INF, b_l)
            b_s, b_l = _signed_add(b_s, b_l, -s_s[:, :, None] * sy[:, None, :], s_l[:, :, None] + ly[:, None, :])
            sdq, ldq = _signed_add(sf[:, :, None] * sdq, lf[:, :, None] + ldq, -b_s, b_l)
            sdq = np.where(live[:, :, None], sdq, 0.0)
            ldq = np.where(live[:, :, None] & (sdq != 0), ldq, _NEG_INF)
        out = -_to_linear(sdq, ldq)
    out[unresolved] = np.nan
    return out


def _ws_jacobian_linear(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """The forward mode of :func:`_ws_jacobian` in linear float64 (may overflow, see there)."""
    fwd = _ws_stored(fwd, z, k)
    bsz, n = z.shape
    live = np.isfinite(z)
    eye = np.broadcast_to(np.eye(n), (bsz, n, n)) * live[:, :, None] * live[:, None, :]
    dq = np.zeros((bsz, n, n))
    w = _ws_w(fwd, z)
    for t in range(k):
        s, f, rho, c = (a[:, :, None] for a in _ws_rounds(fwd, z, t, w))
        x_excl = _exclusive_sum(s * eye)
        y = np.sum(np.where(live[:, :, None], rho * dq, 0.0), axis=1, keepdims=True)
        dq = f * dq - s * (c * eye - x_excl - y)
        dq = np.where(live[:, :, None], dq, 0.0)
    return -dq


def _ws_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """Reverse mode through the rounds stored in ``fwd.aux`` (the transpose of the Jacobian's
    forward mode): ``O(k n)`` time per row. A forward pass that kept no rounds is recomputed, with the
    VJP (:func:`_ws_forward_vjp`) when every row of it succeeded."""
    if "s" not in fwd.aux:
        if (fwd.codes() == OK).all():
            return _ws_forward_vjp(z, k, v)[1]
        fwd = _ws_stored(fwd, z, k)
    live = np.isfinite(z)
    masked = not live.all()  # without masked entries the stored rounds are all finite: no masking needed
    rows = np.arange(z.shape[0])
    qbar = np.where(live, -v, 0.0)
    w = _ws_w(fwd, z)
    if w is not None:  # every row from the fast path (no masked entries)
        return _checked(_ws_vjp_compact(fwd, w, k, qbar), "weighted-softmax")
    zbar = np.zeros_like(qbar)
    for t in reversed(range(k)):
        s, f, rho, c = (np.where(live, a, 0.0) if masked else a for a in _ws_rounds(fwd, z, t, w))
        g = s * qbar  # minus the cotangent of c dz - X (the signs are folded into the updates below)
        # X_i = sum_{j != i} g_j: total minus own term, except for the entry of largest |g|
        total, top, rest = _total_without_largest(g, rows)
        x_excl = total[:, None] - g
        x_excl[rows, top] = rest
        zbar -= c * g
        zbar += s * x_excl
        qbar = f * qbar
        qbar += rho * total[:, None]
        if masked:
            qbar = np.where(live, qbar, 0.0)
    out = zbar
    bad = ~np.isfinite(out).all(axis=-1)
    # rows that overflowed (gaps beyond ~709): v^T J from the log-space Jacobian, one row at a
    # time (O(k n^2) for those rows only)
    for b in np.flatnonzero(bad):
        row = np.zeros(z.shape[0], dtype=bool)
        row[b] = True
        out[b] = v[b] @ _ws_jacobian_log(fwd, z, k, row)[0]
    return _checked(out, "weighted-softmax")


WEIGHTED_SOFTMAX = Implementation(
    forward=weighted_softmax_topk, jacobian=_ws_jacobian, vjp=_ws_vjp, forward_vjp=_ws_forward_vjp
)
