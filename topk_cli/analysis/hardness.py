"""Equal hardness: the temperature at which a method puts a given share of its mass on the true top-k.

The *hardness* of ``p = ST(x / tau)`` on a batch of rows is its mean top-k mass

    H(tau) = mean over rows of  sum_i h_i p_i / k,

with ``h = T_k(x)`` the hard top-k (ties at the k-th value share the remaining mass). For a real
k (a method that takes one), ``h`` is the real-k hard selection (1 on the top ``floor(k)``
entries, ``k - floor(k)`` on the next) and the mass is ``sum_i h_i p_i / (floor(k) + (k -
floor(k))^2)``: the share of ``p`` on that selection, scaled so that ``p = h`` has mass 1 (at an
integer k the divisor is k, the formula above). ``H`` goes
from ``k/n`` (uniform weights, ``tau -> infinity``) to 1 (hard top-k, ``tau -> 0``) for the exact
operators. The same ``tau`` gives very different hardness across operators (a 16x to 250x spread
of tau at equal mass on standardised scores), so operators are compared at equal ``H``, not at
equal ``tau``.

:func:`calibrate_hardness` finds, per target ``H``, the *largest* tau (the softest operator) at
which the mean mass reaches ``H`` while at most ``max_refused`` of the rows are refused (a method
that cannot compute a row reports it instead of returning it wrong). The mass of some methods is
not monotone in tau (``weighted-softmax``), so bisection alone could stop at the wrong crossing:
the search scans a shared log grid (three points per decade, from ``100 * s`` down to
``1e-6 * s``, ``s`` the median row standard deviation) from soft to hard, stops at the first grid
point that qualifies, and refines between it and its softer neighbour by the Illinois variant of
regula falsi on ``log tau`` (with a bisection whenever it stalls) to float64 precision: the mean
mass at the returned tau is within ``MASS_TOLERANCE = 1e-9`` of ``H`` (from above) wherever the
mass is continuous in tau. Where it is not (a Monte Carlo estimate with a fixed seed is a step
function of tau; ``weighted-softmax`` has poles), the bracket shrinks to ``1e-10`` in ``log tau``
and the result is the closest mass from above. A crossing and recrossing inside one grid step
(a factor 2.15 in tau) is not resolved. This is the one solver behind ``compute --hardness``,
``temperature-sweep --hardness`` and ``--match``, and ``train-probe``. A target is *unreachable* when no grid tau qualifies; the reason says whether
the mass never gets there or refusals block it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.api import evaluate, get_method, soft_topk
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray
from topk_cli.registry import BASELINE_METHOD

#: A tau qualifies when at most this share of the rows is refused.
DEFAULT_MAX_REFUSED = 0.01
#: Grid: tau = s * 10 ** (GRID_TOP - j / GRID_PER_DECADE), j = 0 .. (GRID_TOP - GRID_BOTTOM) * GRID_PER_DECADE.
GRID_TOP = 2
GRID_BOTTOM = -6
GRID_PER_DECADE = 3
#: The refinement stops once the mass is within this of the target (from above): float64
#: precision for a mean of masses in [0, 1] (each row's mass is exact to a few ulps).
MASS_TOLERANCE = 1e-9
#: ... or once the bracket on log tau is narrower than this: the mass jumps over the target. The
#: mean mass changes by at most a few units per unit of log tau (each row's by at most about
#: 0.25 k where it is smooth), so a continuous crossing is within MASS_TOLERANCE long before.
TAU_RESOLUTION = 1e-10
#: Where the mass steps over the target (no tau within MASS_TOLERANCE), a step straddling it by
#: less than this on both sides still counts as reaching it (Monte Carlo estimates are steps).
JUMP_TOLERANCE = 5e-3
#: At most this many operator calls refine one target (a bisection every other step, unless the
#: bracket halved, bounds its shrinking: about 2 * 33 calls take a grid step of log 10 / 3 below
#: TAU_RESOLUTION).
MAX_REFINEMENTS = 100


@dataclass(frozen=True)
class HardnessMatch:
    """The tau of one method at one target hardness.

    ``status`` is ``"ok"`` (``mass`` at ``tau`` is within 1e-9 above ``target``; or, where the
    mass is a step function of tau, at a step of less than 5e-3 that straddles ``target``:
    ``reason`` then gives the step),
    ``"approximate"`` (the mean mass jumps over ``target``, e.g. at a pole of some row: ``tau`` is
    the tried tau whose mass came closest from above; ``reason`` says where it jumps),
    ``"constant"`` (the mass does not depend on tau, e.g. the hard top-k: ``tau`` None, ``mass``
    the constant) or ``"unreachable"`` (``tau`` and ``mass`` None; ``reason`` says why). ``refused`` is the share of
    rows the method refused at ``tau``.
    """

    method: str
    target: float
    tau: float | None
    mass: float | None
    refused: float | None
    status: str
    reason: str = ""


@dataclass(frozen=True)
class _Point:
    tau: float
    mass: float | None  # mean over the rows computed; None when every row failed or tau invalid
    refused: float


class _MassCurve:
    """Mean top-k mass of one method on one batch, cached per tau."""

    def __init__(
        self, x: FloatArray, k: Any, method: str, hard: FloatArray, params: Mapping[str, Any] | None = None
    ) -> None:
        self.x, self.k, self.method, self.hard = x, k, method, hard
        self.params: dict[str, Any] = dict(params or {})
        self.cache: dict[float, _Point] = {}

    def __call__(self, tau: float) -> _Point:
        if tau not in self.cache:
            self.cache[tau] = self._measure(tau)
        return self.cache[tau]

    def _measure(self, tau: float) -> _Point:
        try:
            r = evaluate(self.x, self.k, self.method, tau=tau, **self.params)
        except InvalidArgumentError:  # tau below what the method can represent for this spread
            return _Point(tau, None, 1.0)
        ok = np.asarray(r.status).reshape(-1) == "ok"
        refused = float(np.count_nonzero(~ok) / ok.size)
        if not ok.any():
            return _Point(tau, None, refused)
        p = np.asarray(r.weights, dtype=np.float64).reshape(self.hard.shape)[ok]
        k = self.k[ok] if isinstance(self.k, np.ndarray) else self.k
        return _Point(tau, mean_topk_mass(self.hard[ok], p, k), refused)


def selection_norm(k: Any) -> Any:
    """``sum_i h_i^2`` of the hard selection of an untied row: ``floor(k) + (k - floor(k))^2`` (k at an
    integer k); elementwise for an array of k (one per row)."""
    whole = np.floor(k)
    norm = whole + (k - whole) ** 2
    return norm if isinstance(k, np.ndarray) else float(norm)


def mean_topk_mass(hard: FloatArray, p: FloatArray, k: Any) -> float:
    """Mean over the rows of ``sum_i h_i p_i``, divided by :func:`selection_norm` (by ``k`` for an
    integer k, bit for bit the integer formula): the top-k mass of the module docstring. ``k`` is
    one k, or one per row of ``hard`` (each row divided by its own)."""
    if isinstance(k, np.ndarray):
        return float(np.mean(np.sum(hard * p, axis=-1) / selection_norm(np.asarray(k, dtype=np.float64))))
    total = np.mean(np.sum(hard * p, axis=-1))
    if isinstance(k, (int, np.integer)) or float(k).is_integer():
        return float(total / int(k))
    return float(total / selection_norm(float(k)))


def _batch(x: ArrayLike, k: Any) -> tuple[FloatArray, Any, FloatArray]:
    """``x`` as a ``(B, n)`` float64 batch, ``k`` (an int, a float for a real k, or a ``(B,)``
    float64 array: one k per row), and the hard top-k (validates all)."""
    try:
        arr = np.array(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"x must be an array of real numbers: {exc}") from None
    if arr.ndim == 0:
        raise InvalidArgumentError("x must have at least one axis (a vector), got a scalar")
    hard = np.asarray(soft_topk(arr, k, BASELINE_METHOD), dtype=np.float64)  # validates x and k
    n = arr.shape[-1]
    if isinstance(k, (np.ndarray, list, tuple)):
        rows = arr.reshape(-1, n).shape[0]
        k_out: Any = np.broadcast_to(np.asarray(k, dtype=np.float64), arr.shape[:-1]).reshape(rows).copy()
    else:
        k_out = int(k) if float(k).is_integer() else float(k)
    return arr.reshape(-1, n), k_out, hard.reshape(-1, n)


def uniform_mass(x: FloatArray, k: Any) -> float:
    """Mean top-k mass of uniform weights over the unmasked entries: ``mean(k / n_row)`` (times
    ``k / selection_norm(k)`` for a real k, since the hard selection sums to k); ``k`` may hold one
    k per row."""
    base = k / np.isfinite(x).sum(axis=-1)
    if isinstance(k, np.ndarray):
        return float(np.mean(base * (k / selection_norm(k))))
    if isinstance(k, (int, np.integer)) or float(k).is_integer():
        return float(np.mean(base))
    return float(np.mean(base * (k / selection_norm(float(k)))))


def tau_grid(x: FloatArray) -> tuple[float, ...]:
    """The shared calibration grid, from soft to hard, in units of the median row std of ``x``."""
    finite = np.isfinite(x)
    mean = np.sum(np.where(finite, x, 0.0), axis=-1, keepdims=True) / finite.sum(axis=-1, keepdims=True)
    sd = np.sqrt(np.sum(np.where(finite, (x - mean) ** 2, 0.0), axis=-1) / finite.sum(axis=-1))
    positive = sd[sd > 0]
    scale = float(np.median(positive)) if positive.size else 1.0
    count = (GRID_TOP - GRID_BOTTOM) * GRID_PER_DECADE + 1
    return tuple(scale * 10.0 ** (GRID_TOP - j / GRID_PER_DECADE) for j in range(count))


def topk_mass(x: ArrayLike, k: float, method: str, tau: float, **params: Any) -> tuple[float | None, float]:
    """``(mean top-k mass over the rows computed, share of rows refused)`` of ``method`` at ``tau``.

    The mass is None when no row could be computed; ``params`` go to the method (e.g. ``samples``).

    >>> mass, refused = topk_mass([[1.0, 0.0]], 1, "grad", 1.0)  # softmax: e / (e + 1)
    >>> round(mass, 4), refused
    (0.7311, 0.0)
    """
    get_method(method)
    arr, k_int, hard = _batch(x, k)
    point = _MassCurve(arr, k_int, method, hard, params)(float(tau))
    return point.mass, point.refused


def calibrate_hardness(
    x: ArrayLike,
    k: float,
    method: str,
    targets: Sequence[float],
    *,
    max_refused: float = DEFAULT_MAX_REFUSED,
    params: Mapping[str, Any] | None = None,
) -> tuple[HardnessMatch, ...]:
    """The largest tau at which ``method``'s mean top-k mass on ``x`` reaches each target.

    Args:
        x: scores ``[..., n]`` (every row is one instance; ``-inf`` masks an entry).
        k: ``1 <= k <= n``.
        method: a registered method name.
        targets: top-k masses, each in ``(mean k/n, 1)``.
        max_refused: largest share of refused rows a qualifying tau may have.
        params: the method's extra parameters (e.g. ``samples`` and ``seed`` of a Monte Carlo method).

    Returns:
        One :class:`HardnessMatch` per target, in the order given. The grid is shared by all
        targets, so several targets cost little more than one.

    Raises:
        InvalidArgumentError: bad ``x``, ``k``, method, a target outside ``(k/n, 1)`` or
            ``max_refused`` outside ``[0, 1)``.
    """
    get_method(method)
    arr, k_int, hard = _batch(x, k)
    low = uniform_mass(arr, k_int)
    for h in targets:
        if not (isinstance(h, (int, float, np.floating)) and low < float(h) < 1.0):
            raise InvalidArgumentError(
                f"hardness must be a top-k mass in (k/n, 1) = ({low:.4g}, 1), got {h!r}"
            )
    if not 0.0 <= max_refused < 1.0:
        raise InvalidArgumentError(f"max_refused must be in [0, 1), got {max_refused}")
    curve = _MassCurve(arr, k_int, method, hard, params)
    grid = tau_grid(arr)
    pending = {float(h) for h in targets}
    found: dict[float, HardnessMatch] = {}
    previous: _Point | None = None
    too_hard: set[float] = set()  # targets the softest tau already reaches: mass never falls to them
    for tau in grid:
        point = curve(tau)
        for h in sorted(pending):
            if _qualifies(point, h, max_refused):
                if previous is None:
                    too_hard.add(h)
                else:
                    found[h] = _refine(curve, method, h, point, previous, max_refused)
                pending.discard(h)
        if not (pending or too_hard) or (point.mass is None and point.refused >= 1.0):
            break  # every target found, or nothing smaller is computable
        previous = point
    for h in pending | too_hard:
        found[h] = _unreachable(curve, method, h, max_refused, grid[0])
    return tuple(found[float(h)] for h in targets)


def tau_for_hardness(
    x: ArrayLike, k: Any, method: str, hardness: float, *, max_refused: float = DEFAULT_MAX_REFUSED, **params: Any
) -> HardnessMatch:
    """The largest tau at which ``method`` puts a mean share ``hardness`` of its mass on the true top-k.

    ``hardness`` is the mean over the rows of ``x`` of ``sum_i h_i p_i / k`` (``h`` the hard
    top-k), in ``(k/n, 1)``; at most ``max_refused`` of the rows may be refused at that tau. The
    result's ``status`` is ``"unreachable"`` (with a reason) when no tau qualifies. ``params`` go
    to the method, as in :func:`topk_cli.evaluate`.

    Raises:
        InvalidArgumentError: bad ``x``, ``k``, method, or ``hardness`` outside ``(k/n, 1)``.

    >>> m = tau_for_hardness([3.0, 2.0, 1.0, 0.0], 2, "thre-sigmoid", 0.9)
    >>> m.status, round(m.tau, 3), round(m.mass, 3)
    ('ok', 0.341, 0.9)
    >>> tau_for_hardness([3.0, 2.0, 1.0, 0.0], 2, "hard", 0.9).reason
    'the top-k mass is 1 at every tau'
    """
    return calibrate_hardness(x, k, method, [hardness], max_refused=max_refused, params=params)[0]


def _qualifies(point: _Point, target: float, max_refused: float) -> bool:
    return point.mass is not None and point.refused <= max_refused and point.mass >= target


def _refine(
    curve: _MassCurve, method: str, target: float, hit: _Point, soft: _Point | None, max_refused: float
) -> HardnessMatch:
    """Solve ``mass(tau) = target`` between ``hit`` (qualifies) and ``soft`` (does not), on log tau.

    The Illinois variant of regula falsi keeps a bracket whose hard end always qualifies; a step
    that fails to halve the bracket is followed by a bisection, so the bracket shrinks at least
    geometrically. It stops when the hard end's mass is within :data:`MASS_TOLERANCE` of the
    target, or when the bracket is narrower than :data:`TAU_RESOLUTION` (then the mass jumps over
    the target between two taus 1e-10 apart, relatively: a step or a pole).
    """
    if soft is None:  # the softest grid tau already qualifies: keep it
        return HardnessMatch(method, target, hit.tau, hit.mass, hit.refused, "ok")
    lo, hi = hit, soft  # lo: harder, qualifies; hi: softer, does not
    assert lo.mass is not None
    f_lo = lo.mass - target
    f_hi = (hi.mass - target) if hi.mass is not None and hi.refused <= max_refused else None
    side = 0
    width = math.log(hi.tau / lo.tau)
    for step in range(MAX_REFINEMENTS):
        if lo.mass - target <= MASS_TOLERANCE or math.log(hi.tau / lo.tau) < TAU_RESOLUTION:
            break
        u_lo, u_hi = math.log(lo.tau), math.log(hi.tau)
        bisect = f_hi is None or f_hi >= 0 or (step % 2 == 1 and u_hi - u_lo > 0.5 * width)
        if step % 2 == 1:
            width = u_hi - u_lo
        if bisect:  # no usable sign change on the soft side, or regula falsi stalls
            u = 0.5 * (u_lo + u_hi)
        else:
            assert f_hi is not None
            u = u_lo + (u_hi - u_lo) * f_lo / (f_lo - f_hi)
        mid = curve(math.exp(u))
        if not lo.tau < mid.tau < hi.tau:  # the bracket is as narrow as float64 allows
            break
        if _qualifies(mid, target, max_refused):
            assert mid.mass is not None
            lo, f_lo = mid, mid.mass - target
            if side == -1 and f_hi is not None:
                f_hi *= 0.5  # Illinois: halve the stale end's value
            side = -1
        else:
            hi = mid
            f_hi = (mid.mass - target) if mid.mass is not None and mid.refused <= max_refused else None
            if side == 1:
                f_lo *= 0.5
            side = 1
    assert lo.mass is not None
    if lo.mass - target <= MASS_TOLERANCE:
        return HardnessMatch(method, target, lo.tau, lo.mass, lo.refused, "ok")
    if hi.refused > max_refused:  # a refusal barrier, not a jump: the target itself is refused
        return _unreachable(curve, method, target, max_refused, soft.tau)
    if hi.mass is not None and hi.mass >= target - JUMP_TOLERANCE and lo.mass - target <= JUMP_TOLERANCE:
        # A small step of the mass straddles the target (a Monte Carlo estimate with a fixed seed
        # is piecewise constant in tau): lo is the closest mass from above, at the step.
        return HardnessMatch(
            method, target, lo.tau, lo.mass, lo.refused, "ok",
            f"the mean mass steps from {lo.mass:.6g} to {hi.mass:.6g} at tau = {lo.tau:.6g}",
        )
    # The mean mass jumps over the target (a pole of some row, or rows refused from one tau to
    # the next): no tau gives it. Keep the tried tau whose mass came closest from above.
    near = min(
        (p for p in curve.cache.values() if hit.tau <= p.tau <= soft.tau and _qualifies(p, target, max_refused)),
        key=lambda p: (p.mass or 0.0) - target,
    )
    assert near.mass is not None
    if hi.mass is not None:
        why = f"the mean mass jumps from {lo.mass:.3f} to {hi.mass:.3f} at tau = {lo.tau:.3g}"
    else:
        why = f"the rows cannot be computed just above tau = {lo.tau:.3g}"  # pragma: no cover
    return HardnessMatch(
        method, target, near.tau, near.mass, near.refused, "approximate",
        f"no tau gives mass {target:g} exactly: {why}; the closest from above is {near.mass:.4f}",
    )


def _unreachable(
    curve: _MassCurve, method: str, target: float, max_refused: float, softest: float
) -> HardnessMatch:
    points = list(curve.cache.values())
    masses = [p.mass for p in points if p.mass is not None]
    first = curve(softest)
    if masses and max(masses) - min(masses) < 1e-12:
        return HardnessMatch(
            method, target, None, masses[0], first.refused, "constant", f"the top-k mass is {masses[0]:.4g} at every tau"
        )
    if _qualifies(first, target, max_refused):
        reason = f"its top-k mass is still {first.mass:.3f} at the softest tau tried ({softest:.3g})"
    else:
        allowed = [p for p in points if p.mass is not None and p.refused <= max_refused]
        blocked = [p for p in points if p.mass is not None and p.mass >= target and p.refused > max_refused]
        if blocked:
            worst = max(blocked, key=lambda p: p.tau)
            reason = (
                f"refuses more than {max_refused:.0%} of the rows where its mass reaches {target:g} "
                f"({worst.refused:.1%} refused at tau = {worst.tau:.3g})"
            )
        elif allowed:
            best = max(allowed, key=lambda p: p.mass or 0.0)
            reason = f"its top-k mass never reaches {target:g} (at most {best.mass:.3f}, at tau = {best.tau:.3g})"
        else:
            reason = "it cannot compute the rows at any tau tried"
    return HardnessMatch(method, target, None, None, None, "unreachable", reason)
