"""``coordinate-descent``: CoLT5's fixed-iteration dual ascent for a soft top-k (``coor_descent``).

CoLT5 (Ainslie et al., 2023, "CoLT5: faster long-range transformers with conditional
computation") routes tokens with a soft top-k computed by a fixed number of coordinate-descent
steps on the dual of the entropy-regularised top-k LP (Wright 2015, "Coordinate descent
algorithms"). The public implementation, ``coor_descent`` of lucidrains/CoLT5-attention
(``colt5_attention/coor_descent.py``), runs on scores ``s`` with temperature ``eps``::

    a = 0; b = -s
    repeat n_iters times:
        a = eps * (log k - logsumexp((s + b) / eps))
        b = -relu(s + a)
    p = exp((s + a + b) / eps)

Every quantity scales with ``eps``, so this is the same map of ``s / eps`` at ``eps = 1``: here it
runs on ``z = x / tau`` with ``eps = 1``, i.e. it is ``coor_descent(x, eps=tau)`` with the schedule of
its defaults (``eps_init = None``, ``eps_decay = 1``: no eps-scaling). ``iterations`` defaults to 20,
the ``n_iters`` of the repository's router (its ``topk`` helper and transformer block). The map is
not shift-invariant: the first step ``a = eps (log k - log n)`` (``s + b = 0``) does not follow an
offset of ``s``, so after a fixed number of steps the result depends on it (one step gives
``exp(min(s - log(n / k), 0) / eps)``); so ``z`` is not centred (``Implementation.centred`` False).

At a fixed point ``p = min(1, exp(z + a))`` with ``sum p = k``: thre-exp. After a finite number of
iterations the last ``b`` update moves ``p`` off ``sum p = k`` (the ``a`` update made the sum of
``exp(z + a + b_old)`` exactly k); ``p`` stays in ``[0, 1]`` (it is ``exp(min(z + a, 0))``).
Masked entries (``-inf``) are left out of the log-sum-exp and get weight 0, as the mask of the
public code does.

Derivatives: exact, by reverse mode through the iterations (recomputed from ``z``); the first ``a``
does not depend on ``z`` (``s + b = 0``). On a row where some ``z + a`` is exactly 0 at some step
(a kink of ``relu``: e.g. ``x = 0`` at ``k = n``, where ``a`` stays 0) no derivative exists; there each
column is the one-sided derivative of an increase of its entry, by forward mode (one tangent per
column, ``relu(0 + du) = max(du, 0)``), where the public code's autograd would take slope 0 at every
kink (neither side).
``z + b = z - relu(z + a)`` is computed as ``min(z, -a)``, its exact value: the public code's
subtraction loses ``a`` where ``|z|`` is large (``x = 0,0,1``, k = 1, tau = 1e-20: 1/3, 1/3, 1 in
float64 instead of 0.024, 0.024, 1).
The Jacobian is the VJP of every row of the identity.
"""

from __future__ import annotations

import math

import numpy as np

from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.operators._by_vjp import jacobian_from_vjp
from topk_cli.references import BoolArray, ReferenceContext

#: ``n_iters`` of the public router.
DEFAULT_ITERATIONS = 20


def _run(z: FloatArray, k: int, iterations: int, record: bool = False
         ) -> tuple[FloatArray, list[FloatArray], list[np.ndarray]]:
    """The iterations: ``(u, pis, pos)`` with ``u = z + a`` of the last one, the softmax of
    ``z + b`` of every iteration (when recording) and where ``u > 0`` of every iteration."""
    fin = np.isfinite(z)
    s = np.where(fin, z, 0.0)
    logk = math.log(k)
    s_b = np.zeros(s.shape)  # z + b = z - relu(z + a) = min(z, -a), exactly (0 from b = -z)
    pis: list[FloatArray] = []
    pos: list[np.ndarray] = []
    u = s
    for _ in range(iterations):
        sb = np.where(fin, s_b, -np.inf)
        top = sb.max(axis=1, keepdims=True)
        with np.errstate(under="ignore"):
            e = np.exp(sb - top)
        total = e.sum(axis=1, keepdims=True)
        a = logk - (top + np.log(total))
        u = s + a
        s_b = np.minimum(s, -a)
        if record:
            pis.append(e / total)
            pos.append(u > 0.0)
    if record:
        pos.append(u > 0.0)
    return np.where(fin, u, -np.inf), pis, pos


def coordinate_descent_forward(z: FloatArray, k: int, *, iterations: int = DEFAULT_ITERATIONS) -> Forward:
    """``p = exp(min(z + a, 0))`` after ``iterations`` steps; ``q = -expm1(...)`` exactly.

    >>> np.round(coordinate_descent_forward(np.array([[0.0, -1.0, -2.0]]), 1).p, 4)
    array([[0.6652, 0.2447, 0.09  ]])
    """
    u, _, _ = _run(z, k, iterations)
    t = np.minimum(u, 0.0)  # = (z + a) + (-relu(z + a)), exactly
    with np.errstate(under="ignore"):
        return Forward(p=np.exp(t), q=-np.expm1(t))


#: Elements of the recorded iterations (``iterations n`` per row) one reverse pass holds at once.
_CHUNK = 1 << 23


def _vjp_many(z: FloatArray, k: int, v: FloatArray, iterations: int) -> FloatArray:
    """``V dp/dz`` for ``V (B, C, n)``, rows taken in chunks that bound the recorded iterations' memory."""
    step = max(1, _CHUNK // (iterations * z.shape[1] + v[0].size))
    if z.shape[0] <= step:
        return _vjp_once(z, k, v, iterations)
    return np.concatenate([_vjp_once(z[i:i + step], k, v[i:i + step], iterations) for i in range(0, z.shape[0], step)])


def _vjp_once(z: FloatArray, k: int, v: FloatArray, iterations: int) -> FloatArray:
    """``V dp/dz`` for ``V (B, C, n)``."""
    u, pis, pos = _run(z, k, iterations, record=True)
    with np.errstate(under="ignore"):
        p = np.exp(np.minimum(u, 0.0))
    g_u = v * (p * ~pos[-1])[:, None, :]  # d exp(u - relu(u)) / du
    g_s = np.zeros(v.shape)
    for t in range(iterations - 1, -1, -1):
        g_s += g_u
        if t == 0:  # the first z + b is 0 whatever z
            break
        g_a = g_u.sum(axis=-1, keepdims=True)
        g_sb = -g_a * pis[t][:, None, :]  # a_t = log k - logsumexp(z + b_{t-1})
        g_s += g_sb
        g_u = -g_sb * pos[t - 1][:, None, :]  # b_{t-1} = -relu(u_{t-1})
    out = np.where(np.isfinite(z)[:, None, :], g_s, 0.0)
    kinked = _kink_rows(z, k, iterations)
    if kinked.size:
        n = z.shape[1]
        width = max(1, _CHUNK // (kinked.size * n))  # columns per forward pass: bounded memory
        for start in range(0, n, width):
            cols = np.arange(start, min(n, start + width))
            jac = _one_sided_jacobian(z[kinked], k, iterations, cols)
            out[kinked[:, None], :, cols[None, :]] = np.einsum("bci,bij->bjc", v[kinked], jac)
    return out


def _kink_rows(z: FloatArray, k: int, iterations: int) -> np.ndarray:
    """Rows where some finite ``z + a`` is exactly 0 at some step (``relu`` at its kink)."""
    fin = np.isfinite(z)
    s = np.where(fin, z, 0.0)
    s_b = np.zeros(s.shape)
    hit = np.zeros(z.shape[0], dtype=bool)
    for _ in range(iterations):
        sb = np.where(fin, s_b, -np.inf)
        top = sb.max(axis=1, keepdims=True)
        with np.errstate(under="ignore"):
            total = np.exp(sb - top).sum(axis=1, keepdims=True)
        a = math.log(k) - (top + np.log(total))
        hit |= ((s + a == 0.0) & fin).any(axis=1)
        s_b = np.minimum(s, -a)
    return np.flatnonzero(hit)


def _one_sided_jacobian(z: FloatArray, k: int, iterations: int, cols: np.ndarray) -> FloatArray:
    """``J[b, i, c]``: the derivative of ``p_i`` along an increase of ``z_{cols[c]}`` (one-sided where
    a ``relu`` sits at its kink), by forward mode with one tangent per column, ``(B, n, len(cols))``."""
    bsz, n = z.shape
    fin = np.isfinite(z)
    s = np.where(fin, z, 0.0)
    ds = np.zeros((bsz, cols.size, n))  # [b, c, i]: tangent of s_i along e_{cols[c]}
    ds[:, np.arange(cols.size), cols] = fin[:, cols]
    s_b, ds_b = np.zeros(s.shape), np.zeros(ds.shape)  # z + b and its tangent (0 from b = -z)
    u, du = s, ds
    logk = math.log(k)
    for _ in range(iterations):
        sb = np.where(fin, s_b, -np.inf)
        top = sb.max(axis=1, keepdims=True)
        with np.errstate(under="ignore"):
            e = np.exp(sb - top)
        total = e.sum(axis=1, keepdims=True)
        pi = e / total
        a = logk - (top + np.log(total))
        da = -np.einsum("bji,bi->bj", ds_b, pi)[:, :, None]
        u, du = s + a, ds + da
        up, at = (u > 0.0)[:, None, :], (u == 0.0)[:, None, :]
        s_b = np.minimum(s, -a)  # z - relu(z + a); at the kink its tangent is min(ds, -da)
        ds_b = np.where(up, -da, np.where(at, np.minimum(ds, -da), ds))
    with np.errstate(under="ignore"):
        p = np.exp(np.minimum(u, 0.0))
    neg, at = (u < 0.0)[:, None, :], (u == 0.0)[:, None, :]
    dp = p[:, None, :] * np.where(neg, du, np.where(at, np.minimum(du, 0.0), 0.0))
    dp = np.where(fin[:, None, :] & fin[:, cols][:, :, None], dp, 0.0)
    return np.swapaxes(dp, 1, 2)


def coordinate_descent_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray, *,
                           iterations: int = DEFAULT_ITERATIONS) -> FloatArray:
    """``v^T dp/dz`` by reverse mode through the iterations."""
    return _vjp_many(z, k, v[:, None, :], iterations)[:, 0]


def coordinate_descent_jacobian(fwd: Forward, z: FloatArray, k: int, *,
                                iterations: int = DEFAULT_ITERATIONS) -> FloatArray:
    """``dp/dz``, ``(B, n, n)``."""
    return jacobian_from_vjp(lambda v: _vjp_many(z, k, v, iterations), *z.shape)


def coordinate_descent_reference(z: FloatArray, k: int, ctx: ReferenceContext,
                                 iterations: int = DEFAULT_ITERATIONS) -> tuple[FloatArray, BoolArray]:
    """The public update run in extended precision (``np.longdouble``), on the masked scores ``z = x /
    tau``; every row trusted (each step is a log-sum-exp and a clamp, well conditioned)."""
    fin = np.isfinite(z)
    s = np.where(fin, z, 0.0).astype(np.longdouble)
    s_b = np.zeros(s.shape, dtype=np.longdouble)  # s + b = s - relu(s + a) = min(s, -a), exactly
    a = np.zeros((z.shape[0], 1), dtype=np.longdouble)
    with np.errstate(under="ignore"):
        for _ in range(iterations):
            sb = np.where(fin, s_b, -np.inf)
            top = sb.max(axis=1, keepdims=True)
            a = np.log(np.longdouble(k)) - (top + np.log(np.exp(sb - top).sum(axis=1, keepdims=True)))
            s_b = np.minimum(s, -a)
        p = np.where(fin, np.exp(np.minimum(s + a, 0)), 0)
    return p.astype(np.float64), np.ones(z.shape[0], dtype=bool)


COORDINATE_DESCENT = Implementation(
    forward=coordinate_descent_forward, jacobian=coordinate_descent_jacobian, vjp=coordinate_descent_vjp,
    elementwise=True, centred=False,
)
