"""thre-sigmoid's fast solve: fewer exact evaluations, the same answers on hard rows.

The solver evaluates the entries outside the top 2k from the Laplace start's own ``exp`` pass and
starts its exact Newton iteration from the root of a tail model. These tests check that this
saves evaluations on typical batches, and that rows where the shortcuts could go wrong (huge
spreads, ties at the 2k-th entry, a root at the 2k-th entry, tau 1e-300, masks, no tail at all)
still match the 50-digit mpmath reference, bit for bit between a batch and its rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import reference as ref
from mpmath import mp

import topk_cli as st
from topk_cli.api import _prepare
from topk_cli.operators.threshold_sigmoid import _tail_model, thre_sigmoid_forward


def _reference(x: list[float], k: int, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """``(p, 1 - p)`` of thre-sigmoid, both relatively accurate, from the mpmath threshold.

    At tau <= 1e-200 every gap between distinct entries is 1e184 or more (e^-gap is 0 in
    float64): the weights are the hard selection's (tied entries share), computed in mpmath.
    """
    if tau <= 1e-200:
        with mp.workdps(ref.DPS):
            hard = ref.hard(x, k, tau)
            return np.array([float(v) for v in hard]), np.array([float(1 - v) for v in hard])
    f, _ = ref.THRESHOLD_F["thre-sigmoid"]
    fc = ref.THRESHOLD_FC["thre-sigmoid"]
    with mp.workdps(ref._dps(x, tau, ref.DPS)):
        z, idx, n = ref._split(x, tau)
        p, q = np.zeros(n), np.ones(n)
        if k == len(z):
            p[idx], q[idx] = 1.0, 0.0
            return p, q
        lam = ref.threshold_lambda(z, k, "thre-sigmoid")
        p[idx] = [float(f(v - lam)) for v in z]
        q[idx] = [float(fc(v - lam)) for v in z]
    return p, q


def _row(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    x = rng.normal(size=n)
    if kind == "spread-1e6":
        x *= 1e6
    elif kind == "gaps-800":  # lambda - s_2k beyond 709: e^{lambda - s_2k} overflows
        x = -800.0 * np.arange(n) + rng.normal(size=n)
    elif kind == "offset-1e6":
        x += 1e6
    elif kind == "root-at-s2k":  # 2k equal entries, the rest far below: lambda = s_2k + 1e-21
        x = np.full(n, -50.0)
        x[:6] = 1.0
    elif kind == "ties-at-s2k":
        x = np.round(x * 2) / 2
        x[:3] = 2.0
    elif kind == "all-equal":
        x = np.full(n, 0.25)
    elif kind == "masked-tail":
        x[rng.random(n) < 0.5] = -np.inf
        x[:3] = rng.normal(size=3)
    elif kind == "masked-top":  # fewer than 2k finite entries: the tail is all masked
        x[4:] = -np.inf
    elif kind == "gap-1410":  # every term of the residual below e^-700 at the Laplace start
        x = -1410.0 - 60.0 * rng.random(n)
        x[0] = 0.0
    return x


KINDS = ("normal", "spread-1e6", "gaps-800", "offset-1e6", "root-at-s2k", "ties-at-s2k",
         "all-equal", "masked-tail", "masked-top", "gap-1410")


@pytest.mark.parametrize(("k", "tau"), [(3, 1.0), (1, 0.05), (3, 1e-6), (3, 1e-300)])
def test_hard_rows_match_mpmath_and_batch_equals_rows(k: int, tau: float) -> None:
    rng = np.random.default_rng(2026 + k)
    n = 24
    batch = np.stack([_row(rng, kind, n) for kind in KINDS])
    result = st.evaluate(batch, k, "thre-sigmoid", tau=tau)
    assert result.ok
    for b, kind in enumerate(KINDS):
        row = st.evaluate(batch[b], k, "thre-sigmoid", tau=tau)
        assert np.array_equal(row.weights, result.weights[b]), kind
        assert np.array_equal(row.complement, result.complement[b]), kind
        ref_p, ref_q = _reference(batch[b].tolist(), k, tau)
        np.testing.assert_allclose(result.weights[b], ref_p, rtol=0, atol=1e-13, err_msg=kind)
        np.testing.assert_allclose(result.complement[b], ref_q, rtol=0, atol=1e-13, err_msg=kind)
        small_p, small_q = ref_p > 1e-300, ref_q > 1e-300
        np.testing.assert_allclose(result.weights[b][small_p], ref_p[small_p], rtol=1e-12, err_msg=kind)
        np.testing.assert_allclose(result.complement[b][small_q], ref_q[small_q], rtol=1e-12, err_msg=kind)


@pytest.mark.parametrize("gap", [1380.0, 1400.0, 1410.0, 1440.0])
def test_threshold_matches_mpmath_where_every_term_is_tiny(gap: float) -> None:
    # k = 1, the other entries gap..gap+60 below the first: lambda ~ -gap / 2 and every term of
    # the residual is about e^{-gap/2}, on both sides of e^-700 (normal and subnormal numbers).
    # q of the first entry is e^lambda: 1e-300 at gap 1380, checked relatively below.
    rng = np.random.default_rng(7)
    x = -gap - 60.0 * rng.random((3, 30))
    x[:, 0] = 0.0
    z = _prepare(x, 1, "thre-sigmoid", 1.0).z
    fwd = thre_sigmoid_forward(z, 1)
    assert fwd.aux["iterations"].max() <= 3
    for b in range(3):
        with mp.workdps(40):
            lam = float(ref.threshold_lambda([mp.mpf(float(v)) for v in z[b]], 1, "thre-sigmoid"))
        assert fwd.aux["lambda"][b] == pytest.approx(lam, rel=1e-14)
        ref_p, ref_q = _reference(x[b].tolist(), 1, 1.0)
        small_p, small_q = ref_p > 1e-300, ref_q > 1e-300
        np.testing.assert_allclose(fwd.p[b][small_p], ref_p[small_p], rtol=1e-12)
        np.testing.assert_allclose(fwd.q[b][small_q], ref_q[small_q], rtol=1e-12)


def test_terms_beyond_e_minus_700_still_count() -> None:
    # k = 2, lambda = -712: q = p = 2.2e-300 for the entries 690 above and below it; the entry
    # 712 above (q = e^-712, its e^{z - lambda} overflows) and the 200 entries 712 below (tail
    # terms e^-712 each, e^{lambda - s_2k} overflows) move p and q by 3e-10 and 2e-8 relatively
    rng = np.random.default_rng(1)
    x = np.concatenate([[0.0, -22.0, -1402.0, -1423.0], -1424.0 - 0.5 * rng.random(200)])
    result = st.evaluate(x, 2, "thre-sigmoid")
    ref_p, ref_q = _reference(x.tolist(), 2, 1.0)
    small_p, small_q = ref_p > 1e-300, ref_q > 1e-300
    np.testing.assert_allclose(result.weights[small_p], ref_p[small_p], rtol=1e-12)
    np.testing.assert_allclose(result.complement[small_q], ref_q[small_q], rtol=1e-12)


def test_no_tail_and_k_near_n() -> None:
    # n <= 2k: everything is in the sorted top, no tail model
    x = np.random.default_rng(5).normal(size=(3, 7)) * 3
    for k in (4, 6):
        result = st.evaluate(x, k, "thre-sigmoid")
        for b in range(3):
            ref_p, ref_q = _reference(x[b].tolist(), k, 1.0)
            np.testing.assert_allclose(result.weights[b], ref_p, rtol=1e-12, atol=1e-13)
            np.testing.assert_allclose(result.complement[b], ref_q, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("k", "tau"), [(10, 1.0), (100, 1.0), (10, 0.2), (1, 1.0)])
def test_typical_batches_need_at_most_three_exact_evaluations(k: int, tau: float) -> None:
    # Started from the Laplace threshold (0.5-0.7 from the root) Newton needed 5-6 evaluations
    # on every such row; the tail model's root is close enough for 2-3.
    x = np.random.default_rng(k).normal(size=(64, 1000))
    z = _prepare(x, k, "thre-sigmoid", tau).z
    fwd = thre_sigmoid_forward(z, k)
    assert fwd.aux["iterations"].max() <= 3
    np.testing.assert_allclose(fwd.p.sum(axis=1), k, rtol=1e-14)


def test_tail_model_is_exact_for_equal_entries_and_third_order_otherwise() -> None:
    rng = np.random.default_rng(9)
    y = np.concatenate([np.full((1, 50), 0.3), rng.random((3, 50)), np.zeros((1, 50))])
    w0, w1, y1 = _tail_model(y, y.sum(axis=1))
    for v in (1.0, 4.0, 30.0):
        exact = (y / (y + v)).sum(axis=1)
        model = w0 / v + w1 / (y1 + v)
        assert model[0] == pytest.approx(exact[0], rel=1e-14)
        assert model[-1] == 0.0
        # the error is below sum (y / v)^3, the first term the rule does not match
        bound: Any = ((y / v) ** 3).sum(axis=1)
        assert np.all(np.abs(model - exact) <= bound + 1e-15)
