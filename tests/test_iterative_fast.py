"""``iterative``'s certified float64 fast path: its bound against mpmath, the share of rows it
certifies, exact ties without the API's averaging, and derivatives without a stored ``q``.

The certification tests can fail: the adversarial rows below include rows whose float64 ``p`` is
off by more than 1e-12 while their ``1 - p`` is relatively accurate (only the bound on ``p`` may
refuse them), and rows whose ``1 - p`` is off by more than 1e-10 relative while ``p`` is accurate
(only the bound on ``1 - p`` may refuse them).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import reference
from mpmath import mp

import topk_cli as st
from topk_cli.errors import NumericalFailureError
from topk_cli.operators import iterative as it


def _adversarial() -> list[tuple[np.ndarray, int]]:
    """``(z, k)`` rows: wide random spreads, near-ties at large gaps, saturating complements."""
    rows = [(z, 10) for z in st.scaled_scores(np.random.default_rng(0).standard_normal((8, 40)), 10, tau=0.02)]
    rows += [(z, 4) for z in st.scaled_scores(np.random.default_rng(1).standard_normal((6, 12)), 4, tau=0.02)]
    for a in (50.0, 200.0, 700.0):
        for gap in (1e-3, 0.05):
            for k in (2, 4):
                rows.append((np.array([0.0, a, a - gap, a - 2 * gap, a / 2, a / 3, 1.0, 2.0]), k))
    return rows


@functools.cache
def _checked_rows() -> list[tuple[bool, float, float, float]]:
    """Per adversarial row: certified, the bound, the error of ``p`` and the largest relative
    error of ``1 - p``, against mpmath at 120 digits (``z`` is passed as exact input, tau 1)."""
    out = []
    for z, k in _adversarial():
        fast = it._it_fast(z[None], k)
        with mp.workdps(120):
            exact = reference.iterative(list(z), k, 1.0, dps=120)
            p_ref = np.array([float(v) for v in exact])
            q_ref = np.array([float(1 - v) for v in exact])
        err_p = float(np.abs(fast.p[0] - p_ref).max())
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_q = float(np.nanmax(np.abs(fast.q[0] - q_ref) / np.abs(q_ref)))
        out.append((bool(fast.aux["fast"][0]), float(fast.aux["error_estimate"][0]), err_p, rel_q))
    return out


def test_certified_rows_are_within_their_bound_of_mpmath() -> None:
    rows = _checked_rows()
    for certified, bound, err_p, rel_q in rows:
        if certified:
            assert err_p <= bound <= 1e-12
            assert rel_q <= 1e-10
    assert sum(r[0] for r in rows) >= 10  # the fast path does take rows of this set
    # the set can catch a loosened certification: float64 p off by > 1e-12 with 1 - p accurate,
    # and 1 - p off by > 1e-10 relative with p accurate; none of them is certified
    assert any(err_p > 1e-12 and rel_q <= 1e-10 for _, _, err_p, rel_q in rows)
    assert any(rel_q > 1e-10 and err_p <= 1e-13 for _, _, err_p, rel_q in rows)


def test_the_bound_certifies_typical_rows_at_small_temperature() -> None:
    # the first-order error of q_i and the error it causes in s_i cancel (|1 - s c d|, not 1 + s d):
    # at tau = 0.1 the true error is ~1e-14, and so is the bound (it was ~3e-12: 0.6 % certified)
    z = st.scaled_scores(np.random.default_rng(3).standard_normal((20, 300)), 10, tau=0.1)
    fast = it._it_fast(z, 10)
    assert fast.aux["fast"].mean() >= 0.9
    assert np.median(fast.aux["error_estimate"]) < 1e-13
    slow = it._it_faithful(z, 10)
    ok = fast.aux["fast"] == 1
    # the faithful path is itself ~1e-14 off here (log-space rounding at |z| ~ 40)
    assert (np.abs(fast.p - slow.p).max(axis=-1)[ok] <= fast.aux["error_estimate"][ok] + slow.aux["error_estimate"][ok]).all()


def test_exact_ties_are_bitwise_equal_without_the_api_averaging() -> None:
    assert it.ITERATIVE.elementwise  # the API does not sort rows to average over ties
    x = [[0.3, 1.2, 1.2, -0.4, 0.3, 0.3, 1.2, 0.9], [2.0, 2.0, -1.0, 0.5, 0.5, 2.0, -1.0, 0.0]]
    for tau in (1.0, 0.1):
        for k in (1, 3, 5):
            r = st.evaluate(x, k, "iterative", tau=tau)
            assert r.ok
            z = st.scaled_scores(x, k, tau=tau)
            fwd = it.iterative_topk(z, k)
            assert (fwd.aux["fast"] == 1).all()
            np.testing.assert_array_equal(r.weights, fwd.p)  # returned as computed
            for b, row in enumerate(x):
                for v in set(row):
                    tied = np.asarray(row) == v
                    assert np.unique(r.weights[b][tied]).size == 1
                    assert np.unique(r.complement[b][tied]).size == 1
    # the faithful path (a masked entry sends the row there) keeps ties bitwise equal too
    masked = [[1.0, 1.0, 0.2, 0.2, -np.inf, 0.7]]
    r = st.evaluate(masked, 2, "iterative", tau=0.5)
    assert r.ok and r.weights[0, 0] == r.weights[0, 1] and r.weights[0, 2] == r.weights[0, 3]


def test_derivatives_without_a_stored_q_match_the_faithful_ones() -> None:
    rng = np.random.default_rng(5)
    for n, k in ((7, 3), (6, 6), (30, 10)):  # k = n: q goes negative
        z = st.scaled_scores(rng.standard_normal((4, n)), k, tau=0.5)
        fast = it._it_fast(z, k)
        slow = it._it_faithful(z, k)
        assert (fast.aux["fast"] == 1).all() and "q" not in fast.aux and "q" in slow.aux
        v = rng.standard_normal(z.shape)
        np.testing.assert_allclose(it._it_vjp(fast, z, k, v), it._it_vjp(slow, z, k, v), rtol=0, atol=1e-12)
        np.testing.assert_allclose(it._it_jacobian(fast, z, k), it._it_jacobian(slow, z, k), rtol=0, atol=1e-12)
    # a batch mixing fast and faithful rows: the fast rows' q is replayed for the merged forward
    x = np.vstack([rng.standard_normal((3, 9)), [[0.5, -np.inf, 1.0, 1.0, 0.2, -0.3, 0.0, 0.9, -1.0]]])
    z = st.scaled_scores(x, 3, tau=0.5)
    mixed = it.iterative_topk(z, 3)
    assert mixed.aux["fast"].tolist() == [1.0, 1.0, 1.0, 0.0]
    v = rng.standard_normal(z.shape)
    vjp = it._it_vjp(mixed, z, 3, v)
    # the forward pass keeps no rounds (O(B n) memory); the derivatives recompute them, and the
    # API's VJP computes forward and VJP in one pass
    assert "s" not in mixed.aux and "s" in it._it_forward(z, 3).aux
    np.testing.assert_array_equal(st.vjp(x, 3, v, "iterative", tau=0.5), vjp / 0.5)
    for b in range(4):
        alone = it.iterative_topk(z[b : b + 1], 3)
        np.testing.assert_array_equal(mixed.p[b], alone.p[0])
        np.testing.assert_allclose(vjp[b], it._it_vjp(alone, z[b : b + 1], 3, v[b : b + 1])[0], rtol=0, atol=1e-14)


def test_the_vjp_of_a_failed_row_reports_the_forward_failure() -> None:
    # the fused forward + VJP must not turn a refused row into a derivative error
    with pytest.raises(NumericalFailureError) as info:
        st.vjp([[2.0, 1.0, 2.0, 0.0]], 2, [[1.0, 0.0, 0.0, 0.0]], "iterative", tau=1e-20)
    (failure,) = info.value.failures
    assert failure.code == "ill-conditioned" and failure.detail.startswith("iterative: step")


def test_the_fused_forward_and_vjp_agree_with_the_stored_rounds() -> None:
    # rows certified and not (recomputed faithfully) in one all-finite batch, several row blocks
    z = st.scaled_scores(np.random.default_rng(1).standard_normal((6, 12)), 4, tau=0.02)
    z = np.vstack([z, st.scaled_scores(np.random.default_rng(6).standard_normal((6000, 12)), 4, tau=0.5)])
    v = np.random.default_rng(7).standard_normal(z.shape)
    fwd, out = it._it_forward_vjp(z, 4, v)
    stored = it._it_forward(z, 4)
    assert 0 < stored.aux["fast"].sum() < z.shape[0] and "s" not in fwd.aux
    np.testing.assert_array_equal(fwd.p, stored.p)
    np.testing.assert_array_equal(fwd.aux["fast"], stored.aux["fast"])
    np.testing.assert_allclose(out, it._it_vjp(stored, z, 4, v), rtol=0, atol=1e-14)
