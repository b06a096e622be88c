"""Derivatives of the threshold operators where two roundings used to reach 1e-9 of them.

1. ``d/dtau``: ``z = (x - max x) / tau`` gives ``g_tau = -(g_z . z) / tau``. ``g_z`` sums to 0 only to
   rounding, an error that ``|z|`` (here up to 2e3) multiplies. The numpy engine centres ``z`` on
   the entry whose weight is nearest 1/2 (``p q`` largest) and the array-API core on the
   ``f'``-weighted mean of ``z - lambda``: exact rewrites for a shift-invariant operator, since
   ``J_z 1 = 0``, which the first test checks for every method it is applied to.
2. The entry whose ``f'`` dominates a row: ``g_i - (f' . g) / sum f'`` is a difference of nearly
   equal numbers there, summed instead from the other entries' differences.

Reference: the threshold found by bisection in 50-digit mpmath and the implicit-function-theorem
Jacobian ``diag(d) - d d^T / sum d`` in the same precision.
"""

from __future__ import annotations

import importlib.util

import mpmath as mp
import numpy as np
import pytest

from topk_cli import api
from topk_cli.registry import METHODS
from topk_cli.xp import backward, forward

LINKS = {
    "thre-exp": (lambda t: mp.e ** t if t < 0 else mp.mpf(1), lambda t: mp.e ** t if t < 0 else mp.mpf(0)),
    "thre-sigmoid": (lambda t: 1 / (1 + mp.e ** (-t)), lambda t: mp.e ** (-abs(t)) / (1 + mp.e ** (-abs(t))) ** 2),
    "thre-laplace": (lambda t: 1 - mp.e ** (-t) / 2 if t >= 0 else mp.e ** t / 2, lambda t: mp.e ** (-abs(t)) / 2),
}


def _rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of spread 1e-3 at a temperature that puts ``z`` down to -2e3, real and integer k."""
    rng = np.random.default_rng(20261128)
    x = 1e-3 * rng.standard_normal((6, 40))
    k = np.array([2.5, 2.5, 1.5, 3.25, 7.25, 1.75])  # real k: an integer k whose threshold rounds onto an entry takes the one-sided derivative
    tau = np.ptp(x, axis=1) / 2000.0
    return x, k, tau


def _reference(method: str, x: np.ndarray, k: float, tau: float, g: np.ndarray) -> tuple[np.ndarray, float]:
    """``(g_x, g_tau)`` in mpmath."""
    mp.mp.dps = 50
    f, df = LINKS[method]
    t_ = mp.mpf(float(tau))
    top = max(mp.mpf(float(v)) for v in x)
    z = [(mp.mpf(float(v)) - top) / t_ for v in x]
    kk = mp.mpf(float(k))
    lo, hi = min(z) - 100, mp.mpf(100)
    for _ in range(260):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(f(zi - mid) for zi in z) > kk else (lo, mid)
    lam = (lo + hi) / 2
    d = [df(zi - lam) for zi in z]
    gm = [mp.mpf(float(v)) for v in g]
    total = sum(d)
    # g_i - (d . g) / sum d as sum_j d_j (g_i - g_j) / sum d: no cancellation at a dominant d_i
    g_z = [di * sum(dj * (gi - gj) for dj, gj in zip(d, gm, strict=True)) / total for di, gi in zip(d, gm, strict=True)]
    g_x = np.array([float(v / t_) for v in g_z])
    g_tau = float(-sum(gz * zi for gz, zi in zip(g_z, z, strict=True)) / t_)
    return g_x, g_tau


def test_shift_invariant_methods_have_zero_row_sums() -> None:
    """The premise of the centring: ``J_x 1 = 0`` for every centred method that claims shift invariance."""
    rng = np.random.default_rng(4)
    checked = 0
    for name, spec in METHODS.items():
        if not (spec.implementation.centred and spec.guarantees.shift_invariant):
            continue
        x = rng.standard_normal((2, 7))
        k = 2 if spec.capabilities.integer_k else 2.5
        jac = api.jacobian(x, k, name, tau=0.7)
        scale = max(float(np.max(np.abs(jac))), 1e-300)
        assert float(np.max(np.abs(jac.sum(axis=-1)))) <= 1e-9 * scale, name
        checked += 1
    assert checked >= 15, checked


@pytest.mark.parametrize("method", sorted(LINKS))
def test_engine_derivatives_match_mpmath(method: str) -> None:
    x, k, tau = _rows()
    g = np.random.default_rng(3).standard_normal(x.shape)
    g_x, g_tau = api.vjp(x, k, g, method, tau=tau, wrt=("x", "tau"))
    jac_x, jac_tau = api.jacobian(x, k, method, tau=tau, wrt=("x", "tau"))
    for b in range(x.shape[0]):
        want_x, want_tau = _reference(method, x[b], k[b], tau[b], g[b])
        scale = max(float(np.max(np.abs(want_x))), abs(want_tau))
        assert float(np.max(np.abs(g_x[b] - want_x))) <= 1e-12 * scale, (b, g_x[b], want_x)
        assert abs(g_tau[b] - want_tau) <= 1e-12 * scale, (b, g_tau[b], want_tau)
        assert float(np.max(np.abs(g[b] @ jac_x[b] - want_x))) <= 1e-12 * scale, b
        assert abs(float(g[b] @ jac_tau[b]) - want_tau) <= 1e-12 * scale, b


@pytest.mark.parametrize("ns", ["numpy", "torch"])
@pytest.mark.parametrize("method", sorted(LINKS))
def test_core_derivatives_match_mpmath(method: str, ns: str) -> None:
    if ns == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    conv = np.asarray
    if ns == "torch":
        import torch

        conv = torch.asarray
    x, k, tau = _rows()
    g = np.random.default_rng(3).standard_normal(x.shape)
    _, res = forward(conv(x), conv(k), conv(tau), method)
    g_x, _, g_tau = (np.asarray(a) for a in backward(method, res, conv(g)))
    for b in range(x.shape[0]):
        want_x, want_tau = _reference(method, x[b], k[b], tau[b], g[b])
        scale = max(float(np.max(np.abs(want_x))), abs(want_tau))
        assert float(np.max(np.abs(g_x[b] - want_x))) <= 1e-12 * scale, (b, g_x[b], want_x)
        assert abs(g_tau[b] - want_tau) <= 1e-12 * scale, (b, g_tau[b], want_tau)
