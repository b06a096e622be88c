"""The array-API core's partial-selection path (``forward(..., k_max=...)``) against the numpy engine.

With a bound ``k_max`` on every row's k (the drop-ins pass a scalar k), ``hard``, ``thre-exp``,
``thre-laplace`` and ``thre-sigmoid`` read only the ``ceil(k_max)`` (``floor(2 k_max) + 2``,
``floor(4 k_max) + 2``) largest entries of a row individually and the rest through ``sum e^{z_i}``. These cases aim at what that
could get wrong: rows much longer than the prefix, spreads where the left-out mass underflows or
dominates, offsets of 1e6, ties at the prefix's last entry (the selection among them is arbitrary),
rows with fewer unmasked entries than the prefix, ``k = #unmasked``, ``k`` per row below the bound,
and ``k = k_max`` exactly at the bound. Tolerances are those of tests/test_xp_core.py.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import numpy as np
import pytest

from topk_cli import api
from topk_cli.xp import backward, forward
from topk_cli.xp._threshold import prefix_size

PREFIX_METHODS = ("hard", "thre-exp", "thre-laplace", "thre-sigmoid")
EPS64 = float(np.finfo(np.float64).eps)


def _cases(dtype: type, lengths: tuple[int, ...] = (40, 203),
           z_range: float | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, float]]:
    """``(x, k, tau, k_max)`` batches; ``tau`` scales each row to a range of ``z`` of ``z_range``
    (default: the largest the dtype's tolerance allows)."""
    rng = np.random.default_rng(20261128)
    z_max = z_range or (40.0 if dtype == np.float32 else 2000.0)
    out = []
    for n in lengths:
        for k_max in (1.0, 2.5, 4.0, math.floor(n / 9) + 0.5):
            for offset in (0.0, 1e6):
                rows, ks = [], []
                for spread in (1e-3, 1.0, 30.0, z_max / 2):
                    for frac in (1.0, 0.5, 0.1):
                        rows.append(offset + spread * rng.standard_normal(n))
                        ks.append(max(min(k_max, 1.0), frac * k_max))
                x = np.array(rows)
                c = math.ceil(k_max)
                x[1, : c + 5] = x[1, 0]  # ties straddling rank k and the prefix's last entry
                x[4, 3 : 3 + 2 * c + 6] = x[4, 2]
                x[7, c + 1 :] = -np.inf  # fewer unmasked entries than the laplace prefix
                ks[7] = min(ks[7], float(c + 1))
                x[8, c:] = -np.inf  # k = #unmasked (every weight 1)
                ks[8] = float(c)
                x[10, ::3] = -np.inf
                k = np.array(ks)
                fin = np.isfinite(x)
                span = np.array([np.ptp(r[f]) for r, f in zip(x, fin, strict=True)])
                tau = np.maximum(span / z_max, 1e-3 * np.maximum(span, 1e-3))
                out.append((x, k, tau, k_max))
    return out


def _namespace(ns: str) -> Any:
    if ns == "numpy":
        return lambda a, dtype: np.asarray(a, dtype=dtype)
    if importlib.util.find_spec(ns) is None:
        pytest.skip(f"{ns} is not installed")
    import torch

    return lambda a, dtype: torch.asarray(np.asarray(a, dtype=dtype))


def _np(a: Any) -> np.ndarray:
    return np.asarray(a.cpu() if hasattr(a, "cpu") else a, dtype=np.float64)


def _check(method: str, ns: str, dtype: type,
           cases: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]]) -> tuple[int, int]:
    """Every batch through ``forward(..., k_max=...)`` against the numpy engine and the sorted path:
    ``(batches where a partial selection ran, rows checked)``."""
    conv = _namespace(ns)
    tol_p, tol_v = (1e-12, 1e-12) if dtype == np.float64 else (2e-5, 1e-4)
    rng = np.random.default_rng(3)
    used = rows = 0
    for x, k, tau, k_max in cases:
        n = x.shape[1]
        size = math.ceil(k_max) if method == "hard" else prefix_size(method, k_max, n)
        used += size is not None and 4 * size <= n
        xd, kd, td = (np.asarray(a, dtype=dtype) for a in (x, k, tau))
        g = np.where(np.isfinite(xd), rng.standard_normal(x.shape), 0.0).astype(dtype)
        x64, k64, t64, g64 = (a.astype(np.float64) for a in (xd, kd, td, g))
        p, res = forward(conv(xd, dtype), conv(kd, dtype), conv(td, dtype), method, k_max=k_max)
        p_sorted, _ = forward(conv(xd, dtype), conv(kd, dtype), conv(td, dtype), method)
        want_p = api.soft_topk(x64, k64, method, tau=t64)
        assert float(np.max(np.abs(_np(p) - want_p))) <= tol_p, (method, n, k_max)
        assert float(np.max(np.abs(_np(p) - _np(p_sorted)))) <= tol_p, (method, n, k_max)
        got = backward(method, res, conv(g, dtype))
        want = api.vjp(x64, k64, g64, method, tau=t64, wrt=("x", "k", "tau"))
        scale = max(max(float(np.max(np.abs(w))) for w in want), 1e-300)
        z = np.where(np.isfinite(x64), (x64 - x64.max(axis=1, keepdims=True)) / t64[:, None], 0.0)
        own = 64 * EPS64 * np.sum(np.abs(want[0] * z), axis=1)  # the engine's g_tau rounding
        for name, a, b in zip(("x", "k", "tau"), got, want, strict=True):
            err = np.abs(_np(a) - b)
            bound = tol_v * scale + (own if name == "tau" else 0.0)
            assert np.all(err <= bound), (method, n, k_max, name, float(np.max(err)), scale)
        rows += x.shape[0]
    return used, rows


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ns", ["numpy", "torch"])
@pytest.mark.parametrize("method", PREFIX_METHODS)
def test_prefix_path_matches_the_numpy_engine(method: str, ns: str, dtype: type) -> None:
    # thre-sigmoid's prefix (floor(4 k_max) + 2) is a quarter of fewer of the short rows: rows of
    # 800 keep its partial selection running on as many batches as the others'
    cases = _cases(dtype) + (_cases(dtype, (800,)) if method == "thre-sigmoid" else [])
    used, rows = _check(method, ns, dtype, cases)
    assert used >= 10 and rows >= 150, (used, rows)  # the partial selection did run, on most batches


def _complete(x: np.ndarray, k: np.ndarray, tau: np.ndarray, k_max: float, method: str) -> bool | None:
    """Whether the clipped prefix holds every entry that matters on every row (``None``: no prefix)."""
    import array_api_compat.numpy as xnp

    from topk_cli.xp._common import scaled
    from topk_cli.xp._threshold import _rows

    size = prefix_size(method, k_max, x.shape[1])
    if size is None:
        return None
    z, fin = scaled(xnp, x, tau)
    complete = _rows(xnp, z, fin, k, size, clipped=True).complete
    return bool(np.all(complete))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ns", ["numpy", "torch"])
@pytest.mark.parametrize("method", ["thre-clip", "thre-cube"])
def test_clipped_prefix_and_its_fallback_match_the_numpy_engine(method: str, ns: str, dtype: type) -> None:
    """thre-clip and thre-cube select 16 ceil(k_max) entries and use them where they hold every
    entry within 1 of the ceil(k)-th largest (wide rows: the prefix), else sort (dense rows: the
    fallback); both paths are checked, each on several batches, rows of 800."""
    z_max = 40.0 if dtype == np.float32 else 2000.0
    wide, dense = _cases(dtype, (800,), z_max), _cases(dtype, (800,), 3.0)
    paths = [_complete(*case, method) for case in wide + dense]
    assert paths.count(True) >= 4 and paths.count(False) >= 4, paths
    used, rows = _check(method, ns, dtype, wide + dense)
    assert used >= 8 and rows >= 150, (used, rows)


def test_prefix_sizes() -> None:
    assert prefix_size("thre-exp", 10, 1000) == 10
    assert prefix_size("thre-laplace", 10, 1000) == 22
    assert prefix_size("thre-sigmoid", 10, 1000) == 42  # the Newton's trial thresholds reach 4k entries
    assert prefix_size("thre-laplace", 2.4999999, 1000) == 6
    assert prefix_size("thre-exp", 300, 1000) is None  # not cheaper than sorting
    assert prefix_size("thre-clip", 1, 1000) == prefix_size("thre-cube", 1, 1000) == 16
    assert prefix_size("thre-clip", 16, 1000) is None  # 256: a quarter of the row
    assert prefix_size("thre-exp", None, 1000) is None


def test_prefix_path_under_jax_jit() -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    import jax
    import jax.numpy as jnp

    x, k, tau, k_max = _cases(np.float64)[-1]
    assert prefix_size("thre-laplace", k_max, x.shape[1]) is not None
    wide, dense = _cases(np.float64, (800,))[2], _cases(np.float64, (800,), 3.0)[2]  # k_max = 2.5
    assert _complete(*wide, "thre-clip") is True and _complete(*dense, "thre-clip") is False
    with jax.enable_x64(True):
        for method in (*PREFIX_METHODS, "thre-clip", "thre-cube"):
            fwd = jax.jit(forward, static_argnums=3, static_argnames="k_max")
            p, _ = fwd(jnp.asarray(x), jnp.asarray(k), jnp.asarray(tau), method, k_max=k_max)
            np.testing.assert_allclose(np.asarray(p), api.soft_topk(x, k, method, tau=tau), rtol=0, atol=1e-12)
        for method in ("thre-clip", "thre-cube"):  # both branches of the lax.cond, traced and run
            for xc, kc, tc, km in (wide, dense):
                p, _ = fwd(jnp.asarray(xc), jnp.asarray(kc), jnp.asarray(tc), method, k_max=km)
                np.testing.assert_allclose(np.asarray(p), api.soft_topk(xc, kc, method, tau=tc), rtol=0, atol=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_float64_selection_through_float32_keys() -> None:
    """JAX float64 rows are selected on float32 keys, then checked; the cases cover both paths:
    distinct keys (the float32 selection is exact), ties in float64 (any choice is right), and
    float64 values that float32 cannot tell apart at the boundary (1e6 + j 1e-9: the float64
    top-k is taken), masks and values beyond float32's range. Exact equality with numpy's sort."""
    import array_api_compat
    import jax

    from topk_cli.xp._common import top_entries

    with jax.enable_x64(True):
        import jax.numpy as jnp

        xj = array_api_compat.array_namespace(jnp.zeros(1))
        rng = np.random.default_rng(1)
        cases = {
            "distinct": rng.standard_normal((20, 300)),
            "float64 ties": np.round(rng.standard_normal((20, 300)), 1),
            "float32 collapses": 1e6 + rng.integers(0, 3, (20, 300)) * 1e-9,
            "masked": np.where(rng.random((20, 300)) < 0.97, -np.inf, rng.standard_normal((20, 300))),
            "beyond float32": np.concatenate([rng.standard_normal((20, 5)), -1e300 * rng.random((20, 295))], axis=1),
        }
        collapsed = np.asarray(cases["float32 collapses"], dtype=np.float32)
        assert np.all(collapsed == collapsed[:, :1])  # the fallback's case: one float32 key per row
        checked = 0
        for a in cases.values():
            for m in (1, 7, 16):
                values, idx = jax.jit(lambda x, m=m: top_entries(xj, x, m))(jnp.asarray(a))
                values, idx = np.asarray(values), np.asarray(idx)
                assert values.dtype == np.float64
                np.testing.assert_array_equal(values, -np.sort(-a, axis=1)[:, :m])
                np.testing.assert_array_equal(np.take_along_axis(a, idx, axis=1), values)
                checked += 1
        assert checked == 15
