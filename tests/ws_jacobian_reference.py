"""An mpmath reference for weighted-softmax's Jacobian ``d p / d x`` (including ``1/tau``): forward
mode through the recurrence of :func:`reference._ws_run` (``q = 1 - p`` carried as a product, never
by subtraction), every direction at once, at ``P`` and ``2P`` digits until every entry agrees to
``dps`` digits *relatively* (down to 1e-340, below float64's range; entries of ``e^{-1e5}`` included: finite differences cannot resolve
those, their absolute error is far above them).

Written from the definition (``p <- p + q e^z / S``, ``S = sum q e^z``), not from the library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mpmath
import reference as R
from mpmath import mp, mpf


def _run(z: Sequence[Any], k: int) -> list[list[Any]]:
    """``dp_i / dz_j`` of ``k`` rounds at the current precision."""
    m = len(z)
    e = [mpmath.exp(v) for v in z]
    p = [mpf(0)] * m
    q = [mpf(1)] * m
    dp = [[mpf(0)] * m for _ in range(m)]  # dp[i][j] = d p_i / d z_j
    dq = [[mpf(0)] * m for _ in range(m)]
    for _ in range(k):
        t = [q[i] * e[i] for i in range(m)]
        s = mpmath.fsum(t)
        # dt_i/dz_j = dq_ij e_i + q_i e_i [i = j]
        dt = [[dq[i][j] * e[i] + (t[i] if i == j else 0) for j in range(m)] for i in range(m)]
        ds = [mpmath.fsum(dt[i][j] for i in range(m)) for j in range(m)]
        new_p, new_q, new_dp, new_dq = [], [], [], []
        for i in range(m):
            rest = mpmath.fsum(t[j] for j in range(m) if j != i)
            r_i = rest - p[i] * e[i]  # (S - t_i) - p_i e_i = S - e_i
            new_p.append(p[i] + t[i] / s)
            new_q.append(q[i] * r_i / s)
            row_p, row_q = [], []
            for j in range(m):
                d_ratio = dt[i][j] / s - t[i] * ds[j] / (s * s)
                de = e[i] if i == j else 0
                d_r = (ds[j] - dt[i][j]) - dp[i][j] * e[i] - p[i] * de
                row_p.append(dp[i][j] + d_ratio)
                row_q.append(dq[i][j] * r_i / s + q[i] * d_r / s - q[i] * r_i * ds[j] / (s * s))
            new_dp.append(row_p)
            new_dq.append(row_q)
        p, q, dp, dq = new_p, new_q, new_dp, new_dq
    return dp


def jacobian_weighted_softmax(
    x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = 60, max_dps: int = 20000
) -> list[list[Any]]:
    """``J[i][j] = d p_i / d x_j`` of weighted-softmax, every entry to ``dps`` relative digits
    (masked entries: zero rows and columns)."""
    dps = R._dps(x, tau, dps)
    with mp.workdps(dps):
        z, idx, n = R._split(x, tau)
        R._check_k(k, len(z))
    prec = dps + 20
    while True:
        with mp.workdps(prec):
            a = _run(z, k)
        with mp.workdps(2 * prec):
            b = _run(z, k)
            tol = mpf(10) ** (-dps)
            floor = mpf(10) ** -340  # below float64's range: an exact zero need only agree to that
            ok = all(abs(u - v) <= tol * max(abs(v), floor) for ra, rb in zip(a, b, strict=True)
                     for u, v in zip(ra, rb, strict=True))
        if ok:
            break
        prec *= 2
        if prec > max_dps:
            raise RuntimeError(f"reference weighted-softmax Jacobian not certified below {max_dps} digits")
    with mp.workdps(dps):
        out = [[mpf(0)] * n for _ in range(n)]
        t = mpf(tau)
        for a_i, i in enumerate(idx):
            for b_j, j in enumerate(idx):
                out[i][j] = b[a_i][b_j] / t
        return out
