"""GradTopK in probability space: a tilted Poisson-binomial dynamic program, in linear space.

GradTopK's weights are the inclusion probabilities of conditional Poisson sampling,
``P(S) ∝ exp(sum_{i in S} z_i)`` over the k-subsets ``S``. For any tilt ``lambda``, draw every
entry independently with probability ``pi_i = sigmoid(z_i - lambda)``; conditioned on drawing
exactly k entries, the subset has exactly that law (the tilt cancels). So, with
``alpha_t(j) = P(j entries drawn among those before t)`` and ``beta_t(m)`` the same after t,

    p_t = pi_t sum_j alpha_t(j) beta_t(k-1-j) / P(k),  1 - p_t = (1 - pi_t) sum_j alpha_t(j) beta_t(k-j) / P(k).

``alpha`` and ``beta`` follow the Poisson-binomial recursion
``alpha(j) <- (1 - pi_i) alpha(j) + pi_i alpha(j-1)``: every step is a convex combination of
numbers in [0, 1], so nothing overflows, no digits cancel, and an underflowed entry carries an
absolute error below ``n * 2^-1074``. Every quantity that reaches ``p`` or ``1 - p`` is a
probability bounded by ``p_t`` or ``1 - p_t`` divided by ``P(k)``; with the tilt chosen so that
the expected number drawn is close to k, ``P(k)`` is of order ``1 / sqrt(var)``. Hence the
result has the accuracy of the log-space program whenever ``P(k)`` is not small and no
``p_t`` or ``1 - p_t`` is below ``TINY``: the callers check both per row and hand the other rows
to the log-space program (very wide spreads, where some marginal is within ``1e-250`` of 0 or 1).

Cost: O(n k) multiply-adds per row and two passes of ``exp`` (no logarithm or exponential per
table entry); no sort. Memory: the ``alpha`` table is checkpointed every ``L ~ sqrt(n)`` entries
and recomputed block by block during the backward sweep, so a chunk of rows needs
``O((n / L + L) k)`` floats, not ``O(n k)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from topk_cli.operators._base import FloatArray
from topk_cli.operators._logspace import exp_into

#: Marginals (or complements) below this are left to the log-space program (see module doc).
TINY = 1e-250

#: Smallest acceptable ``P(k)`` of the tilted draw (the program is exact for any tilt; a tiny
#: ``P(k)`` would only mean that the bound above is loose).
MIN_PK = 1e-10

#: Floats in the working tables of one chunk of rows (64 MiB).
BUDGET = 1 << 23

#: Elements of a sweep step (``(k + 1) * rows``) below which numpy's per-call overhead dominates
#: it: such narrow batches of at most 8 rows (one long vector) are cut into blocks that the
#: sweeps run side by side.
NARROW = 1 << 11

#: Elements per sweep step aimed at when cutting rows into blocks.
WIDE = 1 << 16

#: Entries of the backward sweep whose states are kept and combined with the forward ones in
#: one vectorised operation (fewer, larger numpy calls; at most ``BUDGET / 16`` floats).
SEGMENT = 64


@dataclass(frozen=True)
class Marginals:
    """``p``, ``q = 1 - p`` (both ``(R, n)``), the tangent ``dp`` when asked, and ``certified``
    per row (``P(k) >= MIN_PK``, every finite ``min(p, q) >= TINY``, all finite)."""

    p: FloatArray
    q: FloatArray
    dp: FloatArray | None
    certified: np.ndarray


def _sigmoid_pair(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sigmoid(t), sigmoid(-t))``, both relatively accurate, from one ``exp(-|t|)``."""
    with np.errstate(under="ignore", invalid="ignore"):  # e = 0 far away; t = -inf masked
        e = np.copysign(t, -1.0)  # -|t|, in one pass
        exp_into(e, e)
        r = np.add(e, 1.0)
        np.reciprocal(r, out=r)
        small = np.multiply(e, r, out=e)
    pos = t >= 0
    return np.where(pos, r, small), np.where(pos, small, r)


def _tilt(z: FloatArray, k: int, lam0: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(pi, 1 - pi)`` for a tilt near the one whose expected count is ``k``.

    Starts from ``lam0`` (the Laplace threshold, within log 2 of the sigmoid one) and takes
    Newton steps on ``sum pi = k`` only for rows whose expected count is more than two standard
    deviations from ``k``.
    """
    lam = lam0.copy()
    rows = np.arange(z.shape[0])
    pi, qi = _sigmoid_pair(z - lam[:, None])
    for step in range(4):
        if step == 0:  # every row: no gathered copies
            mu = pi.sum(axis=1)
            var = np.einsum("rn,rn->r", pi, qi)
        else:
            mu = pi[rows].sum(axis=1)
            var = np.einsum("rn,rn->r", pi[rows], qi[rows])
        off = np.abs(mu - k) > 2.0 * np.sqrt(var) + 0.5
        if not off.any():
            break
        rows = rows[off]
        lam[rows] += (mu[off] - k) / np.maximum(var[off], 1e-300)
        pi[rows], qi[rows] = _sigmoid_pair(z[rows] - lam[rows, None])
    return pi, qi


def _step(a: FloatArray, pi: FloatArray, qi: FloatArray, out: FloatArray, buf: FloatArray) -> None:
    """``out(j) = qi a(j) + pi a(j-1)`` (counts on axis 0, rows on axis 1: long inner loops)."""
    np.multiply(a, qi, out=out)
    np.multiply(a[:-1], pi, out=buf)
    out[1:] += buf


def _tangent_step(a: FloatArray, da: FloatArray, pi: FloatArray, qi: FloatArray, dpi: FloatArray,
                  out: FloatArray, buf: FloatArray) -> None:
    """Tangent of :func:`_step`: ``d out(j) = qi da(j) + pi da(j-1) + dpi (a(j-1) - a(j))``."""
    _step(da, pi, qi, out, buf)
    np.subtract(a[:-1], a[1:], out=buf)
    buf *= dpi
    out[1:] += buf
    out[0] -= dpi * a[0]


def _layout(rows: int, n: int, k: int, tables: int) -> tuple[int, int]:
    """``(rows per chunk, checkpoint interval L)`` keeping a chunk's tables within ``BUDGET``."""
    per_row_full = (n + 1) * (k + 1) * tables
    full_rows = BUDGET // per_row_full
    if full_rows >= min(rows, 256):
        return max(1, min(rows, full_rows)), n
    interval = math.isqrt(n) + 1
    per_row = (n // interval + interval + 3) * (k + 1) * tables
    return max(1, min(rows, BUDGET // per_row)), interval


def marginals(z: FloatArray, k: int, lam0: FloatArray, v: FloatArray | None = None) -> Marginals:
    """GradTopK marginals of the rows of ``z`` (``(R, n)``, ``-inf`` masked) for one ``k``.

    Needs ``1 <= k < m`` (``m`` unmasked entries per row; use the complement identity to keep
    ``k <= m/2``: the cost is O(n k)). ``lam0`` is a starting tilt per row (any value works;
    one whose expected count is near k keeps ``P(k)`` large). With ``v`` (``(R, n)``), also the
    tangent ``dp`` along ``v`` (= ``J v``, the VJP: the Jacobian is symmetric).
    """
    rows, n = z.shape
    blocks = _block_count(rows, n, k)
    if blocks >= 2:
        return _blocked(z, k, lam0, v, blocks)
    tables = 1 if v is None else 2
    chunk, interval = _layout(rows, n, k, tables)
    p = np.empty((rows, n))
    q = np.empty((rows, n))
    dp = None if v is None else np.empty((rows, n))
    certified = np.empty(rows, dtype=bool)
    for r0 in range(0, rows, chunk):
        sl = slice(r0, min(rows, r0 + chunk))
        out = _chunk(z[sl], k, lam0[sl], None if v is None else v[sl], interval)
        p[sl], q[sl], certified[sl] = out.p, out.q, out.certified
        if dp is not None and out.dp is not None:
            dp[sl] = out.dp
    return Marginals(p=p, q=q, dp=dp, certified=certified)


def _chunk(z: FloatArray, k: int, lam0: FloatArray, v: FloatArray | None, interval: int) -> Marginals:
    pi, qi = _tilt(z, k, lam0)
    pit, qit = np.ascontiguousarray(pi.T), np.ascontiguousarray(qi.T)  # (n, R): one entry per step
    dpit = None if v is None else np.ascontiguousarray((pi * qi * v).T)
    nh, mh, dnh, dmh = _sweeps(pit, qit, dpit, k, interval)
    return _finish(z, pit, qit, dpit, nh, mh, dnh, dmh)


#: Initial states of the sweeps: ``(alpha, d alpha, beta, d beta)`` before the first entry and
#: after the last one, ``(k + 1, R)`` each; None: nothing drawn (``e_0``) with zero tangent.
_Starts = tuple[FloatArray, FloatArray | None, FloatArray, FloatArray | None]


def _sweeps(pit: FloatArray, qit: FloatArray, dpit: FloatArray | None, k: int, interval: int,
            starts: _Starts | None = None) -> tuple[FloatArray, FloatArray, FloatArray | None, FloatArray | None]:
    """The forward and backward sweeps over entries (``(n, R)`` inputs): the numerators
    ``(nh, mh)`` of ``p_t`` and ``1 - p_t`` (before the factors ``pi_t``, ``1 - pi_t``) and
    their tangents, ``(n, R)`` each."""
    n, rows = pit.shape
    width = k + 1
    buf = np.empty((k, rows))
    blocks = (n + interval - 1) // interval
    full = interval >= n
    # states (counts 0..k on axis 0, rows on axis 1) before each entry: all of them, or the first
    # of every block of ``interval`` entries (checkpoints) and the current block
    table = np.empty((min(interval, n) + 1, width, rows))
    dtable = None if dpit is None else np.empty_like(table)
    ckpt = table if full else np.empty((blocks, width, rows))
    dckpt = dtable if full or dtable is None else np.empty((blocks, width, rows))
    a = np.zeros((width, rows))
    a[0] = 1.0
    da = np.zeros((width, rows))
    b = np.zeros((width, rows))  # beta after the current segment's last entry
    b[0] = 1.0
    db = np.zeros((width, rows))
    if starts is not None:
        a[:], b[:] = starts[0], starts[2]
        if starts[1] is not None:
            da[:] = starts[1]
        if starts[3] is not None:
            db[:] = starts[3]
    nxt, dnxt = np.empty_like(a), np.empty_like(a)
    if full:  # every state is kept: step from table row to table row, no copies
        table[0] = a
        if dtable is not None:
            dtable[0] = da
        for i in range(n):
            if dtable is not None and dpit is not None:
                _tangent_step(table[i], dtable[i], pit[i], qit[i], dpit[i], dtable[i + 1], buf)
            _step(table[i], pit[i], qit[i], table[i + 1], buf)
    else:
        for i in range(n):
            if i % interval == 0:
                ckpt[i // interval] = a
                if dckpt is not None:
                    dckpt[i // interval] = da
            if dpit is not None:
                _tangent_step(a, da, pit[i], qit[i], dpit[i], dnxt, buf)
                da, dnxt = dnxt, da
            _step(a, pit[i], qit[i], nxt, buf)
            a, nxt = nxt, a
    # backward sweep: beta (the entries after t), kept for a segment of up to ``seg`` entries,
    # then combined with alpha (the entries before t) for the whole segment at once
    nh = np.empty((n, rows))
    mh = np.empty((n, rows))
    dnh = None if dpit is None else np.empty((n, rows))
    dmh = None if dpit is None else np.empty((n, rows))
    seg = max(1, min(SEGMENT, BUDGET // (16 * width * rows)))
    bseg = np.empty((seg, width, rows))
    dbseg = None if dpit is None else np.empty_like(bseg)
    for blk in range(blocks - 1, -1, -1):
        start, stop = blk * interval, min(n, (blk + 1) * interval)
        base = 0 if full else start
        if not full:  # recompute the block's states from its checkpoint
            table[0] = ckpt[blk]
            if dtable is not None and dckpt is not None:
                dtable[0] = dckpt[blk]
            for i in range(start, stop - 1):
                if dtable is not None and dpit is not None:
                    _tangent_step(table[i - start], dtable[i - start], pit[i], qit[i], dpit[i],
                                  dtable[i - start + 1], buf)
                _step(table[i - start], pit[i], qit[i], table[i - start + 1], buf)
        for top in range(stop, start, -seg):
            t0 = max(start, top - seg)
            size = top - t0
            bseg[size - 1] = b  # bseg[t - t0] = beta before entry t
            if dbseg is not None:
                dbseg[size - 1] = db
            for t in range(top - 1, t0 - 1, -1):
                cur = bseg[t - t0]
                nxt_b = bseg[t - t0 - 1] if t > t0 else b
                if dbseg is not None and dpit is not None:
                    nxt_db = dbseg[t - t0 - 1] if t > t0 else db
                    _tangent_step(cur, dbseg[t - t0], pit[t], qit[t], dpit[t], nxt_db, buf)
                _step(cur, pit[t], qit[t], nxt_b, buf)
            at = table[t0 - base : top - base]
            bs = bseg[:size]
            # p_t's numerator: sum_j alpha_t(j) beta_t(k-1-j), j < k; its complement's: beta_t(k-j)
            nh[t0:top] = np.einsum("tjr,tjr->tr", at[:, :k], bs[:, k - 1 :: -1])
            mh[t0:top] = np.einsum("tjr,tjr->tr", at, bs[:, ::-1])
            if dtable is not None and dbseg is not None and dnh is not None and dmh is not None:
                dat = dtable[t0 - base : top - base]
                dbs = dbseg[:size]
                dnh[t0:top] = np.einsum("tjr,tjr->tr", dat[:, :k], bs[:, k - 1 :: -1])
                dnh[t0:top] += np.einsum("tjr,tjr->tr", at[:, :k], dbs[:, k - 1 :: -1])
                dmh[t0:top] = np.einsum("tjr,tjr->tr", dat, bs[:, ::-1])
                dmh[t0:top] += np.einsum("tjr,tjr->tr", at, dbs[:, ::-1])
    return nh, mh, dnh, dmh


def _finish(z: FloatArray, pit: FloatArray, qit: FloatArray, dpit: FloatArray | None, nh: FloatArray,
            mh: FloatArray, dnh: FloatArray | None, dmh: FloatArray | None) -> Marginals:
    """``p``, ``1 - p``, the tangent and the certificate from the sweeps' numerators."""
    num = pit * nh  # (n, R)
    den = np.multiply(qit, mh, out=mh if dpit is None else None)  # mh is still needed for dp
    total = num + den  # = P(k) for every t, up to rounding
    with np.errstate(divide="ignore", invalid="ignore"):  # uncertified rows are recomputed
        pt = np.divide(num, total, out=num)
        qt = np.divide(den, total, out=den)
        dpt = None
        if dpit is not None and dnh is not None and dmh is not None:
            dnum = dpit * nh + pit * dnh
            dden = qit * dmh - dpit * mh
            dpt = (qt * dnum - pt * dden) / total
    # 0 <= num, den <= total: pt and qt lie in [0, 1] or are NaN (0 / 0), and a NaN propagates
    # through minimum and min, failing the comparison; masked entries (p = 0) do not count
    smallest = np.minimum(pt, qt)
    smallest += ~np.isfinite(z.T)
    ok = smallest.min(axis=0) >= TINY
    ok &= total.min(axis=0) >= MIN_PK
    if dpt is not None:
        ok &= np.isfinite(dpt).all(axis=0)
    return Marginals(p=pt.T, q=qt.T, dp=None if dpt is None else dpt.T, certified=ok)


def _block_count(rows: int, n: int, k: int) -> int:
    """Blocks per row for :func:`_blocked` (< 2: run the rows as they are).

    Enough blocks for ``WIDE`` elements per step, at most ``3 n / (k + 1)`` so that the
    ``O(k^2)`` products between blocks stay below a quarter of the sweeps' ``12 n (k + 1)``, and
    at most ``sqrt(n)``, which balances the numpy calls of the products (one per block) against
    those of the sweeps (one per entry of a block); measured fastest against 2 and 4 ``sqrt(n)``."""
    width = k + 1
    if rows * width >= NARROW or rows > 8 or n < 512:  # the products run row by row
        return 1
    return min(-(-WIDE // (rows * width)), 3 * n // width, math.isqrt(n))


def _blocked(z: FloatArray, k: int, lam0: FloatArray, v: FloatArray | None, blocks: int) -> Marginals:
    """:func:`marginals` of a few long rows, each cut into ``blocks`` blocks of consecutive entries.

    The count distribution of a set of independent draws is the product of the generating
    polynomials ``(1 - pi_i) + pi_i x`` (truncated at degree k, which commutes with the product).
    One sweep gives each block's polynomial; their products before and after every block (sums
    of positive terms, so no cancellation) are the sweeps' start states, and the blocks then run
    side by side as if they were rows. The tangent follows the product rule. Same accuracy as
    the row-by-row sweeps, with about ``blocks`` times fewer numpy calls.
    """
    rows, n = z.shape
    width = k + 1
    pi, qi = _tilt(z, k, lam0)
    dpi = None if v is None else pi * qi * v
    size = -(-n // blocks)
    blocks = -(-n // size)
    cols = rows * blocks

    def cut(a: FloatArray, fill: float) -> FloatArray:
        """(R, n) -> (size, R * blocks): entry l of block b of row r at [l, r * blocks + b]."""
        out = np.full((rows, blocks * size), fill)
        out[:, :n] = a
        return np.ascontiguousarray(out.reshape(cols, size).T)

    pit, qit = cut(pi, 0.0), cut(qi, 1.0)  # padding: drawn with probability 0 (no effect)
    dpit = None if dpi is None else cut(dpi, 0.0)
    # each block's polynomial (and its tangent) from nothing drawn
    poly, nxt = np.zeros((width, cols)), np.empty((width, cols))
    poly[0] = 1.0
    dpoly, dnxt = np.zeros((width, cols)), np.empty((width, cols))
    buf = np.empty((k, cols))
    for i in range(size):
        if dpit is not None:
            _tangent_step(poly, dpoly, pit[i], qit[i], dpit[i], dnxt, buf)
            dpoly, dnxt = dnxt, dpoly
        _step(poly, pit[i], qit[i], nxt, buf)
        poly, nxt = nxt, poly
    pre, suf = np.zeros((width, cols)), np.zeros((width, cols))
    dpre, dsuf = np.zeros((width, cols)), np.zeros((width, cols))

    def times(f: FloatArray, df: FloatArray, g: FloatArray, dg: FloatArray) -> tuple[FloatArray, FloatArray]:
        prod = np.convolve(f, g)[:width]
        if dpit is None:
            return prod, df
        return prod, np.convolve(df, g)[:width] + np.convolve(f, dg)[:width]

    for r in range(rows):
        first, last = r * blocks, (r + 1) * blocks - 1
        pre[0, first] = suf[0, last] = 1.0
        for c in range(first, last):
            pre[:, c + 1], dpre[:, c + 1] = times(pre[:, c], dpre[:, c], poly[:, c], dpoly[:, c])
        for c in range(last, first, -1):
            suf[:, c - 1], dsuf[:, c - 1] = times(poly[:, c], dpoly[:, c], suf[:, c], dsuf[:, c])
    chunk, interval = _layout(cols, size, k, 1 if dpit is None else 2)
    parts = []
    for c0 in range(0, cols, chunk):
        sl = slice(c0, c0 + chunk)
        starts = (pre[:, sl], None if dpit is None else dpre[:, sl], suf[:, sl], None if dpit is None else dsuf[:, sl])
        parts.append(_sweeps(pit[:, sl], qit[:, sl], None if dpit is None else dpit[:, sl], k, interval, starts))

    def join(i: int) -> FloatArray:
        """The sweeps' output ``i`` back in the layout (n, R)."""
        whole = np.concatenate([part[i] for part in parts], axis=1)
        return np.ascontiguousarray(whole.T.reshape(rows, blocks * size)[:, :n].T)

    nh, mh = join(0), join(1)
    dnh, dmh = (None, None) if dpit is None else (join(2), join(3))
    return _finish(z, np.ascontiguousarray(pi.T), np.ascontiguousarray(qi.T),
                   None if dpi is None else np.ascontiguousarray(dpi.T), nh, mh, dnh, dmh)
