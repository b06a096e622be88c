"""The threshold family with a real ``k`` and one ``k`` per row (``row_k``), ``dp/dk`` and log-weights.

For ``thre-exp``, ``thre-laplace``, ``thre-sigmoid``, ``thre-clip`` and ``thre-cube``
(``p_i = f(z_i - lambda)``, ``sum p = k``), called as the public API calls an
:class:`~topk_cli.operators._base.Implementation`: on prepared rows ``z`` (largest finite entry 0,
masked entries ``-inf``) with ``k`` an ``int`` or a ``(B,)`` float64 array.

* weights against an mpmath solution of ``sum f(z - lambda) = k`` for a real ``k`` (0.5, 1.5,
  2.5, ``m - 0.5``, ``m`` with ``m`` finite entries) on adversarial rows (offset 1e6, spread 1e3,
  ties straddling the threshold, masks, ``n = 1``, selections so hard that every ``f'`` underflows),
  to the float64 tolerance of tests/test_accuracy.py (1e-12 absolute);
* a per-row ``k`` gives every row bitwise what it gets alone; an integer-valued per-row ``k``
  bitwise what the ``int`` gives;
* ``dp/dk = d / sum d`` (``d_i = f'(z_i - lambda)``) against the same formula in mpmath and against
  central differences in ``k``; at ``k = m`` the one-sided limit from below;
* ``(log p, log(1 - p))`` against mpmath, also where ``p`` or ``1 - p`` is below 1e-310;
* the Jacobian and the VJP at a per-row ``k`` against central differences in ``z``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np
import pytest
import reference
import reference_wider
from mpmath import mp, mpf

from topk_cli.operators._base import Implementation
from topk_cli.operators.projection import THRE_CLIP, THRE_CUBE
from topk_cli.operators.threshold import THRE_EXP, THRE_LAPLACE
from topk_cli.operators.threshold_sigmoid import THRE_SIGMOID

METHODS: dict[str, Implementation] = {
    "thre-exp": THRE_EXP,
    "thre-laplace": THRE_LAPLACE,
    "thre-sigmoid": THRE_SIGMOID,
    "thre-clip": THRE_CLIP,
    "thre-cube": THRE_CUBE,
}
#: float64 weights, as tests/test_accuracy.py holds every threshold method to (absolute, p <= 1).
P_TOL = 1e-12
#: dp/dk and log-weights: the same absolute bound, and this relative one on values in the normal range.
REL_TOL = 1e-9

NINF = -math.inf


# ---------------------------------------------------------------------------------------------
# mpmath: lambda, and f, 1 - f, f' and their logs per method


def _mp_exp(t: Any) -> tuple[Any, Any, Any, Any, Any]:
    """``(f, 1 - f, f', log f, log(1 - f))`` of ``min(1, e^t)`` (the kink counts as saturated)."""
    if t >= 0:
        return mpf(1), mpf(0), mpf(0), mpf(0), mpmath.ninf
    # log(1 - e^t) as log1p(-e^t) far from 0: 1 - e^-98 would round at 40 digits
    log_q = mpmath.log(-mpmath.expm1(t)) if t > -1 else mpmath.log1p(-mpmath.exp(t))
    return mpmath.exp(t), -mpmath.expm1(t), mpmath.exp(t), t, log_q


def _mp_sigmoid(t: Any) -> tuple[Any, Any, Any, Any, Any]:
    e = mpmath.exp(-abs(t))
    lp, lq = -mpmath.log1p(mpmath.exp(-t)), -mpmath.log1p(mpmath.exp(t))
    return mpmath.exp(lp), mpmath.exp(lq), e / (1 + e) ** 2, lp, lq


def _mp_laplace(t: Any) -> tuple[Any, Any, Any, Any, Any]:
    small = mpmath.exp(-abs(t)) / 2
    big, log_big = 1 - small, mpmath.log1p(-small)
    if t >= 0:
        return big, small, small, log_big, mpmath.log(small)
    return small, big, small, mpmath.log(small), log_big


def _mp_clip_pow(power: int) -> Callable[[Any], tuple[Any, Any, Any, Any, Any]]:
    def parts(t: Any) -> tuple[Any, Any, Any, Any, Any]:
        c = min(max(t, mpf(0)), mpf(1))
        p, q = c**power, 1 - c**power
        d = power * c ** (power - 1) if 0 < t < 1 else mpf(0)
        return p, q, d, (mpmath.log(p) if p > 0 else mpmath.ninf), (mpmath.log(q) if q > 0 else mpmath.ninf)

    return parts


MP_PARTS: dict[str, Callable[[Any], tuple[Any, Any, Any, Any, Any]]] = {
    "thre-exp": _mp_exp,
    "thre-sigmoid": _mp_sigmoid,
    "thre-laplace": _mp_laplace,
    "thre-clip": _mp_clip_pow(1),
    "thre-cube": _mp_clip_pow(3),
}
#: the limit of dp/dk as k rises to m (see threshold_dk)
FULL_LIMIT = {"thre-exp": "lowest", "thre-clip": "lowest", "thre-cube": "lowest",
              "thre-sigmoid": "softmin", "thre-laplace": "softmin"}


class MpRow:
    """The mpmath solution of one row: ``p``, ``q``, ``dk``, ``log p``, ``log q`` (as mpf lists)."""

    def __init__(self, method: str, z: np.ndarray, k: float) -> None:
        fin = [float(v) for v in z if np.isfinite(v)]
        m = len(fin)
        big = max((abs(v) for v in fin), default=0.0)
        dps = 40 + int(math.log10(big + 1.0))
        if method == "thre-exp" and k == int(k):
            # thre-exp at an integer k: lambda may sit e^{-|z|} above an entry (the mass below it),
            # which its log(1 - p) and dp/dk resolve: as many digits as that takes
            dps += int(big / 2.3)
        n = len(z)
        with mp.workdps(dps):
            zz = [mpf(v) if np.isfinite(v) else mpmath.ninf for v in z.tolist()]
            if k == m:
                self.p = [mpf(1) if v != mpmath.ninf else mpf(0) for v in zz]
                self.q = [1 - v for v in self.p]
                self.log_p = [mpf(0) if v != mpmath.ninf else mpmath.ninf for v in zz]
                self.log_q = [mpmath.ninf if v != mpmath.ninf else mpf(0) for v in zz]
                low = min(mpf(v) for v in fin)
                if FULL_LIMIT[method] == "lowest":
                    w = [mpf(1) if v == low else mpf(0) for v in zz]
                else:
                    w = [mpmath.exp(low - v) if v != mpmath.ninf else mpf(0) for v in zz]
                total = mpmath.fsum(w)
                self.dk = [v / total for v in w]
                return
            if method in ("thre-clip", "thre-cube"):
                zr, lam, digits = reference_wider.projection_lambda(z.tolist(), k, 1.0,
                                                                    power=1 if method == "thre-clip" else 3)
                with mp.workdps(digits):
                    self._fill(method, zr, lam, n)
                return
            lam = reference.threshold_lambda([mpf(v) for v in fin], k, method)
            self._fill(method, zz, lam, n)

    def _fill(self, method: str, zz: list[Any], lam: Any, n: int) -> None:
        parts = [MP_PARTS[method](v - lam) if v != mpmath.ninf else None for v in zz]
        self.p = [pt[0] if pt else mpf(0) for pt in parts]
        self.q = [pt[1] if pt else mpf(1) for pt in parts]
        self.log_p = [pt[3] if pt else mpmath.ninf for pt in parts]
        self.log_q = [pt[4] if pt else mpf(0) for pt in parts]
        d = [pt[2] if pt else mpf(0) for pt in parts]
        total = mpmath.fsum(d)
        self.dk = [v / total for v in d] if total > 0 else [mpf(0)] * n


def _abs_rel_error(got: np.ndarray, want: list[Any]) -> tuple[float, float]:
    """``(max |got - want|, max relative error over the wanted values in the normal range)``;
    infinite where one is ``-inf`` and the other not."""
    abs_err = rel_err = 0.0
    for g, w in zip(got.tolist(), want, strict=True):
        if w == mpmath.ninf or g == NINF:
            if not (w == mpmath.ninf and g == NINF):
                return math.inf, math.inf
            continue
        diff = abs(mpf(g) - w)
        abs_err = max(abs_err, float(diff))
        if abs(w) > mpf("1e-300"):
            rel_err = max(rel_err, float(diff / abs(w)))
    return abs_err, rel_err


# ---------------------------------------------------------------------------------------------
# adversarial rows and their real k


def _rows() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(20261128)

    def prep(x: np.ndarray) -> np.ndarray:
        return x - np.max(x)

    out = [
        ("normal", prep(rng.standard_normal(6))),
        ("offset 1e6", prep(1e6 + rng.standard_normal(6))),
        ("spread 1e3", prep(1e3 * rng.standard_normal(6))),
        ("ties across the threshold", np.array([0.0, -1.0, -1.0, -1.0, -3.0])),
        ("ties at the top", np.array([0.0, 0.0, 0.0, -0.25, -2.0])),
        ("masked", np.array([0.0, -0.5, NINF, -2.0, NINF, -1.25])),
        ("one entry", np.array([0.0])),
        ("one finite entry", np.array([NINF, 0.0, NINF])),
        ("two apart by 2000", np.array([0.0, -2000.0])),
        ("hard: 0, -800, -1600, -2400", np.array([0.0, -800.0, -1600.0, -2400.0])),
        ("ties at 0, then -3000", np.array([0.0, 0.0, -3000.0])),
    ]
    return out


def _ks(m: int) -> list[float]:
    """Real k for a row with ``m`` finite entries (the integer ``m`` itself included)."""
    ks = {0.5, 1.5, 2.5, m - 0.5, float(m), 1.0, 0.25 + m / 2}
    return sorted(k for k in ks if 0 < k <= m)


CASES = [(name, z, k) for name, z in _rows() for k in _ks(int(np.isfinite(z).sum()))]


def _row_call(impl: Implementation, z: np.ndarray, k: float) -> tuple[Any, ...]:
    zz, kk = z[None, :], np.array([k])
    fwd = impl.forward(zz, kk)
    assert fwd.code is None or (fwd.code == "ok").all(), fwd.messages
    assert impl.dk is not None and impl.log_weights is not None
    lp, lq = impl.log_weights(fwd, zz, kk)
    return fwd.p[0], fwd.q[0], impl.dk(fwd, zz, kk)[0], lp[0], lq[0]


@pytest.mark.parametrize("method", list(METHODS))
def test_real_k_against_mpmath(method: str) -> None:
    """p, q, dp/dk and (log p, log q) of every adversarial row and real k against mpmath."""
    impl = METHODS[method]
    worst = {"p": 0.0, "q": 0.0, "dk": 0.0, "dk rel": 0.0, "log": 0.0, "log rel": 0.0}
    failures = []
    checked = tiny_p = tiny_q = zeros = ones = 0
    for name, z, k in CASES:
        p, q, dk, lp, lq = _row_call(impl, z, k)
        ref = MpRow(method, z, k)
        errs = {
            "p": _abs_rel_error(p, ref.p)[0],
            "q": _abs_rel_error(q, ref.q)[0],
        }
        errs["dk"], errs["dk rel"] = _abs_rel_error(dk, ref.dk)
        lp_abs, lp_rel = _abs_rel_error(lp, ref.log_p)
        lq_abs, lq_rel = _abs_rel_error(lq, ref.log_q)
        # log-weights: absolute 1e-12 on values up to 1 in size, relative beyond and near 0
        log_scale = max([1.0] + [abs(float(v)) for v in ref.log_p + ref.log_q if v != mpmath.ninf])
        errs["log"] = max(lp_abs, lq_abs) / log_scale
        errs["log rel"] = max(lp_rel, lq_rel)
        for key, val in errs.items():
            worst[key] = max(worst[key], val)
        bound = {"p": P_TOL, "q": P_TOL, "dk": P_TOL, "dk rel": REL_TOL, "log": P_TOL, "log rel": REL_TOL}
        over = {key: val for key, val in errs.items() if not val <= bound[key]}
        if over:
            failures.append(f"{name} k={k}: {over}")
        checked += 1
        tiny_p += sum(1 for v in ref.p if 0 < v < mpf("1e-310"))
        tiny_q += sum(1 for v in ref.q if 0 < v < mpf("1e-310"))
        zeros += sum(1 for v, zi in zip(ref.p, z.tolist(), strict=True) if v == 0 and zi != NINF)
        ones += sum(1 for v in ref.q if v == 0)
    assert not failures, "\n".join(failures)
    assert checked >= 60, checked
    if method in ("thre-exp", "thre-sigmoid", "thre-laplace"):
        # the hard rows put weights and complements far below the smallest float64
        assert tiny_p >= 3, tiny_p
        assert tiny_q >= 2, tiny_q
    else:
        # clip and cube: exact zeros (log p = -inf, checked above) and exact ones (log q = -inf)
        assert zeros >= 10 and ones >= 10, (zeros, ones)
    print(method, {key: f"{val:.1e}" for key, val in worst.items()})


@pytest.mark.parametrize("method", list(METHODS))
def test_every_f_prime_underflowing(method: str) -> None:
    """Where every ``f'`` underflows, ``dp/dk`` still sums to 1 and lands on the right entries
    (the mpmath comparison of these rows is in :func:`test_real_k_against_mpmath`)."""
    impl = METHODS[method]
    assert impl.dk is not None
    z = np.array([[0.0, -2000.0], [0.0, -3000.0], [0.0, -1500.0]])
    k = np.array([1.0, 1.0, 1.5])
    fwd = impl.forward(z, k)
    dk = impl.dk(fwd, z, k)
    if method in ("thre-sigmoid", "thre-laplace"):
        # lambda is halfway: both entries are equally far from it, and f' = e^-1000 underflows
        assert (fwd.aux["d"][:2] == 0).all()
        np.testing.assert_allclose(dk[:2], 0.5, rtol=1e-12)
    elif method == "thre-exp":
        # lambda = log1p(e^-2000) rounds onto the top entry; it still carries dp/dk = 1 - e^-2000
        assert (fwd.aux["d"][:2] == 0).all()
        np.testing.assert_array_equal(dk[:2], [[1.0, 0.0], [1.0, 0.0]])
    else:
        # no entry strictly inside 0 < p < 1 at an integer k: dp/dk jumps there, zeros (documented)
        np.testing.assert_array_equal(dk[:2], 0.0)
    # k = 1.5: the top entry saturated, the other carries the remaining 0.5
    np.testing.assert_allclose(dk[2], [0.0, 1.0], rtol=0, atol=1e-300)
    np.testing.assert_allclose(dk[:2].sum(axis=1), 0.0 if method in ("thre-clip", "thre-cube") else 1.0,
                               rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# per-row k: each row as alone, integer values as the int


def _batch(seed: int, b: int = 48, n: int = 11) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = np.array([1e-3, 0.1, 1.0, 30.0, 1e3])[rng.integers(0, 5, b)]
    x = rng.standard_normal((b, n)) * scale[:, None] + np.where(rng.random(b) < 0.3, 1e6, 0.0)[:, None]
    x[0] = np.round(x[0])
    x[1, :] = x[1, 0]
    x[2, n // 2:] = x[2, 0]
    x[3:9, -3:] = -np.inf
    x[9, 1:] = -np.inf
    return x - np.max(x, axis=1, keepdims=True)


def _all_outputs(impl: Implementation, z: np.ndarray, k: Any) -> list[np.ndarray]:
    fwd = impl.forward(z, k)
    assert impl.dk is not None and impl.log_weights is not None
    lp, lq = impl.log_weights(fwd, z, k)
    return [fwd.p, fwd.q, fwd.aux["d"], fwd.aux["lambda"], impl.dk(fwd, z, k), lp, lq]


@pytest.mark.parametrize("method", list(METHODS))
def test_per_row_k_gives_each_row_what_it_gets_alone(method: str) -> None:
    impl = METHODS[method]
    checked = 0
    for seed in range(3):
        z = _batch(seed)
        m = np.isfinite(z).sum(axis=1)
        rng = np.random.default_rng(100 + seed)
        # scattered real k (several sort sizes), integers, and k = m on a few rows
        k = np.minimum(rng.uniform(0.05, 1.0, z.shape[0]) * m, m).astype(np.float64)
        k[::5] = np.maximum(np.round(k[::5]), 1.0)
        k[1::7] = m[1::7]
        full = _all_outputs(impl, z, k)
        for b in range(z.shape[0]):
            alone = _all_outputs(impl, z[b:b + 1], k[b:b + 1])
            for got, want in zip(full, alone, strict=True):
                assert np.array_equal(got[b:b + 1], want, equal_nan=True), (b, k[b])
            checked += 1
    assert checked >= 140


@pytest.mark.parametrize("method", list(METHODS))
def test_integer_valued_per_row_k_is_the_int_path(method: str) -> None:
    """An integer-valued per-row k gives bitwise the ``int`` path's outputs (every row has it)."""
    impl = METHODS[method]
    checked = 0
    for seed in range(2):
        zb = _batch(10 + seed)
        m_row = np.isfinite(zb).sum(axis=1)
        for k in sorted({1, 2, 3, 5, 7, 10, 11}):
            z = zb[m_row >= k]  # rows with at least k finite entries; some with exactly k
            assert z.shape[0] >= 30
            as_int = _all_outputs(impl, z, k)
            as_array = _all_outputs(impl, z, np.full(z.shape[0], float(k)))
            for got, want in zip(as_array, as_int, strict=True):
                assert np.array_equal(got, want, equal_nan=True), k
            checked += 1
    assert checked >= 14


# ---------------------------------------------------------------------------------------------
# derivatives against central differences


def _smooth_batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    z = rng.standard_normal((8, 7)) * 1.5
    z[2, -2:] = -np.inf
    z -= np.max(z, axis=1, keepdims=True)
    k = np.array([0.5, 1.5, 2.7, 3.25, 4.5, 6.2, 1.1, 2.0])
    return z, k


@pytest.mark.parametrize("method", list(METHODS))
def test_dk_against_central_differences(method: str) -> None:
    impl = METHODS[method]
    assert impl.dk is not None
    z, k = _smooth_batch()
    dk = impl.dk(impl.forward(z, k), z, k)
    h = 1e-5
    plus, minus = impl.forward(z, k + h), impl.forward(z, k - h)
    fd = (plus.p - minus.p) / (2 * h)
    # a breakpoint of clip/cube inside [k - h, k + h] would make the difference one-sided: skip it
    same = ((plus.aux["d"] > 0) == (minus.aux["d"] > 0)).all(axis=1)
    assert same.sum() >= 6
    np.testing.assert_allclose(dk[same], fd[same], rtol=0, atol=2e-8)
    # at k = m the one-sided difference from below
    m = np.isfinite(z).sum(axis=1).astype(np.float64)
    at_full = impl.forward(z, m)
    dk_full = impl.dk(at_full, z, m)
    h = 1e-7
    fd_left = (at_full.p - impl.forward(z, m - h).p) / h
    np.testing.assert_allclose(dk_full, fd_left, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", list(METHODS))
def test_jacobian_and_vjp_with_per_row_k(method: str) -> None:
    impl = METHODS[method]
    z, k = _smooth_batch()
    fwd = impl.forward(z, k)
    jac = impl.jacobian(fwd, z, k)
    v = np.random.default_rng(6).standard_normal(z.shape)
    v[~np.isfinite(z)] = 0.0
    vjp = impl.vjp(fwd, z, k, v)
    h = 1e-6
    checked = 0
    for j in range(z.shape[1]):
        zp, zm = z.copy(), z.copy()
        zp[:, j] += h
        zm[:, j] -= h
        zp -= np.max(zp, axis=1, keepdims=True)  # prepared rows: largest finite entry 0 (p is shift-invariant)
        zm -= np.max(zm, axis=1, keepdims=True)
        pp, pm = impl.forward(zp, k), impl.forward(zm, k)
        smooth = ((pp.aux["d"] > 0) == (pm.aux["d"] > 0)).all(axis=1) & np.isfinite(z[:, j])
        fd = (pp.p - pm.p) / (2 * h)
        np.testing.assert_allclose(jac[smooth, :, j], fd[smooth], rtol=0, atol=1e-6)
        checked += int(smooth.sum())
    assert checked >= 40
    np.testing.assert_allclose(vjp, np.einsum("bi,bij->bj", v, jac), rtol=0, atol=1e-12)


def test_thre_exp_refine_with_per_row_k() -> None:
    """``thre-exp``'s refine (rows whose threshold lies 64 or more below the row maximum) takes each
    row's own real k: bitwise each row alone, bitwise the int for integer values, and the refined
    weights match mpmath on the prepared ``z`` (zero rounding residual)."""
    assert THRE_EXP.refine is not None and THRE_EXP.dk is not None
    rng = np.random.default_rng(9)
    z = -1e3 + rng.standard_normal((6, 9))
    z[:, 0] = 0.0  # an outlier: lambda sits near -1e3, far below the row maximum
    z[4, -2:] = -np.inf
    k = np.array([1.5, 2.0, 3.25, 4.5, 6.75, 8.0])

    def residual(rows: np.ndarray) -> np.ndarray:
        return np.zeros((rows.size, z.shape[1]))

    def refined(zz: np.ndarray, kk: Any) -> Any:
        assert THRE_EXP.refine is not None
        return THRE_EXP.refine(THRE_EXP.forward(zz, kk), zz, kk, residual)

    fwd = refined(z, k)
    assert (fwd.aux["lambda"] <= -64).all()
    dk = THRE_EXP.dk(fwd, z, k)
    checked = 0
    for b in range(z.shape[0]):
        alone = refined(z[b:b + 1], k[b:b + 1])
        for name in ("lambda", "d", "t"):
            assert np.array_equal(alone.aux[name], fwd.aux[name][b:b + 1])
        assert np.array_equal(alone.p, fwd.p[b:b + 1]) and np.array_equal(alone.q, fwd.q[b:b + 1])
        if k[b] == int(k[b]):
            as_int = refined(z[b:b + 1], int(k[b]))
            assert np.array_equal(as_int.p, alone.p) and np.array_equal(as_int.aux["d"], alone.aux["d"])
        ref = MpRow("thre-exp", z[b], float(k[b]))
        assert _abs_rel_error(fwd.p[b], ref.p)[0] <= P_TOL
        assert _abs_rel_error(dk[b], ref.dk)[0] <= P_TOL
        checked += 1
    assert checked == 6
