"""``temperature_sweep``: the price of hardness, measured across a grid of temperatures.

For a score vector ``x`` (shape ``(n,)``) and each method and temperature ``tau`` the sweep
measures, with ``p = ST(x / tau)`` and ``h = T_k(x)`` the hard top-k (ties at the k-th value
share the remaining mass):

* ``l1_to_hard = sum_i |p_i - h_i|`` and ``max_entry_error = max_i |p_i - h_i|``;
* ``topk_mass = sum_i h_i p_i / k``: the share of the mass ``k`` that sits on the true top-k
  (for a real k, divided by ``floor(k) + (k - floor(k))^2`` instead: see ``topk_cli.analysis.hardness``);
* ``entropy = -sum_i (p_i / k) log(p_i / k)`` in nats: ``log k`` at hard top-k (distinct
  values), ``log n`` at the uniform ``k/n``;
* ``jacobian_norm = ||dp/dx||_F`` (includes ``1/tau``), and ``small_gradient_fraction``: the
  share of input entries ``x_j`` whose Jacobian column has norm below 1e-8, i.e. entries that
  receive (almost) no gradient whatever the loss: where learning stops;
* ``status``: ``"ok"`` or the method's failure code (then the measurements are None);
  ``jacobian_status`` likewise for the Jacobian alone (e.g. ``overflow`` where the derivative
  of ``weighted-softmax`` is not representable at tiny tau: the norms are then None).

The limits are computed separately from the grid, at temperatures relative to the data:
``tau -> 0`` at ``tau = 1e-4 * g`` (``g`` the smallest positive gap between distinct values of
``x``), which resolves every ordering by at least 1e4 in ``z``; ``tau -> infinity`` at
``tau = 1e6 * (max x - min x)``. ``converges`` is True when the small-tau vector is within 1e-6 of
``T_k(x)``, False otherwise, None when the method failed there.

A batch ``(B, n)`` (every row one instance, e.g. router logits, one row per token) is swept as
a whole, the way ``--hardness`` defines hardness: every measurement is the mean over the rows of
the per-row value, except ``max_entry_error``, the maximum over rows and entries; the rows a
method cannot compute at a tau are left out of the means and counted in ``failed_rows`` (and
``status`` is then the most frequent failure code). The limits use the smallest gap and the
largest spread over all rows; ``converges`` holds when every row converges.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.analysis.hardness import HardnessMatch, mean_topk_mass, tau_for_hardness, uniform_mass
from topk_cli.api import check_k, check_real_k, check_tau, evaluate, get_method, jacobian
from topk_cli.errors import InvalidArgumentError, NumericalFailureError
from topk_cli.operators._base import FloatArray
from topk_cli.operators.hard import hard_topk_weights
from topk_cli.registry import METHODS

#: The vector swept when the user gives none (documented in the README).
DEFAULT_SWEEP_VECTOR: tuple[float, ...] = (3.0, 2.0, 1.5, 1.0, 0.0, -1.0)
DEFAULT_TAUS = "1e-3:1e3:13"
SMALL_GRADIENT = 1e-8
LIMIT_DECIMALS = 4
_CONVERGED = 1e-6
#: Jacobians are formed for at most this many numbers at once (rows x n x n).
JACOBIAN_CHUNK = 4_000_000


@dataclass(frozen=True)
class SweepPoint:
    """Measurements of one method at one temperature (None where the method failed)."""

    method: str
    tau: float
    status: str
    l1_to_hard: float | None
    topk_mass: float | None
    max_entry_error: float | None
    entropy: float | None
    jacobian_norm: float | None
    small_gradient_fraction: float | None
    jacobian_status: str = "ok"
    #: Rows the method could not compute at this tau (the measurements are over the others).
    failed_rows: int = 0


@dataclass(frozen=True)
class SweepLimit:
    """Where a method goes as tau -> 0 and tau -> infinity (vectors rounded to 4 decimals).

    ``limit`` and ``infinity_limit`` are the vectors of a single-vector sweep (None for a batch);
    ``limit_rows`` and ``infinity_rows`` hold one vector per row (None where the row failed).
    ``converges``, ``limit_error`` and ``uniform_at_infinity`` cover every row computed.
    """

    method: str
    converges: bool | None
    limit: tuple[float, ...] | None
    limit_tau: float
    limit_status: str
    limit_error: float | None
    infinity_limit: tuple[float, ...] | None
    infinity_tau: float
    uniform_at_infinity: bool | None
    limit_rows: tuple[tuple[float, ...] | None, ...] = ()
    infinity_rows: tuple[tuple[float, ...] | None, ...] = ()


@dataclass(frozen=True)
class SweepMatch:
    """The temperature at which a method puts ``target`` of its mass on the true top-k.

    ``status`` and ``reason`` are those of :class:`topk_cli.HardnessMatch` (the same solver).
    """

    method: str
    target: float
    tau: float | None
    topk_mass: float | None
    status: str = "ok"
    reason: str = ""


@dataclass(frozen=True)
class SweepResult:
    """Everything ``temperature-sweep`` measured on one vector or a batch.

    ``x`` and ``hard`` are the vector and its hard top-k for a single vector (empty for a
    batch); ``rows`` and ``hard_rows`` always hold every row.
    """

    x: tuple[float, ...]
    k: int | float | tuple[float, ...]  # one k, or one per row of a batch (``--k-column``)
    taus: tuple[float, ...]
    hard: tuple[float, ...]
    points: tuple[SweepPoint, ...]
    limits: tuple[SweepLimit, ...]
    matches: tuple[SweepMatch, ...] = ()
    #: ``hardness``: per method, its calibration and the measurements at that tau (None if unreachable).
    at_hardness: tuple[tuple[HardnessMatch, SweepPoint | None], ...] = ()
    rows: tuple[tuple[float, ...], ...] = ()
    hard_rows: tuple[tuple[float, ...], ...] = ()
    #: True when several rows were swept (the measurements are aggregates over them).
    batch: bool = False

    def series(self, method: str, key: str) -> list[float | None]:
        """One measurement of one method along the tau grid (for charts)."""
        return [getattr(p, key) for p in self.points if p.method == method]


_RANGE = re.compile(r"^\s*([^:]+):([^:]+):([^:]+)\s*$")


def parse_taus(text: str) -> tuple[float, ...]:
    """Parse ``--taus``: ``START:STOP:COUNT`` (log-spaced, endpoints included) or ``a,b,c``.

    Raises:
        InvalidArgumentError: malformed text, a tau that is not a finite number > 0, COUNT < 1.

    >>> parse_taus("1e-2:1:3")
    (0.01, 0.1, 1.0)
    >>> parse_taus("0.5, 2")
    (0.5, 2.0)
    """
    m = _RANGE.match(text)
    try:
        if m:
            start, stop = float(m.group(1)), float(m.group(2))
            count = int(m.group(3))
            if count < 1:
                raise InvalidArgumentError(f"--taus count must be >= 1, got {count} in {text!r}")
            values = [start] if count == 1 else np.logspace(math.log10(start), math.log10(stop), count).tolist()
            if count > 1:
                values[0], values[-1] = start, stop
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidArgumentError(
            f"--taus must be START:STOP:COUNT (e.g. 1e-3:1e3:13) or a list (e.g. 0.01,0.1,1), got {text!r}"
        ) from None
    if not values:
        raise InvalidArgumentError(f"--taus is empty: {text!r}")
    for v in values:
        if not (math.isfinite(v) and v > 0):
            raise InvalidArgumentError(f"every tau must be a finite number > 0, got {v} in {text!r}")
    return tuple(float(v) for v in values)


def _status(codes: FloatArray | np.ndarray) -> str:
    """``"ok"`` when every row is, else the most frequent failure code (first seen on a tie)."""
    failed = [str(c) for c in codes if str(c) != "ok"]
    return "ok" if not failed else max(dict.fromkeys(failed), key=failed.count)


def _jacobian_rows(
    method: str, x: FloatArray, k: Any, tau: float
) -> tuple[list[FloatArray | None], list[str]]:
    """Per row: its Jacobian (None where not representable) and ``"ok"`` or the failure code."""
    n = x.shape[-1]
    chunk = max(1, JACOBIAN_CHUNK // (n * n))
    jacs: list[FloatArray | None] = []
    codes: list[str] = []
    per_row = isinstance(k, np.ndarray)
    for start in range(0, x.shape[0], chunk):
        part = x[start:start + chunk]
        part_k = k[start:start + chunk] if per_row else k
        try:
            block = jacobian(part, part_k, method, tau=tau).astype(np.float64)
        except NumericalFailureError:  # forward fine, derivative not representable in some row
            for i, row in enumerate(part):
                try:
                    jacs.append(jacobian(row, part_k[i] if per_row else k, method, tau=tau).astype(np.float64))
                    codes.append("ok")
                except NumericalFailureError as exc:
                    jacs.append(None)
                    codes.append(exc.failures[0].code if exc.failures else "failed")
        else:
            jacs.extend(block)
            codes.extend("ok" for _ in block)
    return jacs, codes


#: ``jacobian_status`` of a method that has no Jacobian (a user's numpy operator).
NOT_AVAILABLE = "not-available"


def _measure(method: str, x: FloatArray, k: Any, tau: float, hard: FloatArray) -> SweepPoint:
    """One method at one tau on the batch ``x`` ``(B, n)``: means over the rows computed."""
    r = evaluate(x, k, method, tau=tau)
    codes = np.asarray(r.status).reshape(-1)
    ok = codes == "ok"
    status = _status(codes)
    failed_rows = int(np.count_nonzero(~ok))
    if not ok.any():
        return SweepPoint(method, tau, status, None, None, None, None, None, None, status, failed_rows)
    p = np.asarray(r.weights, dtype=np.float64).reshape(x.shape)[ok]
    h = hard[ok]
    err = np.abs(p - h)
    if isinstance(k, np.ndarray):  # one k per row: the rows computed keep theirs
        k = k[ok]
        w = p / k[:, None]
    else:
        w = p / k
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 log 0 = 0 by convention
        entropy = -np.sum(np.where(w > 0, w * np.log(w), 0.0), axis=-1)
    if get_method(method).capabilities.jacobian:
        jacs, jac_codes = _jacobian_rows(method, x[ok], k, tau)
        jac_status = _status(np.asarray(jac_codes))
    else:  # no Jacobian (a user's numpy operator): nothing stands in for it
        jacs, jac_status = [], NOT_AVAILABLE
    good = [j for j in jacs if j is not None]
    if good:
        jac_norm: float | None = float(np.mean([np.linalg.norm(j) for j in good]))
        small: float | None = float(np.mean([np.mean(np.linalg.norm(j, axis=0) < SMALL_GRADIENT) for j in good]))
    else:
        jac_norm = small = None
    return SweepPoint(
        method=method, tau=tau, status=status,
        l1_to_hard=float(np.mean(err.sum(axis=-1))),
        topk_mass=mean_topk_mass(h, p, k),
        max_entry_error=float(err.max()),
        entropy=float(np.mean(entropy)),
        jacobian_norm=jac_norm,
        small_gradient_fraction=small,
        jacobian_status=jac_status,
        failed_rows=failed_rows,
    )


def limit_taus(x: FloatArray) -> tuple[float, float]:
    """``(tau for the tau -> 0 limit, tau for the tau -> infinity limit)`` relative to ``x``.

    ``x`` is one vector or a batch: the smallest gap and the largest spread over its rows count.

    >>> limit_taus(np.array([3.0, 1.0, 2.0]))
    (0.0001, 2000000.0)
    """
    rows = np.atleast_2d(x)
    gap, spread = math.inf, 0.0
    for row in rows:
        values = np.unique(row[np.isfinite(row)])
        gaps = np.diff(values)
        if gaps.size:
            gap = min(gap, float(gaps.min()))
            spread = max(spread, float(values.max() - values.min()))
    gap = 1.0 if gap == math.inf else gap
    spread = spread or 1.0
    # clamped: a subnormal gap (5e-324) must not underflow tau to 0, nor a huge spread overflow it
    tiny, huge = float(np.finfo(np.float64).tiny), float(np.finfo(np.float64).max) / 16
    return min(max(1e-4 * gap, tiny), huge), min(max(1e6 * spread, tiny), huge)


def _rounded(p: FloatArray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.round(p, LIMIT_DECIMALS) + 0.0)


def _limit(method: str, x: FloatArray, k: Any, hard: FloatArray) -> SweepLimit:
    """Both limits on the batch ``x`` ``(B, n)``: per-row vectors, worst error over the rows."""
    small, large = limit_taus(x)
    r0 = evaluate(x, k, method, tau=small)
    codes0 = np.asarray(r0.status).reshape(-1)
    ok0 = codes0 == "ok"
    p0 = np.asarray(r0.weights, dtype=np.float64).reshape(x.shape)
    status = _status(codes0)
    rows0: tuple[tuple[float, ...] | None, ...] = tuple(_rounded(p) if good else None for p, good in zip(p0, ok0, strict=True))
    if ok0.any():
        worst = float(np.max(np.abs(p0[ok0] - hard[ok0])))
        err: float | None = worst
        converges: bool | None = worst <= _CONVERGED
    else:
        err = converges = None
    rl = evaluate(x, k, method, tau=large)
    okl = np.asarray(rl.status).reshape(-1) == "ok"
    pl = np.asarray(rl.weights, dtype=np.float64).reshape(x.shape)
    rows_inf: tuple[tuple[float, ...] | None, ...] = tuple(_rounded(p) if good else None for p, good in zip(pl, okl, strict=True))
    uniform: bool | None = None
    if okl.any():
        finite = np.isfinite(x[okl])
        k_rows = k[okl, None] if isinstance(k, np.ndarray) else k
        uniform_value = k_rows / finite.sum(axis=-1, keepdims=True)
        uniform = bool(np.max(np.where(finite, np.abs(pl[okl] - uniform_value), 0.0)) <= 1e-4)
    return SweepLimit(
        method, converges, rows0[0] if len(rows0) == 1 else None, small, status, err,
        rows_inf[0] if len(rows_inf) == 1 else None, large, uniform, rows0, rows_inf,
    )


def _match(method: str, x: FloatArray, k: Any, target: float) -> SweepMatch:
    """``--match``: the tau of mean top-k mass ``target``, by the one hardness solver."""
    hm = tau_for_hardness(x, k, method, target)
    return SweepMatch(method, target, hm.tau, hm.mass, hm.status, hm.reason)


def temperature_sweep(
    x: ArrayLike,
    k: Any,
    *,
    methods: Sequence[str] | None = None,
    taus: Sequence[float] | str = DEFAULT_TAUS,
    match: float | None = None,
    hardness: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Measure each method on ``x`` across a grid of temperatures, plus its limits.

    Args:
        x: one score vector ``(n,)`` or a batch ``(B, n)`` (every row one instance; the
            measurements are then aggregated over the rows, see :class:`SweepPoint`); ``-inf``
            masks an entry.
        k: ``1 <= k <= n``; a real ``0 < k <= n`` for the methods that take one; or one k per
            row of a batch (a sequence of B numbers, each in its row's range).
        methods: registered names (default: all).
        taus: temperatures, or text for :func:`parse_taus`.
        match: a mean top-k mass in ``(k/n, 1)``: the tau per method that reaches it is reported
            (:func:`topk_cli.tau_for_hardness`, the solver of ``hardness`` and ``compute --hardness``).
        hardness: a mean top-k mass in (k/n, 1): each method is also measured at the largest tau that
            reaches it (:func:`topk_cli.tau_for_hardness`), or reported unreachable with the reason.
        progress: called with ``(done, total)`` after each method.

    Raises:
        InvalidArgumentError: bad ``x``, ``k``, method, tau grid, ``match`` or ``hardness``.

    >>> r = temperature_sweep([2.0, 1.0, 0.0], 1, methods=["hard"], taus=[1.0])
    >>> r.points[0].l1_to_hard, r.limits[0].converges
    (0.0, True)
    """
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise InvalidArgumentError(f"x must be one non-empty vector (n,) or a batch (B, n), got shape {arr.shape}")
    batch = arr.reshape(-1, arr.shape[-1])
    if np.isnan(batch).any() or (batch == np.inf).any():
        raise InvalidArgumentError("x must not contain NaN or +inf (use -inf to mask an entry)")
    counts = np.isfinite(batch).sum(axis=-1)
    if isinstance(k, (np.ndarray, list, tuple)):  # one k per row
        ks = np.asarray(k, dtype=np.float64).reshape(-1)
        if ks.shape != (batch.shape[0],):
            raise InvalidArgumentError(f"k must be one number or one per row ({batch.shape[0]}), got shape {ks.shape}")
        for row, value in enumerate(ks.tolist()):
            if value.is_integer():
                check_k(value, int(counts[row]), name=f"k of row {row}")
            else:
                check_real_k(value, int(counts[row]), name=f"k of row {row}")
        k = ks if not bool(np.all(ks == ks[0])) else (int(ks[0]) if float(ks[0]).is_integer() else float(ks[0]))
    if not isinstance(k, np.ndarray):
        n_finite = int(counts.min())
        k_real = isinstance(k, (float, np.floating)) and not float(k).is_integer()
        k = check_real_k(k, n_finite) if k_real else check_k(k, n_finite)
    grid = parse_taus(taus) if isinstance(taus, str) else tuple(float(t) for t in taus)
    for t in grid:
        check_tau(t)
    low = uniform_mass(batch, k)
    for option, value in (("match", match), ("hardness", hardness)):
        if value is not None and not (isinstance(value, (int, float)) and low < value < 1.0):
            raise InvalidArgumentError(
                f"{option} must be a mean top-k mass in (k/n, 1) = ({low:.4g}, 1), got {value!r}"
            )
    names = tuple(methods) if methods is not None else tuple(METHODS)
    for name in names:
        get_method(name)
    hard = np.zeros_like(batch)
    for row, values in enumerate(batch):
        finite = np.isfinite(values)
        hard[row, finite] = hard_topk_weights(values[finite], k[row] if isinstance(k, np.ndarray) else k)
    points: list[SweepPoint] = []
    limits: list[SweepLimit] = []
    matches: list[SweepMatch] = []
    at_hardness: list[tuple[HardnessMatch, SweepPoint | None]] = []
    for i, name in enumerate(names):
        if hardness is not None:
            hm = tau_for_hardness(batch, k, name, hardness)
            at_hardness.append((hm, _measure(name, batch, k, hm.tau, hard) if hm.tau is not None else None))
        points.extend(_measure(name, batch, k, tau, hard) for tau in grid)
        limits.append(_limit(name, batch, k, hard))
        if match is not None:
            matches.append(_match(name, batch, k, match))
        if progress is not None:
            progress(i + 1, len(names))
    rows = tuple(tuple(float(v) for v in r) for r in batch)
    hard_rows = tuple(tuple(float(v) for v in r) for r in hard)
    return SweepResult(
        x=rows[0] if len(rows) == 1 else (), k=tuple(k.tolist()) if isinstance(k, np.ndarray) else k, taus=grid, hard=hard_rows[0] if len(rows) == 1 else (),
        points=tuple(points), limits=tuple(limits), matches=tuple(matches), at_hardness=tuple(at_hardness),
        rows=rows, hard_rows=hard_rows, batch=len(rows) > 1,
    )
