"""``weighted-softmax`` keeps no rounds in its forward pass: the Jacobian and VJP recompute them (the
API's VJP in one fused pass over row blocks), with the bits of the computation that stores them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_same_bits

import topk_cli as st
from topk_cli.errors import NumericalFailureError
from topk_cli.operators import _weighted_softmax_fast as wsf
from topk_cli.operators import weighted_softmax as ws


def _batch(tau: float, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(int(1000 * tau) + k)
    x = rng.standard_normal((23, 40))
    x[0, :3] = x[0, 3]  # ties, with the maximum
    x[1] = np.round(x[1], 1)  # many ties
    x[2, 5] = -np.inf  # masked: faithful
    z = st.scaled_scores(x, k, tau=tau)
    return x, z, rng.standard_normal(x.shape)


def _same(a: st.operators._base.Forward, b: st.operators._base.Forward) -> None:
    for name in ("p", "q"):
        assert_same_bits(getattr(a, name), getattr(b, name), name)
    assert a.codes().tolist() == b.codes().tolist() and a.messages == b.messages
    for name in ("fast", "error_estimate"):
        assert_same_bits(a.aux[name], b.aux[name], name)


@pytest.mark.parametrize(("tau", "k"), [(1.0, 7), (0.2, 3), (0.05, 10)])
def test_the_forward_keeps_no_rounds_and_the_derivatives_recompute_them(tau: float, k: int) -> None:
    _, z, v = _batch(tau, k)
    with np.errstate(all="ignore"):  # masked entries: -inf arithmetic, as under the public API
        _check_both_ways(z, k, v)


def _check_both_ways(z: np.ndarray, k: int, v: np.ndarray) -> None:
    lean, stored = ws.weighted_softmax_topk(z, k), ws._ws_forward(z, k)
    fused, g = ws._ws_forward_vjp(z, k, v)
    assert set(lean.aux) == {"fast", "error_estimate"} and "s" in stored.aux
    fast = lean.aux["fast"] > 0
    assert 0 < fast.sum() < z.shape[0]  # both paths
    _same(lean, stored)
    _same(fused, stored)
    ok = lean.codes() == "ok"
    # faithful rows: the stored-rounds VJP bit for bit; fast rows: the VJP of an all-fast batch of them
    np.testing.assert_array_equal(g[ok & ~fast], ws._ws_vjp(stored, z, k, v)[ok & ~fast])
    sub = stored if fast.all() else ws._ws_forward(z[fast], k)
    np.testing.assert_array_equal(g[fast], ws._ws_vjp(sub, z[fast], k, v[fast]))
    np.testing.assert_array_equal(ws._ws_vjp(lean, z, k, v)[ok], g[ok])
    # the Jacobian from a forward pass without rounds equals the one from stored rounds
    np.testing.assert_array_equal(ws._ws_jacobian(lean, z[ok], k) if ok.all() else ws._ws_jacobian(
        ws.weighted_softmax_topk(z[ok], k), z[ok], k), ws._ws_jacobian(ws._ws_forward(z[ok], k), z[ok], k))


def test_row_blocks_do_not_change_a_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    # several blocks (of one row, the extreme) against one block for the whole batch
    rng = np.random.default_rng(2)
    z = st.scaled_scores(rng.standard_normal((9, 30)), 6, tau=0.3)
    v = rng.standard_normal(z.shape)
    whole, g_whole = wsf.ws_fast_vjp(z, 6, v)
    stored = wsf.ws_fast(z, 6)
    assert 0 < whole.aux["fast"].sum() < 9
    monkeypatch.setattr(wsf, "_FWD_BLOCK", 1)
    monkeypatch.setattr(wsf, "_VJP_BLOCK", 1)
    split, g_split = wsf.ws_fast_vjp(z, 6, v)
    for fwd in (split, wsf.ws_fast(z, 6, store=False), wsf.ws_fast(z, 6)):
        _same(fwd, whole)
    np.testing.assert_array_equal(g_split, g_whole)
    for name in ("s", "f", "inv", "c_top", "top"):
        np.testing.assert_array_equal(wsf.ws_fast(z, 6).aux[name], stored.aux[name])
    # and the fused VJP is the stored-rounds VJP on the certified rows
    cert = whole.aux["fast"] > 0
    want = wsf._ws_vjp_compact(stored, wsf._ws_w(stored, z), 6, -v)
    np.testing.assert_array_equal(g_whole[cert], want[cert])


def test_the_vjp_of_a_batch_with_a_failed_row_reports_the_forward_failure() -> None:
    pole = (1.29767596828515988 * (1.0 + 1e-5) * np.array([3.0, 2.0, 1.0, 0.0])).tolist()
    x = np.vstack([[0.1, 0.4, -0.3, 0.2], [pole], [0.5, -0.2, 0.0, 0.3]])
    with pytest.raises(NumericalFailureError) as info:
        st.vjp(x, 3, np.ones_like(x), "weighted-softmax")
    (failure,) = info.value.failures
    assert failure.row == (1,) and failure.code == "ill-conditioned" and failure.level == 3
    # the other rows' VJP is the one they have alone
    keep = np.array([0, 2])
    np.testing.assert_array_equal(st.vjp(x[keep], 3, np.ones((2, 4)), "weighted-softmax"),
                                  np.vstack([st.vjp(x[b], 3, np.ones(4), "weighted-softmax") for b in keep]))


def _bound_round_by_round(z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fast path's rounds with its bound formed inside each round, as first written (an oracle for
    the record-then-bound form, which must give the same bits): ``p``, ``q``, ``e_p``, certified."""
    bsz, n = z.shape
    u = wsf._UNIT
    rows = np.arange(bsz)
    top, w, w_min, w2 = wsf._ws_weights(z)  # the weights both forms start from; the bound is what is compared
    p, q = np.zeros_like(z), np.ones_like(z)
    s, f = np.empty_like(z), np.empty_like(z)
    eps_w = wsf._EXP_ERR * u
    gamma = 1.01 * (wsf._tree_sum_depth(n) + 1) * u
    r = np.zeros(bsz)  # relative error of the non-top q
    r_top = np.zeros(bsz)  # relative error of q_top
    e_p = np.zeros(bsz)  # absolute error of p
    p_max = np.zeros(bsz)  # bound on max |p|
    q_low = np.ones(bsz)  # lower bound on min_{i != top} |q_i|
    positive = np.ones(bsz, dtype=bool)  # every non-top q > 0 (then A = X)
    all_positive = np.ones(bsz, dtype=bool)  # every q > 0 in every round so far
    err_s_max = np.zeros(bsz)  # largest relative error of an s_i so far
    ok = np.ones(bsz, dtype=bool)
    uu = np.empty_like(z)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # blown-up bounds: not certified
        for t in range(k):
            q_top = q[rows, top]
            np.multiply(q, w, out=uu)
            uu[rows, top] = 0.0
            x_sum = wsf._tree_sum(uu)
            total = x_sum + q_top
            inv = 1.0 / total
            np.multiply(uu, inv[:, None], out=s)
            s[rows, top] = q_top * inv
            np.multiply(w, -inv[:, None], out=f)  # -fl(w / S), exactly
            f += 1.0
            one_minus = 1.0 - q_top
            v_top = x_sum - one_minus
            f[rows, top] = v_top * inv
            c_top = x_sum * inv
            # the bound for this round
            s_abs = np.abs(total)
            shortcut = positive & (total > w2 * (1.0 + 8.0 * u))
            a_sum = x_sum * (1.0 + gamma)
            # computed f_i = fl(1 - fl(w_i fl(1 / S))) >= (1 - (w_2 / S)(1 + 3 u))(1 - u) > 0 there
            g_max = w2 / (total - w2 * (1.0 + 4.0 * u)) * (1.0 + 4.0 * u)
            f_low = (1.0 - w2 * inv * (1.0 + 8.0 * u)) * (1.0 - 4.0 * u)
            slow = np.flatnonzero(~shortcut)
            if slow.size:  # S below some w_i, or some q_i < 0: per-entry passes on those rows
                a_sum[slow], g_max[slow], f_low[slow], f_min = wsf._general_terms(uu[slow], w[slow], f[slow], top[slow],
                                                                            s_abs[slow], gamma)
                positive[slow] &= f_min > 0
            d_x = (1.01 * (r + eps_w + u) + gamma) * a_sum
            d_s = d_x + r_top * np.abs(q_top) + u * s_abs
            rho_s = d_s / s_abs
            err_f = 1.01 * g_max * (eps_w + rho_s + 2.0 * u) + u
            v_abs = np.abs(v_top)
            err_v_top = (d_x + r_top * np.abs(q_top) + u * np.abs(one_minus)) / v_abs
            err_f_top = 1.01 * ((d_x + r_top * np.abs(q_top)) / (s_abs * v_abs) + u * np.abs(one_minus) / v_abs) + 4.0 * u
            kappa = (a_sum + np.abs(q_top)) / s_abs
            p_max += kappa
            s_top = np.abs(q_top * inv)
            err_s_top = r_top * np.abs(c_top) + d_x / s_abs + 3.0 * u
            err_s = r + eps_w + rho_s + 3.0 * u  # relative error of the non-top s_i
            e_p += 1.01 * np.maximum(s_top * err_s_top, (kappa - s_top) * err_s) + u * p_max
            err_s_max = np.maximum(err_s_max, np.maximum(err_s_top, err_s))
            all_positive &= positive & (q_top > 0) & (total > 0)
            r = r + 1.01 * err_f + u
            r_top = r_top + err_f_top + u
            ok &= (err_v_top <= 1e-6) & (rho_s <= 1e-6) & (np.abs(q_top) >= wsf._TINY) & (q_low * w_min >= wsf._TINY)
            q_low = q_low * f_low
            p += s
            q *= f
        # with every q_i > 0 in every round, every s_i >= 0 and p_i = sum_t s_i < 1: the errors of the
        # s_i add up to at most the largest relative one (and the additions to p to k u)
        all_positive &= positive & (q[rows, top] > 0)
        e_p = np.where(all_positive, np.minimum(e_p, 1.01 * err_s_max + k * u), e_p)
        slack = 1.0 + 32.0 * k * u
        e_p *= slack
        certified = (ok & (e_p <= wsf.FAST_P_BOUND) & (slack * r <= wsf.FAST_Q_BOUND) & (slack * r_top <= wsf.FAST_Q_BOUND)
                     & (np.abs(q[rows, top]) >= wsf._TINY) & (q_low * w_min >= wsf._TINY))
    return p, q, e_p, certified


def test_the_bound_formed_after_the_rounds_is_the_bound_formed_in_each_round() -> None:
    # random rows at several tau (shortcut and per-entry rows, certified and not, q < 0 at k near n),
    # near ties 1e-10 apart and saturated rows: every bit of p, q, the bound and the certification
    rng = np.random.default_rng(7)
    batches = [(st.scaled_scores(rng.standard_normal((40, 12)), k, tau=tau), k)
               for tau in (1.0, 0.3, 0.1, 0.02) for k in (1, 4, 11)]
    near = rng.standard_normal((20, 6))
    near[:, 1::2] = near[:, ::2] - 1e-10 * rng.uniform(0.5, 1.5, (20, 3))
    batches += [(st.scaled_scores(near, k, tau=0.1), k) for k in (3, 4, 5)]
    batches += [(st.scaled_scores(10.0 * rng.standard_normal((20, 8)), 2, tau=0.05), 2)]
    # q < 0 (k near n) and gaps near the limit (the underflow guard)
    batches += [(st.scaled_scores(rng.standard_normal((40, n)), k, tau=1.0), k) for n, k in ((5, 5), (7, 6))]
    wide = -np.sort(rng.uniform(0.0, 699.0, (40, 6)), axis=1)
    wide[:, 0] = 0.0
    batches += [(wide, k) for k in (2, 4, 5)]
    certified = 0
    for z, k in batches:
        z = z[np.min(z, axis=1) >= -wsf.FAST_MAX_GAP]
        p, q, e_p, cert = _bound_round_by_round(z, k)
        fwd = wsf.ws_fast(z, k, store=False)
        np.testing.assert_array_equal(fwd.p, p)
        np.testing.assert_array_equal(fwd.q, q)
        np.testing.assert_array_equal(fwd.aux["error_estimate"], e_p)
        np.testing.assert_array_equal(fwd.aux["fast"], cert.astype(np.float64))
        certified += int(cert.sum())
    assert 100 < certified < sum(z.shape[0] for z, _ in batches)
