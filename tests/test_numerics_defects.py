"""Regression tests of the numpy core's numerical contract: what a derivative may return at extreme
``tau``, what a refusal says, and the costs the operators guard against."""

from __future__ import annotations

import re

import numpy as np
import pytest

import topk_cli as st
from topk_cli.registry import METHODS

ALL = list(METHODS)


@pytest.mark.parametrize("method", ALL)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_derivatives_at_tiny_tau_with_ties_are_refused_not_infinite(method: str, dtype: type) -> None:
    # all entries tied: z = 0 at any tau, d p / d z is finite and d p / d x = (d p / d z) / tau
    x = np.array([[1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]], dtype=dtype)
    if not METHODS[method].implementation.centred:  # z = x / tau: 0 at any tau only where x = 0
        x = x - x.max(axis=1, keepdims=True)
    v = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, -1.0, 0.0, 2.0]], dtype=dtype)
    tau = 1e-310 if dtype == np.float64 else 1e-40
    checked = 0
    for fn in (lambda: st.jacobian(x, 2, method, tau=tau), lambda: st.vjp(x, 2, v, method, tau=tau)):
        try:
            out = fn()
        except st.NumericalFailureError as exc:
            assert [f.row for f in exc.failures] == [(0,), (1,)]
            for f in exc.failures:
                assert f.code == "overflow", f
                found = re.search(r"the smallest tau at which it is representable is (\S+)$", f.detail)
                assert found, f.detail
                smallest = float(found.group(1))
                assert tau < smallest < 1e-300 if dtype == np.float64 else tau < smallest < 1e-36
            checked += 1
            continue
        assert np.isfinite(out).all(), (method, out)  # e.g. hard: the zero derivative
        assert out.dtype == dtype
        checked += 1
    assert checked == 2


@pytest.mark.parametrize("method", [m for m in ALL if m != "hard"])
def test_smallest_usable_tau_of_the_refusal_works(method: str) -> None:
    # tied entries: z = 0 at any tau (x = 0 for a method of the raw scores, z = x / tau)
    x = [2.0, 2.0, 2.0] if METHODS[method].implementation.centred else [0.0, 0.0, 0.0]
    with pytest.raises(st.NumericalFailureError) as info:
        st.jacobian(x, 1, method, tau=1e-311)
    smallest = float(re.search(r"representable is (\S+)$", info.value.failures[0].detail).group(1))
    jac = st.jacobian(x, 1, method, tau=smallest)
    assert np.isfinite(jac).all() and np.abs(jac).max() > 1e300


def test_compute_jacobian_reports_the_overflow_per_row() -> None:
    from conftest import run_cli

    code, out, err = run_cli("compute", "-k", "1", "--tau", "1e-310", "-m", "thre-exp", "--jacobian",
                             "--format", "json", "--values", "3,3,3")
    assert code == 1, (out, err)
    assert "overflow" in out + err


def test_a_spread_beyond_float64_says_so() -> None:
    for method in ("grad", "hard", "thre-exp"):
        with pytest.raises(st.InvalidArgumentError) as info:
            st.soft_topk([-1e308, 1e308], 1, method)
        msg = str(info.value)
        assert msg.startswith("the spread of x overflows float64 (max x - min x = 2e+308 > 1.79769e+308)"), msg
        assert "tau >= inf" not in msg and "rescale the scores: divide x by at least 1.12 " in msg, msg
        # the factor it names is enough
        st.soft_topk(np.array([-1e308, 1e308]) / 1.12, 1, method)
    with pytest.raises(st.InvalidArgumentError, match=r"divide x by at least 1\.12e\+03 to use tau=0\.001"):
        st.soft_topk([1e308, -1e308, 0.0], 1, "grad", tau=1e-3)


def _ref_jacobian(x: np.ndarray, k: int, tau: float, method: str) -> np.ndarray:
    import reference as R

    return np.array([[float(v) for v in row] for row in R.jacobian_threshold(x.tolist(), k, tau, method=method)])


@pytest.mark.parametrize("outlier", [1e7, 1e9, 3e9])
def test_thre_exp_is_accurate_far_below_an_outlier(outlier: float) -> None:
    # x = 1e6 + N(0, 1) determines the bulk's differences to ~1e-10 (1e-9 in z at tau = 0.1), but
    # z = (x - max x) / tau puts the bulk at -outlier / tau, whose ulp (1.9e-6 at 1e10) used to be an
    # absolute error of every z_i - lambda: the Jacobian was 4.4e-7 off (relative to its max) at 1e9
    import reference as R

    rng = np.random.default_rng(0)
    x = 1e6 + rng.standard_normal(50)
    x[7] = outlier
    jac = st.jacobian(x, 25, "thre-exp", tau=0.1)
    ref = _ref_jacobian(x, 25, 0.1, "thre-exp")
    assert np.abs(jac - ref).max() <= 1e-14 * np.abs(ref).max()
    p_ref = np.array([float(v) for v in R.thre_exp(x.tolist(), 25, 0.1)])
    res = st.evaluate(x, 25, "thre-exp", tau=0.1)
    np.testing.assert_allclose(res.weights, p_ref, rtol=1e-14, atol=0)
    assert abs(res.weights.sum() - 25) <= 1e-13
    v = rng.standard_normal(50)
    np.testing.assert_allclose(st.vjp(x, 25, v, "thre-exp", tau=0.1), v @ ref, rtol=0, atol=1e-13 * np.abs(v @ ref).max())


def test_k_and_tau_have_one_wording_everywhere() -> None:
    from topk_cli.analysis.sweep import temperature_sweep
    from topk_cli.properties import verify_properties

    k_msg = r"^k must satisfy 1 <= k <= n \(n=5\), got 7$"
    with pytest.raises(st.InvalidArgumentError, match=k_msg):
        st.soft_topk([1.0, 2.0, 3.0, 4.0, 5.0], 7, "grad")
    # a method defined for a real k says so in the same words
    with pytest.raises(st.InvalidArgumentError, match=r"^k must satisfy 0 < k <= n \(n=5\), got 7$"):
        st.soft_topk([1.0, 2.0, 3.0, 4.0, 5.0], 7, "thre-sigmoid")
    with pytest.raises(st.InvalidArgumentError, match=k_msg):
        verify_properties(["grad"], properties=["range"], vectors=[[1.0, 2.0, 3.0, 4.0, 5.0]], k=7)
    with pytest.raises(st.InvalidArgumentError, match=k_msg):
        temperature_sweep([1.0, 2.0, 3.0, 4.0, 5.0], 7, taus=[1.0])
    tau_msg = r"^tau must be a finite number > 0, got 0\.0$"
    with pytest.raises(st.InvalidArgumentError, match=tau_msg):
        st.soft_topk([1.0, 2.0], 1, tau=0.0)
    with pytest.raises(st.InvalidArgumentError, match=tau_msg):
        verify_properties(["grad"], properties=["range"], vectors=[[1.0, 2.0]], tau=0.0)
    with pytest.raises(st.InvalidArgumentError, match=tau_msg):
        temperature_sweep([1.0, 2.0], 1, taus=[0.0])


def test_one_hard_topk_with_the_bits_of_the_copies_it_replaced() -> None:
    from topk_cli.operators.hard import hard_topk_weights

    def old(x: np.ndarray, k: int) -> np.ndarray:  # the 1-D copy the properties and the sweep carried
        kth = -np.partition(-x, k - 1)[k - 1]
        above = x > kth
        at = x == kth
        return np.where(above, 1.0, np.where(at, (k - above.sum()) / at.sum(), 0.0))

    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(300):
        n = int(rng.integers(1, 12))
        x = rng.integers(-3, 4, size=n).astype(np.float64) * rng.choice([1.0, 1e-300, 1e300])
        if rng.random() < 0.3:
            x[rng.random(n) < 0.3] = -np.inf
        k = int(rng.integers(1, n + 1))
        if np.isfinite(x).sum() < k:
            continue
        np.testing.assert_array_equal(hard_topk_weights(x, k).view(np.int64), old(x, k).view(np.int64))
        checked += 1
    assert checked > 150


@pytest.mark.parametrize(("method", "limit"), [("iterative", 2.5e7), ("weighted-softmax", 1e7)])
def test_sequential_methods_refuse_a_row_that_cannot_end_in_reasonable_time(method: str, limit: float) -> None:
    import time

    start = time.perf_counter()
    with pytest.raises(st.InvalidArgumentError) as info:
        st.soft_topk(np.zeros(20_000), 10_000, method)  # O(n k): minutes
    assert time.perf_counter() - start < 5.0  # refused before any round
    msg = str(info.value)
    assert f"n*k = 2e+08 (n=20000, k=10000) exceeds its limit {limit:.3g}" in msg, msg
    assert f"use k <= {int(limit // 20_000)} at this n" in msg, msg
    with pytest.raises(st.InvalidArgumentError, match="exceeds its limit"):
        st.vjp(np.zeros(20_000), 10_000, np.ones(20_000), method)
    assert "O(n k)" in st.METHODS[method].notes
