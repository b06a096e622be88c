"""The certified float64 fast path of ``weighted-softmax``: taken where its bound proves the accuracy
of the faithful path, and falling back to it, row by row, everywhere else."""

from __future__ import annotations

import numpy as np
import pytest
from test_sequential import ref

import topk_cli as st
from topk_cli.operators import _weighted_softmax_fast as wsf
from topk_cli.operators import weighted_softmax as ws


def _z(rng: np.random.Generator, shape: tuple[int, int], scale: float) -> np.ndarray:
    z = scale * rng.standard_normal(shape)
    return z - z.max(axis=1, keepdims=True)


def test_fast_path_is_taken_on_a_typical_batch_and_agrees_with_the_faithful_one() -> None:
    rng = np.random.default_rng(3)
    z = _z(rng, (8, 200), 1.0)
    fast = ws.weighted_softmax_topk(z, 10)
    slow = ws._ws_faithful(z, 10)
    assert (fast.aux["fast"] == 1).all()
    assert fast.codes().tolist() == ["ok"] * 8
    # the certified bound holds against the faithful result (itself ~1e-15 off) and is small
    assert (np.abs(fast.p - slow.p).max(axis=-1) <= fast.aux["error_estimate"] + 1e-14).all()
    assert fast.aux["error_estimate"].max() <= wsf.FAST_P_BOUND
    np.testing.assert_allclose(fast.q, slow.q, rtol=1e-13, atol=0)
    # the linear rounds feed the same derivatives as the faithful ones
    v = rng.standard_normal(z.shape)
    np.testing.assert_allclose(ws._ws_vjp(fast, z, 10, v), ws._ws_vjp(slow, z, 10, v), rtol=0, atol=1e-12)
    small = z[:2, :6] - z[:2, :6].max(axis=1, keepdims=True)
    jac_fast, jac_slow = ws._ws_jacobian(ws.weighted_softmax_topk(small, 3), small, 3), ws._ws_jacobian(
        ws._ws_faithful(small, 3), small, 3)
    np.testing.assert_allclose(jac_fast, jac_slow, rtol=0, atol=1e-13)
    # and the log-space copies derived for the fast rows equal the stored faithful ones
    every = np.ones(2, dtype=bool)
    fwd_fast, fwd_slow = ws.weighted_softmax_topk(small, 3), ws._ws_faithful(small, 3)
    assert (fwd_fast.aux["fast"] == 1).all() and "lf" not in fwd_fast.aux
    np.testing.assert_allclose(ws._ws_jacobian_log(fwd_fast, small, 3, every),
                               ws._ws_jacobian_log(fwd_slow, small, 3, every), rtol=0, atol=1e-13)


@pytest.mark.parametrize("scale", [10.0, 50.0])
def test_the_vjp_from_the_compact_rounds_matches_the_faithful_one(scale: float) -> None:
    # saturated top entries (the entry of largest |g| is often the top one): the VJP folds rho = e^z / S
    # and c = 1 - s into its updates and keeps c_top = X / S; a mixed batch stores them instead
    rng = np.random.default_rng(8)
    z = _z(rng, (12, 40), scale)
    fast = ws.weighted_softmax_topk(z, 5)
    assert fast.aux["fast"].sum() >= 6
    if (fast.aux["fast"] == 0).any():  # keep the all-fast batch, whose rounds are compact
        z = z[fast.aux["fast"] > 0]
        fast = ws.weighted_softmax_topk(z, 5)
    assert "rho" not in fast.aux and "c" not in fast.aux
    v = rng.standard_normal(z.shape)
    want = ws._ws_vjp(ws._ws_faithful(z, 5), z, 5, v)
    np.testing.assert_allclose(ws._ws_vjp(fast, z, 5, v), want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))
    np.testing.assert_allclose(ws._ws_jacobian(fast, z, 5), ws._ws_jacobian(ws._ws_faithful(z, 5), z, 5), rtol=0,
                               atol=1e-12 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("tau", [1.0, 0.1, 0.01])
def test_the_bound_holds_against_mpmath(tau: float) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 12))
    z = st.scaled_scores(x, 4, tau=tau)
    fast = wsf.ws_fast(z, 4)
    assert fast.aux["fast"].sum() >= 2
    for b in np.flatnonzero(fast.aux["fast"] > 0):
        p_ref, q_ref = ref("weighted-softmax", x[b].tolist(), 4, tau)
        assert np.abs(fast.p[b] - p_ref).max() <= fast.aux["error_estimate"][b]
        np.testing.assert_allclose(fast.q[b], q_ref, rtol=wsf.FAST_Q_BOUND, atol=0)


def test_the_bound_sees_the_gains_on_near_ties() -> None:
    # pairs 1e-10 apart at tau = 0.1, k near n: S - e^{z_i} cancels and the rounds amplify rounding
    # errors; plain float64 ends up to 2e-5 off on some rows. Only rows the bound proves are returned
    # (a bound without the gains e^{z_i} / |S - e^{z_i}| certified rows 1.5e-9 off here)
    rows = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=5)
        order = np.argsort(-x)
        for a, b in zip(order[::2], order[1::2], strict=False):
            x[b] = x[a] - 1e-10 * rng.uniform(0.5, 1.5)
        rows.append(x)
    x = np.array(rows)
    worst = 0.0
    for k in (3, 4):
        fast = wsf.ws_fast(st.scaled_scores(x, k, tau=0.1), k)
        assert fast.aux["fast"].sum() >= 1
        for b in range(len(x)):
            err = np.abs(fast.p[b] - ref("weighted-softmax", x[b].tolist(), k, 0.1)[0]).max()
            worst = max(worst, err)
            if fast.aux["fast"][b]:
                assert err <= fast.aux["error_estimate"][b] <= wsf.FAST_P_BOUND
    assert worst > 1e-9  # float64 really is wrong on some of these rows


def test_rows_the_fast_path_cannot_certify_are_recomputed_faithfully() -> None:
    # ties at tau = 1e-20: 1 - p_3 = 2 e^{-1e20} carries a factor 2 below an ulp of 1e20; the faithful
    # path refuses it, and the fast path (gap 1e20) never sees it
    tiny = [[0.3e-20, -1.2e-20, 0.5e-20], [1.0, 1.0, 2.0], [-0.7e-20, 0.2e-20, 0.0]]
    z = st.scaled_scores(tiny, 2, tau=1e-20)
    with np.errstate(all="ignore"):  # the faithful row's log-space arithmetic, as under the public API
        assert ws.weighted_softmax_topk(z, 2).aux["fast"].tolist() == [1.0, 0.0, 1.0]
    r = st.evaluate(tiny, 2, "weighted-softmax", tau=1e-20)
    assert r.status.tolist() == ["ok", "ill-conditioned", "ok"]
    for b in (0, 2):
        p_ref, q_ref = ref("weighted-softmax", tiny[b], 2, 1e-20)
        np.testing.assert_allclose(r.weights[b], p_ref, rtol=0, atol=1e-13)
        np.testing.assert_allclose(r.complement[b], q_ref, rtol=1e-12)
    # the same ties at tau = 1e-3 (gap 1000, beyond the fast path): exactly 0.25, 0.25, 1.5 in the limit
    r = st.evaluate([1.0, 1.0, 2.0], 2, "weighted-softmax", tau=1e-3)
    assert r.ok and r.weights[0] == r.weights[1]
    np.testing.assert_allclose(r.weights, [0.25, 0.25, 1.5], rtol=0, atol=1e-12)
    # a saturated complement: 1 - p_1 = e^{-1/0.03} / (1 + e^{-1/0.03}) ~ 3e-15; 1 - s would be ~2% off
    z = st.scaled_scores([[1.0, 0.0], [0.0, 1.0]], 1, tau=0.03)
    fwd = ws.weighted_softmax_topk(z, 1)
    assert fwd.aux["fast"].tolist() == [1.0, 1.0]  # carried as a product, the complement stays accurate
    q = st.evaluate([1.0, 0.0], 1, "weighted-softmax", tau=0.03).complement
    np.testing.assert_allclose(q, ref("weighted-softmax", [1.0, 0.0], 1, 0.03)[1], rtol=1e-13)
    # saturated complements at k = 2 (the top entry's 1 - p goes negative in round two): at tau = 0.02
    # (1 - p_1 = e^{-50} after round one) the product keeps it; at tau = 1e-3 (gaps of 1000, beyond
    # the fast path's range) the faithful path returns the limit 1.5, 0.5
    x = [3.0, 2.0, 1.0, 0.0]
    z = st.scaled_scores([x, x], 2, tau=0.02)
    assert ws.weighted_softmax_topk(z, 2).aux["fast"].tolist() == [1.0, 1.0]
    r = st.evaluate(x, 2, "weighted-softmax", tau=0.02)
    p_ref, q_ref = ref("weighted-softmax", x, 2, 0.02)
    np.testing.assert_allclose(r.weights, p_ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(r.complement, q_ref, rtol=1e-12)
    z = st.scaled_scores([x], 2, tau=1e-3)
    assert ws.weighted_softmax_topk(z, 2).aux["fast"].tolist() == [0.0]
    np.testing.assert_allclose(st.soft_topk(x, 2, "weighted-softmax", tau=1e-3), [1.5, 0.5, 0.0, 0.0], atol=1e-12)
    # a masked row is computed faithfully, the others fast
    x = [[0.4, -np.inf, 1.1, -0.3], [0.4, 0.2, 1.1, -0.3]]
    z = st.scaled_scores(x, 2, tau=0.7)
    with np.errstate(all="ignore"):  # masked entries: -inf arithmetic, as under the public API
        fwd = ws.weighted_softmax_topk(z, 2)
    assert fwd.aux["fast"].tolist() == [0.0, 1.0]
    np.testing.assert_allclose(st.soft_topk(x, 2, "weighted-softmax", tau=0.7)[0, [0, 2, 3]],
                               st.soft_topk([0.4, 1.1, -0.3], 2, "weighted-softmax", tau=0.7), rtol=1e-14)


def test_a_failed_row_among_fast_ones_keeps_its_index_status_and_message() -> None:
    # x = c (3, 2, 1, 0), k = 3 near the pole c* = 1.2976759682851599 (the normaliser S of round 3
    # crosses 0): float64 is 1e-8 off there; the fast path must not certify it, the faithful one refuses it
    pole = (1.29767596828515988 * (1.0 + 1e-5) * np.array([3.0, 2.0, 1.0, 0.0])).tolist()
    rng = np.random.default_rng(4)
    x = np.vstack([0.5 * rng.standard_normal((2, 4)), [pole], 0.5 * rng.standard_normal((2, 4))])
    z = st.scaled_scores(x, 3, tau=1.0)
    assert wsf.ws_fast(z, 3).aux["fast"].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    r = st.evaluate(x, 3, "weighted-softmax")
    assert r.status.tolist() == ["ok", "ok", "ill-conditioned", "ok", "ok"]
    (failure,) = r.failures
    assert failure.row == (2,) and failure.level == 3 and "normaliser S" in failure.detail
    for b in (0, 1, 3, 4):
        np.testing.assert_allclose(r.weights[b], ref("weighted-softmax", x[b].tolist(), 3, 1.0)[0], rtol=0, atol=1e-13)


def test_tree_sum_depth_bounds_its_additions() -> None:
    for n in (1, 2, 15, 16, 17, 62, 100, 1000, 1003, 4097):
        x = np.random.default_rng(n).random((2, n))
        np.testing.assert_allclose(wsf._tree_sum(x), x.sum(axis=1), rtol=wsf._tree_sum_depth(n) * 2.0**-53)
    assert wsf._tree_sum_depth(1000) < 40
