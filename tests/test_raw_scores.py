"""The methods defined on raw scores (``Implementation.centred`` False): ``scaled-sigmoid`` and
``coordinate-descent`` compute on ``z = x / tau`` as their sources do, not on ``(x - max x) / tau``
(which would change them: neither is shift-invariant), with exact derivatives in x and tau."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import run_cli

import topk_cli as st
from topk_cli.properties import Case, check_shift_invariant

RAW = ["scaled-sigmoid", "coordinate-descent"]


def _scaled_sigmoid_public(theta: np.ndarray, k: int) -> np.ndarray:
    """``scaled_sigmoid(theta, k)`` of the public code (Pervez et al. 2023), transcribed in float64."""
    s = 1 / (1 + np.exp(-theta))
    total = s.sum()
    return k * s / total if k <= total else 1 - (theta.size - k) * (1 - s) / (theta.size - total)


def _coor_descent_public(s: np.ndarray, k: int, eps: float, n_iters: int = 20) -> np.ndarray:
    """``coor_descent`` of lucidrains/CoLT5-attention (no mask, no eps-scaling), transcribed in float64."""
    a, b = 0.0, -s
    for _ in range(n_iters):
        sb = (s + b) / eps
        a = eps * (math.log(k) - (sb.max() + math.log(np.exp(sb - sb.max()).sum())))
        b = -np.maximum(s + a, 0.0)
    return np.exp((s + a + b) / eps)


def test_scaled_sigmoid_is_the_public_formula_on_the_raw_logits() -> None:
    """Regression: it ran on (x - max x) / tau, where the largest sigmoid is always 1/2 (x = 1,0,
    k = 1 gave 0.5, 0.5 * 0.269 / ... instead of 0.594, 0.406)."""
    for x, k, tau in [([1.0, 0.0], 1, 1.0), ([0.3, -1.2, 2.0, 0.7], 2, 0.5), ([-3.0, -4.0, -2.5], 2, 1.0),
                      ([5.0, 4.0, 3.0, -1.0], 1, 2.0)]:
        xa = np.array(x)
        np.testing.assert_allclose(st.soft_topk(xa, k, "scaled-sigmoid", tau=tau), _scaled_sigmoid_public(xa / tau, k),
                                   rtol=1e-14, atol=1e-15)
    # hard when exactly k logits are positive, which the centred map could never be
    p = st.soft_topk(np.array([1.0, -1.0, -2.0]), 1, "scaled-sigmoid", tau=1e-3)
    np.testing.assert_allclose(p, [1.0, 0.0, 0.0], atol=1e-12)


def test_coordinate_descent_is_coor_descent_on_the_raw_scores() -> None:
    """Regression: it ran coor_descent(x - max x, eps = tau); the public code's first step,
    a = eps log(k / n), does not follow an offset of x, so the two differ (x = 1,0, k = 1)."""
    for x, k, tau in [([1.0, 0.0], 1, 1.0), ([0.3, -1.2, 2.0, 0.7], 2, 0.5), ([3.0, 2.5, -1.0, 0.0, 1.0], 3, 0.2),
                      ([-5.0, -6.0, -7.0], 1, 1.0)]:
        xa = np.array(x)
        np.testing.assert_allclose(st.soft_topk(xa, k, "coordinate-descent", tau=tau),
                                   _coor_descent_public(xa, k, tau), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("method", RAW)
def test_a_shift_changes_the_raw_score_methods_and_the_registry_says_so(method: str) -> None:
    x = np.array([1.0, 0.0])
    assert np.abs(st.soft_topk(x, 1, method) - st.soft_topk(x + 1e6, 1, method)).max() > 0.05
    spec = st.METHODS[method]
    assert not spec.guarantees.shift_invariant and not spec.implementation.centred
    measured = check_shift_invariant(method, [Case((1.0, 0.0), 1)])
    assert not measured.holds


@pytest.mark.parametrize("method", RAW)
def test_tau_derivatives_match_finite_differences(method: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 6)) * 2 + np.array([[0.0], [3.0], [-2.0]])  # offsets matter here
    x[1, 4] = -np.inf
    v = rng.normal(size=x.shape)
    for k, tau in [(1, 0.7), (2, 1.3), (4, 0.4)]:
        d_tau = st.jacobian(x, k, method, tau=tau, wrt="tau")
        h = 1e-6 * tau
        fd = (st.soft_topk(x, k, method, tau=tau + h) - st.soft_topk(x, k, method, tau=tau - h)) / (2 * h)
        np.testing.assert_allclose(d_tau, fd, atol=2e-7)
        g_x, g_tau = st.vjp(x, k, v, method, tau=tau, wrt=("x", "tau"))
        np.testing.assert_allclose(g_tau, np.einsum("bi,bi->b", v, d_tau), rtol=1e-10, atol=1e-13)
        jac = st.jacobian(x, k, method, tau=tau)
        np.testing.assert_allclose(g_x, np.einsum("bi,bij->bj", v, jac), rtol=1e-10, atol=1e-13)
        fd_x = np.stack([(st.soft_topk(x + 1e-6 * e, k, method, tau=tau) - st.soft_topk(x - 1e-6 * e, k, method, tau=tau))
                         / 2e-6 for e in np.eye(6)], axis=-1)
        np.testing.assert_allclose(jac, np.nan_to_num(fd_x), atol=2e-7)


def test_coordinate_descent_jacobian_at_a_kink_is_one_sided() -> None:
    """x = 0 at k = n: z + a is exactly 0 at every step; each column is the derivative along an
    increase of its entry (slope 0 at every kink, as autograd takes it, matched neither side)."""
    for x, k in [(np.array([0.0, 2.0, 0.0, 1.0, 0.0]), 5), (np.zeros(4), 4), (np.array([0.0, -np.inf, 0.0, 0.5]), 3)]:
        jac = st.jacobian(x, k, "coordinate-descent")
        h = 1e-7
        for j in range(x.size):
            if not np.isfinite(x[j]):
                continue
            e = np.eye(x.size)[j]
            right = (st.soft_topk(x + h * e, k, "coordinate-descent") - st.soft_topk(x, k, "coordinate-descent")) / h
            np.testing.assert_allclose(jac[:, j], right, atol=1e-6)


@pytest.mark.parametrize("method", RAW)
def test_per_row_k_and_tau_give_the_rows_alone(method: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(4, 5)) + 2.0
    ks, taus = np.array([1, 3, 2, 3]), np.array([0.5, 1.0, 2.0, 0.3])
    got = st.soft_topk(x, ks, method, tau=taus)
    for b in range(4):
        np.testing.assert_array_equal(got[b], st.soft_topk(x[b], int(ks[b]), method, tau=float(taus[b])))


def test_an_overflowing_x_over_tau_is_refused_in_one_line() -> None:
    x = np.array([1e308, -1e308, 0.0])
    with pytest.raises(st.InvalidArgumentError, match=r"x / tau .*overflows float64; use tau >= 0\.557"):
        st.soft_topk(x, 1, "scaled-sigmoid", tau=1e-3)
    np.testing.assert_allclose(st.soft_topk(x, 1, "scaled-sigmoid"), [2 / 3, 0.0, 1 / 3], rtol=1e-15)
    st.soft_topk(x / 1e10, 1, "thre-sigmoid", tau=1e-3)  # a centred method only needs the spread
    code, _, err = run_cli("compute", "-m", "scaled-sigmoid", "-k", "1", "--tau", "1e-3", "--values=1e308,0")
    assert code == 2 and "overflows float64" in err and len(err.strip().splitlines()) == 1


def test_stability_probe_judges_them_against_their_reference_on_x_over_tau() -> None:
    """Regression: the probe gave their references the centred z, so a correct method was called
    inaccurate wherever the row maximum is not 0."""
    from topk_cli.analysis.probe import stability_probe

    report = stability_probe(methods=RAW, ns=[8], ks=[1, 3], scales=[0.3, 3.0], trials=4, offset=2.0)
    assert not report.failed
    assert len(report.cells) == 8 and max(c.max_error for c in report.cells) < 1e-12


def test_coordinate_descent_kink_columns_in_blocks_equal_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-sided Jacobian of a kinked row is formed a block of columns at a time (bounded
    memory): the blocks give the bits of one pass, for the Jacobian and the VJP."""
    from topk_cli.operators import coordinate_descent as cd

    x = np.array([[0.0, 2.0, 0.0, 1.0, 0.0, -1.0], [0.3, -0.2, 1.1, 0.4, 0.7, 0.2], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    v = np.random.default_rng(1).normal(size=x.shape)
    jac, g = st.jacobian(x, 6, "coordinate-descent"), st.vjp(x, 6, v, "coordinate-descent")
    assert cd._kink_rows(x, 6, 20).tolist() == [0, 2]
    monkeypatch.setattr(cd, "_CHUNK", 2 * 6 * 2)  # two columns per block for the two kinked rows
    np.testing.assert_array_equal(st.jacobian(x, 6, "coordinate-descent"), jac)
    np.testing.assert_array_equal(st.vjp(x, 6, v, "coordinate-descent"), g)


def test_coordinate_descent_keeps_a_against_a_huge_score() -> None:
    """Regression: z + b = z - relu(z + a) by subtraction lost a where |z| >> |a| (x = 0,0,1, k = 1,
    tau = 1e-20: 1/3, 1/3, 1 instead of 1/41, 1/41, 1, the 50-digit reference); min(z, -a) is exact."""
    for tau in (1e-20, 1e-300):
        np.testing.assert_allclose(st.soft_topk(np.array([0.0, 0.0, 1.0]), 1, "coordinate-descent", tau=tau),
                                   [1 / 41, 1 / 41, 1.0], rtol=1e-14)
