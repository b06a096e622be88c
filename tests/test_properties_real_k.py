"""verify-properties with a real k: real-k cases for the methods that take one (none for the
others), the properties defined with the real-k hard top-k, and monotone-k / continuous-k, which
must catch a toy operator whose p decreases in k or jumps in k."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest

import topk_cli.api as st
from topk_cli import registry
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import Forward, Implementation
from topk_cli.operators.hard import hard_topk_weights
from topk_cli.properties import (
    K_PROPERTIES,
    PROPERTIES,
    Case,
    Counterexample,
    check_continuous_k,
    check_hard_limit,
    check_monotone_k,
    check_monotone_strict,
    check_sum,
    default_suite,
    takes_real_k,
    verify_properties,
)
from topk_cli.properties.in_k import k_grid
from topk_cli.properties.verify import cases_from_vectors, method_cases

#: The methods that take a real k (the others refuse one).
REAL_K = tuple(name for name, spec in registry.METHODS.items() if not spec.capabilities.integer_k)


def test_the_methods_taking_a_real_k_are_those_with_real_k_kernels() -> None:
    assert set(REAL_K) == {
        "hard", "thre-exp", "thre-sigmoid", "thre-laplace", "thre-clip", "thre-cube", "ot-sinkhorn", "perturbed",
    }
    assert all(takes_real_k(name) == (name in REAL_K) for name in registry.METHODS)


# ---- the suite ----------------------------------------------------------------------------------


def test_the_suite_gains_real_k_cases_after_the_unchanged_integer_ones() -> None:
    integer = default_suite(trials=2, seed=1)
    both = default_suite(trials=2, seed=1, real_k=True)
    assert all(isinstance(c.k, int) for c in integer)
    assert both[: len(integer)] == integer  # the integer-k cases do not move
    real = both[len(integer) :]
    assert len(real) >= 50 and all(not float(c.k).is_integer() for c in real)
    ks = {(len(c.x), c.k) for c in real}
    assert {(1, 0.5), (2, 1.5), (10, 0.5), (10, 1.5), (10, 9.5), (50, 49.5)} <= ks
    assert all(0 < c.k < len(c.x) for c in real)
    assert {c.x for c in real} == {c.x for c in integer if len(c.x) >= 1}  # every vector, one real k each
    assert default_suite(trials=1, k=2, real_k=True) == default_suite(trials=1, k=2)  # a given k: only it


def test_real_k_cases_go_to_the_methods_that_take_one_only() -> None:
    suite = default_suite(trials=1, real_k=True)
    assert takes_real_k("hard") and takes_real_k("perturbed") and not takes_real_k("grad")
    for name in registry.METHODS:
        mine = method_cases(name, suite)
        if takes_real_k(name):
            assert mine == suite
        else:
            assert len(mine) >= 100 and all(isinstance(c.k, int) for c in mine), name
    users = cases_from_vectors([[3.0, 1.0, 2.0, 0.0]], real_k=True)
    assert [c.k for c in users] == [1, 2, 3, 4, 0.5, 1.5, 3.5]


def test_integer_only_runs_have_no_real_k_rows_or_cases() -> None:
    report = verify_properties(["grad"], trials=1, properties=["sum", "range"])
    assert report.properties == ("sum", "range")
    full = verify_properties(["grad"], [[3.0, 1.0, 2.0]])
    assert full.properties == PROPERTIES and full.cases == len(cases_from_vectors([[3.0, 1.0, 2.0]]))
    assert all(isinstance(r.counterexample.k, int) for r in full.results if r.counterexample)


def test_mixed_runs_give_integer_only_methods_rows_not_applicable() -> None:
    report = verify_properties(["grad", "hard"], [[3.0, 1.0, 2.0, 0.5]], properties=["sum", *K_PROPERTIES])
    rows = {(r.method, r.property): r for r in report.results}
    for prop in K_PROPERTIES:
        assert rows[("grad", prop)].holds is None and "integer k only" in rows[("grad", prop)].detail
        assert rows[("hard", prop)].holds is True and rows[("hard", prop)].checked == 1
    assert rows[("grad", "sum")].checked == 4  # k = 1..4, no real k
    assert rows[("hard", "sum")].checked == 7  # and 0.5, 1.5, 3.5
    assert report.cases == 7


def test_a_real_k_given_to_an_integer_only_method_is_not_applicable_not_a_crash() -> None:
    report = verify_properties(["grad", "thre-laplace"], [[3.0, 1.0, 2.0]], 2.5, properties=["sum", "smooth", "monotone-k"])
    rows = {(r.method, r.property): r for r in report.results}
    for prop in ("sum", "smooth", "monotone-k"):
        assert rows[("grad", prop)].holds is None, prop
        assert "grad takes an integer k only" in rows[("grad", prop)].detail, prop
    assert rows[("thre-laplace", "sum")].holds is True and rows[("thre-laplace", "sum")].checked == 1
    assert all(c.k == 2.5 for c in default_suite(trials=1, k=2.5, real_k=True))
    with pytest.raises(InvalidArgumentError, match="0 < k"):
        default_suite(trials=1, k=-0.5, real_k=True)
    # only integer-only methods selected: the k itself is refused, saying which methods take one
    with pytest.raises(InvalidArgumentError, match=r"k must be an integer, got 2\.5: the selected methods take an integer k only"):
        verify_properties(["grad", "iterative"], k=2.5)
    with pytest.raises(InvalidArgumentError, match=r"k must be an integer, got 2\.5"):
        default_suite(trials=1, k=2.5)


# ---- the properties at a real k -----------------------------------------------------------------


def test_properties_use_the_real_k_hard_top_k() -> None:
    cases = [Case((3.0, 2.0, 1.0, 0.0), k) for k in (0.5, 1.5, 2.25, 3.75)]
    judged = 0
    for method in REAL_K:
        claims = registry.METHODS[method].guarantees
        if not (claims.hard_limit and claims.sum and claims.monotone_strict):
            continue
        judged += 1
        limit = check_hard_limit(method, cases)
        assert limit.holds is True and limit.checked == 4, (method, limit.detail)
        assert check_sum(method, cases).holds is True, method
        assert check_monotone_strict(method, cases).holds is True, method
    assert judged >= 2
    # the limit at k = 1.5 is [1, 0.5, 0, 0]: a method converging to the integer top-1 fails
    np.testing.assert_array_equal(hard_topk_weights(np.array([3.0, 2.0, 1.0, 0.0]), 1.5), [1.0, 0.5, 0.0, 0.0])
    # a tie next to the ceil(k)-th value: no limit to judge (p shares it, the hard target too)
    assert check_hard_limit("thre-sigmoid", [Case((3.0, 2.0, 2.0, 0.0), 1.5)]).holds is None
    strict = check_monotone_strict("hard", [Case((3.0, 2.0, 1.0, 0.0), 1.5)])
    assert strict.holds is False and strict.counterexample is not None
    assert " -k 1.5 " in strict.counterexample.command or " -k 0.5 " in strict.counterexample.command


@pytest.mark.parametrize("method", REAL_K)
def test_every_method_taking_a_real_k_is_monotone_and_continuous_in_k(method: str) -> None:
    suite = default_suite(trials=1, seed=2, real_k=True)
    for check in (check_monotone_k, check_continuous_k):
        result = check(method, suite)
        assert result.holds is True, (method, result.property, result.detail)
        assert result.checked >= 8, result.checked


def test_the_grid_of_k_is_exact_and_bounded() -> None:
    for m in (1, 2, 3, 5, 10, 50, 129, 1000):
        grid = k_grid(m)
        assert grid[-1] == m and grid[0] > 0 and np.all(np.diff(grid) > 0) and grid.size <= 130
        assert all(float(k * 2**10).is_integer() for k in grid[:-1])  # binary fractions: exact midpoints


def test_a_counterexample_command_prints_a_real_k_exactly() -> None:
    cex = Counterexample("hard", (1.0, 0.0), 1.5, 1.0, "")
    assert cex.command == "softtopk compute -m hard -k 1.5 --tau 1 --values=1,0"
    assert "k2" not in cex.as_dict()
    two = Counterexample("hard", (1.0, 0.0), 0.9960932731628418, 1.0, "", k2=2)
    assert two.command == (
        "softtopk compute -m hard -k 0.9960932731628418 --tau 1 --values=1,0 && "
        "softtopk compute -m hard -k 2 --tau 1 --values=1,0"
    )
    assert two.as_dict()["k2"] == 2
    assert Counterexample("hard", (1.0,), 2, 1.0, "").command == "softtopk compute -m hard -k 2 --tau 1 --values=1"


# ---- toy operators that break the properties in k -----------------------------------------------


def _k_rows(z: np.ndarray, k: object) -> np.ndarray:
    return np.broadcast_to(np.asarray(k, dtype=np.float64), z.shape[:1]).astype(np.float64)


def _decreasing_forward(z: np.ndarray, k: object) -> Forward:
    """Uniform ``k / m`` plus ``0.5 sin(pi k / 2)`` moved from the smallest entry to the largest:
    sums to k, continuous in k, but the largest entry's weight falls for k in about (1.3, 2.7)."""
    kk = _k_rows(z, k)
    fin = np.isfinite(z)
    m = fin.sum(axis=1)
    p = np.where(fin, (kk / m)[:, None], 0.0)
    rows = np.arange(z.shape[0])
    bump = np.where(m >= 2, 0.5 * np.sin(np.pi * kk / 2), 0.0)
    p[rows, np.argmax(np.where(fin, z, -np.inf), axis=1)] += bump
    p[rows, np.argmin(np.where(fin, z, np.inf), axis=1)] -= bump
    return Forward(p=p, q=1.0 - p)


def _jumping_forward(z: np.ndarray, k: object) -> Forward:
    """The real-k hard top-k, plus 0.25 on the largest entry once k > 1.5: non-decreasing in k,
    but with a jump at k = 1.5."""
    kk = _k_rows(z, k)
    fin = np.isfinite(z)
    p = hard_topk_weights(z, kk)
    p[np.arange(z.shape[0]), np.argmax(np.where(fin, z, -np.inf), axis=1)] += np.where(kk > 1.5, 0.25, 0.0)
    return Forward(p=p, q=1.0 - p)


def _zero_jacobian(fwd: Forward, z: np.ndarray, k: object) -> np.ndarray:
    return np.zeros(z.shape + z.shape[-1:])


def _zero_vjp(fwd: Forward, z: np.ndarray, k: object, v: np.ndarray) -> np.ndarray:
    return np.zeros_like(z)


def _toy(name: str, forward: object) -> registry.MethodSpec:
    return dataclasses.replace(
        registry.METHODS["hard"], name=name, aliases=(), summary=f"a toy ({name}) registered by a test",
        implementation=Implementation(forward=forward, jacobian=_zero_jacobian, vjp=_zero_vjp, row_k=True),  # type: ignore[arg-type]
        capabilities=dataclasses.replace(registry.METHODS["hard"].capabilities, integer_k=False, potential=None),
    )


@pytest.fixture
def toys(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = {"toy-decreasing": _toy("toy-decreasing", _decreasing_forward), "toy-jump": _toy("toy-jump", _jumping_forward)}
    monkeypatch.setattr(registry, "METHODS", MappingProxyType({**registry.METHODS, **specs}))


def _reproduces(cex: Counterexample) -> tuple[np.ndarray, np.ndarray]:
    assert cex.k2 is not None and cex.command.count("softtopk compute") == 2
    x = np.array(cex.x)
    return st.soft_topk(x, cex.k, cex.method, tau=cex.tau), st.soft_topk(x, cex.k2, cex.method, tau=cex.tau)


def test_monotone_k_catches_a_weight_that_decreases_in_k(toys: None) -> None:
    suite = default_suite(trials=1, real_k=True)
    result = check_monotone_k("toy-decreasing", suite)
    assert result.holds is False and result.checked >= 20 and result.violations >= 10
    assert result.worst is not None and result.worst > 0.01
    cex = result.counterexample
    assert cex is not None and len(cex.x) <= 4 and cex.k < cex.k2  # shrunk (m >= 4 decreases at k = 1..1.5)
    pa, pb = _reproduces(cex)
    assert (pa - pb).max() > 1e-3  # the commands show p falling from k to k2
    assert check_continuous_k("toy-decreasing", suite).holds is True  # smooth in k, only not monotone


def test_continuous_k_catches_a_jump_in_k(toys: None) -> None:
    suite = default_suite(trials=1, real_k=True)
    result = check_continuous_k("toy-jump", suite)
    assert result.holds is False and result.checked >= 20 and result.violations >= 10
    # 3/4 of the 0.25 jump: the local slope estimate, 16 times wider, is the jump's own there
    assert result.worst is not None and result.worst >= 0.15
    cex = result.counterexample
    assert cex is not None and cex.k <= 1.5 < cex.k2 and cex.k2 - cex.k < 1e-3
    pa, pb = _reproduces(cex)
    assert np.abs(pb - pa).max() > 0.2
    assert check_monotone_k("toy-jump", suite).holds is True  # it jumps upwards: still monotone


def test_verify_properties_reports_the_toys_failures_in_k(toys: None) -> None:
    report = verify_properties(["toy-decreasing", "toy-jump"], trials=1, properties=list(K_PROPERTIES))
    verdicts = {(r.method, r.property): r.holds for r in report.results}
    assert verdicts == {
        ("toy-decreasing", "monotone-k"): False, ("toy-decreasing", "continuous-k"): True,
        ("toy-jump", "monotone-k"): True, ("toy-jump", "continuous-k"): False,
    }
    # a method taking a real k claims both (unless its guarantees say otherwise): the toys break them
    assert all(r.expected for r in report.results)
    assert {(r.method, r.property) for r in report.claim_failures} == {
        ("toy-decreasing", "monotone-k"), ("toy-jump", "continuous-k"),
    }
