"""``weighted-softmax``: ``k`` rounds of ``p <- p + q e^z / sum_j q_j e^{z_j}`` (``q = 1 - p``) in signed
log space, with the running error estimate of :mod:`~topk_cli.operators._logsigned` (see
:mod:`~topk_cli.operators.sequential` for the method and its failure modes)."""

from __future__ import annotations

import decimal

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import OK, FloatArray, Forward, Implementation, _combine_rows
from topk_cli.operators._logsigned import (
    _NEG_INF,
    _UNIT,
    ILL_CONDITIONED_TOLERANCE,
    _checked,
    _exclusive_sum,
    _signed_add,
    _slog_sum,
    _to_linear,
    _total_without_largest,
)
from topk_cli.operators._weighted_softmax_faithful import _ws_faithful
from topk_cli.operators._weighted_softmax_fast import (
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

    Rows without masked entries first go through
    :func:`~topk_cli.operators._weighted_softmax_fast.ws_fast` (plain float64 rounds with a rigorous
    error bound, which takes the errors of entries more than
    :data:`~topk_cli.operators._weighted_softmax_fast.FAST_MAX_GAP` below the maximum as absolute); the
    rows it cannot certify, and the others, are computed by :func:`_ws_faithful`.
    ``aux["fast"]`` is 1.0 on the rows the fast path returned.

    The rounds (``k`` arrays of ``n`` per row) are not kept: a forward pass needs ``O(B n)`` memory on
    the fast rows, and the Jacobian and VJP recompute them (:func:`_ws_forward`; the API's VJP runs
    :func:`_ws_forward_vjp`, one pass for both).

    >>> weighted_softmax_topk(np.array([[0.0, -1.0]]), 1).p.round(4)
    array([[0.7311, 0.2689]])
    """
    return _ws_forward(z, k, store=False)


def _eligible(z: FloatArray) -> NDArray[np.bool_]:
    """The rows the fast path takes: no masked entry and ``max z = 0``. Entries more than
    :data:`~topk_cli.operators._weighted_softmax_fast.FAST_MAX_GAP` below the maximum are allowed (their
    ``e^z`` may be subnormal or 0: the fast path's bound charges them absolutely)."""
    with np.errstate(invalid="ignore"):  # -inf - -inf on fully masked input: not eligible
        return np.asarray(np.isfinite(z).all(axis=-1) & (z.max(axis=-1) == 0.0), dtype=bool)


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
    for r in np.flatnonzero(unresolved):  # beyond float64's logs: in decimal arithmetic, or refused (NaN)
        exact = _ws_jacobian_decimal(zr[r], k)
        out[r] = np.nan if exact is None else exact
    return out


#: The largest ``k m^3`` (``m`` unmasked entries) for which :func:`_ws_jacobian_decimal` runs on a row
#: (its cost: about 3 s at ``k m^3 = 1e5``, one loaded core); beyond it such a row is refused.
DECIMAL_MAX_WORK = 1e5

#: The relative agreement, per entry, of two precisions that certifies :func:`_ws_jacobian_decimal`.
_DECIMAL_AGREE = decimal.Decimal("1e-20")
#: The largest ``|z|`` :func:`_ws_jacobian_decimal` takes: ``e^{-z}`` must stay within decimal's exponent
#: range (``10^-999999999999999999``, i.e. ``|z|`` up to about 2.3e18), products of k of them included.
_DECIMAL_MAX_Z = 1e16
#: Below float64's range (an entry that is exactly 0 need only agree to this, as it rounds to 0 anyway).
_DECIMAL_FLOOR = decimal.Decimal("1e-340")


def _ws_jacobian_decimal(z: FloatArray, k: int) -> FloatArray | None:
    """``dp/dz`` of one row (``(n,)``, masked entries ``-inf``) in :mod:`decimal` arithmetic, for the rows
    whose log-space derivative float64 cannot resolve (gaps in ``z`` of 1e5 and more: the logs carry
    absolute errors ``u |gap|`` that leave noise where terms of size ``e^{+-gap}`` cancel).

    Forward mode through ``p <- p + q e^z / S``, ``q <- q (S - e^z) / S`` with ``S - e_i`` formed as
    ``sum_{j != i} q_j e_j - p_i e_i`` (``q`` is never ``1 - p``), with an unbounded exponent range (so
    ``e^{-1e7}`` is a number, not 0), at ``P`` and ``2P`` digits from ``P = 40 + log10 max|z|``, doubled
    until every entry agrees to 1e-20 relative (or below 1e-340). None when ``k m^3`` exceeds
    :data:`DECIMAL_MAX_WORK`, ``|z|`` exceeds 1e16 (beyond decimal's exponent range), or no precision up
    to 5000 digits agrees."""
    live = np.flatnonzero(np.isfinite(z))
    m = live.size
    big = float(np.max(np.abs(z[live]), initial=1.0))
    if k * m**3 > DECIMAL_MAX_WORK or big > _DECIMAL_MAX_Z:
        return None
    prec = 40 + int(np.ceil(np.log10(max(big, 1.0))))
    while prec <= 5000:
        try:
            low = _ws_decimal_rounds([float(v) for v in z[live]], k, prec)
            high = _ws_decimal_rounds([float(v) for v in z[live]], k, 2 * prec)
        except ArithmeticError:  # a sum S that underflowed to 0 (decimal's exceptions are ArithmeticErrors)
            return None
        if all(abs(u - v) <= _DECIMAL_AGREE * max(abs(v), _DECIMAL_FLOOR) for ru, rv in zip(low, high, strict=True)
               for u, v in zip(ru, rv, strict=True)):
            out = np.zeros((z.size, z.size))
            out[np.ix_(live, live)] = [[float(v) for v in row] for row in high]
            return out
        prec *= 2
    return None


def _ws_decimal_rounds(z: list[float], k: int, prec: int) -> list[list[decimal.Decimal]]:
    """``dp_i / dz_j`` of ``k`` rounds at ``prec`` digits (see :func:`_ws_jacobian_decimal`)."""
    ctx = decimal.Context(prec=prec, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[decimal.InvalidOperation])
    zero = decimal.Decimal(0)
    with decimal.localcontext(ctx):
        m = len(z)
        e = [decimal.Decimal(v).exp() for v in z]
        p = [zero] * m
        q = [decimal.Decimal(1)] * m
        dp = [[zero] * m for _ in range(m)]
        dq = [[zero] * m for _ in range(m)]
        for _ in range(k):
            t = [q[i] * e[i] for i in range(m)]
            total = sum(t, zero)
            dt = [[dq[i][j] * e[i] + (t[i] if i == j else zero) for j in range(m)] for i in range(m)]
            ds = [sum((dt[i][j] for i in range(m)), zero) for j in range(m)]
            s2 = total * total
            new_p, new_q, new_dp, new_dq = [], [], [], []
            for i in range(m):
                rest = sum((t[j] for j in range(m) if j != i), zero)
                r_i = rest - p[i] * e[i]  # S - e_i without cancelling S against e_i
                new_p.append(p[i] + t[i] / total)
                new_q.append(q[i] * r_i / total)
                row_p, row_q = [], []
                for j in range(m):
                    d_r = (ds[j] - dt[i][j]) - dp[i][j] * e[i] - (p[i] * e[i] if i == j else zero)
                    row_p.append(dp[i][j] + dt[i][j] / total - t[i] * ds[j] / s2)
                    row_q.append((dq[i][j] * r_i + q[i] * d_r) / total - q[i] * r_i * ds[j] / s2)
                new_dp.append(row_p)
                new_dq.append(row_q)
            p, q, dp, dq = new_p, new_q, new_dp, new_dq
        return dp


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


#: The largest ``n k`` per row :data:`WEIGHTED_SOFTMAX` runs: k rounds over the row cost O(n k),
#: measured (one core, machine loaded) at 30 ns per ``n k`` on rows the fast path certifies and
#: 6-7.6 us on the others (n = 4000, k = 2000: 47 s; n = 20000, k = 1000: 152 s).
WEIGHTED_SOFTMAX_MAX_ROW_WORK = 1e7

WEIGHTED_SOFTMAX = Implementation(
    forward=weighted_softmax_topk, jacobian=_ws_jacobian, vjp=_ws_vjp, forward_vjp=_ws_forward_vjp,
    max_row_work=WEIGHTED_SOFTMAX_MAX_ROW_WORK,
)
