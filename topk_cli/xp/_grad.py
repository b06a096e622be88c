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


def _program(xp: Any, s: Array, k: int, ds: Array | None) -> tuple[Array, Array, Array | None]:
    """``(log p, log q, dp)`` of sorted rows ``s`` (``(B, n)``, decreasing, ``1 <= k <= #finite``),
    ``dp`` the tangent along ``ds`` (``(B, n)``, 0 on masked entries) when given."""
    rows, n = s.shape
    off = s[:, :k]  # s_1..s_K: the prefix offsets, finite (k <= #finite)
    off_b = xp.flip(off, axis=1)  # s_K..s_1: the suffix's, s_{K-m+1} at m = 1..K
    one = _zeros(xp, s, (rows, 1))
    a = xp.concat([one, _ninf(xp, s, (rows, k))], axis=1)
    da = _zeros(xp, s, (rows, k + 1))
    prefix, dprefix = [a], [da]
    for i in range(n - 1):  # a_i for i = 0..n-1 (the prefix before each entry)
        a, da = _step(xp, a, da, s[:, i : i + 1], off, None if ds is None else ds[:, i : i + 1])
        prefix.append(a)
        dprefix.append(da)
    b = xp.concat([one, _ninf(xp, s, (rows, k))], axis=1)
    db = _zeros(xp, s, (rows, k + 1))
    log_n, log_m, d_out = [], [], []
    for t in range(n - 1, -1, -1):  # b = b_{t+1}, the suffix after entry t
        st = s[:, t : t + 1]
        a_t = prefix[t]
        b_rev = xp.flip(b, axis=1)  # b_rev[j] = b(K - j)
        en = (st - off) + a_t[:, :k] + b_rev[:, 1:]  # log N_t's terms j = 0..K-1 (offsets cancel)
        em = a_t + b_rev  # log M_t's terms j = 0..K
        ln, lm = _lse(xp, en), _lse(xp, em)
        log_n.append(ln)
        log_m.append(lm)
        if ds is not None:
            dst = ds[:, t]
            da_t = dprefix[t]
            db_rev = xp.flip(db, axis=1)
            d_ln = dst + xp.sum(_weight(xp, en, ln[:, None]) * (da_t[:, :k] + db_rev[:, 1:]), axis=1)
            d_lm = xp.sum(_weight(xp, em, lm[:, None]) * (da_t + db_rev), axis=1)
            d_out.append(d_ln - d_lm)
        if t > 0:
            b, db = _step(xp, b, db, st, off_b, None if ds is None else ds[:, t : t + 1])
    diff = xp.stack(log_n[::-1], axis=1) - xp.stack(log_m[::-1], axis=1)
    zero = xp.zeros_like(diff)
    log_p = -xp.logaddexp(zero, -diff)
    log_q = -xp.logaddexp(zero, diff)
    if ds is None:
        return log_p, log_q, None
    # p = N / (N + M): dp = p q (d log N - d log M), no cancellation against p or q
    dlog = xp.stack(d_out[::-1], axis=1)
    pq = xp.exp(log_p + log_q)
    return log_p, log_q, xp.where(pq > 0, pq * dlog, zero)


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


def grad_forward(xp: Any, z: Array, fin: Array, k: int, tau: Array) -> tuple[Array, tuple[Array, ...]]:
    """``(p, (s, order, inverse, tau, top))``: GradTopK weights of ``z = (x - max x) / tau`` and what
    :func:`grad_backward` needs: the sorted rows, the permutations, and ``top = s[:, :k]`` (its
    shape gives :func:`grad_backward` the static ``k``)."""
    s, order, inverse = _sorted(xp, z)
    log_p, _, _ = _program(xp, s, k, None)
    p = xp.take_along_axis(xp.exp(log_p), inverse, axis=1)
    return xp.where(fin, p, xp.zeros_like(p)), (s, order, inverse, tau, s[:, :k])


def grad_backward(xp: Any, residuals: tuple[Array, ...], g: Array) -> tuple[Array, Array, Array]:
    """``(g_x, 0, g_tau)``: ``g_x = J_z g / tau`` (the Jacobian is symmetric: a tangent along
    ``g``) and ``g_tau = -(J_z g) . (z - s_k) / tau`` (``J_z g`` sums to 0, so the shift by the
    k-th largest ``s_k`` changes nothing but the rounding: no cancellation against far entries)."""
    s, order, inverse, tau, top = residuals
    k = top.shape[1]
    fin = xp.isfinite(s)
    zero = xp.zeros_like(s)
    gs = xp.where(fin, xp.take_along_axis(g, order, axis=1), zero)
    _, _, dp = _program(xp, s, k, gs)
    assert dp is not None
    dp = xp.where(fin, dp, zero)
    t = xp.where(fin, s - top[:, k - 1 :], zero)
    g_tau = -xp.sum(dp * t, axis=1) / tau
    gx = xp.take_along_axis(dp, inverse, axis=1) / tau[:, None]
    return gx, xp.zeros_like(g_tau), g_tau
