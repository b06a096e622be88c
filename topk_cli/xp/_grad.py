"""GradTopK (``grad``) on any array-API namespace: ``p = grad_z log e_k(exp z)``, exactly.

``p_i = e^{z_i} e_{k-1}(e^z without i) / e_k(e^z)``, ``e_k`` the k-th elementary symmetric
polynomial: the inclusion probabilities of conditional Poisson sampling. For any tilt ``lambda``,
draw every entry independently with probability ``pi_i = sigmoid(z_i - lambda)``; conditioned on
exactly k draws, the subset has GradTopK's law (the tilt cancels), so with ``a_t(j) = log P(j
drawn before t)`` and ``b_t(m) = log P(m drawn after t)``

    p_t = pi_t N_t / (pi_t N_t + (1 - pi_t) M_t),  N_t = sum_j e^{a_t(j) + b_t(k-1-j)},  M_t = sum_j e^{a_t(j) + b_t(k-j)},

and ``a`` follows ``a_t(j) = logaddexp(a_{t-1}(j) + log(1 - pi), a_{t-1}(j-1) + log pi)`` (its
mirror for ``b``): the numpy engine's probability-space program (:mod:`topk_cli.operators._poisson`)
run in log space, so that nothing underflows at any spread (the engine falls back to a log-space
program on such rows; here one program serves every row, with no data-dependent branch). Sums of
positive terms only: no cancellation; with ``lambda`` near the sigmoid threshold (a few Newton
steps) the log-probabilities that matter stay small, so their rounding does too (log-space
programs normalised by the top entries instead carry values up to ``log C(n, k)``: 1e-12 errors at
n = 1000). ``p_t = sigmoid(log(pi_t N_t) - log((1 - pi_t) M_t))``: relatively accurate.

The Jacobian ``dp/dz`` is symmetric (the covariance of the k-subset indicators), so the VJP is the
tangent along ``g``: forward mode through the same program (every tangent a convex combination of
bounded tangents, the tilt held fixed), ``dp_t = p_t q_t (d log(pi_t N_t) - d log((1 - pi_t) M_t))``.

``k`` is a Python ``int``, the same for every row (static under ``jax.jit``); the sweeps run over
the ``n`` entries (a :data:`Scan`: a Python loop, or ``jax.lax.scan``), each step a few
operations on ``(B, k + 1)`` arrays: O(n k) work and memory per row. Unlike the engine, rows with
``k > m/2`` do not switch to the complement program (``m`` differs per row with masks), so the
cost is O(n k), not O(n min(k, n - k)). No value is read back to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from topk_cli.xp._common import Array, device, sort_descending

#: Newton steps of the tilt (:func:`_tilt`) and the most each may move it.
TILT_STEPS = 6
TILT_MOVE = 4.0


def _ninf(xp: Any, like: Array, shape: tuple[int, ...]) -> Array:
    return xp.full(shape, -xp.inf, dtype=like.dtype, device=device(like))


def _zeros(xp: Any, like: Array, shape: tuple[int, ...]) -> Array:
    return xp.zeros(shape, dtype=like.dtype, device=device(like))


def _lse(xp: Any, a: Array) -> tuple[Array, Array]:
    """``(log sum exp, softmax)`` over axis 1; ``-inf`` and weights 0 for a row of ``-inf`` (an
    empty sum: no weight, no derivative; no NaN)."""
    top = xp.max(a, axis=1)
    ok = xp.isfinite(top)
    safe = xp.where(ok, top, xp.zeros_like(top))
    e = xp.exp(a - safe[:, None])  # 0 on a row of -inf
    total = xp.where(ok, xp.sum(e, axis=1), xp.ones_like(top))  # >= 1 where ok (the top term is 1)
    return xp.where(ok, safe + xp.log(total), top), e / total[:, None]


class Scan(Protocol):
    """``scan(step, carry, xs, reverse=False) -> (carry, ys)`` with the semantics of
    ``jax.lax.scan``: ``xs`` a tuple of arrays with a leading axis of length ``n``,
    ``step(carry, x) -> (carry, y)`` called on their slices in order (from the last with
    ``reverse``), ``ys`` the tuple of ``y``'s arrays stacked on a new leading axis, in ``xs``'s order."""

    def __call__(self, f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, *,
                 reverse: bool = False) -> tuple[Any, Any]: ...


def python_scan(xp: Any) -> Scan:
    """A Python loop with :data:`Scan`'s semantics (the default): ``n`` steps, unrolled under a
    tracer. ``jax.lax.scan`` computes the same and keeps a ``jax.jit`` graph small (one step)."""

    def scan(f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, *,
             reverse: bool = False) -> tuple[Any, Any]:
        n = xs[0].shape[0]
        carry, ys = init, []
        for i in range(n - 1, -1, -1) if reverse else range(n):
            carry, y = f(carry, tuple(x[i, ...] for x in xs))
            ys.append(y)
        if reverse:
            ys.reverse()
        return carry, tuple(xp.stack([y[j] for y in ys], axis=0) for j in range(len(ys[0])))

    return scan


def _program(xp: Any, lp: Array, lq: Array, k: int, ds: Array | None, scan: Scan) -> tuple[Array, Array | None]:
    """``(log p - log q, dp)`` from the log draw probabilities ``lp = log pi``, ``lq = log(1 - pi)``
    (``(B, n)``; ``-inf`` and 0 on masked entries), ``dp`` the tangent along ``ds`` (``(B, n)``, 0 on
    masked entries) when given (``d lp = (1 - pi) ds``, ``d lq = -pi ds``: the tilt is held fixed,
    as the result does not depend on it)."""
    rows = lp.shape[0]
    start = xp.concat([_zeros(xp, lp, (rows, 1)), _ninf(xp, lp, (rows, k))], axis=1)
    dstart = _zeros(xp, lp, (rows, k + 1))
    tangent = ds is not None
    cols: tuple[Array, ...] = (lp, lq)
    if ds is not None:
        cols = (lp, lq, xp.exp(lq) * ds, -xp.exp(lp) * ds)
    # carries and scanned inputs hold the tangents only when asked: (a,) or (a, da)
    steps = tuple(xp.permute_dims(c, (1, 0)) for c in cols)  # (n, B): one entry per step
    init = (start, dstart) if tangent else (start,)

    # the prefix before every entry: a_t (and its tangent) for t = 0..n-1
    def forward_step(carry: Any, x: Any) -> tuple[Any, Any]:
        if not tangent:
            return (_step(xp, carry[0], None, x)[0],), carry
        return _step(xp, carry[0], carry[1], x), carry

    _, prefix = scan(forward_step, init, steps)

    # the suffix after every entry, from the last: log N_t, log M_t (and their tangents) on the way
    def backward_step(carry: Any, x: Any) -> tuple[Any, Any]:
        b = carry[0]
        a_t = x[4] if tangent else x[2]
        b_rev = xp.flip(b, axis=1)  # b_rev[j] = b(K - j)
        en = a_t[:, :k] + b_rev[:, 1:]  # N_t / pi_t: j drawn before t, K - 1 - j after
        em = a_t + b_rev  # M_t / (1 - pi_t): K drawn without t
        (ln, wn), (lm, wm) = _lse(xp, en), _lse(xp, em)
        diff = (x[0] + ln) - (x[1] + lm)
        if not tangent:
            return (_step(xp, b, None, x)[0],), (diff,)
        da_t, db_rev = x[5], xp.flip(carry[1], axis=1)
        d_ln = xp.sum(wn * (da_t[:, :k] + db_rev[:, 1:]), axis=1)
        d_lm = xp.sum(wm * (da_t + db_rev), axis=1)
        return _step(xp, b, carry[1], x), (diff, (x[2] + d_ln) - (x[3] + d_lm))

    _, outs = scan(backward_step, init, (*steps, *prefix), reverse=True)
    diff, *rest = (xp.permute_dims(a, (1, 0)) for a in outs)
    return diff, (rest[0] if tangent else None)


def _step(xp: Any, a: Array, da: Array | None, x: Any) -> tuple[Array, Array]:
    """One entry into a table row ``a`` (``(B, K + 1)``: ``log P(j drawn)``) and its tangent:
    ``a(j) <- logaddexp(a(j) + lq, a(j - 1) + lp)``; ``x = (lp, lq[, d lp, d lq])``, ``(B,)`` each."""
    lp, lq = x[0][:, None], x[1][:, None]
    old = a[:, 1:] + lq
    new = a[:, :-1] + lp
    if da is None:
        out = xp.concat([a[:, :1] + lq, xp.logaddexp(old, new)], axis=1)
        return out, out
    # logaddexp(old, new) = hi + log1p(e), e = e^{lo - hi}, with the weights of its derivative
    # u d(old) + v d(new) from the same e: 1 / (1 + e) for the larger term, e / (1 + e) for the
    # other (both relatively accurate), 0 where both terms are -inf (no derivative)
    hi, lo = xp.maximum(old, new), xp.minimum(old, new)
    ok = xp.isfinite(hi)
    e = xp.exp(lo - xp.where(ok, hi, xp.zeros_like(hi)))  # 0 where lo is -inf
    cur = hi + xp.log1p(e)
    zero = xp.zeros_like(e)
    big = xp.where(ok, 1.0 / (1.0 + e), zero)
    small = e * big
    newer = new > old
    u, v = xp.where(newer, small, big), xp.where(newer, big, small)
    out = xp.concat([a[:, :1] + lq, cur], axis=1)
    dlp, dlq = x[2][:, None], x[3][:, None]
    dcur = u * (da[:, 1:] + dlq) + v * (da[:, :-1] + dlp)
    return out, xp.concat([da[:, :1] + dlq, dcur], axis=1)


def _sigmoid(xp: Any, t: Array) -> Array:
    """``1 / (1 + e^-t)`` without overflow (0 at ``t = -inf``)."""
    e = xp.exp(-xp.abs(t))
    return xp.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _tilt(xp: Any, z: Array, k: int) -> tuple[Array, Array]:
    """``(lambda, c)``: a tilt ``lambda`` per row with ``sum sigmoid(z - lambda)`` near ``k``: from the midpoint of the
    k-th and (k+1)-th largest entries, :data:`TILT_STEPS` Newton steps of at most
    :data:`TILT_MOVE` each. Any finite tilt gives the same weights; a good one keeps the table's
    relevant log-probabilities small (rounding relative to ``log C(n, k)`` otherwise). ``c`` is
    ``lambda`` clipped to the k-th and (k+1)-th largest entries: a centre within the row (``lambda``
    may lie ``log(n / k)`` outside it) for ``g_tau``."""
    n = z.shape[1]
    s = sort_descending(xp, z)
    sk = s[:, k - 1]
    below = s[:, k] if k < n else xp.full_like(sk, -xp.inf)
    lam = xp.where(xp.isfinite(below), (sk + below) / 2, sk - 1.0)
    tiny = xp.finfo(z.dtype).smallest_normal
    for _ in range(TILT_STEPS):
        pi = _sigmoid(xp, z - lam[:, None])
        mean = xp.sum(pi, axis=1)
        var = xp.sum(pi * _sigmoid(xp, lam[:, None] - z), axis=1)
        lam = lam + xp.clip((mean - k) / xp.maximum(var, tiny), -TILT_MOVE, TILT_MOVE)
    return lam, xp.minimum(xp.maximum(lam, below), sk)


def grad_forward(xp: Any, z: Array, fin: Array, k: int, tau: Array,
                 scan: Scan | None = None) -> tuple[Array, tuple[Array, ...]]:
    """``(p, (z, tau, lam, c))``: GradTopK weights of ``z = (x - max x) / tau`` and what
    :func:`grad_backward` needs: the tilt ``lam`` and the centre ``c`` (:func:`_tilt`), the latter
    of shape ``(B, k)`` (one column repeated: its shape gives :func:`grad_backward` the static ``k``)."""
    lam, c = _tilt(xp, z, k)
    t = z - lam[:, None]
    zero = xp.zeros_like(t)
    diff, _ = _program(xp, -xp.logaddexp(zero, -t), -xp.logaddexp(zero, t), k, None, scan or python_scan(xp))
    p = _sigmoid(xp, diff)
    return xp.where(fin, p, zero), (z, tau, lam, xp.broadcast_to(c[:, None], (z.shape[0], k)))


def grad_backward(xp: Any, residuals: tuple[Array, ...], g: Array,
                  scan: Scan | None = None) -> tuple[Array, Array, Array]:
    """``(g_x, 0, g_tau)``: ``g_x = J_z g / tau`` (the Jacobian is symmetric: a tangent along
    ``g``) and ``g_tau = -(J_z g) . (z - c) / tau`` (``J_z g`` sums to 0, so the shift by ``c``,
    between the k-th and (k+1)-th largest entries, changes nothing but the rounding: no
    cancellation against far entries)."""
    z, tau, lam, cs = residuals
    k = cs.shape[1]
    fin = xp.isfinite(z)
    zero = xp.zeros_like(z)
    t = z - lam[:, None]
    gz = xp.where(fin, g, zero)
    diff, dlog = _program(xp, -xp.logaddexp(zero, -t), -xp.logaddexp(zero, t), k, gz, scan or python_scan(xp))
    assert dlog is not None
    # p = sigmoid(diff): dp = p q d(diff), no cancellation against p or q
    pq = _sigmoid(xp, diff) * _sigmoid(xp, -diff)
    dp = xp.where(fin & (pq > 0), pq * dlog, zero)
    g_tau = -xp.sum(dp * xp.where(fin, z - cs[:, :1], zero), axis=1) / tau
    return dp / tau[:, None], xp.zeros_like(g_tau), g_tau
