"""GradTopK: ``p = grad_z log e_k(exp z)``, exactly (``grad``) and by the article's recursion.

Both methods compute the same function of a ``(B, n)`` batch ``z`` (rows act independently):

    p_i = e^{z_i} e_{k-1}(e^z without i) / e_k(e^z),

where ``e_k`` is the k-th elementary symmetric polynomial. ``p_i`` is the inclusion probability
of entry ``i`` under conditional Poisson sampling, ``P(S) ∝ exp(sum_{i in S} z_i)`` over the
k-subsets ``S`` (Hájek 1964; Chen, Dempster & Liu 1994), so ``0 < p_i < 1`` and ``sum p = k``.
Its Jacobian ``dp/dz`` is the covariance matrix of the indicators ``1[i in S]``.

``grad`` (:data:`GRAD`) evaluates it with a log-space dynamic program that only ever adds
positive terms, in O(n min(k, n-k)) time per row; ``q = 1 - p`` is computed by the same program,
not by subtraction, so saturated marginals keep their digits. ``grad-recursive``
(:data:`GRAD_RECURSIVE`) runs the recursion of the source article, which subtracts nearly equal
numbers; it detects and reports the rows it cannot compute instead of returning them (it lives
in :mod:`topk_cli.operators.grad_recursive` and uses this module's program as its check).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import ResourceError
from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.operators._logspace import exp_new, logsumexp
from topk_cli.operators._poisson import marginals
from topk_cli.operators.threshold import _laplace_threshold

#: Float64 elements per working table; rows (and Jacobian directions) are processed in chunks
#: so that one O(n k) table of a chunk stays below this size (16 MiB).
_TABLE_BUDGET = 1 << 21

# ---------------------------------------------------------------------------------------------
# grad: the log-space dynamic program


@dataclass(frozen=True)
class _Tables:
    """Log-space tables of one chunk of rows, sorted in decreasing order (``s``, ``(R, n)``).

    With offsets ``o(j) = s_1 + ... + s_j`` and ``o'(m) = s_{K-m+1} + ... + s_K``:
    ``a[i, j] = log e_j(w_1..w_i) - o(j)`` (prefix of length ``i``) and
    ``b[i, m] = log e_m(w_{i+1}..w_n) - o'(m)`` (suffix after ``i`` entries), layout
    ``(n + 1, K + 1, R)``. ``wp``/``wq`` are the weights (softmax) of the terms of
    ``log N_t``/``log M_t``, where ``p_t = N_t / (N_t + M_t)``.
    """

    s: FloatArray
    k: int
    a: FloatArray
    b: FloatArray
    log_p: FloatArray  # (n, R)
    log_q: FloatArray  # (n, R)
    wp: FloatArray  # (n, K, R)
    wq: FloatArray  # (n, K + 1, R)


def _tables(s: FloatArray, k: int) -> _Tables:
    """Run the forward/backward dynamic program on sorted rows ``s`` (decreasing, ``1 <= k``).

    ``a[i, j] = logaddexp(a[i-1, j], (s_i - s_j) + a[i-1, j-1])`` and its mirror ``b``; with
    the rows sorted, every value read in the combination below lies in
    ``[0, log C(n, k)]`` or is a negligible term, so nothing large is ever subtracted.
    """
    rows, n = s.shape
    st = s.T  # (n, R)
    a = np.full((n + 1, k + 1, rows), -np.inf)
    b = np.full((n + 1, k + 1, rows), -np.inf)
    a[:, 0] = 0.0
    b[:, 0] = 0.0
    # -inf (masked) entries only meet finite offsets s_1..s_K: no inf - inf below.
    for j in range(1, k + 1):
        new = (st - st[j - 1]) + a[:-1, j - 1]
        a[1:, j] = np.logaddexp.accumulate(new, axis=0)
    for m in range(1, k + 1):
        new = (st - st[k - m]) + b[1:, m - 1]
        b[:n, m] = np.logaddexp.accumulate(new[::-1], axis=0)[::-1]
    # p_t = N_t / (N_t + M_t) with N_t = w_t e_{K-1}(w without t) and M_t = e_K(w without t):
    # log N_t has the terms j = 0..K-1: (s_t - s_{j+1}) + a[t, j] + b[t+1, K-1-j] (offsets cancel)
    en = (st[:, None, :] - st[None, :k, :]) + a[:n, :k] + b[1:, k - 1 :: -1]
    # log M_t has the terms j = 0..K: a[t, j] + b[t+1, K-j]
    em = a[:n, :] + b[1:, ::-1]
    log_n = logsumexp(en, axis=1)
    log_m = logsumexp(em, axis=1)  # finite: K < number of unmasked entries
    # p = sigmoid(log N - log M), q = sigmoid(log M - log N): p + q = 1 and both relatively
    # accurate, with no common factor e_k to carry (and its rounding) between them
    diff = log_n - log_m
    log_p = -np.logaddexp(0.0, -diff)
    log_q = -np.logaddexp(0.0, diff)
    with np.errstate(invalid="ignore"):  # masked entries: -inf - -inf, weight set to 0
        wp = np.nan_to_num(exp_new(en - log_n[:, None]), nan=0.0)
        wq = np.nan_to_num(exp_new(em - log_m[:, None]), nan=0.0)
    return _Tables(s=s, k=k, a=a, b=b, log_p=log_p, log_q=log_q, wp=wp, wq=wq)


def _step_weights(tab: _Tables) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Weights of the old and the new term in every ``logaddexp`` of the two tables.

    ``a[i, j] = log(e^{old} + e^{new})`` has derivative ``u d(old) + v d(new)`` with
    ``u = e^{old - a[i, j]}``, ``v = e^{new - a[i, j]}``, both in [0, 1]; set to 0 where the
    table entry is ``-inf`` (empty sums, which carry no derivative).
    """
    st, k = tab.s.T, tab.k
    n = st.shape[0]
    a, b = tab.a, tab.b
    ua = np.zeros_like(a)
    va = np.zeros_like(a)
    ub = np.zeros_like(b)
    vb = np.zeros_like(b)
    with np.errstate(invalid="ignore"):  # -inf - -inf where a prefix is too short: weight 0
        ua[1:, 1:] = np.exp(a[:-1, 1:] - a[1:, 1:])
        va[1:, 1:] = np.exp((st[:, None, :] - st[None, :k, :]) + a[:-1, :-1] - a[1:, 1:])
        ub[:n, 1:] = np.exp(b[1:, 1:] - b[:n, 1:])
        offsets = st[k - 1 :: -1]  # s_{K-m+1} for m = 1..K
        vb[:n, 1:] = np.exp((st[:, None, :] - offsets[None, :, :]) + b[1:, :-1] - b[:n, 1:])
    for w in (ua, va, ub, vb):
        np.nan_to_num(w, copy=False, nan=0.0)
    return ua, va, ub, vb


def _tangent(tab: _Tables, ds: FloatArray) -> FloatArray:
    """Directional derivatives ``dp`` of the sorted rows along ``ds`` (``(n, R, D)`` -> same).

    Forward-mode through the dynamic program: every tangent is a convex combination of
    bounded tangents, and ``dp_t = p_t q_t (d log N_t - d log M_t)``, so its error is about
    ``eps * p_t q_t * |ds|_1`` (tiny where ``p_t`` saturates at 0 or 1).
    """
    n, k = tab.s.shape[1], tab.k
    ua, va, ub, vb = _step_weights(tab)
    shape = (n + 1, k + 1, *ds.shape[1:])
    da = np.zeros(shape)
    db = np.zeros(shape)
    ua, va, ub, vb = (w[..., None] for w in (ua, va, ub, vb))
    for i in range(1, n + 1):
        da[i, 1:] = ua[i, 1:] * da[i - 1, 1:] + va[i, 1:] * (ds[i - 1] + da[i - 1, :-1])
    for i in range(n - 1, -1, -1):
        db[i, 1:] = ub[i, 1:] * db[i + 1, 1:] + vb[i, 1:] * (ds[i] + db[i + 1, :-1])
    d_log_n = ds + np.einsum("tjr,tjrd->trd", tab.wp, da[:n, :k] + db[1:, k - 1 :: -1])
    d_log_m = np.einsum("tjr,tjrd->trd", tab.wq, da[:n] + db[1:, ::-1])
    # p = N / (N + M): dp = p q (d log N - d log M), no cancellation against p or q
    pq = np.exp(tab.log_p + tab.log_q)[..., None]
    return pq * (d_log_n - d_log_m)


@dataclass(frozen=True)
class _Plan:
    """How each row is computed: rows with ``k > m/2`` (``m`` unmasked entries) use the
    complement identity ``p(z, k) = 1 - p(-z, m - k)`` so that the program runs with
    ``K = min(k, m - k)``; ``s`` holds the (possibly negated) rows sorted decreasingly."""

    order: NDArray[np.intp]
    s: FloatArray
    kk: NDArray[np.int64]
    flip: NDArray[np.bool_]
    finite: NDArray[np.bool_]


def _plan(z: FloatArray, k: int) -> _Plan:
    finite = np.isfinite(z)
    m = finite.sum(axis=-1)
    flip = 2 * k > m
    kk = np.where(flip, m - k, k).astype(np.int64)
    zz = np.where(flip[:, None] & finite, -z, z)
    order = np.argsort(-zz, axis=-1, kind="stable")
    return _Plan(order=order, s=np.take_along_axis(zz, order, axis=-1), kk=kk, flip=flip, finite=finite)


def _chunks(rows: NDArray[np.intp], per_row: int) -> list[NDArray[np.intp]]:
    size = max(1, _TABLE_BUDGET // max(per_row, 1))
    return [rows[i : i + size] for i in range(0, rows.size, size)]


def _unsort(values: FloatArray, order: NDArray[np.intp]) -> FloatArray:
    out = np.empty_like(values)
    np.put_along_axis(out, order, values, axis=-1)
    return out


@dataclass(frozen=True)
class _Program:
    """What each row runs: rows with ``k > m/2`` (``m`` unmasked entries) use the complement
    identity ``p(z, k) = 1 - p(-z, m - k)`` so that the program runs with ``K = min(k, m - k)``
    on ``zz`` (the possibly negated row, shifted so that its largest finite entry is 0)."""

    zz: FloatArray
    kk: NDArray[np.int64]
    flip: NDArray[np.bool_]
    finite: NDArray[np.bool_]


def _program(z: FloatArray, k: int) -> _Program:
    finite = np.isfinite(z)
    m = finite.sum(axis=-1)
    flip = 2 * k > m
    kk = np.where(flip, m - k, k).astype(np.int64)
    zz = z
    if flip.any():
        zz = z.copy()
        neg = -z[flip]
        top = np.max(neg, axis=-1, where=np.isfinite(neg), initial=-np.inf)
        zz[flip] = np.where(np.isfinite(neg), neg - top[:, None], -np.inf)
    return _Program(zz=zz, kk=kk, flip=flip, finite=finite)


def _start_tilt(zz: FloatArray, kk: int) -> FloatArray:
    """The Laplace threshold (closed form), a tilt within log 2 of the one with mean count k."""
    ref, delta, _ = _laplace_threshold(zz, kk)
    lam = ref + delta
    return np.where(np.isfinite(lam), lam, 0.0)


def _logspace_rows(zz: FloatArray, kk: int, v: FloatArray | None = None) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """``(p, q, J v)`` of rows by the log-space program on sorted rows (any spread)."""
    order = np.argsort(-zz, axis=-1, kind="stable")
    s = np.take_along_axis(zz, order, axis=-1)
    rows, n = zz.shape
    ps, qs = np.zeros((rows, n)), np.ones((rows, n))
    dps = None if v is None else np.zeros((rows, n))
    vs = None if v is None else np.take_along_axis(v, order, axis=-1)
    per_row = (n + 1) * (kk + 1) * (1 if v is None else 3)
    for idx in _chunks(np.arange(rows), per_row):
        tab = _tables(s[idx], kk)
        ps[idx] = np.exp(tab.log_p).T
        qs[idx] = np.exp(tab.log_q).T
        if dps is not None and vs is not None:
            dps[idx] = _tangent(tab, vs[idx].T[..., None])[..., 0].T
    return _unsort(ps, order), _unsort(qs, order), None if dps is None else _unsort(dps, order)


def _run(z: FloatArray, k: int, v: FloatArray | None) -> tuple[_Program, FloatArray, FloatArray, FloatArray | None]:
    """Marginals (and ``J v``) of the program each row runs (complements for flipped rows).

    The probability-space program (``_poisson``) runs first; rows it does not certify (a
    marginal within 1e-250 of 0 or 1: spreads of hundreds) are recomputed in log space.
    """
    prog = _program(z, k)
    rows, n = z.shape
    ps, qs = np.zeros((rows, n)), np.ones((rows, n))  # kk = 0: the program selects nothing
    dps = None if v is None else np.zeros((rows, n))
    try:
        for kk in np.unique(prog.kk):
            if kk == 0:
                continue
            idx = np.flatnonzero(prog.kk == kk)
            zi = prog.zz[idx]
            vi = None if v is None else v[idx]
            res = marginals(zi, int(kk), _start_tilt(zi, int(kk)), vi)
            if idx.size == rows:  # one program for every row (the usual case): no copies
                ps, qs = res.p, res.q
                dps = res.dp if dps is not None else None
            else:
                ps[idx], qs[idx] = res.p, res.q
                if dps is not None and res.dp is not None:
                    dps[idx] = res.dp
            bad = np.flatnonzero(~res.certified)
            if bad.size:
                lp, lq, ldp = _logspace_rows(zi[bad], int(kk), None if vi is None else vi[bad])
                ps[idx[bad]], qs[idx[bad]] = lp, lq
                if dps is not None and ldp is not None:
                    dps[idx[bad]] = ldp
    except MemoryError:
        raise ResourceError(
            f"grad: out of memory for {rows} row(s) of n={n} entries at k={k}; the exact program needs "
            f"O(n min(k, n-k)) floats per row (checkpointed): process fewer rows at a time"
        ) from None
    return prog, ps, qs, dps


def _grad_forward(z: FloatArray, k: int) -> Forward:
    """Exact GradTopK weights and complements of a prepared batch (see ``_base``).

    >>> z = np.log(np.array([[0.3, 0.6, 0.5, 0.2]]) / np.array([[0.7, 0.4, 0.5, 0.8]]))
    >>> _grad_forward(z - z.max(), 2).p.round(4)
    array([[0.3568, 0.7622, 0.6595, 0.2216]])
    """
    prog, ps, qs, _ = _run(z, k, None)
    return _exact_forward(prog, ps, qs)


def _exact_forward(prog: _Program, ps: FloatArray, qs: FloatArray) -> Forward:
    """The weights of the input rows from the marginals of the program each row ran."""
    p, q = ps, qs
    if prog.flip.any():
        flip = prog.flip[:, None]
        p, q = np.where(flip, qs, ps), np.where(flip, ps, qs)
    if not prog.finite.all():
        p, q = np.where(prog.finite, p, 0.0), np.where(prog.finite, q, 1.0)
    return Forward(p=p, q=q)


def _grad_forward_vjp(z: FloatArray, k: int, v: FloatArray) -> tuple[Forward, FloatArray]:
    """:func:`_grad_forward` and :func:`_grad_vjp` from one run of the program (the tangent
    sweep computes the marginals on the way)."""
    prog, ps, qs, dps = _run(z, k, np.where(np.isfinite(z), v, 0.0))
    assert dps is not None
    return _exact_forward(prog, ps, qs), np.where(prog.finite, dps, 0.0)


def _grad_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """``v^T dp/dz`` (= ``J v``: the Jacobian is symmetric) by forward mode, O(n k) per row.

    The flipped program has ``J(z, k) = J'(-z, m - k)``: the same tangent, no sign change.

    >>> z = np.array([[0.0, -1.0, -2.0]])
    >>> _grad_vjp(_grad_forward(z, 1), z, 1, np.array([[1.0, 0.0, 0.0]])).round(4)
    array([[ 0.2227, -0.1628, -0.0599]])
    """
    prog, _, _, dps = _run(z, k, np.where(np.isfinite(z), v, 0.0))
    assert dps is not None
    return np.where(prog.finite, dps, 0.0)


def _grad_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """``dp/dz``: the covariance of the subset indicators, ``(B, n, n)``, symmetric.

    ``J_il = P(i, l in S) - p_i p_l``, ``J_ii = p_i (1 - p_i)``: symmetric, PSD, zero row sums.
    Column ``l`` is the tangent along ``e_l``, whose entry ``i`` carries the error
    ``eps * p_i q_i``; entry ``(i, l)`` is taken from the column of whichever of ``i``, ``l`` has
    the smaller ``p q`` (so entries next to saturated marginals keep their tiny, correct
    values), and the diagonal is ``p_i q_i`` exactly. O(n^2 min(k, n-k)) per row.

    >>> z = np.array([[0.0, 0.0]])
    >>> _grad_jacobian(_grad_forward(z, 1), z, 1)
    array([[[ 0.25, -0.25],
            [-0.25,  0.25]]])
    """
    plan = _plan(z, k)
    rows, n = z.shape
    jac = np.zeros((rows, n, n))
    ps = np.zeros((rows, n))  # of the program run, sorted; min(p, q) and p q are flip-invariant
    qs = np.ones((rows, n))
    eye = np.eye(n)
    for kk in np.unique(plan.kk):
        if kk == 0:
            continue
        per_dir = 3 * (n + 1) * (int(kk) + 1)
        for idx in _chunks(np.flatnonzero(plan.kk == kk), per_dir * n):
            tab = _tables(plan.s[idx], int(kk))
            ps[idx] = np.exp(tab.log_p).T
            qs[idx] = np.exp(tab.log_q).T
            cols = np.empty((n, idx.size, n))  # cols[t, r, l] = dp_t / dz_l (sorted space)
            step = max(1, _TABLE_BUDGET // (per_dir * idx.size))
            for l0 in range(0, n, step):
                ds = np.broadcast_to(eye[:, None, l0 : l0 + step], (n, idx.size, min(step, n - l0)))
                cols[:, :, l0 : l0 + step] = _tangent(tab, ds)
            jac[idx] = cols.transpose(1, 0, 2)
    # symmetrise: keep the entry computed on the side with the smaller p q (its error bound)
    r = ps * qs
    ri, rl = r[:, :, None], r[:, None, :]
    upper = np.triu(np.ones((n, n), dtype=bool))
    own = (ri < rl) | ((ri == rl) & upper)
    jac = np.where(own, jac, jac.transpose(0, 2, 1))
    diag = np.arange(n)
    jac[:, diag, diag] = ps * qs
    # back to the input order on both axes; masked entries have zero rows and columns
    inv = np.argsort(plan.order, axis=-1)
    jac = np.take_along_axis(jac, inv[:, :, None], axis=1)
    jac = np.take_along_axis(jac, inv[:, None, :], axis=2)
    mask = plan.finite[:, :, None] & plan.finite[:, None, :]
    return np.where(mask, jac, 0.0)


#: GradTopK by the exact log-space dynamic program.
GRAD = Implementation(
    forward=_grad_forward, jacobian=_grad_jacobian, vjp=_grad_vjp, forward_vjp=_grad_forward_vjp
)
