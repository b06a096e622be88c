"""The array-API core (topk_cli.xp) against the numpy engine, on numpy, PyTorch and JAX arrays.

An adversarial suite (offsets 1e6, spreads 1e3, ties straddling rank k, k = 1 and k = n, -inf masks,
a real k per row, several rows) is run through ``topk_cli.xp.forward``/``backward`` and compared with
``topk_cli.api.soft_topk`` and ``topk_cli.api.vjp(..., wrt=("x", "k", "tau"))``.

Tolerances. float64: 1e-12 absolute on ``p``; the VJPs within 1e-12 of the VJP's max-norm, except
that the reference's own rounding of ``g_tau = -(g_z . z) / tau`` (a dot product with ``|z|`` up to
1e6 whose terms cancel, since ``g_z`` sums to 0) is added to its tolerance: ``64 eps sum|g_z z| / tau``
(the core sums ``g_z (z - lambda)`` instead and is the more accurate of the two there).
float32: computed in float32 by the core (the engine computes in float64 and rounds once), on
the same suite with ``tau`` scaled so that ``|z| <= 40``: 2e-5 on ``p`` (170 ulps of 1: ``z`` is rounded
to ``40 * 2^-24`` and the threshold's solve sums n terms) and 1e-4 of the max-norm on the VJPs
(they subtract means of ``g`` weighted by ``f'``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from topk_cli import api
from topk_cli.xp import DROPIN_METHODS, REAL_K_METHODS, backward, forward

torch_spec = importlib.util.find_spec("torch")
jax_spec = importlib.util.find_spec("jax")

EPS64 = float(np.finfo(np.float64).eps)
#: grad takes one integer k for all rows (forward's k_static): tests/test_xp_grad.py compares it.
IMPLEMENTED = tuple(m for m in DROPIN_METHODS if m != "grad")


def _suite() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(x, k, tau)`` cases, each a batch of rows (float64)."""
    rng = np.random.default_rng(20261128)
    cases = []
    for offset in (0.0, 1e6):
        for spread in (1e-3, 1.0, 1e3):
            for n in (1, 2, 7, 33):
                x = offset + spread * rng.standard_normal((4, n))
                k = np.array([1.0, float(n), max(0.3, n * 0.41), float(max(1, n // 2))])
                tau = np.array([0.37, 1.0, 3.0 * spread, 0.05 * spread])
                cases.append((x, k, tau))
    # ties straddling rank k (integer and real k), at an offset
    base = np.array([9.0, 5.0, 5.0, 5.0, 5.0, 1.0, 0.0, -3.0])
    for offset in (0.0, 1e6):
        x = np.tile(base + offset, (5, 1))
        cases.append((x, np.array([2.0, 3.0, 4.0, 2.5, 4.75]), np.array([1.0, 0.1, 1e-3, 2.0, 0.5])))
    # masks: -inf entries, k = #unmasked, k = 1, a real k
    x = rng.standard_normal((4, 9)) * 10.0
    x[0, [1, 4]] = -np.inf
    x[1, :5] = -np.inf
    x[2, [0, 8]] = -np.inf
    x[3, 3] = -np.inf
    cases.append((x, np.array([7.0, 4.0, 1.0, 5.5]), np.array([1.0, 0.3, 2.0, 0.01])))
    x = np.array([[0.0, -np.inf, 0.0, -1.0], [2.0, 2.0, -np.inf, -np.inf]])
    cases.append((x, np.array([3.0, 2.0]), np.array([1.0, 1.0])))
    # all-equal rows and a hard selection (every f' underflows in float64)
    cases.append((np.zeros((2, 6)), np.array([2.0, 3.5]), np.array([1.0, 1.0])))
    x = np.array([[0.0, -2000.0, -2000.5, -4000.0], [1e6, 1e6 - 900.0, 1e6 - 1800.0, 1e6 - 2700.0]])
    cases.append((x, np.array([1.0, 2.0]), np.array([1.0, 1.0])))
    return cases


SUITE = _suite()


def _padded(cases: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The cases' rows as one batch, padded with masked entries (-inf: computed as if absent) to a
    common length: one call per namespace (PyTorch and JAX pay per call and per shape)."""
    width = max(x.shape[1] for x, _, _ in cases)
    rows = [np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=-np.inf) for x, _, _ in cases]
    return [(np.concatenate(rows), np.concatenate([k for _, k, _ in cases]), np.concatenate([t for _, _, t in cases]))]


@contextmanager
def _namespace(name: str) -> Iterator[Callable[[np.ndarray, Any], Any]]:
    """A function that turns a numpy array into an array of the namespace ``name``."""
    if name == "numpy":
        yield lambda a, dtype: np.asarray(a, dtype=dtype)
    elif name == "torch":
        if torch_spec is None:
            pytest.skip("torch is not installed")
        import torch

        yield lambda a, dtype: torch.asarray(np.asarray(a, dtype=dtype))
    else:
        if jax_spec is None:
            pytest.skip("jax is not installed")
        import jax
        import jax.numpy as jnp

        with jax.enable_x64(True):
            yield lambda a, dtype: jnp.asarray(np.asarray(a, dtype=dtype))


def _np(a: Any) -> np.ndarray:
    return np.asarray(a.cpu() if hasattr(a, "cpu") else a, dtype=np.float64)


def _applicable(method: str, k: np.ndarray) -> bool:
    return method in REAL_K_METHODS or bool((k == np.floor(k)).all())


def _compare(method: str, ns: str, dtype: Any, cases: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
             tol_p: float, tol_v: float, jit: bool = False) -> dict[str, float]:
    rng = np.random.default_rng(7)
    worst = {"p": 0.0, "vjp": 0.0}
    checked = 0
    with _namespace(ns) as conv:
        for x, k, tau in cases:
            if not _applicable(method, k):
                continue
            xd = np.asarray(x, dtype=dtype)
            kd, td = np.asarray(k, dtype=dtype), np.asarray(tau, dtype=dtype)
            g = rng.standard_normal(x.shape)
            g = np.where(np.isfinite(xd), g, 0.0).astype(dtype)
            x64, k64, t64, g64 = (a.astype(np.float64) for a in (xd, kd, td, g))
            ref_p = api.soft_topk(x64, k64, method, tau=t64)
            wrt = ("x", "k", "tau") if method in REAL_K_METHODS else ("x", "tau")
            ref = dict(zip(wrt, api.vjp(x64, k64, g64, method, tau=t64, wrt=wrt), strict=True))
            if "k" not in ref:
                ref["k"] = np.zeros(x.shape[0])
            fwd, bwd = forward, backward
            if jit:
                import jax

                fwd = jax.jit(forward, static_argnums=3)
                bwd = jax.jit(backward, static_argnums=0)
            p, res = fwd(conv(xd, dtype), conv(kd, dtype), conv(td, dtype), method)
            gx, gk, gtau = bwd(method, res, conv(g, dtype))
            assert _np(p).shape == x.shape and str(getattr(p, "dtype", "")).endswith(np.dtype(dtype).name)
            err_p = float(np.max(np.abs(_np(p) - ref_p)))
            assert err_p <= tol_p, (method, ns, x, k, tau, err_p)
            scale = max(float(np.max(np.abs(ref["x"]))), float(np.max(np.abs(ref["k"]))),
                        float(np.max(np.abs(ref["tau"]))), 1e-300)
            z = np.where(np.isfinite(x64), (x64 - x64.max(axis=1, keepdims=True)) / t64[:, None], 0.0)
            own = 64 * EPS64 * np.sum(np.abs(ref["x"] * z), axis=1)  # the reference's rounding of g_tau
            for name, got in (("x", gx), ("k", gk), ("tau", gtau)):
                err = np.abs(_np(got) - ref[name])
                bound = tol_v * scale + (own if name == "tau" else 0.0)
                assert np.all(err <= bound), (method, ns, name, x, k, tau, err, bound)
                worst["vjp"] = max(worst["vjp"], float(np.max(err)) / scale)
            worst["p"] = max(worst["p"], err_p)
            checked += x.shape[0]
    assert checked >= 80, (method, checked)  # rows checked: most of the suite applies to every method
    return worst


@pytest.mark.parametrize("ns", ["numpy", "torch"])
@pytest.mark.parametrize("method", IMPLEMENTED)
def test_float64_matches_the_numpy_engine(method: str, ns: str) -> None:
    _compare(method, ns, np.float64, SUITE if ns == "numpy" else _padded(SUITE), 1e-12, 1e-12)


@pytest.mark.skipif(jax_spec is None, reason="jax is not installed")
@pytest.mark.parametrize("method", ["thre-sigmoid", "thre-cube"])
def test_float64_under_jax_jit_matches_the_numpy_engine(method: str) -> None:
    """forward and backward traced by jax.jit (loops of static length, no host reads), x64 on."""
    _compare(method, "jax", np.float64, _padded(SUITE), 1e-12, 1e-12, jit=True)


def _float32_suite() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    out = []
    for x, k, tau in SUITE:
        x32 = x.astype(np.float32).astype(np.float64)
        fin = np.isfinite(x32)
        spread = np.max(np.where(fin, x32.max(axis=1, keepdims=True) - x32, 0.0), axis=1)
        out.append((x, k, np.maximum(tau, spread / 40.0)))
    return out


@pytest.mark.parametrize("ns", ["numpy", "torch"])
@pytest.mark.parametrize("method", IMPLEMENTED)
def test_float32_within_float32_accuracy(method: str, ns: str) -> None:
    cases = _float32_suite()
    _compare(method, ns, np.float32, cases if ns == "numpy" else _padded(cases), 2e-5, 1e-4)


def test_straight_through_uses_the_soft_gradient() -> None:
    x = np.array([[3.0, 1.0, 2.0, 2.0], [0.0, -np.inf, 1.0, 0.5]])
    k, tau, g = np.array([2.0, 1.5]), np.array([1.0, 0.5]), np.array([[1.0, 0.0, -1.0, 2.0], [0.5, 0.0, 1.0, -1.0]])
    p, res = forward(x, k, tau, "hard", st_method="thre-sigmoid")
    np.testing.assert_array_equal(p, api.soft_topk(x, k, "hard", tau=tau))
    got = backward("hard", res, g, st_method="thre-sigmoid")
    want = api.vjp(x, k, g, "thre-sigmoid", tau=tau, wrt=("x", "k", "tau"))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    # without it, hard has no gradient in x and tau
    gx, _, gtau = backward("hard", forward(x, k, tau, "hard")[1], g)
    assert not np.any(gx) and not np.any(gtau)


def test_forward_refuses_unknown_methods() -> None:
    x = np.zeros((1, 3))
    with pytest.raises(ValueError, match="unknown method"):
        forward(x, np.ones(1), np.ones(1), "iterative")
    with pytest.raises(ValueError, match="st_method"):
        forward(x, np.ones(1), np.ones(1), "thre-exp", st_method="thre-sigmoid")
