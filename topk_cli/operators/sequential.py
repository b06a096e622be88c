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

Ill-conditioned rows. Both operators have inputs where no float64 algorithm is accurate:
``weighted-softmax`` has poles (``S = sum_j (1 - p_j) e^{z_j}`` crosses 0 for ``k >= 3``) and
zeros of ``1 - p_i`` where ``S - e^{z_i}`` cancels, and the rounds of both can amplify errors
(``iterative``: ``d s_i / d(1 - p_i) = s_i (1 - s_i)(z_i - min z)`` reaches hundreds at large
spreads). Each forward pass therefore carries, for every row, a running estimate of the absolute
error of ``p``: the rounding errors of the rounds, propagated to first order through the same
linearisation as the Jacobian (relative errors of ``q``, absolute errors of ``p``), with a random
local error at every operation of the size of its rounding bound (``u`` times the magnitude of
each log-space value, unless what was added is smaller; ``u (P + N) / |P - N|`` for a signed sum
of positive part ``P`` and negative part ``N``). Three such random patterns run side by side
(``O(n)`` work and ``O(B n)`` memory per round); the estimate is 3 times the largest RMS over
them, after averaging over exact ties as the public API does. It is an estimate, not a proof:
against mpmath on ~6500 random rows (spreads 0.1 to 1e4, n 10 and 100, k 2 to 50) it was 0.8 to
~300 times the real error where that exceeded 1e-12 (median 8), and no row over the tolerance
went unflagged; rare rows are over-estimated ~1e3-fold. Rows whose estimate exceeds :data:`ILL_CONDITIONED_TOLERANCE` get code
``"ill-conditioned"`` (NaN weights from the public API; ``level`` is the round where the estimate
crossed it, ``value`` the estimate, and the message says which round amplified the errors most
and why).

Derivatives (with respect to ``z``; the public API divides by ``tau``): the Jacobian is forward
mode through the ``k`` rounds, ``O(k n^2)`` per row; the VJP is reverse mode, ``O(k n)`` time
per row but it stores the ``k`` rounds, ``O(B k n)`` memory (kept in ``Forward.aux``). Both use
the accurate complements and exclusive sums, so saturated entries keep their (tiny) relative
accuracy. For ``weighted-softmax`` they use ``e^{z_i} / S``, which overflows once a gap in
``z`` exceeds ~709 (e.g. ``tau`` below 1/709 of the spread) while the quantities it multiplies
underflow: those rows are recomputed with every factor in signed log space (``O(k n^2)`` per
row, also for the VJP), which returns the (typically exponentially small) derivative. The logs
there are as large as the gaps, and their rounding errors ``u |gap|`` grow with them: where the
bound ``16 k u max |log|`` exceeds :data:`ILL_CONDITIONED_TOLERANCE` (gaps beyond ~3e5) the row
is reported as a :class:`~topk_cli.errors.NumericalFailureError` (code ``"ill-conditioned"``),
never returned as inf, NaN or noise. For ``iterative`` the derivative w.r.t. ``min z`` is taken
through the first minimal entry (one-sided when the minimum is tied).
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def _failed(
    fwd: Forward, code: str, rows: NDArray[np.bool_], step: NDArray[np.int64], message: str | Callable[[int], str],
    value: FloatArray | None = None,
) -> None:
    """Record a failure on ``rows`` that have not failed yet (first failure wins); ``step`` is the
    1-based round, ``message`` the sentence (or ``message(b)`` the sentence for row ``b``)."""
    if fwd.code is None or fwd.level is None or fwd.value is None:
        b = fwd.p.shape[0]
        fwd.code = np.full(b, OK, dtype="<U16")
        fwd.level = np.full(b, -1, dtype=np.int64)
        fwd.value = np.full(b, np.nan)
    new = rows & (fwd.code == OK)
    for b in np.flatnonzero(new):
        fwd.code[b] = code
        fwd.level[b] = int(step[b])
        if value is not None:
            fwd.value[b] = float(value[b])
        fwd.messages[int(b)] = message if isinstance(message, str) else message(int(b))


# --------------------------------------------------------------------------- error estimate

#: Rows whose estimated absolute error of ``p`` exceeds this get code ``"ill-conditioned"`` (their
#: weights are NaN) instead of being returned as "ok". It is the stability probe's default tolerance.
ILL_CONDITIONED_TOLERANCE = 1e-9
#: log of the relative size below which a cancelled difference is pure rounding noise (64 ulps)
_LOG_NOISE = math.log(64 * np.finfo(np.float64).eps)

_UNIT = float(np.finfo(np.float64).eps) / 2  # unit roundoff of float64
_SQRT2_UNIT = float(np.sqrt(2.0)) * _UNIT
_SAMPLES = 3  # independent random patterns of rounding errors propagated side by side
_SAFETY = 3.0  # the estimate is the RMS over the patterns times this (see the module docstring)
_SEED = 20240611  # fixed: the estimate, hence the status of a row, is deterministic
_GROWTH_FLOOR = 1e3 * _UNIT  # growth is measured from here: below, new local errors dominate
_FIX = "the operator is ill-conditioned at this input (use a larger tau or a threshold method)"


def _times(factor: FloatArray, err: FloatArray) -> FloatArray:
    """``factor * err`` with ``inf * 0 = 0`` (a huge factor applied to no error at all)."""
    with np.errstate(invalid="ignore", over="ignore"):  # the 0 * inf products are replaced below
        out = factor * err
    return np.where(err == 0, 0.0, out)


def _finite(x: FloatArray) -> FloatArray:
    """``x`` with the infinite entries (masked entries, empty log-sums) replaced by 0."""
    return np.where(np.isfinite(x), x, 0.0)


def _estimate(dp: FloatArray) -> FloatArray:
    """``_SAFETY`` times the largest RMS (over the samples) of the entries' errors, per row; inf
    for a row whose propagated errors overflowed."""
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up estimate is inf or NaN
        est = _SAFETY * np.sqrt(np.max(np.einsum("bic,bic->bi", dp, dp), axis=-1) / _SAMPLES)
    return np.where(np.isnan(est), np.inf, est)


def _average_ties(z: FloatArray, dp: FloatArray) -> FloatArray:
    """``dp`` (``(B, n, C)``) averaged over the groups of exactly equal ``z`` of each row; ``dp``
    itself when no row has a tie."""
    order = np.argsort(z, axis=-1, kind="stable")
    zs = np.take_along_axis(z, order, axis=-1)
    starts = np.ones(z.shape, dtype=bool)
    starts[:, 1:] = zs[:, 1:] != zs[:, :-1]
    if starts.all():
        return dp
    group = (np.cumsum(starts.ravel()) - 1).reshape(z.shape)
    counts = np.bincount(group.ravel())
    out = np.empty_like(dp)
    for c in range(dp.shape[-1]):
        sorted_dp = np.take_along_axis(dp[:, :, c], order, axis=-1)
        means = (np.bincount(group.ravel(), weights=sorted_dp.ravel()) / counts)[group]
        np.put_along_axis(out[:, :, c], order, means, axis=-1)
    return out


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
        self._rank = rank if (first[:, 1:] == 0).any() else None  # without ties: the column will do
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
        dp = _average_ties(z, self.dp)
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

    def iterative_round(
        self, t: int, d: FloatArray, s: FloatArray, c: FloatArray,
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


# --------------------------------------------------------------------------- weighted-softmax


def weighted_softmax_topk(z: FloatArray, k: int) -> Forward:
    """``k`` rounds of ``p <- p + q e^z / sum(q e^z)`` with ``q = 1 - p``, in signed log space.

    Shapes: ``z`` is ``(B, n)`` (see ``_base``); ``p`` and ``q`` are ``(B, n)``, ``sum p = k``.
    ``p`` is not confined to [0, 1]; as ``tau -> 0`` with ``k = 2`` it tends to
    ``(1.5, 0.5, 0, ...)``. Rows where the normaliser ``S`` vanishes (a pole) get code ``"inf"``,
    rows whose estimated error exceeds :data:`ILL_CONDITIONED_TOLERANCE` ``"ill-conditioned"``.

    >>> weighted_softmax_topk(np.array([[0.0, -3000.0, -6000.0]]), 2).p.round(4)
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
    fwd.aux = {name: np.stack(vals, axis=1) for name, vals in steps.items()}  # (B, k, n)
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


def _rnd(result: FloatArray, *operands: FloatArray) -> FloatArray:
    """Rounding error of a float64 sum of ``operands``: at most ``u |result|``, and never more than
    the smallest operand (each operand is a float as close to the sum as that); 0 if infinite."""
    bound = _UNIT * np.abs(result)
    for x in operands:
        bound = np.minimum(bound, np.abs(x))
    return np.where(np.isfinite(result), bound, 0.0)


def _rnd_log(result: FloatArray, added: FloatArray) -> FloatArray:
    """Rounding error of ``result = base + added`` (a log-sum: ``added`` is the ``log(...)`` term,
    computed to ``u`` before it is added): ``min(u |result|, |added|) + u``.

    ``added`` must be the term itself, not ``result - base``: when it is below half an ulp of
    ``base`` (``log 2`` beside ``|base| = 1e20``), ``result == base`` and the whole term is the
    error, which ``result - base = 0`` would hide (tied entries at ``tau = 1e-20`` lost their factor
    2 that way, silently).
    """
    with np.errstate(invalid="ignore"):  # inf added to an empty sum: masked by isfinite
        bound = np.minimum(_UNIT * np.abs(result), np.abs(np.where(np.isfinite(added), added, 0.0))) + _UNIT
    return np.where(np.isfinite(result), bound, 0.0)


def _lse_added(parts: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(max, log sum exp(parts - max))`` along the last axis (keepdims): the two terms whose float64 sum
    is :func:`logsumexp`; the second is 0 for an empty sum."""
    top = np.max(parts, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # empty sums: log 0
        added = np.log(np.sum(np.exp(parts - safe), axis=-1, keepdims=True))
    return top, np.where(np.isfinite(top), added, 0.0)


def _log1pexp_added(x: FloatArray, other: FloatArray) -> FloatArray:
    """The term ``log(1 + e^{-|x - other|})`` that ``logaddexp(x, other)`` adds to the larger; 0 if one is empty."""
    with np.errstate(invalid="ignore"):  # -inf - -inf: both empty
        gap = np.abs(x - other)
    return np.where(np.isfinite(gap), np.log1p(np.exp(-np.where(np.isfinite(gap), gap, 0.0))), 0.0)


def _log_diff_added(lpos: FloatArray, lneg: FloatArray) -> FloatArray:
    """The term ``log(1 - e^{-|lpos - lneg|})`` that :func:`_log_diff` adds to the larger; 0 if one is empty."""
    with np.errstate(invalid="ignore", divide="ignore"):  # equal terms: log 0 (an exact zero, no error)
        gap = np.abs(lpos - lneg)
        added = np.log(-np.expm1(-np.where(np.isfinite(gap), gap, 1.0)))
    return np.where(np.isfinite(gap) & np.isfinite(added), added, 0.0)


def _lse_exclusive_error(parts: FloatArray, out: FloatArray) -> FloatArray:
    """Rounding error of ``out = logsumexp_exclusive(parts)``: ``total + log1p(-ratio)`` for every
    entry but the largest, whose exclusive sum is summed directly around the second largest."""
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
    out = _ws_jacobian_linear(fwd, z, k)
    bad = np.asarray(~np.isfinite(out.reshape(out.shape[0], -1)).all(axis=-1), dtype=bool)
    if bad.any():
        out[bad] = _ws_jacobian_log(fwd, z, k, bad)
    return _checked(out, "weighted-softmax")


#: The log-space derivative multiplies factors ``e^L`` whose logs ``L`` (of size up to the largest
#: gap in ``z``) carry absolute rounding errors ``u |L|`` per operation; over ``k`` rounds the
#: derivative's error (in units of ``1/tau``) is about this factor times ``k u max |L|``.
_LOG_JACOBIAN_GROWTH = 16.0


def _ws_log_jacobian_error(fwd: Forward, k: int, rows: NDArray[np.bool_]) -> FloatArray:
    """Per row, the error bound of :func:`_ws_jacobian_log` (in units of ``1/tau``)."""
    big = np.zeros(int(rows.sum()))
    for name in ("lf", "lrho", "ls", "lc"):
        vals = fwd.aux[name][rows]
        big = np.maximum(big, np.max(np.where(np.isfinite(vals), np.abs(vals), 0.0), axis=(1, 2)))
    return _LOG_JACOBIAN_GROWTH * k * _UNIT * big


def _slog(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sign, log|x|)`` of linear values (``log 0 = -inf``)."""
    with np.errstate(divide="ignore"):  # log 0 = -inf: an exact zero
        return np.sign(x), np.log(np.abs(x))


def _slog_sum(sign: FloatArray, log_abs: FloatArray, axis: int) -> tuple[FloatArray, FloatArray]:
    """``(sign, log|.|)`` of the sum of signed log values along ``axis``."""
    pos, neg = _parts(sign, log_abs)
    return _log_diff(logsumexp(pos, axis=axis), logsumexp(neg, axis=axis))


def _ws_jacobian_log(fwd: Forward, z: FloatArray, k: int, rows: NDArray[np.bool_]) -> FloatArray:
    """The forward mode of :func:`_ws_jacobian` on ``rows``, with ``dq``, ``f dq`` and
    ``Y = sum_j rho_j dq_j`` in signed log space: ``f`` and ``rho`` may overflow and ``dq``
    underflow while their products are moderate. ``O(k n^2)`` exponentials and logs per row."""
    zr = z[rows]
    bsz, n = zr.shape
    live = np.isfinite(zr)
    eye = np.broadcast_to(np.eye(n), (bsz, n, n)) * live[:, :, None] * live[:, None, :]
    off = (1.0 - np.eye(n)) * live[:, :, None] * live[:, None, :]
    sdq, ldq = np.zeros((bsz, n, n)), np.full((bsz, n, n), _NEG_INF)
    # rows whose logs are too large for float64 to give the derivative to the tolerance are NaN
    # (refused by the caller) rather than returned wrong
    unresolved = _ws_log_jacobian_error(fwd, k, rows) > ILL_CONDITIONED_TOLERANCE
    aux = {name: fwd.aux[name][rows] for name in ("lf", "sf", "lrho", "rho", "ls", "ss", "lc", "sc")}
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
    return -dq


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
    out = zbar[:, :, 0]
    bad = ~np.isfinite(out).all(axis=-1)
    # rows that overflowed (gaps beyond ~709): v^T J from the log-space Jacobian, one row at a
    # time (O(k n^2) for those rows only)
    for b in np.flatnonzero(bad):
        row = np.zeros(z.shape[0], dtype=bool)
        row[b] = True
        out[b] = v[b] @ _ws_jacobian_log(fwd, z, k, row)[0]
    return _checked(out, "weighted-softmax")


def _checked(out: FloatArray, method: str) -> FloatArray:
    """Raise instead of returning a derivative float64 could not compute (rows with non-finite
    entries): never an inf or NaN in a returned derivative."""
    bad = ~np.isfinite(out.reshape(out.shape[0], -1) if out.size else np.zeros((out.shape[0], 0))).all(axis=-1)
    if bad.any():
        detail = (
            "the derivative is not computable in float64 at this input: x / tau spans gaps so large that "
            "the logs of the factors e^{z_i}/S carry rounding errors beyond the tolerance "
            f"{ILL_CONDITIONED_TOLERANCE:g} (in units of 1/tau); use a larger tau"
            if method == "weighted-softmax" else
            "the derivative overflows float64 at this input (x / tau spans a range beyond float64); use a larger tau"
        )
        failures = tuple(
            RowFailure(method=method, row=(int(b),), code="ill-conditioned", detail=detail)
            for b in np.flatnonzero(bad)
        )
        raise NumericalFailureError(failures)
    return out


# --------------------------------------------------------------------------- iterative


def iterative_topk(z: FloatArray, k: int) -> Forward:
    """Su's ``k`` rounds of ``p <- p + softmax((1 - p) * (z - min z))``, with ``1 - p`` accurate.

    Shapes: ``z`` is ``(B, n)`` (see ``_base``); ``p`` and ``q`` are ``(B, n)``, ``sum p = k``.
    ``p`` can exceed 1 (``k = n``); masked entries get 0. Round one is ``softmax(z)`` exactly
    (``softmax`` is shift-invariant). Rows whose estimated error exceeds
    :data:`ILL_CONDITIONED_TOLERANCE` get code ``"ill-conditioned"``.

    >>> iterative_topk(np.array([[0.0, -1.0]]), 2).p.round(4)
    array([[1.2979, 0.7021]])
    """
    masked = np.isneginf(z)
    zmin = np.min(np.where(masked, np.inf, z), axis=-1, keepdims=True)
    d = np.where(masked, _NEG_INF, z - zmin)
    p, q = np.zeros_like(z), np.ones_like(z)
    s_steps, c_steps, q_steps = [], [], []
    err = _RoundingErrors(z)
    d_live = np.where(masked, 0.0, d)
    for t in range(k):
        y = z if t == 0 else np.where(masked, _NEG_INF, q * d)
        s, c, local = _it_softmax(y, masked)
        s_steps.append(s)
        c_steps.append(c)
        q_steps.append(q)
        # q - s and c - p are equal in exact arithmetic; keep the one with the smaller error bound
        direct = np.abs(q) + s <= c + np.abs(p)
        q = np.where(direct, q - s, c - p)
        p = p + s
        err.iterative_round(t, d_live, s, c, local, direct, p, q)
        slope = s * c * d_live  # d s_i / d q_i
        err.close_round(t, {"slope": np.max(slope, axis=-1), "entry": np.argmax(slope, axis=-1).astype(np.float64)})
    fwd = Forward(p=np.where(masked, 0.0, p), q=np.where(masked, 1.0, q))
    fwd.aux = {
        "s": np.stack(s_steps, axis=1), "c": np.stack(c_steps, axis=1), "q": np.stack(q_steps, axis=1),
        "d": np.where(masked, 0.0, d),
        "argmin": np.argmin(np.where(masked, np.inf, z), axis=-1).astype(np.float64),
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
        dev = np.abs(pq - _average_ties(z, pq)).max(axis=(1, 2))
    return np.where(np.isnan(dev), np.inf, 2.0 * dev)


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
