"""weighted-softmax's Jacobian on rows whose gaps in ``x / tau`` are beyond float64's log space (1e5 and
more): returned where it exists, against a 60-digit mpmath forward-mode reference (relative per entry,
so derivatives of size ``e^{-1e7}`` count), instead of refused as ``ill-conditioned``."""

from __future__ import annotations

import numpy as np
import pytest
import ws_jacobian_reference as W

import topk_cli as st

CASES = [
    ([0.0, -1e7], 2, 1.0),  # every derivative ~ e^{-1e7}: 0 in float64 (the log path gave 1e-11 noise)
    ([0.0, -1e6, -2e6], 2, 1.0),
    ([3.0, 2.9, -4e5, -4e5 - 1.0, 7.0], 4, 1.0),
    ([0.1, -0.2, 5e2, -3e2, 1.0], 3, 1e-3),  # spread 8e2 at tau 1e-3: gaps of 8e5
    ([1e6 + 0.5, 1e6, 1e6 - 300.0, 1e6 + 0.25], 3, 1e-3),  # offset, gaps of 3e5
]


def _ref(x: list[float], k: int, tau: float) -> np.ndarray:
    return np.array([[float(v) for v in row] for row in W.jacobian_weighted_softmax(x, k, tau)])


@pytest.mark.parametrize(("x", "k", "tau"), CASES)
def test_jacobian_across_huge_gaps_is_returned_and_accurate(x: list[float], k: int, tau: float) -> None:
    ref = _ref(x, k, tau)
    jac = st.jacobian(x, k, "weighted-softmax", tau=tau)  # used to raise ill-conditioned
    # relative to the largest entry, or absolute in units of 1/tau where the whole Jacobian is far
    # below 1/tau (the documented accuracy of the float64 paths)
    scale = max(float(np.abs(ref).max()), 1e-3 / tau)
    assert np.abs(jac - ref).max() <= 1e-12 * scale, (jac, ref)
    v = np.linspace(-1.0, 1.0, len(x))
    np.testing.assert_allclose(st.vjp(x, k, v, "weighted-softmax", tau=tau), v @ ref, rtol=0, atol=1e-12 * scale)
