"""The running bound's row scalars."""

from __future__ import annotations

import numpy as np

from topk_cli.operators._recursion_bound import _largest_finite_magnitude


def test_largest_finite_magnitude_is_the_max_of_abs_over_finite_entries() -> None:
    z = np.array([
        [0.0, -3.0, -1.0],
        [-np.inf, -7.0, 0.0],  # masked: -inf is not the largest magnitude
        [2.0, -1.0, 0.5],  # largest magnitude at the maximum
        [np.nan, -2.0, 0.0],
        [np.inf, -4.0, 1.0],
        [-np.inf, -np.inf, -np.inf],
    ])
    expected = np.max(np.abs(z), axis=-1, where=np.isfinite(z), initial=0.0)
    np.testing.assert_array_equal(_largest_finite_magnitude(z), expected)
    np.testing.assert_array_equal(expected, [3.0, 7.0, 2.0, 2.0, 4.0, 0.0])
