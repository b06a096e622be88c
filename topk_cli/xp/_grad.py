"""GradTopK (``grad``) on any array-API namespace: ``p = grad_z log e_k(exp z)``, exactly.

``p_i = e^{z_i} e_{k-1}(e^z without i) / e_k(e^z)``, ``e_k`` the k-th elementary symmetric
polynomial, computed as the numpy engine's log-space program
(:mod:`topk_cli.operators.gradtopk`): on the rows sorted in decreasing order ``s``, the prefix table
``a_i(j) = log e_j(e^{s_1..s_i}) - (s_1 + ... + s_j)`` and the suffix table
``b_i(m) = log e_m(e^{s_{i+1}..s_n}) - (s_{K-m+1} + ... + s_K)`` follow

    a_i(j) = logaddexp(a_{i-1}(j), (s_i - s_j) + a_{i-1}(j-1))   (and its mirror for b),

sums of positive terms whose values stay within ``[0, log C(n, k)]`` or are negligible: no
overflow, no cancellation, at any offset or spread. With ``N_t = e^{s_t} e_{k-1}(without t)`` and
``M_t = e_k(without t)`` (both from ``a_t`` and ``b_{t+1}``), ``p_t = sigmoid(log N_t - log M_t)``
and ``1 - p_t = sigmoid(log M_t - log N_t)``: both relatively accurate.

The Jacobian ``dp/dz`` is symmetric (the covariance of the k-subset indicators), so the VJP is the
tangent along ``g``: forward mode through the same program (every tangent a convex combination of
bounded tangents), ``dp_t = p_t q_t (d log N_t - d log M_t)``.

``k`` is a Python ``int``, the same for every row (static under ``jax.jit``); the loops run over
the ``n`` entries (static), each step a few operations on ``(B, k)`` arrays: O(n k) work per row,
O(n k) memory per row for the prefix table. Unlike the engine, rows with ``k > m/2`` do not switch
to the complement program (``m`` differs per row with masks), so the cost is O(n k), not
O(n min(k, n - k)). No value is read back to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from topk_cli.xp._common import Array, device


def _ninf(xp: Any, like: Array, shape: tuple[int, ...]) -> Array:
    return xp.full(shape, -xp.inf, dtype=like.dtype, device=device(like))


def _zeros(xp: Any, like: Array, shape: tuple[int, ...]) -> Array:
    return xp.zeros(shape, dtype=like.dtype, device=device(like))


def _weight(xp: Any, num: Array, den: Array) -> Array:
    """``exp(num - den)``, 0 where ``den`` is ``-inf`` (an empty sum: no weight, no derivative)."""
    ok = xp.isfinite(den)
    safe = xp.where(ok, den, xp.zeros_like(den))
    return xp.where(ok, xp.exp(num - safe), xp.zeros_like(num))


def _lse(xp: Any, a: Array) -> Array:
    """``log sum exp`` over axis 1; ``-inf`` for a row of ``-inf`` (no NaN)."""
    top = xp.max(a, axis=1)
    ok = xp.isfinite(top)
    safe = xp.where(ok, top, xp.zeros_like(top))
    total = xp.sum(xp.exp(a - safe[:, None]), axis=1)  # >= 1 where ok (the top term is 1)
    return xp.where(ok, safe + xp.log(xp.where(ok, total, xp.ones_like(total))), top)


#: ``scan(step, carry, xs) -> (carry, ys)`` with the semantics of ``jax.lax.scan``: ``xs`` a tuple
#: of arrays with a leading axis of length ``n``, ``step(carry, x) -> (carry, y)`` called on their
#: slices in order, ``ys`` the tuple of ``y``'s arrays stacked on a new leading axis.
Scan = Callable[[Callable[[Any, Any], tuple[Any, Any]], Any, Any], tuple[Any, Any]]


def python_scan(xp: Any) -> Scan:
    """A Python loop with :data:`Scan`'s semantics (the default): ``n`` steps, unrolled under a
    tracer. ``jax.lax.scan`` computes the same and keeps a ``jax.jit`` graph small (one step)."""

    def scan(step: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any) -> tuple[Any, Any]:
        ys = []
        for i in range(xs[0].shape[0]):
            carry, y = step(carry, tuple(x[i, ...] for x in xs))
            ys.append(y)
        return carry, tuple(xp.stack([y[j] for y in ys], axis=0) for j in range(len(ys[0])))

    return scan


def _program(xp: Any, s: Array, k: int, ds: Array | None, scan: Scan) -> tuple[Array, Array, Array | None]:
    """``(log p, log q, dp)`` of sorted rows ``s`` (``(B, n)``, decreasing, ``1 <= k <= #finite``),
    ``dp`` the tangent along ``ds`` (``(B, n)``, 0 on masked entries) when given."""
    rows = s.shape[0]
    off = s[:, :k]  # s_1..s_K: the prefix offsets, finite (k <= #finite)
    off_b = xp.flip(off, axis=1)  # s_K..s_1: the suffix's, s_{K-m+1} at m = 1..K
    start = xp.concat([_zeros(xp, s, (rows, 1)), _ninf(xp, s, (rows, k))], axis=1)
    dstart = _zeros(xp, s, (rows, k + 1))
    s_t = xp.permute_dims(s, (1, 0))  # (n, B): one entry per step
    tangent = ds is not None
    # carries and scanned inputs hold the tangents only when asked: (a,) or (a, da), (s,) or (s, ds)
    steps = (s_t, xp.permute_dims(ds, (1, 0))) if ds is not None else (s_t,)
    init = (start, dstart) if tangent else (start,)

    # the prefix before every entry: a_t (and its tangent) for t = 0..n-1
    def forward_step(carry: Any, x: Any) -> tuple[Any, Any]:
        a, da = carry if tangent else (carry[0], None)
        nxt, dnxt = _step(xp, a, da, x[0][:, None], off, x[1][:, None] if tangent else None)
        return ((nxt, dnxt), (a, da)) if tangent else ((nxt,), (a,))

    _, prefix = scan(forward_step, init, steps)

    # the suffix after every entry, from the last: log N_t, log M_t (and their tangents) on the way
    def backward_step(carry: Any, x: Any) -> tuple[Any, Any]:
        b, db = carry if tangent else (carry[0], None)
        st = x[0]
        a_t = x[2] if tangent else x[1]
        b_rev = xp.flip(b, axis=1)  # b_rev[j] = b(K - j)
        en = (st[:, None] - off) + a_t[:, :k] + b_rev[:, 1:]  # log N_t's terms j = 0..K-1 (offsets cancel)
        em = a_t + b_rev  # log M_t's terms j = 0..K
        ln, lm = _lse(xp, en), _lse(xp, em)
        if not tangent:
            nxt, _ = _step(xp, b, b, st[:, None], off_b, None)
            return (nxt,), (ln, lm)
        dst, da_t = x[1], x[3]
        db_rev = xp.flip(db, axis=1)
        d_ln = dst + xp.sum(_weight(xp, en, ln[:, None]) * (da_t[:, :k] + db_rev[:, 1:]), axis=1)
        d_lm = xp.sum(_weight(xp, em, lm[:, None]) * (da_t + db_rev), axis=1)
        nxt, dnxt = _step(xp, b, db, st[:, None], off_b, dst[:, None])
        return (nxt, dnxt), (ln, lm, d_ln - d_lm)

    _, outs = scan(backward_step, init, tuple(xp.flip(a, axis=0) for a in (*steps, *prefix)))
    log_n, log_m, *rest = (xp.permute_dims(xp.flip(a, axis=0), (1, 0)) for a in outs)
    diff = log_n - log_m
    zero = xp.zeros_like(diff)
    log_p = -xp.logaddexp(zero, -diff)
    log_q = -xp.logaddexp(zero, diff)
    if not tangent:
        return log_p, log_q, None
    # p = N / (N + M): dp = p q (d log N - d log M), no cancellation against p or q
    pq = xp.exp(log_p + log_q)
    return log_p, log_q, xp.where(pq > 0, pq * rest[0], zero)


def _step(xp: Any, a: Array, da: Array, si: Array, off: Array, dsi: Array | None) -> tuple[Array, Array]:
    """One entry ``si`` (``(B, 1)``) into a table row ``a`` (``(B, K + 1)``) and its tangent:
    ``a(j) <- logaddexp(a(j), (si - off(j)) + a(j - 1))``, ``j = 1..K``."""
    old = a[:, 1:]
    new = (si - off) + a[:, :-1]
    cur = xp.logaddexp(old, new)
    one = a[:, :1]
    out = xp.concat([one, cur], axis=1)
    if dsi is None:
        return out, da
    # d logaddexp(old, new) = u d(old) + v d(new), u, v in [0, 1]; 0 where the entry is -inf
    u, v = _weight(xp, old, cur), _weight(xp, new, cur)
    dcur = u * da[:, 1:] + v * (dsi + da[:, :-1])
    return out, xp.concat([da[:, :1], dcur], axis=1)


def _sorted(xp: Any, z: Array) -> tuple[Array, Array, Array]:
    """``(s, order, inverse)``: the rows sorted decreasingly (masked ``-inf`` last), the order and
    its inverse permutation (``take_along_axis(s, inverse) == z``)."""
    order = xp.argsort(z, axis=1, descending=True, stable=True)
    inverse = xp.argsort(order, axis=1)
    return xp.take_along_axis(z, order, axis=1), order, inverse


def grad_forward(xp: Any, z: Array, fin: Array, k: int, tau: Array,
                 scan: Scan | None = None) -> tuple[Array, tuple[Array, ...]]:
    """``(p, (s, order, inverse, tau, top))``: GradTopK weights of ``z = (x - max x) / tau`` and what
    :func:`grad_backward` needs: the sorted rows, the permutations, and ``top = s[:, :k]`` (its
    shape gives :func:`grad_backward` the static ``k``)."""
    s, order, inverse = _sorted(xp, z)
    log_p, _, _ = _program(xp, s, k, None, scan or python_scan(xp))
    p = xp.take_along_axis(xp.exp(log_p), inverse, axis=1)
    return xp.where(fin, p, xp.zeros_like(p)), (s, order, inverse, tau, s[:, :k])


def grad_backward(xp: Any, residuals: tuple[Array, ...], g: Array,
                  scan: Scan | None = None) -> tuple[Array, Array, Array]:
    """``(g_x, 0, g_tau)``: ``g_x = J_z g / tau`` (the Jacobian is symmetric: a tangent along
    ``g``) and ``g_tau = -(J_z g) . (z - s_k) / tau`` (``J_z g`` sums to 0, so the shift by the
    k-th largest ``s_k`` changes nothing but the rounding: no cancellation against far entries)."""
    s, order, inverse, tau, top = residuals
    k = top.shape[1]
    fin = xp.isfinite(s)
    zero = xp.zeros_like(s)
    gs = xp.where(fin, xp.take_along_axis(g, order, axis=1), zero)
    _, _, dp = _program(xp, s, k, gs, scan or python_scan(xp))
    assert dp is not None
    dp = xp.where(fin, dp, zero)
    t = xp.where(fin, s - top[:, k - 1 :], zero)
    g_tau = -xp.sum(dp * t, axis=1) / tau
    gx = xp.take_along_axis(dp, inverse, axis=1) / tau[:, None]
    return gx, xp.zeros_like(g_tau), g_tau
