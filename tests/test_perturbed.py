"""perturbed: Monte Carlo E[T_k(x + tau Z)] (Berthet et al. 2020) with standard errors.

Oracle: the exact expectation on small n, ``int phi(t - z_i) P(at most k - 1 others exceed t) dt``
by mpmath quadrature, and its exact Jacobian (``reference_wider``). A Monte Carlo answer is
judged within its own standard error: a bound of 4.5 standard errors over the ~40 compared
numbers here fails by chance with probability about 3e-4, and the seeds are fixed, so the test
is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference_wider as ref
from golden_store import golden

import topk_cli as st
from topk_cli.api import scaled_scores
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators.perturbed import (
    PERTURBED,
    perturbed_forward,
    perturbed_jacobian_with_stderr,
    perturbed_potential,
    perturbed_vjp,
)
from topk_cli.registry import MONTE_CARLO_STDERRS

Z_BOUND = 4.5
CASES = [
    ([0.3, -0.2, 1.1], 1, 1.0),
    ([0.3, -0.2, 1.1, 0.9], 2, 1.0),
    ([0.0, 0.5, -0.4, 0.2], 3, 0.5),
]


@golden("test_perturbed.exact_weights")  # stored: tests/golden/references.json.gz
def _exact_weights(x: list[float], k: int, tau: float) -> tuple[float, ...]:
    """``E[T_k(x + tau Z)]`` by quadrature (``reference_wider.perturbed``, 15 digits)."""
    return tuple(float(v) for v in ref.perturbed(x, k, tau, dps=15))


@golden("test_perturbed.exact_jacobian")  # stored: tests/golden/references.json.gz
def _exact_jacobian(x: list[float], k: int) -> tuple[tuple[float, ...], ...]:
    """Its Jacobian at tau = 1 by differentiating under the integral (15 digits)."""
    return tuple(tuple(float(v) for v in row) for row in ref.perturbed_jacobian(x, k, 1.0, dps=15))


@pytest.mark.parametrize(("x", "k", "tau"), CASES)
def test_weights_match_the_exact_expectation_within_standard_error(x: list[float], k: int, tau: float) -> None:
    z = scaled_scores(np.asarray(x), k, tau=tau)
    fwd = perturbed_forward(z, k, samples=20_000, seed=1)
    exact = np.array(_exact_weights([float(v) for v in x], k, float(tau)))
    se = fwd.aux["stderr"][0]
    assert np.all(se > 0) and np.all(se < 0.01)
    assert np.all(np.abs(fwd.p[0] - exact) <= Z_BOUND * se)
    assert abs(fwd.p[0].sum() - k) < 1e-12


def test_jacobian_estimator_matches_the_exact_jacobian_within_standard_error() -> None:
    x, k = [0.3, -0.2, 1.1], 2
    z = scaled_scores(np.asarray(x), k, tau=1.0)
    jac, se = perturbed_jacobian_with_stderr(z, k, samples=20_000, seed=2)
    exact = np.array(_exact_jacobian(x, k))
    assert np.all(np.abs(jac[0] - exact) <= Z_BOUND * se[0] + 1e-12)
    np.testing.assert_allclose(jac[0].sum(axis=0), 0, atol=1e-12)  # sum p = k in every sample
    np.testing.assert_allclose(jac[0].sum(axis=1), 0, atol=1e-12)  # centred noise: shift invariance
    v = np.array([[0.5, -1.0, 2.0]])
    fwd = perturbed_forward(z, k, samples=20_000, seed=2)
    vjp = perturbed_vjp(fwd, z, k, v, samples=20_000, seed=2)
    np.testing.assert_allclose(vjp[0], v[0] @ jac[0], atol=1e-12)


def test_exact_jacobian_reference_agrees_with_finite_differences() -> None:
    x, k, h = [0.3, -0.2, 1.1], 2, 1e-4
    exact = ref.perturbed_jacobian(x, k, 1.0, dps=15)
    up = ref.perturbed([x[0] + h, *x[1:]], k, dps=15)
    dn = ref.perturbed([x[0] - h, *x[1:]], k, dps=15)
    for i in range(3):
        assert abs(float((up[i] - dn[i]) / (2 * h)) - float(exact[i][0])) < 1e-7


def test_deterministic_for_a_seed_and_independent_of_the_batch() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(4, 6))
    z -= z.max(axis=1, keepdims=True)
    a = perturbed_forward(z, 2, samples=200, seed=5).p
    np.testing.assert_array_equal(a, perturbed_forward(z, 2, samples=200, seed=5).p)
    np.testing.assert_array_equal(a[2:3], perturbed_forward(z[2:3], 2, samples=200, seed=5).p)
    assert not np.array_equal(a, perturbed_forward(z, 2, samples=200, seed=6).p)


def test_exact_invariants() -> None:
    z = np.array([[0.0, -0.5, -np.inf, -1.0, -0.2], [0.0, -1e-3, -2e-3, -np.inf, -np.inf]])
    fwd = perturbed_forward(z, 3, samples=100, seed=0)
    assert np.all((fwd.p >= 0) & (fwd.p <= 1))
    np.testing.assert_allclose(fwd.p.sum(axis=1), 3, atol=1e-13)
    assert np.all(fwd.p[~np.isfinite(z)] == 0) and np.all(fwd.aux["stderr"][~np.isfinite(z)] == 0)
    np.testing.assert_array_equal(fwd.p[1, :3], 1.0)  # k = number of unmasked entries
    np.testing.assert_allclose(fwd.q, 1 - fwd.p, atol=1e-15)
    hard = perturbed_forward(scaled_scores(np.array([3.0, 1.0, 2.0]), 2, tau=1e-3), 2, samples=100, seed=0)
    np.testing.assert_array_equal(hard.p, [[1.0, 0.0, 1.0]])


def test_an_entry_no_pair_selected_still_has_a_standard_error() -> None:
    """Every pair agreeing on a finite entry is no proof that its weight is 0: x = (0, 0, -3, 0, 0),
    k = 1 has exact weight 3.7642e-4 on the third entry (``reference_wider.perturbed``), which the
    default 500 pairs rarely see; its estimate 0 came with standard error 0 and was judged exact."""
    res = st.evaluate(np.array([0.0, 0.0, -3.0, 0.0, 0.0]), 1, "perturbed")
    assert res.weights[2] == 0.0 and res.stderr is not None
    assert abs(res.weights[2] - 3.7642e-4) <= (MONTE_CARLO_STDERRS + 1) * res.stderr[2]
    masked = st.evaluate(np.array([0.0, -np.inf, 1.0]), 1, "perturbed")
    assert masked.stderr is not None and masked.stderr[1] == 0.0  # weight exactly 0


def test_potential_gradient_is_the_estimate() -> None:
    """With common random numbers the estimated perturbed maximum has gradient exactly p-hat."""
    z = np.array([[0.0, -0.3, -0.9, -0.4]])
    fwd = perturbed_forward(z, 2, samples=400, seed=3)
    h = 1e-7
    fd = []
    for j in range(4):
        e = np.zeros((1, 4))
        e[0, j] = h
        up = perturbed_potential(perturbed_forward(z + e, 2, samples=400, seed=3), z + e, 2)
        dn = perturbed_potential(perturbed_forward(z - e, 2, samples=400, seed=3), z - e, 2)
        fd.append((up - dn)[0] / (2 * h))
    np.testing.assert_allclose(fd, fwd.p[0], atol=1e-7)


def test_implementation_takes_its_parameters_as_keywords() -> None:
    z = np.array([[0.0, -0.3, -0.9]])
    fwd = PERTURBED.forward(z, 1, samples=64, seed=3)  # type: ignore[call-arg]
    np.testing.assert_array_equal(
        PERTURBED.jacobian(fwd, z, 1, samples=64, seed=3),  # type: ignore[call-arg]
        perturbed_jacobian_with_stderr(z, 1, samples=64, seed=3)[0],
    )


@pytest.mark.parametrize(("samples", "seed"), [(3, 0), (2, 0), (10.0, 0), (10, -1), (True, 0), (10, 1.5)])
def test_parameters_are_validated(samples: object, seed: object) -> None:
    with pytest.raises(InvalidArgumentError):
        perturbed_forward(np.zeros((1, 3)), 1, samples=samples, seed=seed)  # type: ignore[arg-type]
