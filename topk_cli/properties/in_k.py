"""Properties in k itself, for the methods that take a real k: ``monotone-k`` and ``continuous-k``.

Both look at ``k -> p(x / tau; k)`` for one vector at a time, on a grid of k over ``(0, m]`` (``m``
the unmasked entries of the vector; step ``h = max(1/4, 2^ceil(log2(m / 128)))``, a binary fraction,
so every k of the grid and of the refinements below is exact and prints back exactly), the rows of a
vector evaluated in one call with one k per row:

* ``monotone-k``: each ``p_i`` is non-decreasing in k. Between consecutive k of the grid, the
  decrease of ``p_i`` is read through the accurate one of ``p_i`` and ``1 - p_i`` (near 1, ``p_i``
  saturates at 1.0 in float64 and would hide a decrease that ``1 - p_i`` shows); worst is the
  largest decrease (tolerance 1e-12).
* ``continuous-k``: ``p`` has no jump in k. The steepest interval of the grid, the two whose
  change sits most in one half (a jump, rather than a slope, puts it all in one half) and any
  interval changing twice as much as both neighbours are refined 7 times, each time into 4 pieces,
  keeping the piece where ``p`` changes most, down to a width ``w = h / 2^14``. ``L``, the
  Lipschitz estimate, is the steepest slope measured: between consecutive k of the grid, or over
  the piece kept two rounds before the last (16 w). A function of slope at most ``L`` changes by
  at most ``L w`` over the final piece; a jump keeps its size however small ``w`` is. Worst is the
  change beyond ``4 L w`` (tolerance 1e-9). ``hard`` with a real k is continuous and piecewise
  linear in k: it holds too.

A Monte-Carlo method is judged within :data:`~topk_cli.registry.MONTE_CARLO_STDERRS` standard errors
of its estimate, as in the other properties. A counterexample names two values of k (``k`` and
``k2``): its command runs ``softtopk compute`` at both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from topk_cli.api import evaluate, get_method
from topk_cli.operators._base import FloatArray
from topk_cli.properties.evaluator import Evaluator
from topk_cli.properties.results import (
    TOL_ABS,
    Case,
    Counterexample,
    PropertyResult,
    Tally,
    _fmt_k,
)
from topk_cli.properties.shrinking import _shrink
from topk_cli.registry import MONTE_CARLO_STDERRS

#: Jumps in k below this are not told apart from rounding (of p, and of iterative solvers).
TOL_CONTINUOUS_K = 1e-9
#: Rounds of the refinement of ``continuous-k``: each splits the interval in :data:`K_SPLIT` pieces
#: and keeps the one where p changes most (the final width is ``h / K_SPLIT^K_ROUNDS = h / 2^14``).
K_SPLIT = 4
K_ROUNDS = 7
#: How much steeper than the Lipschitz estimate the final change may be.
K_LIPSCHITZ_FACTOR = 4.0
#: The local Lipschitz estimate of ``continuous-k`` is the slope this many rounds before the last
#: (over a width 16 times the final one).
_K_LOCAL_ROUNDS = 2
#: At most this many vectors per check, spread evenly over the cases (each costs a grid of k);
#: a Monte-Carlo method (a thousand samples a row) gets fewer, of at most 10 entries.
_MAX_K_VECTORS = 24
_MAX_K_VECTORS_MONTE_CARLO = 8
#: Grid intervals refined per vector: the steepest ones, the ones whose change sits most in one
#: half, and the ones changing twice as much as both neighbours (at most :data:`_K_MAX_BISECTED`).
_K_STEEPEST = 1
_K_UNEVEN = 2
_K_MAX_BISECTED = 4


def takes_real_k(method: str) -> bool:
    """True when ``method`` takes a real k (``capabilities.integer_k`` is False), as ``hard``, the
    threshold methods, ``ot-sinkhorn`` and ``perturbed`` do; integer-only methods refuse one.

    >>> takes_real_k("grad")
    False
    """
    return not get_method(method).capabilities.integer_k


def is_integer_k(k: object) -> bool:
    """True for an ``int`` (not a bool) or an integral float such as ``2.0``."""
    if isinstance(k, (bool, np.bool_)):
        return False
    if isinstance(k, (int, np.integer)):
        return True
    return isinstance(k, (float, np.floating)) and math.isfinite(float(k)) and float(k).is_integer()


def k_applies(method: str, k: object) -> bool:
    """Whether ``method`` is defined at ``k``: every method at an integer k, only the methods that
    take a real k (:func:`takes_real_k`) at a non-integer one.

    >>> k_applies("grad", 2), k_applies("grad", 2.0), k_applies("grad", 2.5)
    (True, True, False)
    """
    return is_integer_k(k) or takes_real_k(method)


def expected_in_k(method: str, prop: str) -> bool:
    """The registry's claim of ``method`` on ``prop`` (``monotone-k``, ``continuous-k``); every method
    that takes a real k claims both (each of them, ``hard`` included, is measured monotone and
    continuous in k on the default suite), the others neither.

    >>> expected_in_k("grad", "monotone-k")
    False
    """
    return bool(get_method(method).guarantees.as_dict()[prop])


def k_grid(m: int) -> FloatArray:
    """The k of the grid over ``(0, m]``: multiples of ``h = max(1/4, 2^ceil(log2(m / 128)))``, and m.

    >>> k_grid(2).tolist()
    [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    >>> len(k_grid(50)), len(k_grid(1000))
    (100, 125)
    """
    h = max(0.25, 2.0 ** math.ceil(math.log2(m / 128)))
    grid = h * np.arange(1, math.floor(m / h) + 1, dtype=np.float64)
    return grid if grid.size and grid[-1] == m else np.append(grid, np.float64(m))


@dataclass(frozen=True)
class _KRows:
    """``p`` and ``q = 1 - p`` of one vector at each k of ``ks`` (``ok``: computed)."""

    ks: FloatArray  # (G,)
    p: FloatArray  # (G, n)
    q: FloatArray  # (G, n)
    ok: np.ndarray  # (G,) bool
    slack: float  # a Monte-Carlo method's allowance on a difference of weights


def _eval_ks(method: str, items: Sequence[tuple[FloatArray, FloatArray, float]]) -> list[_KRows]:
    """Each ``(x, ks, tau)`` evaluated at every k of ``ks``, one k per row: one call per tau, the
    vectors padded with masked entries (``-inf``) to the longest; one call per ``(n, tau)`` for a
    Monte-Carlo method (its noise depends on n)."""
    monte_carlo = get_method(method).capabilities.monte_carlo
    groups: dict[tuple[int, float], list[int]] = {}
    for index, (x, _, tau) in enumerate(items):
        groups.setdefault((x.shape[-1] if monte_carlo else 0, float(tau)), []).append(index)
    out: list[_KRows] = [
        _KRows(ks, np.zeros((0, x.shape[-1])), np.zeros((0, x.shape[-1])), np.zeros(0, dtype=bool), 0.0)
        for x, ks, _ in items
    ]
    for (_, tau), indices in groups.items():
        width = max(items[i][0].shape[-1] for i in indices)
        padded = [np.pad(items[i][0], (0, width - items[i][0].shape[-1]), constant_values=-np.inf) for i in indices]
        batch = np.vstack([np.repeat(x[None, :], items[i][1].size, axis=0) for x, i in zip(padded, indices, strict=True)])
        if batch.shape[0] == 0:
            continue
        kcol = np.concatenate([items[i][1] for i in indices]).astype(np.float64)
        r = evaluate(batch, kcol, method, tau=tau)
        weights = np.asarray(r.weights, dtype=np.float64)
        complement = np.asarray(r.complement, dtype=np.float64)
        status = np.asarray(r.status)
        start = 0
        for i in indices:
            n, size = items[i][0].shape[-1], items[i][1].size
            rows = slice(start, start + size)
            start += size
            ok = status[rows] == "ok"
            slack = 0.0
            if monte_carlo and r.stderr is not None and ok.any():
                slack = MONTE_CARLO_STDERRS * float(np.nanmax(np.asarray(r.stderr)[rows][ok]))
            out[i] = _KRows(items[i][1], weights[rows, :n], complement[rows, :n], ok, slack)
    return out


@dataclass(frozen=True)
class _KMeasure:
    """The violation of one vector: ``value`` (0 = fine) between ``k = ka`` and ``k = kb``."""

    value: float
    ka: float
    kb: float
    detail: str = ""
    slack: float = 0.0
    lipschitz: float = 0.0  # continuous-k: the grid's Lipschitz estimate


def _decrease(pa: FloatArray, qa: FloatArray, pb: FloatArray, qb: FloatArray) -> FloatArray:
    """How much each ``p_i`` decreases from a to b, read through the accurate one of p and 1 - p."""
    through_q = np.minimum(qa, qb) < np.minimum(pa, pb)
    return np.where(through_q, qb - qa, pa - pb)


def _change(pa: FloatArray, qa: FloatArray, pb: FloatArray, qb: FloatArray) -> FloatArray:
    """``|p_i(b) - p_i(a)|`` read through the accurate one of p and 1 - p."""
    return np.abs(_decrease(pa, qa, pb, qb))


def _monotone_detail(i: int, ka: float, kb: float, pa: float, pb: float, qa: float, qb: float) -> str:
    if pa == pb:
        return (
            f"p[{i}] = {pa:.17g} at k = {_fmt_k(ka)} and k = {_fmt_k(kb)} but 1 - p[{i}] rises "
            f"from {qa:.6g} to {qb:.6g}: p[{i}] decreases in k"
        )
    return f"p[{i}] decreases from {pa:.17g} at k = {_fmt_k(ka)} to {pb:.17g} at k = {_fmt_k(kb)}"


def _monotone_measure(rows: _KRows) -> _KMeasure | None:
    idx = np.flatnonzero(rows.ok)
    if idx.size < 2:
        return None
    a, b = idx[:-1], idx[1:]
    drop = _decrease(rows.p[a], rows.q[a], rows.p[b], rows.q[b])
    j, i = (int(v) for v in np.unravel_index(int(np.argmax(drop)), drop.shape))
    value = max(0.0, float(drop[j, i]))
    ka, kb = float(rows.ks[a[j]]), float(rows.ks[b[j]])
    detail = ""
    if value > 0:
        detail = _monotone_detail(i, ka, kb, rows.p[a[j], i], rows.p[b[j], i], rows.q[a[j], i], rows.q[b[j], i])
    return _KMeasure(value, ka, kb, detail, slack=2 * rows.slack)


@dataclass
class _Refinement:
    vector: int
    ka: float
    kb: float
    pa: FloatArray
    qa: FloatArray
    pb: FloatArray
    qb: FloatArray
    done: bool = False
    slopes: list[float] = field(default_factory=list)  # change per unit of k, round by round


def _continuity_measures(
    method: str, vectors: Sequence[Case], grids: Sequence[_KRows]
) -> list[_KMeasure | None]:
    """The ``continuous-k`` measure of each vector (None: fewer than two k computed)."""
    lipschitz: list[float] = []
    state: list[_Refinement] = []
    measured: list[bool] = []
    pairs = [np.flatnonzero(rows.ok) for rows in grids]
    # the midpoint of every interval between computed k: where p changes in one half only (a jump)
    # rather than evenly (a slope), that interval is refined even if others change more
    mids = _eval_ks(
        method,
        [(c.array, (rows.ks[idx[:-1]] + rows.ks[idx[1:]]) / 2, c.tau) for c, rows, idx in zip(vectors, grids, pairs, strict=True)],
    )
    for v, (rows, idx, mid) in enumerate(zip(grids, pairs, mids, strict=True)):
        measured.append(idx.size >= 2)
        if idx.size < 2:
            lipschitz.append(0.0)
            continue
        a, b = idx[:-1], idx[1:]
        delta = _change(rows.p[a], rows.q[a], rows.p[b], rows.q[b]).max(axis=1)
        width = rows.ks[b] - rows.ks[a]
        lipschitz.append(float(np.max(delta / width)))
        halves = np.maximum(
            _change(rows.p[a], rows.q[a], mid.p, mid.q).max(axis=1), _change(mid.p, mid.q, rows.p[b], rows.q[b]).max(axis=1)
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            uneven = np.where(mid.ok & (delta > 0), halves / delta, 0.0)  # 1/2 for a slope, ~1 for a jump
        chosen = [int(j) for j in np.argsort(-delta, kind="stable")[:_K_STEEPEST]]
        chosen += [int(j) for j in np.lexsort((-delta, -uneven))[:_K_UNEVEN] if j not in chosen]
        left = np.concatenate(([0.0], delta[:-1]))
        right = np.concatenate((delta[1:], [0.0]))
        peaks = np.flatnonzero(delta > 2 * np.maximum(left, right))
        chosen += [int(j) for j in peaks if j not in chosen]
        for j in chosen[:_K_MAX_BISECTED]:
            ja, jb = int(a[j]), int(b[j])
            state.append(_Refinement(v, float(rows.ks[ja]), float(rows.ks[jb]), rows.p[ja], rows.q[ja], rows.p[jb], rows.q[jb]))
    for _ in range(K_ROUNDS):
        active = [s for s in state if not s.done]
        if not active:
            break
        inner = np.arange(1, K_SPLIT) / K_SPLIT
        points = _eval_ks(
            method, [(vectors[s.vector].array, s.ka + inner * (s.kb - s.ka), vectors[s.vector].tau) for s in active]
        )
        for s, pts in zip(active, points, strict=True):
            if not pts.ok.all():
                s.done = True  # the method refuses a k in between: measured on the width reached
                continue
            ks = np.concatenate(([s.ka], pts.ks, [s.kb]))
            p = np.vstack([s.pa[None, :], pts.p, s.pb[None, :]])
            q = np.vstack([s.qa[None, :], pts.q, s.qb[None, :]])
            pieces = _change(p[:-1], q[:-1], p[1:], q[1:]).max(axis=1)
            j = int(np.argmax(pieces))  # the first of the pieces where p changes most
            s.ka, s.kb = float(ks[j]), float(ks[j + 1])
            s.pa, s.qa, s.pb, s.qb = p[j], q[j], p[j + 1], q[j + 1]
            s.slopes.append(float(pieces[j]) / (s.kb - s.ka))
    out: list[_KMeasure | None] = [
        _KMeasure(0.0, 0.0, 0.0, slack=2 * rows.slack, lipschitz=lipschitz[v]) if measured[v] else None
        for v, rows in enumerate(grids)
    ]
    for s in state:
        change = _change(s.pa, s.qa, s.pb, s.qb)
        i = int(np.argmax(change))
        # the steepest slope seen: on the grid, or 16 times wider than the final width (p steeper
        # than the grid on a short stretch of k, e.g. near-tied entries saturating one after the
        # other, is continuous all the same; a jump is not a slope at any width: it stays
        # 16 / K_LIPSCHITZ_FACTOR = 4 times the bound)
        local = s.slopes[-_K_LOCAL_ROUNDS - 1] if len(s.slopes) > _K_LOCAL_ROUNDS else 0.0
        slope = max(lipschitz[s.vector], local)
        value = max(0.0, float(change[i]) - K_LIPSCHITZ_FACTOR * slope * (s.kb - s.ka))
        best = out[s.vector]
        if best is not None and (value > best.value or best.kb == 0.0):
            detail = _jump_detail(i, s.ka, s.kb, float(s.pa[i]), float(s.pb[i]), slope)
            out[s.vector] = _KMeasure(value, s.ka, s.kb, detail, best.slack, slope)
    return out


def _jump_detail(i: int, ka: float, kb: float, pa: float, pb: float, lipschitz: float) -> str:
    bound = K_LIPSCHITZ_FACTOR * lipschitz * (kb - ka)
    return (
        f"p[{i}] jumps from {pa:.6g} at k = {_fmt_k(ka)} to {pb:.6g} at k = {_fmt_k(kb)} "
        f"(a slope up to {K_LIPSCHITZ_FACTOR:g} x {lipschitz:.3g}, the steepest measured, allows {bound:.3g})"
    )


def _pair(
    ev: Evaluator, method: str, y: FloatArray, ka: float, kb: float, tau: float, prop: str, lipschitz: float
) -> _KMeasure | None:
    """The measure of ``prop`` between two k on ``y`` alone (what the counterexample's commands show)."""
    n = int(np.isfinite(y).sum())
    if not (0 < ka < kb <= n):
        return None
    ra, rb = ev.row(method, y, _as_k(ka), tau), ev.row(method, y, _as_k(kb), tau)
    if ra.failures or rb.failures:
        return None
    pa, qa, pb, qb = ra.weights[0].astype(np.float64), ra.complement[0], rb.weights[0].astype(np.float64), rb.complement[0]
    slack = 2 * ev.slack(method, ra, rb)
    if prop == "monotone-k":
        drop = _decrease(pa, qa, pb, qb)
        i = int(np.argmax(drop))
        value = max(0.0, float(drop[i]))
        detail = _monotone_detail(i, ka, kb, pa[i], pb[i], qa[i], qb[i]) if value > 0 else ""
        return _KMeasure(value, ka, kb, detail, slack)
    change = _change(pa, qa, pb, qb)
    i = int(np.argmax(change))
    value = max(0.0, float(change[i]) - K_LIPSCHITZ_FACTOR * lipschitz * (kb - ka))
    return _KMeasure(value, ka, kb, _jump_detail(i, ka, kb, pa[i], pb[i], lipschitz), slack, lipschitz)


def _as_k(k: float) -> int | float:
    """An integral k as an ``int`` (what ``softtopk compute -k 2`` passes), else the float."""
    return int(k) if float(k).is_integer() else float(k)


def _k_vectors(method: str, cases: Sequence[Case]) -> list[Case]:
    """The distinct ``(x, tau)`` of ``cases`` with an unmasked entry, at most :data:`_MAX_K_VECTORS`
    of them spread evenly (each is measured on its own grid of k; the case's k does not matter);
    for a Monte-Carlo method at most :data:`_MAX_K_VECTORS_MONTE_CARLO` of at most 10 entries."""
    monte_carlo = get_method(method).capabilities.monte_carlo
    limit = _MAX_K_VECTORS_MONTE_CARLO if monte_carlo else _MAX_K_VECTORS
    seen: set[tuple[tuple[float, ...], float]] = set()
    out: list[Case] = []
    for c in cases:
        key = (c.x, c.tau)
        if key in seen or not np.isfinite(c.array).any() or (monte_carlo and len(c.x) > 10):
            continue
        seen.add(key)
        out.append(c)
    if len(out) <= limit:
        return out
    step = len(out) / limit
    return [out[int(i * step)] for i in range(limit)]


def _grids(ev: Evaluator, method: str, cases: Sequence[Case]) -> tuple[list[Case], list[_KRows]]:
    """The vectors of ``cases`` (:func:`_k_vectors`) and their grids of k, computed once per
    evaluator (``monotone-k`` and ``continuous-k`` share them)."""
    vectors = _k_vectors(method, cases)
    key = ("k-grids", method, tuple((c.x, c.tau) for c in vectors))
    return vectors, ev.cached(
        key, lambda: _eval_ks(method, [(c.array, k_grid(int(np.isfinite(c.array).sum())), c.tau) for c in vectors])
    )


def _check_in_k(
    method: str, prop: str, cases: Sequence[Case], evaluator: Evaluator | None, tol: float,
    measures: Callable[[str, list[Case], list[_KRows]], list[_KMeasure | None]],
) -> PropertyResult:
    spec = get_method(method)
    within = MONTE_CARLO_STDERRS if spec.capabilities.monte_carlo else None
    expected = expected_in_k(method, prop)
    if not takes_real_k(method):
        return PropertyResult(
            method, prop, expected, None, None, None, 0, 0,
            detail=f"not applicable: {spec.name} takes an integer k only", within_stderr=within,
        )
    ev = evaluator if evaluator is not None else Evaluator()
    vectors, grids = _grids(ev, method, cases)
    found = measures(method, vectors, grids)
    tally: Tally[_KMeasure] = Tally(tol)
    skipped = 0
    for case, m in zip(vectors, found, strict=True):  # refused k are left out of a vector's grid
        if m is None:
            skipped += 1
            continue
        tally.add(case, m)
    done = tally.settled(method, prop, expected, skipped, within)
    if done is not None:
        return done
    assert tally.bad is not None
    m, case = tally.bad
    gap = m.kb - m.ka
    floor = max(tol, 1e-2 * m.value)

    def violates(y: FloatArray, kk: int | float) -> bool:
        mm = _pair(ev, method, y, float(kk), float(kk) + gap, case.tau, prop, m.lipschitz)
        return mm is not None and mm.value > floor + mm.slack

    x, ka = case.array, m.ka
    final = m
    if violates(x, ka):  # the pair shows it with one k per call, as the commands do: shrink it
        x, shrunk_k = _shrink(violates, x, _as_k(ka), budget=120)
        ka = float(shrunk_k)
        final = _pair(ev, method, x, ka, ka + gap, case.tau, prop, m.lipschitz) or m
    cex = Counterexample(method, tuple(float(v) for v in x), _as_k(ka), case.tau, final.detail, k2=_as_k(ka + gap))
    return PropertyResult(
        method, prop, expected, False, tally.worst, cex, tally.checked, skipped, tally.violations,
        detail=final.detail, within_stderr=within,
    )


def _monotone_measures(method: str, vectors: list[Case], grids: list[_KRows]) -> list[_KMeasure | None]:
    return [_monotone_measure(rows) for rows in grids]


def check_monotone_k(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """Each ``p_i`` non-decreasing in k on a grid of k over ``(0, m]`` per vector of ``cases``
    (tolerance 1e-12); not applicable to a method that takes an integer k only.

    >>> check_monotone_k("grad", [Case((3.0, 1.0, 2.0), 2)]).detail
    'not applicable: grad takes an integer k only'
    """
    return _check_in_k(method, "monotone-k", cases, evaluator, TOL_ABS, _monotone_measures)


def check_continuous_k(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """``p`` continuous in k: no change beyond a Lipschitz bound over a width ``h / 2^20`` of k
    (tolerance 1e-9); not applicable to a method that takes an integer k only.

    >>> check_continuous_k("grad", [Case((3.0, 1.0, 2.0), 2)]).holds is None
    True
    """
    return _check_in_k(method, "continuous-k", cases, evaluator, TOL_CONTINUOUS_K, _continuity_measures)
