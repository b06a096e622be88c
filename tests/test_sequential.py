"""Accuracy of the sequential operators ``iterative`` and ``weighted-softmax``.

The oracle is the naive recurrence of the operators' definition run in mpmath at a precision high enough that
``1 - p`` keeps its digits (``weighted-softmax`` needs ``q`` *relatively*, so the precision grows
with the spread of ``z``). It starts from the same float64 ``z = (x - max x) / tau`` as the
library, so the comparison measures the algorithm, not the rounding of the quotient.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from golden_store import golden
from mpmath import mp, mpf

import topk_cli as st
from topk_cli.analysis.probe import draw_scores
from topk_cli.errors import NumericalFailureError
from topk_cli.operators import sequential as seq

METHODS = ("iterative", "weighted-softmax")


def _z(x: list[float], tau: float) -> list[float]:
    """The library's shifted, scaled row (float64, same operations as the public API)."""
    arr = np.asarray(x, dtype=np.float64)
    fin = np.isfinite(arr)
    top = arr[fin].max()
    return [float((v - top) / tau) if f else -math.inf for v, f in zip(arr, fin)]


def _digits_needed(z: list[float], k: int, *, relative: bool) -> int:
    """``1 - p`` to absolute accuracy ``1e-60 / max|z|`` (enough for ``iterative``'s ``p``), or
    relatively (``weighted-softmax``; any complement): ``q`` can be as small as ``e^{-k spread}``."""
    fin = [v for v in z if v != -math.inf]
    spread = max(fin) - min(fin)
    extra = int(k * spread / math.log(10)) if relative else 0
    return 60 + extra + int(math.log10(1.0 + spread))


def ref(method: str, x: list[float], k: int, tau: float, *, relative: bool = True) -> tuple[list, list]:
    """``(p, 1 - p)`` by the naive recurrence in mpmath; masked entries get 0 (complement 1).

    ``relative=False`` lowers the precision to what ``iterative``'s ``p`` needs (not its ``q``).
    """
    return _ref(method, [float(v) for v in x], k, float(tau), relative)


@golden("test_sequential.ref")  # stored: tests/golden/references.json.gz
def _ref(method: str, x: list[float], k: int, tau: float, relative: bool) -> tuple[list, list]:
    z = _z(x, tau)
    idx = [i for i, v in enumerate(z) if v != -math.inf]
    with mp.workdps(_digits_needed(z, k, relative=relative or method == "weighted-softmax")):
        zz = [mpf(z[i]) for i in idx]
        p = [mpf(0)] * len(zz)
        if method == "iterative":
            zmin = min(zz)
            zz = [v - zmin for v in zz]
            for _ in range(k):
                y = [(1 - pi) * v for pi, v in zip(p, zz)]
                m = max(y)
                e = [mpmath.exp(v - m) for v in y]
                tot = mpmath.fsum(e)
                p = [pi + ei / tot for pi, ei in zip(p, e)]
        else:
            for _ in range(k):
                u = [(1 - pi) * mpmath.exp(v) for pi, v in zip(p, zz)]
                tot = mpmath.fsum(u)
                p = [pi + ui / tot for pi, ui in zip(p, u)]
        full = [mpf(0)] * len(z)
        for i, v in zip(idx, p):
            full[i] = v
        return [float(v) for v in full], [float(1 - v) for v in full]


def naive(method: str, x: list[float], k: int, tau: float) -> np.ndarray:
    """The recurrence in float64 with ``1 - p`` by subtraction (each softmax itself stable)."""
    z = np.asarray(_z(x, tau))
    p = np.zeros_like(z)
    if method == "iterative":
        z = z - z.min()
        for _ in range(k):
            y = (1 - p) * z
            e = np.exp(y - y.max())
            p = p + e / e.sum()
    else:
        for _ in range(k):  # the usual stable weighted softmax: log-weights, max subtracted
            with np.errstate(divide="ignore"):  # log 0 = -inf for a weight that rounded to 0
                a = np.log(1 - p) + z
            e = np.exp(a - a.max())
            p = p + e / e.sum()
    return p


def _close(got: np.ndarray, want: list[float], rtol: float, atol: float) -> bool:
    return bool(np.allclose(got, want, rtol=rtol, atol=atol))


# --------------------------------------------------------------------------- forward accuracy


@pytest.mark.parametrize("method", METHODS)
def test_matches_mpmath_over_spreads_and_taus(method: str) -> None:
    rng = np.random.default_rng(7)
    worst_p = worst_q = 0.0
    for n in (1, 2, 3, 5, 6):
        for tau in (1e-3, 0.03, 0.3, 1.0, 10.0, 1e3):
            for spread in (1.0, 3.0) if tau > 1e-3 else (1.0,):  # (mpmath needs ~k spread/tau digits)
                x = (spread * rng.standard_normal(n)).tolist()
                for k in sorted({1, 2, min(3, n), n} - {0}):
                    if k > n:
                        continue
                    r = st.evaluate(x, k, method, tau=tau)
                    assert r.ok
                    p_ref, q_ref = ref(method, x, k, tau)
                    scale = max(1.0, max(abs(v) for v in p_ref))
                    worst_p = max(worst_p, float(np.max(np.abs(r.weights - p_ref))) / scale)
                    # the complement relatively (down to the float64 range), where it matters
                    rel = np.abs(r.complement - q_ref) / np.maximum(np.abs(q_ref), 1e-300)
                    worst_q = max(worst_q, float(np.max(np.where(np.abs(q_ref) > 1e-290, rel, 0.0))))
    assert worst_p < 1e-13, worst_p
    # relative accuracy of e^{-gap}-small complements: rounding of z itself costs ~|z| eps
    assert worst_q < 1e-9, worst_q


def test_weighted_softmax_k2_limit_is_one_and_a_half_and_a_half() -> None:
    x = [3.0, 2.0, 1.0, 0.0]
    p = st.soft_topk(x, 2, "weighted-softmax", tau=1e-3)
    np.testing.assert_allclose(p, [1.5, 0.5, 0.0, 0.0], atol=1e-12)
    q = st.evaluate(x, 2, "weighted-softmax", tau=1e-3).complement
    np.testing.assert_allclose(q, [-0.5, 0.5, 1.0, 1.0], atol=1e-12)
    # the naive float64 recurrence hides the wrong limit behind 1 - p = 0
    np.testing.assert_allclose(naive("weighted-softmax", x, 2, 1e-3), [1.0, 1.0, 0.0, 0.0], atol=1e-12)


def test_weighted_softmax_k3_small_tau_goes_through_a_negative_normaliser() -> None:
    x = [3.0, 2.0, 1.0, 0.0]
    p = st.soft_topk(x, 3, "weighted-softmax", tau=1e-3)
    p_ref, _ = ref("weighted-softmax", x, 3, 1e-3)
    np.testing.assert_allclose(p, p_ref, atol=1e-12)
    np.testing.assert_allclose(p, [2.5, 0.5, 0.0, 0.0], atol=1e-12)


@pytest.mark.parametrize(
    ("method", "x", "k", "tau"),
    [
        ("weighted-softmax", [3.0, 2.0, 1.0, 0.0], 2, 1e-3),
        ("weighted-softmax", [0.5, 0.46, 0.1, -0.3], 3, 1e-3),
        # q_1 = e^{-40} is lost by 1 - p, but q_1 * (z_1 - min z) = 4e7 decides round three
        ("iterative", [0.0, -0.04, -1e22, -2e22], 3, 1e-3),
    ],
)
def test_naive_float64_is_wrong_where_the_faithful_code_is_right(
    method: str, x: list[float], k: int, tau: float
) -> None:
    p_ref, _ = ref(method, x, k, tau, relative=False)
    assert not _close(naive(method, x, k, tau), p_ref, rtol=1e-3, atol=1e-3)
    assert _close(st.soft_topk(x, k, method, tau=tau), p_ref, rtol=1e-12, atol=1e-12)


def test_iterative_exceeds_one_at_k_equal_n() -> None:
    p = st.soft_topk([1.0, 0.0], 2, "iterative")
    p_ref, q_ref = ref("iterative", [1.0, 0.0], 2, 1.0)
    np.testing.assert_allclose(p, p_ref, rtol=1e-14)
    assert p[0] > 1.29 and abs(p.sum() - 2.0) < 1e-14
    np.testing.assert_allclose(st.evaluate([1.0, 0.0], 2, "iterative").complement, q_ref, rtol=1e-13)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("tau", [1e-3, 0.5, 1e3])
def test_k1_is_softmax(method: str, tau: float) -> None:
    x = np.array([0.3, -1.2, 0.8, 0.1, 2.0, 1e-3])
    z = (x - x.max()) / tau
    softmax = np.exp(z) / np.exp(z).sum()
    np.testing.assert_allclose(st.soft_topk(x, 1, method, tau=tau), softmax, rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("method", METHODS)
def test_edge_cases(method: str) -> None:
    # n = 1, k = n, all equal, ties, huge offsets
    assert st.soft_topk([4.0], 1, method).tolist() == [1.0]
    np.testing.assert_allclose(st.soft_topk([2.0, 2.0, 2.0], 2, method), [2 / 3] * 3, rtol=1e-14)
    x = np.array([0.7, 0.2, 0.7, -0.4, 0.2])
    for k in (1, 2, 3, 5):
        p = st.soft_topk(x, k, method, tau=0.3)
        assert p[0] == p[2] and p[1] == p[4]
        assert abs(p.sum() - k) < 1e-13
        np.testing.assert_allclose(st.soft_topk(x + 1e6, k, method, tau=0.3), p, atol=1e-9)
        np.testing.assert_allclose(p, ref(method, x.tolist(), k, 0.3)[0], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("method", METHODS)
def test_wide_spread_small_tau_stays_finite(method: str) -> None:
    rng = np.random.default_rng(3)
    x = 1e4 * rng.standard_normal((4, 7))
    for k in (1, 2, 3, 7):
        r = st.evaluate(x, k, method, tau=1e-3)
        assert r.ok and np.isfinite(r.weights).all()
        np.testing.assert_allclose(r.weights.sum(axis=-1), k, rtol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_masked_entries_behave_as_absent(method: str) -> None:
    x = [0.4, -np.inf, 1.1, -0.3, -np.inf, 0.9]
    kept = [0, 2, 3, 5]
    sub = [x[i] for i in kept]
    for k in (1, 2, 4):
        p = st.soft_topk(x, k, method, tau=0.7)
        assert p[1] == 0.0 and p[4] == 0.0
        np.testing.assert_allclose(p[kept], st.soft_topk(sub, k, method, tau=0.7), rtol=1e-14)
        q = st.evaluate(x, k, method, tau=0.7).complement
        assert q[1] == 1.0 and q[4] == 1.0
        jac = st.jacobian(x, k, method, tau=0.7)
        assert not jac[[1, 4]].any() and not jac[:, [1, 4]].any()
        np.testing.assert_allclose(jac[np.ix_(kept, kept)], st.jacobian(sub, k, method, tau=0.7), atol=1e-14)
        v = np.array([1.0, 5.0, -2.0, 0.5, 7.0, 3.0])
        np.testing.assert_allclose(st.vjp(x, k, v, method, tau=0.7), v @ jac, atol=1e-14)


# --------------------------------------------------------------------------- derivatives


def _fd_reference_jacobian(method: str, x: list[float], k: int, tau: float) -> np.ndarray:
    """Central differences of the mpmath recurrence in x (step 1e-12 at 60+ digits)."""
    n = len(x)
    h = mpf("1e-15")
    out = np.zeros((n, n))
    with mp.workdps(80):
        for j in range(n):
            cols = []
            for sign in (1, -1):
                xs = [mpf(v) for v in x]
                xs[j] += sign * h
                z = [(v - max(xs)) / tau for v in xs]
                p = [mpf(0)] * n
                if method == "iterative":
                    zmin = min(z)
                    d = [v - zmin for v in z]
                    for _ in range(k):
                        y = [(1 - pi) * v for pi, v in zip(p, d)]
                        e = [mpmath.exp(v - max(y)) for v in y]
                        p = [pi + ei / mpmath.fsum(e) for pi, ei in zip(p, e)]
                else:
                    for _ in range(k):
                        u = [(1 - pi) * mpmath.exp(v) for pi, v in zip(p, z)]
                        p = [pi + ui / mpmath.fsum(u) for pi, ui in zip(p, u)]
                cols.append(p)
            out[:, j] = [float((a - b) / (2 * h)) for a, b in zip(*cols)]
    return out


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("tau", [0.1, 1.0, 100.0])
def test_jacobian_matches_finite_differences_of_the_reference(method: str, tau: float) -> None:
    rng = np.random.default_rng(11)
    for n, k in ((2, 1), (4, 2), (5, 3), (5, 5)):
        x = rng.uniform(-1.0, 1.0, n).tolist()
        jac = st.jacobian(x, k, method, tau=tau)
        want = _fd_reference_jacobian(method, x, k, tau)
        err = np.abs(jac - want).max() / max(np.abs(want).max(), 1e-300)
        assert err < 1e-8, (n, k, err)


@pytest.mark.parametrize("method", METHODS)
def test_vjp_is_v_times_jacobian_on_a_batch(method: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 6)) * np.array([[0.1], [1.0], [5.0]])
    v = rng.normal(size=(3, 6))
    for k in (1, 3, 6):
        for tau in (0.05, 1.0):
            jac = st.jacobian(x, k, method, tau=tau)
            got = st.vjp(x, k, v, method, tau=tau)
            want = np.einsum("bi,bij->bj", v, jac)
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * np.abs(jac).max())


def test_iterative_jacobian_keeps_tiny_entries_relatively_accurate() -> None:
    # saturated entries: dp/dx ~ e^{-gap}; total-minus-own would leave rounding noise of ~1e-16
    x = [2.0, 0.0, -1.0]
    jac = st.jacobian(x, 1, "iterative", tau=0.05)
    want = _fd_reference_jacobian("iterative", x, 1, 0.05)
    np.testing.assert_allclose(jac, want, rtol=1e-8, atol=0.0)


def test_weighted_softmax_derivative_beyond_overflow_is_returned() -> None:
    # gaps of 1000 in x / tau: e^{z_i} / S overflows while what it multiplies underflows; the
    # derivative (exponentially small) is recomputed in log space and returned, not refused
    x = [3.0, 2.0, 1.0, 0.0]
    tau = 1e-3
    jac = st.jacobian(x, 2, "weighted-softmax", tau=tau)
    want = _fd_reference_jacobian("weighted-softmax", x, 2, tau)
    assert np.isfinite(jac).all()
    np.testing.assert_allclose(jac * tau, want * tau, rtol=0, atol=1e-12)  # in units of 1/tau
    v = np.array([1.0, 0.0, -2.0, 0.5])
    np.testing.assert_allclose(st.vjp(x, 2, v, "weighted-softmax", tau=tau) * tau, v @ want * tau, rtol=0, atol=1e-12)
    # iterative's derivative stays finite there (it is exponentially small, not overflowing)
    assert np.isfinite(st.jacobian(x, 2, "iterative", tau=1e-3)).all()


@pytest.mark.parametrize("scale", [1.0, 30.0, 300.0])
def test_weighted_softmax_log_space_derivative_equals_the_linear_one(scale: float) -> None:
    # the log-space path (used where the linear one overflows) computes the same forward mode:
    # compare the two wherever the linear one is finite, ties and masked entries included
    rng = np.random.default_rng(5)
    z = np.round(rng.normal(size=(6, 5)), 1) * scale
    z[1, :2] = z[1, 2]
    z[2, 3] = -np.inf
    z = z - np.max(z, axis=-1, keepdims=True)
    for k in (1, 2, 4):
        with np.errstate(all="ignore"):  # masked entries: -inf arithmetic, as under the public API
            fwd = seq.weighted_softmax_topk(z, k)
            lin = seq._ws_jacobian_linear(fwd, z, k)
        log = seq._ws_jacobian_log(fwd, z, k, np.ones(z.shape[0], dtype=bool))
        ok = np.isfinite(lin).all(axis=(1, 2)) & (fwd.codes() == "ok")
        assert ok.sum() >= 3
        np.testing.assert_allclose(log[ok], lin[ok], rtol=0, atol=1e-12)


def test_weighted_softmax_derivative_is_refused_where_float64_cannot_resolve_it() -> None:
    # at gaps of 1e20 the logs carry errors of ~1e4: refused, never returned as noise
    with pytest.raises(NumericalFailureError, match="ill-conditioned"):
        st.jacobian([0.0, 1.0, 2.0], 2, "weighted-softmax", tau=1e-20)
    with pytest.raises(NumericalFailureError, match="ill-conditioned"):
        st.vjp([0.0, 1.0, 2.0], 2, [1.0, 0.0, 0.0], "weighted-softmax", tau=1e-20)


# --------------------------------------------------------------------------- ill-conditioned rows

TOL = seq.ILL_CONDITIONED_TOLERANCE

# x = c (3, 2, 1, 0), k = 3: the round-3 normaliser S = sum_j (1 - p_j) e^{z_j} crosses 0 (a pole of
# weighted-softmax) at c* = 1.29767596828515988 (bisection in mpmath); near it p ~ 1/S and float64
# loses ~|log10 S| digits.
POLE = 1.29767596828515988


def _pole_row(offset: float) -> list[float]:
    return (POLE * (1.0 + offset) * np.array([3.0, 2.0, 1.0, 0.0])).tolist()


# iterative at k = n, n = 11 (found by a small random search): the rounds amplify rounding errors
# ~30-fold each once s_i (1 - s_i)(z_i - min z) >> 1; float64 ends 6.9e-8 away from the exact result
ITERATIVE_UNSTABLE = [186.9, -195.6, -125.3, -126.4, 3.8, -6.3, 2.7, -19.9, -4.9, 41.8, -40.2]


def _raw(method: str, x: list[float], k: int) -> np.ndarray:
    """The operator's own float64 result (which ``evaluate`` replaces by NaN on a flagged row)."""
    z = np.asarray(x) - max(x)
    forward = seq.weighted_softmax_topk if method == "weighted-softmax" else seq.iterative_topk
    return forward(z[None], k).p[0]


@pytest.mark.parametrize(
    ("method", "x", "k", "level", "cause"),
    [
        ("weighted-softmax", _pole_row(1e-5), 3, 3, "normaliser S"),
        ("weighted-softmax", _pole_row(-1e-7), 3, 3, "pole"),
        ("iterative", ITERATIVE_UNSTABLE, 11, 8, "slope"),
    ],
)
def test_ill_conditioned_rows_are_flagged_not_returned(
    method: str, x: list[float], k: int, level: int, cause: str
) -> None:
    p_ref, _ = ref(method, x, k, 1.0, relative=method == "weighted-softmax")
    assert np.abs(_raw(method, x, k) - p_ref).max() > 10 * TOL  # float64 really is wrong here
    r = st.evaluate(x, k, method)
    assert r.status.tolist() == "ill-conditioned" and not r.ok
    assert np.isnan(r.weights).all() and np.isnan(r.complement).all()
    (failure,) = r.failures
    assert failure.code == "ill-conditioned" and failure.level == level
    assert failure.value is not None and failure.value > TOL
    assert f"step {level}:" in failure.detail and cause in failure.detail and "ill-conditioned" in failure.detail
    with pytest.raises(NumericalFailureError, match="ill-conditioned"):
        st.soft_topk(x, k, method)


def test_near_a_pole_only_the_rows_float64_cannot_resolve_are_flagged() -> None:
    offsets = [1e-1, 1e-2, -1e-2, 1e-3, -1e-3, 1e-4, -1e-4, 1e-5, 1e-6, -1e-6, 1e-8]
    x = np.array([_pole_row(o) for o in offsets])
    r = st.evaluate(x, 3, "weighted-softmax")
    flagged = r.status == "ill-conditioned"
    assert flagged.tolist() == [abs(o) < 2e-4 for o in offsets]
    for row, bad in zip(x.tolist(), flagged):
        err = np.abs(_raw("weighted-softmax", row, 3) - ref("weighted-softmax", row, 3, 1.0)[0]).max()
        if bad:
            assert err > TOL / 30  # flagged rows are wrong, or within a factor 30 of it
        else:  # rows returned as "ok" match the exact values to the tolerance (they reach |p| ~ 250)
            assert err < TOL
            np.testing.assert_allclose(r.weights[list(x.tolist()).index(row)], _raw("weighted-softmax", row, 3))


def test_flagged_iterative_rows_in_a_batch_leave_the_others_ok_and_accurate() -> None:
    # spread ~50 at n = 16, k = 12: some rows amplify rounding errors past the tolerance, most not
    rng = np.random.default_rng(2)
    x = 50.0 * rng.standard_normal((40, 16))
    r = st.evaluate(x, 12, "iterative")
    flagged = r.status == "ill-conditioned"
    assert 0 < flagged.sum() < len(x) // 2
    for b in range(len(x)):
        p_ref, _ = ref("iterative", x[b].tolist(), 12, 1.0, relative=False)
        err = np.abs(_raw("iterative", x[b].tolist(), 12) - p_ref).max()
        estimate = seq.iterative_topk((x[b] - x[b].max())[None], 12).aux["error_estimate"][0]
        assert err <= estimate  # the estimate bounds the error (it is 3x the RMS of a linearised model) ...
        if err > 1e-12:  # ... without being far above it where the error is measurable
            assert estimate < 100 * err, (b, err, estimate)
        if not flagged[b]:
            np.testing.assert_allclose(r.weights[b], p_ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("method", METHODS)
def test_well_conditioned_batches_are_all_ok(method: str) -> None:
    rng = np.random.default_rng(0)
    for n in (10, 100):
        for scale in (0.1, 1.0, 3.0, 10.0):
            x = scale * rng.standard_normal((16, n))
            for k in sorted({1, 2, 5, 10, n}) if n == 10 else (1, 2, 5, 10):
                r = st.evaluate(x, k, method)
                assert r.ok, (n, scale, k, [f.detail for f in r.failures][:1])
    # and the estimate stays far below the tolerance there (the error is ~1e-15)
    z = rng.standard_normal((16, 100))
    z -= z.max(axis=1, keepdims=True)
    forward = seq.weighted_softmax_topk if method == "weighted-softmax" else seq.iterative_topk
    assert forward(z, 10).aux["error_estimate"].max() < 1e-3 * TOL


def test_weighted_softmax_at_large_k_returns_only_accurate_rows() -> None:
    # n = 100, k = 50 at spread 3: the rounds pass near poles and amplify rounding errors. Row 5 is
    # flagged: its round 45 amplifies errors 5e4-fold (float64 ends 4e-11 off; the estimate, 6e-8,
    # is pessimistic there); the rows returned are accurate to the tolerance
    x = 3.0 * np.random.default_rng(0).standard_normal((16, 100))
    r = st.evaluate(x, 50, "weighted-softmax")
    assert np.flatnonzero(r.status != "ok").tolist() == [5]
    for b in (0, 1, 8):  # row 8 is the least accurate row returned (1.1e-10 off)
        np.testing.assert_allclose(r.weights[b], ref("weighted-softmax", x[b].tolist(), 50, 1.0)[0], rtol=0, atol=TOL)


@pytest.mark.parametrize(
    ("method", "n", "row", "scale", "k", "entry", "exact"),
    [
        # the stability probe's cells (seed 0, normal draws, scales on np.logspace(-1, 4, 13), tau = 1)
        ("weighted-softmax", 100, 11, 12.115276586285882, 50, 86, 158.53026784500588),
        ("iterative", 1000, 0, 215.44346900318845, 50, 606, 0.22865839511531572),
    ],
)
def test_stability_probe_cases_are_flagged(
    method: str, n: int, row: int, scale: float, k: int, entry: int, exact: float
) -> None:
    x = draw_scores(n, 20, dist="normal", seed=0)[row] * scale
    assert abs(_raw(method, x.tolist(), k)[entry] - exact) > 0.1  # exact: mpmath, 80 and 160 digits
    r = st.evaluate(x, k, method)
    assert r.status.tolist() == "ill-conditioned" and np.isnan(r.weights).all()


# --------------------------------------------------------------------------- exact ties (regression)

# n = 50, k = 50, tau = 1e-3 (tests/test_accuracy.py's "near-ties" case, float32 values): 25
# distinct values, the maximum three times. The old code summed the exclusive log-sum directly for
# the argmax among tied maxima only, so that entry's 1 - s was rounded differently, took the other
# branch of the q - s / c - p choice, and the tie split; later rounds multiplied the split by
# z_i - min z ~ 4e6 and the row came back "ok" 0.31 off (naive float64 is exact here).
NEAR_TIES_50 = [
    1001103.375, 998800.4375, 1000648.125, 998800.4375, 1001103.375, 998443.9375, 999393.3125, 999393.3125,
    997894.6875, 1000852.75, 998692.75, 998692.75, 999450.125, 1000852.75, 999269.4375, 1001988.8125,
    1000012.8125, 999710.9375, 1000475.5625, 999930.4375, 998942.3125, 999450.125, 1000200.75, 1001576.9375,
    1000322.625, 1000475.5625, 1001988.8125, 999798.75, 999972.0625, 1001988.8125, 1001722.125, 1000118.5625,
    1000609.5625, 999930.4375, 999269.4375, 1000118.5625, 999710.9375, 1000322.625, 1000718.375, 999798.75,
    1001576.9375, 998942.3125, 1000012.8125, 1000200.75, 998443.9375, 1000648.125, 1000718.375, 1001722.125,
    999972.0625, 1000609.5625,
]


def _groups(x: list[float]) -> list[list[int]]:
    return [[i for i, v in enumerate(x) if v == u] for u in sorted(set(x))]


@pytest.mark.parametrize(
    ("x", "k", "tau"),
    [
        ([4e6, 4e6, 4e6, 0.0], 4, 1.0),  # minimal repro: the old code returned (1.25, 1.25, 0.25, 0.25), "ok"
        ([3.0, 3.0, 3.0, 2.0, 2.0, 0.0], 6, 1e-3),  # two tied groups (a pair tied at the max in round 3)
        ([3.0, 3.0, 3.0, 0.0], 4, 1e-3),  # old: 4.5e-8 off, "ok"
        (NEAR_TIES_50, 50, 1e-3),
    ],
)
def test_exact_ties_stay_tied_and_no_wrong_row_is_ok(x: list[float], k: int, tau: float) -> None:
    z = np.asarray(_z(x, tau))
    fwd = seq.iterative_topk(z[None], k)
    for g in _groups(x):  # bitwise: exact ties are tied in every round of exact arithmetic
        assert len(set(fwd.p[0, g].tolist())) == 1 and len(set(fwd.q[0, g].tolist())) == 1, g
    p_ref, _ = ref("iterative", x, k, tau, relative=False)
    r = st.evaluate(x, k, "iterative", tau=tau)
    assert r.status.tolist() in ("ok", "ill-conditioned")
    if r.ok:
        np.testing.assert_allclose(r.weights, p_ref, rtol=0, atol=TOL)
    else:  # refused: the error model saw the amplification of the u |logsumexp| rounding of s
        assert np.abs(_raw("iterative", [v / tau for v in x], k) - p_ref).max() > TOL / 30


def test_a_split_tie_is_flagged_not_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    # reinstate the old asymmetric exclusive sum (argmax summed directly): the tie-split floor of
    # the estimate must refuse the row the error model alone returned as "ok"
    from topk_cli.operators._logspace import logsumexp_exclusive

    def asymmetric(a: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        dom = np.zeros(a.shape, dtype=bool)
        np.put_along_axis(dom, np.argmax(a, axis=-1)[:, None], True, axis=-1)
        return logsumexp_exclusive(a), dom

    from topk_cli.operators import iterative

    monkeypatch.setattr(iterative, "_lse_exclusive_symmetric", asymmetric)
    r = st.evaluate([4e6, 4e6, 4e6, 0.0], 4, "iterative")
    assert r.status.tolist() == "ill-conditioned" and np.isnan(r.weights).all()
    (failure,) = r.failures
    assert failure.value is not None and failure.value > 0.1


# --------------------------------------------------------------------------- iterative's fast path


def test_iterative_fast_path_is_taken_on_a_typical_batch_and_agrees_with_the_faithful_one() -> None:
    from topk_cli.operators import iterative

    rng = np.random.default_rng(3)
    z = rng.standard_normal((8, 200))
    z -= z.max(axis=1, keepdims=True)
    fast = iterative.iterative_topk(z, 10)
    slow = iterative._it_faithful(z, 10)
    assert (fast.aux["fast"] == 1).all() and (slow.aux["fast"] == 0).all()
    # the certified bound holds against the faithful result (itself ~1e-15 off) and is small
    assert (np.abs(fast.p - slow.p).max(axis=-1) <= fast.aux["error_estimate"] + 1e-14).all()
    assert fast.aux["error_estimate"].max() < 1e-12
    np.testing.assert_allclose(fast.q, slow.q, rtol=1e-12, atol=0)
    # the stored rounds feed the same VJP
    v = rng.standard_normal(z.shape)
    np.testing.assert_allclose(iterative._it_vjp(fast, z, 10, v), iterative._it_vjp(slow, z, 10, v), rtol=0, atol=1e-12)


def test_iterative_rows_the_fast_path_cannot_certify_are_recomputed_faithfully() -> None:
    # ties at tau = 1e-20: round 1 puts s = 1 on the 2; then y = (1 - p)(z - min z) = 0 everywhere,
    # so round 2 splits evenly: exactly (1/3, 1/3, 4/3); z - min z = 1e20 defeats the fast bound
    tiny = [[0.3e-20, -1.2e-20, 0.5e-20], [1.0, 1.0, 2.0], [-0.7e-20, 0.2e-20, 0.0]]
    z = st.scaled_scores(tiny, 2, tau=1e-20)
    from topk_cli.operators import iterative

    assert iterative.iterative_topk(z, 2).aux["fast"].tolist() == [1.0, 0.0, 1.0]
    r = st.evaluate(tiny, 2, "iterative", tau=1e-20)
    assert r.ok
    np.testing.assert_allclose(r.weights[1], [1 / 3, 1 / 3, 4 / 3], rtol=1e-15)
    np.testing.assert_allclose(r.complement[1], [2 / 3, 2 / 3, -1 / 3], rtol=1e-15)
    for b in (0, 2):
        p_ref, q_ref = ref("iterative", tiny[b], 2, 1e-20)
        np.testing.assert_allclose(r.weights[b], p_ref, rtol=0, atol=1e-13)
        np.testing.assert_allclose(r.complement[b], q_ref, rtol=1e-12)
    # a saturated entry: 1 - p_1 = e^{-1/0.03} / (1 + e^{-1/0.03}) ~ 3e-15, which 1 - s gets ~2% wrong
    z = st.scaled_scores([1.0, 0.0], 1, tau=0.03)
    assert iterative.iterative_topk(z, 1).aux["fast"].tolist() == [0.0]
    q = st.evaluate([1.0, 0.0], 1, "iterative", tau=0.03).complement
    np.testing.assert_allclose(q, ref("iterative", [1.0, 0.0], 1, 0.03)[1], rtol=1e-12)
    # a failed row among fast ones keeps its own index, status and message
    mixed = [[0.3e-20, -1.2e-20, 0.5e-20, 0.1e-20], [2.0, 1.0, 2.0, 0.0]]
    r = st.evaluate(mixed, 2, "iterative", tau=1e-20)
    assert r.status.tolist() == ["ok", "ill-conditioned"]
    (failure,) = r.failures
    assert failure.row == (1,) and failure.detail.startswith("iterative: step")
    np.testing.assert_array_equal(r.weights[0], st.evaluate(mixed[0], 2, "iterative", tau=1e-20).weights)
