"""The default adversarial suite, user cases, and ``verify_properties`` (what the command runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from topk_cli.analysis.parallel import parallel_map
from topk_cli.api import check_k, check_tau, get_method
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray
from topk_cli.properties.checks import CHECKS
from topk_cli.properties.evaluator import Evaluator
from topk_cli.properties.results import (
    _POLE_CODES,
    PROPERTIES,
    SUITE_OFFSETS,
    SUITE_SIZES,
    SUITE_SPREADS,
    Case,
    PropertyResult,
    VerifyReport,
)
from topk_cli.registry import METHODS


def _suite_ks(n: int, k: int | None) -> list[int]:
    if k is not None:
        return [k] if k <= n else []
    return sorted({kk for kk in (1, 2, max(1, n // 3), n - 1, n) if 1 <= kk <= n})


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _check_k(k: object) -> None:
    if k is not None:  # None: every k of the suite
        check_k(k)


def default_suite(*, trials: int = 3, seed: int = 0, k: int | None = None) -> tuple[Case, ...]:
    """The deterministic adversarial suite of ``verify-properties``.

    Per trial and size n in :data:`SUITE_SIZES`: a random vector at each spread of
    :data:`SUITE_SPREADS` (rotating offsets 0 and 1e6), a vector with ties, one with near-ties
    (relative gaps 1e-9), small integers with a tie at the k-th value; each at k = 1, 2, n/3,
    n-1, n (or the given k), tau = 1. Same ``seed`` and ``trials``, same cases.

    Raises:
        InvalidArgumentError: ``trials < 1`` or ``k < 1``.

    >>> len(default_suite(trials=1)) > 100
    True
    """
    if not _is_int(trials) or trials < 1:
        raise InvalidArgumentError(f"trials must be an integer >= 1, got {trials!r}")
    if not _is_int(seed) or seed < 0:
        raise InvalidArgumentError(f"seed must be an integer >= 0, got {seed!r}")
    _check_k(k)
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
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
            for x, label in vectors:
                for kk in _suite_ks(n, k):
                    cases.append(Case(tuple(float(v) for v in x), kk, 1.0, f"n={n} {label}"))
    return tuple(cases)


def cases_from_vectors(vectors: ArrayLike, k: int | None = None, *, tau: float = 1.0) -> tuple[Case, ...]:
    """Cases from user vectors (rows of a 2-D array): the given k, or k = 1, 2, n/3, n-1, n.

    Raises:
        InvalidArgumentError: not a 1-D/2-D array of reals, or k larger than every row.

    >>> [c.k for c in cases_from_vectors([[3.0, 1.0, 2.0]])]
    [1, 2, 3]
    """
    _check_k(k)
    check_tau(tau)
    try:
        arr = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError) as exc:  # ragged rows, text
        raise InvalidArgumentError(f"vectors must be a 1-D or 2-D array of real numbers: {exc}") from None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[-1] == 0:
        raise InvalidArgumentError(f"vectors must be a 1-D or 2-D array with entries, got shape {arr.shape}")
    cases = []
    for row_index, row in enumerate(arr):
        n = int(np.isfinite(row).sum())
        for kk in _suite_ks(n, k):
            cases.append(Case(tuple(float(v) for v in row), kk, tau, f"row {row_index}"))
    if not cases:
        check_k(k, arr.shape[-1])  # the only way no case is left: k > n
        raise AssertionError("unreachable: a row without cases has k > n")
    return tuple(cases)


def _check_method(unit: tuple[str, tuple[str, ...], tuple[Case, ...]]) -> list[PropertyResult]:
    """Every property of one method on ``cases``, with the method's own memoising evaluator."""
    name, props, cases = unit
    evaluator = Evaluator()  # shared by the checks of this method, dropped at its end
    return [CHECKS[prop](name, cases, evaluator=evaluator) for prop in props]


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
    k: int | None = None,
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
        k: fixed k, or None to vary k (1, 2, n/3, n-1, n).
        tau: temperature of the user vectors (the suite uses 1; ``hard-limit`` picks its own).
        trials, seed: size and seed of the default suite.
        properties: a subset of :data:`PROPERTIES` (default: all).
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
    props = tuple(properties) if properties is not None else PROPERTIES
    for prop in props:
        if prop not in CHECKS:
            raise InvalidArgumentError(f"unknown property {prop!r}; valid properties: {', '.join(PROPERTIES)}")
    if vectors is None:
        cases = default_suite(trials=trials, seed=seed, k=k)
        source = "suite"
    else:
        cases = cases_from_vectors(vectors, k, tau=tau)
        source = "input"
    units = [(name, props, cases) for name in names]
    per_method = parallel_map(_check_method, units, jobs=jobs, progress=progress, cost=_unit_cost)
    results = [r for method_results in per_method for r in method_results]
    return VerifyReport(
        methods=names, properties=props, cases=len(cases), results=tuple(results), source=source,
        seed=seed if vectors is None else None, trials=trials if vectors is None else None,
    )
