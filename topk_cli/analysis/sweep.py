"""``temperature_sweep``: the price of hardness, measured across a grid of temperatures.

For one score vector ``x`` (shape ``(n,)``) and each method and temperature ``tau`` the sweep
measures, with ``p = ST(x / tau)`` and ``h = T_k(x)`` the hard top-k (ties at the k-th value
share the remaining mass):

* ``l1_to_hard = sum_i |p_i - h_i|`` and ``max_entry_error = max_i |p_i - h_i|``;
* ``topk_mass = sum_i h_i p_i / k``: the share of the mass ``k`` that sits on the true top-k;
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
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.analysis.hardness import HardnessMatch, tau_for_hardness
from topk_cli.api import check_k, check_tau, evaluate, get_method, jacobian
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


@dataclass(frozen=True)
class SweepLimit:
    """Where a method goes as tau -> 0 and tau -> infinity (vectors rounded to 4 decimals)."""

    method: str
    converges: bool | None
    limit: tuple[float, ...] | None
    limit_tau: float
    limit_status: str
    limit_error: float | None
    infinity_limit: tuple[float, ...] | None
    infinity_tau: float
    uniform_at_infinity: bool | None


@dataclass(frozen=True)
class SweepMatch:
    """The temperature at which a method puts ``target`` of its mass on the true top-k."""

    method: str
    target: float
    tau: float | None
    topk_mass: float | None


@dataclass(frozen=True)
class SweepResult:
    """Everything ``temperature-sweep`` measured on one vector."""

    x: tuple[float, ...]
    k: int
    taus: tuple[float, ...]
    hard: tuple[float, ...]
    points: tuple[SweepPoint, ...]
    limits: tuple[SweepLimit, ...]
    matches: tuple[SweepMatch, ...] = ()
    #: ``hardness``: per method, its calibration and the measurements at that tau (None if unreachable).
    at_hardness: tuple[tuple[HardnessMatch, SweepPoint | None], ...] = ()

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


def _measure(method: str, x: FloatArray, k: int, tau: float, hard: FloatArray) -> SweepPoint:
    r = evaluate(x, k, method, tau=tau)
    status = str(r.status) if r.status.ndim == 0 else str(r.status.ravel()[0])
    if r.failures:
        return SweepPoint(method, tau, status, None, None, None, None, None, None, status)
    p = r.weights.astype(np.float64)
    err = np.abs(p - hard)
    w = p / k
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 log 0 = 0 by convention
        entropy = float(-np.sum(np.where(w > 0, w * np.log(w), 0.0)))
    jac_status = "ok"
    try:
        jac = jacobian(x, k, method, tau=tau).astype(np.float64)
    except NumericalFailureError as exc:  # forward fine, derivative not representable
        jac_norm = small = None
        jac_status = exc.failures[0].code if exc.failures else "failed"
    else:
        jac_norm = float(np.linalg.norm(jac))
        small = float(np.mean(np.linalg.norm(jac, axis=0) < SMALL_GRADIENT))
    return SweepPoint(
        method=method, tau=tau, status=status,
        l1_to_hard=float(err.sum()),
        topk_mass=float(np.sum(hard * p) / k),
        max_entry_error=float(err.max()),
        entropy=entropy,
        jacobian_norm=jac_norm,
        small_gradient_fraction=small,
        jacobian_status=jac_status,
    )


def limit_taus(x: FloatArray) -> tuple[float, float]:
    """``(tau for the tau -> 0 limit, tau for the tau -> infinity limit)`` relative to ``x``.

    >>> limit_taus(np.array([3.0, 1.0, 2.0]))
    (0.0001, 2000000.0)
    """
    values = np.unique(x[np.isfinite(x)])
    gaps = np.diff(values)
    gap = float(gaps.min()) if gaps.size else 1.0
    spread = float(values.max() - values.min()) if values.size > 1 else 1.0
    # clamped: a subnormal gap (5e-324) must not underflow tau to 0, nor a huge spread overflow it
    tiny, huge = float(np.finfo(np.float64).tiny), float(np.finfo(np.float64).max) / 16
    return min(max(1e-4 * gap, tiny), huge), min(max(1e6 * spread, tiny), huge)


def _limit(method: str, x: FloatArray, k: int, hard: FloatArray) -> SweepLimit:
    small, large = limit_taus(x)
    r0 = evaluate(x, k, method, tau=small)
    if r0.failures:
        converges, limit, err, status = None, None, None, r0.failures[0].code
    else:
        p0 = r0.weights.astype(np.float64)
        err = float(np.max(np.abs(p0 - hard)))
        converges, status = err <= _CONVERGED, "ok"
        limit = tuple(float(v) for v in np.round(p0, LIMIT_DECIMALS) + 0.0)
    rl = evaluate(x, k, method, tau=large)
    if rl.failures:
        inf_limit, uniform = None, None
    else:
        pl = rl.weights.astype(np.float64)
        finite = np.isfinite(x)
        uniform_value = k / finite.sum()
        uniform = bool(np.max(np.abs(pl[finite] - uniform_value)) <= 1e-4)
        inf_limit = tuple(float(v) for v in np.round(pl, LIMIT_DECIMALS) + 0.0)
    return SweepLimit(method, converges, limit, small, status, err, inf_limit, large, uniform)


def _match(method: str, x: FloatArray, k: int, target: float, hard: FloatArray) -> SweepMatch:
    """Bisection on log tau for ``topk_mass(tau) = target`` (mass decreasing in tau)."""
    small, large = limit_taus(x)

    def mass(tau: float) -> float | None:
        r = evaluate(x, k, method, tau=tau)
        if r.failures:
            return None
        return float(np.sum(hard * r.weights.astype(np.float64)) / k)

    lo, hi = math.log(small), math.log(large)
    m_lo, m_hi = mass(small), mass(large)
    while m_lo is None and hi - lo > 1.0:  # a method failing only at small tau: start where it works
        lo += 0.25 * math.log(10.0)
        m_lo = mass(math.exp(lo))
    if m_lo is None or m_hi is None or not (m_hi <= target <= m_lo):
        return SweepMatch(method, target, None, None)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        m = mass(math.exp(mid))
        if m is None or m >= target:  # a failure is on the small-tau side
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    tau = math.exp(lo)
    found = mass(tau)
    if found is None:
        tau = math.exp(hi)
        found = mass(tau)
    return SweepMatch(method, target, tau, found)


def temperature_sweep(
    x: ArrayLike,
    k: int,
    *,
    methods: Sequence[str] | None = None,
    taus: Sequence[float] | str = DEFAULT_TAUS,
    match: float | None = None,
    hardness: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Measure each method on ``x`` across a grid of temperatures, plus its limits.

    Args:
        x: one score vector ``(n,)``; ``-inf`` masks an entry.
        k: ``1 <= k <= n``.
        methods: registered names (default: all).
        taus: temperatures, or text for :func:`parse_taus`.
        match: a top-k mass in (0, 1] to reach (the tau per method is reported).
        hardness: a top-k mass in (k/n, 1): each method is also measured at the largest tau that
            reaches it (:func:`topk_cli.tau_for_hardness`), or reported unreachable with the reason.
        progress: called with ``(done, total)`` after each method.

    Raises:
        InvalidArgumentError: bad ``x``, ``k``, method, tau grid or ``match``.

    >>> r = temperature_sweep([2.0, 1.0, 0.0], 1, methods=["hard"], taus=[1.0])
    >>> r.points[0].l1_to_hard, r.limits[0].converges
    (0.0, True)
    """
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidArgumentError(f"x must be one non-empty vector (n,), got shape {arr.shape}")
    if np.isnan(arr).any() or (arr == np.inf).any():
        raise InvalidArgumentError("x must not contain NaN or +inf (use -inf to mask an entry)")
    n_finite = int(np.isfinite(arr).sum())
    k = check_k(k, n_finite)
    grid = parse_taus(taus) if isinstance(taus, str) else tuple(float(t) for t in taus)
    for t in grid:
        check_tau(t)
    if match is not None and not (0 < match <= 1):
        raise InvalidArgumentError(f"match must be a top-k mass in (0, 1], got {match}")
    names = tuple(methods) if methods is not None else tuple(METHODS)
    for name in names:
        get_method(name)
    finite = np.isfinite(arr)
    hard = np.zeros_like(arr)
    hard[finite] = hard_topk_weights(arr[finite], int(k))
    points: list[SweepPoint] = []
    limits: list[SweepLimit] = []
    matches: list[SweepMatch] = []
    at_hardness: list[tuple[HardnessMatch, SweepPoint | None]] = []
    for i, name in enumerate(names):
        if hardness is not None:
            hm = tau_for_hardness(arr, int(k), name, hardness)
            at_hardness.append((hm, _measure(name, arr, int(k), hm.tau, hard) if hm.tau is not None else None))
        points.extend(_measure(name, arr, int(k), tau, hard) for tau in grid)
        limits.append(_limit(name, arr, int(k), hard))
        if match is not None:
            matches.append(_match(name, arr, int(k), match, hard))
        if progress is not None:
            progress(i + 1, len(names))
    return SweepResult(
        x=tuple(float(v) for v in arr), k=int(k), taus=grid, hard=tuple(float(v) for v in hard),
        points=tuple(points), limits=tuple(limits), matches=tuple(matches), at_hardness=tuple(at_hardness),
    )
