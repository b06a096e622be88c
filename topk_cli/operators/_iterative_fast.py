"""``iterative``'s certified fast path: the ``k`` rounds in plain float64 with a rigorous forward
error bound per row (:func:`_it_fast`); :mod:`~topk_cli.operators.iterative` recomputes the rows
it cannot certify faithfully."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward
from topk_cli.operators._logsigned import _UNIT
from topk_cli.operators._logspace import exp_into

#: The fast path returns a row only if its certified bound on the absolute error of ``p`` is at
#: most this (1000 times below :data:`ILL_CONDITIONED_TOLERANCE`, the accuracy the README states
#: for returned rows) ...
_FAST_P_BOUND = 1e-12
#: ... and the bound on the error of every ``1 - p_i`` is at most this fraction of ``|1 - p_i|``
#: (the complement is reported relatively accurately: ``1 - 1e-20`` is not 1).
_FAST_Q_BOUND = 1e-10
#: Error allowed for one float64 ``np.exp``, in units of ``u``: 4 ulps (8 u), a generous margin
#: over the < 1 ulp of glibc's ``exp`` and numpy's vectorised one.
_EXP_ERR = 8.0


def _it_fast(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """The ``k`` rounds in plain float64 (one ``exp`` pass per round), with a rigorous error bound.

    Rows must be free of masked entries. The rows are processed in blocks of about
    :data:`_FAST_BLOCK` entries, all ``k`` rounds of a block at a time, so that the working
    arrays stay in cache (the rows are independent); see :func:`_it_fast_block` for the rounds
    and the bound. ``aux["fast"]`` is 1.0 on the rows whose bound is at most :data:`_FAST_P_BOUND`
    for ``p`` and :data:`_FAST_Q_BOUND` ``|1 - p_i|`` for every ``1 - p_i``;
    ``aux["error_estimate"]`` is the bound on ``p``. Without ``store``, the rounds are not kept
    (``s`` goes to one reused buffer).
    """
    bsz, n = z.shape
    rows = np.arange(bsz)
    argmin = np.argmin(z, axis=-1)
    d = z - z[rows, argmin][:, None]
    s_st = np.empty((bsz, k if store else 1, n))
    ctop, top = np.empty((bsz, k)), np.empty((bsz, k))
    p, q = np.zeros_like(z), np.empty_like(z)
    ep, certified = np.empty(bsz), np.empty(bsz, dtype=bool)
    step = max(1, _FAST_BLOCK // n)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # blown-up bounds: not certified
        for lo in range(0, bsz, step):
            b = slice(lo, lo + step)
            ep[b], certified[b] = _it_fast_block(
                z[b], d[b], k, s_st[b], ctop[b], top[b], p[b], q[b]
            )
    fwd = Forward(p=p, q=q)
    fwd.aux = {"error_estimate": ep, "fast": certified.astype(np.float64)}
    if store:
        fwd.aux.update(s=s_st, ctop=ctop, top=top, qlast=q, d=d, argmin=argmin.astype(np.float64))
    return fwd


#: Entries per block of rows in :func:`_it_fast` and :func:`~topk_cli.operators.iterative._it_vjp_dense` (2^16 float64 = 512 KiB per
#: working array: the few arrays of a block stay in the shared cache, and the numpy calls per
#: block are few enough that their overhead stays small).
_FAST_BLOCK = 2**16


def _it_fast_block(
    z: FloatArray, d: FloatArray, k: int, s_st: FloatArray, ctop_st: FloatArray, top_st: FloatArray,
    p: FloatArray, q: FloatArray,
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """The rounds of :func:`_it_fast` on a block of rows; fills ``s_st``, ``ctop_st``, ``top_st``, ``p`` and ``q``
    and returns the bound on the error of ``p`` and whether each row is certified.

    Per round, with ``y = q d`` (round one ``y = z``), ``e = exp(y - max y)`` (the top entry is 1
    and is left out of ``rest = sum e``, so that ``c_top = rest / (1 + rest)`` is relatively
    accurate: it is ``1 - s_top``), ``s = e / (1 + rest)``, ``c = 1 - s``, ``p <- p + s``,
    ``q <- q - s``. The bound is forward error analysis, each float64 operation contributing at
    most ``u = 2^-53`` relative; ``h_i`` bounds the error of ``q_i`` against the exact rounds:

    * computing the softmax of the computed ``y``: each ``e_j`` is off by
      ``eta_1 = u (max y - min y) + exp_err`` (shift, ``exp``; the top one exact), the normaliser
      ``1 + rest`` by ``eta_n = ((e^{eta_1} - 1) + gamma) c_top + 2 u`` (the summed terms only make
      up ``c_top`` of it, which keeps a saturated ``s_top`` accurate to ``O(u)``), so the computed
      ``s_i`` is within a factor ``e^{+-eta_i}`` (``eta_top = eta_n``, ``eta_i = eta_1 + eta_n``):
      an error ``s_i (e^{eta_i} - 1) e^{eta_i}``; ``gamma = (2 sqrt(n) + 2) u`` bounds the
      rounding of the sum, taken in two levels of about ``sqrt(n)`` terms (:func:`_blocked_sum`;
      ``(m - 1) u`` holds for ``m`` terms in any order). ``min y`` is not scanned: ``q_i <= 1``
      always (``s >= 0``), so ``y`` lies in ``[min(0, min q) max d, max d]`` (``min q`` is one row
      reduction per round);
    * the error of ``y`` itself, ``dy_i = d_i dq_i + rho_i`` (``dq_i`` the error of ``q_i``,
      ``|rho_i| <= 2 u |q_i| d_i`` the rounding of ``d`` and of the product). By the mean value
      theorem for each ``s_i`` (at a point ``xi`` between the exact and the computed ``y``,
      ``sigma = softmax(xi)``), the next ``q_i - s_i`` is off by
      ``dq_i (1 - sigma_i (1 - sigma_i) d_i) - sigma_i (1 - sigma_i) rho_i
      + sigma_i sum_{j != i} sigma_j dy_j`` plus the local error above. The first term keeps its
      sign: an error of ``q_i`` and the error it causes in ``s_i`` cancel (the round contracts
      errors where ``s_i (1 - s_i) d_i < 2``); adding their absolute values instead made the old
      bound grow by ``1 + s_i d_i`` per round. ``sigma`` is within ``e^{+-(2 D + eta)}`` of the
      computed ``s`` (and ``1 - sigma`` of the computed ``c``), ``D = max |dy|``, so
      ``|1 - sigma_i (1 - sigma_i) d_i| <= |1 - s_i c_i d_i| + eps max d`` with
      ``eps = e^{4 D + 2 eta} - 1`` plus the rounding of ``s_i c_i d_i``, and the other terms are
      at most ``F s_i (W + 2 u max|q| max d)`` with ``F = e^{6 D + 2 eta + (n + 16) u}`` and
      ``W = sum_j s_j d_j (h_j + 2 u |q_j|)`` (for the top entry: the sum without it, and its own
      ``rho`` term with its small ``c_top``, so that a saturated ``1 - p_top`` stays relatively
      accurate);
    * ``p + s`` and ``q - s`` add their own rounding, ``u |p| <= u (t + 1)`` and ``u |q|``; since
      ``p + q = 1`` in exact arithmetic, the error of ``p`` is at most ``h`` plus those roundings.

    The bounds are sums and products of non-negative terms (the one subtraction, ``1 - s c d``,
    has its rounding charged in ``eps``), so their own rounding only lowers them by a factor
    ``(1 + u)^{O(k)}``, which the final ``1 + 64 k u`` covers. Exact ties stay bitwise equal in
    ``p`` and ``q``: every operation on them is elementwise or row-wide (the top entry's ``s`` is
    ``1 / (1 + rest)``, as for its tied peers).
    """
    bsz, n = z.shape
    u = _UNIT
    rows = np.arange(bsz)
    gamma_n = 1.01 * (_blocked_sum_depth(n) + 1) * u
    dmax = 1.01 * d.max(axis=-1)  # >= the exact max(z) - min(z) and the computed max d
    q_lo = np.ones(bsz)  # the smallest computed q_i
    aq_max = np.maximum(1.0, -q_lo)  # >= max |q_i|: q_i <= 1 always
    h = np.zeros((bsz, n))  # bound on the error of q, per entry
    y, tmp, c = np.empty((bsz, n)), np.empty((bsz, n)), np.empty((bsz, n))
    q[...] = 1.0
    ep_add = np.zeros(bsz)  # the roundings of p + s and q - s, summed
    for t in range(k):
        s = s_st[:, t % s_st.shape[1]]  # one buffer when the rounds are not kept
        if t == 0:  # round one is softmax(z): z is exact
            top = z.argmax(axis=-1)
            m = z[rows, top]
            np.subtract(z, m[:, None], out=y)
        else:
            np.multiply(q, d, out=y)
            top = y.argmax(axis=-1)
            m = y[rows, top]
            y -= m[:, None]
        exp_into(y, y)  # in the contiguous buffer: the blocked sum reshapes it without a copy
        y[rows, top] = 0.0
        rest = _blocked_sum(y)
        total = 1.0 + rest
        np.divide(y, total[:, None], out=s)
        s_top = 1.0 / total
        s[rows, top] = s_top
        np.subtract(1.0, s, out=c)
        c_top = rest / total
        c[rows, top] = c_top
        ctop_st[:, t] = c_top
        top_st[:, t] = top
        # the local error of the softmax of the computed y
        spread = dmax if t == 0 else m - np.minimum(0.0, q_lo) * dmax
        eta_1 = 1.01 * (u * spread + _EXP_ERR * u)
        eta_n = 1.01 * (np.expm1(eta_1) + gamma_n) * c_top + 2.02 * u
        eta_1n = eta_1 + eta_n
        loc = np.expm1(eta_1n) * np.exp(eta_1n)
        loc_top = np.expm1(eta_n) * np.exp(eta_n)
        eta = eta_1n + gamma_n + 2.02 * u  # the log-error of every s_i and c_i
        h_top = h[rows, top]
        if t == 0:
            np.multiply(s, loc[:, None], out=h)
            h[rows, top] = s_top * loc_top
        else:
            big_d = 1.01 * dmax * (h.max(axis=-1) + 2.02 * u * aq_max)  # >= max |dy|
            two_eta = 2.0 * eta
            f = np.exp(6.0 * big_d + two_eta + 1.01 * (n + 16) * u)
            eps = 1.01 * np.expm1(4.0 * big_d + two_eta) + 4.0 * u
            eps_d = eps * dmax
            v = np.multiply(s, d, out=tmp)  # s_i d_i
            w_h = np.einsum("ij,ij->i", v, h)  # sum_j s_j d_j h_j
            v_top = v[rows, top]
            w_h_rest = np.maximum(0.0, (w_h * (1.0 + 1.01 * (n + 2) * u) - v_top * h_top * (1.0 - 3.0 * u))
                                  * (1.0 + 4.0 * u))
            rho = 2.02 * u * aq_max * dmax  # >= 2 u |q_j| d_j
            w_all = w_h + rho * np.exp(eta)  # sum_j s_j <= e^eta
            w_rest = w_h_rest + rho * c_top * np.exp(two_eta)  # sum_{j != top} s_j <= c_top e^{2 eta}
            # non-top entries: h (|1 - s c d| + eps max d) + s (loc + F (W + rho))
            v *= c
            np.subtract(1.0, v, out=v)
            np.abs(v, out=v)
            v += eps_d[:, None]
            h *= v
            np.multiply(s, (loc + f * (w_all + rho))[:, None], out=v)
            h += v
            # the top entry: its own rho (scaled by c_top) and the sum without it
            w1_top = s_top * c_top * d[rows, top]
            h[rows, top] = (h_top * (np.abs(1.0 - w1_top) + eps_d) + s_top * loc_top
                            + f * s_top * (c_top * 2.02 * u * np.abs(q[rows, top]) * dmax + w_rest))
        q -= s
        p += s
        q_lo = q.min(axis=-1)
        aq_max = np.maximum(1.0, -q_lo)  # >= max |q_i| in the next round: q_i <= 1 always
        np.abs(q, out=tmp)
        tmp *= u
        h += tmp
        ep_add += 1.01 * u * ((t + 1) + aq_max)
    slack = 1.0 + 64.0 * k * u
    ep = slack * (h.max(axis=-1) + ep_add)
    h *= slack
    np.abs(q, out=tmp)
    tmp *= _FAST_Q_BOUND
    certified = (ep <= _FAST_P_BOUND) & (h <= tmp).all(axis=-1)
    return ep, certified


def _blocked_sum(x: FloatArray) -> FloatArray:
    """Row sums of non-negative ``x`` in two levels: blocks of ``L = isqrt(n)`` entries, then the
    block sums and the remainder. Whatever order numpy adds within each level, the relative
    error is at most ``(_blocked_sum_depth(n) + 1) u`` (a sum of ``m`` terms in any order: ``(m - 1) u``)."""
    n = x.shape[1]
    width = max(1, math.isqrt(n))
    blocks = n // width
    head = x[:, : blocks * width].reshape(x.shape[0], blocks, width).sum(axis=-1).sum(axis=-1)
    return head + x[:, blocks * width :].sum(axis=-1)


def _blocked_sum_depth(n: int) -> int:
    """Additions on the longest path of :func:`_blocked_sum`: within a block, across the blocks,
    the remainder (fewer than ``L`` terms) and the final addition."""
    width = max(1, math.isqrt(n))
    return (width - 1) + (n // width - 1) + (width - 1) + 1
