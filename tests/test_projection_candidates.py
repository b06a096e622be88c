"""``thre-clip`` / ``thre-cube`` solve for the threshold on a partial sort's candidates only: the
result must equal the solve on every entry of the row, including rows where the first partial
sort misses candidates (many entries within 1 of the (k+1)-th largest) and is widened."""

from __future__ import annotations

import numpy as np
import pytest

from topk_cli.operators import projection as proj


def _full(z: np.ndarray, k: int, power: int) -> np.ndarray:
    """The weights from a solve over the whole row (no candidate selection)."""
    z_lo, o_lo, delta, _ = proj._solve(z, k, power)
    return proj._weights(z, z_lo, o_lo, delta, power)[0]


@pytest.mark.parametrize("power", [1, 3])
def test_candidates_give_the_solve_over_the_whole_row(power: int) -> None:
    rng = np.random.default_rng(3)
    n, k = 700, 5
    # rows at temperatures from hard (few candidates) to soft (every entry within 1 of s_{k+1})
    scales = np.array([0.01, 0.1, 1.0, 10.0, 100.0, 1000.0])
    x = rng.standard_normal((scales.size, n)) * scales[:, None]
    x[2, rng.choice(n, 300, replace=False)] = -np.inf  # masked entries
    z = x - np.nanmax(np.where(np.isfinite(x), x, np.nan), axis=1, keepdims=True)
    groups = proj._candidates(z, k)
    widths = {top.shape[1] for _, top in groups}
    assert len(widths) >= 3 and max(widths) == n  # the first sort, a widened one and whole rows
    fwd = proj._projection_forward(z, k, power)
    np.testing.assert_allclose(fwd.p, _full(z, k, power), rtol=0, atol=4 * np.finfo(float).eps)
    np.testing.assert_allclose(fwd.p.sum(axis=1), k, rtol=0, atol=1e-12)


@pytest.mark.parametrize("power", [1, 3])
def test_rows_with_exactly_k_finite_entries_are_all_ones(power: int) -> None:
    z = np.full((2, 200), -np.inf)
    z[0, [3, 50, 120]] = [0.0, -5.0, -1e6]
    z[1, :10] = -np.arange(10.0)
    fwd = proj._projection_forward(z, 3, power)
    np.testing.assert_array_equal(fwd.p[0], np.isfinite(z[0]).astype(float))
    assert fwd.p[1, :3].sum() + fwd.p[1, 3:].sum() == pytest.approx(3.0, abs=1e-14)
