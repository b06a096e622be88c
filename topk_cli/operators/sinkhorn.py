"""Entropic optimal-transport top-k (Xie et al. 2020, "SOFT top-k") by log-domain Sinkhorn.

Axis convention: every function acts on a validated ``(B, n)`` batch ``z`` (see ``_base``): the
largest finite entry of each row is 0, masked entries are ``-inf``. Each row is its own
transport problem.

The problem (per row, ``m`` unmasked entries): transport the points ``z_i`` (mass ``1/m`` each)
onto two anchors ``y = {0, 1}`` with masses ``(m - k)/m`` and ``k/m``, cost ``C_ij = (z_i - y_j)^2 / 2``,
entropic regularisation ``eps = 1``::

    Gamma = argmin_{Gamma 1 = mu, Gamma^T 1 = nu}  <C, Gamma> - H(Gamma)

and output ``p_i = m * Gamma_{i, upper}``. The row term ``z_i^2 / 2`` of the cost changes no plan
(the row potential absorbs it), so the reduced cost ``C_i0 = 0, C_i1 = 1/2 - z_i`` is used: the
same iterates in exact arithmetic, without the cancellation of large squares.

Relation to ``thre-sigmoid``: the optimal plan satisfies ``Gamma_i1 / Gamma_i0 = e^{z_i - lambda}``
for one scalar ``lambda``, so at convergence ``p = sigmoid(z - lambda)`` with ``sum p = k``: exactly
``thre-sigmoid`` at the same temperature. Xie et al. divide the squared cost
``(x_i - y_j)^2`` by its maximum ``M`` over the batch and use ``eps`` on that scale; their map is
therefore ``thre-sigmoid`` at ``tau = eps * M / 2`` (and depends on the other rows of the batch
through ``M``). Their reference code puts mass ``k/n`` at anchor 0 and returns that column, which
selects the k *smallest* scores; this is the same construction applied to the largest.
Sinkhorn is a slow fixed-point solver for that one scalar: its contraction factor approaches 1
as the selection hardens (small tau), which is what this method shows.

Iteration (as in the authors' ``sinkhorn_forward_stablized``): start from ``g = 0``; repeat
``f = log mu - LSE_j(g_j - C_ij)`` then ``g = log nu - LSE_i(f_i - C_ij)``. Both updates have a
closed form in the one scalar ``lambda = 1/2 + g_0 - g_1``: with ``t_i = z_i - lambda``,
``s_i = sigmoid(t_i)`` and ``r_i = sigmoid(-t_i)``, the row update is
``f_i = log mu - g_0 + log r_i``, and the column update that follows is ``g_0 += log((m - k) / R)``,
``g_1 += log(k / S)`` with ``S = sum_i s_i``, ``R = sum_i r_i``, i.e.
``lambda += log1p(alpha) - log1p(beta)``, ``alpha = (m - k - R) / R``, ``beta = (k - S) / S``.
These are the same iterates as the log-sum-exp form in exact arithmetic, computed with one ``exp``
per entry and iteration (``s`` and ``r`` both from ``e^{-|t|}``, no ``1 - x``) instead of two
log-sum-exps, a ``logaddexp`` and an ``expm1`` over the row. After each column update
``p = (1 + beta) s`` (``sum p = k`` up to rounding) and ``m`` times row ``i``'s mass is
``(1 + alpha) r_i + (1 + beta) s_i``, so the marginal error ``max_i |alpha r_i + beta s_i|`` is
known for free: it is affine in ``s_i`` (``r_i = 1 - s_i``), hence largest at the largest or the
smallest score. A row stops when it is ``<= tol``; a row still above after ``max_iter`` iterations
gets the failure code ``no-convergence`` (never a silent value). ``q = 1 - p = r - beta s``,
without cancellation. (Measured against 50-digit iterates, this marginal error decides the
stopping iteration better than ``expm1(f - f')`` of the log-sum-exp form, whose rounding grows
with ``|f|``.)

Jacobian: the implicit derivative of the converged plan at the returned point (what the
authors' backward pass computes): the threshold form with ``d_i = p_i (1 - p_i)``, i.e. the
derivative of the limit map, not of the truncated iteration.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import OK, FloatArray, Forward, Implementation
from topk_cli.operators._logspace import exp_into
from topk_cli.operators.threshold import threshold_jacobian, threshold_vjp

#: Default iteration cap: the authors' ``max_iter`` default.
DEFAULT_MAX_ITER = 200

#: Default tolerance on the row-marginal error ``max_i |m * rowmass_i - 1|``.
DEFAULT_TOL = 1e-13

#: Failure code of a row whose marginal error is still above ``tol`` after ``max_iter`` iterations.
NO_CONVERGENCE = "no-convergence"


def check_sinkhorn_params(max_iter: object, tol: object) -> tuple[int, float]:
    """Validate ``max_iter`` (an integer >= 1) and ``tol`` (a finite number > 0)."""
    if isinstance(max_iter, (bool, np.bool_)) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise InvalidArgumentError(f"max-iter must be an integer >= 1, got {max_iter!r}")
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"tol must be a finite number > 0, got {tol!r}")
    if not (np.isfinite(float(tol)) and float(tol) > 0):
        raise InvalidArgumentError(f"tol must be a finite number > 0, got {tol!r}")
    return int(max_iter), float(tol)


def _sigmoid_pair(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sigmoid(t), sigmoid(-t))``, each to a few ulps (no ``1 - x``), from one ``exp`` per
    entry; ``t`` is overwritten."""
    pos = t >= 0
    e = exp_into(np.copysign(t, -1.0, out=t), t)  # e^{-|t|}; t = -inf (masked): e = 0
    d = np.add(e, 1.0)
    u = np.divide(1.0, d)
    v = np.divide(e, d, out=e)
    return np.where(pos, u, v), np.where(pos, v, u)


def ot_sinkhorn_forward(z: FloatArray, k: Any, *, max_iter: int = DEFAULT_MAX_ITER,
                        tol: float = DEFAULT_TOL) -> Forward:
    """SOFT top-k weights ``p = m * Gamma[:, upper]`` by log-domain Sinkhorn, per-row convergence.

    ``k``: an ``int`` for every row, or a ``(B,)`` float array with one real ``k`` per row
    (``0 < k <= m``: the anchors' masses ``(m - k)/m`` and ``k/m``; an integer value gives bitwise
    the ``int`` result).
    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q (B, n)``; ``code`` (``"ok"`` or
    ``"no-convergence"``), ``value`` (the final marginal error of failed rows);
    ``aux["lambda"]`` (the sigmoid threshold implied by the potentials), ``aux["d"]``,
    ``aux["iterations"]`` and ``aux["marginal_error"]`` per row.

    >>> fwd = ot_sinkhorn_forward(np.array([[0.0, -1.0, -2.0]]), 1)
    >>> np.round(fwd.p, 4), fwd.codes()
    (array([[0.5491, 0.3094, 0.1415]]), array(['ok'], dtype='<U16'))
    """
    max_iter, tol = check_sinkhorn_params(max_iter, tol)
    b = z.shape[0]
    fin = np.isfinite(z)
    m = fin.sum(axis=1).astype(np.float64)
    if not isinstance(k, (int, np.integer)):  # one real k per row: sliced with the rows below
        k = np.broadcast_to(np.asarray(k, dtype=np.float64).reshape(-1), (b,))
    sat = m == k  # every unmasked entry selected: p = 1 exactly, nothing to iterate
    p = np.where(fin, 1.0, 0.0)  # saturated rows keep these; the others are overwritten
    q = np.where(fin, 0.0, 1.0)
    lam = np.where(sat, -np.inf, 0.5)  # g0 = g1 = 0
    err = np.where(sat, 0.0, np.inf)
    iters = np.zeros(b)
    rows = np.flatnonzero(~sat)
    za, la, masked = z[rows], lam[rows], ~fin[rows]
    has_mask = bool(masked.any())
    unselected = (m - k)[rows]
    kr = k[rows] if isinstance(k, np.ndarray) else k  # the column mass of each remaining row
    # the marginal error is affine in s_i (r_i = 1 - s_i), so its maximum over a row is at the
    # largest or the smallest unmasked score
    ends = np.stack([np.argmax(za, axis=-1), np.argmin(np.where(masked, np.inf, za), axis=-1)], axis=-1)
    at = np.arange(rows.size)[:, None]  # with ends: the two entries of each row (fancy indexing, cheaper per
    # iteration than take_along_axis on the one-row batches the property checks make)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a row that breaks down is no-convergence
        for it in range(1, max_iter + 1):
            if rows.size == 0:
                break
            s, r = _sigmoid_pair(np.subtract(za, la[:, None]))  # the plan of the current g, per unit row mass
            if has_mask:
                np.copyto(r, 0.0, where=masked)  # s is already 0 there
            big_s, big_r = s.sum(axis=-1), r.sum(axis=-1)
            alpha = (unselected - big_r) / big_r  # the column updates scale the columns by 1 + alpha, 1 + beta
            beta = (kr - big_s) / big_s
            # m * row mass - 1 after the column updates: (1 + alpha) r_i + (1 + beta) s_i - 1
            s_end, r_end = s[at, ends], r[at, ends]
            e = np.abs(alpha[:, None] * r_end + beta[:, None] * s_end).max(axis=-1)
            la = la + np.log1p(alpha) - np.log1p(beta)
            stop = (e <= tol) if it < max_iter else np.ones(rows.size, dtype=bool)
            if stop.any():
                out = rows[stop]
                p[out] = s[stop] + beta[stop, None] * s[stop]  # the columns: sum p = k
                q[out] = r[stop] - beta[stop, None] * s[stop]  # 1 - p, without cancellation
                lam[out], err[out], iters[out] = la[stop], e[stop], it
                go = ~stop
                rows, za, la, masked, unselected, ends = rows[go], za[go], la[go], masked[go], unselected[go], ends[go]
                if isinstance(kr, np.ndarray):
                    kr = kr[go]
                at = at[: rows.size]
                has_mask = has_mask and bool(masked.any())
    p = np.where(fin, p, 0.0)
    q = np.where(fin, q, 1.0)
    d = np.where(fin & ~sat[:, None], p * q, 0.0)
    code = np.full(b, OK, dtype="<U16")
    value = np.full(b, np.nan)
    messages: dict[int, str] = {}
    failed = np.flatnonzero(~(err <= tol))
    code[failed] = NO_CONVERGENCE
    value[failed] = err[failed]
    for r_ in failed:
        messages[int(r_)] = (
            f"Sinkhorn did not converge: marginal error {err[r_]:.3g} > tol={tol:g} after max-iter={max_iter} "
            "iterations (the selection is too hard for this cap: raise max-iter or tau)"
        )
    return Forward(
        p=p, q=q, code=code, value=value, messages=messages,
        aux={"lambda": lam, "d": d, "iterations": iters, "marginal_error": err},
    )


def ot_sinkhorn_dk(fwd: Forward, z: FloatArray, k: Any) -> FloatArray:
    """``dp/dk`` of the converged plan, ``(B, n)``: the implicit derivative of the fixed point with
    respect to the column mass ``k/m``.

    At the fixed point ``p_i = sigmoid(z_i - lambda)`` with ``sum p = k``, so ``dlambda/dk = -1 / sum d``
    and ``dp_i/dk = d_i / sum_j d_j``, ``d_i = p_i (1 - p_i)`` (it sums to 1). Computed as a softmax of
    ``log d_i = -|t_i| - 2 log1p(e^{-|t_i|})``, ``t_i = z_i - lambda`` (``aux["lambda"]``), so it stays
    defined where every ``d_i`` underflows (a hard selection: the mass goes to the entries at the
    threshold). On a row with ``k = m`` (every entry selected, ``lambda = -inf``) it is the derivative
    from below, the limit ``k -> m``: ``d_i`` is proportional to ``e^{-z_i}`` there.

    >>> z = np.array([[0.0, -1.0, -2.0]])
    >>> np.round(ot_sinkhorn_dk(ot_sinkhorn_forward(z, 1), z, 1), 4)
    array([[0.4249, 0.3667, 0.2085]])
    """
    lam = fwd.aux["lambda"][:, None]
    fin = np.isfinite(z)
    with np.errstate(invalid="ignore"):  # masked entries and saturated rows: replaced below
        a = -np.abs(z - lam)
        log_d = a - 2.0 * np.log1p(np.exp(np.where(fin, a, 0.0)))
    log_d = np.where(np.isfinite(lam), log_d, -z)  # k = m: d_i ~ e^{lambda - z_i}, lambda -> -inf
    log_d = np.where(fin, log_d, -np.inf)
    w = np.exp(log_d - log_d.max(axis=1, keepdims=True))
    return np.divide(w, w.sum(axis=1, keepdims=True))


#: ``max_iter`` and ``tol`` reach the forward as keyword arguments; the Jacobian and VJP are those
#: of the converged map at the returned point (for a real k as for an integer one: ``k`` enters
#: only through ``lambda``); so is ``dp/dk``.
OT_SINKHORN = Implementation(
    forward=ot_sinkhorn_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True,
    row_k=True, dk=ot_sinkhorn_dk,
)
