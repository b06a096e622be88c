"""The sequential operators ``iterative`` and ``weighted-softmax``, computed faithfully.

Both build ``p`` in ``k`` rounds, each adding one softmax-like distribution, on a ``(B, n)``
batch ``z`` (last axis; see ``_base`` for the contract). With ``q = 1 - p``:

* ``iterative`` (Su 2019): ``d = z - min z``; ``k`` times ``p <- p + softmax(q * d)``;
* ``weighted-softmax``: ``k`` times ``p <- p + q e^z / sum_j q_j e^{z_j}``.

Neither keeps ``0 <= p <= 1``: ``q`` goes negative (``weighted-softmax``, ``k = 2``, ``tau -> 0``
tends to 1.5 on the max and 0.5 on the second entry; ``iterative`` at ``k = n`` on ``(1, 0)``
gives ``p_1 = 1.298``). The point of this module is to report that true mathematics rather than
float64 artefacts: computed naively, ``1 - p`` rounds to 0 once ``p`` is within 1e-16 of 1,
which changes the answer (and hides the wrong limit). So ``q`` is carried *relatively*
accurately through the rounds:

* ``weighted-softmax`` works in signed log space, ``(sign, log|.|)``, for ``q``, ``p`` and
  ``u = q e^z``. The update ``q_i <- q_i (S - e^{z_i}) / S`` uses
  ``S - e^{z_i} = sum_{j != i} u_j - p_i e^{z_i}``, whose positive and negative parts are
  exclusive log-sums (no subtraction of ``e^{z_i}`` from a sum that contains it), so ``q_1``
  after round one is ``e^{z_2 - z_1}``-small and exact to rounding even when that underflows
  in linear space. ``S`` may be negative (``k >= 3`` at small ``tau``): that is the operator.
  ``S = 0`` is a pole: the row is reported with code ``"inf"``.
* ``iterative`` works in linear space (``q * d`` only needs ``q`` relatively accurate, and
  that survives underflow of ``q``): ``c = 1 - s`` comes from an exclusive log-sum, and the new
  ``q`` is ``q - s`` or ``c - p``, whichever has the smaller rounding bound.

Derivatives (with respect to ``z``; the public API divides by ``tau``): the Jacobian is forward
mode through the ``k`` rounds, ``O(k n^2)`` per row; the VJP is reverse mode, ``O(k n)`` time
per row but it stores the ``k`` rounds, ``O(B k n)`` memory (kept in ``Forward.aux``). Both use
the accurate complements and exclusive sums, so saturated entries keep their (tiny) relative
accuracy. For ``weighted-softmax`` they use ``e^{z_i} / S``, which overflows once a gap in
``z`` exceeds ~709 (e.g. ``tau`` below 1/709 of the spread): the derivative is then reported
as a :class:`~topk_cli.errors.NumericalFailureError` (code ``"overflow"``), never returned as
NaN. For ``iterative`` the derivative w.r.t. ``min z`` is taken through the first minimal entry
(one-sided when the minimum is tied).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import NumericalFailureError, RowFailure
from topk_cli.operators._base import OK, FloatArray, Forward, Implementation
from topk_cli.operators._logspace import logsumexp, logsumexp_exclusive

_NEG_INF = -np.inf


# --------------------------------------------------------------------------- signed log space


def _log_diff(lpos: FloatArray, lneg: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sign, log|e^lpos - e^lneg|)``; sign 0 and log ``-inf`` when the two are equal."""
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
    """Split signed log values into positive-part and negative-part log values."""
    return np.where(sign > 0, log_abs, _NEG_INF), np.where(sign < 0, log_abs, _NEG_INF)


def _signed_add(
    s1: FloatArray, l1: FloatArray, s2: FloatArray, l2: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """``(sign, log|.|)`` of the sum of two signed log values, elementwise."""
    p1, n1 = _parts(s1, l1)
    p2, n2 = _parts(s2, l2)
    return _log_diff(np.logaddexp(p1, p2), np.logaddexp(n1, n2))


def _to_linear(sign: FloatArray, log_abs: FloatArray) -> FloatArray:
    with np.errstate(over="ignore"):  # a pole (S -> 0) overflows: reported by the caller
        return np.where(sign == 0, 0.0, sign * np.exp(log_abs))


def _exclusive_sum(x: FloatArray) -> FloatArray:
    """``out[:, i] = sum_{j != i} x[:, j]`` along axis 1 of ``(B, n, C)``, accurately.

    Total minus own term is accurate except for the entry of largest magnitude (the only one
    that can dominate the total); that one is summed directly without it.
    """
    total = x.sum(axis=1, keepdims=True)
    out = total - x
    top = np.argmax(np.abs(x), axis=1)[:, None]
    without = x.copy()
    np.put_along_axis(without, top, 0.0, axis=1)
    np.put_along_axis(out, top, without.sum(axis=1, keepdims=True), axis=1)
    return out


def _failed(fwd: Forward, code: str, rows: NDArray[np.bool_], message: str, step: NDArray[np.int64]) -> None:
    """Record a failure on ``rows`` that have not failed yet (first failure wins)."""
    if fwd.code is None:
        b = fwd.p.shape[0]
        fwd.code = np.full(b, OK, dtype="<U16")
        fwd.level = np.full(b, -1, dtype=np.int64)
        fwd.value = np.full(b, np.nan)
    new = rows & (fwd.code == OK)
    for b in np.flatnonzero(new):
        fwd.code[b] = code
        fwd.level[b] = int(step[b]) if fwd.level is not None else -1  # type: ignore[index]
        fwd.messages[int(b)] = message.format(step=int(step[b]) + 1)


# --------------------------------------------------------------------------- weighted-softmax


def weighted_softmax_topk(z: FloatArray, k: int) -> Forward:
    """``k`` rounds of ``p <- p + q e^z / sum(q e^z)`` with ``q = 1 - p``, in signed log space.

    Shapes: ``z`` is ``(B, n)`` (see ``_base``); ``p`` and ``q`` are ``(B, n)``, ``sum p = k``.
    ``p`` is not confined to [0, 1]; as ``tau -> 0`` with ``k = 2`` it tends to
    ``(1.5, 0.5, 0, ...)``. Rows where the normaliser ``S`` vanishes (a pole) get code ``"inf"``.

    >>> weighted_softmax_topk(np.array([[0.0, -3000.0, -6000.0]]), 2).p.round(4)
    array([[1.5, 0.5, 0. ]])
    """
    bsz = z.shape[0]
    masked = np.isneginf(z)
    sq, lq = np.ones_like(z), np.zeros_like(z)  # q = 1
    sp, lp = np.zeros_like(z), np.full_like(z, _NEG_INF)  # p = 0
    steps: dict[str, list[FloatArray]] = {"s": [], "f": [], "rho": [], "c": []}
    fwd = Forward(p=np.zeros_like(z), q=np.ones_like(z))
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
            _failed(fwd, "inf", pole, "the normaliser sum_j (1 - p_j) e^{{z_j}} is exactly 0 at round {step} (a pole)",
                    np.full(bsz, t))
        s_lin = np.where(pole[:, None], 1.0, s_lin)
        s_sign = np.sign(s_lin)
        log_s = np.log(np.abs(s_lin))  # log|S| = m + log_s; differences subtract m first
        xpos, xneg = logsumexp_exclusive(apos), logsumexp_exclusive(aneg)  # sum_{j != i} u_j, by sign
        t_sign, lt = _log_diff(xpos, xneg)
        lpe = lp + z  # log|p_i e^{z_i}|
        ppos, pneg = _parts(sp, lpe)
        v_sign, lv = _log_diff(np.logaddexp(xpos, pneg), np.logaddexp(xneg, ppos))  # S - e^{z_i}
        l_step = (a - m) - log_s  # log|s_i|
        l_f = (lv - m) - log_s  # log|f_i|, f_i = 1 - e^{z_i}/S = q_new_i / q_i
        steps["s"].append(e / s_lin)
        steps["f"].append(_to_linear(v_sign * s_sign, l_f))
        steps["c"].append(_to_linear(t_sign * s_sign, (lt - m) - log_s))
        steps["rho"].append(_to_linear(s_sign * np.ones_like(z), (z - m) - log_s))
        sp, lp = _signed_add(sp, lp, sq * s_sign, l_step)
        sq, lq = sq * v_sign * s_sign, lq + l_f
        lq = np.where(sq == 0, _NEG_INF, lq)
    fwd.p = np.where(masked, 0.0, _to_linear(sp, lp))
    fwd.q = np.where(masked, 1.0, _to_linear(sq, lq))
    fwd.aux = {name: np.stack(vals, axis=1) for name, vals in steps.items()}  # (B, k, n)
    return fwd


def _ws_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """Forward mode: ``dq <- f dq - s (c dz - X - Y)``, ``X_i = sum_{j != i} s_j dz_j``,
    ``Y = sum_j rho_j dq_j``, ``dp = -dq``; all ``n`` directions at once."""
    bsz, n = z.shape
    live = np.isfinite(z)
    eye = np.broadcast_to(np.eye(n), (bsz, n, n)) * live[:, :, None] * live[:, None, :]
    dq = np.zeros((bsz, n, n))
    aux = fwd.aux
    for t in range(k):
        s, f, rho, c = (aux[name][:, t, :, None] for name in ("s", "f", "rho", "c"))
        x_excl = _exclusive_sum(s * eye)
        y = np.sum(np.where(live[:, :, None], rho * dq, 0.0), axis=1, keepdims=True)
        dq = f * dq - s * (c * eye - x_excl - y)
        dq = np.where(live[:, :, None], dq, 0.0)
    return _checked(-dq, "weighted-softmax")


def _ws_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """Reverse mode through the rounds stored in ``fwd.aux`` (the transpose of the Jacobian's
    forward mode): ``O(k n)`` time per row."""
    live = np.isfinite(z)
    qbar = np.where(live, -v, 0.0)[:, :, None]
    zbar = np.zeros_like(qbar)
    aux = fwd.aux
    for t in reversed(range(k)):
        s, f, rho, c = (np.where(live, aux[name][:, t], 0.0)[:, :, None] for name in ("s", "f", "rho", "c"))
        g = -s * qbar
        zbar += c * g - s * _exclusive_sum(g)
        qbar = f * qbar - rho * np.sum(g, axis=1, keepdims=True)
        qbar = np.where(live[:, :, None], qbar, 0.0)
    return _checked(zbar[:, :, 0], "weighted-softmax")


def _checked(out: FloatArray, method: str) -> FloatArray:
    """Raise instead of returning a derivative that overflowed (rows with non-finite entries)."""
    bad = ~np.isfinite(out.reshape(out.shape[0], -1)).all(axis=-1)
    if bad.any():
        failures = tuple(
            RowFailure(
                method=method, row=(int(b),), code="overflow",
                detail="the derivative overflows float64: a gap in x / tau exceeds ~709, where e^{z_i}/S is not "
                "representable; use a larger tau (the exact derivative is exponentially small there)",
            )
            for b in np.flatnonzero(bad)
        )
        raise NumericalFailureError(failures)
    return out


# --------------------------------------------------------------------------- iterative


def iterative_topk(z: FloatArray, k: int) -> Forward:
    """Su's ``k`` rounds of ``p <- p + softmax((1 - p) * (z - min z))``, with ``1 - p`` accurate.

    Shapes: ``z`` is ``(B, n)`` (see ``_base``); ``p`` and ``q`` are ``(B, n)``, ``sum p = k``.
    ``p`` can exceed 1 (``k = n``); masked entries get 0. Round one is ``softmax(z)`` exactly
    (``softmax`` is shift-invariant).

    >>> iterative_topk(np.array([[0.0, -1.0]]), 2).p.round(4)
    array([[1.2979, 0.7021]])
    """
    masked = np.isneginf(z)
    zmin = np.min(np.where(masked, np.inf, z), axis=-1, keepdims=True)
    d = np.where(masked, _NEG_INF, z - zmin)
    p, q = np.zeros_like(z), np.ones_like(z)
    s_steps, c_steps, q_steps = [], [], []
    for t in range(k):
        y = z if t == 0 else np.where(masked, _NEG_INF, q * d)
        total = logsumexp(y)[:, None]
        s = np.exp(y - total)
        c = np.exp(logsumexp_exclusive(y) - total)  # 1 - s without cancellation
        s_steps.append(s)
        c_steps.append(c)
        q_steps.append(q)
        # q - s and c - p are equal in exact arithmetic; keep the one with the smaller error bound
        q = np.where(np.abs(q) + s <= c + np.abs(p), q - s, c - p)
        p = p + s
    fwd = Forward(p=np.where(masked, 0.0, p), q=np.where(masked, 1.0, q))
    fwd.aux = {
        "s": np.stack(s_steps, axis=1), "c": np.stack(c_steps, axis=1), "q": np.stack(q_steps, axis=1),
        "d": np.where(masked, 0.0, d),
        "argmin": np.argmin(np.where(masked, np.inf, z), axis=-1).astype(np.float64),
    }
    return fwd


def _it_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """Forward mode: ``dy = dq d + q dd``; ``ds = s (c dy - X)``, ``X_i = sum_{j != i} s_j dy_j``."""
    bsz, n = z.shape
    live = np.isfinite(z)
    aux = fwd.aux
    d = aux["d"][:, :, None]
    eye = np.broadcast_to(np.eye(n), (bsz, n, n)) * live[:, :, None] * live[:, None, :]
    m = aux["argmin"].astype(np.int64)
    dd = eye - eye[np.arange(bsz), m][:, None, :] * live[:, :, None]  # d(z_i - z_m)
    dq = np.zeros((bsz, n, n))
    for t in range(k):
        s, c, q = (aux[name][:, t, :, None] for name in ("s", "c", "q"))
        dy = eye if t == 0 else dq * d + q * dd  # round one is softmax(z): no reference shift
        ds = s * (c * dy - _exclusive_sum(s * dy))
        dq = np.where(live[:, :, None], dq - ds, 0.0)
    return _checked(-dq, "iterative")


def _it_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """Reverse mode through the stored rounds, ``O(k n)`` time per row."""
    bsz = z.shape[0]
    live = np.isfinite(z)
    aux = fwd.aux
    d = aux["d"]
    qbar = np.where(live, -v, 0.0)
    dbar = np.zeros_like(z)
    for t in reversed(range(k)):
        s, c, q = (np.where(live, aux[name][:, t], 0.0) for name in ("s", "c", "q"))
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


ITERATIVE = Implementation(forward=iterative_topk, jacobian=_it_jacobian, vjp=_it_vjp)
WEIGHTED_SOFTMAX = Implementation(forward=weighted_softmax_topk, jacobian=_ws_jacobian, vjp=_ws_vjp)
