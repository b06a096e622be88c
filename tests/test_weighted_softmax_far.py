"""``weighted-softmax``'s certified fast path on rows with far entries (more than ``FAST_MAX_GAP`` below
the maximum), whose ``e^z`` is subnormal or 0 and whose errors the bound charges absolutely."""

from __future__ import annotations

import numpy as np
import pytest
import reference as R
from golden_store import golden

import topk_cli as st
from topk_cli.operators import _weighted_softmax_fast as wsf
from topk_cli.operators import weighted_softmax as ws

GAP = wsf.FAST_MAX_GAP


def _ref(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    p, q = _ref_values(tuple(float(v) for v in x.tolist()), int(k))
    return np.array(p), np.array(q)


@golden("test_weighted_softmax_far.ref")  # stored: tests/golden/references.json.gz
def _ref_values(x: tuple[float, ...], k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    p, q = R.weighted_softmax_with_complement(list(x), k)
    return tuple(float(v) for v in p), tuple(float(v) for v in q)


def _check_certified(z: np.ndarray, k: int, fwd: st.Forward | None = None) -> int:
    """Every certified row of ``ws_fast(z, k)`` against mpmath, with its claimed bounds; the number certified."""
    fwd = wsf.ws_fast(z, k) if fwd is None else fwd
    for b in np.flatnonzero(fwd.aux["fast"] > 0):
        p_ref, q_ref = _ref(z[b], k)
        err = np.abs(fwd.p[b] - p_ref).max()
        assert err <= fwd.aux["error_estimate"][b] <= wsf.FAST_P_BOUND, (z[b], k, err)
        normal = np.abs(q_ref) >= 2.0**-1022
        assert (np.abs(fwd.q[b] - q_ref)[normal] <= wsf.FAST_Q_BOUND * np.abs(q_ref)[normal]).all(), (z[b], k)
    return int(fwd.aux["fast"].sum())


def _adversarial(seed: int, count: int) -> list[tuple[np.ndarray, int]]:
    """Rows with at least one far entry: n in 2..60, k in 1..n-1, far gaps 700..1e5 (also inside the
    subnormal range of e^z), ties among the near entries, and top-k sets reaching the far entries."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(2, 61))
        m = int(rng.integers(1, n))  # near entries (the top included)
        span = float(rng.choice([0.5, 5.0, 60.0, 400.0, 699.0]))
        near = -span * rng.random(m)
        near[0] = 0.0
        if m > 2 and rng.random() < 0.5:  # ties
            near[rng.integers(1, m, size=m // 2)] = near[int(rng.integers(1, m))]
        reach = float(rng.choice([1.0, 8.0, 45.0, 300.0, 1e5]))  # how far below -700 the far entries go
        far = -GAP - 1e-9 - reach * rng.random(n - m)
        z = rng.permutation(np.concatenate([near, far]))
        k = int(rng.integers(1, n)) if rng.random() < 0.5 else int(rng.integers(1, min(m + 2, n) + 1))
        out.append((z, min(k, n - 1) if n > 1 else 1))
    return out


def test_rows_where_the_far_entries_matter_are_refused_or_right() -> None:
    # [0, -1000], k = 2: the far entry takes half a unit in round two (p = 1.5, 0.5), invisible in float64
    z = np.array([[0.0, -1000.0]])
    assert wsf.ws_fast(z, 2).aux["fast"].tolist() == [0.0]
    np.testing.assert_allclose(st.soft_topk([0.0, -1000.0], 2, "weighted-softmax"), [1.5, 0.5], rtol=0, atol=1e-12)
    assert wsf.ws_fast(z, 1).aux["fast"].tolist() == [0.0]  # 1 - p_1 = e^-1000 underflows: no relative q
    certified = 0
    row = np.array([[0.0, -1.0, -705.0, -720.0, -1000.0]])
    for k in range(1, 5):
        certified += _check_certified(row, k)
    # many far entries: 10 near ones, 990 far (down to -1690), k up to 11; 290 far at k = 50 (the
    # reference's cost)
    x = np.concatenate([[0.0], -3.0 * np.arange(1, 10), -GAP - 0.5 - np.arange(990.0)])[None, :]
    for k in (1, 10, 11):
        certified += _check_certified(x, k)
    certified += _check_certified(x[:, :300], 50)
    # the near entries saturate before round k (k > number of near entries, gap to the far ones > 700)
    sat = np.array([[0.0, -0.3, -800.0, -801.0, -1e4], [0.0, -40.0, -740.0, -745.0, -746.0]])
    for k in (2, 3, 4):
        certified += _check_certified(sat, k)
    assert certified >= 8


def test_seeded_adversarial_rows_with_far_entries_against_mpmath() -> None:
    rows = _adversarial(5, 60)
    certified = refused = 0
    for z, k in rows:
        c = _check_certified(z[None, :], k)
        certified += c
        refused += 1 - c
    assert certified >= 20 and refused >= 3  # the new path is exercised, and it does refuse some rows


def _perturbed_weights(seed: int):
    """``_ws_weights`` whose far ``w`` are off by up to the allowed :data:`_EXP_ABS` (what an ``exp`` at
    the edge of the bound's model may return): the bound must still hold against the exact result."""
    original = wsf._ws_weights
    rng = np.random.default_rng(seed)

    def weights(z: np.ndarray):
        top, w, w_min, _ = original(z)
        is_far = z < -GAP
        w = np.where(is_far, np.maximum(w + wsf._EXP_ABS * rng.choice([-1.0, 1.0], size=z.shape), 0.0), w)
        rest = w.copy()
        rest[np.arange(z.shape[0]), top] = -np.inf
        return top, w, w_min, np.maximum(rest.max(axis=-1), 0.0)

    return weights


def test_the_bound_covers_far_errors_at_the_edge_of_its_exp_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # S of the order of e^{-672} in round two: an absolute error of 8 * 2^-1022 in each of 37 or 38 far
    # e^z is a relative 1e-14 to 2e-13 of S; the bound must see it (without the absolute far term of
    # |dS| it certified the first two rows with bounds of 4e-15 and 1.3e-14, 1.1e-14 and 1.1e-13 off)
    monkeypatch.setattr(wsf, "_ws_weights", _perturbed_weights(1))
    z = np.array([[0.0, -672.0] + [-720.0] * 38, [0.0, -675.0, -676.0] + [-730.0] * 37,
                  [0.0, -668.0] + [-760.0] * 38, [0.0, -0.5, -670.0] + [-710.0] * 37,
                  [0.0, -680.0] + [-750.0] * 38, [0.0, -1.0] + [-1e4] * 38])
    certified = 0
    for k in (1, 2, 3):
        certified += _check_certified(z, k)
    for seed in (7, 8):
        for zz, k in _adversarial(seed, 15):
            certified += _check_certified(zz[None, :], k)
    assert certified >= 10


def test_rows_without_far_entries_keep_their_bits() -> None:
    # the far terms are exact zeros on rows without far entries: a batch with far rows gives the other
    # rows the bits they get in a batch without any (where the bound runs without the far terms at all)
    rng = np.random.default_rng(2)
    near = rng.standard_normal((6, 40)) * np.array([1.0, 10.0, 50.0, 100.0, 150.0, 0.1])[:, None]
    near -= near.max(axis=1, keepdims=True)
    near = np.maximum(near, -GAP)
    far = near[:3].copy()
    far[:, :5] = -GAP - 10.0 ** np.arange(5)
    for k in (1, 4, 12):
        alone = wsf.ws_fast(near, k)
        mixed = wsf.ws_fast(np.vstack([far[:1], near[:3], far[1:], near[3:]]), k)
        idx = [1, 2, 3, 6, 7, 8]
        for name in ("p", "q"):
            np.testing.assert_array_equal(getattr(mixed, name)[idx], getattr(alone, name))
        for name, val in alone.aux.items():
            np.testing.assert_array_equal(mixed.aux[name][idx], val, err_msg=name)
        assert alone.aux["fast"].sum() >= 4 and mixed.aux["fast"][[0, 4, 5]].sum() >= 1


def test_derivatives_on_newly_certified_rows() -> None:
    rng = np.random.default_rng(9)
    z = np.array([[0.0, -0.5, -1.2, -720.0, -750.0, -1000.0], [0.0, -3.0, -0.1, -2.0, -701.0, -745.5],
                  [0.0, -20.0, -30.0, -705.0, -710.0, -2e4]])
    for k in (2, 3):
        fwd = ws.weighted_softmax_topk(z, k)
        assert (fwd.aux["fast"] == 1).all()
        slow = ws._ws_faithful(z, k)
        v = rng.standard_normal(z.shape)
        want = ws._ws_vjp(slow, z, k, v)
        np.testing.assert_allclose(ws._ws_vjp(fwd, z, k, v), want, rtol=0, atol=1e-12)
        _, got = ws._ws_forward_vjp(z, k, v)  # the API's route: ws_fast_vjp
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        jac = ws._ws_jacobian(fwd, z, k)
        np.testing.assert_allclose(jac, ws._ws_jacobian(slow, z, k), rtol=0, atol=1e-12)
    # and against finite differences of the mpmath reference (d p_i / d z_j), on the first row and on
    # one whose S is of the order of e^{-675} in round two (there the faithful path's is 3e-14 off)
    for row in (z[0], np.array([0.0, -675.0, -676.0] + [-730.0] * 7)):
        fd = np.array([[float(v) for v in r]
                       for r in R.jacobian_fd(R.weighted_softmax, row.tolist(), 2, dps=80, step_digits=25)])
        fwd = ws.weighted_softmax_topk(row[None, :], 2)
        assert fwd.aux["fast"].tolist() == [1.0]
        np.testing.assert_allclose(ws._ws_jacobian(fwd, row[None, :], 2)[0], fd, rtol=0, atol=1e-15)
