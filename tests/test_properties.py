"""Every claim in the registry holds on generated inputs, checked by the same functions as the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import cases

from topk_cli.api import evaluate, soft_topk
from topk_cli.properties import (
    CHECKS,
    PROPERTIES,
    Case,
    _line_class,
    _pole_probe,
    check_hard_limit,
    check_jacobian,
    check_monotone_strict,
    check_monotone_weak,
    check_range,
    check_smooth,
    check_softmax_at_k1,
    check_sum,
    default_suite,
    takes_real_k,
    verify_properties,
)
from topk_cli.registry import METHODS

FAST = settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
# smooth is measured on the default suite below (its kink search is too slow for many examples).
CLAIM_PROPERTIES = [p for p in PROPERTIES if p != "smooth"]


def _claimed(method: str) -> list[str]:
    claims = METHODS[method].guarantees.as_dict()
    return [p for p in CLAIM_PROPERTIES if claims[p]]


@pytest.mark.parametrize("method", list(METHODS))
@FAST
@given(case=cases(max_n=8))
def test_every_claimed_property_holds_on_generated_inputs(method: str, case: Case) -> None:
    for prop in _claimed(method):
        result = CHECKS[prop](method, [case])
        assert result.holds is not False, (prop, result.counterexample and result.counterexample.command, result.detail)


@pytest.fixture(scope="module")
def suite() -> tuple[Case, ...]:
    return default_suite(trials=1, seed=0)


@pytest.mark.parametrize("method", list(METHODS))
def test_measured_smoothness_class_matches_the_claim(method: str, suite: tuple[Case, ...]) -> None:
    result = check_smooth(method, suite)
    # a Monte-Carlo estimate is not differentiated by finite differences: not measured
    expected = None if METHODS[method].capabilities.monte_carlo else METHODS[method].guarantees.smoothness
    assert result.smoothness == expected, result.detail


def test_suite_is_deterministic_and_covers_the_adversarial_regimes() -> None:
    a, b = default_suite(trials=1, seed=3), default_suite(trials=1, seed=3)
    assert a == b
    assert default_suite(trials=1, seed=4) != a
    assert {len(c.x) for c in a} == {1, 2, 3, 5, 10, 50}
    ks = {(len(c.x), c.k) for c in a}
    assert {(10, 1), (10, 2), (10, 9), (10, 10)} <= ks
    assert any(max(c.x) > 1e5 for c in a)  # offsets
    assert any(len(set(c.x)) < len(c.x) for c in a)  # exact ties
    assert len(default_suite(trials=2)) == 2 * len(a)
    assert all(c.k == 2 for c in default_suite(trials=1, k=2))


# ---- verdicts known from the maths ------------------------------------------------------------


def test_hard_is_discontinuous_and_not_strictly_monotone(suite: tuple[Case, ...]) -> None:
    smooth = check_smooth("hard", suite)
    assert smooth.holds is False and smooth.smoothness == "discontinuous"
    strict = check_monotone_strict("hard", suite)
    assert strict.holds is False
    cex = strict.counterexample
    assert cex is not None and len(cex.x) == 3  # shrunk: two zeros below the selected entry
    assert cex.command.startswith("softtopk compute -m hard -k 1 --tau 1 --values=")


def test_thre_sigmoid_is_c_infinity_and_converges(suite: tuple[Case, ...]) -> None:
    assert check_smooth("thre-sigmoid", suite).smoothness == "C-infinity"
    assert check_hard_limit("thre-sigmoid", suite).holds is True


def test_thre_laplace_is_c1_and_thre_exp_c0(suite: tuple[Case, ...]) -> None:
    laplace = check_smooth("thre-laplace", suite)
    assert laplace.smoothness == "C1" and laplace.holds is True
    exp = check_smooth("thre-exp", suite)
    assert exp.smoothness == "C0" and exp.holds is False
    assert exp.counterexample is not None and "jumps" in exp.counterexample.detail


def test_weighted_softmax_does_not_converge_for_k2() -> None:
    result = check_hard_limit("weighted-softmax", [Case((3.0, 2.0, 1.0, 0.0), 2)])
    assert result.holds is False
    assert result.counterexample is not None
    assert "1.5" in result.counterexample.detail and "0.5" in result.counterexample.detail


def test_thre_laplace_is_softmax_at_k1_only_below_one_half() -> None:
    below = check_softmax_at_k1("thre-laplace", [Case((0.0, 0.1, 0.2, 0.3), 1)])  # weights < 1/2
    assert below.holds is True
    above = check_softmax_at_k1("thre-laplace", [Case((0.0, 0.0, 3.0), 1)])  # one weight > 1/2
    assert above.holds is False and above.worst is not None and above.worst > 1e-3
    assert check_softmax_at_k1("thre-sigmoid", [Case((0.0, 1.0, 2.0), 1)]).holds is False
    assert check_softmax_at_k1("thre-exp", [Case((0.0, 1.0, 2.0), 1)]).holds is True


def test_iterative_exceeds_one_at_k_equals_n() -> None:
    result = check_range("iterative", [Case((0.0, 1.0, 5.0), 3)])
    assert result.holds is False and result.worst is not None and result.worst > 0.01
    assert check_sum("iterative", [Case((0.0, 1.0, 5.0), 3)]).holds is True


def test_grad_recursive_fails_where_grad_does_not() -> None:
    wide = [Case((0.0, 50.0, 100.0), 2, 0.01)]
    assert CHECKS["finite"]("grad-recursive", wide).holds is False
    assert CHECKS["finite"]("grad", wide).holds is True
    limit = check_hard_limit("grad-recursive", [Case((3.0, 2.0, 1.0, 0.0), 2)])
    assert limit.holds is False and "fails" in limit.detail


def test_a_pole_of_weighted_softmax_is_found_through_its_refusals() -> None:
    """x = c (3, 2, 1, 0), k = 3: S = sum_j (1 - p_j) e^{z_j} crosses 0 at c* ~ 1.2977."""
    base = np.array([3.0, 2.0, 1.0, 0.0])
    cs = np.linspace(1.29, 1.31, 201)
    r = evaluate(cs[:, None] * base, 3, "weighted-softmax")
    refused = np.isin(r.status, ["inf", "ill-conditioned"])
    assert refused.any() and abs(cs[refused].mean() - 1.2977) < 2e-3  # refused near the pole ...
    below = ~refused & (cs < cs[refused].min()) & (cs > 1.2977 - 5e-3)
    above = ~refused & (cs > cs[refused].max()) & (cs < 1.2977 + 5e-3)
    p0 = r.weights[:, 0]
    assert p0[below].min() < -100 and p0[above].max() > 100  # ... and huge values of opposite signs around it
    x0 = cs[refused][0] * base
    d = base / np.linalg.norm(base)
    measured = _line_class("weighted-softmax", x0, 3, 1.0, d)
    assert measured is not None and measured[0] == "discontinuous" and "a pole" in measured[2]
    result = check_smooth("weighted-softmax", [Case(tuple(float(v) for v in x0), 3)])
    assert result.smoothness == "discontinuous" and result.holds is False
    assert result.counterexample is not None and "a pole" in result.counterexample.detail


def test_a_grad_recursive_refusal_is_not_a_pole_nor_smoothness() -> None:
    """grad-recursive refuses ("cancellation") on a smooth stretch: neither a pole nor evidence."""
    x0, d = np.array([0.0, 20.0, 40.0, 30.7]), np.array([0.0, 0.0, 0.0, 1.0])
    status = evaluate(x0 + np.linspace(-0.1, 0.1, 21)[:, None] * d, 2, "grad-recursive").status
    assert "cancellation" in set(status) and "ok" in set(status)  # refused stretches between accepted points
    assert _line_class("grad-recursive", x0, 2, 1.0, d) is None  # unmeasured, not C-infinity
    assert _pole_probe("grad-recursive", x0, 2, 1.0, d, 0.0) is None  # even probed, bounded values are no pole
    result = check_smooth("grad-recursive", [Case(tuple(float(v) for v in x0), 2)])
    assert result.holds is None and result.smoothness is None and result.skipped == 1


def test_strict_monotonicity_ignores_saturation_that_float64_cannot_show() -> None:
    # Both top entries round to p = 1.0 but 1 - p differs: strictly monotone after all.
    case = Case((0.0, 80.0, 85.0), 2)
    p = soft_topk(case.x, case.k, "thre-sigmoid")
    assert p[1] == p[2] == 1.0
    assert check_monotone_strict("thre-sigmoid", [case]).holds is True


def test_checks_can_fail_on_a_wrong_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Jacobian and weak-monotonicity checks catch a deliberately broken method."""
    import topk_cli.properties.violations as props  # where the Jacobian check lives since the split

    real_jacobian = props.jacobian
    monkeypatch.setattr(props, "jacobian", lambda x, k, m, tau: 1.01 * real_jacobian(x, k, m, tau=tau))
    bad = check_jacobian("thre-sigmoid", [Case((0.0, 0.5, 1.0), 1)])
    assert bad.holds is False and bad.worst is not None and bad.worst > 1e-3
    assert check_monotone_weak("hard", [Case((0.0, 1.0), 1)]).holds is True


def test_verify_properties_report_shape() -> None:
    report = verify_properties(["hard", "thre-exp"], [[3.0, 1.0, 2.0, 2.0]], None, properties=["range", "smooth"])
    assert [(r.method, r.property) for r in report.results] == [
        ("hard", "range"), ("hard", "smooth"), ("thre-exp", "range"), ("thre-exp", "smooth"),
    ]
    real = 3 if takes_real_k("hard") else 0  # and k = 0.5, 1.5, 3.5 for the methods taking a real k
    assert report.source == "input" and report.cases == 4 + real
    with pytest.raises(ValueError, match="unknown property"):
        verify_properties(["hard"], properties=["bogus"])
    with pytest.raises(ValueError, match="unknown method"):
        verify_properties(["bogus"])


# ---- arguments found by fuzzing: refused with one clear message, never a bare ValueError ----


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(vectors=[[1, 2], [3]]), "vectors must be a 1-D or 2-D array of real numbers"),
        (dict(vectors="abc"), "vectors must be a 1-D or 2-D array of real numbers"),
        (dict(vectors=[[1.0, 2.0]], k="1"), "k must be an integer, got '1'"),
        (dict(vectors=[[1.0, 2.0]], k=1.5), "k must be an integer, got 1.5"),
        (dict(vectors=[[1.0, 2.0]], tau=float("nan")), "tau must be a finite number > 0"),
        (dict(trials=1.5), "trials must be an integer >= 1"),
        (dict(seed=-1), "seed must be an integer >= 0"),
    ],
)
def test_bad_verify_arguments_are_invalid_argument_errors(kwargs: dict, match: str) -> None:
    from topk_cli.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=match):
        verify_properties(["grad"], properties=["range"], **kwargs)


def test_a_tau_too_small_for_finite_differences_is_not_applicable() -> None:
    # log2(1e-5 * 5e-324) was a math domain error escaping verify_properties
    report = verify_properties(["grad"], [[1.0, 1.0]], 1, tau=5e-324, properties=["jacobian", "hard-limit", "range"])
    by = {r.property: r for r in report.results}
    assert by["jacobian"].holds is None and by["range"].holds is True
