"""Signed log-space arithmetic and the running rounding-error model shared by the sequential
operators (:mod:`~topk_cli.operators.iterative`, :mod:`~topk_cli.operators.weighted_softmax`).

See :mod:`~topk_cli.operators.sequential` for what the error estimate is and how it was validated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import NumericalFailureError, RowFailure
from topk_cli.operators._base import OK, FloatArray, Forward, average_ties
from topk_cli.operators._logspace import exp_new, logsumexp

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
    sign = np.where((lpos == _NEG_INF) & np.isfinite(lneg), -1.0, sign)
    sign = np.where(np.isnan(sign), 0.0, sign)  # (a sign is never infinite)
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
        return np.where(sign == 0, 0.0, sign * exp_new(log_abs))


def _exclusive_sum(x: FloatArray) -> FloatArray:
    """``out[:, i] = sum_{j != i} x[:, j]`` along axis 1 of ``(B, n, C)``, accurately.

    Total minus own term is accurate except for the entry of largest magnitude (the only one
    that can dominate the total); that one is summed directly without it.
    """
    total = x.sum(axis=1, keepdims=True)
    out = total - x
    b, c = np.arange(x.shape[0])[:, None], np.arange(x.shape[2])[None, :]
    top = np.abs(x).argmax(axis=1)  # (B, C): the row of each column's largest |x|
    without = x.copy()
    without[b, top, c] = 0.0
    out[b, top, c] = without.sum(axis=1)
    return out


def _total_without_largest(
    g: FloatArray, rows: NDArray[np.intp], scratch: FloatArray | None = None
) -> tuple[FloatArray, NDArray[np.intp], FloatArray]:
    """The pieces of :func:`_exclusive_sum` for a 2-D ``g`` without forming it: the row totals, the
    column of each row's largest ``|g|`` and the row sum without that entry (summed directly; total
    minus it could lose everything). ``g`` is restored bit for bit; ``rows`` is ``arange(B)``;
    ``scratch`` (``g``'s shape), when given, receives ``|g|``."""
    total = g.sum(axis=1)
    big = np.argmax(np.abs(g, out=scratch), axis=1)
    g_big = g[rows, big]
    g[rows, big] = 0.0
    rest = g.sum(axis=1)
    g[rows, big] = g_big
    return total, big, rest


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
_LARGEST = float(np.finfo(np.float64).max)
_SQRT2_UNIT = float(np.sqrt(2.0)) * _UNIT
_SAMPLES = 3  # independent random patterns of rounding errors propagated side by side
_SAFETY = 3.0  # the estimate is the RMS over the patterns times this (see the module docstring)
_SEED = 20240611  # fixed: the estimate, hence the status of a row, is deterministic
_GROWTH_FLOOR = 1e3 * _UNIT  # growth is measured from here: below, new local errors dominate
_FIX = "the operator is ill-conditioned at this input (use a larger tau or a threshold method)"


def _nan_to_num(x: FloatArray, nan: float) -> FloatArray:
    """``np.nan_to_num(x, nan=nan)`` bit for bit (``+-inf`` become ``+-``the largest float, as there),
    without its Python-level overhead (it ran several times per round of the sequential operators)."""
    return np.where(np.isnan(x), nan, np.minimum(np.maximum(x, -_LARGEST), _LARGEST))


def _estimate(dp: FloatArray) -> FloatArray:
    """``_SAFETY`` times the largest RMS (over the samples) of the entries' errors, per row; inf
    for a row whose propagated errors overflowed."""
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up estimate is inf or NaN
        est = _SAFETY * np.sqrt(np.einsum("bic,bic->bi", dp, dp).max(axis=-1) / _SAMPLES)
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
        index = np.arange(bsz)[:, None], order
        zs = z[index]
        first = np.where(np.concatenate([np.ones((bsz, 1), dtype=bool), zs[:, 1:] != zs[:, :-1]], axis=-1),
                         np.arange(n), 0)
        rank = np.empty_like(order)
        rank[index] = np.maximum.accumulate(first, axis=-1)  # ties: same rank
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

    def tables(self, widths: tuple[int, ...]) -> list[FloatArray]:
        """The tables successive :meth:`noise` calls on sizes ``widths`` columns wide (the row's ``n``,
        or 1 for a per-row size) would use, from one draw of the generator (it draws them in sequence)."""
        draw = self._rng.standard_normal((sum(widths), _SAMPLES))
        out = [draw[a:b] for a, b in itertools.pairwise(np.cumsum((0, *widths)))]
        if self._rank is None:
            return out
        return [table[self._rank] if table.shape[0] > 1 else table for table in out]

    def close_round(self, t: int, cause: dict[str, FloatArray]) -> None:
        est = _estimate(self.dp)
        with np.errstate(invalid="ignore"):  # inf / inf: no growth
            growth = _nan_to_num(est / np.maximum(self.estimate, _GROWTH_FLOOR), 1.0)
        worse = growth > self.growth
        if worse.any():  # (else nothing changes but the first round's cause)
            self.growth = np.where(worse, growth, self.growth)
            self.worst = np.where(worse, t + 1, self.worst)
            for name, val in cause.items():
                self.cause[name] = np.where(worse, val, self.cause.get(name, val))
        elif not self.cause:
            self.cause = dict(cause)
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
        Called inside the caller's ``np.errstate`` (a blown-up estimate overflows: the row is reported).
        """
        # the tables noise() would draw for err_u, err_sum, err_q and err_p
        n = s.shape[1]
        u_table, sum_table, q_table, p_table = self.tables((n, 1, n, n))
        # in place where a temporary would be the result (the same operations in the same order)
        wide = s.size >= 256
        dq = _scaled(err_u, u_table, wide)
        dq += self.dq
        dp = self.dp
        s3 = _spread(s, wide)
        x = _exclusive_sum(s3 * dq)
        d_sum = err_sum[:, :, None] * sum_table
        gap = x - dp
        kept = (1.0 - s3) * dq  # (1 - s_i) dq_i
        new_dq = np.multiply(_spread(e_over_v, wide), gap, out=dq)
        new_dq[gap == 0] = 0.0  # an infinite gain on no error at all
        new_dq += kept
        new_dq -= d_sum
        new_dq += _scaled(err_q, q_table, wide)
        kept -= x
        kept -= d_sum
        kept *= s3
        kept += dp
        kept += _scaled(err_p, p_table, wide)
        self.dq, self.dp = new_dq, kept

    def iterative_round(
        self, t: int, d: FloatArray, s: FloatArray, c: FloatArray,
        local: tuple[FloatArray, FloatArray, FloatArray, NDArray[np.bool_]], direct: NDArray[np.bool_], p: FloatArray,
        q: FloatArray,
    ) -> None:
        """One round: ``y = q d``, ``s = softmax(y)``, ``p <- p + s``, ``q <- q - s`` or ``c - p``.

        ``dy = d dq``, ``ds = s (dy - sum_j s_j dy_j)``, plus the local errors of ``s`` and
        ``c = 1 - s`` (computed separately) from :func:`_it_local_errors`, ``u |p|`` of ``p`` and
        ``sqrt(2) u |q|`` of ``q`` (its own rounding and, one round later, that of ``y = q d``).
        """
        err_s, err_c, err_total, is_top = local
        dq, dp = self.dq, self.dp
        wide = dq.size >= 4096
        n = dq.shape[1]

        def spread(x: NDArray[Any]) -> NDArray[Any]:
            return _spread(x, wide, n)

        # the tables noise() would draw for err_total, s err_s, c err_c, u |p| and sqrt(2) u |q|
        total_table, *tables = self.tables((1, n, n, n, n))

        def noise(size: FloatArray, table: FloatArray) -> FloatArray:
            return _scaled(size, table, wide)

        s3 = spread(s)
        if t > 0:  # round one is softmax(z): z is exact
            ds = spread(d) * dq  # dy
            ds -= spread((s3 * ds).sum(axis=1, keepdims=True))
            ds *= s3
        else:
            ds = np.zeros_like(dq)
        d_total = spread(err_total[:, :, None] * total_table)
        loc_s = noise(s * err_s, tables[0])
        loc_s -= s3 * d_total
        loc_c = noise(c * err_c, tables[1])
        loc_c += spread(np.where(is_top, -c, s)) * d_total
        new_dp = dp + ds
        new_dp += loc_s
        new_dp += noise(_UNIT * np.abs(p), tables[2])
        self.dp = new_dp
        ds += noise(_SQRT2_UNIT * np.abs(q), tables[3])
        # the new dq: dq - loc_s where q - s was kept, else loc_c - dp; minus ds (in loc_c's buffer)
        loc_c -= dp
        np.subtract(dq, loc_s, out=loc_c, where=spread(direct))
        loc_c -= ds
        self.dq = loc_c


def _spread(x: NDArray[Any], wide: bool, n: int = 1) -> NDArray[Any]:
    """``x`` (``(B, n)``, or ``(B, 1, _SAMPLES)`` repeated ``n`` times) as an operand of a
    ``(B, n, _SAMPLES)`` product of the error model. Every such product is elementwise, so its bits do
    not depend on the operands' layout; on large arrays (``wide``) they are laid out in full first:
    numpy broadcasts a ``(B, n, 1)`` operand with an inner loop of ``_SAMPLES`` entries, several times
    slower than a pass over a contiguous array (on a few entries the extra call costs more than it saves)."""
    if x.ndim == 3:
        return np.tile(x, (1, n, 1)) if wide else x
    return np.repeat(x, _SAMPLES).reshape(*x.shape, _SAMPLES) if wide else x[:, :, None]


def _scaled(size: FloatArray, table: FloatArray, wide: bool) -> FloatArray:
    """What :meth:`_RoundingErrors.noise` returns for ``size`` with ``table`` as its draw."""
    if not wide:
        return size[:, :, None] * table
    out = _spread(size, wide)
    out *= table
    return out


def _rnd_log(result: FloatArray, added: FloatArray) -> FloatArray:
    """Rounding error of ``result = base + added`` (a log-sum: ``added`` is the ``log(...)`` term,
    computed to ``u`` before it is added): ``min(u |result|, |added|) + u``.

    ``added`` must be the term itself, not ``result - base``: when it is below half an ulp of
    ``base`` (``log 2`` beside ``|base| = 1e20``), ``result == base`` and the whole term is the
    error, which ``result - base = 0`` would hide (tied entries at ``tau = 1e-20`` lost their factor
    2 that way, silently). Called inside the round's ``np.errstate`` (an infinite ``result`` is masked).
    """
    bound = np.minimum(_UNIT * np.abs(result), np.abs(np.where(np.isfinite(added), added, 0.0)))
    bound += _UNIT
    return np.where(np.isfinite(result), bound, 0.0)


def _lse_added(parts: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(max, log sum exp(parts - max))`` along the last axis (keepdims): the two terms whose float64 sum
    is :func:`logsumexp`; the second is 0 for an empty sum."""
    top = np.max(parts, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # empty sums: log 0
        added = np.log(np.sum(exp_new(parts - safe), axis=-1, keepdims=True))
    return top, np.where(np.isfinite(top), added, 0.0)


def _slog_sum(sign: FloatArray, log_abs: FloatArray, axis: int) -> tuple[FloatArray, FloatArray]:
    """``(sign, log|.|)`` of the sum of signed log values along ``axis``."""
    pos, neg = _parts(sign, log_abs)
    return _log_diff(logsumexp(pos, axis=axis), logsumexp(neg, axis=axis))


def _checked(out: FloatArray, method: str) -> FloatArray:
    """Raise instead of returning a derivative float64 could not compute (rows with non-finite
    entries): never an inf or NaN in a returned derivative."""
    bad = ~np.isfinite(out.reshape(out.shape[0], -1) if out.size else np.zeros((out.shape[0], 0))).all(axis=-1)
    if bad.any():
        detail = (
            "the derivative is not computable in float64 at this input: x / tau spans gaps so large that "
            "the logs of the factors e^{z_i}/S carry rounding errors beyond the tolerance "
            f"{ILL_CONDITIONED_TOLERANCE:g} (in units of 1/tau), and the row is beyond the exact decimal "
            "computation (k m^3 > 1e5 with m unmasked entries, or |x / tau| > 1e16); use a larger tau or a shorter row"
            if method == "weighted-softmax" else
            "the derivative overflows float64 at this input (x / tau spans a range beyond float64); use a larger tau"
        )
        failures = tuple(
            RowFailure(method=method, row=(int(b),), code="ill-conditioned", detail=detail)
            for b in np.flatnonzero(bad)
        )
        raise NumericalFailureError(failures)
    return out
