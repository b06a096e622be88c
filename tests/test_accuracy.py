"""Accuracy of every method against the independent mpmath reference (``tests/reference.py``).

The adversarial case set: n in {1, 2, 5, 50, 1000}; k in {1, 2, n//2, n-1, n};
spreads 1e-6 .. 1e3; offsets 0 and 1e6; random vectors, exact ties and near-ties (a few ulps
to 1e-10 of the spread apart); tau in {1e-3, 0.1, 1, 100}. The full cross product runs for
n <= 5; n = 50 and n = 1000 run a deliberate subset (the mpmath reference costs O(n) per
threshold evaluation and O(nk) for the sequential methods), with a heavier extension marked
``slow``.

Tolerances are absolute: 1e-12 in float64, 1e-5 in float32 (the float32 input's values, exactly
converted, are what the reference sees). The reference is evaluated on the operator's actual
input ``z = fl((x - max) / tau)`` (see :func:`operator_reference`); the end-to-end error against
exact ``x`` differs only by that single rounding and is reported by ``benchmarks/accuracy.py``. ``hard`` is compared exactly, except where the
float64 preprocessing ``(x - max) / tau`` merges distinct inputs (the answer is discontinuous
there). Methods that do not claim finiteness (``grad-recursive``, ``iterative``,
``weighted-softmax``) are compared wherever ``evaluate`` reports the row ``"ok"``: they must
refuse a row rather than return it wrong, and may refuse at most a quarter of a block. Weights
larger than 1 (only those two sequential methods produce them) are held to the bound relative
to their size. Each test walks a whole block of cases and reports every case over tolerance,
worst first.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import reference as ref
from golden_store import golden

import topk_cli as st

#: Every method's reference: ``reference.py`` and the wider field's ``reference_wider.py``.
REFERENCES = ref.all_references()


def _reference(method: str, x: list, k: int, tau: float = 1.0, **kw: int) -> list:
    return REFERENCES[method](x, k, tau, **kw)

TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}
TAUS = (1e-3, 0.1, 1.0, 100.0)
SPREADS = (1e-6, 1e-3, 1.0, 1e3)
OFFSETS = (0.0, 1e6)
KINDS = ("random", "ties", "near-ties")


@dataclass(frozen=True)
class Case:
    """One adversarial input: ``x`` (float64), ``k``, ``tau`` and a readable name."""

    name: str
    x: tuple[float, ...]
    k: int
    tau: float


def ks_for(n: int) -> list[int]:
    """The valid k of {1, 2, n//2, n-1, n}, deduplicated, in order."""
    return sorted({k for k in (1, 2, n // 2, n - 1, n) if 1 <= k <= n})


def make_vector(n: int, spread: float, offset: float, kind: str, seed: int) -> np.ndarray:
    """A float64 vector of ``n`` entries: ``offset + spread * normal``, with ties or near-ties."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n) * spread
    if kind == "ties" and n >= 2:
        pool = x[: max(1, n // 2)]
        x = rng.choice(pool, size=n)
        x[:2] = pool[0]  # at least one exact tie
    elif kind == "near-ties" and n >= 2:
        order = np.argsort(-x)
        # pair every entry with its successor in sorted order, 1e-10 of the spread apart
        for a, b in zip(order[::2], order[1::2], strict=False):
            x[b] = x[a] - spread * 1e-10 * rng.uniform(0.5, 1.5)
        x[order[-1]] = np.nextafter(x[order[0]], -np.inf)  # and one pair a single ulp apart
    return x + offset


def small_cases() -> list[Case]:
    """The full grid for n in {1, 2, 5}."""
    out = []
    seed = 0
    for n in (1, 2, 5):
        kinds = ("random",) if n == 1 else KINDS
        for kind in kinds:
            for spread in SPREADS:
                for offset in OFFSETS:
                    seed += 1
                    x = make_vector(n, spread, offset, kind, seed)
                    for k in ks_for(n):
                        for tau in TAUS:
                            name = f"n={n} k={k} tau={tau:g} spread={spread:g} offset={offset:g} {kind}"
                            out.append(Case(name, tuple(x.tolist()), k, tau))
    return out


def medium_cases() -> list[Case]:
    """A subset for n = 50: every k, the extreme and middle spreads and taus, some near-ties."""
    out = []
    n = 50
    combos = [
        (1e-6, 1e6, "random", (0.1, 100.0)),
        (1.0, 0.0, "random", TAUS),
        (1e3, 0.0, "random", (1e-3, 1.0)),
        (1e3, 1e6, "near-ties", (1e-3, 1.0)),
        (1.0, 0.0, "ties", (0.1,)),
    ]
    for seed, (spread, offset, kind, taus) in enumerate(combos, start=100):
        x = make_vector(n, spread, offset, kind, seed)
        for k in ks_for(n):
            for tau in taus:
                name = f"n={n} k={k} tau={tau:g} spread={spread:g} offset={offset:g} {kind}"
                out.append(Case(name, tuple(x.tolist()), k, tau))
    return out


def large_cases(*, slow: bool) -> list[Case]:
    """n = 1000: a few k for the threshold methods and grad; k <= 2 for the sequential ones."""
    n = 1000
    spec = (
        [(2, 1.0, 1.0, 0.0, "random"), (999, 0.1, 1e3, 1e6, "random"), (1, 1e-3, 1.0, 0.0, "near-ties")]
        if not slow
        else [
            (500, 1.0, 1.0, 0.0, "random"),
            (500, 1e-3, 1e3, 1e6, "near-ties"),
            (1000, 100.0, 1.0, 0.0, "ties"),
        ]
    )
    out = []
    for seed, (k, tau, spread, offset, kind) in enumerate(spec, start=1000 + 10 * slow):
        x = make_vector(n, spread, offset, kind, seed)
        name = f"n={n} k={k} tau={tau:g} spread={spread:g} offset={offset:g} {kind}"
        out.append(Case(name, tuple(x.tolist()), k, tau))
    return out


SEQUENTIAL = ("iterative", "weighted-softmax")


def cases_for(method: str, block: str) -> list[Case]:
    """The cases of ``block`` (small / medium / medium32 / large / large-slow) of ``method``."""
    if block == "small":
        return small_cases()
    if block == "medium":
        return medium_cases()
    if block == "medium32":  # float32 at n = 50: every other case (CI time)
        return medium_cases()[::2]
    large = large_cases(slow=block == "large-slow")
    if method in SEQUENTIAL:  # O(nk) mpmath work: only k <= 2 at n = 1000
        large = [c for c in large if c.k <= 2]
    return large


def api_z(x: np.ndarray, tau: float) -> np.ndarray:
    """``(x - max) / tau`` in float64, exactly as the public API prepares an operator's input."""
    finite = np.isfinite(x)
    with np.errstate(over="ignore", invalid="ignore"):
        z = (x - x[finite].max()) / tau
    return np.where(finite, z, -np.inf)


def reference_floats(method: str, x: tuple[float, ...], k: int, tau: float) -> tuple[float, ...]:
    """The reference weights of ``method`` rounded to float64 (cached: shared by the tests)."""
    return _reference_floats("grad" if method == "grad-recursive" else method, x, k, tau)


@functools.cache
@golden("test_accuracy.reference_floats")  # stored: tests/golden/references.json.gz
def _reference_floats(name: str, x: tuple[float, ...], k: int, tau: float) -> tuple[float, ...]:
    return tuple(ref.to_floats(_reference(name, list(x), k, tau)))


def operator_reference(method: str, x64: np.ndarray, k: int, tau: float) -> np.ndarray:
    """The reference on the operator's actual input ``z = fl((x - max) / tau)`` (tau = 1).

    That one float64 rounding of ``z`` is a backward error of 1 ulp that every float64
    implementation pays; its effect ``|J| * ulp(z)`` can exceed 1e-12 when ``z`` ~ 1e6 (tau =
    1e-3, spread 1e3), so the operators are judged against the exact image of the ``z`` they
    receive. ``benchmarks/accuracy.py`` also reports the end-to-end error against exact ``x``.
    A method that corrects that rounding (``thre-exp``) is judged against the exact ``x``.
    """
    if st.METHODS[method].implementation.refine is not None:
        # the method corrects the rounding of z itself (``Implementation.refine``): judged against exact x
        return np.asarray(reference_floats(method, tuple(x64.tolist()), k, tau))
    return np.asarray(reference_floats(method, tuple(api_z(x64, tau).tolist()), k, 1.0))


def hard_is_ambiguous(x: np.ndarray, tau: float) -> bool:
    """True when the float64 preprocessing ``(x - max) / tau`` merges distinct inputs."""
    with np.errstate(over="ignore"):
        z = (x - x.max()) / tau
    return bool(np.unique(z).size != np.unique(x).size)


@dataclass(frozen=True)
class Miss:
    case: str
    error: float
    detail: str = ""


#: Marker for a row the method refused (reported a numerical failure): not a miss, but counted.
REFUSED = Miss("refused", 0.0)
#: The most a method that may refuse rows may refuse of a block; a method that refused
#: everything would otherwise pass vacuously.
MAX_REFUSED_SHARE = 0.25
#: ``iterative`` and ``weighted-softmax`` refuse a row when their error estimate exceeds this
#: (``ILL_CONDITIONED_TOLERANCE`` in ``topk_cli/operators/sequential.py``); a returned row off by
#: more than 1e-12 but less than this is a known gap of float64 (reported as xfail), one off by
#: more is a silent wrong answer (a failure).
SEQUENTIAL_REFUSAL = 1e-9


def measure(method: str, case: Case, dtype: np.dtype) -> Miss | None:
    """Run the public API on ``case`` in ``dtype``; a :class:`Miss` when over tolerance.

    Returns None when within tolerance or when the case does not apply (hard at a merged
    tie, grad-recursive on a row it reports as failed).
    """
    x = np.asarray(case.x, dtype=np.float64).astype(dtype)
    x64 = x.astype(np.float64)
    if method == "hard" and hard_is_ambiguous(x64, case.tau):
        return None
    expected = operator_reference(method, x64, case.k, case.tau)
    result = st.evaluate(x, case.k, method, tau=case.tau)
    if result.weights.dtype != dtype:
        return Miss(case.name, math.inf, f"dtype {result.weights.dtype}, expected {dtype}")
    status = str(result.status)
    if status != "ok":
        if not st.METHODS[method].guarantees.finite:
            return REFUSED  # a method that does not claim finiteness may refuse a row, never return it wrong
        return Miss(case.name, math.inf, f"reported failure {status}: {result.failures[0].detail}")
    got = result.weights.astype(np.float64)
    if method == "hard":
        error = float(np.max(np.abs(got - expected)))
        exact = np.array_equal(got, expected.astype(dtype).astype(np.float64))
        return None if exact else Miss(case.name, error, "hard must be exact")
    error = float(np.max(np.abs(got - expected)))
    return None if error <= tolerance(dtype, expected) else Miss(case.name, error)


def tolerance(dtype: np.dtype, expected: np.ndarray) -> float:
    """1e-12 (float64) or 1e-5 (float32) absolute for weights of size <= 1, relative beyond.

    Methods that keep p in [0, 1] are held to the absolute bound. ``iterative`` and
    ``weighted-softmax`` can return weights of 1e7 and more (near a pole), whose float64 ulp
    (~2e-9) is far above 1e-12: no float64 result could meet an absolute bound there.
    """
    return TOL[dtype] * max(1.0, float(np.max(np.abs(expected))))


def misses(method: str, block: str, dtype: np.dtype) -> Iterator[Miss]:
    for case in cases_for(method, block):
        miss = measure(method, case, dtype)
        if miss is not None:
            yield miss


def check_block(method: str, block: str, dtype: np.dtype) -> None:
    outcomes = list(misses(method, block, dtype))
    refused = sum(m is REFUSED for m in outcomes)
    total = len(cases_for(method, block))
    if method in SEQUENTIAL:  # grad-recursive refuses whole regimes by design (its failure map is the point)
        assert refused <= MAX_REFUSED_SHARE * total, f"{method} refused {refused} of {total} cases"
    found = sorted((m for m in outcomes if m is not REFUSED), key=lambda m: -m.error)
    if found and method in SEQUENTIAL and dtype == np.float64 and found[0].error <= SEQUENTIAL_REFUSAL:
        lines = "; ".join(f"{m.error:.2g} at {m.case}" for m in found[:3])
        pytest.xfail(  # a known, reported gap: shown as xfail in every run, never silently passed
            f"{method}: {len(found)} of {total} rows returned with errors in (1e-12, 1e-9]: the k rounds "
            f"amplify float64 rounding and rows are refused only above 1e-9; worst: {lines}"
        )
    if found:
        lines = "\n".join(f"  {m.error:.3g}  {m.case} {m.detail}" for m in found[:8])
        pytest.fail(
            f"{method} ({dtype}): {len(found)} of {len(cases_for(method, block))} cases over "
            f"tolerance {TOL[dtype]:g}; worst:\n{lines}",
            pytrace=False,
        )


#: Monte Carlo methods are judged against their exact expectation within their standard error
#: (tests/test_perturbed.py), not at the float64 tolerances of these grids. The methods whose
#: references live in reference_wider.py pass these grids too (set WIDER_ACCURACY_GRID=1 to run
#: them: about 70 s per method), but CI checks them in their own files against the same
#: references to keep its time budget.
METHOD_NAMES = [
    m for m in st.METHODS
    if not st.METHODS[m].capabilities.monte_carlo
    and (m in ref.REFERENCES or os.environ.get("WIDER_ACCURACY_GRID"))
]
DTYPES = [np.dtype(np.float64), np.dtype(np.float32)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_small_grid(method: str, dtype: np.dtype) -> None:
    check_block(method, "small", dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_n50_subset(method: str, dtype: np.dtype) -> None:
    check_block(method, "medium" if dtype == np.float64 else "medium32", dtype)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_n1000_subset(method: str) -> None:
    check_block(method, "large", np.dtype(np.float64))


@pytest.mark.slow
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_n1000_slow(method: str) -> None:
    check_block(method, "large-slow", np.dtype(np.float64))


# -- the reference checks itself -------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["iterative", "weighted-softmax", "grad", "thre-exp", "thre-sigmoid", "thre-laplace"]
)
def test_reference_digits_are_stable_under_more_precision(method: str) -> None:
    """Recomputing at 100 digits changes no weight by more than 1e-40 (the reference's own error)."""
    for case in small_cases()[::23] + medium_cases()[::17]:
        lo = _reference(method, list(case.x), case.k, case.tau, dps=50)
        hi = _reference(method, list(case.x), case.k, case.tau, dps=100)
        assert ref.max_abs_diff(lo, hi) < 1e-40, case.name


def test_weighted_softmax_rewrite_matches_the_naive_recurrence() -> None:
    """The carried-complement recurrence equals the naive one run at enough digits."""
    checked = 0
    for case in small_cases()[::7]:
        p = ref.weighted_softmax(list(case.x), case.k, case.tau)
        # 1 - p can be as small as e^-(span of z) after each step: enough digits for all of it
        span = (max(case.x) - min(case.x)) / case.tau
        need = 60 + int(case.k * span / math.log(10))
        if need > 3000:
            continue
        naive = ref.weighted_softmax_direct(list(case.x), case.k, case.tau, dps=need)
        assert ref.max_abs_diff(p, naive) < 1e-40, case.name
        checked += 1
    assert checked > 20


def test_grad_enumeration_and_esp_agree() -> None:
    for case in small_cases()[::5] + medium_cases()[:0]:
        a = ref.grad_enumerate(list(case.x), case.k, case.tau)
        b = ref.grad_esp(list(case.x), case.k, case.tau)
        assert ref.max_abs_diff(a, b) < 1e-40, case.name
    rng = np.random.default_rng(7)
    for n in (9, 12):
        x = list(rng.normal(size=n) * 3)
        for k in range(1, n + 1):
            assert ref.max_abs_diff(ref.grad_enumerate(x, k, 0.5), ref.grad_esp(x, k, 0.5)) < 1e-40


def test_reference_known_values() -> None:
    """Known values (hand-derived golden vectors) and closed forms the reference must reproduce."""
    logits = [math.log(q / (1 - q)) for q in (0.3, 0.6, 0.5, 0.2)]
    assert [round(float(v), 4) for v in ref.grad(logits, 2)] == [0.3568, 0.7622, 0.6595, 0.2216]
    x = [0.1, -2.0, 1.5, 0.7]
    soft = np.exp(np.array(x) - max(x))
    soft /= soft.sum()
    for method in ("grad", "thre-exp", "iterative", "weighted-softmax"):
        assert ref.max_abs_diff(_reference(method, x, 1), soft.tolist()) < 1e-15, method
    for method in REFERENCES:
        p = _reference(method, [*x, -math.inf], 2, 0.3)
        assert p[-1] == 0, method
        if st.METHODS[method].guarantees.sum:  # coordinate-descent's 20 iterations stop short of sum p = k
            assert abs(float(sum(p)) - 2) < 1e-40, method
        assert ref.max_abs_diff(p[:-1], _reference(method, x, 2, 0.3)) == 0, method
    assert ref.to_floats(ref.hard([1.0, 3.0, 3.0, 2.0], 1)) == [0.0, 0.5, 0.5, 0.0]
    assert ref.to_floats(ref.weighted_softmax([0.0, 5.0, 10.0], 2, 1e-3)) == [0.0, 0.5, 1.5]
