"""k and tau per row, any axis, and derivatives with respect to tau and k, over the registry.

A per-row k (or tau) must give exactly what a Python loop over the rows with scalar k and tau
gives: the same bits for the weights, the status, the Jacobian and the VJP.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import topk_cli as st

METHODS = tuple(st.METHODS)
#: Monte-Carlo methods get fewer samples (the same for the batch and the loop: same numbers)
PARAMS: dict[str, dict[str, Any]] = {
    name: ({"samples": 200} if spec.capabilities.monte_carlo else {}) for name, spec in st.METHODS.items()
}


def _batch(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(6, 7))
    x[2, 3] = -np.inf  # a masked entry
    x[4, :2] = x[4, 2]  # a three-way tie
    x[5] *= 40.0  # a wide row
    return x


def _k_for(name: str) -> np.ndarray:
    ks = np.array([1, 2, 3, 2, 5, 6], dtype=np.int64)
    if st.METHODS[name].capabilities.integer_k:
        return ks
    return ks - np.array([0.0, 0.5, 0.0, 0.25, 0.5, 0.0])  # real k per row where the method takes one


def _scalar(k: Any) -> int | float:
    return int(k) if float(k).is_integer() else float(k)


@pytest.mark.parametrize("method", METHODS)
def test_per_row_k_and_tau_equal_a_loop_over_rows(method: str) -> None:
    x = _batch()
    k = _k_for(method)
    tau = np.array([0.7, 0.7, 1.3, 2.0, 0.9, 0.5])
    params = PARAMS[method]
    batch = st.evaluate(x, k, method, tau=tau, logs=True, **params)
    rows = [st.evaluate(x[b], _scalar(k[b]), method, tau=float(tau[b]), logs=True, **params) for b in range(x.shape[0])]
    assert np.array_equal(batch.weights, np.stack([r.weights for r in rows]), equal_nan=True)
    for name in ("log_weights", "log_complement"):
        assert np.array_equal(getattr(batch, name), np.stack([getattr(r, name) for r in rows]), equal_nan=True)
    assert np.array_equal(batch.complement, np.stack([r.complement for r in rows]), equal_nan=True)
    assert [str(s) for s in batch.status] == [str(r.status) for r in rows]
    assert np.array_equal(batch.k, k) and np.array_equal(batch.tau, tau)
    good = [b for b in range(x.shape[0]) if rows[b].ok]
    assert len(good) >= 4, f"{method}: only rows {good} computed"
    v = np.random.default_rng(1).normal(size=x.shape)[good]
    jac = st.jacobian(x[good], k[good], method, tau=tau[good], **params)
    loop = [st.jacobian(x[b], _scalar(k[b]), method, tau=float(tau[b]), **params) for b in good]
    assert np.array_equal(jac, np.stack(loop))
    g = st.vjp(x[good], k[good], v, method, tau=tau[good], **params)
    loop = [st.vjp(x[b], _scalar(k[b]), v[i], method, tau=float(tau[b]), **params) for i, b in enumerate(good)]
    assert np.array_equal(g, np.stack(loop))


@pytest.mark.parametrize("method", METHODS)
def test_uniform_array_k_is_the_scalar_k(method: str) -> None:
    """An array of one repeated k is the scalar k: same bits, and the result reports the scalar."""
    x = _batch(3)[:, :5]
    params = PARAMS[method]
    one = st.evaluate(x, 2, method, tau=0.8, **params)
    many = st.evaluate(x, np.full((6, 1), 2.0), method, tau=np.full(6, 0.8), **params)
    assert np.array_equal(one.weights, many.weights, equal_nan=True)
    assert many.k == 2 and isinstance(many.k, int) and many.tau == 0.8


@pytest.mark.parametrize("method", METHODS)
def test_axis_selects_along_columns(method: str) -> None:
    """``axis=0`` on a tokens x experts matrix is the transpose's rows, transposed back."""
    x = _batch(5)[:, :4]  # 6 tokens x 4 experts: select the top-2 tokens of each expert
    params = PARAMS[method]
    k = 2
    assert np.array_equal(
        st.soft_topk(x, k, method, tau=0.9, axis=0, **params), st.soft_topk(x.T, k, method, tau=0.9, **params).T
    )
    v = np.random.default_rng(2).normal(size=x.shape)
    assert np.array_equal(
        st.vjp(x, k, v, method, tau=0.9, axis=0, **params), st.vjp(x.T, k, v.T, method, tau=0.9, **params).T
    )
    jac = st.jacobian(x, k, method, tau=0.9, axis=0, **params)
    assert jac.shape == (4, 6, 6)
    assert np.array_equal(jac, st.jacobian(x.T, k, method, tau=0.9, **params))


def test_axis_and_k_per_slice() -> None:
    x = np.arange(12.0).reshape(3, 4)
    p = st.soft_topk(x, [1, 2, 3, 1], "hard", axis=0)  # one k per column
    assert p.tolist() == [[0, 0, 1, 0], [0, 1, 1, 0], [1, 1, 1, 1]]
    with pytest.raises(st.InvalidArgumentError, match=r"axis must satisfy -2 <= axis < 2 for x with 2 axes, got 2"):
        st.soft_topk(x, 1, "hard", axis=2)
    with pytest.raises(st.InvalidArgumentError, match=r"k of shape \(3,\) does not broadcast to the batch shape \(4,\)"):
        st.soft_topk(x, [1, 2, 3], "hard", axis=0)


#: straight-through's derivatives are thre-sigmoid's by design, not those of its hard forward (its claim says so)
@pytest.mark.parametrize("method", [m for m in METHODS if not st.METHODS[m].capabilities.monte_carlo
                                    and st.METHODS[m].guarantees.jacobian])
def test_derivative_in_tau_matches_finite_differences(method: str) -> None:
    """``wrt="tau"`` against central differences in tau, row by row, and the Jacobian form against
    the VJP form."""
    x = _batch(7)[:, :6]
    k = np.array([1, 2, 3, 2, 4, 5])
    tau = np.array([0.7, 0.9, 1.3, 2.0, 0.9, 3.0])
    v = np.random.default_rng(4).normal(size=x.shape)
    checked, good, loop = 0, [], []
    for b in range(x.shape[0]):
        r = st.evaluate(x[b], int(k[b]), method, tau=float(tau[b]))
        if not r.ok:
            continue
        g_x, g_tau = st.vjp(x[b], int(k[b]), v[b], method, tau=float(tau[b]), wrt=("x", "tau"))
        assert np.array_equal(g_x, st.vjp(x[b], int(k[b]), v[b], method, tau=float(tau[b])))
        h = 1e-6 * tau[b]
        up = st.soft_topk(x[b], int(k[b]), method, tau=float(tau[b] + h))
        down = st.soft_topk(x[b], int(k[b]), method, tau=float(tau[b] - h))
        fd = float(v[b] @ (up - down)) / (2 * h)
        assert abs(float(g_tau) - fd) <= 1e-6 * max(1.0, abs(fd)), (method, b, float(g_tau), fd)
        d_tau = st.jacobian(x[b], int(k[b]), method, tau=float(tau[b]), wrt="tau")
        assert abs(float(v[b] @ d_tau) - float(g_tau)) <= 1e-12 * max(1.0, abs(fd))
        checked += 1
        good.append(b)
        loop.append(float(g_tau))
    assert checked >= 5, f"{method}: only {checked} rows checked"
    # the batch form is the loop's
    g_tau = st.vjp(x[good], k[good], v[good], method, tau=tau[good], wrt="tau")
    assert g_tau.shape == (len(good),) and g_tau.tolist() == loop


def test_wrt_validation_and_integer_only_k_derivative() -> None:
    x = [1.0, 2.0, 3.0]
    with pytest.raises(st.InvalidArgumentError, match=r"wrt must be one of 'x', 'k', 'tau'"):
        st.vjp(x, 1, [1.0, 0.0, 0.0], "grad", wrt="z")
    with pytest.raises(st.InvalidArgumentError, match=r"wrt names a variable twice"):
        st.vjp(x, 1, [1.0, 0.0, 0.0], "grad", wrt=("x", "x"))
    with pytest.raises(st.InvalidArgumentError, match=r"method 'grad' has no derivative with respect to k"):
        st.vjp(x, 1, [1.0, 0.0, 0.0], "grad", wrt="k")
    with pytest.raises(st.InvalidArgumentError, match=r"method 'grad' has no derivative with respect to k"):
        st.jacobian(x, 1, "grad", wrt=("x", "k"))


def test_per_row_validation_names_the_row() -> None:
    x = np.zeros((2, 3))
    x[1, 1:] = -np.inf
    with pytest.raises(st.InvalidArgumentError, match=r"row \(1,\) has only 1 unmasked entries \(-inf = masked\), fewer than k=2"):
        st.soft_topk(x, [1, 2], "grad")
    with pytest.raises(st.InvalidArgumentError, match=r"k must satisfy 1 <= k <= n \(n=3\) in every row, got 4 at row \(1,\)"):
        st.soft_topk(np.zeros((2, 3)), [1, 4], "grad")
    with pytest.raises(st.InvalidArgumentError, match=r"tau must be a finite number > 0 in every row, got -1.0 at row \(1,\)"):
        st.soft_topk(np.zeros((2, 3)), 1, "grad", tau=[1.0, -1.0])
    with pytest.raises(st.InvalidArgumentError, match=r"tau of shape \(3,\) does not broadcast to the batch shape \(2,\)"):
        st.soft_topk(np.zeros((2, 3)), 1, "grad", tau=[1.0, 2.0, 3.0])


def test_evaluate_sum_per_row_k() -> None:
    x = _batch(9)[:, :5]
    k = np.array([1, 2, 3, 2, 4, 5])
    for method in ("grad", "thre-sigmoid", "hard"):
        total = st.evaluate_sum(x, k, method, tau=0.6)
        for b in range(x.shape[0]):
            one = st.evaluate_sum(x[b], int(k[b]), method, tau=0.6)
            assert total.value[b] == one.value
            assert total.potential is not None and total.potential[b] == one.potential


def test_method_parameters_reach_the_k_derivative() -> None:
    """A Monte-Carlo method's d/dk uses the samples and seed given (the same ones as its weights):
    it is then the exact derivative in k of the estimate, checked by a difference in k."""
    x = np.random.default_rng(0).normal(size=(3, 6))
    params = {"samples": 50, "seed": 3}
    dk = st.jacobian(x, 2.5, "perturbed", wrt="k", **params)
    h = 1e-3  # the estimate is piecewise linear in k between integers: the difference is exact
    fd = (st.soft_topk(x, 2.5 + h, "perturbed", **params) - st.soft_topk(x, 2.5 - h, "perturbed", **params)) / (2 * h)
    np.testing.assert_allclose(dk, fd, atol=1e-9)
    assert not np.allclose(dk, st.jacobian(x, 2.5, "perturbed", wrt="k", samples=50, seed=4))


@pytest.mark.parametrize("method", ["hard", "topk-softmax"])
@pytest.mark.parametrize("low, high", [(1.0, 9.0), (100.0, 199.5)])
def test_kth_largest_per_row_is_each_row_alone(method: str, low: float, high: float) -> None:
    """Both ways of finding each row's k-th largest in one call (a sort of the top few, or a
    partition at every position the batch needs) agree with one row at a time, ties included."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 40, size=(50, 200)).astype(np.float64)  # many ties
    k = rng.uniform(low, high, size=50)
    if st.METHODS[method].capabilities.integer_k:
        k = np.floor(k)
    batch = st.soft_topk(x, k, method)
    for b in range(50):
        assert np.array_equal(batch[b], st.soft_topk(x[b], _scalar(k[b]), method)), b
    assert np.allclose(batch.sum(axis=-1), k, rtol=0, atol=1e-12)


REAL_K_WITH_DK = [m for m, s in st.METHODS.items() if not s.capabilities.integer_k and s.implementation.dk is not None]


@pytest.mark.parametrize("method", REAL_K_WITH_DK)
def test_vjp_in_k_is_v_dot_dp_dk(method: str) -> None:
    """``vjp(wrt="k")`` (a shortcut hook where the method has one) is ``v . dp/dk`` row by row, on
    ordinary rows, on very hard ones (every f' near underflow), at k = #finite, and where
    thre-exp's threshold rounds onto an entry (an integer k with a negligible rest)."""
    rng = np.random.default_rng(21)
    x = rng.normal(size=(8, 9))
    x[1] *= 1e4  # every derivative underflows at tau = 1e-2
    x[2, 5:] = -np.inf  # five finite entries, k = 5 below
    x[3] = [0.0, 0.0, -40.0, -41.0, -45.0, -50.0, -60.0, -70.0, -80.0]  # thre-exp: rest below e^-37
    k = np.array([2.5, 3.0, 5.0, 2.0, 1.0, 0.5, 8.5, 4.0])
    params = PARAMS[method]
    v = rng.normal(size=x.shape)
    tau = 1e-2
    if method == "ot-sinkhorn":  # its iteration cap stops short of the two hard rows
        keep = [0, 2, 4, 5, 6, 7]
        x, k, v, tau = x[keep], k[keep], v[keep], 1.0
    got = st.vjp(x, k, v, method, tau=tau, wrt="k", **params)
    dk = st.jacobian(x, k, method, tau=tau, wrt="k", **params)
    want = np.einsum("bi,bi->b", v, dk)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13 * np.abs(v).max())


def test_tau_for_hardness_takes_a_k_per_row() -> None:
    """An array of one repeated k gives the scalar k's tau to the bit; a k per row is matched too."""
    x = np.random.default_rng(5).normal(size=(20, 8))
    one = st.tau_for_hardness(x, 2, "thre-sigmoid", 0.8)
    many = st.tau_for_hardness(x, np.full(20, 2.0), "thre-sigmoid", 0.8)
    assert one.status == many.status == "ok" and one.tau == many.tau
    per_row = st.tau_for_hardness(x, np.array([1.0, 2.0, 3.0, 2.5] * 5), "thre-sigmoid", 0.8)
    assert per_row.status == "ok" and np.isfinite(per_row.tau) and per_row.tau > 0
