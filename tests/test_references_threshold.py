"""The threshold references of ``stability-probe`` (``references.threshold_bisection``).

A row stops when its float64 total at the midpoint is exactly ``k`` (at large spreads that is
true over a wide range of lambda), otherwise when the bracket is two adjacent floats. Checked on
an adversarial batch for every ``f`` the probe uses: the weights sum to ``k``, they match a
50-digit mpmath solution, rows that never hit ``k`` exactly keep the bits of the walk to adjacent
floats (kept verbatim below), and an exact hit does stop the row early.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from mpmath import mp, mpf

from topk_cli.analysis.probe_grid import draw_scores
from topk_cli.api import scaled_scores
from topk_cli.operators.projection import f_clip, f_cube
from topk_cli.references import ReferenceContext, f_exp, f_laplace, f_sigmoid, threshold_bisection

Link = Callable[[np.ndarray], np.ndarray]
FS: dict[str, Link] = {"exp": f_exp, "sigmoid": f_sigmoid, "laplace": f_laplace, "clip": f_clip, "cube": f_cube}
EPS = 2.0**-52


def walk_to_adjacent_floats(f: Link, z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The previous reference (every row bisected until its bracket is two adjacent floats)."""
    n = z.shape[1]
    if k == n:
        return np.ones_like(z), np.ones(z.shape[0], dtype=bool)
    lo = np.min(np.where(np.isfinite(z), z, np.inf), axis=-1) - math.log(n) - 40.0
    hi = np.max(z, axis=-1) + math.log(n) + 1.0
    for _ in range(2200):
        mid = 0.5 * (lo + hi)
        moving = (mid > lo) & (mid < hi)
        if not moving.any():
            break
        total = np.sum(f(z - mid[:, None]), axis=-1)
        above = total > k
        lo = np.where(moving & above, mid, lo)
        hi = np.where(moving & ~above, mid, hi)
    lam = 0.5 * (lo + hi)
    return f(z - lam[:, None]), np.spacing(np.abs(lam)) <= 1e-11


def adversarial_batch(n: int, seed: int = 7) -> np.ndarray:
    """Prepared rows of length ``n``: spreads 1e-8..1e6, offsets 0 and 1e8, exact ties (all tied,
    tied with the largest, integer scores, a tie at the middle value), masked entries."""
    rng = np.random.default_rng(seed + n)
    rows = [off + s * rng.standard_normal(n) for s in (1e-8, 1e-3, 0.1, 1.0, 7.0, 60.0, 900.0, 1e4, 1e6)
            for off in (0.0, 1e8)]
    x = np.array(rows)
    x[1, :] = x[1, 0]
    x[2, n // 2:] = x[2, 0]
    x[3] = np.round(x[3])
    if n > 1:
        x[4, -1] = -np.inf
        x[5, 1:] = -np.inf
    x[6] = np.sort(x[6])[::-1]
    x[6, n // 2:] = x[6, n // 2]
    return scaled_scores(x, 1)


def cases() -> list[tuple[np.ndarray, int]]:
    out = []
    for n in (1, 2, 3, 7, 40):
        z = adversarial_batch(n)
        out += [(z, k) for k in sorted({1, 2, n // 2, n - 1, n} - {0}) if k <= n]
    d = draw_scores(60, 4, dist="student-t", seed=3)  # heavy tails far from 0, as the probe's --offset
    out.append((scaled_scores(np.concatenate([1e6 + s * d for s in (0.3, 30.0, 3000.0)]), 1), 5))
    return out


CASES = cases()


def _lam_step(z: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per row, the spacing of floats where lambda lies: within 41 of the entries with ``0 < p <
    1`` (``f`` is 0 below -log n - 1 and 1 above 40). One float step of lambda, or the rounding
    of ``z_i - lambda``, moves a weight by at most ``max f' <= 3`` times it."""
    inner = (p > 0) & (p < 1)
    far = np.max(np.where(inner, np.abs(z), 0.0), axis=-1)
    return np.spacing(far + 41.0)


@pytest.mark.parametrize("name", list(FS))
def test_weights_sum_to_k_and_keep_the_walk_bits(name: str) -> None:
    """Each row sums to ``k`` within ``k n 2^-52`` plus ``n`` times what a float step of lambda
    moves a weight; rows not stopped by an exact total keep the old bits."""
    ref = threshold_bisection(FS[name])
    for z, k in CASES:
        n = z.shape[1]
        p, trusted = ref(z, k, ReferenceContext(z, k))
        p_old, t_old = walk_to_adjacent_floats(FS[name], z, k)
        finite_rows = np.isfinite(z).sum(axis=-1) >= k
        err = np.abs(p.sum(axis=-1) - k)
        tol = k * n * EPS + 5 * n * _lam_step(z, p)
        assert (err[finite_rows] <= tol[finite_rows]).all(), (name, n, k, err.max())
        exact = p.sum(axis=-1) == k
        assert p[~exact].tobytes() == p_old[~exact].tobytes(), (name, n, k)
        assert ((p >= 0) & (p <= 1)).all()
        assert (trusted[~exact] == t_old[~exact]).all()


_MP_F = {
    "exp": lambda t: mpf(1) if t >= 0 else mp.exp(t),
    "sigmoid": lambda t: 1 / (1 + mp.exp(-t)),
    "laplace": lambda t: 1 - mp.exp(-t) / 2 if t >= 0 else mp.exp(t) / 2,
    "clip": lambda t: min(max(t, mpf(0)), mpf(1)),
    "cube": lambda t: min(max(t, mpf(0)), mpf(1)) ** 3,
}


def _exact_weights(name: str, row: np.ndarray, k: int) -> list[mpf]:
    """``f(z - lambda*)``, ``sum = k``, at 50 digits: lambda* by regula falsi (Illinois), every
    third step a bisection, from a bracket the total crosses, to a width of 1e-40."""
    f = _MP_F[name]
    z = [mpf(float(v)) for v in row if np.isfinite(v)]
    with mp.workdps(50):
        def g(lam: mpf) -> mpf:  # nonincreasing in lam
            return mp.fsum(f(v - lam) for v in z) - k

        lo, hi = min(z) - 60, max(z) + 60
        glo, ghi, side = g(lo), g(hi), 0
        for step in range(400):
            if hi - lo <= mpf(10) ** -40 * (1 + abs(hi)):
                break
            mid = hi - ghi * (hi - lo) / (ghi - glo) if step % 3 != 2 and ghi != glo else (lo + hi) / 2
            if not lo < mid < hi:
                mid = (lo + hi) / 2
            gm = g(mid)
            if gm == 0:
                lo = hi = mid
                break
            if gm > 0:
                lo, glo, ghi, side = mid, gm, ghi / 2 if side == 1 else ghi, 1
            else:
                hi, ghi, glo, side = mid, gm, glo / 2 if side == -1 else glo, -1
        lam = (lo + hi) / 2
        return [f(mpf(float(v)) - lam) if np.isfinite(v) else mpf(0) for v in row]


@pytest.mark.parametrize("name", list(FS))
def test_weights_match_mpmath(name: str) -> None:
    """Trusted rows (n <= 7, every spread and tie pattern) within ``4 n 2^-52`` plus what a
    float step of lambda moves a weight (5 spacings): float64 rounding of the exact weights."""
    ref = threshold_bisection(FS[name])
    worst = 0.0
    for z, k in CASES:
        n = z.shape[1]
        if n > 7 or k == n:
            continue
        p, trusted = ref(z, k, ReferenceContext(z, k))
        tol = 4 * n * EPS + 5 * _lam_step(z, p)
        for b in np.flatnonzero(trusted & (np.isfinite(z).sum(axis=-1) > k)):
            exact = _exact_weights(name, z[b], k)
            err = max(abs(float(mpf(float(p[b, i])) - exact[i])) for i in range(n))
            worst = max(worst, err / tol[b])
            assert err <= tol[b], (name, n, k, b, err)
    assert worst > 0.0  # the check did compare something


class Counting:
    """``f`` that counts its calls and the scores it is evaluated on."""

    def __init__(self, f: Link) -> None:
        self.f, self.calls, self.scores = f, 0, 0

    def __call__(self, t: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.scores += t.size
        return self.f(t)


@pytest.mark.parametrize("name", list(FS))
def test_exact_total_stops_early(name: str) -> None:
    """At large spreads the float64 total is exactly ``k`` over a wide range of lambda: those
    rows stop there (fewer scores evaluated than the walk to adjacent floats) and sum to k."""
    z = scaled_scores(draw_scores(40, 12, dist="normal", seed=5) * 300.0, 1)
    new, old = Counting(FS[name]), Counting(FS[name])
    p, _ = threshold_bisection(new)(z, 3, ReferenceContext(z, 3))
    walk_to_adjacent_floats(old, z, 3)
    exact = p.sum(axis=-1) == 3
    assert exact.sum() >= 6, exact.sum()
    assert new.scores < 0.8 * old.scores, (new.scores, old.scores)
    assert new.calls <= old.calls, (new.calls, old.calls)
    # a batch whose every row stops on an exact total stops there (no empty passes after it)
    one = Counting(FS[name])
    p1, _ = threshold_bisection(one)(z[exact][:1], 3, ReferenceContext(z[exact][:1], 3))
    assert p1.sum() == 3 and one.calls <= 70, one.calls
