"""The soft top-k sum and the potentials: gradient = p, exact values, limits, masks."""

from __future__ import annotations

from itertools import combinations

import mpmath as mp
import numpy as np
import pytest

import topk_cli as st

WITH_POTENTIAL = [s.name for s in st.METHODS.values() if s.capabilities.potential is not None]
CASES = [
    (np.array([0.3, -1.2, 2.5, 0.0, 1.1, 0.7]), 1, 1.0),
    (np.array([0.3, -1.2, 2.5, 0.0, 1.1, 0.7]), 2, 0.5),
    (np.array([4.0, 3.9, -2.0, 1.0, 1.5, 0.2]) * 3.0, 4, 2.0),
    (np.array([0.1, 0.2, 0.15, 0.05, 0.3, 0.25]) + 1e3, 5, 0.05),
]


def test_methods_declare_potentials_where_they_are_gradients() -> None:
    assert {"grad", "thre-exp", "thre-sigmoid", "thre-laplace", "hard"} <= set(WITH_POTENTIAL)
    assert "iterative" not in WITH_POTENTIAL and "weighted-softmax" not in WITH_POTENTIAL


@pytest.mark.parametrize("method", WITH_POTENTIAL)
@pytest.mark.parametrize(("x", "k", "tau"), CASES)
def test_the_gradient_of_the_potential_is_p(method: str, x: np.ndarray, k: int, tau: float) -> None:
    result = st.evaluate(x, k, method, tau=tau)
    if not result.ok:
        pytest.skip(f"{method} refuses this input ({result.failures[0].code}); its potential is not defined there")
    p = result.weights
    h = 1e-5 * tau
    steps = x + h * np.eye(x.size)
    up = st.evaluate_sum(steps, k, method, tau=tau).potential
    down = st.evaluate_sum(x - h * np.eye(x.size), k, method, tau=tau).potential
    assert up is not None and down is not None
    if not (np.isfinite(up).all() and np.isfinite(down).all()):
        pytest.skip(f"{method} refuses a neighbouring input")
    fd = (up - down) / (2 * h)
    np.testing.assert_allclose(fd, p, atol=2e-6 * max(1.0, float(np.abs(x).max()) / tau) ** 0.5)


def test_the_check_fails_for_a_wrong_potential() -> None:
    # the regularised max of thre-sigmoid is not the potential of thre-exp: its gradient is not p
    x, k, tau = CASES[1]
    h = 1e-5
    wrong = [float(st.evaluate_sum(x + s * h * e, k, "thre-sigmoid", tau=tau).potential) for e in np.eye(6) for s in (1, -1)]
    fd = (np.array(wrong[0::2]) - np.array(wrong[1::2])) / (2 * h)
    assert np.abs(fd - st.soft_topk(x, k, "thre-exp", tau=tau)).max() > 1e-2


def _log_esp(x: np.ndarray, k: int, tau: float) -> float:
    mp.mp.dps = 50
    terms = [mp.e ** (mp.fsum(mp.mpf(float(x[i])) for i in s) / tau) for s in combinations(range(x.size), k)]
    return float(tau * mp.log(mp.fsum(terms)))


@pytest.mark.parametrize(("x", "k", "tau"), CASES)
def test_grad_potential_is_tau_log_ek(x: np.ndarray, k: int, tau: float) -> None:
    value, potential = st.soft_topk_sum(x, k, "grad", tau=tau)
    assert potential is not None
    exact = _log_esp(x, k, tau)
    assert abs(float(potential) - exact) <= 1e-13 * max(1.0, abs(exact))
    np.testing.assert_allclose(value, np.sum(st.soft_topk(x, k, "grad", tau=tau) * x), rtol=1e-14)


def test_grad_potential_on_a_batch_with_masks_and_huge_spread() -> None:
    x = np.array([[0.0, -np.inf, 2.0, 1.0], [0.0, 5.0, -np.inf, -np.inf], [1e4, 0.0, -1e4, 3.0]])
    _, potential = st.soft_topk_sum(x, 2, "grad")
    assert potential is not None
    assert potential[0] == pytest.approx(_log_esp(np.array([0.0, 2.0, 1.0]), 2, 1.0), rel=1e-14)
    assert potential[1] == 5.0  # k = number of unmasked entries: the sum itself
    assert potential[2] == pytest.approx(1e4 + 3.0 + np.log1p(np.exp(-3.0)), rel=1e-14)


@pytest.mark.parametrize("method", WITH_POTENTIAL)
def test_sums_tend_to_the_hard_top_k_sum(method: str) -> None:
    x = np.array([0.3, -1.2, 2.5, 0.0, 1.1, 0.7])
    hard = 2.5 + 1.1 + 0.7
    result = st.evaluate_sum(x, 3, method, tau=1e-3)
    if result.failures:
        pytest.skip(f"{method} refuses this input ({result.failures[0].code})")
    value, potential = result.value, result.potential
    assert abs(float(value) - hard) < 1e-6
    # a regularised max exceeds the hard sum by at most tau * max regulariser (<= k log n here)
    assert potential is not None and abs(float(potential) - hard) < 1e-3 * 3 * np.log(6)


def test_methods_without_potential_return_none_and_sums_still() -> None:
    value, potential = st.soft_topk_sum([3.0, 1.0, 2.0], 2, "iterative")
    assert potential is None and np.isfinite(value)


def test_failed_rows_raise_or_are_nan() -> None:
    x = np.array([[0.0, 50.0, 100.0], [0.0, 0.01, 0.02]])
    result = st.evaluate_sum(x, 2, "grad-recursive", tau=0.01)
    assert result.status.tolist() == ["log0", "ok"] and np.isnan(result.value[0]) and np.isfinite(result.value[1])
    assert result.potential is not None and np.isnan(result.potential[0])
    with pytest.raises(st.NumericalFailureError):
        st.soft_topk_sum(x, 2, "grad-recursive", tau=0.01)


@pytest.mark.parametrize("method", WITH_POTENTIAL)
def test_the_potential_checks_are_not_all_skipped(method: str) -> None:
    """``test_the_gradient_of_the_potential_is_p`` skips a case the method refuses: a floor on the
    cases it accepts (measured: every method accepts all 4)."""
    accepted = sum(bool(st.evaluate(x, k, method, tau=tau).ok) for x, k, tau in CASES)
    assert accepted >= len(CASES) - 1, f"{method} accepts only {accepted} of {len(CASES)} cases"
