"""ot-sinkhorn: entropic OT top-k (Xie et al. 2020) by log-domain Sinkhorn.

Oracles: a converged log-domain Sinkhorn with the full squared cost at 40 digits
(``reference_wider.sinkhorn``); its limit ``thre-sigmoid``; the authors' normalised-cost
formulation (cost divided by its maximum, their eps) computed independently here; central finite
differences of the limit map.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference_wider as ref

from topk_cli.api import scaled_scores
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators.sinkhorn import DEFAULT_TOL, NO_CONVERGENCE, ot_sinkhorn_forward
from topk_cli.operators.threshold import threshold_jacobian
from topk_cli.operators.threshold_sigmoid import thre_sigmoid_forward

_RNG = np.random.default_rng(13)
CASES = [
    ("normal", list(_RNG.normal(size=7)), 3, 1.0),
    ("k1", list(_RNG.normal(size=6)), 1, 0.5),
    ("k=n", list(_RNG.normal(size=5)), 5, 1.0),
    ("k=n-1", list(_RNG.normal(size=5)), 4, 0.7),
    ("n=1", [2.0], 1, 1.0),
    ("offset-1e6", list(1e6 + _RNG.normal(size=6)), 2, 1.0),
    ("ties", [1.0, 0.5, 0.5, -1.0], 2, 1.0),
    ("masked", [0.2, -np.inf, 0.1, -0.4], 2, 0.5),
]


@pytest.mark.parametrize(("label", "x", "k", "tau"), CASES, ids=[c[0] for c in CASES])
def test_matches_converged_high_precision_sinkhorn(label: str, x: list[float], k: int, tau: float) -> None:
    z = scaled_scores(np.asarray(x), k, tau=tau)
    fwd = ot_sinkhorn_forward(z, k)
    assert fwd.codes()[0] == "ok"
    want, _ = ref.sinkhorn(x, k, tau)
    p_ref = np.array([float(v) for v in want])
    # stopped at marginal error <= tol: p is within a few tol of the converged plan
    np.testing.assert_allclose(fwd.p[0], p_ref, rtol=0, atol=4 * DEFAULT_TOL)
    np.testing.assert_allclose(fwd.q[0], 1 - p_ref, rtol=0, atol=4 * DEFAULT_TOL)
    assert abs(fwd.p[0].sum() - k) < 1e-13  # columns are exact after each column update
    fixed = [float(v) for v in ref.sinkhorn_fixed_point(x, k, tau)]
    np.testing.assert_allclose(p_ref, fixed, rtol=0, atol=1e-30)  # the reference checks itself


def test_converged_plan_is_thre_sigmoid_at_the_same_tau() -> None:
    """At convergence the two-anchor plan is sigmoid(z - lambda): the distance is set by tol."""
    rng = np.random.default_rng(2)
    z = rng.normal(size=(100, 12))
    z -= z.max(axis=1, keepdims=True)
    limit = thre_sigmoid_forward(z, 4).p
    for tol in (1e-6, 1e-9, 1e-12):
        fwd = ot_sinkhorn_forward(z, 4, tol=tol, max_iter=10_000)
        assert np.all(fwd.codes() == "ok")
        gap = np.abs(fwd.p - limit).max()
        assert gap <= 4 * tol
    np.testing.assert_allclose(fwd.aux["lambda"], thre_sigmoid_forward(z, 4).aux["lambda"], atol=1e-10)


def _authors_normalised(x: np.ndarray, k: int, eps: float, iters: int) -> np.ndarray:
    """Xie et al.'s construction on one batch: cost (x - y)^2 divided by its batch maximum, their
    eps, log-domain iterations, mass k/n at the upper anchor (their code selects the smallest)."""
    b, n = x.shape
    cost = (x[:, :, None] - np.array([0.0, 1.0])[None, None, :]) ** 2
    cost = cost / cost.max()
    log_mu = np.log(1.0 / n)
    log_nu = np.log(np.array([(n - k) / n, k / n]))
    f = np.zeros((b, n, 1))
    g = np.zeros((b, 1, 2))
    for _ in range(iters):
        f = -eps * np.logaddexp.reduce((g - cost) / eps, axis=2, keepdims=True) + eps * log_mu
        g = -eps * np.logaddexp.reduce((f - cost) / eps, axis=1, keepdims=True) + eps * log_nu
    return n * np.exp((f + g - cost) / eps)[:, :, 1]


def test_authors_normalisation_is_a_temperature_rescaling() -> None:
    """Their eps on a cost normalised by M = max (x - y)^2 is thre-sigmoid at tau = eps * M / 2."""
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 1, size=(3, 8))
    eps = 0.1
    m = max(float(((x - 0.0) ** 2).max()), float(((x - 1.0) ** 2).max()))
    theirs = _authors_normalised(x, 3, eps, 5000)
    tau = eps * m / 2
    ours = ot_sinkhorn_forward(scaled_scores(x, 3, tau=tau), 3, max_iter=5000, tol=1e-13)
    assert np.all(ours.codes() == "ok")
    np.testing.assert_allclose(ours.p, theirs, atol=1e-10)
    np.testing.assert_allclose(ours.p, thre_sigmoid_forward(scaled_scores(x, 3, tau=tau), 3).p, atol=1e-10)


def test_rows_that_do_not_converge_are_reported() -> None:
    z = scaled_scores(np.array([[0.0, -1.0, -2.0, -3.0], [0.0, -0.1, -0.2, -0.3]]), 2, tau=0.02)
    fwd = ot_sinkhorn_forward(z, 2, max_iter=20)
    assert fwd.codes()[0] == NO_CONVERGENCE
    assert fwd.value is not None and fwd.value[0] > DEFAULT_TOL
    assert "max-iter=20" in fwd.messages[0]
    easy = ot_sinkhorn_forward(scaled_scores(np.array([0.0, -0.1, -0.2, -0.3]), 2, tau=1.0), 2, max_iter=20)
    assert easy.codes()[0] == "ok"


def test_jacobian_is_that_of_the_limit_map() -> None:
    rng = np.random.default_rng(8)
    z = rng.normal(size=(1, 6))
    z -= z.max()
    fwd = ot_sinkhorn_forward(z, 2, tol=1e-13, max_iter=10_000)
    jac = threshold_jacobian(fwd, z, 2)[0]
    h = 1e-6
    fd = np.empty((6, 6))
    for j in range(6):
        e = np.zeros((1, 6))
        e[0, j] = h
        fd[:, j] = (thre_sigmoid_forward(z + e, 2).p[0] - thre_sigmoid_forward(z - e, 2).p[0]) / (2 * h)
    np.testing.assert_allclose(jac, fd, atol=1e-8)


@pytest.mark.parametrize(("max_iter", "tol"), [(0, 1e-9), (2.5, 1e-9), (10, 0.0), (10, float("nan")), (True, 1e-9)])
def test_parameters_are_validated(max_iter: object, tol: object) -> None:
    with pytest.raises(InvalidArgumentError):
        ot_sinkhorn_forward(np.zeros((1, 3)), 1, max_iter=max_iter, tol=tol)  # type: ignore[arg-type]


def test_fixed_point_reference_converges_from_a_1e300_wide_bracket() -> None:
    """Three tied entries share k = 2 equally whatever tau; at tau = 1e-300 the reference's float
    bracket starts 1e300 wide, and 200 halvings left it at 0.6675 each (sum 2.0024), which made a
    correct operator row look wrong."""
    for tau in (1e-300, 1e-20, 1e-3):
        p = [float(v) for v in ref.sinkhorn_fixed_point([0.0, 1.0, 1.0, 1.0], 2, tau)]
        np.testing.assert_allclose(p, [0.0, 2 / 3, 2 / 3, 2 / 3], rtol=0, atol=1e-15)


def _exact_stop(z: list[float], k: int, tol: float, max_iter: int) -> int:
    """First iteration whose marginal error is <= tol, on the 40-digit Sinkhorn iterates (the
    potentials' difference ``lambda``; see the module docstring), or 0 if none."""
    import mpmath as mp

    with mp.workdps(40):
        zs = [mp.mpf(v) for v in z]
        lam, m = mp.mpf("0.5"), len(zs)
        for it in range(1, max_iter + 1):
            s = [1 / (1 + mp.exp(lam - v)) for v in zs]
            big_s = mp.fsum(s)
            a0, a1 = (m - k) / (m - big_s), k / big_s
            if max(abs(a0 * (1 - si) + a1 * si - 1) for si in s) <= tol:
                return it
            lam += mp.log(a0) - mp.log(a1)
    return 0


def test_rows_stop_at_the_iteration_exact_arithmetic_stops_at() -> None:
    """Rows of the probe's normal draws (n = 100) whose marginal error crosses tol within 1% of it:
    the log-sum-exp form's estimate, ``expm1(f - f')`` with ``|f|`` about 5, stopped each of
    them one iteration off (early or late); the closed-form estimate stops where the 40-digit
    iterates do."""
    from topk_cli.analysis.probe_grid import draw_scores

    draws = draw_scores(100, 20, dist="normal", seed=0)
    scales = np.geomspace(0.1, 1e4, 13)
    for scale, k, rows in ((scales[4], 2, (12, 19)), (scales[5], 5, (4,)), (scales[5], 10, (10,))):
        z = scaled_scores(scale * draws[list(rows)], 1, tau=1.0)
        fwd = ot_sinkhorn_forward(z, k)
        exact = [_exact_stop(row.tolist(), k, DEFAULT_TOL, 200) for row in z]
        assert fwd.aux["iterations"].tolist() == exact
