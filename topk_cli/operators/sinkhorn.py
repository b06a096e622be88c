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
``f = log mu - LSE_j(g_j - C_ij)`` then ``g = log nu - LSE_i(f_i - C_ij)``. After each ``g`` update
the columns are exact (``sum p = k`` up to rounding) and the row masses are
``mu_i exp(f_i - f'_i)`` with ``f'`` the next row update, so the marginal error
``max_i |exp(f_i - f'_i) - 1|`` is known for free. A row stops when it is ``<= tol``; a row still
above after ``max_iter`` iterations gets the failure code ``no-convergence`` (never a silent
value). ``q = 1 - p`` is ``m Gamma_i0`` corrected by the row error.

Jacobian: the implicit derivative of the converged plan at the returned point (what the
authors' backward pass computes): the threshold form with ``d_i = p_i (1 - p_i)``, i.e. the
derivative of the limit map, not of the truncated iteration.
"""

from __future__ import annotations

import numpy as np

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import OK, FloatArray, Forward, Implementation
from topk_cli.operators._logspace import logsumexp
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


def _row_update(log_mu: FloatArray, c1: FloatArray, g0: FloatArray, g1: FloatArray) -> FloatArray:
    """``f_i = log mu - log(e^{g0} + e^{g1 - c1_i})``; ``-inf`` on masked entries (``c1 = +inf``)."""
    f = log_mu[:, None] - np.logaddexp(g0[:, None], g1[:, None] - c1)
    return np.where(np.isfinite(c1), f, -np.inf)


def ot_sinkhorn_forward(z: FloatArray, k: int, *, max_iter: int = DEFAULT_MAX_ITER,
                        tol: float = DEFAULT_TOL) -> Forward:
    """SOFT top-k weights ``p = m * Gamma[:, upper]`` by log-domain Sinkhorn, per-row convergence.

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
    sat = m == k  # every unmasked entry selected: p = 1 exactly, nothing to iterate
    with np.errstate(divide="ignore"):  # log 0 for saturated rows, which are not iterated
        log_mu = -np.log(m)
        log_nu0 = np.log(m - k) - np.log(m)
        log_nu1 = np.log(float(k)) - np.log(m)
    c1 = np.where(fin, 0.5 - z, np.inf)
    g0 = np.zeros(b)
    g1 = np.zeros(b)
    f = _row_update(log_mu, c1, g0, g1)
    f_next = f.copy()
    err = np.full(b, np.inf)
    iters = np.zeros(b)
    active = np.flatnonzero(~sat)
    err[sat] = 0.0
    for it in range(1, max_iter + 1):
        if active.size == 0:
            break
        fa, c1a = f[active], c1[active]
        g0[active] = log_nu0[active] - logsumexp(fa)
        g1[active] = log_nu1[active] - logsumexp(fa - c1a)
        fn = _row_update(log_mu[active], c1a, g0[active], g1[active])
        with np.errstate(invalid="ignore"):  # masked entries: -inf - -inf
            e = np.where(np.isfinite(fa), np.abs(np.expm1(fa - fn)), 0.0).max(axis=1)
        err[active] = e
        iters[active] = it
        f_next[active] = fn
        done = e <= tol
        keep = active[~done]
        if it < max_iter:  # converged rows (and the last iteration) keep the f matching g
            f[keep] = fn[~done]
        active = keep
    with np.errstate(under="ignore", invalid="ignore"):  # far entries: weights underflow to 0
        p = m[:, None] * np.exp(f + g1[:, None] - c1)
        gamma0 = m[:, None] * np.exp(f + g0[:, None])
        q = gamma0 - np.expm1(f - f_next)  # 1 - p = m Gamma_i0 + (1 - m * rowmass_i)
    p = np.where(fin, p, 0.0)
    q = np.where(fin, q, 1.0)
    p[sat] = np.where(fin[sat], 1.0, 0.0)
    q[sat] = np.where(fin[sat], 0.0, 1.0)
    d = np.where(fin, p * q, 0.0)
    d[sat] = 0.0
    code = np.full(b, OK, dtype="<U16")
    value = np.full(b, np.nan)
    messages: dict[int, str] = {}
    failed = np.flatnonzero(err > tol)
    code[failed] = NO_CONVERGENCE
    value[failed] = err[failed]
    for r in failed:
        messages[int(r)] = (
            f"Sinkhorn did not converge: marginal error {err[r]:.3g} > tol={tol:g} after max-iter={max_iter} "
            "iterations (the selection is too hard for this cap: raise max-iter or tau)"
        )
    lam = np.where(sat, -np.inf, 0.5 + g0 - g1)
    return Forward(
        p=p, q=q, code=code, value=value, messages=messages,
        aux={"lambda": lam, "d": d, "iterations": iters, "marginal_error": err},
    )


#: ``max_iter`` and ``tol`` reach the forward as keyword arguments; the Jacobian and VJP are those
#: of the converged map at the returned point.
OT_SINKHORN = Implementation(
    forward=ot_sinkhorn_forward, jacobian=threshold_jacobian, vjp=threshold_vjp, elementwise=True
)
