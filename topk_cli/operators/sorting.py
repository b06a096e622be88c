"""Top-k from relaxed sorting: NeuralSort, SoftSort and a differentiable odd-even sorting network.

Axis convention: every function acts on a validated ``(B, n)`` batch ``z`` (see ``_base``): the
largest finite entry of each row is 0, masked entries are ``-inf``. Each method relaxes the
permutation matrix ``P`` that sorts a row decreasingly (``P[i, j]``: the weight of entry ``j`` at
sorted position ``i``, row 0 the largest) and returns the sum of its first ``k`` rows,
``p_j = sum_{i < k} P[i, j]``. Masked entries are removed before relaxing (the rest is computed as
if they were absent, so ``n`` is the number of unmasked entries) and get weight exactly 0.

* ``neuralsort`` (Grover, Wang, Zweig & Ermon, ICLR 2019, "Stochastic optimization of sorting
  networks via continuous relaxations"): ``P[i, :] = softmax((n + 1 - 2i) s - A_s 1)``, ``i`` from
  1, ``A_s[j, l] = |s_j - s_l|``, on ``s = z``. Each row sums to 1 (so ``sum p = k``) but the
  columns do not: a weight can exceed 1 (``x = 0, -1, -2``, ``k = 3``: ``p = 0.947, 1.107, 0.947``), and
  ``k = n`` does not give all ones. Computed in sorted coordinates: the logit of row ``i`` at the
  entry of rank ``r`` minus its value at rank ``i`` is minus a sum of the gaps
  ``g_t = s_(t) - s_(t+1)`` weighted by ``|2 (t - i) + 1|`` (``t`` between ``i`` and ``r``), a sum
  of non-negative terms: no cancellation between the ``O(n |s|)``-sized terms of the definition.
* ``softsort`` (Prillo & Eisenschlos, ICML 2020, "SoftSort: a continuous relaxation for the argsort
  operator"): ``P[i, j] = softmax_j(-|sort(s)_i - s_j|)``, ``d = |.|`` as in their experiments.
  At ``k = 1`` it is exactly softmax; like NeuralSort its columns do not sum to 1.
* ``sorting-network`` (Petersen, Borgelt, Kuehne & Deussen, ICML 2021, "Differentiable sorting
  networks for scalable sorting and ranking supervision"): the odd-even transposition network on
  ``n`` wires (``n`` layers, comparators ``(i, i + 1)`` from ``i = 0`` on even layers and ``i = 1``
  on odd ones), each comparator relaxed with the logistic sigmoid:
  ``alpha = sigmoid(z_b - z_a)``, ``min = alpha a + (1 - alpha) b``,
  ``max = (1 - alpha) a + alpha b``, the relaxed values fed to the next layer. This is
  ``diffsort``'s ``odd_even`` network with ``distribution='logistic'`` and
  ``steepness = 1 / tau`` (the 2021 paper's inverse temperature ``beta``). The network sorts
  ascending, so the top k are the last k wires. Each layer's mixing matrix is doubly stochastic:
  ``0 <= p <= 1`` and ``sum p = k``. It depends on the order of the entries (a relaxed network
  compares fixed wires): it is not permutation-equivariant.

Memory: NeuralSort and SoftSort need the first ``k`` rows of ``P`` (``k n`` entries per row), the
network one comparator state per comparator (``n (n - 1) / 2`` per row; the relaxed permutation
matrix itself is never formed: ``p = M_1 M_2 ... M_L c``, ``c`` the indicator of the top-k wires,
is evaluated from the right). A row needing more than :data:`MAX_ROW_ENTRIES` such entries is
refused (:class:`~topk_cli.errors.InvalidArgumentError`) before any work; rows are processed in
chunks of at most :data:`CHUNK_ENTRIES` entries per working array.

Complements: the network carries ``q = 1 - p`` through the same comparators (from ``1 - c``), so
it keeps its digits where ``p`` is close to 1; NeuralSort's and SoftSort's columns do not sum to
1, so their ``q`` is ``1 - p`` by subtraction (absolute accuracy only).

Derivatives are exact, written by hand (no autodiff): the VJP of NeuralSort and SoftSort in
``O(k n)`` per cotangent, their Jacobians in ``O(k n^2)``; the network's VJP by one forward pass
of the cotangent through the layers and one backward pass through the comparators (``O(n^2)``),
its Jacobian as ``n`` such cotangents. At exact ties ``|s_j - s_l|`` and ``sort(s)`` have kinks
(NeuralSort and SoftSort are C0 there): ties are broken by rank, i.e. the derivatives are those
of the smooth branch where the tied entries are ordered as the stable sort orders them (earlier
position first). That makes them exact along every direction that keeps the tied entries tied
(``d/dtau``, shifts), and for a pair of tied entries each column is a one-sided derivative (the
earlier entry's as it increases, the later one's as it decreases); for the middle entries of a
tie of three or more it is the branch's, which neither one-sided derivative equals. The network
gives tied entries different weights, which the API averages (equal inputs, equal outputs): its
derivative is that of the averaged weights along directions that keep the ties and the network's
own along directions that break them (see :func:`_implementation`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray, Forward, Implementation, average_ties
from topk_cli.references import BoolArray, ReferenceContext

IntArray = NDArray[np.intp]

#: The most relaxed-permutation entries one row may need (2^25, 256 MiB of float64): ``k n`` for
#: neuralsort and softsort, ``n (n - 1) / 2`` comparator states for the network (n <= 8192).
MAX_ROW_ENTRIES = 2**25
#: Rows are processed in chunks whose working arrays hold at most this many entries (2^22, 32 MiB).
CHUNK_ENTRIES = 2**22

#: ``core(z, k, v) -> (p, q, vjp)`` on finite rows ``z (b, m)``; ``v (b, C, m)`` cotangents or None.
Core = Callable[[FloatArray, int, FloatArray | None], tuple[FloatArray, FloatArray, FloatArray | None]]
#: ``jac(z, k) -> (b, m, m)`` on finite rows.
JacCore = Callable[[FloatArray, int], FloatArray]


# ---------------------------------------------------------------------------------------------
# shared: masks, chunks, the size limit


def _row_entries(method: str, m: int, k: int) -> int:
    """Entries of the relaxed permutation (or comparator states) one row needs (the limit's measure)."""
    return m * (m - 1) // 2 if method == "sorting-network" else k * m


def _check_size(method: str, n: int, k: int) -> None:
    need = _row_entries(method, n, k)
    if need <= MAX_ROW_ENTRIES:
        return
    if method == "sorting-network":
        what = f"n(n-1)/2 = {need:.4g} comparator states per row (O(n^2) memory), n = {n}"
        hint = "use n <= 8192"
    else:
        what = f"k*n = {need:.4g} entries of the relaxed permutation per row (O(k n) memory), n = {n}, k = {k}"
        hint = f"use k <= {MAX_ROW_ENTRIES // n} at this n"
    raise InvalidArgumentError(
        f"method {method!r} needs {what}, above its limit of {MAX_ROW_ENTRIES} (2^25, 256 MiB of float64); "
        f"{hint}, or a method of O(n) memory such as thre-laplace"
    )


def _finite_groups(z: FloatArray) -> list[tuple[IntArray, IntArray | None]]:
    """``(rows, cols)`` per number of finite entries: ``cols`` the positions of the finite entries
    of those rows in order (None when no entry is masked)."""
    finite = np.isfinite(z)
    counts = finite.sum(axis=1)
    n = z.shape[1]
    out: list[tuple[IntArray, IntArray | None]] = []
    for m in np.unique(counts):
        rows = np.flatnonzero(counts == m)
        if m == n:
            out.append((rows, None))
        else:
            cols = np.argsort(~finite[rows], axis=1, kind="stable")[:, :m]
            out.append((rows, cols))
    return out


def _chunks(rows: int, per_row: int) -> list[slice]:
    step = max(1, CHUNK_ENTRIES // max(per_row, 1))
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def _run(method: str, core: Core, z: FloatArray, k: int, v: FloatArray | None) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """``core`` on every row of ``z`` (masked entries removed), in chunks; ``v (B, C, n)``."""
    b, n = z.shape
    p = np.zeros((b, n))
    q = np.ones((b, n))
    g = None if v is None else np.zeros(v.shape)
    cols_c = 1 if v is None else v.shape[1]
    for rows, cols in _finite_groups(z):
        m = n if cols is None else cols.shape[1]
        _check_size(method, m, k)
        per_row = _row_entries(method, m, k) * (1 if v is None else 2 + cols_c) + m
        for part in _chunks(rows.size, per_row):
            r = rows[part]
            if cols is None:
                zc = z[r]
                vc = None if v is None else v[r]
            else:
                c = cols[part]
                zc = np.take_along_axis(z[r], c, axis=1)
                vc = None if v is None else np.take_along_axis(v[r], np.broadcast_to(c[:, None, :], (r.size, cols_c, m)), axis=2)
            pc, qc, gc = core(zc, k, vc)
            if cols is None:
                p[r], q[r] = pc, qc
                if g is not None and gc is not None:
                    g[r] = gc
            else:
                c = cols[part]
                pr, qr = p[r], q[r]
                np.put_along_axis(pr, c, pc, axis=1)
                np.put_along_axis(qr, c, qc, axis=1)
                p[r], q[r] = pr, qr
                if g is not None and gc is not None:
                    gr = g[r]
                    np.put_along_axis(gr, np.broadcast_to(c[:, None, :], gc.shape), gc, axis=2)
                    g[r] = gr
    return p, q, g


def _run_jacobian(method: str, jac: JacCore, z: FloatArray, k: int) -> FloatArray:
    """``jac`` on every row of ``z`` (masked entries removed: zero rows and columns), in chunks."""
    b, n = z.shape
    out = np.zeros((b, n, n))
    for rows, cols in _finite_groups(z):
        m = n if cols is None else cols.shape[1]
        _check_size(method, m, k)
        for part in _chunks(rows.size, 4 * m * m):
            r = rows[part]
            if cols is None:
                out[r] = jac(z[r], k)
            else:
                c = cols[part]
                jc = jac(np.take_along_axis(z[r], c, axis=1), k)
                out[r[:, None, None], c[:, :, None], c[:, None, :]] = jc
    return out


def _sorted(z: FloatArray) -> tuple[IntArray, FloatArray, IntArray]:
    """``(order, s, inverse)``: the stable decreasing order, the sorted rows, the inverse permutation."""
    order = np.argsort(-z, axis=1, kind="stable")
    s = np.take_along_axis(z, order, axis=1)
    inverse = np.empty_like(order)
    np.put_along_axis(inverse, order, np.arange(z.shape[1])[None, :].repeat(z.shape[0], axis=0), axis=1)
    return order, s, inverse


def _unsort(a: FloatArray, inverse: IntArray) -> FloatArray:
    """Sorted coordinates back to the row's order along the last axis (``a (b, ..., m)``)."""
    idx = inverse.reshape(inverse.shape[0], *([1] * (a.ndim - 2)), inverse.shape[1])
    return np.take_along_axis(a, np.broadcast_to(idx, a.shape), axis=-1)


def _softmax_rows(logits: FloatArray) -> FloatArray:
    """Softmax along the last axis of logits whose maximum per row is 0 (no shift needed)."""
    with np.errstate(under="ignore"):
        e = np.exp(logits)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_vjp_terms(P: FloatArray, vs: FloatArray) -> FloatArray:
    """``Y[b, c, i, r] = P_ir (v_r - sum_j v_j P_ij)``: the cotangent of the logits of each row."""
    a = np.einsum("bcr,bir->bci", vs, P)
    return P[:, None, :, :] * (vs[:, :, None, :] - a[..., None])


# ---------------------------------------------------------------------------------------------
# NeuralSort


def _neuralsort_logits(s: FloatArray, k: int) -> FloatArray:
    """Rows ``i < k`` of NeuralSort's logits in sorted coordinates, shifted so that row ``i``'s
    maximum (at rank ``i``) is 0: ``(b, k, m)``, every entry a sum of non-negative terms."""
    b, m = s.shape
    out = np.zeros((b, k, m))
    if m == 1:
        return out
    gaps = s[:, :-1] - s[:, 1:]  # >= 0
    i = np.arange(k)[:, None]
    t = np.arange(m - 1)[None, :]
    coef = np.abs(2 * (t - i) + 1).astype(np.float64)  # (k, m - 1)
    with np.errstate(over="ignore"):  # a gap of ~1e308 times 2n: -inf logit, weight 0 (correct)
        terms = coef[None] * gaps[:, None, :]
    upper = np.cumsum(np.where(t >= i, terms, 0.0), axis=2)  # sum_{t=i}^{r-1}: logit at r = t + 1 > i
    lower = np.cumsum(np.where(t < i, terms, 0.0)[:, :, ::-1], axis=2)[:, :, ::-1]  # sum_{t=r}^{i-1}
    out[:, :, 1:] -= upper
    out[:, :, :-1] -= lower
    return out


def _neuralsort_core(z: FloatArray, k: int, v: FloatArray | None) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    _, m = z.shape
    order, s, inverse = _sorted(z)
    P = _softmax_rows(_neuralsort_logits(s, k))  # (b, k, m)
    p = _unsort(P.sum(axis=1), inverse)
    if v is None:
        return p, 1.0 - p, None
    vs = np.take_along_axis(v, np.broadcast_to(order[:, None, :], v.shape), axis=2)
    Y = _softmax_vjp_terms(P, vs)  # (b, C, k, m)
    ysum = Y.sum(axis=2)
    c = (m - 1 - 2 * np.arange(k)).astype(np.float64)  # (n + 1 - 2i) with i from 1
    yc = np.einsum("bcir,i->bcr", Y, c)
    # ties are broken by rank (see the module docstring): sign(s_q - s_l) = sign(l - q) on ranks
    sigma = (m - 1 - 2 * np.arange(m)).astype(np.float64)  # sum_l sign(s_q - s_l)
    cs = np.zeros((*ysum.shape[:2], m + 1))
    np.cumsum(ysum, axis=2, out=cs[:, :, 1:])
    above = cs[:, :, :m]
    below = cs[:, :, m:] - above - ysum
    gs = yc - sigma * ysum + above - below
    return p, 1.0 - p, _unsort(gs, inverse)


def _neuralsort_jac(z: FloatArray, k: int) -> FloatArray:
    """``dp/dz`` (b, m, m): ``J[j, q] = [j = q] sum_i P_ij (c_i - sigma_j) + sum_i P_ij sign(s_j - s_q)
    - sum_i P_ij D_iq`` with ``D_iq = P_iq (c_i - sigma_q) + sum_l P_il sign(s_l - s_q)``, signs on
    ranks (ties broken by rank)."""
    _, m = z.shape
    _, s, inverse = _sorted(z)
    P = _softmax_rows(_neuralsort_logits(s, k))  # (b, k, m)
    c = (m - 1 - 2 * np.arange(k)).astype(np.float64)
    idx = np.arange(m)
    sigma = (m - 1 - 2 * idx).astype(np.float64)
    cs = np.zeros((*P.shape[:2], m + 1))
    np.cumsum(P, axis=2, out=cs[:, :, 1:])
    above = cs[:, :, :m]
    below = cs[:, :, m:] - above - P
    D = P * (c[None, :, None] - sigma[None, None, :]) + above - below  # (b, k, m)
    sign = np.sign(idx[None, :] - idx[:, None]).astype(np.float64)  # sign(s_j - s_q) = sign(q - j) on ranks
    js = sign[None] * P.sum(axis=1)[:, :, None] - np.einsum("bij,biq->bjq", P, D)
    js[:, idx, idx] += np.einsum("bij,bij->bj", P, c[None, :, None] - sigma[None, None, :])
    return _unsort(_unsort(js, inverse).swapaxes(1, 2), inverse).swapaxes(1, 2)


# ---------------------------------------------------------------------------------------------
# SoftSort


def _softsort_parts(s: FloatArray, k: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """``(P, S, T, A, R)`` in sorted coordinates, each ``(b, k, m)`` but ``R (b, k)``: the first k rows
    of SoftSort's matrix ``P``; ``S = sign(s_i - s_r)``, ``A[i, q]`` the derivative of the anchor
    ``sort(s)_i`` in ``s_q``, ``T`` (``S``) and ``R_i = sum_r P_ir (S_ir + [r = i])`` for the
    Jacobian below. Ties are broken by rank (see the module docstring): ``S = sign(r - i)``,
    ``A = [q = i]``."""
    _, m = s.shape
    P = _softmax_rows(-np.abs(s[:, :k, None] - s[:, None, :]))
    i = np.arange(k)[:, None]
    r = np.arange(m)[None, :]
    S = np.broadcast_to(np.sign(r - i).astype(np.float64), P.shape)
    A = np.broadcast_to((r == i).astype(np.float64), P.shape)
    R = np.einsum("bir,bir->bi", P, S + A)
    return P, S, S, A, R


def _softsort_core(z: FloatArray, k: int, v: FloatArray | None) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    order, s, inverse = _sorted(z)
    P, S, T, A, R = _softsort_parts(s, k)
    p = _unsort(P.sum(axis=1), inverse)
    if v is None:
        return p, 1.0 - p, None
    vs = np.take_along_axis(v, np.broadcast_to(order[:, None, :], v.shape), axis=2)
    Y = _softmax_vjp_terms(P, vs)  # (b, C, k, m)
    hplus = np.einsum("bcr,bir->bci", vs, P * (R[:, :, None] - S - A))
    gs = np.einsum("bciq,biq->bcq", Y, T + A) + np.einsum("bci,biq->bcq", hplus, A)
    return p, 1.0 - p, _unsort(gs, inverse)


def _softsort_jac(z: FloatArray, k: int) -> FloatArray:
    """``J = diag(sum_i P_iq (T_iq + A_iq)) - P^T (P o (T + A)) + (P o (R - S - A))^T A`` in sorted
    coordinates (see :func:`_softsort_parts`)."""
    _, m = z.shape
    _, s, inverse = _sorted(z)
    P, S, T, A, R = _softsort_parts(s, k)
    TA = T + A
    js = np.einsum("bij,biq->bjq", P * (R[:, :, None] - S - A), A) - np.einsum("bij,biq->bjq", P, P * TA)
    idx = np.arange(m)
    js[:, idx, idx] += np.einsum("biq,biq->bq", P, TA)
    return _unsort(_unsort(js, inverse).swapaxes(1, 2), inverse).swapaxes(1, 2)


# ---------------------------------------------------------------------------------------------
# the odd-even sorting network


def _layers(m: int) -> list[tuple[int, int]]:
    """``(start, pairs)`` of each of the ``m`` layers: comparators on wires ``(start + 2t, start + 2t + 1)``."""
    return [(layer % 2, (m - layer % 2) // 2) for layer in range(m)]


def _sigmoid_into(d: FloatArray, out: FloatArray) -> FloatArray:
    """``sigmoid(d) = 1 / (1 + exp(-d))`` into ``out`` (``exp`` overflows to inf for ``d < -709``,
    giving exactly 0; relatively accurate everywhere: no ``1 - sigmoid`` by subtraction)."""
    np.negative(d, out=out)
    np.exp(out, out=out)
    out += 1.0
    return np.reciprocal(out, out=out)


def _split_wires(a: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The even and the odd wires (last axis) as two contiguous arrays: every layer of the
    odd-even network compares a contiguous run of one with a contiguous run of the other."""
    return np.ascontiguousarray(a[..., 0::2]), np.ascontiguousarray(a[..., 1::2])


def _join_wires(even: FloatArray, odd: FloatArray) -> FloatArray:
    out = np.empty((*even.shape[:-1], even.shape[-1] + odd.shape[-1]))
    out[..., 0::2] = even
    out[..., 1::2] = odd
    return out


def _network_core(z: FloatArray, k: int, v: FloatArray | None) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """Forward ``p = M_1 ... M_L c`` (and ``q`` with ``1 - c``); with cotangents ``v``, their VJP.

    Pass 1 runs the relaxed values (and ``w = M_l ... M_1 v``) through the layers, storing each
    comparator's ``beta = 1 - alpha = sigmoid(z_a - z_b)`` (and, for the VJP, ``d = z_b - z_a`` and
    ``w_a - w_b``). Pass 2 runs back: ``u = M_{l+1} ... M_L c``, and ``g``, the derivative with
    respect to the values entering each layer: ``dL/dalpha = (w_a - w_b)(u_a - u_b) - (g_a - g_b) d``
    for ``L = v . p``. Every mix is written as a transfer, ``a + beta (b - a)``, so that a
    comparator that barely acts changes its wires by exactly what it should. The wires are kept as
    two contiguous arrays (even, odd): layer ``l`` compares even ``t`` with odd ``t`` (``l`` even)
    or odd ``t`` with even ``t + 1`` (``l`` odd).
    """
    b, m = z.shape
    xs = _split_wires(z)
    ws = None if v is None else _split_wires(v)
    layers = _layers(m)
    sides = [(0, slice(0, h), 1, slice(0, h)) if start == 0 else (1, slice(0, h), 0, slice(1, 1 + h))
             for start, h in layers]
    betas: list[FloatArray] = []
    ds: list[FloatArray] = []
    wds: list[FloatArray] = []
    with np.errstate(over="ignore", under="ignore"):  # exp(+-d) beyond the range: sigmoid 0 or 1, exactly
        for sa, ia, sb, ib in sides:
            xa, xb = xs[sa][:, ia], xs[sb][:, ib]
            d = np.subtract(xb, xa)
            beta = _sigmoid_into(-d, np.empty_like(d))  # the weight moving to the other wire
            betas.append(beta)
            if ws is not None:
                ds.append(d)
                wa, wb = ws[sa][:, :, ia], ws[sb][:, :, ib]
                wd = np.subtract(wa, wb)
                wds.append(wd)
                tw = beta[:, None, :] * wd
                wa -= tw
                wb += tw
                t = beta * d
            else:
                t = np.multiply(d, beta, out=d)
            xa += t  # min = a + beta d
            xb -= t  # max = b - beta d
        top = np.zeros((b, m))
        top[:, m - k:] = 1.0
        us = _split_wires(top)
        qs = _split_wires(1.0 - top)
        gs = None if ws is None else (np.zeros(ws[0].shape), np.zeros(ws[1].shape))
        for layer in range(len(layers) - 1, -1, -1):
            sa, ia, sb, ib = sides[layer]
            beta = betas[layer]
            ua, ub = us[sa][:, ia], us[sb][:, ib]
            ud = np.subtract(ua, ub)
            if gs is not None:
                d = ds[layer]
                alpha = _sigmoid_into(d, np.empty_like(d))
                ab = alpha * beta
                dab = d * ab  # bounded (|d| e^-|d|): no inf * 0 when |d| is huge
                ga, gb = gs[sa][:, :, ia], gs[sb][:, :, ib]
                gd = ga - gb
                grad_alpha = wds[layer] * (ud * ab)[:, None, :] - gd * dab[:, None, :]
                grad_alpha += beta[:, None, :] * gd
                ga -= grad_alpha  # d alpha / d x_a = -alpha beta, and the transfer beta (g_b - g_a)
                gb += grad_alpha
            ud *= beta
            ua -= ud
            ub += ud
            qa, qb = qs[sa][:, ia], qs[sb][:, ib]
            tq = np.subtract(qa, qb)
            tq *= beta
            qa -= tq
            qb += tq
    g = None if gs is None else _join_wires(*gs)
    return _join_wires(*us), _join_wires(*qs), g


def _network_jac(z: FloatArray, k: int) -> FloatArray:
    """``dp/dz`` as the VJPs of the ``m`` unit cotangents, in blocks (``J[j, :] = e_j^T J``)."""
    b, m = z.shape
    out = np.empty((b, m, m))
    block = max(1, CHUNK_ENTRIES // max(1, b * m * m // 2))
    eye = np.eye(m)
    for lo in range(0, m, block):
        hi = min(m, lo + block)
        v = np.broadcast_to(eye[lo:hi][None], (b, hi - lo, m)).copy()
        _, _, g = _network_core(z, k, v)
        assert g is not None
        out[:, lo:hi, :] = g
    return out


# ---------------------------------------------------------------------------------------------
# implementations


def _implementation(method: str, core: Core, jac: JacCore, *, tied_outputs_averaged: bool = False) -> Implementation:
    """``tied_outputs_averaged``: the method gives exactly tied entries different weights, which the
    API averages (equal inputs, equal outputs). Its derivative is then ``J = J_net + (A - I) J_net A``,
    ``A`` the average over each group of tied entries: along a direction that keeps the ties
    (``A d = d``: ``d/dtau``, shifts) it is ``A J_net d``, the derivative of the averaged weights the
    API returns; along one that breaks them (``A d = 0``) it is the network's own ``J_net d``, so an
    all-tied row (e.g. scores initialised equal) still gets the network's gradient."""

    def averaged(z: FloatArray, a: FloatArray) -> FloatArray:
        return average_ties(z, a)[0]

    def forward(z: FloatArray, k: int) -> Forward:
        p, q, _ = _run(method, core, z, k, None)
        return Forward(p=p, q=q)

    def vjp_of(z: FloatArray, k: int, v: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        av = averaged(z, v) if tied_outputs_averaged else v
        if av is v:  # no tie (average_ties returns its argument): J = J_net
            p, q, g = _run(method, core, z, k, v[:, None, :])
            assert g is not None
            return p, q, g[:, 0, :]
        # v^T J = v^T J_net + A (J_net^T (A v - v))
        p, q, g = _run(method, core, z, k, np.stack([v, av - v], axis=1))
        assert g is not None
        return p, q, g[:, 0, :] + averaged(z, g[:, 1, :])

    def vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
        return vjp_of(z, k, v)[2]

    def forward_vjp(z: FloatArray, k: int, v: FloatArray) -> tuple[Forward, FloatArray]:
        p, q, g = vjp_of(z, k, v)
        return Forward(p=p, q=q), g

    def jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
        jn = _run_jacobian(method, jac, z, k)
        if not tied_outputs_averaged:
            return jn
        m = averaged(z, jn.swapaxes(1, 2)).swapaxes(1, 2)  # J_net A: columns averaged over ties
        return jn + averaged(z, m) - m

    forward.__doc__ = f"The {method} top-k weights of a prepared batch (see the module docstring)."
    return Implementation(forward=forward, jacobian=jacobian, vjp=vjp, forward_vjp=forward_vjp)


#: NeuralSort's top-k (integer k; the API groups rows by k).
NEURALSORT = _implementation("neuralsort", _neuralsort_core, _neuralsort_jac)
#: SoftSort's top-k.
SOFTSORT = _implementation("softsort", _softsort_core, _softsort_jac)
#: The logistic odd-even sorting network's top-k.
SORTING_NETWORK = _implementation("sorting-network", _network_core, _network_jac, tied_outputs_averaged=True)


def neuralsort_weights(z: FloatArray, k: int) -> FloatArray:
    """NeuralSort's top-k weights of a prepared batch.

    >>> np.round(neuralsort_weights(np.array([[0.0, -1.0, -2.0]]), 3), 4)
    array([[0.9466, 1.1069, 0.9466]])
    """
    return NEURALSORT.forward(z, k).p


# ---------------------------------------------------------------------------------------------
# probe references: the definitions in extended precision


def _finite_rows(z: FloatArray, k: int, fn: Callable[[NDArray[np.longdouble], int], NDArray[np.longdouble]]) -> FloatArray:
    out = np.zeros(z.shape)
    for rows, cols in _finite_groups(z):
        zc = z[rows] if cols is None else np.take_along_axis(z[rows], cols, axis=1)
        pc = fn(zc.astype(np.longdouble), k).astype(np.float64)
        if cols is None:
            out[rows] = pc
        else:
            part = out[rows]
            np.put_along_axis(part, cols, pc, axis=1)
            out[rows] = part
    return out


def _ld_softmax(a: NDArray[np.longdouble]) -> NDArray[np.longdouble]:
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _neuralsort_definition(s: NDArray[np.longdouble], k: int) -> NDArray[np.longdouble]:
    m = s.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        a1 = np.abs(s[:, :, None] - s[:, None, :]).sum(axis=2)  # A_s 1
        scale = (m + 1 - 2 * np.arange(1, k + 1)).astype(np.longdouble)
        logits = scale[None, :, None] * s[:, None, :] - a1[:, None, :]
    return _ld_softmax(logits).sum(axis=1)


def _softsort_definition(s: NDArray[np.longdouble], k: int) -> NDArray[np.longdouble]:
    top = -np.sort(-s, axis=1)[:, :k]
    return _ld_softmax(-np.abs(top[:, :, None] - s[:, None, :])).sum(axis=1)


def _network_definition(s: NDArray[np.longdouble], k: int) -> NDArray[np.longdouble]:
    """diffsort's formulas: ``alpha = sigmoid(b - a)``, ``1 - alpha`` by subtraction, convex mixes."""
    b, m = s.shape
    x = s.copy()
    alphas = []
    for start, h in _layers(m):
        ia, ib = slice(start, start + 2 * h, 2), slice(start + 1, start + 2 * h, 2)
        with np.errstate(over="ignore"):
            alpha = 1 / (1 + np.exp(x[:, ia] - x[:, ib]))
        a, bb = x[:, ia].copy(), x[:, ib].copy()
        x[:, ia] = alpha * a + (1 - alpha) * bb
        x[:, ib] = (1 - alpha) * a + alpha * bb
        alphas.append(alpha)
    u = np.zeros((b, m), dtype=np.longdouble)
    u[:, m - k:] = 1
    for (start, h), alpha in zip(_layers(m)[::-1], alphas[::-1], strict=True):
        ia, ib = slice(start, start + 2 * h, 2), slice(start + 1, start + 2 * h, 2)
        a, bb = u[:, ia].copy(), u[:, ib].copy()
        u[:, ia] = alpha * a + (1 - alpha) * bb
        u[:, ib] = (1 - alpha) * a + alpha * bb
    return u


def neuralsort_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The definition ``softmax((n + 1 - 2i) s - A_s 1)`` in ``np.longdouble``; rows trusted where its
    logits (of size ``n max |z|``) keep an absolute error below 1e-11."""
    finite = np.isfinite(z)
    n = finite.sum(axis=1)
    span = np.max(np.where(finite, -z, 0.0), axis=1)
    eps = float(np.finfo(np.longdouble).eps)
    trusted = 4.0 * n * n * span * eps < 1e-11
    return _finite_rows(z, k, _neuralsort_definition), trusted


def softsort_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The definition ``softmax_j(-|sort(s)_i - s_j|)`` in ``np.longdouble`` (no cancellation: trusted)."""
    return _finite_rows(z, k, _softsort_definition), np.ones(z.shape[0], dtype=bool)


def sorting_network_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The network run with diffsort's formulas in ``np.longdouble`` (trusted)."""
    return _finite_rows(z, k, _network_definition), np.ones(z.shape[0], dtype=bool)
