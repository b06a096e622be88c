"""``exp_into`` and ``exp_new`` (``exp`` without its slow underflow path) keep every bit, so do
``logsumexp``, GradTopK's recursion and its outlook, the other operators and references that call
them, and the probe's records.

The oracle is the code before the change: ``np.exp`` everywhere and :func:`_old_logsumexp`,
the previous ``logsumexp`` (the verbatim copy the faithful path's bit test keeps).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields

import numpy as np
import pytest
from _ws_faithful_reference import logsumexp as _old_logsumexp

import topk_cli.operators.grad_recursive as gr
from topk_cli import recursion, references
from topk_cli.analysis.probe import stability_probe
from topk_cli.analysis.probe_grid import draw_scores, parse_scales
from topk_cli.api import scaled_scores
from topk_cli.operators import (
    _iterative_fast,
    _logsigned,
    _poisson,
    _weighted_softmax_faithful,
    _weighted_softmax_fast,
    gradtopk,
    iterative,
    sinkhorn,
    threshold,
    topk_softmax,
)
from topk_cli.operators._logspace import EXP_ZERO_BELOW, exp_into, exp_new, logsumexp
from topk_cli.references import ReferenceContext, esp_logs, forward_len


def _plain_exp(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.exp(a, out=out)


def _plain_exp_new(a: np.ndarray) -> np.ndarray:
    return np.exp(a)


#: Every module that calls ``exp_into`` or ``exp_new``.
_EXP_USERS = (gr, references, gradtopk, iterative, _iterative_fast, _logsigned, _weighted_softmax_faithful,
              _weighted_softmax_fast, _poisson, sinkhorn, threshold)


@pytest.fixture
def old_code(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Once called, every module on the probe's path computes exactly as before the change."""
    def use() -> None:
        for module in (gr, recursion, references, gradtopk, iterative, topk_softmax, _logsigned):
            if hasattr(module, "logsumexp"):
                monkeypatch.setattr(module, "logsumexp", _old_logsumexp)
        for module in _EXP_USERS:
            for name, plain in (("exp_into", _plain_exp), ("exp_new", _plain_exp_new)):
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, plain)
    return use


def _adversarial() -> np.ndarray:
    rng = np.random.default_rng(11)
    edges = [
        -np.inf, np.inf, np.nan, -0.0, 0.0, 709.78, 709.79, -708.39, -708.4, -744.44, -745.13, -745.14,
        EXP_ZERO_BELOW, -1e300, -np.finfo(np.float64).max, 5e-324, -5e-324,
    ]
    near = [float(v) for e in (-745.1332191019412, -745.1332191019411, EXP_ZERO_BELOW, -708.3964185322641)
            for v in (e, np.nextafter(e, -np.inf), np.nextafter(e, np.inf))]
    body = np.concatenate([
        rng.uniform(-760.0, -700.0, 4000),  # the subnormal results and the cut
        rng.uniform(-2000.0, 10.0, 4000),
        -rng.exponential(1e4, 2000),
        np.array(edges + near),
    ])
    return rng.permutation(body)


@pytest.mark.parametrize(
    "layout", ["contiguous", "strided", "reversed", "transposed", "all-low", "none-low", "sparse-low", "small"]
)
def test_exp_into_is_np_exp_bit_for_bit(layout: str) -> None:
    a = _adversarial()
    a = np.concatenate([a, a[: (-a.size) % 60]])  # 60 | size
    if layout == "strided":
        a = np.repeat(a, 2)[::2]
    elif layout == "reversed":
        a = a[::-1]
    elif layout == "transposed":
        a = a.reshape(60, -1).T
    elif layout == "all-low":
        a = np.where(a < EXP_ZERO_BELOW, a, -1e5)
    elif layout == "none-low":
        a = np.where(a < EXP_ZERO_BELOW, -3.0, a)
    elif layout == "sparse-low":  # too few to skip: plain exp
        a = np.where(a < EXP_ZERO_BELOW, -3.0, a)
        a[::97] = -800.0
    elif layout == "small":  # too small to check: plain exp
        a = a[a < -700.0][:300]
    with np.errstate(all="ignore"):
        want = np.exp(a)
        got = exp_into(a, np.empty_like(a))
        fresh = exp_new(a)
        in_place = a.copy()
        exp_into(in_place, in_place)
    assert got.tobytes() == want.tobytes()
    assert fresh.tobytes() == want.tobytes()
    assert in_place.tobytes() == want.tobytes()


def test_exp_below_the_cut_is_zero_and_other_dtypes_are_plain() -> None:
    grid = np.linspace(-800.0, EXP_ZERO_BELOW, 200_001)
    below = np.nextafter(EXP_ZERO_BELOW, -np.inf)
    with np.errstate(under="ignore"):
        assert not np.exp(grid[:-1]).any() and np.exp(below) == 0.0
        assert 0.0 < math.exp(-745.13)  # the cut is well below the last nonzero result
        for dtype in (np.float32, np.longdouble):
            a = np.array([-800.0, -50.0, -1e4, -np.inf], dtype=dtype)
            assert np.array_equal(exp_into(a, np.empty_like(a)), np.exp(a))  # longdouble bytes carry padding
            assert np.array_equal(exp_new(a), np.exp(a)) and exp_new(a).dtype == dtype
    assert np.exp(np.array([-800.0], dtype=np.longdouble))[0] > 0  # hence no cut there


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_logsumexp_keeps_its_bits(axis: int) -> None:
    rng = np.random.default_rng(2)
    for scale in (0.1, 1.0, 30.0, 800.0, 1e4):
        a = scale * rng.normal(size=(7, 33, 9))
        a[0, 3] = -np.inf  # a masked entry
        a[1, :, :] = -np.inf  # empty sums
        for view in (a, a.transpose(2, 0, 1), a[:, ::-1], a[..., ::2]):
            assert logsumexp(view, axis=axis).tobytes() == _old_logsumexp(view, axis=axis).tobytes()
            buf1, buf2 = np.empty_like(view), np.empty_like(view)
            got, want = logsumexp(view, axis=axis, buf=buf1), _old_logsumexp(view, axis=axis, buf=buf2)
            assert got.tobytes() == want.tobytes() and buf1.tobytes() == buf2.tobytes()


def _arrays(obj: object) -> list[bytes]:
    return [np.asarray(getattr(obj, f.name)).tobytes() for f in fields(obj)]  # type: ignore[arg-type]


def test_trace_forward_and_outlook_keep_their_bits_on_the_probe_grid(old_code: Callable[[], None]) -> None:
    """n 10 and 100, every default k, 13 scales, 5 trials: trace, forward and outlook arrays."""
    cases = []
    for n in (10, 100):
        draws = draw_scores(n, 5, dist="normal", seed=0)
        for scale in parse_scales("0.1:1e4:13"):
            z = scaled_scores(scale * draws, 1)
            ks = [k for k in (1, 2, 5, 10, 50) if k <= n]
            cases.extend((z, k, ks[-1]) for k in ks)

    broke = []

    def run() -> list[list[bytes]]:
        out = []
        with np.errstate(all="ignore"):
            ctx = None
            for z, k, kmax in cases:
                if ctx is None or ctx.z is not z:
                    ctx = ReferenceContext(z, kmax)  # the probe's tables, shared by every k
                rec = gr._run_recursion(z, k)
                broke.append(bool((rec.trace.failed_level >= 0).any()))
                fwd = gr._recursive_forward(z, k)
                out.append([
                    *_arrays(rec.trace), rec.p.tobytes(), rec.q.tobytes(), rec.p_bound.tobytes(),
                    fwd.p.tobytes(), fwd.q.tobytes(), fwd.code.tobytes(),
                    *_arrays(recursion.recursion_outlook(z, k, ctx)),
                ])
                if k > 1:  # the leave-one-out sums behind the outlook, as outlook_from_tables forms them
                    tab = ctx.esp()
                    prefix, suffix, _ = esp_logs(tab, min(z.shape[1], 2 * k, forward_len(tab)), k - 1)
                    out.append([recursion._loo(prefix.astype(np.float64), suffix.astype(np.float64), k - 1).tobytes()])
        return out

    new = run()
    old_code()
    assert run() == new
    assert any(broke) and not all(broke)  # rows that break and rows that do not


def test_probe_report_keeps_its_bits(old_code: Callable[[], None]) -> None:
    grid = {"methods": ["grad-recursive", "grad", "ot-sinkhorn", "thre-sigmoid", "thre-exp", "thre-laplace",
                        "iterative", "weighted-softmax"],
            "ns": [10, 100], "ks": [1, 2, 5, 50], "trials": 5, "scales": parse_scales("0.1:1e4:7")}
    new = stability_probe(**grid)  # type: ignore[arg-type]
    old_code()
    assert repr(stability_probe(**grid)) == repr(new)  # type: ignore[arg-type]
