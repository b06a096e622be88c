"""gumbel-topk, coordinate-descent, dftopk, scaled-sigmoid, k-softmax and straight-through against
their independent mpmath references (tests/reference_more.py) on adversarial rows, their
derivatives against finite differences of those references, and what each one claims."""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import reference_more as more

import topk_cli as st
from topk_cli.registry import lookup

NEW = ["gumbel-topk", "coordinate-descent", "dftopk", "scaled-sigmoid", "k-softmax", "straight-through"]

#: (x, k, tau): offsets, spreads, ties, k = 1, k = n, n = 1, masks.
CASES = [
    ([0.3, -1.2, 2.0, 0.7], 2, 1.0),
    ([1e6 + 0.3, 1e6 - 1.2, 1e6 + 2.0, 1e6 + 0.7], 2, 0.5),
    ([0.0, -30.0, -800.0, -5.0, 2.0], 3, 1.0),
    ([1.0, 1.0, 1.0, 0.0], 2, 1.0),
    ([2.0, 2.0, 0.5, -1.0, 0.5], 1, 0.3),
    ([0.1, -0.4, 0.9], 3, 2.0),
    ([4.2], 1, 1.0),
    ([0.5, -np.inf, 1.5, -0.5, -np.inf, 0.0], 2, 0.7),
    ([0.5, -np.inf, 1.5], 2, 1.0),
    ([3.0, -2.0, 1.0, 0.0, -1.0, 2.0, -3.0], 5, 0.05),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]!s:.40} k={c[1]} tau={c[2]}" for c in CASES])
@pytest.mark.parametrize("method", NEW)
def test_weights_match_the_mpmath_reference(method: str, case: tuple) -> None:
    x, k, tau = case
    got = st.soft_topk(np.array(x), k, method, tau=tau)
    # the operator's input, rounded to float64: x / tau for a method of the raw scores
    centred = st.METHODS[method].implementation.centred
    z = st.api.scaled_scores(np.array(x), k, tau=tau)[0] if centred else np.array(x) / tau
    want = np.array([float(v) for v in more.REFERENCES[method](list(z), k, 1.0)])
    assert np.abs(got - want).max() <= 1e-13 * max(1.0, np.abs(want).max()), (got, want)


JAC_CASES = [c for c in CASES if c[1] < sum(np.isfinite(c[0])) and len(set(c[0])) == len(c[0])] + [
    ([0.3, -1.2, 2.0, 0.7, -0.1], 2, 1.0), ([0.9, -0.2, 0.4], 1, 0.5)]


@pytest.mark.parametrize("case", JAC_CASES, ids=[f"{c[0]!s:.40} k={c[1]}" for c in JAC_CASES])
@pytest.mark.parametrize("method", [m for m in NEW if m != "straight-through"])
def test_jacobian_matches_finite_differences_of_the_reference(method: str, case: tuple) -> None:
    x, k, tau = case
    if method == "dftopk" and 3 <= len(x) and tau == 0.05:
        pytest.skip("far entries: sigmoid derivatives below the finite-difference resolution")
    got = st.jacobian(np.array(x), k, method, tau=tau)
    fd = ref.jacobian_fd(more.REFERENCES[method], list(x), k, tau)
    want = np.array([[float(v) for v in row] for row in fd])
    assert np.abs(got - want).max() <= 1e-9 * max(1.0, np.abs(want).max()), (method, got, want)


def test_enough_jacobian_cases() -> None:
    assert len(JAC_CASES) >= 6


@pytest.mark.parametrize("method", NEW)
def test_vjp_is_v_times_the_jacobian(method: str) -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(4, 7)) * 3
    x[1, 3] = -np.inf
    x[2, :2] = x[2, 2]  # a tie at the largest score
    v = rng.normal(size=x.shape)
    for k in (1, 3, 6):
        jac = st.jacobian(x, k, method, tau=0.6)
        np.testing.assert_allclose(st.vjp(x, k, v, method, tau=0.6), np.einsum("bi,bij->bj", v, jac),
                                   rtol=1e-10, atol=1e-13)


def test_gumbel_noise_is_judged_within_its_standard_errors() -> None:
    x = np.array([1.2, 0.3, -0.5, 0.9, -2.0, 0.0])
    small = st.evaluate(x, 2, "gumbel-topk", tau=0.5, noise=1, samples=400, seed=0)
    large = st.evaluate(x, 2, "gumbel-topk", tau=0.5, noise=1, samples=4000, seed=1)
    assert small.stderr is not None and large.stderr is not None
    bound = 4.0 * np.hypot(small.stderr, large.stderr) + 1e-12
    assert (np.abs(small.weights - large.weights) <= bound).all()
    assert np.isclose(small.weights.sum(), 2.0, atol=1e-12)  # every sample sums to k
    # the noise is seeded and changes the result; without noise it is the deterministic relaxation
    again = st.evaluate(x, 2, "gumbel-topk", tau=0.5, noise=1, samples=400, seed=0)
    np.testing.assert_array_equal(small.weights, again.weights)
    assert not np.allclose(small.weights, st.soft_topk(x, 2, "gumbel-topk", tau=0.5))


def test_gumbel_noise_pathwise_jacobian_matches_finite_differences_of_the_estimate() -> None:
    x = np.array([1.2, 0.3, -0.5, 0.9])
    params = {"noise": 1, "samples": 50, "seed": 3}
    jac = st.jacobian(x, 2, "gumbel-topk", tau=0.5, **params)
    h = 1e-6
    fd = np.stack([(st.soft_topk(x + h * e, 2, "gumbel-topk", tau=0.5, **params)
                    - st.soft_topk(x - h * e, 2, "gumbel-topk", tau=0.5, **params)) / (2 * h) for e in np.eye(4)], axis=1)
    np.testing.assert_allclose(jac, fd, atol=1e-7)


def test_gumbel_topk_keeps_the_exact_relaxation_where_a_floor_would_change_it() -> None:
    # 1 - a of the first round is e^-2207: a floor at 1e-38 would give 0, 2
    np.testing.assert_allclose(st.soft_topk(np.array([-2207.0, 0.0]), 2, "gumbel-topk"), [0.5, 1.5], atol=1e-15)
    assert st.soft_topk(np.array([0.0, -1.0, -2.0]), 3, "gumbel-topk").max() > 1.5  # range not claimed


def test_coordinate_descent_tends_to_thre_exp_and_misses_k_at_20_iterations() -> None:
    x = np.array([1.0, 2.0, 0.0, -0.5, 1.5])
    exact = st.soft_topk(x, 2, "thre-exp", tau=0.2)
    many = st.soft_topk(x, 2, "coordinate-descent", tau=0.2, iterations=5000)
    np.testing.assert_allclose(many, exact, atol=1e-10)
    few = st.soft_topk(x, 2, "coordinate-descent", tau=0.2)
    assert abs(few.sum() - 2.0) > 1e-6 and (few <= 1.0).all()
    assert lookup("colt5").name == "coordinate-descent"


def test_dftopk_is_the_authors_threshold_and_all_ones_at_k_equal_n() -> None:
    x = np.array([0.3, -1.2, 2.0, 0.7])
    m = (0.7 + 0.3) / 2  # the 2nd and 3rd largest
    np.testing.assert_allclose(st.soft_topk(x, 2, "dftopk", tau=0.5), 1 / (1 + np.exp(-(x - m) / 0.5)), rtol=1e-15)
    np.testing.assert_array_equal(st.soft_topk(x, 4, "dftopk"), np.ones(4))
    np.testing.assert_array_equal(st.jacobian(x, 4, "dftopk"), np.zeros((4, 4)))


def test_scaled_sigmoid_sums_to_k_in_the_unit_interval_on_both_forms() -> None:
    rng = np.random.default_rng(4)
    firsts = seconds = 0
    for _ in range(200):
        n = int(rng.integers(2, 9))
        x = rng.normal(size=n) * rng.choice([0.1, 1.0, 10.0])
        k = int(rng.integers(1, n + 1))
        p = st.soft_topk(x, k, "scaled-sigmoid")
        assert abs(p.sum() - k) < 1e-12 and (p >= 0).all() and (p <= 1).all()
        s = 1 / (1 + np.exp(-x))  # the raw logits: not centred
        firsts += k <= s.sum()
        seconds += k > s.sum()
    assert firsts >= 20 and seconds >= 20  # both forms were exercised


def test_k_softmax_and_the_softmax_alias() -> None:
    x = np.array([0.3, -1.2, 2.0, 0.7])
    soft = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    np.testing.assert_allclose(st.soft_topk(x, 1, "softmax"), soft, rtol=1e-15)
    np.testing.assert_allclose(st.soft_topk(x, 3, "k-softmax"), 3 * soft, rtol=1e-15)
    assert lookup("softmax").name == "k-softmax" and lookup("subsets").name == "gumbel-topk"


def test_straight_through_is_hard_forward_and_thre_sigmoid_backward() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 6))
    x[0, 2] = -np.inf
    np.testing.assert_array_equal(st.soft_topk(x, 2, "straight-through"), st.soft_topk(x, 2, "hard"))
    np.testing.assert_array_equal(st.jacobian(x, 2, "straight-through", tau=0.3), st.jacobian(x, 2, "thre-sigmoid", tau=0.3))
    v = rng.normal(size=x.shape)
    np.testing.assert_array_equal(st.vjp(x, 2, v, "straight-through", tau=0.3), st.vjp(x, 2, v, "thre-sigmoid", tau=0.3))
    assert not st.METHODS["straight-through"].guarantees.jacobian  # not the forward's derivative, and says so


def test_gumbel_topk_keys_survive_a_huge_gap() -> None:
    """Regression: with the keys kept relative to the largest, log(1 - a_top) (~ -1e20 + log 2) was
    absorbed by -1e20 and 0,0,1 at tau = 1e-20, k = 2 gave 1/3, 1/3, 4/3 instead of 1/4, 1/4, 3/2."""
    np.testing.assert_allclose(st.soft_topk(np.array([0.0, 0.0, 1.0]), 2, "gumbel-topk", tau=1e-20),
                               [0.25, 0.25, 1.5], rtol=0, atol=1e-15)
    np.testing.assert_allclose(st.soft_topk(np.array([0.0, 1.0]), 2, "gumbel-topk", tau=1e-8), [0.5, 1.5],
                               rtol=0, atol=1e-15)


def test_coordinate_descent_jacobian_at_tied_largest_scores_is_one_sided() -> None:
    """Regression: at k = n with every score tied, each entry's column is the derivative of its own
    increase (it had the centring's derivative on the first entry only: 0.8 where the one-sided
    difference is 0.0144)."""
    x = np.ones(5)
    jac = st.jacobian(x, 5, "coordinate-descent")
    h = 1e-7
    for j in range(5):
        e = np.eye(5)[j]
        right = (st.soft_topk(x + h * e, 5, "coordinate-descent") - st.soft_topk(x, 5, "coordinate-descent")) / h
        np.testing.assert_allclose(jac[:, j], right, atol=1e-5)


def test_gumbel_topk_refuses_a_row_whose_rounds_would_not_fit() -> None:
    """k rounds over the row, stored for the VJP (24 n k bytes): n k above 1e7 is refused up front."""
    with pytest.raises(st.InvalidArgumentError, match="exceeds its limit"):
        st.soft_topk(np.zeros(20_000), 1_000, "gumbel-topk")
    with pytest.raises(st.InvalidArgumentError, match="exceeds its limit"):
        st.vjp(np.zeros(20_000), 1_000, np.ones(20_000), "gumbel-topk")
    assert "O(n k)" in st.METHODS["gumbel-topk"].notes


def test_gumbel_topk_vjp_in_row_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from topk_cli.operators import gumbel_topk as g

    rng = np.random.default_rng(6)
    x, v = rng.normal(size=(7, 9)), rng.normal(size=(7, 9))
    whole = st.vjp(x, 3, v, "gumbel-topk", tau=0.4)
    monkeypatch.setattr(g, "_CHUNK", 3 * 3 * 9 * 2)  # two rows per chunk
    np.testing.assert_array_equal(st.vjp(x, 3, v, "gumbel-topk", tau=0.4), whole)


def test_coordinate_descent_vjp_in_row_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from topk_cli.operators import coordinate_descent as cd

    rng = np.random.default_rng(9)
    x, v = rng.normal(size=(7, 9)), rng.normal(size=(7, 9))
    x[3, :3] = x[3].max()  # a tie at the largest score: its own reverse passes
    whole = st.vjp(x, 3, v, "coordinate-descent", tau=0.4)
    monkeypatch.setattr(cd, "_CHUNK", 2 * (20 * 9 + 9))  # two rows per chunk
    np.testing.assert_array_equal(st.vjp(x, 3, v, "coordinate-descent", tau=0.4), whole)
