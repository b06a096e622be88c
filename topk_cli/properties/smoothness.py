"""The ``smooth`` check: the smoothness class along random lines through candidate kinks, and poles."""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.api import TopKResult, evaluate, get_method
from topk_cli.operators._base import FloatArray
from topk_cli.properties.evaluator import Evaluator, _z
from topk_cli.properties.in_k import k_applies
from topk_cli.properties.results import (
    _MAX_REAL_K_SMOOTH_CASES,
    _MAX_REFUSED_SMOOTH_CASES,
    _MAX_SMOOTH_CASES,
    _POLE_CODES,
    _POLE_EDGE,
    _POLE_GRID,
    _POLE_GROWTH,
    _POLE_HUGE,
    _RAY_POINTS,
    _SMOOTH_STEP,
    Case,
    Counterexample,
    PropertyResult,
    _vec,
)
from topk_cli.properties.shrinking import _shrink
from topk_cli.registry import SMOOTHNESS_CLASSES

_CLASS_RANK = {name: rank for rank, name in enumerate(SMOOTHNESS_CLASSES)}


@dataclass
class _Bisection:
    """One entry's bisection in :func:`_bisect_entries`: ``x_i`` in ``[lo, hi]``, done or not."""

    i: int
    predicate: Callable[[FloatArray, FloatArray], np.ndarray]
    lo: float
    hi: float
    found: bool = False
    done: bool = False


def _bisect_entries(
    method: str, x: FloatArray, k: int | float, tau: float, tasks: Sequence[tuple[int, Callable[[FloatArray, FloatArray], np.ndarray]]]
) -> list[FloatArray | None]:
    """Move ``x_i`` to where ``predicate`` (monotone in x_i) switches from False to True, per task.

    Each task ``(i, predicate)`` is an independent bisection of 9 rounds on 64-point grids; the
    rounds of all tasks share one operator call (a row's bits do not depend on its batch).
    ``predicate(weights, complement)`` gets the rows of one grid.
    """
    finite = x[np.isfinite(x)]
    lo, hi = float(finite.min()) - 60 * tau, float(finite.max()) + 60 * tau
    state = [_Bisection(i, pred, lo, hi) for i, pred in tasks]
    for _ in range(9):
        active = [b for b in state if not b.done]
        if not active:
            break
        grids = [np.linspace(b.lo, b.hi, 64) for b in active]
        batch = np.repeat(x[None, :], 64 * len(active), axis=0)
        for a, (b, grid) in enumerate(zip(active, grids, strict=True)):
            batch[64 * a : 64 * (a + 1), b.i] = grid
        r = evaluate(batch, k, method, tau=tau)
        for a, (b, grid) in enumerate(zip(active, grids, strict=True)):
            rows = slice(64 * a, 64 * (a + 1))
            if not (r.status[rows] == "ok").all():
                b.done = True
                continue
            flags = b.predicate(r.weights[rows], r.complement[rows])
            if flags[0] or not flags[-1]:
                b.done = True
                continue
            first = int(np.argmax(flags))
            b.lo, b.hi = float(grid[first - 1]), float(grid[first])
            if b.hi - b.lo <= 1e-13 * max(1.0, abs(b.hi)):
                b.found = b.done = True
    out: list[FloatArray | None] = []
    for b in state:
        if b.done and not b.found:
            out.append(None)
            continue
        y = x.copy()
        y[b.i] = b.hi
        out.append(y)
    return out


def _weight_at_least(weights: FloatArray, complement: FloatArray, *, i: int, level: float) -> np.ndarray:
    return np.asarray(weights[:, i] >= level)


def _weight_above(weights: FloatArray, complement: FloatArray, *, i: int, level: float) -> np.ndarray:
    return np.asarray(weights[:, i] > level)


def _saturated(weights: FloatArray, complement: FloatArray, *, i: int) -> np.ndarray:
    return np.asarray(complement[:, i] <= 0.0)


def _candidate_points(method: str, x: FloatArray, k: int | float, tau: float) -> list[tuple[FloatArray, str]]:
    """Points where a kink or jump would sit: ties and p_i crossings at 1/2, 1 and 0.

    For a non-integer k, ``j = ceil(k)`` stands for k: the ``j``-th largest entry holds the
    fractional mass, and ties with both of its neighbours are candidates.
    """
    n = x.shape[-1]
    order = np.argsort(-x, kind="stable")
    out: list[tuple[FloatArray, str]] = []
    j = math.ceil(k)
    if j < n:
        y = x.copy()
        y[order[j]] = y[order[j - 1]]
        out.append((y, "tie at the k-th value"))
    if not float(k).is_integer() and j >= 2:
        y = x.copy()
        y[order[j - 1]] = y[order[j - 2]]
        out.append((y, "tie above the ceil(k)-th value"))
    if n >= 3:
        y = x.copy()
        y[order[-1]] = y[order[-2]]
        out.append((y, "tie at the minimum"))
    entries = sorted({int(order[j - 1]), int(order[min(j, n - 1)]), int(order[0])})
    tasks: list[tuple[int, Callable[[FloatArray, FloatArray], np.ndarray]]] = []
    names: list[str] = []
    for i in entries:
        crossings: list[tuple[str, Callable[[FloatArray, FloatArray], np.ndarray]]] = [
            ("p_i = 1/2", functools.partial(_weight_at_least, i=i, level=0.5)),
            ("edge of p_i = 1", functools.partial(_saturated, i=i)),
            ("edge of p_i = 0", functools.partial(_weight_above, i=i, level=0.0)),
        ]
        for name, pred in crossings:
            tasks.append((i, pred))
            names.append(f"{name} (entry {i})")
    for y, name in zip(_bisect_entries(method, x, k, tau, tasks), names, strict=True):
        if y is not None:
            out.append((y, name))
    return out


def _line_points(x0: FloatArray, tau: float, d: FloatArray, ts: ArrayLike) -> FloatArray:
    """The rows ``x0 + t d tau`` for every ``t`` in ``ts``."""
    t = np.asarray(ts, dtype=np.float64)
    return np.asarray(x0[None, :] + t[:, None] * (d * tau)[None, :], dtype=np.float64)


def _accepted_edge(method: str, x0: FloatArray, k: int | float, tau: float, d: FloatArray, t0: float, side: int) -> float | None:
    """Distance from ``t0`` (refused) to the first accepted point on ``side`` (+1 or -1), or None.

    A geometric grid of distances (2^-30 .. 4, in units of tau) locates the edge of the refused
    stretch within a factor 2; a linear grid then pins it to 1/16 of that.
    """
    ts = t0 + side * _POLE_GRID
    ok = evaluate(_line_points(x0, tau, d, ts), k, method, tau=tau).status == "ok"
    if not ok.any():
        return None
    a = float(_POLE_GRID[int(np.argmax(ok))])
    fine = np.linspace(a / 2, a, 9)[1:]
    ok = evaluate(_line_points(x0, tau, d, t0 + side * fine), k, method, tau=tau).status == "ok"
    return float(fine[int(np.argmax(ok))])  # the last one (a) is accepted


def _pole_probe(method: str, x0: FloatArray, k: int | float, tau: float, d: FloatArray, t0: float) -> tuple[float, str] | None:
    """Evidence of a pole of ``t -> p(x0 + t d)`` in the refused stretch around ``t0``.

    From the refused ``t0`` the probe walks outwards on both sides until the method accepts
    (``[left, right]``, width ``w``), then reads p at distances ``0, w/2, 2w`` beyond each edge.
    A pole is reported when some ``p_i`` grows toward the stretch on *both* sides (a factor >=
    1.5 from each distance to the next nearer one: ``1/t`` gives 2 and 2.5), exceeds 2 in
    magnitude at both edges (beyond every weight of a top-k operator) and either changes sign
    across the stretch (a simple pole, ``A / (t - t*)``) or reaches ``1e3`` on both sides. A
    continuous p of bounded slope cannot do this across a stretch the method refuses; a refusal
    on a smooth stretch (bounded values that do not grow toward it) is no evidence at all.
    Returns ``(size, detail)``, size the smaller edge magnitude, or None.
    """
    u_minus = _accepted_edge(method, x0, k, tau, d, t0, -1)
    u_plus = _accepted_edge(method, x0, k, tau, d, t0, +1)
    if u_minus is None or u_plus is None:
        return None
    left, right = t0 - u_minus, t0 + u_plus
    w = right - left
    offsets = np.array([0.0, w / 2, 2 * w])
    ts = np.concatenate([left - offsets, right + offsets])
    r = evaluate(_line_points(x0, tau, d, ts), k, method, tau=tau)
    if (r.status != "ok").any():
        return None
    g = np.abs(r.weights.astype(np.float64))
    sides = (g[:3], g[3:])
    p_left, p_right = r.weights[0].astype(np.float64), r.weights[3].astype(np.float64)
    grows = np.ones(g.shape[-1], dtype=bool)
    for near, mid, far in sides:
        grows &= (near >= _POLE_GROWTH * mid) & (mid >= _POLE_GROWTH * far)
    edge = np.minimum(np.abs(p_left), np.abs(p_right))
    opposite = np.sign(p_left) * np.sign(p_right) < 0
    pole = grows & (edge > _POLE_EDGE) & (opposite | (edge >= _POLE_HUGE))
    if not pole.any():
        return None
    i = int(np.argmax(np.where(pole, edge, -np.inf)))
    detail = (
        f"p[{i}] = {p_left[i]:.4g} and {p_right[i]:.4g} at the edges of a stretch the method refuses "
        f"(t in [{left:.3g}, {right:.3g}]), growing like 1/t toward it from both sides "
        f"({g[2, i]:.3g} -> {g[1, i]:.3g} -> {g[0, i]:.3g} and {g[5, i]:.3g} -> {g[4, i]:.3g} -> {g[3, i]:.3g}): a pole"
    )
    return float(edge[i]), detail


def _line_ts() -> FloatArray:
    """The points ``t`` of :func:`_line_class`: 0, then +-h and +-2h for h, h/4, h/16."""
    hs = (_SMOOTH_STEP, _SMOOTH_STEP / 4, _SMOOTH_STEP / 16)
    return np.array([0.0] + [s * h for h in hs for s in (-2, -1, 1, 2)])


def _evaluate_lines(
    method: str, lines: Sequence[tuple[FloatArray, FloatArray]], k: int | float, tau: float
) -> list[tuple[FloatArray, np.ndarray]]:
    """``(weights, status)`` on the points of each line ``(x0, d)``, in one operator call."""
    if not lines:
        return []
    ts = _line_ts()
    r = evaluate(np.vstack([_line_points(x0, tau, d, ts) for x0, d in lines]), k, method, tau=tau)
    m = ts.size
    return [(r.weights[m * a : m * (a + 1)], r.status[m * a : m * (a + 1)]) for a in range(len(lines))]


def _line_class(
    method: str, x0: FloatArray, k: int | float, tau: float, d: FloatArray, rows: tuple[FloatArray, np.ndarray] | None = None
) -> tuple[str, float, str] | None:
    """Smoothness class of ``t -> p(x0 + t d)`` at ``t = 0`` (d in units of tau), None if unmeasured.

    Three step sizes h, h/4, h/16: a jump in p (or in dp, d2p) at t = 0 keeps its size as h
    shrinks, while a smooth change shrinks with h, and a kink near (not at) 0 cannot persist
    across both refinements. A line on which the method refuses a point is no evidence of
    smoothness: it is unmeasured (None) unless the refusal is ``"inf"``/``"ill-conditioned"``
    and :func:`_pole_probe` finds a pole there (``discontinuous``). ``rows``: the line's
    ``(weights, status)`` from :func:`_evaluate_lines` (None: evaluate them here).
    """
    hs = (_SMOOTH_STEP, _SMOOTH_STEP / 4, _SMOOTH_STEP / 16)
    ts = _line_ts()
    weights, status = _evaluate_lines(method, [(x0, d)], k, tau)[0] if rows is None else rows
    if (status != "ok").any():
        refused = np.isin(status, list(_POLE_CODES))
        if not refused.any():
            return None
        t0 = float(ts[np.flatnonzero(refused)[np.argmin(np.abs(ts[refused]))]])
        found = _pole_probe(method, x0, k, tau, d, t0)
        if found is None:
            return None
        return "discontinuous", found[0], found[1]
    g = weights.astype(np.float64)
    noise = 16 * np.finfo(float).eps * max(1.0, float(np.max(np.abs(g))))
    g0 = g[0]
    jumps: list[list[np.ndarray]] = [[], [], []]
    sides = []
    for b, h in enumerate(hs):
        gm2, gm1, gp1, gp2 = g[1 + 4 * b : 5 + 4 * b]
        d_plus = (-3 * g0 + 4 * gp1 - gp2) / (2 * h)
        d_minus = (3 * g0 - 4 * gm1 + gm2) / (2 * h)
        s_plus = (g0 - 2 * gp1 + gp2) / h**2
        s_minus = (g0 - 2 * gm1 + gm2) / h**2
        # a jump across 0, or p(0) off both one-sided limits (a removable jump: a method whose
        # tied entries are averaged although its value there differs, e.g. a sorting network)
        jumps[0].append(np.maximum(np.abs(gp1 - gm1), np.abs(2 * g0 - gp1 - gm1)))
        jumps[1].append(np.abs(d_plus - d_minus))
        jumps[2].append(np.abs(s_plus - s_minus))
        sides.append((d_plus, d_minus, s_plus, s_minus))
    h_small = hs[-1]
    dpb, dmb, spb, smb = sides[-1]
    tests = (
        ("discontinuous", jumps[0], noise, 1e-6),
        ("C0", jumps[1], noise / h_small, 1e-5),
        ("C1", jumps[2], noise / h_small**2, 1e-3),
    )
    for name, (big, mid, small), floor, absolute in tests:
        persists = (mid > 0.6 * big) & (small > 0.6 * mid) & (small > 100 * floor) & (small > absolute)
        if persists.any():
            c = small
            i = int(np.argmax(np.where(persists, c, -np.inf)))
            if name == "discontinuous":
                detail = f"p[{i}] jumps by {c[i]:.3g} across this point"
            elif name == "C0":
                detail = f"dp[{i}]/dt jumps from {dmb[i]:.4g} to {dpb[i]:.4g} across this point"
            else:
                detail = f"d2p[{i}]/dt2 jumps from {smb[i]:.4g} to {spb[i]:.4g} across this point"
            return name, float(c[i]), detail
    return "C-infinity", 0.0, ""


def _direction(rng: np.random.Generator, n: int) -> FloatArray:
    d = rng.standard_normal(n)
    d /= np.linalg.norm(d)
    return d


def _point_class(method: str, x0: FloatArray, k: int | float, tau: float) -> tuple[str, float, str]:
    """Worst class along two fixed-seed random lines through ``x0``."""
    if x0.shape[-1] < 2 or not np.isfinite(x0).all():
        return "C-infinity", 0.0, ""
    rng = np.random.default_rng(zlib.crc32(x0.tobytes() + repr((k, tau)).encode()))
    best = ("C-infinity", 0.0, "")
    directions = [_direction(rng, x0.shape[-1]) for _ in range(2)]
    for d, rows in zip(directions, _evaluate_lines(method, [(x0, d) for d in directions], k, tau), strict=True):
        measured = _line_class(method, x0, k, tau, d, rows)
        if measured is None:
            continue
        cls, size, detail = measured
        if _CLASS_RANK[cls] > _CLASS_RANK[best[0]]:
            best = (cls, size, f"{detail}; direction {_vec(d, 3)}")
    return best


def _refused_for_pole(r: TopKResult) -> np.ndarray:
    """Rows the method refused with a code that a pole produces (``"inf"``, ``"ill-conditioned"``)."""
    return np.asarray(np.isin(r.status, list(_POLE_CODES)))


def _ray_candidates(method: str, x: FloatArray, k: int | float, tau: float) -> list[tuple[FloatArray, str]]:
    """Refused points on the ray ``max x + c (x - max x)`` (spread in z from 0.1 to 50).

    A pole (``weighted-softmax``, k >= 3) is a hypersurface that rays through a vector cross at
    some scale: the scan looks for a point refused with ``"inf"``/``"ill-conditioned"``, and
    for a sign change of some ``p_i`` with ``|p_i| > 1`` on both sides, which it bisects until
    it lands on a refused point. At most one point of each kind.
    """
    top = float(np.max(x))
    span = float(np.max(x) - np.min(x)) / tau
    if not span > 0:
        return []
    scales = np.geomspace(0.1, 50.0, _RAY_POINTS) / span

    def rows(c: FloatArray) -> FloatArray:
        return np.asarray(top + c[:, None] * (x - top)[None, :], dtype=np.float64)

    r = evaluate(rows(scales), k, method, tau=tau)
    out: list[tuple[FloatArray, str]] = []
    refused = _refused_for_pole(r)
    if refused.any():
        c = scales[int(np.argmax(refused))]
        out.append((rows(np.array([c]))[0], f"refused point on the ray (scale {c * span:.4g} in z)"))
    p = r.weights.astype(np.float64)
    flips = (np.sign(p[1:]) * np.sign(p[:-1]) < 0) & (np.abs(p[1:]) > 1) & (np.abs(p[:-1]) > 1)
    if not flips.any():
        return out
    j, i = (int(v) for v in np.argwhere(flips)[0])
    lo, hi = float(scales[j]), float(scales[j + 1])
    for _ in range(6):
        grid = np.linspace(lo, hi, 17)
        rr = evaluate(rows(grid), k, method, tau=tau)
        hit = _refused_for_pole(rr)
        if hit.any():
            c = float(grid[int(np.argmax(hit))])
            out.append((rows(np.array([c]))[0], f"sign change of p[{i}] on the ray (scale {c * span:.4g} in z)"))
            break
        s = np.sign(rr.weights[:, i].astype(np.float64))
        change = np.flatnonzero(s[1:] * s[:-1] < 0)
        if change.size == 0:
            break
        lo, hi = float(grid[change[0]]), float(grid[change[0] + 1])
    return out


def _shift_candidates(method: str, x: FloatArray, k: int | float, tau: float) -> list[tuple[FloatArray, str]]:
    """For a method of the raw scores (``Implementation.centred`` False, so not shift-invariant): the
    point of sharpest bend on the shift line ``x + c tau`` (``c`` such that ``z = x / tau + c`` spans
    ``[-max z - 40, -min z + 40]``), located by zooming in on the largest second difference. A kink
    that a shift moves the row across (``scaled-sigmoid``: where ``sum sigmoid(z)`` crosses k) sits
    on a hypersurface that the other candidates do not meet; lines through this point cross it.
    """
    z = x / tau
    lo, hi = float(-np.max(z) - 40.0), float(-np.min(z) + 40.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return []
    points = 257
    for _ in range(10):
        cs = np.linspace(lo, hi, points)
        r = evaluate(x[None, :] + (cs * tau)[:, None], k, method, tau=tau)
        if r.failures:
            return []
        bend = np.max(np.abs(np.diff(r.weights.astype(np.float64), n=2, axis=0)), axis=1)
        j = int(np.argmax(bend))
        lo, hi = float(cs[j]), float(cs[j + 2])
        points = 33
    c = (lo + hi) / 2
    return [(x + c * tau, f"sharpest bend on the shift line (z + {c:.6g})")]


def _smooth_measure(ev: Evaluator, method: str, x: FloatArray, k: int | float, tau: float) -> tuple[str, float, str, FloatArray] | None:
    """Worst class over lines through ``x`` and its candidate points, None when nothing was measured.

    A base point the method refuses is measured only for a pole (lines through it go to
    :func:`_pole_probe`); other refusals leave it unmeasured.
    """
    if not np.isfinite(x).all() or x.shape[-1] < 2:
        return None
    r = ev.row(method, x, k, tau)
    if r.failures and r.failures[0].code not in _POLE_CODES:
        return None
    rng = np.random.default_rng(zlib.crc32(x.tobytes() + repr((k, tau)).encode()))
    best: tuple[str, float, str, FloatArray] | None = None
    points = [(x, "the input")]
    if not r.failures:
        points += _candidate_points(method, x, k, tau)
    points += _ray_candidates(method, x, k, tau)
    if not get_method(method).implementation.centred:
        points += _shift_candidates(method, x, k, tau)
    lines = [(x0, where, _direction(rng, x.shape[-1])) for x0, where in points for _ in range(2)]
    evaluated = _evaluate_lines(method, [(x0, d) for x0, _, d in lines], k, tau)
    for (x0, where, d), rows in zip(lines, evaluated, strict=True):
        measured = _line_class(method, x0, k, tau, d, rows)
        if measured is None:
            continue
        cls, size, detail = measured
        if best is None or _CLASS_RANK[cls] > _CLASS_RANK[best[0]] or (cls == best[0] and size > best[1]):
            best = (cls, size, f"{where}: {detail}; direction {_vec(d, 3)}", x0)
    return best


def _smooth_cases(cases: Sequence[Case]) -> list[Case]:
    """A bounded, deterministic subset of cases where kinks can be located (n <= 10): up to
    :data:`_MAX_SMOOTH_CASES` with an integer k, then up to :data:`_MAX_REAL_K_SMOOTH_CASES` with a
    non-integer k (the methods that take one)."""
    integer = [c for c in cases if float(c.k).is_integer()]
    real = [c for c in cases if not float(c.k).is_integer()]
    return _some_smooth_cases(integer, _MAX_SMOOTH_CASES) + _some_smooth_cases(real, _MAX_REAL_K_SMOOTH_CASES)


def _some_smooth_cases(cases: Sequence[Case], limit: int) -> list[Case]:
    chosen: list[Case] = []
    seen: set[tuple[int, int | float]] = set()
    for c in cases:
        x = c.array
        n = x.shape[-1]
        if not (2 <= n <= 10) or not np.isfinite(x).all():
            continue
        z = _z(x, c.tau)
        if not 0.05 <= float(z.max() - z.min()) <= 50:
            continue
        key = (n, c.k)
        if key in seen and len(chosen) >= limit // 2:
            continue
        seen.add(key)
        chosen.append(c)
        if len(chosen) >= limit:
            break
    return chosen


def _refused_smooth_cases(ev: Evaluator, method: str, cases: Sequence[Case], chosen: Sequence[Case]) -> list[Case]:
    """Up to :data:`_MAX_REFUSED_SMOOTH_CASES` cases (2 <= n <= 10) refused with a pole's code.

    The method refuses rows near a pole instead of returning huge inaccurate values, so the
    refused rows are where a pole is looked for (:func:`_pole_probe`).
    """
    small = [c for c in cases if 2 <= len(c.x) <= 10 and c not in chosen and np.isfinite(c.array).all()]
    ev.prefetch(method, [(c.array, c.k, c.tau) for c in small])
    out: list[Case] = []
    for c in small:
        r = ev.row(method, c.array, c.k, c.tau)
        if r.failures and r.failures[0].code in _POLE_CODES and c not in out:
            out.append(c)
            if len(out) >= _MAX_REFUSED_SMOOTH_CASES:
                break
    return out


def check_smooth(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """Measure the smoothness class of ``method`` near candidate kinks of ``cases``.

    ``holds`` is True when the measured class is C1 or better. C-infinity means no
    discontinuity was detected in p or its first two derivatives. Lines on which the method
    refuses a point are not evidence of smoothness (they are skipped) unless the refusal hides
    a pole (:func:`_pole_probe`): a pole is ``discontinuous``. Besides the candidate kinks, the
    check looks for poles at refused suite cases and at refused points on rays through them.

    >>> check_smooth("hard", [Case((1.0, 0.5, 0.0), 1)]).smoothness
    'discontinuous'
    """
    spec = get_method(method)
    if spec.capabilities.monte_carlo:
        return PropertyResult(
            method, "smooth", spec.guarantees.smooth, None, None, None, 0, len(cases),
            detail="not measured: finite differences of a Monte-Carlo estimate measure its noise, not the operator",
            expected_smoothness=spec.guarantees.smoothness,
        )
    ev = evaluator if evaluator is not None else Evaluator()
    cases = [c for c in cases if k_applies(method, c.k)]  # a non-integer k: real-k methods only
    worst: tuple[str, float, str, FloatArray, Case] | None = None
    checked = skipped = 0
    chosen = _smooth_cases(cases)
    for case in [*chosen, *_refused_smooth_cases(ev, method, cases, chosen)]:
        m = _smooth_measure(ev, method, case.array, case.k, case.tau)
        if m is None:
            skipped += 1
            continue
        checked += 1
        if worst is None or _CLASS_RANK[m[0]] > _CLASS_RANK[worst[0]] or (m[0] == worst[0] and m[1] > worst[1]):
            worst = (*m, case)
    claimed = spec.guarantees.smoothness
    if worst is None:
        return PropertyResult(
            method, "smooth", spec.guarantees.smooth, None, None, None, checked, skipped,
            detail="no case with 2 <= n <= 10 and a moderate spread on which the method was measured",
            expected_smoothness=claimed,
        )
    cls, size, detail, x0, case = worst
    holds = cls in ("C-infinity", "C1")
    violations = 0 if holds else 1
    cex = None
    if not holds:
        k = case.k
        rank = _CLASS_RANK[cls]

        def violates(y: FloatArray, kk: int | float) -> bool:
            return _CLASS_RANK[_point_class(method, y, kk, case.tau)[0]] >= rank

        x0, k = _shrink(violates, x0, k, budget=60)
        cls2, _, detail2 = _point_class(method, x0, k, case.tau)
        if cls2 == cls:
            detail = detail2
        cex = Counterexample(method, tuple(float(v) for v in x0), k, case.tau, detail)
    return PropertyResult(
        method, "smooth", spec.guarantees.smooth, holds, size, cex, checked, skipped, violations,
        detail=detail if cls != "C-infinity" else "", smoothness=cls, expected_smoothness=claimed,
    )
