"""``d p / d tau`` of every exact method against the high-precision references.

The reference is a central difference in tau of each method's mpmath reference, at 90 digits with
a step of 1e-25 (truncation and rounding errors far below float64 resolution), on the cases the
x-Jacobians are checked on (tests/test_jacobians.py), at the same relative tolerance.
"""

from __future__ import annotations

import functools

import mpmath
import numpy as np
import pytest
from mpmath import mp, mpf
from test_jacobians import CASES, REFERENCES, RTOL, SMOOTH, _assert_close, _thre_exp_near_kink

import topk_cli as st


@functools.cache
def tau_reference(method: str, x: tuple[float, ...], k: int, tau: float) -> np.ndarray:
    fn = REFERENCES["grad" if method == "grad-recursive" else method]
    with mp.workdps(90):
        h = mpf(10) ** -25
        t = mpf(tau)
        up, down = fn(list(x), k, t + h, dps=90), fn(list(x), k, t - h, dps=90)
        return np.array([float((u - d) / (2 * h)) if u != d else 0.0 for u, d in zip(up, down, strict=True)])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("method", SMOOTH)
def test_derivative_in_tau_matches_the_reference(method: str, case: tuple) -> None:
    name, x, k, tau = case
    if method == "thre-exp" and _thre_exp_near_kink(x, k, tau):
        pytest.skip("finite differences straddle the kink of min(1, exp)")
    res = st.evaluate(np.array(x), k, method, tau=tau)
    if not res.ok:
        assert not st.METHODS[method].guarantees.finite, f"{method} fails at {name}"
        pytest.skip(f"{method} reports {res.status} here (documented)")
    got = st.jacobian(np.array(x), k, method, tau=tau, wrt="tau")
    _assert_close(got, tau_reference(method, x, k, tau), RTOL, f"{method} {name} d/dtau")


def test_the_reference_difference_is_exact_for_softmax() -> None:
    """At k = 1 thre-exp is softmax, whose d/dtau is closed-form: checks the reference itself."""
    x = (0.3, -1.2, 2.0, 0.7)
    tau = 0.8
    with mp.workdps(60):
        z = [mpf(v) / mpf(tau) for v in x]
        e = [mpmath.exp(v) for v in z]
        s = sum(e)
        p = [v / s for v in e]
        mean = sum(pi * zi for pi, zi in zip(p, z, strict=True))
        want = [float(-pi * (zi - mean) / mpf(tau)) for pi, zi in zip(p, z, strict=True)]
    np.testing.assert_allclose(tau_reference("thre-exp", x, 1, tau), want, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("method", SMOOTH)
def test_most_cases_are_checked(method: str) -> None:
    """The grid above skips a case only where the method reports a documented failure or sits on
    thre-exp's kink: at least 5 of its 7 cases are checked for every method."""
    checked = sum(
        1 for _, x, k, tau in CASES
        if st.evaluate(np.array(x), k, method, tau=tau).ok and not (method == "thre-exp" and _thre_exp_near_kink(x, k, tau))
    )
    assert checked >= 5, f"{method}: only {checked} of {len(CASES)} cases checked"
