"""The default adversarial suite, user cases, and ``verify_properties`` (what the command runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.analysis.parallel import parallel_map
from topk_cli.api import check_k, check_real_k, check_tau, get_method, real_k_methods
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray
from topk_cli.properties.checks import CHECKS
from topk_cli.properties.evaluator import Evaluator
from topk_cli.properties.in_k import is_integer_k, takes_real_k
from topk_cli.properties.results import (
    _POLE_CODES,
    K_PROPERTIES,
    PROPERTIES,
    SUITE_OFFSETS,
    SUITE_SIZES,
    SUITE_SPREADS,
    Case,
    PropertyResult,
    VerifyReport,
)
from topk_cli.registry import METHODS, runs_in_process


def _suite_ks(n: int, k: int | float | None) -> list[int | float]:
    if k is not None:
        return [k] if k <= n else []
    return sorted({kk for kk in (1, 2, max(1, n // 3), n - 1, n) if 1 <= kk <= n})


def _real_suite_ks(n: int) -> list[float]:
    """The non-integer k of the suite for the methods that take one: 0.5, 1.5 and n - 0.5 (in (0, n))."""
    return sorted({kk for kk in (0.5, 1.5, n - 0.5) if 0 < kk < n})


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _check_k(k: object, real_k: bool) -> int | float | None:
    """``k`` as the suite uses it: None (every k of the suite), an ``int``, or (``real_k``: some
    method takes a real k) a non-integer real ``k > 0``, which the methods that take an integer k
    only have no case at."""
    if k is None or is_integer_k(k) or not real_k:
        return None if k is None else check_k(k)
    return check_real_k(k)


def default_suite(
    *, trials: int = 3, seed: int = 0, k: int | float | None = None, real_k: bool = False
) -> tuple[Case, ...]:
    """The deterministic adversarial suite of ``verify-properties``.

    Per trial and size n in :data:`SUITE_SIZES`: a random vector at each spread of
    :data:`SUITE_SPREADS` (rotating offsets 0 and 1e6), a vector with ties, one with near-ties
    (relative gaps 1e-9), small integers with a tie at the k-th value; each at k = 1, 2, n/3,
    n-1, n (or the given k), tau = 1. ``real_k``: the suite is also for methods that take a real
    k; a non-integer k may be given, and without one the same vectors follow, each at one
    non-integer k, in turn 0.5, 1.5, n - 0.5 (those in (0, n)). Same ``seed`` and ``trials``,
    same cases; the integer-k cases do not depend on ``real_k``.

    Raises:
        InvalidArgumentError: ``trials < 1``, ``k < 1``, or a non-integer k without ``real_k``
            (a real ``k <= 0`` with it).

    >>> len(default_suite(trials=1)) > 100
    True
    """
    if not _is_int(trials) or trials < 1:
        raise InvalidArgumentError(f"trials must be an integer >= 1, got {trials!r}")
    if not _is_int(seed) or seed < 0:
        raise InvalidArgumentError(f"seed must be an integer >= 0, got {seed!r}")
    k = _check_k(k, real_k)
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    real: list[Case] = []
    for t in range(trials):
        for n in SUITE_SIZES:
            vectors: list[tuple[FloatArray, str]] = []
            for s, spread in enumerate(SUITE_SPREADS):
                offset = SUITE_OFFSETS[(s + t) % len(SUITE_OFFSETS)]
                vectors.append((offset + spread * rng.standard_normal(n), f"spread {spread:g}, offset {offset:g}"))
            if n >= 2:
                base = rng.standard_normal(max(1, (n + 1) // 2))
                vectors.append((rng.permutation(np.resize(base, n)), "ties"))
                near = rng.standard_normal(n)
                near[1:] = near[0] * (1 + 1e-9 * np.arange(1, n)) + 1e-9 * np.arange(1, n)
                vectors.append((rng.permutation(near), "near-ties"))
                vectors.append((rng.integers(0, 3, n).astype(np.float64), "small integers"))
            for index, (x, label) in enumerate(vectors):
                for kk in _suite_ks(n, k):
                    cases.append(Case(tuple(float(v) for v in x), kk, 1.0, f"n={n} {label}"))
                reals = _real_suite_ks(n)
                if real_k and k is None and reals:  # one non-integer k per vector, in turn
                    real.append(Case(tuple(float(v) for v in x), reals[(index + t) % len(reals)], 1.0, f"n={n} {label}"))
    return tuple(cases + real)


def cases_from_vectors(
    vectors: ArrayLike, k: int | float | None = None, *, tau: float = 1.0, real_k: bool = False
) -> tuple[Case, ...]:
    """Cases from user vectors (rows of a 2-D array): the given k, or k = 1, 2, n/3, n-1, n
    (followed, with ``real_k``, by every row at k = 0.5, 1.5, n - 0.5).

    Raises:
        InvalidArgumentError: not a 1-D/2-D array of reals, or k larger than every row.

    >>> [c.k for c in cases_from_vectors([[3.0, 1.0, 2.0]])]
    [1, 2, 3]
    """
    k = _check_k(k, real_k)
    check_tau(tau)
    try:
        arr = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError) as exc:  # ragged rows, text
        raise InvalidArgumentError(f"vectors must be a 1-D or 2-D array of real numbers: {exc}") from None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[-1] == 0:
        raise InvalidArgumentError(f"vectors must be a 1-D or 2-D array with entries, got shape {arr.shape}")
    cases: list[Case] = []
    real: list[Case] = []
    for row_index, row in enumerate(arr):
        n = int(np.isfinite(row).sum())
        for kk in _suite_ks(n, k):
            cases.append(Case(tuple(float(v) for v in row), kk, tau, f"row {row_index}"))
        if real_k and k is None:
            real += [Case(tuple(float(v) for v in row), kk, tau, f"row {row_index}") for kk in _real_suite_ks(n)]
    if not cases:
        if k is not None and not is_integer_k(k):
            raise InvalidArgumentError(f"k must satisfy 0 < k <= n (n={arr.shape[-1]}), got {k!r}")
        check_k(k, arr.shape[-1])  # the only way no case is left: k > n
        raise AssertionError("unreachable: a row without cases has k > n")
    return tuple(cases + real)


def method_cases(method: str, cases: Sequence[Case]) -> tuple[Case, ...]:
    """The cases ``method`` is defined on: all of them for a method that takes a real k, the
    integer-k ones for the others (a non-integer k is no failure of theirs)."""
    if takes_real_k(method):
        return tuple(cases)
    return tuple(c for c in cases if is_integer_k(c.k))


def _check_method(unit: tuple[str, tuple[str, ...], tuple[Case, ...]]) -> list[PropertyResult]:
    """Every property of one method on its cases (:func:`method_cases`), with the method's own
    memoising evaluator."""
    name, props, cases = unit
    evaluator = Evaluator()  # shared by the checks of this method, dropped at its end
    mine = method_cases(name, cases)
    results = [CHECKS[prop](name, mine, evaluator=evaluator) for prop in props]
    if cases and not mine:  # a non-integer k given to a method that takes an integer k only
        why = f"not applicable: {name} takes an integer k only"
        results = [r if r.holds is not None else replace(r, detail=why) for r in results]
    return results


def _unit_cost(unit: tuple[str, tuple[str, ...], tuple[Case, ...]]) -> float:
    """Rough CPU seconds of one method's checks on the default suite (measured once, by kind).

    A scheduling estimate only: with several jobs the slow methods start first so that no core
    idles at the end; results never depend on it. Methods refused near poles run long
    extended-precision rounds (and the smoothness check probes their poles), a Monte-Carlo
    estimate draws samples, a method with solver parameters iterates; the closed forms and
    bisections take 0.6-1 s.
    """
    spec = get_method(unit[0])
    if any(f.code in _POLE_CODES for f in spec.failures):
        return 5.0
    if spec.capabilities.monte_carlo:
        return 2.7
    return 1.4 if spec.parameters else 0.8


def verify_properties(
    methods: Sequence[str] | None = None,
    vectors: ArrayLike | None = None,
    k: int | float | None = None,
    *,
    tau: float = 1.0,
    trials: int = 3,
    seed: int = 0,
    properties: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: int = 1,
) -> VerifyReport:
    """Measure every property of every method on ``vectors`` or the default suite.

    Args:
        methods: registered names (default: all).
        vectors: user vectors, 1-D or 2-D (rows); None for :func:`default_suite`.
        k: fixed k, or None to vary k (1, 2, n/3, n-1, n, and for the methods that take a real k
            also 0.5, 1.5, n - 0.5). A non-integer k leaves a method that takes an integer k only
            without cases: its properties are not applicable (``holds`` None), not failed.
        tau: temperature of the user vectors (the suite uses 1; ``hard-limit`` picks its own).
        trials, seed: size and seed of the default suite.
        properties: a subset of :data:`PROPERTIES` and :data:`K_PROPERTIES` (default: all of
            :data:`PROPERTIES`, and :data:`K_PROPERTIES` when a method takes a real k; a method
            that does not gets rows "not applicable" there).
        progress: called with ``(done, total)`` after each method.
        jobs: processes the methods are spread over (1: in-process); results are identical for
            every ``jobs`` (each method gets its own evaluator, as with one process).

    Raises:
        InvalidArgumentError: unknown method or property, bad k, trials or vectors.

    >>> report = verify_properties(["hard"], [[3.0, 1.0, 2.0]], 1, properties=["range", "smooth"])
    >>> [(r.property, r.holds) for r in report.results]
    [('range', True), ('smooth', False)]
    """
    names = tuple(methods) if methods is not None else tuple(METHODS)
    for name in names:
        get_method(name)
    real_k = any(takes_real_k(name) for name in names)
    if k is not None and not real_k and not is_integer_k(k):
        try:
            check_k(k)
        except InvalidArgumentError as exc:
            others = real_k_methods()
            hint = f" (methods that take a real k: {', '.join(others)})" if others else ""
            raise InvalidArgumentError(f"{exc}: the selected methods take an integer k only{hint}") from None
    if properties is not None:
        props = tuple(properties)
    else:
        props = PROPERTIES + K_PROPERTIES if real_k else PROPERTIES
    for prop in props:
        if prop not in CHECKS:
            valid = ", ".join(PROPERTIES + K_PROPERTIES)
            raise InvalidArgumentError(f"unknown property {prop!r}; valid properties: {valid}")
    if vectors is None:
        cases = default_suite(trials=trials, seed=seed, k=k, real_k=real_k)
        source = "suite"
    else:
        cases = cases_from_vectors(vectors, k, tau=tau, real_k=real_k)
        source = "input"
    units = [(name, props, cases) for name in names]
    jobs = 1 if runs_in_process(names) else jobs  # a user's operator runs where it was loaded
    per_method = parallel_map(_check_method, units, jobs=jobs, progress=progress, cost=_unit_cost)
    results = [r for method_results in per_method for r in method_results]
    return VerifyReport(
        methods=names, properties=props, cases=len(cases), results=tuple(results), source=source,
        seed=seed if vectors is None else None, trials=trials if vectors is None else None,
    )
