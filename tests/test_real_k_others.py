"""Real k, one per row, for hard, ot-sinkhorn and perturbed (the operator functions on ``z``).

Oracles: ``reference.hard_real`` (sort in mpmath), ``reference.sinkhorn_real`` (log-domain Sinkhorn
with the full squared cost at 40 digits, k exact) and ``reference.sinkhorn_real_dk`` (central
differences in k of the mpmath fixed point), ``reference.perturbed_real`` (quadrature of the two
neighbouring integer k); the integer-k functions as they were before real k (bitwise); finite
differences in k and z; and, for Monte Carlo, the identity ``T_k = (c - k) T_{c-1} + (k - c + 1) T_c``
(``c = ceil(k)``) sample by sample, so that a real-k estimate is the interpolation of two integer-k
estimates with the same seed.
"""

from __future__ import annotations

import numpy as np
import perturbed_old
import pytest
import reference as ref
import reference_wider

import topk_cli.operators.perturbed as pert
from topk_cli.operators._base import FloatArray, Forward
from topk_cli.operators.hard import HARD, hard_topk, hard_topk_dk, hard_topk_weights
from topk_cli.operators.sinkhorn import DEFAULT_TOL, OT_SINKHORN, ot_sinkhorn_dk, ot_sinkhorn_forward
from topk_cli.operators.threshold import threshold_jacobian, threshold_vjp


def _z(x: FloatArray) -> FloatArray:
    """``z`` as the API passes it: each row's largest finite entry is 0."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    top = np.where(np.isfinite(x), x, -np.inf).max(axis=1, keepdims=True)
    return x - top


def _batch(rng: np.random.Generator, b: int, n: int, *, ties: bool = True, masks: bool = True) -> FloatArray:
    x = rng.normal(size=(b, n))
    if ties:
        x[: b // 2] = np.round(x[: b // 2] * 2) / 2  # many ties, some straddling ceil(k)
    if masks:
        for r in range(0, b, 3):
            x[r, rng.choice(n, size=rng.integers(0, n // 2 + 1), replace=False)] = -np.inf
    return _z(x)


def _real_ks(rng: np.random.Generator, z: FloatArray) -> FloatArray:
    """One real k per row in (0, m], with integers, k < 1 and k = m among them."""
    m = np.isfinite(z).sum(axis=1)
    k = rng.uniform(0.0, 1.0, size=m.shape) * m
    k[::5] = np.ceil(k[::5])  # integer values
    k[1::7] = m[1::7]  # k = m
    k[2::7] = rng.uniform(0.01, 1.0, size=k[2::7].shape)  # k < 1
    return np.maximum(k, 1e-3)


def _hard_before(z: FloatArray, k: int) -> Forward:
    """``hard_topk`` as it was before real k (integer k only)."""
    n = z.shape[-1]
    kth = np.partition(z, n - k, axis=-1)[..., n - k : n - k + 1]
    above = z > kth
    at = z == kth
    share = (k - above.sum(axis=-1, keepdims=True)) / at.sum(axis=-1, keepdims=True)
    at_share = np.multiply(at, share)
    return Forward(p=np.add(above, at_share), q=np.subtract(~above, at_share))


# ---------------------------------------------------------------------------------------------
# hard


@pytest.mark.parametrize(
    ("x", "k", "want"),
    [
        ([3.0, 1.0, 2.0, 2.0], 2.5, [1.0, 0.0, 0.75, 0.75]),
        ([3.0, 1.0, 2.0, 2.0], 1.5, [1.0, 0.0, 0.25, 0.25]),  # the tie straddles ceil(k) = 2
        ([3.0, 1.0, 2.0, 2.0], 0.5, [0.5, 0.0, 0.0, 0.0]),  # k < 1
        ([2.0, 2.0, 0.0], 0.5, [0.25, 0.25, 0.0]),  # k < 1 on a tied top
        ([3.0, 2.0, 2.0, 2.0, 1.0], 2.5, [1.0, 0.5, 0.5, 0.5, 0.0]),  # 1.5 shared by three
        ([3.0, -np.inf, 2.0, 1.0], 2.5, [1.0, 0.0, 1.0, 0.5]),  # masked
        ([3.0, -np.inf, 2.0], 2.0, [1.0, 0.0, 1.0]),  # k = m
        ([3.0, -np.inf, 2.0], 1.75, [1.0, 0.0, 0.75]),
    ],
)
def test_hard_real_k_hand_computed(x: list[float], k: float, want: list[float]) -> None:
    z = _z(np.array(x))
    fwd = hard_topk(z, np.array([k]))
    np.testing.assert_array_equal(fwd.p[0], want)
    np.testing.assert_array_equal(fwd.q[0], 1.0 - np.array(want))
    np.testing.assert_array_equal([float(v) for v in ref.hard_real(x, k)], want)


def test_hard_real_k_matches_the_reference() -> None:
    rng = np.random.default_rng(0)
    z = _batch(rng, 60, 7)
    k = _real_ks(rng, z)
    fwd = hard_topk(z, k)
    checked = 0
    for r in range(z.shape[0]):
        want = np.array([float(v) for v in ref.hard_real(list(z[r]), float(k[r]))])
        np.testing.assert_allclose(fwd.p[r], want, rtol=0, atol=2e-16)
        np.testing.assert_allclose(fwd.q[r], 1 - want, rtol=0, atol=2e-16)
        assert abs(fwd.p[r].sum() - k[r]) <= 4e-16 * 7
        checked += 1
    assert checked == 60


def test_hard_rows_alone_and_integer_k_are_bitwise() -> None:
    rng = np.random.default_rng(1)
    z = _batch(rng, 40, 9)
    k = _real_ks(rng, z)
    whole = hard_topk(z, k)
    dk = hard_topk_dk(whole, z, k)
    for r in range(z.shape[0]):
        alone = hard_topk(z[r : r + 1], k[r : r + 1])
        np.testing.assert_array_equal(whole.p[r], alone.p[0])
        np.testing.assert_array_equal(whole.q[r], alone.q[0])
        np.testing.assert_array_equal(dk[r], hard_topk_dk(alone, z[r : r + 1], k[r : r + 1])[0])
    # the int path is what it was, and an array of that integer gives the same bits
    checked = 0
    for zz in (_batch(rng, 200, 30, masks=False), np.round(_batch(rng, 200, 30, masks=False))):
        for kk in (1, 2, 7, 15, 29, 30):
            before = _hard_before(zz, kk)
            for fwd in (hard_topk(zz, kk), hard_topk(zz, np.full(200, float(kk)))):
                np.testing.assert_array_equal(fwd.p, before.p)
                np.testing.assert_array_equal(fwd.q, before.q)
                checked += 1
    assert checked == 24


def test_hard_dk_is_the_derivative_in_k() -> None:
    rng = np.random.default_rng(2)
    z = _batch(rng, 50, 8)
    k = _real_ks(rng, z)
    h = 1e-6
    below = hard_topk(z, k - h).p
    dk = hard_topk_dk(hard_topk(z, k), z, k)
    inner = (np.ceil(k + h) == np.ceil(k)) & (k - h > 0)  # not at an integer: central differences
    assert inner.sum() >= 25
    fd = (hard_topk(z[inner], k[inner] + h).p - below[inner]) / (2 * h)
    np.testing.assert_allclose(dk[inner], fd, rtol=0, atol=1e-9)
    ints = (k == np.round(k)) & (k - h > 0)  # at an integer: the derivative from below
    assert ints.sum() >= 10
    fd = (hard_topk(z[ints], k[ints]).p - below[ints]) / h
    np.testing.assert_allclose(dk[ints], fd, rtol=0, atol=1e-9)
    np.testing.assert_allclose(dk.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    assert np.all(dk[~np.isfinite(z)] == 0)
    # an int k: the k-th entry's group
    np.testing.assert_array_equal(hard_topk_dk(None, _z(np.array([3.0, 2.0, 2.0, 1.0])), 2), [[0, 0.5, 0.5, 0]])  # type: ignore[arg-type]
    assert HARD.row_k and HARD.dk is hard_topk_dk


def test_hard_weights_broadcast_a_real_k_per_slice() -> None:
    x = np.array([[[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], [[1.0, 1.0, 0.0], [2.0, -np.inf, 1.0]]])
    k = np.array([[1.5], [0.5]])  # broadcast to x.shape[:-1] = (2, 2)
    got = hard_topk_weights(x, k)
    want = [[[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]], [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(hard_topk_weights(x[0], 2), [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])


# ---------------------------------------------------------------------------------------------
# ot-sinkhorn

SINKHORN_CASES = [
    ([0.3, -0.2, 1.0, 0.1, -1.0], 2.5, 1.0),
    ([0.3, -0.2, 1.0, 0.1, -1.0], 0.3, 1.0),  # k < 1
    ([0.3, -0.2, 1.0, 0.1, -1.0], 4.9, 0.7),
    ([0.3, -0.2, 1.0, 0.1, -1.0], 5.0, 1.0),  # k = m: every entry selected
    ([1.0, 0.5, 0.5, -1.0], 1.5, 1.0),  # ties
    ([0.2, -np.inf, 0.1, -0.4], 1.25, 0.5),  # masked
]


def test_sinkhorn_real_k_matches_high_precision_sinkhorn() -> None:
    checked = 0
    for x, kk, tau in SINKHORN_CASES:
        fwd = ot_sinkhorn_forward(_z(np.array(x)) / tau, np.array([kk]))
        assert fwd.codes()[0] == "ok"
        want = np.array([float(v) for v in ref.sinkhorn_real(x, kk, tau)])
        # stopped at marginal error <= tol: p is within a few tol of the converged plan
        np.testing.assert_allclose(fwd.p[0], want, rtol=0, atol=4 * DEFAULT_TOL)
        np.testing.assert_allclose(fwd.q[0], 1 - want, rtol=0, atol=4 * DEFAULT_TOL)
        assert abs(fwd.p[0].sum() - kk) < 1e-13
        checked += 1
    assert checked == len(SINKHORN_CASES)


def test_sinkhorn_rows_alone_and_integer_k_are_bitwise() -> None:
    rng = np.random.default_rng(4)
    z = _batch(rng, 30, 8)
    k = _real_ks(rng, z)
    whole = ot_sinkhorn_forward(z, k)
    assert np.all(whole.codes() == "ok")
    for r in range(z.shape[0]):
        alone = ot_sinkhorn_forward(z[r : r + 1], k[r : r + 1])
        np.testing.assert_array_equal(whole.p[r], alone.p[0])
        np.testing.assert_array_equal(whole.q[r], alone.q[0])
        np.testing.assert_array_equal(whole.aux["lambda"][r], alone.aux["lambda"][0])
    zz = _batch(rng, 50, 12, masks=False)
    checked = 0
    for kk in (1, 3, 6, 11, 12):
        a, b = ot_sinkhorn_forward(zz, kk), ot_sinkhorn_forward(zz, np.full(50, float(kk)))
        for name in ("p", "q"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        for name in ("lambda", "d", "iterations", "marginal_error"):
            np.testing.assert_array_equal(a.aux[name], b.aux[name])
        checked += 1
    assert checked == 5


def test_sinkhorn_real_k_jacobian_and_vjp_match_finite_differences() -> None:
    rng = np.random.default_rng(5)
    z = _z(rng.normal(size=(4, 6)))
    k = np.array([0.4, 1.5, 2.75, 5.2])
    fwd = ot_sinkhorn_forward(z, k, tol=1e-13, max_iter=10_000)
    jac = OT_SINKHORN.jacobian(fwd, z, k)
    h = 1e-6
    checked = 0
    for j in range(6):
        e = np.zeros_like(z)
        e[:, j] = h
        up = ot_sinkhorn_forward(z + e, k, tol=1e-13, max_iter=10_000).p
        dn = ot_sinkhorn_forward(z - e, k, tol=1e-13, max_iter=10_000).p
        np.testing.assert_allclose(jac[:, :, j], (up - dn) / (2 * h), rtol=0, atol=1e-8)
        checked += 1
    assert checked == 6
    v = rng.normal(size=z.shape)
    np.testing.assert_allclose(threshold_vjp(fwd, z, k, v), np.einsum("bi,bij->bj", v, jac), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(jac, threshold_jacobian(fwd, z, k))


def test_sinkhorn_dk_matches_the_fixed_point_derivative() -> None:
    cases = [c for c in SINKHORN_CASES if c[1] < sum(np.isfinite(c[0]))]
    assert len(cases) == 5
    for x, kk, tau in cases:
        z, k = _z(np.array(x)) / tau, np.array([kk])
        fwd = ot_sinkhorn_forward(z, k)
        dk = ot_sinkhorn_dk(fwd, z, k)
        want = np.array([float(v) for v in ref.sinkhorn_real_dk(x, kk, tau)])
        np.testing.assert_allclose(dk[0], want, rtol=0, atol=1e-12)
        # and the library's own forward, differenced in k
        h = 1e-5
        up = ot_sinkhorn_forward(z, k + h).p
        dn = ot_sinkhorn_forward(z, k - h).p
        np.testing.assert_allclose(dk, (up - dn) / (2 * h), rtol=0, atol=1e-7)
    assert OT_SINKHORN.row_k and OT_SINKHORN.dk is ot_sinkhorn_dk


def test_sinkhorn_dk_at_k_equal_m_is_the_limit_from_below() -> None:
    x = [0.3, -0.2, 1.0, 0.1, -1.0]
    z = _z(np.array([[*x, -np.inf], [*x[:2], -np.inf, *x[2:]]]))
    k = np.array([5.0, 5.0])
    fwd = ot_sinkhorn_forward(z, k)
    dk = ot_sinkhorn_dk(fwd, z, k)
    near = ot_sinkhorn_forward(z, k - 1e-9)
    assert np.all(near.codes() == "ok")
    np.testing.assert_allclose(dk, ot_sinkhorn_dk(near, z, k - 1e-9), rtol=0, atol=1e-8)
    assert dk[0, 5] == 0.0 and dk[1, 2] == 0.0
    np.testing.assert_array_equal(dk[1, [0, 1, 3, 4, 5]], dk[0, :5])  # masking is removing
    # a threshold halfway between two entries 3000 apart: every d_i = p_i (1 - p_i) underflows,
    # the ratios do not (equal distances: equal shares)
    hard = np.array([[0.0, -3000.0, -6000.0]])
    f = Forward(p=np.array([[1.0, 0.0, 0.0]]), q=np.array([[0.0, 1.0, 1.0]]), aux={"lambda": np.array([-1500.0])})
    np.testing.assert_array_equal(ot_sinkhorn_dk(f, hard, np.array([1.0])), [[0.5, 0.5, 0.0]])


# ---------------------------------------------------------------------------------------------
# perturbed


def _same_forward(a: Forward, b: Forward) -> None:
    np.testing.assert_array_equal(a.p, b.p)
    np.testing.assert_array_equal(a.q, b.q)
    np.testing.assert_array_equal(a.aux["stderr"], b.aux["stderr"])
    np.testing.assert_array_equal(a.aux["potential"], b.aux["potential"])


def test_perturbed_integer_k_is_bitwise_what_it_was() -> None:
    rng = np.random.default_rng(6)
    z = _batch(rng, 9, 8, ties=False)
    checked = 0
    for k in (1, 2, 4):  # at most the fewest unmasked entries of a row
        before = perturbed_old.perturbed_forward(z, k, samples=200, seed=3)
        _same_forward(pert.perturbed_forward(z, k, samples=200, seed=3), before)
        _same_forward(pert.perturbed_forward(z, np.full(9, float(k)), samples=200, seed=3), before)
        checked += 1
    assert checked == 3


def test_perturbed_rows_alone_and_chunks_are_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    z = _batch(rng, 12, 9, ties=False)
    k = _real_ks(rng, z)
    whole = pert.perturbed_forward(z, k, samples=100, seed=1)
    dk, se = pert.perturbed_dk_with_stderr(z, k, samples=100, seed=1)
    for r in range(z.shape[0]):
        alone = pert.perturbed_forward(z[r : r + 1], k[r : r + 1], samples=100, seed=1)
        _same_forward(alone, Forward(p=whole.p[r : r + 1], q=whole.q[r : r + 1],
                                     aux={name: whole.aux[name][r : r + 1] for name in ("stderr", "potential")}))
        dk_r, se_r = pert.perturbed_dk_with_stderr(z[r : r + 1], k[r : r + 1], samples=100, seed=1)
        np.testing.assert_array_equal(dk_r[0], dk[r])
        np.testing.assert_array_equal(se_r[0], se[r])
    monkeypatch.setattr(pert, "_BLOCK", 64)  # one row's samples exceed a block: sample chunks
    monkeypatch.setattr(pert, "_NOISE_BUDGET", 300)
    _same_forward(pert.perturbed_forward(z, k, samples=100, seed=1), whole)


def test_perturbed_real_k_is_the_interpolation_of_its_integer_neighbours() -> None:
    """``T_k = (c - k) T_{c-1} + (k - c + 1) T_c`` sample by sample, the same noise for every k."""
    rng = np.random.default_rng(8)
    z = _z(rng.normal(size=(1, 7)))
    v = rng.normal(size=z.shape)
    checked = 0
    for kk in (0.3, 1.5, 2.25, 3.9, 6.5):
        c = int(np.ceil(kk))
        frac = kk - c + 1
        k = np.array([kk])

        def both(fn: str, kk: float = kk, c: int = c, frac: float = frac) -> tuple[FloatArray, FloatArray]:
            run = {
                "p": lambda kv: pert.perturbed_forward(z, kv, samples=200, seed=4).p,
                "jac": lambda kv: pert.perturbed_jacobian(None, z, kv, samples=200, seed=4),  # type: ignore[arg-type]
                "vjp": lambda kv: pert.perturbed_vjp(None, z, kv, v, samples=200, seed=4),  # type: ignore[arg-type]
            }[fn]
            lower = run(c - 1) if c > 1 else 0.0
            return run(np.array([kk])), (1 - frac) * lower + frac * run(c)

        for fn in ("p", "jac", "vjp"):
            got, want = both(fn)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)
            checked += 1
        dk = pert.perturbed_dk(None, z, k, samples=200, seed=4)  # type: ignore[arg-type]
        lower = pert.perturbed_forward(z, c - 1, samples=200, seed=4).p if c > 1 else 0.0
        np.testing.assert_allclose(dk, pert.perturbed_forward(z, c, samples=200, seed=4).p - lower, rtol=0, atol=1e-14)
    assert checked == 15


def test_perturbed_dk_is_the_derivative_in_k_of_the_estimate() -> None:
    rng = np.random.default_rng(9)
    z = _batch(rng, 10, 6, ties=False)
    k = _real_ks(rng, z)
    dk, se = pert.perturbed_dk_with_stderr(z, k, samples=300, seed=2)
    h = 1e-5
    inner = (np.ceil(k + h) == np.ceil(k)) & (k - h > 0)
    assert inner.sum() >= 5
    up = pert.perturbed_forward(z[inner], k[inner] + h, samples=300, seed=2).p
    dn = pert.perturbed_forward(z[inner], k[inner] - h, samples=300, seed=2).p
    np.testing.assert_allclose(dk[inner], (up - dn) / (2 * h), rtol=0, atol=1e-9)
    ints = (k == np.round(k)) & (k - h > 0)  # from below at an integer
    assert ints.sum() >= 2
    dn = pert.perturbed_forward(z[ints], k[ints] - h, samples=300, seed=2).p
    np.testing.assert_allclose(dk[ints], (pert.perturbed_forward(z[ints], k[ints], samples=300, seed=2).p - dn) / h,
                               rtol=0, atol=1e-9)
    np.testing.assert_allclose(dk.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    fin = np.isfinite(z)
    assert np.all(dk[~fin] == 0) and np.all(se[~fin] == 0) and np.all(se[fin] >= 1 / 150)
    assert pert.PERTURBED.row_k and pert.PERTURBED.dk is pert.perturbed_dk


def test_perturbed_real_k_at_tiny_noise_is_the_hard_top_k() -> None:
    rng = np.random.default_rng(10)
    z = _batch(rng, 20, 8, ties=False) / 1e-6  # tau = 1e-6: the noise never reorders
    k = _real_ks(rng, z)
    np.testing.assert_allclose(pert.perturbed_forward(z, k, samples=100, seed=0).p, hard_topk(z, k).p,
                               rtol=0, atol=1e-15)
    np.testing.assert_array_equal(pert.perturbed_dk(None, z, k, samples=100, seed=0),  # type: ignore[arg-type]
                                  hard_topk_dk(None, z, k))  # type: ignore[arg-type]


def test_perturbed_real_k_matches_the_exact_expectation_within_standard_error() -> None:
    """4.5 standard errors over the 8 weights and 8 derivatives compared (fixed seed)."""
    x = [0.3, -0.2, 1.1, 0.9]
    z = _z(np.array([x, x]))
    k = np.array([1.4, 2.7])
    fwd = pert.perturbed_forward(z, k, samples=20_000, seed=1)
    dk, dk_se = pert.perturbed_dk_with_stderr(z, k, samples=20_000, seed=1)
    exact = {c: np.array([float(v) for v in reference_wider.perturbed_masked(x, c, dps=15)]) for c in (1, 2, 3)}
    checked = 0
    for r, kk in enumerate(k):
        c = int(np.ceil(kk))
        frac = kk - c + 1
        lower = exact[c - 1] if c > 1 else 0.0
        want = (1 - frac) * lower + frac * exact[c]
        if r == 0:  # the reference's own interpolation
            np.testing.assert_allclose(want, [float(v) for v in ref.perturbed_real(x, kk, dps=15)], atol=1e-13)
        assert np.all(np.abs(fwd.p[r] - want) <= 4.5 * fwd.aux["stderr"][r])
        assert np.all(np.abs(dk[r] - (exact[c] - lower)) <= 4.5 * dk_se[r])
        checked += 1
    assert checked == 2
