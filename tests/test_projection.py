"""thre-clip and thre-cube (sparse projections onto the capped simplex).

Oracles: an mpmath bisection on lambda (``reference_wider.projection``), a generic log-barrier
solver of the regularised problem itself (``reference_wider.regularised_argmax``), sparsemax's
sort-based formula, central finite differences and the one-sided derivatives at kinks.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference_wider as ref
from golden_store import golden
from hypothesis import given, settings
from hypothesis import strategies as hst
from strategies import score_vectors

from topk_cli.api import scaled_scores
from topk_cli.operators.projection import thre_clip_forward, thre_cube_forward
from topk_cli.operators.threshold import threshold_jacobian, threshold_vjp

FORWARDS = {"thre-clip": (thre_clip_forward, 1), "thre-cube": (thre_cube_forward, 3)}
EPS = np.finfo(np.float64).eps

_RNG = np.random.default_rng(20261123)
CASES = [
    ("normal", list(_RNG.normal(size=7)), 3, 1.0),
    ("normal-k1", list(_RNG.normal(size=6)), 1, 0.5),
    ("k=n", list(_RNG.normal(size=5)), 5, 1.0),
    ("k=n-1", list(_RNG.normal(size=5)), 4, 0.3),
    ("n=1", [3.5], 1, 1.0),
    ("spread-1e-12", list(1e-12 * _RNG.normal(size=6)), 2, 1.0),
    ("spread-30", list(30 * _RNG.normal(size=8)), 3, 1.0),
    ("offset-1e6", list(1e6 + _RNG.normal(size=6)), 2, 0.2),
    ("ties", [1.0, 0.5, 0.5, 0.5, -1.0], 2, 1.0),
    ("masked", [0.2, -np.inf, 0.1, -0.4, -np.inf], 2, 0.5),
    ("hard-gap", [5.0, 3.0, -2.0, -2.5], 2, 1.0),
    ("huge-spread", list(1e4 * _RNG.normal(size=6)), 2, 1e-3),
    ("many-saturated", list(np.linspace(0, 9, 10)), 7, 0.4),
]


def _run(name: str, x: list[float], k: int, tau: float):
    forward, _ = FORWARDS[name]
    z = scaled_scores(np.asarray(x), k, tau=tau)
    return z, forward(z, k)


@pytest.mark.parametrize("name", FORWARDS)
@pytest.mark.parametrize(("label", "x", "k", "tau"), CASES, ids=[c[0] for c in CASES])
def test_matches_high_precision_bisection(name: str, label: str, x: list[float], k: int, tau: float) -> None:
    _, power = FORWARDS[name]
    _, fwd = _run(name, x, k, tau)
    want = ref.projection(x, k, tau, power=power)
    p_ref = np.array([float(v) for v in want])
    q_ref = np.array([float(1 - v) for v in want])
    # absolute error of a few ulps of 1 (t = z - lambda carries the rounding of z itself)
    np.testing.assert_allclose(fwd.p[0], p_ref, rtol=0, atol=8 * EPS)
    np.testing.assert_allclose(fwd.q[0], q_ref, rtol=0, atol=8 * EPS)
    assert abs(fwd.p[0].sum() - k) <= 8 * EPS * k
    assert np.all((fwd.p >= 0) & (fwd.p <= 1))


def _sparsemax(z: np.ndarray) -> np.ndarray:
    """Martins & Astudillo (2016), Algorithm 1: sort, cumulative sums, support size."""
    s = np.sort(z)[::-1]
    cs = np.cumsum(s)
    idx = np.arange(1, z.size + 1)
    support = idx[1 + idx * s > cs].max()
    thr = (cs[support - 1] - 1) / support
    return np.maximum(z - thr, 0.0)


def test_thre_clip_at_k1_is_sparsemax() -> None:
    rng = np.random.default_rng(7)
    z = rng.normal(size=(50, 9)) * rng.choice([0.1, 1.0, 5.0], size=(50, 1))
    z -= z.max(axis=1, keepdims=True)
    got = thre_clip_forward(z, 1).p
    want = np.array([_sparsemax(row) for row in z])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


@golden("test_projection.regularised_argmax")  # stored: tests/golden/references.json.gz
def _regularised_argmax(z: list[float], k: int, q: float) -> tuple[float, ...]:
    """``reference_wider.regularised_argmax`` (log-barrier interior point, 20 digits), rounded."""
    return tuple(float(v) for v in ref.regularised_argmax(z, k, q, dps=20))


@pytest.mark.parametrize(("z", "k"), [([0.0, -0.5, -1.4, -0.2], 2), ([0.0, -0.9, -0.3], 1)])
def test_thre_cube_solves_the_regularised_problem(z: list[float], k: int) -> None:
    """The closed form equals a direct solution of max <p, z> - (3/4) sum p^(4/3) over D(n, k)."""
    direct = np.array(_regularised_argmax(z, k, 4 / 3))
    np.testing.assert_allclose(thre_cube_forward(np.array([z]), k).p[0], direct, rtol=0, atol=1e-12)


def test_thre_clip_solves_the_regularised_problem() -> None:
    z = [0.0, -0.5, -1.4, -0.2]
    direct = np.array(_regularised_argmax(z, 2, 2.0))
    np.testing.assert_allclose(thre_clip_forward(np.array([z]), 2).p[0], direct, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", FORWARDS)
@settings(max_examples=40, deadline=None)
@given(x=score_vectors(min_n=1, max_n=10, allow_mask=True), data=hst.data())
def test_invariants_on_adversarial_vectors(name: str, x: np.ndarray, data: hst.DataObject) -> None:
    m = int(np.isfinite(x).sum())
    if m == 0:
        return
    k = data.draw(hst.integers(1, m))
    z, fwd = _run(name, list(x), k, data.draw(hst.sampled_from((0.1, 1.0))))
    p = fwd.p[0]
    assert np.all((p >= 0) & (p <= 1))
    assert abs(p.sum() - k) <= 16 * EPS * k
    assert np.all(p[~np.isfinite(z[0])] == 0)
    np.testing.assert_allclose(fwd.q[0], 1 - p, rtol=0, atol=4 * EPS)
    # equal inputs, bitwise-equal outputs; larger inputs never get smaller weights
    order = np.argsort(z[0], kind="stable")
    assert np.all(np.diff(p[order]) >= 0)


@pytest.mark.parametrize("name", FORWARDS)
def test_jacobian_matches_finite_differences(name: str) -> None:
    forward, _ = FORWARDS[name]
    rng = np.random.default_rng(3)
    for _ in range(5):
        z = rng.normal(size=(1, 7))
        z -= z.max()
        k = int(rng.integers(1, 6))
        fwd = forward(z, k)
        jac = threshold_jacobian(fwd, z, k)[0]
        h = 1e-7
        fd = np.empty((7, 7))
        for j in range(7):
            e = np.zeros((1, 7))
            e[0, j] = h
            fd[:, j] = (forward(z + e, k).p[0] - forward(z - e, k).p[0]) / (2 * h)
        np.testing.assert_allclose(jac, fd, rtol=0, atol=1e-6)
        np.testing.assert_allclose(jac, jac.T, atol=1e-15)
        v = rng.normal(size=(1, 7))
        np.testing.assert_allclose(threshold_vjp(fwd, z, k, v)[0], v[0] @ jac, atol=1e-14)


@pytest.mark.parametrize("name", FORWARDS)
def test_kinks_return_the_clipped_side(name: str) -> None:
    """An entry exactly at p = 0 or p = 1 counts as clipped: d = 0, the flat side's derivative."""
    forward, power = FORWARDS[name]
    # k = 1, z = (0, -1, -5): the top entry sits exactly at t = 1 for thre-clip (lambda = -1)
    z = np.array([[0.0, -1.0, -5.0]])
    fwd = forward(z, 1)
    np.testing.assert_array_equal(fwd.p, [[1.0, 0.0, 0.0]])
    assert np.all(fwd.aux["d"] == 0)
    jac = threshold_jacobian(fwd, z, 1)[0]
    assert np.all(jac == 0)
    # the clipped side: moving entry 1 down keeps p constant; moving it up changes p
    h = 1e-7
    down = forward(z - np.array([[0.0, h, 0.0]]), 1).p[0]
    up = forward(z + np.array([[0.0, h, 0.0]]), 1).p[0]
    np.testing.assert_array_equal(down, fwd.p[0])
    assert abs(up[1]) > 0 or power == 3  # thre-cube leaves 0 with zero slope (C1 there)


def test_thre_cube_is_c1_where_entries_leave_zero_but_not_where_they_saturate() -> None:
    """dp/dz is continuous across t = 0 but jumps across t = 1 (the measured smoothness class)."""
    def jac_at(z: np.ndarray, k: int) -> np.ndarray:
        return threshold_jacobian(thre_cube_forward(z, k), z, k)[0]

    # entry 2 crossing p = 0: continuous Jacobian
    base = np.array([[0.0, -0.2, -1.0]])
    lam = thre_cube_forward(base, 1).aux["lambda"][0]
    below = base.copy()
    above = base.copy()
    below[0, 2], above[0, 2] = lam - 1e-9, lam + 1e-9
    assert np.abs(jac_at(below, 1) - jac_at(above, 1)).max() < 1e-6
    # entry 0 crossing p = 1 while entry 1 stays free: the Jacobian jumps by O(1)
    z = np.array([[0.0, -0.8, -0.9]])
    lam = thre_cube_forward(z, 2).aux["lambda"][0]
    below, above = z.copy(), z.copy()
    below[0, 0], above[0, 0] = lam + 1 - 1e-9, lam + 1 + 1e-9
    lam_b = thre_cube_forward(below, 2).aux["lambda"][0]
    assert abs(lam_b - lam) < 1e-6  # the same kink, approached from both sides
    assert np.abs(jac_at(below, 2) - jac_at(above, 2)).max() > 0.1


@pytest.mark.parametrize("name", FORWARDS)
def test_hard_limit_is_exact_for_a_finite_gap(name: str) -> None:
    """Exactly sparse: once the gap x_(k) - x_(k+1) exceeds tau, the result IS hard top-k."""
    forward, _ = FORWARDS[name]
    x = np.array([0.3, 2.0, -1.0, 1.1])
    z = scaled_scores(x, 2, tau=0.5)
    np.testing.assert_array_equal(forward(z, 2).p, [[0.0, 1.0, 0.0, 1.0]])


@pytest.mark.parametrize("method", ["thre-clip", "thre-cube"])
@pytest.mark.parametrize("tau", [1e-20, 1e-300])
def test_breakpoints_beyond_2_53_are_exact(method: str, tau: float) -> None:
    """z = (-1e20, -1e20, 0): lambda = -1e20 - 0.5 is not representable and z - lambda used to
    round to 0, returning (0, 0, 1) (sum 1, not k = 2) with status "ok"; exact: (1/2, 1/2, 1)."""
    import topk_cli as st

    res = st.evaluate([0.0, 0.0, 1.0], 2, method, tau=tau)
    assert res.status == "ok"
    np.testing.assert_allclose(res.weights, [0.5, 0.5, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(res.complement, [0.5, 0.5, 0.0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("method", ["thre-clip", "thre-cube"])
def test_weights_sum_to_k_at_huge_offsets(method: str) -> None:
    import topk_cli as st

    x = np.array([[0.0, 0.0, 1.0, 1.0, 3.0], [2.0, 2.0, 2.0, 0.0, 5.0]])
    for tau in (1e-17, 1e-20, 1e-200):
        for k in (1, 2, 3, 4):
            res = st.evaluate(x, k, method, tau=tau)
            assert (res.status == "ok").all()
            np.testing.assert_allclose(res.weights.sum(axis=1), k, rtol=1e-14)
