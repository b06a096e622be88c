"""GradTopK (``grad``) on any array-API namespace: ``p = grad_z log e_k(exp z)``, exactly.

``p_i = e^{z_i} e_{k-1}(e^z without i) / e_k(e^z)``, ``e_k`` the k-th elementary symmetric
polynomial: the inclusion probabilities of conditional Poisson sampling. For any tilt ``lambda``,
draw every entry independently with probability ``pi_i = sigmoid(z_i - lambda)``
(``q_i = 1 - pi_i``); conditioned on exactly k draws, the subset has GradTopK's law (the tilt
cancels), so with ``A_t = P(k - 1 drawn among the others)`` and ``C_t = P(k drawn among the others)``

    p_t = pi_t A_t / D_t,  1 - p_t = q_t C_t / D_t,  D_t = pi_t A_t + q_t C_t = P(k drawn),

each side relatively accurate. The draw count's generating function is the product of the
entries' ``q_t + pi_t x``: :func:`_tree` multiplies it up a balanced tree of polynomial products
(kept to degree k) and each entry's "others" polynomial back down it, so every table is a
probability (products and sums of numbers in ``[0, 1]``: no cancellation, no overflow) and the
program takes ``2 log2 n`` vectorised levels, O(n k) work per row, where an entry-by-entry
program (the numpy engine's, :mod:`topk_cli.operators._poisson`) takes ``n`` sequential steps.
The tilt (a few Newton steps on ``sum pi = k``) makes ``k`` the mode of the draw count, so
``D_t >= 1 / (n + 1)`` up to the Newton residual: the tables that matter stay far from underflow
(an underflowed table entry is one whose terms are all negligible against ``D_t``).

The Jacobian ``dp/dz`` is symmetric (the covariance of the k-subset indicators), so the VJP is the
tangent along ``g``: forward mode through the same tree (the tilt held fixed),
``dp_t = ((1 - p_t)(dpi_t A_t + pi_t dA_t) - p_t (dq_t C_t + q_t dC_t)) / D_t``.

``k`` is a Python ``int``, the same for every row (static under ``jax.jit``: the tables' shapes
depend on it). Unlike the engine, rows with ``k > m/2`` do not switch to the complement program
(``m`` differs per row with masks), so the cost is O(n k), not O(n min(k, n - k)). No value is
read back to the host.
"""

from __future__ import annotations

import math
from typing import Any

from topk_cli.xp._common import Array, device, top_entries

#: Newton steps of the tilt (:func:`_tilt`) and the most each may move it.
TILT_STEPS = 6
TILT_MOVE = 4.0


def _zeros_rows(xp: Any, like: Array, count: int) -> Array:
    """``count`` coefficients of 0 shaped as ``like``'s (``(count, M, B)``)."""
    return xp.zeros((count, *like.shape[1:]), dtype=like.dtype, device=device(like))


def _span(xp: Any, a: Array, a_lo: int, lo: int, length: int) -> Array:
    """Coefficients ``lo .. lo + length - 1`` of a polynomial of which ``a`` (``(la, M, B)``) holds
    coefficients ``a_lo .. a_lo + la - 1`` (the others are 0)."""
    la = a.shape[0]
    first, stop = max(lo, a_lo), min(lo + length, a_lo + la)
    if stop <= first:
        return _zeros_rows(xp, a, length)
    parts = [a[first - a_lo:stop - a_lo, ...]]
    if first > lo:
        parts.insert(0, _zeros_rows(xp, a, first - lo))
    if lo + length > stop:
        parts.append(_zeros_rows(xp, a, lo + length - stop))
    return parts[0] if len(parts) == 1 else xp.concat(parts, axis=0)


#: Polynomial products with a factor of at most this many coefficients are summed term by term
#: (slices of the other factor: no copies); longer factors (``k`` above it) a block of terms at a
#: time, from stacked shifted copies of at most :data:`BLOCK` elements (bounded memory, and a
#: ``jax.jit`` graph whose size does not grow with ``k``).
SHORT = 32
BLOCK = 1 << 22


def _product(xp: Any, a: Array, a_lo: int, b: Array, lo: int, hi: int,
             da: Array | None = None, db: Array | None = None) -> tuple[Array, Array | None]:
    """Coefficients ``lo .. hi - 1`` of ``A B`` (and of its tangent ``dA B + A dB`` when ``da``, ``db``
    are given), node by node: ``a`` (``(la, M, B)``: coefficient-major, so that every operation
    reads whole ``(M, B)`` blocks) holds coefficients ``a_lo ..`` of ``A`` (the others 0), ``b``
    (``(lb, M, B)``) coefficients ``0 .. lb - 1`` of ``B``: ``(AB)_{lo + w} = sum_j A_{lo + w - j} B_j``.
    For probability tables every term is a product of nonnegative numbers (no cancellation)."""
    lb = b.shape[0]
    width = hi - lo
    start = lo - lb + 1
    span = _span(xp, a, a_lo, start, hi - start)
    dspan = _span(xp, da, a_lo, start, hi - start) if da is not None and db is not None else None
    out = dout = None
    if lb <= SHORT:
        for j in range(lb):
            sa, bj = span[lb - 1 - j:lb - 1 - j + width, ...], b[j, ...]
            term = sa * bj
            out = term if out is None else out + term
            if dspan is not None and db is not None:
                dterm = dspan[lb - 1 - j:lb - 1 - j + width, ...] * bj + sa * db[j, ...]
                dout = dterm if dout is None else dout + dterm
        assert out is not None
        return out, dout
    step = max(1, BLOCK // (width * b.shape[1] * b.shape[2]))
    for j0 in range(0, lb, step):
        js = range(j0, min(lb, j0 + step))

        def shifted(s: Array, js: range = js) -> Array:
            return xp.stack([s[lb - 1 - j:lb - 1 - j + width, ...] for j in js], axis=0)

        bj = b[js.start:js.stop, None, ...]
        sa = shifted(span)
        term = xp.sum(sa * bj, axis=0)
        out = term if out is None else out + term
        if dspan is not None and db is not None:
            dterm = xp.sum(shifted(dspan) * bj + sa * db[js.start:js.stop, None, ...], axis=0)
            dout = dterm if dout is None else dout + dterm
    assert out is not None
    return out, dout


def _width(level: int, k: int) -> int:
    """Coefficients kept of a node ``level`` steps above the leaves: its degree is at most
    ``2^level``, and only those up to ``k`` are read."""
    return min(2 ** min(level, 62), k) + 1


def _even(xp: Any, a: Array, one: bool) -> Array:
    """``a`` (``(c, M, B)``) with an identity node (``[1, 0, ...]``, or 0 for a tangent) appended
    when ``M`` is odd."""
    if a.shape[1] % 2 == 0:
        return a
    pad = xp.zeros((a.shape[0], 1, a.shape[2]), dtype=a.dtype, device=device(a))
    if one:
        pad = xp.concat([xp.ones_like(pad[:1, ...]), pad[1:, ...]], axis=0)
    return xp.concat([a, pad], axis=1)


def _halves(xp: Any, a: Array | None) -> tuple[Array | None, Array | None]:
    """The first and second halves of the nodes (node ``i`` is paired with node ``i + M/2``: both
    halves are contiguous blocks)."""
    if a is None:
        return None, None
    half = a.shape[1] // 2
    return a[:, :half, :], a[:, half:, :]


def _tree(xp: Any, pi: Array, q: Array, k: int,
          dpi: Array | None = None) -> tuple[Array, Array, Array | None, Array | None]:
    """``(A, C, dA, dC)``: with every entry drawn independently with probability ``pi``
    (``q = 1 - pi``), ``A_t = P(k - 1 drawn among the others)`` and ``C_t = P(k drawn among the
    others)`` (``(B, n)``), and their tangents along ``dpi`` (``dq = -dpi``) when given.

    The draw count's generating function is the product of the entries' ``q_t + pi_t x``,
    multiplied up a balanced tree (each node the product of two, kept to degree ``k``), and each
    leaf's "others" polynomial multiplied down it (a node's is its parent's times its sibling's,
    kept to the coefficients ``k - 2^level .. k`` its leaves read): ``2 log2 n`` levels of
    polynomial products, O(n k) work per row in all and O(log n) sequential steps, where an
    entry-by-entry program takes ``n``.
    """
    # (2, n, B): coefficients 0 and 1 of every leaf, the rows innermost (every operation then runs
    # over whole rows of B, however few nodes a level has)
    cur = xp.stack([xp.permute_dims(q, (1, 0)), xp.permute_dims(pi, (1, 0))], axis=0)
    dcur = None
    if dpi is not None:
        dpi_t = xp.permute_dims(dpi, (1, 0))
        dcur = xp.stack([-dpi_t, dpi_t], axis=0)
    ups: list[tuple[Array, Array | None]] = []
    while cur.shape[1] > 1:
        cur = _even(xp, cur, True)
        dcur = _even(xp, dcur, False) if dcur is not None else None
        ups.append((cur, dcur))
        (left, right), (dleft, dright) = _halves(xp, cur), _halves(xp, dcur)
        assert left is not None and right is not None
        cur, dcur = _product(xp, left, 0, right, 0, _width(len(ups), k), dleft, dright)
    # the root's "others" polynomial is 1, kept to its coefficients 0 .. k (the root's degree is
    # at least n >= k: its width is k + 1)
    out = xp.concat([xp.ones_like(cur[:1, ...]), xp.zeros_like(cur[1:, ...])], axis=0)
    dout = xp.zeros_like(out) if dcur is not None else None
    for below in range(len(ups) - 1, -1, -1):
        nodes, dnodes = ups[below]
        half = nodes.shape[1] // 2
        out = out[:, :half, :]  # the level above's own nodes (an identity node appended to pair them is left out)
        dout = dout[:, :half, :] if dout is not None else None
        (left, right), (dleft, dright) = _halves(xp, nodes), _halves(xp, dnodes)
        assert left is not None and right is not None
        w, child = out.shape[0], _width(below, k)
        # node i's sibling is node i + M/2 and back; both halves' parent is the node above them
        first, dfirst = _product(xp, out, k - w + 1, right, k - child + 1, k + 1, dout, dright)
        second, dsecond = _product(xp, out, k - w + 1, left, k - child + 1, k + 1, dout, dleft)
        out = xp.concat([first, second], axis=1)
        dout = xp.concat([dfirst, dsecond], axis=1) if dfirst is not None and dsecond is not None else None
    n = pi.shape[1]
    a, c = xp.permute_dims(out[0, :n, :], (1, 0)), xp.permute_dims(out[1, :n, :], (1, 0))
    if dout is None:
        return a, c, None, None
    return a, c, xp.permute_dims(dout[0, :n, :], (1, 0)), xp.permute_dims(dout[1, :n, :], (1, 0))


def _draws(xp: Any, t: Array) -> tuple[Array, Array]:
    """``(sigmoid(t), sigmoid(-t))``, each relatively accurate, from one ``exp`` pass (0 and 1 at
    ``t = -inf``)."""
    e = xp.exp(-xp.abs(t))
    big = 1.0 / (1.0 + e)
    small = e * big
    up = t >= 0
    return xp.where(up, big, small), xp.where(up, small, big)


def _tilt(xp: Any, z: Array, k: int) -> tuple[Array, Array]:
    """``(lambda, c)``: a tilt ``lambda`` per row with ``sum sigmoid(z - lambda)`` near ``k``: from the
    midpoint of the k-th and (k+1)-th largest entries, :data:`TILT_STEPS` Newton steps of at most
    :data:`TILT_MOVE` each. Any finite tilt gives the same weights; a good one keeps ``P(k drawn)``
    (the mode of the draw count when its mean is k) and the table entries that matter far from
    underflow. ``c`` is ``lambda`` clipped to the k-th and (k+1)-th largest entries: a centre
    within the row (``lambda`` may lie ``log(n / k)`` outside it) for ``g_tau``."""
    n = z.shape[1]
    s, _ = top_entries(xp, z, min(k + 1, n))  # the k + 1 largest: a partial selection, no sort
    sk = s[:, k - 1]
    below = s[:, k] if k < n else xp.full_like(sk, -xp.inf)
    lam = xp.where(xp.isfinite(below), (sk + below) / 2, sk - 1.0)
    tiny = xp.finfo(z.dtype).smallest_normal
    cap = math.log(float(xp.finfo(z.dtype).max)) / 2  # e^cap is finite; sigmoid(-cap) is ~0 to the Newton sums
    for _ in range(TILT_STEPS):
        pi = 1 / (1 + xp.exp(xp.minimum(lam[:, None] - z, cap)))  # (only a Newton step: no exactness needed)
        mean = xp.sum(pi, axis=1)
        var = mean - xp.sum(pi * pi, axis=1)  # sum pi (1 - pi)
        lam = lam + xp.clip((mean - k) / xp.maximum(var, tiny), -TILT_MOVE, TILT_MOVE)
    return lam, xp.minimum(xp.maximum(lam, below), sk)


def _total(xp: Any, pi: Array, q: Array, a: Array, c: Array) -> Array:
    """``D = pi_t A_t + q_t C_t = P(k drawn)``, formed per entry from that entry's own ``A_t`` and
    ``C_t`` (whose roundings, inherited from the same ancestors, then largely cancel in the ratios:
    measured 3x closer to an mpmath reference than the root's ``D``); 1 where it underflows."""
    total = pi * a + q * c
    return xp.where(total > 0, total, xp.ones_like(total))


def grad_forward(xp: Any, z: Array, k: int, tau: Array) -> tuple[Array, tuple[Array, ...]]:
    """``(p, (z, tau, lam, c))``: GradTopK weights of ``z = (x - max x) / tau`` and what
    :func:`grad_backward` needs: the tilt ``lam`` and the centre ``c`` (:func:`_tilt`), the latter
    of shape ``(B, k)`` (one column repeated: its shape gives :func:`grad_backward` the static ``k``)."""
    lam, c = _tilt(xp, z, k)
    t = z - lam[:, None]
    pi, q = _draws(xp, t)  # 0 and 1 on masked entries
    a, c_, _, _ = _tree(xp, pi, q, k)
    p = pi * a / _total(xp, pi, q, a, c_)  # relatively accurate; 1 - p = q C / D likewise
    return p, (z, tau, lam, xp.broadcast_to(c[:, None], (z.shape[0], k)))


def grad_backward(xp: Any, residuals: tuple[Array, ...], g: Array) -> tuple[Array, Array, Array]:
    """``(g_x, 0, g_tau)``: ``g_x = J_z g / tau`` (the Jacobian is symmetric: a tangent along
    ``g``) and ``g_tau = -(J_z g) . (z - c) / tau`` (``J_z g`` sums to 0, so the shift by ``c``,
    between the k-th and (k+1)-th largest entries, changes nothing but the rounding: no
    cancellation against far entries).

    With ``D = pi_t A_t + q_t C_t`` (the same for every ``t``), ``p_t = pi_t A_t / D``; along
    ``dz = g`` (the tilt held fixed: ``p`` does not depend on it) ``dpi = pi q dz = -dq``, and
    ``dp_t = ((1 - p_t)(dpi_t A_t + pi_t dA_t) - p_t (dq_t C_t + q_t dC_t)) / D``, which with
    ``1 - p_t = q_t C_t / D`` and ``pi_t + q_t = 1`` is ``pi_t q_t (A_t C_t dz_t + C_t dA_t - A_t dC_t) / D^2``:
    a saturated ``p_t`` (``pi_t`` or ``q_t`` tiny) keeps the digits of its derivative."""
    z, tau, lam, cs = residuals
    k = cs.shape[1]
    t = z - lam[:, None]
    pi, q = _draws(xp, t)  # 0 and 1 on masked entries: no draw, no tangent
    gz = xp.where(xp.isfinite(z), g, xp.zeros_like(g))
    # J 1 = 0 (a shift of z changes nothing): the tangent along g less its pi q-weighted mean is the
    # same, and its table tangents, sums of terms of both signs, are smaller (less cancellation)
    var = pi * q
    spread = xp.sum(var, axis=1)
    mean = xp.sum(var * gz, axis=1) / xp.where(spread > 0, spread, xp.ones_like(spread))  # 0 on a hard row
    dz = gz - mean[:, None]
    a, c, da, dc = _tree(xp, pi, q, k, var * dz)
    assert da is not None and dc is not None
    total = _total(xp, pi, q, a, c)
    dp = var * ((a * c) * dz + (c * da - a * dc)) / (total * total)
    # masked entries: dp = 0 times a finite stand-in for z - c = -inf
    g_tau = -xp.sum(dp * xp.maximum(z - cs[:, :1], -xp.finfo(z.dtype).max), axis=1) / tau
    return dp / tau[:, None], xp.zeros_like(g_tau), g_tau
