"""``grad`` (GradTopK's exact dynamic program) in the array-API core against the numpy engine.

The adversarial suite of tests/test_xp_core.py (offsets 1e6, spreads 1e3, ties straddling rank k,
k = 1, k = n, n = 1, -inf masks) is run through ``topk_cli.xp.forward(..., "grad", k_static=k)`` and
``backward`` and compared with ``topk_cli.api.soft_topk`` and ``topk_cli.api.vjp(..., wrt=("x",
"tau"))``; grad takes one integer k for all rows, so each case is split by its integer k values.

Tolerances. float64: 1e-12 absolute on ``p``; the VJPs within 1e-12 of the VJP's max-norm, plus, on
``g_tau``, the reference's own rounding of ``-(g_z . z) / tau`` (``64 eps sum|g_z z| / tau``: a dot
product with ``|z|`` up to 1e4 whose terms cancel; the core sums ``g_z (z - c)`` instead, ``c``
between the k-th and (k+1)-th largest ``z``).
float32 (computed in float32 by the core, in float64 by the engine from the same rounded inputs, on
the suite with ``|z| <= 40``): 4e-6 on ``p`` and 2e-5 of the max-norm on the VJPs. Rounding ``z`` to
float32 moves it by up to ``40 * 2^-24 = 2.4e-6``, which moves ``p_i`` by up to
``sum_j |J_ij| 2.4e-6 <= 2 p_i (1 - p_i) 2.4e-6 <= 1.2e-6`` (the rows of the covariance ``J`` have
1-norm ``<= 2 p_i (1 - p_i)``); the program's own rounding (sums of positive terms in log space)
adds less. Measured on the suite: 4.6e-7 on ``p``, 2.1e-6 on the VJPs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_xp_core import EPS64, SUITE, _float32_suite, _namespace, _np, _padded

from topk_cli import api
from topk_cli.xp import DROPIN_METHODS, REAL_K_METHODS, backward, forward

jax_spec = importlib.util.find_spec("jax")

Case = tuple[np.ndarray, np.ndarray, np.ndarray]


def _by_k(cases: list[Case]) -> list[tuple[Case, int]]:
    """Every case's rows grouped by their k, for the integer k values (``(case, k)``)."""
    out = []
    for x, k, tau in cases:
        for kv in sorted(set(k.tolist())):
            if kv == int(kv):
                rows = np.flatnonzero(k == kv)
                out.append(((x[rows], k[rows], tau[rows]), int(kv)))
    return out


def _compare(ns: str, dtype: Any, cases: list[tuple[Case, int]], tol_p: float, tol_v: float,
             run: Callable[..., Any] | None = None) -> tuple[int, dict[str, float]]:
    """``(rows checked, worst errors)``; ``run(x, k, tau, g, k_static) -> (p, gx, gk, gtau)``."""
    rng = np.random.default_rng(7)
    worst = {"p": 0.0, "vjp": 0.0}
    checked = 0

    def default(x: Any, k: Any, tau: Any, g: Any, k_static: int) -> tuple[Any, ...]:
        p, res = forward(x, k, tau, "grad", k_static=k_static)
        return (p, *backward("grad", res, g))

    run = run or default
    with _namespace(ns) as conv:
        for (x, k, tau), kv in cases:
            xd = np.asarray(x, dtype=dtype)
            kd, td = np.asarray(k, dtype=dtype), np.asarray(tau, dtype=dtype)
            g = np.where(np.isfinite(xd), rng.standard_normal(x.shape), 0.0).astype(dtype)
            x64, k64, t64, g64 = (a.astype(np.float64) for a in (xd, kd, td, g))
            ref_p = api.soft_topk(x64, k64, "grad", tau=t64)
            ref_x, ref_tau = api.vjp(x64, k64, g64, "grad", tau=t64, wrt=("x", "tau"))
            p, gx, gk, gtau = run(conv(xd, dtype), conv(kd, dtype), conv(td, dtype), conv(g, dtype), kv)
            for a in (p, gx, gk, gtau):
                assert str(getattr(a, "dtype", "")).endswith(np.dtype(dtype).name)
            assert _np(p).shape == x.shape and _np(gx).shape == x.shape and _np(gtau).shape == k.shape
            err_p = float(np.max(np.abs(_np(p) - ref_p)))
            assert err_p <= tol_p, (ns, x, kv, tau, err_p)
            scale = max(float(np.max(np.abs(ref_x))), float(np.max(np.abs(ref_tau))), 1e-300)
            z = np.where(np.isfinite(x64), (x64 - x64.max(axis=1, keepdims=True)) / t64[:, None], 0.0)
            own = 64 * EPS64 * np.sum(np.abs(ref_x * z), axis=1)  # = 64 eps sum|g_z z| / tau
            for name, got, want, extra in (("x", gx, ref_x, 0.0), ("tau", gtau, ref_tau, own)):
                err = np.abs(_np(got) - want)
                bound = tol_v * scale + extra
                assert np.all(err <= bound), (ns, name, x, kv, tau, err, bound)
                worst["vjp"] = max(worst["vjp"], float(np.max(err)) / scale)
            assert not np.any(_np(gk)), "k is an integer for grad: g_k is 0"
            worst["p"] = max(worst["p"], err_p)
            checked += x.shape[0]
    return checked, worst


def test_grad_is_a_dropin_method_with_an_integer_k() -> None:
    assert "grad" in DROPIN_METHODS and "grad" not in REAL_K_METHODS


def test_float64_on_numpy_matches_the_numpy_engine_on_the_whole_suite() -> None:
    checked, worst = _compare("numpy", np.float64, _by_k(SUITE), 1e-12, 1e-12)
    assert checked >= 86, checked  # the suite's rows with an integer k (all of them)
    assert worst["p"] <= 1e-12


def test_float32_on_numpy_within_float32_accuracy() -> None:
    checked, _ = _compare("numpy", np.float32, _by_k(_float32_suite()), 4e-6, 2e-5)
    assert checked >= 86, checked


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_torch_on_a_padded_batch(dtype: Any) -> None:
    """The suite's rows as one batch padded with masked entries (width 33), one call per k, for
    the k values with the most rows (1, 2 and 3: offsets, spreads, ties, masks, k = n)."""
    suite = SUITE if dtype == np.float64 else _float32_suite()
    tol_p, tol_v = (1e-12, 1e-12) if dtype == np.float64 else (4e-6, 2e-5)
    groups = [(case, kv) for case, kv in _by_k(_padded(suite)) if kv <= 3]
    checked, _ = _compare("torch", dtype, groups, tol_p, tol_v)
    assert checked >= 60 and len(groups) == 3, (checked, len(groups))


@pytest.mark.skipif(jax_spec is None, reason="jax is not installed")
def test_float64_under_jax_jit_with_a_static_k() -> None:
    """forward and backward traced by jax.jit with k static (x64 on), on the padded suite's rows
    with k = 1, 2 and 3 (masks, offsets, spreads, n = 1 to 33). The k = 1 batch caught a
    miscompilation of XLA's CPU fusion emitters (jax 0.10.2) in an earlier layout of the tree's
    downward pass (the parents and siblings concatenated along the node axis: C_t of 0.001 for
    0.999 at a few entries, only under jit and only on the 44-row batch)."""
    import jax

    def both(x: Any, k: Any, tau: Any, g: Any, k_static: int) -> tuple[Any, ...]:
        p, res = forward(x, k, tau, "grad", k_static=k_static)
        return (p, *backward("grad", res, g))

    run = jax.jit(both, static_argnums=4)  # one compilation for both

    groups = [(case, kv) for case, kv in _by_k(_padded(SUITE)) if kv <= 3]
    checked, _ = _compare("jax", np.float64, groups, 1e-12, 1e-12, run=run)
    assert checked >= 60 and len(groups) == 3, (checked, len(groups))


def test_known_values_sum_to_k_and_saturate() -> None:
    # probabilities [0.3, 0.6, 0.5, 0.2] as logits, k = 2: the conditional Poisson marginals
    q = np.array([[0.3, 0.6, 0.5, 0.2]])
    x = np.log(q / (1 - q))
    p, _ = forward(x, np.array([2.0]), np.array([1.0]), "grad", k_static=2)
    np.testing.assert_allclose(p, [[0.3568, 0.7622, 0.6595, 0.2216]], atol=5e-5)
    # k = #unmasked: every unmasked entry has weight exactly 1, masked ones 0, and no gradient
    x = np.array([[3.0, -np.inf, -2.0, 1e6], [0.0, 0.0, 0.0, -np.inf]])
    p, res = forward(x, np.array([3.0, 3.0]), np.array([1.0, 0.5]), "grad", k_static=3)
    np.testing.assert_array_equal(p, [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    gx, _, gtau = backward("grad", res, np.ones_like(x))
    np.testing.assert_array_equal(gx, np.zeros_like(x))
    np.testing.assert_array_equal(gtau, [0.0, 0.0])
    # a spread of 1e4 / tau: saturated but no NaN, the sum is k
    x = np.array([[0.0, -1e4, -2e4, -3e4, 5.0]])
    p, _ = forward(x, np.array([2.0]), np.array([0.01]), "grad", k_static=2)
    assert np.all(np.isfinite(p)) and abs(float(p.sum()) - 2.0) < 1e-12


def test_straight_through_with_grad() -> None:
    x = np.array([[3.0, 1.0, 2.0, 2.0], [0.0, -np.inf, 1.0, 0.5]])
    k, tau, g = np.array([2.0, 2.0]), np.array([1.0, 0.5]), np.array([[1.0, 0.0, -1.0, 2.0], [0.5, 0.0, 1.0, -1.0]])
    p, res = forward(x, k, tau, "hard", st_method="grad", k_static=2)
    np.testing.assert_array_equal(p, api.soft_topk(x, k, "hard", tau=tau))
    gx, gk, gtau = backward("hard", res, g, st_method="grad")
    want_x, want_tau = api.vjp(x, k, g, "grad", tau=tau, wrt=("x", "tau"))
    np.testing.assert_allclose(gx, want_x, rtol=0, atol=1e-14)
    np.testing.assert_allclose(gtau, want_tau, rtol=0, atol=1e-14)
    assert not np.any(gk)


def test_grad_needs_an_integer_k_static() -> None:
    x, k, tau = np.zeros((2, 3)), np.ones(2), np.ones(2)
    with pytest.raises(ValueError, match="k_static"):
        forward(x, k, tau, "grad")
    for bad in (0, 4, 1.0, True):
        with pytest.raises(ValueError, match="k_static"):
            forward(x, k, tau, "grad", k_static=bad)  # type: ignore[arg-type]


def _mp_reference(z: np.ndarray, k: int, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(p, J v)`` of one row at 60 digits: prefix and suffix elementary symmetric polynomials, the
    tangent by a central difference of step 1e-25."""
    import mpmath as mp

    def weights(zz: list[Any]) -> list[Any]:
        w = [mp.exp(a) for a in zz]
        pre = [[mp.mpf(1)] + [mp.mpf(0)] * k]
        for wi in w:
            last = pre[-1]
            pre.append([last[0]] + [last[j] + wi * last[j - 1] for j in range(1, k + 1)])
        suf = [[mp.mpf(1)] + [mp.mpf(0)] * k]
        for wi in reversed(w):
            last = suf[-1]
            suf.append([last[0]] + [last[j] + wi * last[j - 1] for j in range(1, k + 1)])
        suf.reverse()  # suf[i]: the entries from i on
        return [w[i] * mp.fsum(pre[i][j] * suf[i + 1][k - 1 - j] for j in range(k)) / pre[-1][k] for i in range(len(w))]

    with mp.workdps(60):
        base = [mp.mpf(float(a)) for a in z]
        h = mp.mpf("1e-25")
        up = weights([a + h * mp.mpf(float(b)) for a, b in zip(base, v, strict=True)])
        down = weights([a - h * mp.mpf(float(b)) for a, b in zip(base, v, strict=True)])
        p = np.array([float(a) for a in weights(base)])
        jv = np.array([float((a - b) / (2 * h)) for a, b in zip(up, down, strict=True)])
    return p, jv


def test_near_uniform_long_row_to_full_float64_accuracy() -> None:
    """n = 120, k = 60, spread 0.01: C(120, 60) ~ 1e35 subsets of similar weight. A log-space table
    normalised by the top entries carries values up to log C(n, k) ~ 80 and lost an order of
    magnitude here (4e-15 on p, 7e-15 on J v); the tilted program keeps both within 1e-15."""
    pytest.importorskip("mpmath")
    rng = np.random.default_rng(11)
    x, g = 0.01 * rng.standard_normal((1, 120)), rng.standard_normal((1, 120))
    p_ref, jv_ref = _mp_reference(x[0] - x.max(), 60, g[0])
    p, res = forward(x, np.array([60.0]), np.array([1.0]), "grad", k_static=60)
    gx, _, _ = backward("grad", res, g)
    assert np.max(np.abs(p[0] - p_ref)) <= 1e-15
    assert np.max(np.abs(gx[0] - jv_ref)) <= 1e-15 * np.max(np.abs(jv_ref))


def _engine_rows(x: np.ndarray, kv: int, tau: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = np.full(x.shape[0], float(kv))
    t = np.full(x.shape[0], tau)
    return x, k, t


def test_long_factors_in_blocks_match_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """k above SHORT: the upper levels' products sum their terms from stacked blocks of shifted
    copies; with BLOCK shrunk to a few hundred elements every such product takes several blocks
    (and the last one shorter). n = 70 and 75 (odd levels: identity nodes), k = 33, 40, 69, 70,
    masks, against the numpy engine at 1e-12."""
    from topk_cli.xp import _grad

    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 75)) * np.array([[0.1], [1.0], [3.0], [10.0], [1.0], [1.0]])
    x[4, 60:] = -np.inf  # 60 unmasked entries
    x[5, ::3] = 0.25  # ties
    cases = [(_engine_rows(x[:, :70], kv, 0.7), kv) for kv in (33, 40, 69, 70)]
    cases += [(_engine_rows(x[:4], kv, 1.3), kv) for kv in (33, 60)]
    cases += [(_engine_rows(x[4:5], 60, 1.0), 60)]
    for block in (_grad.BLOCK, 300):
        monkeypatch.setattr(_grad, "BLOCK", block)
        checked, _ = _compare("numpy", np.float64, [(c, kv) for c, kv in cases if kv <= c[0].shape[1]
                                                         and np.all(np.isfinite(c[0]).sum(axis=1) >= kv)],
                                  1e-12, 1e-12)
        assert checked >= 21, checked  # k = 69, 70 skip the batch with a 60-entry row


def test_the_tilt_keeps_p_k_far_from_underflow() -> None:
    """D = P(k drawn) under the tilt (the mode of the draw count when the mean is k): at least
    1 / (n + 1) on the adversarial suite and on wide rows (n = 1000, spreads from 0.01 to 1e4,
    k from 1 to n), in float32 and float64, so the tables that matter never reach subnormals."""
    import array_api_compat.numpy as xnp

    from topk_cli.xp import _grad
    from topk_cli.xp._common import scaled

    rng = np.random.default_rng(3)
    rows = []
    for scale in (0.01, 1.0, 30.0, 1e4):
        for kv in (1, 10, 500, 999, 1000):
            rows.append((scale * rng.standard_normal((2, 1000)), kv))
    for (x, k, tau), kv in _by_k(SUITE):
        rows.append(((x - np.nanmax(np.where(np.isfinite(x), x, np.nan), axis=1, keepdims=True)) / tau[:, None], kv))
    checked = 0
    for dtype in (np.float64, np.float32):
        for z0, kv in rows:
            z, _ = scaled(xnp, z0.astype(dtype), np.ones(z0.shape[0], dtype=dtype))
            lam, _ = _grad._tilt(xnp, z, kv)
            pi, q = _grad._draws(xnp, z - lam[:, None])
            a, c, _, _ = _grad._tree(xnp, pi, q, kv)
            total = (pi * a + q * c).astype(np.float64)
            n_fin = np.isfinite(z).sum(axis=1)
            assert np.all(total >= 1 / (n_fin[:, None] + 1) / 4), (dtype, kv, total.min())
            checked += z.shape[0]
    assert checked >= 2 * (40 + 86), checked
