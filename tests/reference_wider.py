"""Independent high-precision references for the wider field of operators (mpmath).

Written from the definitions, deliberately with other algorithms than the library's:

* ``thre-clip`` / ``thre-cube``: bisection on ``lambda`` for ``sum clip(z - lambda, 0, 1)^r = k``
  (no breakpoints, no closed form), then the weights; and, for the regularised problem itself,
  :func:`regularised_argmax`, a log-barrier interior-point solver of
  ``max_{p in D(n,k)} <p, z> - (1/q) sum p_i^q`` that knows nothing of the threshold structure.
* ``topk-softmax``: the closed form (sort, ones, softmax of the rest).
* ``ot-sinkhorn``: log-domain Sinkhorn with the *full* squared cost ``(z_i - y_j)^2 / 2`` run at
  high precision until the marginal error is below ``10^-(dps - 10)``.
* ``perturbed``: the exact expectation ``P(i in top k of z + Z)``
  ``= int phi(t - z_i) P(at most k - 1 of the others exceed t) dt``, the inner probability by the
  Poisson-binomial recursion, the integral by mpmath quadrature; its Jacobian by differentiating
  that integral under the integral sign (checked against central differences in the tests).

Every function takes floats ``x``, ``k``, ``tau`` and works on ``z = (x - max x) / tau`` in mpmath.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import mpmath
from mpmath import mp, mpf

DPS = 40


def _z(x: Sequence[float], tau: float) -> list[Any]:
    vals = [mpf(v) for v in x]
    top = max(v for v in vals if v != mpmath.ninf)
    return [(v - top) / mpf(tau) if v != mpmath.ninf else mpmath.ninf for v in vals]


# ---------------------------------------------------------------------------------------------
# projections


def _clip_pow(t: Any, power: int) -> Any:
    c = min(max(t, mpf(0)), mpf(1))
    return c**power


def projection_lambda(x: Sequence[float], k: Any, tau: float = 1.0, *, power: int,
                      dps: int = DPS) -> tuple[list[Any], Any, int]:
    """``(z, lambda, digits)`` of :func:`projection` (``lambda = -inf`` when ``k`` is the unmasked
    count); ``z`` and ``lambda`` are valid at ``digits`` decimal digits (use ``mp.workdps(digits)``)."""
    with mp.workdps(dps):
        z0 = _z(x, tau)
        mag = max((abs(v) for v in z0 if v != mpmath.ninf), default=mpf(0))
    extra = int(mpmath.log10(mag + 1)) + 5
    with mp.workdps(dps + extra):
        z = _z(x, tau)
        fin = [v for v in z if v != mpmath.ninf]
        if len(fin) == k:
            return z, mpmath.ninf, dps + extra
        # G(lo) >= ceil(k) >= k, G(hi) = 0 < k (k may be real)
        lo, hi = sorted(fin, reverse=True)[math.ceil(k) - 1] - 1, max(fin)
        for _ in range(int(4 * (dps + extra)) + 20):
            mid = (lo + hi) / 2
            if mpmath.fsum(_clip_pow(v - mid, power) for v in fin) >= k:
                lo = mid
            else:
                hi = mid
        return z, (lo + hi) / 2, dps + extra


def projection(x: Sequence[float], k: Any, tau: float = 1.0, *, power: int, dps: int = DPS) -> list[Any]:
    """``clip(z - lambda, 0, 1)^power`` with ``sum = k``, ``lambda`` by bisection to ``dps`` digits.

    ``lambda`` lies in ``[z_(k) - 1, max z]`` (``G = #{top k} >= k`` at the left end); for a spread
    like ``|z| ~ 1e300`` the working precision and the number of steps follow the magnitude, so
    ``lambda = -1e300 - 0.5`` is resolved (a fixed 4 * dps steps left it ~1e245 off). ``k`` may be
    real (``0 < k <= #unmasked``).
    """
    z, lam, digits = projection_lambda(x, k, tau, power=power, dps=dps)
    with mp.workdps(digits):
        if lam == mpmath.ninf:
            return [mpf(1) if v != mpmath.ninf else mpf(0) for v in z]
        return [_clip_pow(v - lam, power) if v != mpmath.ninf else mpf(0) for v in z]


def regularised_argmax(z: Sequence[float], k: int, q: float, *, dps: int = 30) -> list[Any]:
    """``argmax_{p in D(n,k)} <p, z> - (1/q) sum p_i^q`` by a log-barrier interior-point method.

    Minimises ``t * (R(p) - <p, z>) - sum log p_i - sum log(1 - p_i)`` subject to ``sum p = k`` by
    equality-constrained Newton steps (diagonal Hessian plus one constraint, solved exactly) with
    backtracking, for ``t = 1, 100, ..., 1e20``: the barrier's duality gap ``2n / t`` ends far below
    float64 resolution. Generic: it does not use the threshold form of the solution.
    """
    with mp.workdps(dps):
        zz = [mpf(v) for v in z]
        n = len(zz)
        qq = mpf(q)
        p = [mpf(k) / n] * n

        def obj(pp: list[Any], t: Any) -> Any:
            if any(v <= 0 or v >= 1 for v in pp):
                return mpmath.inf
            reg = mpmath.fsum(v**qq for v in pp) / qq - mpmath.fsum(a * b for a, b in zip(pp, zz))
            return t * reg - mpmath.fsum(mpmath.log(v) + mpmath.log(1 - v) for v in pp)

        t = mpf(1)
        while t <= mpf(10) ** 20:
            for _ in range(100):
                grad = [t * (v ** (qq - 1) - a) - 1 / v + 1 / (1 - v) for v, a in zip(p, zz)]
                hess = [t * (qq - 1) * v ** (qq - 2) + 1 / v**2 + 1 / (1 - v) ** 2 for v in p]
                # Newton step with sum(step) = 0: step = -(grad + nu) / hess, nu from the constraint
                nu = -mpmath.fsum(g / h for g, h in zip(grad, hess)) / mpmath.fsum(1 / h for h in hess)
                step = [-(g + nu) / h for g, h in zip(grad, hess)]
                dec = -mpmath.fsum(s * (g + nu) for s, g in zip(step, grad))  # Newton decrement^2
                if dec < mpf(10) ** (-(dps - 4)):
                    break
                a = mpf(1)
                base = obj(p, t)
                while obj([v + a * s for v, s in zip(p, step)], t) > base - a * dec / 4:
                    a /= 2
                    if a < mpf(10) ** -30:
                        break
                p = [v + a * s for v, s in zip(p, step)]
            t *= 100
        return p


# ---------------------------------------------------------------------------------------------
# topk-softmax


def topk_softmax(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = DPS) -> list[Any]:
    """Ones on the ``k - 1`` largest entries, softmax of the others (ties: see the complement form)."""
    return topk_softmax_with_complement(x, k, tau, dps=dps)[0]


def topk_softmax_with_complement(x: Sequence[float], k: int, tau: float = 1.0, *,
                                 dps: int = DPS) -> tuple[list[Any], list[Any]]:
    """``(p, 1 - p)``, the complement of a soft entry summed over the other soft entries.

    Where tied entries straddle the ``k - 1`` hard ones the map is discontinuous; equal inputs get
    equal outputs by averaging over every choice of which tied entries are hard (the mean over all
    orderings of the ties, by symmetry).
    """
    import itertools

    with mp.workdps(dps):
        z = _z(x, tau)
        fin = [i for i in range(len(z)) if z[i] != mpmath.ninf]
        if k <= 1:
            choices: list[set[int]] = [set()]
        else:
            cut = sorted((z[i] for i in fin), reverse=True)[k - 2]  # value of the last hard entry
            above = {i for i in fin if z[i] > cut}
            tied = [i for i in fin if z[i] == cut]
            choices = [above | set(c) for c in itertools.combinations(tied, k - 1 - len(above))]
        out = [mpf(0)] * len(z)
        comp = [mpf(0)] * len(z)
        for hard in choices:
            rest = [i for i in fin if i not in hard]
            total = mpmath.fsum(mpmath.exp(z[i]) for i in rest)
            for i in range(len(z)):
                if i in hard:
                    out[i] += 1
                elif i in rest:
                    out[i] += mpmath.exp(z[i]) / total
                    comp[i] += mpmath.fsum(mpmath.exp(z[j]) for j in rest if j != i) / total
                else:
                    comp[i] += 1
        return [v / len(choices) for v in out], [v / len(choices) for v in comp]


# ---------------------------------------------------------------------------------------------
# ot-sinkhorn


def sinkhorn(x: Sequence[float], k: Any, tau: Any = 1.0, *, dps: int = DPS,
             max_iter: int = 100_000) -> tuple[list[Any], int]:
    """Converged entropic OT top-k (two anchors {0, 1}, cost (z - y)^2 / 2, eps = 1): ``(p, iterations)``.

    Full squared cost at ``dps`` digits; iterates until ``max |m rowmass - 1| < 10^-(dps - 10)``. ``k`` may be
    real (an mpf keeps it exact in the anchor masses).
    """
    with mp.workdps(dps):
        z = _z(x, tau)
        fin = [v for v in z if v != mpmath.ninf]
        m = len(fin)
        if m == k:
            return [mpf(1) if v != mpmath.ninf else mpf(0) for v in z], 0
        anchors = (mpf(0), mpf(1))
        cost = [[(v - y) ** 2 / 2 for y in anchors] for v in fin]
        log_mu = -mpmath.log(m)
        log_nu = (mpmath.log(mpf(m - k) / m), mpmath.log(mpf(k) / m))
        g = [mpf(0), mpf(0)]
        target = mpf(10) ** (-(dps - 10))
        f = [log_mu - mpmath.log(mpmath.fsum(mpmath.exp(g[j] - c[j]) for j in range(2))) for c in cost]
        for it in range(1, max_iter + 1):
            g = [
                log_nu[j] - mpmath.log(mpmath.fsum(mpmath.exp(fi - c[j]) for fi, c in zip(f, cost)))
                for j in range(2)
            ]
            f_new = [log_mu - mpmath.log(mpmath.fsum(mpmath.exp(g[j] - c[j]) for j in range(2))) for c in cost]
            err = max(abs(mpmath.expm1(a - b)) for a, b in zip(f, f_new))
            f = f_new
            if err < target:
                break
        else:
            raise RuntimeError("reference Sinkhorn did not converge")
        # f matches g now (rows exact); one more column update makes the columns exact too,
        # and at this precision the two agree to far below float64 resolution.
        p_fin = [m * mpmath.exp(fi + g[1] - c[1]) for fi, c in zip(f, cost)]
        it_out = it
        out, pos = [], 0
        for v in z:
            if v == mpmath.ninf:
                out.append(mpf(0))
            else:
                out.append(p_fin[pos])
                pos += 1
        return out, it_out


# ---------------------------------------------------------------------------------------------
# perturbed


def _at_most(probs: Sequence[Any], r: int) -> Any:
    """P(at most r successes) among independent Bernoulli(probs) (Poisson-binomial recursion)."""
    dist = [mpf(1)] + [mpf(0)] * r
    for pr in probs:
        for j in range(r, 0, -1):
            dist[j] = dist[j] * (1 - pr) + dist[j - 1] * pr
        dist[0] = dist[0] * (1 - pr)
    return mpmath.fsum(dist)


def _ncdf(d: Any) -> Any:
    """``Phi(d)``; 0 or 1 beyond ``|d| > 50`` (``Phi(-50) ~ 1e-545``): mpmath's erfc raises
    OverflowError for ``|d| ~ 1e300``."""
    if d > 50:
        return mpf(1)
    if d < -50:
        return mpf(0)
    return mpmath.ncdf(d)


#: Entries of z whose sorted values are more than this apart are split into clusters: an entry of
#: a cluster wholly above the k-th largest one's is selected except with probability at most
#: ``n Phi(-GAP / sqrt 2)`` (~1e-98), so it is given weight 1 (and 0 below); only the cluster that
#: holds the boundary needs the quadrature, on its values shifted by its maximum (exact in mpmath)
#: at a precision that no longer has to follow |z| ~ 1e300.
CLUSTER_GAP = 30


def perturbed_z(z: Sequence[Any], k: int, *, dps: int = 25) -> list[Any]:
    """Exact ``E[T_k(z + Z)]`` for finite ``z`` (a list of mpf), Z standard Gaussian, to about
    ``1e-98`` (see :data:`CLUSTER_GAP`) or ``dps`` digits."""
    n = len(z)
    order = sorted(range(n), key=lambda i: z[i], reverse=True)
    clusters: list[list[int]] = [[order[0]]]
    for a, b in itertools.pairwise(order):
        if z[a] - z[b] > CLUSTER_GAP:  # rounded at |z| ~ 1e300, but only its size near 30 matters
            clusters.append([])
        clusters[-1].append(b)
    if len(clusters) == 1:
        return _perturbed_quad(z, k, dps=dps)
    out: list[Any] = [mpf(0)] * n
    above = 0
    for members in clusters:
        if above + len(members) <= k:  # wholly inside the top k
            for i in members:
                out[i] = mpf(1)
        elif above < k:  # the boundary cluster: k - above of its entries are selected
            with mp.workdps(dps + int(mpmath.log10(max(abs(mpf(v)) for v in z) + 1)) + 5):
                top = z[members[0]]
                shifted = [z[i] - top for i in members]
            inner = perturbed_z(shifted, k - above, dps=dps)
            for i, v in zip(members, inner):
                out[i] = v
        above += len(members)
    return out


def _perturbed_quad(z: Sequence[Any], k: int, *, dps: int = 25) -> list[Any]:
    """Exact ``E[T_k(z + Z)]`` by quadrature (see :func:`perturbed_z`).

    The working precision follows ``|z|``: at ``z ~ 1e300`` the window ``z_i +- 12`` must not round
    to ``z_i``."""
    extra = int(mpmath.log10(max(abs(mpf(v)) for v in z) + 1)) + 5
    with mp.workdps(dps + extra):
        out = []
        n = len(z)
        for i in range(n):
            others = [z[j] for j in range(n) if j != i]

            def integrand(t: Any, zi: Any = z[i], others: list[Any] = others) -> Any:
                exceed = [_ncdf(zj - t) for zj in others]  # P(z_j + Z_j > t)
                return mpmath.npdf(t, zi, 1) * _at_most(exceed, k - 1)

            # phi(t - z_i) < e^-72 outside z_i +- 12 (the tails carry 2 Phi(-12) ~ 4e-33): a window
            # around z_i, not [min z - 12, max z + 12], which at |z| ~ 1e300 overflowed the quadrature
            lo, hi = z[i] - 12, z[i] + 12
            pts = sorted({lo, *[mpf(v) for v in z if lo < v < hi], hi})
            out.append(mpmath.quad(integrand, pts, method="gauss-legendre"))  # smooth: 2.5x fewer nodes
        return out


def perturbed(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = 25) -> list[Any]:
    """Exact ``E[T_k(x + tau Z)]`` (no masked entries)."""
    with mp.workdps(dps):
        return perturbed_z(_z(x, tau), k, dps=dps)


def _exactly(probs: Sequence[Any], r: int) -> Any:
    """P(exactly r successes) among independent Bernoulli(probs)."""
    if r < 0:
        return mpf(0)
    return _at_most(probs, r) - (_at_most(probs, r - 1) if r >= 1 else mpf(0))


def perturbed_jacobian(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = 20) -> list[list[Any]]:
    """Exact ``d E[T_k(x + tau Z)] / dx`` by differentiating under the integral.

    With ``P_j(t) = Phi(z_j - t)`` and ``S`` the number of other entries (neither ``i`` nor ``j``)
    above ``t``: ``dp_i/dz_j = -int phi(t - z_i) phi(z_j - t) P(S = k - 1) dt`` for ``j != i``, and
    ``dp_i/dz_i = -sum_{j != i} dp_i/dz_j`` (shift invariance); divided by ``tau`` for ``x``.
    """
    with mp.workdps(dps):
        z = _z(x, tau)
        n = len(z)
        jac = [[mpf(0)] * n for _ in range(n)]
        lo, hi = min(z) - 12, max(z) + 12
        pts = sorted({lo, *z, hi})
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                rest = [z[m] for m in range(n) if m not in (i, j)]

                def integrand(t: Any, zi: Any = z[i], zj: Any = z[j], rest: list[Any] = rest) -> Any:
                    probs = [mpmath.ncdf(v - t) for v in rest]
                    return mpmath.npdf(t, zi, 1) * mpmath.npdf(zj - t) * _exactly(probs, k - 1)

                jac[i][j] = -mpmath.quad(integrand, pts) / mpf(tau)
            jac[i][i] = -mpmath.fsum(jac[i][j] for j in range(n) if j != i)
        return jac


# ---------------------------------------------------------------------------------------------
# one signature for the shared test grids: f(x, k, tau=1.0, *, dps=...) -> list of mpf


def thre_clip(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = DPS) -> list[Any]:
    """``clip(z - lambda, 0, 1)``, ``sum = k``."""
    return projection(x, k, tau, power=1, dps=dps)


def thre_cube(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = DPS) -> list[Any]:
    """``clip(z - lambda, 0, 1)^3``, ``sum = k``."""
    return projection(x, k, tau, power=3, dps=dps)


def sinkhorn_fixed_point(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = DPS) -> list[Any]:
    """The exact fixed point of the two-anchor Sinkhorn iteration (the converged plan).

    At the fixed point rows and columns are both exact: ``Gamma_i1 / Gamma_i0 = e^{h - C_i1 + C_i0}``
    with the full squared cost and one scalar ``h = (g_1 - g_0) / eps``, fixed by
    ``sum_i m Gamma_i1 = k``. Solved by float64 bisection for a start, then bisection and Newton
    in mpmath to ``10^-(dps - 5)``. Used where iterating to convergence would take too long (hard
    selections); :func:`sinkhorn` iterates, and the tests check that both agree where it converges.
    """
    import numpy as np

    with mp.workdps(dps):
        z = _z(x, tau)
        fin = [v for v in z if v != mpmath.ninf]
        m = len(fin)
        if m == k:
            return [mpf(1) if v != mpmath.ninf else mpf(0) for v in z]
        # C_i0 - C_i1 = (v^2 - (v - 1)^2) / 2 with eps = 1, written as v - 1/2: the difference of
        # squares cancels all 40 digits at |v| ~ 1e300 (it gave 0.41, 0.30, 0.30 for (0, 1, 1))
        a = [v - mpf(1) / 2 for v in fin]

        def excess(h: Any) -> Any:  # sum p - k, increasing in h
            return mpmath.fsum(1 / (1 + mpmath.exp(-(h + v))) for v in a) - k

        af = np.array([float(v) for v in a])
        lo = -float(af.max()) - math.log(m) - 5.0
        hi = -float(af.min()) + math.log(m) + 5.0
        for _ in range(2200):  # to adjacent floats: the bracket can start 1e300 wide (~2100 halvings)
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:
                break
            t = mid + af
            total = float(np.sum(np.where(t >= 0, 1 / (1 + np.exp(-np.abs(t))), np.exp(-np.abs(t)) / (1 + np.exp(-np.abs(t))))))
            lo, hi = (mid, hi) if total < k else (lo, mid)
        width = mpf(10) ** -6 * (1 + abs(mpf(lo)))
        lo_m, hi_m = mpf(lo) - width, mpf(hi) + width
        while excess(lo_m) > 0:
            lo_m -= 4 * width
        while excess(hi_m) < 0:
            hi_m += 4 * width
        target = mpf(10) ** (-(dps - 5))
        h = (lo_m + hi_m) / 2
        for _ in range(20 * dps):
            e = excess(h)
            if e > 0:
                hi_m = h
            else:
                lo_m = h
            slope = mpmath.fsum(mpmath.exp(-(h + v)) / (1 + mpmath.exp(-(h + v))) ** 2 for v in a)
            new = h - e / slope if slope > 0 else (lo_m + hi_m) / 2
            if not lo_m < new < hi_m:
                new = (lo_m + hi_m) / 2
            if abs(new - h) < target * (1 + abs(h)) or hi_m - lo_m < target * (1 + abs(h)):
                h = new
                break
            h = new
        else:  # never return an unconverged reference (200 float halvings left x = (0, 1, 1, 1),
            # k = 2, tau = 1e-300 at 0.6675 each, summing to 2.0024)
            raise RuntimeError(f"sinkhorn_fixed_point did not converge: bracket {hi_m - lo_m}")
        p_fin = [1 / (1 + mpmath.exp(-(h + v))) for v in a]
        out, pos = [], 0
        for v in z:
            if v == mpmath.ninf:
                out.append(mpf(0))
            else:
                out.append(p_fin[pos])
                pos += 1
        return out


def ot_sinkhorn(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = DPS) -> list[Any]:
    """The converged entropic-OT top-k (see :func:`sinkhorn_fixed_point`)."""
    return sinkhorn_fixed_point(x, k, tau, dps=dps)


def perturbed_masked(x: Sequence[float], k: int, tau: float = 1.0, *, dps: int = 25) -> list[Any]:
    """Exact ``E[T_k(x + tau Z)]``, masked (``-inf``) entries removed and given weight 0."""
    keep = [i for i, v in enumerate(x) if v != float("-inf")]
    with mp.workdps(dps):
        if len(keep) == k:
            vals = [mpf(1)] * k
        else:
            vals = perturbed([x[i] for i in keep], k, tau, dps=dps)
        out = [mpf(0)] * len(x)
        for i, v in zip(keep, vals):
            out[i] = v
        return out


#: The reference of each method of this module, by CLI name (same signature as ``reference.py``).
REFERENCES = {
    "thre-clip": thre_clip,
    "thre-cube": thre_cube,
    "topk-softmax": topk_softmax,
    "ot-sinkhorn": ot_sinkhorn,
    "perturbed": perturbed_masked,
}
