"""topk-softmax: hard top-(k-1), softmax over the rest (the pseudo-smooth variant).

Oracles: the closed form in mpmath (``reference_wider.topk_softmax``), softmax itself at k = 1,
central finite differences away from swaps, and the jump at a swap.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference_wider as ref

from topk_cli.api import scaled_scores
from topk_cli.operators.topk_softmax import topk_softmax_forward, topk_softmax_jacobian, topk_softmax_vjp

EPS = np.finfo(np.float64).eps
_RNG = np.random.default_rng(11)
CASES = [
    ("normal", list(_RNG.normal(size=7)), 3, 1.0),
    ("k1", list(_RNG.normal(size=6)), 1, 0.5),
    ("k=n", list(_RNG.normal(size=5)), 5, 1.0),
    ("k=n-1", list(_RNG.normal(size=5)), 4, 0.3),
    ("n=1", [2.0], 1, 1.0),
    ("offset-1e6", list(1e6 + _RNG.normal(size=6)), 2, 0.2),
    ("spread-300", list(300 * _RNG.normal(size=6)), 2, 1.0),
    ("masked", [0.2, -np.inf, 0.1, -0.4], 2, 0.5),
]


@pytest.mark.parametrize(("label", "x", "k", "tau"), CASES, ids=[c[0] for c in CASES])
def test_matches_closed_form(label: str, x: list[float], k: int, tau: float) -> None:
    z = scaled_scores(np.asarray(x), k, tau=tau)
    fwd = topk_softmax_forward(z, k)
    want, comp = ref.topk_softmax_with_complement(x, k, tau)
    p_ref = np.array([float(v) for v in want])
    q_ref = np.array([float(v) for v in comp])
    # relative accuracy on p and on 1 - p (tiny weights and weights near 1 alike), up to the
    # condition number |z| of exp: z = (x - max x) / tau is itself rounded
    cond = 1 + np.abs(np.where(np.isfinite(z[0]), z[0], 0.0)).max()
    np.testing.assert_allclose(fwd.p[0], p_ref, rtol=8 * EPS * cond, atol=1e-300)
    np.testing.assert_allclose(fwd.q[0], q_ref, rtol=8 * EPS * cond, atol=1e-300)
    assert abs(fwd.p[0].sum() - k) <= 8 * EPS * k


def test_k1_is_softmax_and_k_n_is_all_ones() -> None:
    z = np.array([[0.0, -0.3, -2.0, -7.0]])
    e = np.exp(z)
    np.testing.assert_allclose(topk_softmax_forward(z, 1).p, e / e.sum(), rtol=4 * EPS)
    np.testing.assert_array_equal(topk_softmax_forward(z, 4).p, np.ones((1, 4)))


def test_jacobian_matches_finite_differences_away_from_swaps() -> None:
    rng = np.random.default_rng(5)
    for _ in range(5):
        z = rng.normal(size=(1, 6))
        z -= z.max()
        k = int(rng.integers(1, 6))
        fwd = topk_softmax_forward(z, k)
        jac = topk_softmax_jacobian(fwd, z, k)[0]
        h = 1e-7
        fd = np.empty((6, 6))
        for j in range(6):
            e = np.zeros((1, 6))
            e[0, j] = h
            fd[:, j] = (topk_softmax_forward(z + e, k).p[0] - topk_softmax_forward(z - e, k).p[0]) / (2 * h)
        np.testing.assert_allclose(jac, fd, rtol=0, atol=1e-7)
        v = rng.normal(size=(1, 6))
        np.testing.assert_allclose(topk_softmax_vjp(fwd, z, k, v)[0], v[0] @ jac, atol=1e-15)


def test_discontinuous_where_the_k_minus_1th_and_kth_entries_swap() -> None:
    """k = 2, x = (0, s, -1): entry 1 jumps from its softmax weight to 1 as s crosses 0."""
    below = topk_softmax_forward(np.array([[0.0, -1e-9, -1.0]]), 2).p[0]
    above = topk_softmax_forward(np.array([[-1e-9, 0.0, -1.0]]), 2).p[0]
    assert above[1] == 1.0
    assert below[1] < 0.75  # e^0 / (e^0 + e^-1) = 0.731
    assert above[1] - below[1] > 0.25


@pytest.mark.parametrize("tau", [1e-20, 1e-300])
def test_soft_part_is_shifted_before_the_log_sum(tau: float) -> None:
    """z = (-1e20, -1e20, 0), k = 2: log(e^z1 + e^z2) = -1e20 + log 2 rounds to -1e20 and the two
    soft weights came out 1 each (sum 3, not k = 2) with status "ok"; exact: (1/2, 1/2, 1)."""
    import topk_cli as st

    res = st.evaluate([0.0, 0.0, 1.0], 2, "topk-softmax", tau=tau)
    assert res.status == "ok"
    np.testing.assert_allclose(res.weights, [0.5, 0.5, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(res.complement, [0.5, 0.5, 0.0], rtol=0, atol=1e-15)
