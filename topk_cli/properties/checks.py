"""The property checks ``check_<property>(method, cases) -> PropertyResult`` and their driver."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from topk_cli.api import get_method
from topk_cli.operators._base import FloatArray
from topk_cli.properties.evaluator import Evaluator
from topk_cli.properties.in_k import check_continuous_k, check_monotone_k, k_applies
from topk_cli.properties.results import (
    _MAX_JACOBIAN_CASES,
    _MAX_REAL_K_JACOBIAN_CASES,
    TOL_ABS,
    TOL_HARD_LIMIT,
    TOL_JACOBIAN,
    Case,
    Counterexample,
    PropertyResult,
    Tally,
    _Measure,
)
from topk_cli.properties.shrinking import _shrink
from topk_cli.properties.smoothness import check_smooth
from topk_cli.properties.violations import (
    _fd_stencil,
    _limit_row,
    _permutations,
    _shift_rows,
    _strict_pairs,
    _v_finite,
    _v_hard_limit,
    _v_jacobian,
    _v_monotone_strict,
    _v_monotone_weak,
    _v_permutation,
    _v_range,
    _v_shift,
    _v_softmax_k1,
    _v_sum,
    _Violation,
)
from topk_cli.registry import MONTE_CARLO_STDERRS


class Check(Protocol):
    """``check(method, cases, *, evaluator=None) -> PropertyResult``."""

    def __call__(self, method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult: ...


_K = int | float  # an int, or a non-integer real k (the methods that take one)
_Items = Callable[[Evaluator, FloatArray, _K, float], list[tuple[FloatArray, _K, float]]]
"""The single-vector evaluations ``(x, k, tau)`` a violation looks at for the case ``(x, k, tau)``
(exactly those, so that batching them ahead costs no operator call the violation would not make)."""


def _plain_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    return [(x, k, tau)]


def _pair_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    return [(x, k, tau)] if x.shape[-1] >= 2 else []


def _strict_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    return [(x, k, tau)] if ev.memo(_strict_pairs, x, k, tau) is not None else []


def _k1_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    return [(x, k, tau)] if k == 1 else []


def _jacobian_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    stencil = _fd_stencil(x, tau) if np.isfinite(x).all() else None
    fd = [] if stencil is None else [(row, k, tau) for row in stencil[1].reshape(-1, x.shape[-1])]
    return [(x, k, tau), *fd]


def _shift_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    y, x_back, _ = ev.memo(_shift_rows, x, k, tau)
    return [(x_back, k, tau), (y, k, tau)]


def _permutation_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    return [(x, k, tau)] + [(x[perm], k, tau) for perm in _permutations(x.shape[-1])]


def _hard_limit_items(ev: Evaluator, x: FloatArray, k: _K, tau: float) -> list[tuple[FloatArray, _K, float]]:
    limit = ev.memo(_limit_row, x, k, tau)
    return [] if limit is None else [(limit[1], k, 1.0)]


def _run_check(
    ev: Evaluator,
    method: str,
    prop: str,
    cases: Sequence[Case],
    violation: _Violation,
    tol: float,
    *,
    failure_counts: bool = False,
    shrink: bool = True,
    items: _Items | None = _plain_items,
) -> PropertyResult:
    spec = get_method(method)
    expected = spec.guarantees.as_dict()[prop]
    cases = [c for c in cases if k_applies(method, c.k)]  # a non-integer k: real-k methods only
    # a Monte-Carlo estimate is judged within MONTE_CARLO_STDERRS of its standard errors (the slack)
    within = MONTE_CARLO_STDERRS if spec.capabilities.monte_carlo else None
    if items is not None:
        ev.prefetch(method, [item for case in cases for item in items(ev, case.array, case.k, case.tau)])
    tally: Tally[_Measure] = Tally(tol)
    skipped = 0
    for case in cases:
        m = violation(ev, method, case.array, case.k, case.tau)
        if m is None:
            continue
        if m.failed and not failure_counts:
            skipped += 1
            continue
        tally.add(case, m)
    done = tally.settled(method, prop, expected, skipped, within)
    if done is not None:
        return done
    assert tally.bad is not None
    m, case = tally.bad
    x, k, tau = case.array, case.k, case.tau
    if shrink:
        floor = max(tol, 1e-2 * m.value) if math.isfinite(m.value) else tol  # keep it a clear failure

        def violates(y: FloatArray, kk: _K) -> bool:
            mm = violation(ev, method, y, kk, tau)
            return mm is not None and (failure_counts or not mm.failed) and mm.value > floor + mm.slack

        def prefetch(candidates: Sequence[tuple[FloatArray, _K]]) -> None:
            if items is not None:
                ev.prefetch(method, [item for y, kk in candidates for item in items(ev, y, kk, tau)])

        x, k = _shrink(violates, x, k, prefetch=prefetch)
        m = violation(ev, method, x, k, tau) or m
    cex = Counterexample(method, tuple(float(v) for v in x), k, m.tau if m.tau is not None else tau, m.detail)
    return PropertyResult(
        method, prop, expected, False, tally.worst, cex, tally.checked, skipped, tally.violations, detail=m.detail,
        within_stderr=within,
    )


def check_range(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """Entries in [0, 1]: worst is ``max(-min p, max p - 1)`` (through ``1 - p`` computed accurately).

    >>> check_range("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(evaluator or Evaluator(), method, "range", cases, _v_range, TOL_ABS)


def check_sum(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """``sum p = k``: worst is ``|sum p - k| / k``.

    >>> check_sum("hard", [Case((3.0, 1.0, 2.0), 2)]).worst
    0.0
    """
    return _run_check(evaluator or Evaluator(), method, "sum", cases, _v_sum, TOL_ABS)


def check_monotone_weak(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """``x_i > x_j => p_i >= p_j``: worst is the largest ``p_j - p_i`` over such pairs.

    >>> check_monotone_weak("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(evaluator or Evaluator(), method, "monotone-weak", cases, _v_monotone_weak, TOL_ABS, items=_pair_items)


def check_monotone_strict(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """``x_i > x_j => p_i > p_j`` on ``k < n``; worst is the largest unseparated gap ``x_i - x_j``.

    >>> r = check_monotone_strict("hard", [Case((3.0, 1.0, 2.0), 1)])
    >>> r.holds, r.counterexample.x, r.counterexample.k
    (False, (2.0, 0.0, 1.0), 1)
    """
    return _run_check(evaluator or Evaluator(), method, "monotone-strict", cases, _v_monotone_strict, 0.0, items=_strict_items)


def check_shift_invariant(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """``ST(x + c) = ST(x)`` for a large exactly representable shift (tolerance 1e-12).

    >>> check_shift_invariant("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(evaluator or Evaluator(), method, "shift-invariant", cases, _v_shift, TOL_ABS, items=_shift_items)


def check_permutation_equivariant(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """``ST(x[perm]) = ST(x)[perm]`` for two permutations (tolerance 1e-12).

    >>> check_permutation_equivariant("hard", [Case((3.0, 1.0, 2.0, 2.0), 2)]).holds
    True
    """
    return _run_check(evaluator or Evaluator(), method, "permutation-equivariant", cases, _v_permutation, TOL_ABS, items=_permutation_items)


def check_hard_limit(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """Converges to ``T_k(x)`` as tau -> 0 where ``x_(k) > x_(k+1)`` (error <= 1e-6 at tau = 1e-3 g).

    The ``tau`` of each case is ignored: the check picks ``tau = 1e-3 * g``, ``g`` the smallest
    positive gap between distinct entries.
    A numerical failure of the method there counts as a violation.

    >>> check_hard_limit("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    return _run_check(
        evaluator or Evaluator(), method, "hard-limit", cases, _v_hard_limit, TOL_HARD_LIMIT, failure_counts=True, items=_hard_limit_items
    )


def check_softmax_at_k1(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """At ``k = 1`` the method equals softmax (tolerance 1e-12); not applicable without k = 1.

    >>> check_softmax_at_k1("hard", [Case((1.0, 0.0), 1)]).holds
    False
    """
    return _run_check(evaluator or Evaluator(), method, "softmax-at-k1", cases, _v_softmax_k1, TOL_ABS, items=_k1_items)


def _jacobian_cases(cases: Sequence[Case]) -> list[Case]:
    """At most :data:`_MAX_JACOBIAN_CASES` cases with n <= 10 and an integer k, spread evenly over
    ``cases``, then at most :data:`_MAX_REAL_K_JACOBIAN_CASES` with a non-integer k."""
    integer = [c for c in cases if float(c.k).is_integer()]
    real = [c for c in cases if not float(c.k).is_integer()]
    return _spread(integer, _MAX_JACOBIAN_CASES) + _spread(real, _MAX_REAL_K_JACOBIAN_CASES)


def _spread(cases: Sequence[Case], limit: int) -> list[Case]:
    small = [c for c in cases if len(c.x) <= 10]
    if len(small) <= limit:
        return small
    step = len(small) / limit
    return [small[int(i * step)] for i in range(limit)]


def check_jacobian(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """Analytic Jacobian against central finite differences, ``max |J - J_fd| * tau <= 1e-6``.

    >>> check_jacobian("hard", [Case((3.0, 1.0, 2.0), 2)]).holds
    True
    """
    spec = get_method(method)
    if not spec.capabilities.jacobian:  # e.g. a user's numpy operator: no finite difference stands in for it
        return PropertyResult(
            method, "jacobian", spec.guarantees.jacobian, None, None, None, 0, len(cases),
            detail="not available: the method has no Jacobian (a numpy operator has no gradient)",
        )
    items = _plain_items if spec.capabilities.monte_carlo else _jacobian_items  # MC: not differentiated
    return _run_check(
        evaluator or Evaluator(), method, "jacobian", _jacobian_cases(cases), _v_jacobian, TOL_JACOBIAN, shrink=False, items=items
    )


def check_finite(method: str, cases: Sequence[Case], *, evaluator: Evaluator | None = None) -> PropertyResult:
    """Finite weights on every case; a reported numerical failure counts as not finite.

    >>> check_finite("hard", [Case((1e300, -1e300), 1)]).holds
    True
    """
    return _run_check(evaluator or Evaluator(), method, "finite", cases, _v_finite, 0.0, failure_counts=True)


CHECKS: dict[str, Check] = {
    "range": check_range,
    "sum": check_sum,
    "monotone-weak": check_monotone_weak,
    "monotone-strict": check_monotone_strict,
    "shift-invariant": check_shift_invariant,
    "permutation-equivariant": check_permutation_equivariant,
    "hard-limit": check_hard_limit,
    "softmax-at-k1": check_softmax_at_k1,
    "smooth": check_smooth,
    "jacobian": check_jacobian,
    "finite": check_finite,
    "monotone-k": check_monotone_k,
    "continuous-k": check_continuous_k,
}
