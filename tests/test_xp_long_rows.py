"""The array-API core on long rows against the numpy engine.

tests/test_xp_core.py holds rows of at most 33 entries; the core's branch search for ``thre-exp``
and ``thre-laplace`` sums ``e^{s_i - r}`` over whole rows relative to the ``ceil(k)``-th largest entry
``r``, with exponents clipped where ``n e^{3V}`` would overflow (``V`` about 234 in float64 and 27
in float32 at ``n = 1000``) and the entries beyond ``V`` decided by bounds. These rows reach that
regime: spreads of ``z`` far beyond ``V``, ties at the cut, masks, ``k`` from 1 to ``#unmasked``.
Tolerances are those of tests/test_xp_core.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from topk_cli import api
from topk_cli.xp import backward, forward

THRESHOLD = ("thre-exp", "thre-laplace", "thre-sigmoid", "thre-clip", "thre-cube")


def _rows(dtype: type, n: int = 1000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    rows, ks = [], []
    z_max = 40.0 if dtype == np.float32 else 2000.0  # float32: |z| <= 40, as tests/test_xp_core.py
    for spread in (0.05, 1.0, 10.0, z_max / 4):
        for k in (1.0, 2.5, 10.0, 37.25, 400.0, float(n)):
            x = spread * rng.standard_normal(n)
            rows.append(x)
            ks.append(k)
    x = np.array(rows)
    x[::5, :300] = -np.inf  # a third masked in every fifth row
    x[3::7, 1:12] = x[3::7, :1]  # ties with the largest entry, straddling small k
    nfin = np.isfinite(x).sum(axis=1)
    k = np.minimum(np.array(ks), nfin)
    spread = np.nanmax(np.where(np.isfinite(x), x, np.nan), axis=1) - np.nanmin(np.where(np.isfinite(x), x, np.nan), axis=1)
    tau = np.maximum(spread / z_max, 1e-3)
    return x.astype(dtype), k.astype(dtype), tau.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", (*THRESHOLD, "hard"))
def test_long_rows_match_the_numpy_engine(method: str, dtype: type) -> None:
    x, k, tau = _rows(dtype)
    tol_p, tol_v = (1e-12, 1e-12) if dtype == np.float64 else (2e-5, 1e-4)
    rng = np.random.default_rng(5)
    g = np.where(np.isfinite(x), rng.standard_normal(x.shape), 0.0).astype(dtype)
    x64, k64, t64, g64 = (a.astype(np.float64) for a in (x, k, tau, g))
    p, res = forward(x, k, tau, method)
    assert p.dtype == dtype
    np.testing.assert_allclose(p, api.soft_topk(x64, k64, method, tau=t64), rtol=0, atol=tol_p)
    got = backward(method, res, g)
    want = api.vjp(x64, k64, g64, method, tau=t64, wrt=("x", "k", "tau"))
    scale = max(float(np.max(np.abs(w))) for w in want)
    z = np.where(np.isfinite(x64), (x64 - x64.max(axis=1, keepdims=True)) / t64[:, None], 0.0)
    own = 64 * np.finfo(np.float64).eps * np.sum(np.abs(want[0] * z), axis=1)  # the engine's g_tau rounding
    for name, a, b in zip(("x", "k", "tau"), got, want, strict=True):
        bound = tol_v * scale + (own if name == "tau" else 0.0)
        assert np.all(np.abs(a - b) <= bound), (method, name, float(np.max(np.abs(a - b))), scale)
