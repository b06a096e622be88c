"""Threshold operators (thre-exp, thre-sigmoid, thre-laplace) through the public API.

Oracles: a 60-digit mpmath bisection of ``sum f(z_i - lambda) = k``, softmax, central finite
differences of the operator itself, and the defining identities of the implicit Jacobian.
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
from golden_store import golden

import topk_cli as st
from topk_cli.api import _prepare
from topk_cli.operators.threshold import thre_laplace_forward
from topk_cli.operators.threshold_sigmoid import SIGMOID_MAX_ITER, thre_sigmoid_forward

METHODS = ("thre-exp", "thre-sigmoid", "thre-laplace")


def _f_mp(method: str, t: mp.mpf) -> mp.mpf:
    if method == "thre-exp":
        return mp.mpf(1) if t >= 0 else mp.exp(t)
    if method == "thre-sigmoid":
        return 1 / (1 + mp.exp(-t))
    return 1 - mp.exp(-t) / 2 if t >= 0 else mp.exp(t) / 2


@golden("test_threshold.reference")  # stored: tests/golden/references.json.gz
def _reference(method: str, x: list[float], k: int, tau: float) -> tuple[list[float], list[float]]:
    """``(p, 1 - p)`` by bisection on lambda at 60 digits; z = (x - max x) / tau computed exactly."""
    with mp.workdps(60):
        finite = [mp.mpf(v) for v in x if np.isfinite(v)]
        top = max(finite)
        z = [(mp.mpf(v) - top) / mp.mpf(tau) if np.isfinite(v) else None for v in x]
        zf = [v for v in z if v is not None]
        if len(zf) == k:
            return [1.0 if v is not None else 0.0 for v in z], [0.0 if v is not None else 1.0 for v in z]
        lo, hi = min(zf) - 60, max(zf) + 60  # G(lo) > k > G(hi)
        for _ in range(400):
            mid = (lo + hi) / 2
            if sum(_f_mp(method, v - mid) for v in zf) > k:
                lo = mid
            else:
                hi = mid
            if hi - lo < mp.mpf(10) ** -45 * (1 + abs(mid)):
                break
        lam = (lo + hi) / 2
        p = [_f_mp(method, v - lam) if v is not None else mp.mpf(0) for v in z]
        return [float(a) for a in p], [float(1 - a) for a in p]


_RNG = np.random.default_rng(20240917)
CASES = [
    ("normal", list(_RNG.normal(size=7)), 3, 1.0),
    ("normal-k1", list(_RNG.normal(size=6)), 1, 1.0),
    ("normal-kn", list(_RNG.normal(size=5)), 5, 1.0),
    ("k=n-1", list(_RNG.normal(size=5)), 4, 0.7),
    ("n=1", [3.5], 1, 1.0),
    ("spread-1e-12", list(1e-12 * _RNG.normal(size=6)), 2, 1.0),
    ("spread-30", list(30 * _RNG.normal(size=8)), 3, 1.0),
    ("offset-1e6", list(1e6 + _RNG.normal(size=6)), 2, 1.0),
    ("offset-1e6-tau", list(1e6 + _RNG.normal(size=6)), 4, 0.25),
    ("ties", [1.0, 1.0, 1.0, 0.5, 0.5, -1.0], 2, 1.0),
    ("ties-at-kth", [2.0, 0.3, 0.3, 0.3, -1.0], 2, 0.1),
    ("all-equal", [0.25] * 6, 4, 1.0),
    ("masked", [0.3, -np.inf, 1.2, -0.4, -np.inf, 0.9], 2, 1.0),
    ("masked-k=finite", [0.3, -np.inf, 1.2, -np.inf], 2, 1.0),
    ("one-dominant", [5.0, 0.0, -0.1, -0.3], 1, 1.0),
    ("big-gap", [0.0, -0.5, -40.0, -40.5, -41.0], 2, 1.0),
    ("small-tau", list(_RNG.normal(size=6)), 3, 0.02),
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("name", "x", "k", "tau"), CASES, ids=[c[0] for c in CASES])
def test_matches_mpmath(method: str, name: str, x: list[float], k: int, tau: float) -> None:
    result = st.evaluate(np.array(x), k, method, tau=tau)
    ref_p, ref_q = (np.array(a) for a in _reference(method, x, k, tau))
    assert result.ok
    np.testing.assert_allclose(result.weights, ref_p, rtol=0, atol=1e-13)
    np.testing.assert_allclose(result.complement, ref_q, rtol=0, atol=1e-13)
    # Small weights and small complements: relative accuracy too. Not for thre-exp's q, which is
    # small only next to the kink (t -> 0-), where q ~ |t| inherits the absolute error of lambda.
    big = (ref_q > 1e-300) & (method != "thre-exp")
    np.testing.assert_allclose(result.complement[big], ref_q[big], rtol=1e-12)
    small = ref_p > 1e-300
    np.testing.assert_allclose(result.weights[small], ref_p[small], rtol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_complement_is_accurate_when_p_is_near_one(method: str) -> None:
    x = np.array([0.0, -100.0, -101.0, -102.0])
    result = st.evaluate(x, 1, method)
    _, ref_q = _reference(method, list(x), 1, 1.0)
    q0 = result.complement[0]
    assert result.weights[0] == 1.0 and 0 < q0 < 1e-20  # p rounds to 1; q keeps its digits
    assert q0 == pytest.approx(ref_q[0], rel=1e-12)


def test_thre_exp_at_k1_is_softmax() -> None:
    x = np.random.default_rng(1).normal(size=(20, 9)) * 3
    soft = np.exp(x - x.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    np.testing.assert_allclose(st.soft_topk(x, 1, "thre-exp"), soft, rtol=1e-14, atol=1e-16)


def test_thre_laplace_at_k1_is_softmax_only_below_one_half() -> None:
    # Every softmax weight < 1/2: all entries sit below lambda and the Laplace CDF is e^t / 2.
    spread = np.array([0.3, 0.1, 0.0, -0.2, -0.5])
    soft = np.exp(spread) / np.exp(spread).sum()
    assert soft.max() < 0.5
    np.testing.assert_allclose(st.soft_topk(spread, 1, "thre-laplace"), soft, rtol=1e-14)
    # One weight above 1/2: that entry is above lambda and the result is not softmax.
    peaked = np.array([2.0, 0.0, -0.5, -1.0])
    soft = np.exp(peaked) / np.exp(peaked).sum()
    lap = st.soft_topk(peaked, 1, "thre-laplace")
    assert soft[0] > 0.5
    assert abs(lap[0] - soft[0]) > 0.01  # measured: 0.7415 vs softmax 0.7891
    assert lap.sum() == pytest.approx(1.0, abs=1e-15)


def _fd_jacobian(method: str, x: np.ndarray, k: int, tau: float, h: float) -> np.ndarray:
    n = x.shape[-1]
    jac = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = h
        jac[:, j] = (st.soft_topk(x + e, k, method, tau=tau) - st.soft_topk(x - e, k, method, tau=tau)) / (2 * h)
    return jac


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("k", "tau"), [(1, 1.0), (3, 0.5), (5, 2.0)])
def test_jacobian_matches_finite_differences(method: str, k: int, tau: float) -> None:
    x = np.random.default_rng(k).normal(size=7)
    jac = st.jacobian(x, k, method, tau=tau)
    fd = _fd_jacobian(method, x, k, tau, h=1e-6)
    np.testing.assert_allclose(jac, fd, atol=1e-7)
    np.testing.assert_allclose(jac, jac.T, atol=1e-15)
    np.testing.assert_allclose(jac.sum(axis=1), 0.0, atol=1e-14)
    assert np.linalg.eigvalsh(jac).min() > -1e-14


@pytest.mark.parametrize("method", METHODS)
def test_vjp_equals_v_times_jacobian_and_masks(method: str) -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 6))
    x[1, 2] = -np.inf
    v = rng.normal(size=(3, 6))
    jac = st.jacobian(x, 2, method, tau=0.3)
    out = st.vjp(x, 2, v, method, tau=0.3)
    np.testing.assert_allclose(out, np.einsum("bi,bij->bj", v, jac), atol=1e-13)
    assert (jac[1, 2, :] == 0).all() and (jac[1, :, 2] == 0).all()
    assert st.soft_topk(x, 2, method)[1, 2] == 0.0


@pytest.mark.parametrize("method", METHODS)
def test_jacobian_is_zero_not_nan_when_every_derivative_underflows(method: str) -> None:
    x = np.array([0.0, -1.0, -2.0, -3.0])
    jac = st.jacobian(x, 2, method, tau=1e-4)
    assert np.isfinite(jac).all()
    assert np.abs(jac).max() < 1e-100
    assert (st.jacobian(x, 4, method) == 0).all()  # k = n: p = 1 whatever x


def test_thre_exp_jacobian_takes_the_saturated_side_at_the_kink() -> None:
    # k = 3 on [0, 0, log 1/2, log 1/2]: lambda = 0 exactly, the two top entries sit on the kink.
    x = np.array([0.0, 0.0, np.log(0.5), np.log(0.5)])
    result = st.evaluate(x, 3, "thre-exp")
    np.testing.assert_array_equal(result.weights, [1.0, 1.0, 0.5, 0.5])
    np.testing.assert_array_equal(result.complement, [0.0, 0.0, 0.5, 0.5])
    jac = st.jacobian(x, 3, "thre-exp")
    np.testing.assert_array_equal(jac[:2], 0.0)  # d = 0: the saturated side
    np.testing.assert_array_equal(jac[2:, 2:], [[0.25, -0.25], [-0.25, 0.25]])
    # It is the one-sided derivative of raising a top entry (which stays saturated).
    h = 1e-7
    up = (st.soft_topk(x + np.array([h, 0, 0, 0]), 3, "thre-exp") - result.weights) / h
    np.testing.assert_allclose(up, jac[:, 0], atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_float32_path(method: str) -> None:
    x = np.random.default_rng(3).normal(size=(4, 9))
    p64 = st.soft_topk(x, 3, method, tau=0.5)
    p32 = st.soft_topk(x.astype(np.float32), 3, method, tau=0.5)
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, p64, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("scale", [1e-12, 1.0, 30.0, 1e4])
def test_sum_is_exact_to_a_few_ulps(method: str, scale: float) -> None:
    x = np.random.default_rng(11).normal(size=(30, 40)) * scale
    for k in (1, 5, 20, 39):
        p = st.soft_topk(x, k, method)
        assert np.abs(p.sum(axis=-1) - k).max() <= 8 * np.finfo(np.float64).eps * k


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("scale", "tau"), [(1e4, 1e-3), (1e300, 1.0), (1.0, 1e-300)])
def test_huge_spreads_are_finite_and_in_range(method: str, scale: float, tau: float) -> None:
    x = np.random.default_rng(5).normal(size=(10, 12)) * scale
    for k in (1, 4, 11):
        result = st.evaluate(x, k, method, tau=tau)
        p = result.weights
        assert result.ok and np.isfinite(p).all()
        assert p.min() >= 0 and p.max() <= 1
        np.testing.assert_allclose(p.sum(-1), k, atol=8e-16 * k)
        hard = st.soft_topk(x, k, "hard", tau=tau)
        np.testing.assert_allclose(p, hard, atol=1e-12)  # spreads this wide are hard selections


@pytest.mark.parametrize("method", METHODS)
def test_ties_give_bitwise_equal_weights(method: str) -> None:
    x = np.array([[0.7, 0.1, 0.7, 0.7, -0.2, 0.1], [1e6, 1e6, 1e6 - 1, 1e6, 1e6, 1e6 - 1]])
    for k in (1, 2, 3, 5):
        p = st.soft_topk(x, k, method)
        assert p[0, 0] == p[0, 2] == p[0, 3] and p[0, 1] == p[0, 5]
        assert p[1, 0] == p[1, 1] == p[1, 3] == p[1, 4] and p[1, 2] == p[1, 5]


def test_sigmoid_newton_converges_fast_over_all_spreads() -> None:
    rng = np.random.default_rng(13)
    worst = 0
    for scale in (1e-12, 1e-3, 1.0, 5.0, 30.0, 1e3, 1e7, 1e200):
        for k in (1, 3, 9):
            z = _prepare(rng.normal(size=(40, 10)) * scale, k, "thre-sigmoid", 1.0).z
            iters = thre_sigmoid_forward(z, k).aux["iterations"]
            worst = max(worst, int(iters.max()))
    assert worst <= 10 < SIGMOID_MAX_ITER


def test_laplace_brackets_sigmoid_threshold() -> None:
    # F(t - log 2) <= sigmoid(t) <= F(t + log 2): the sigmoid threshold is within log 2 of Laplace's.
    z = _prepare(np.random.default_rng(17).normal(size=(50, 8)) * 4, 3, "thre-sigmoid", 1.0).z
    lam_f = thre_laplace_forward(z, 3).aux["lambda"]
    lam_s = thre_sigmoid_forward(z, 3).aux["lambda"]
    assert np.abs(lam_s - lam_f).max() <= np.log(2)
