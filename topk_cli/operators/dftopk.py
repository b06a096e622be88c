"""``dftopk``: DFTopK (Zhu et al., 2025), a sigmoid around the midpoint of the k-th and (k+1)-th scores.

"Differentiable fast top-k selection for large-scale recommendation" (DFTopK): ``p_i =
sigmoid((x_i - m) / tau)`` with ``m`` the midpoint of the k-th and (k+1)-th largest scores, one
selection (``O(n)``) and no normalisation. The authors' code (zhangzhen97/DFTOPK,
``tensorflow_based/op/DFTopK.py``) computes exactly this: ``tf.nn.top_k(x, k + 1)``, the threshold
``(x_k + x_{k+1}) / 2``, ``sigmoid((x - threshold) / tau)``. At ``k = n`` (no (k+1)-th score; the
authors' code needs ``k < n``) the (k+1)-th score is taken as ``-inf``: every weight is 1, the
hard top-n. Masked entries (``-inf``) are never the k-th or (k+1)-th score (``k`` counts the
unmasked ones) and get weight 0.

Properties: shift-invariant (``m`` moves with the scores), in ``(0, 1)``, strictly increasing in
its own score, but ``sum p`` is not k (the sigmoids are not normalised). ``m`` is a continuous,
piecewise-linear function of the scores: the map is continuous with kinks where the k-th or
(k+1)-th entry changes. ``q = 1 - p = sigmoid((m - x_i) / tau)`` exactly.

Jacobian: ``dp_i/dz_j = s_i (delta_ij - [j = k-th] / 2 - [j = (k+1)-th] / 2)`` with ``s = p (1 - p)``:
the diagonal plus the two columns of the k-th and (k+1)-th entries (through ``m``). At a tie of
the k-th or (k+1)-th score no derivative exists; the positions ``np.argpartition`` picks are used.
"""

from __future__ import annotations

import numpy as np

from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.references import BoolArray, ReferenceContext


def _midpoint(z: FloatArray, k: int) -> tuple[FloatArray, np.ndarray, np.ndarray]:
    """``(m, i_k, i_k1)``: the midpoint per row and the positions of the k-th and (k+1)-th largest
    (``i_k1 = -1`` where there is no (k+1)-th unmasked entry)."""
    bsz, n = z.shape
    rows = np.arange(bsz)
    if k < n:  # one selection (O(n)): positions k - 1 and k of the descending order
        part = np.argpartition(-z, (k - 1, k), axis=1)
        i_k, i_k1 = part[:, k - 1], part[:, k].copy()
        s_k1 = z[rows, i_k1]
    else:
        i_k = np.argmin(z, axis=1)
        i_k1 = np.full(bsz, -1)
        s_k1 = np.full(bsz, -np.inf)
    s_k = z[rows, i_k]
    i_k1[~np.isfinite(s_k1)] = -1
    m = 0.5 * s_k + 0.5 * s_k1  # halving is exact: no overflow at z near -max float
    return m, i_k, i_k1


def _sigmoids(t: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sigmoid(t), sigmoid(-t))`` from one ``exp(-|t|)``, each to full relative precision."""
    with np.errstate(under="ignore", invalid="ignore"):
        e = np.exp(-np.abs(t))
    small = e / (1.0 + e)
    large = 1.0 / (1.0 + e)
    pos = t >= 0
    return np.where(pos, large, small), np.where(pos, small, large)


def dftopk_forward(z: FloatArray, k: int) -> Forward:
    """``p = sigmoid(z - m)``, ``q = sigmoid(m - z)``.

    >>> np.round(dftopk_forward(np.array([[0.0, -1.0, -2.0]]), 1).p, 4)
    array([[0.6225, 0.3775, 0.1824]])
    """
    m, _, _ = _midpoint(z, k)
    fin = np.isfinite(z)
    with np.errstate(invalid="ignore"):
        d = np.where(fin, z - m[:, None], -np.inf)  # m = -inf at k = n: d = +inf on finite entries
    p, q = _sigmoids(d)
    return Forward(p=p, q=q)


def _parts(fwd: Forward, z: FloatArray, k: int) -> tuple[FloatArray, np.ndarray, np.ndarray]:
    _, i_k, i_k1 = _midpoint(z, k)
    return fwd.p * fwd.q, i_k, i_k1


def dftopk_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """``diag(s) - s (e_k + e_{k+1})^T / 2``, ``s = p q``."""
    s, i_k, i_k1 = _parts(fwd, z, k)
    bsz, n = z.shape
    rows = np.arange(bsz)
    jac = np.zeros((bsz, n, n))
    idx = np.arange(n)
    jac[:, idx, idx] = s
    jac[rows, :, i_k] -= 0.5 * s
    has = i_k1 >= 0
    jac[rows[has], :, i_k1[has]] -= 0.5 * s[has]
    return jac


def dftopk_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """``v^T J = v s - (v . s) (e_k + e_{k+1}) / 2``, ``O(n)`` per row."""
    s, i_k, i_k1 = _parts(fwd, z, k)
    rows = np.arange(z.shape[0])
    out = v * s
    half = 0.5 * (v * s).sum(axis=1)
    out[rows, i_k] -= half
    has = i_k1 >= 0
    out[rows[has], i_k1[has]] -= half[has]
    return out


def dftopk_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The definition by a full sort, the sigmoid in extended precision (every row trusted)."""
    srt = -np.sort(-z, axis=1)
    s_k = srt[:, k - 1].astype(np.longdouble)
    s_k1 = srt[:, k].astype(np.longdouble) if k < z.shape[1] else np.full(z.shape[0], -np.inf, dtype=np.longdouble)
    m = (s_k + s_k1) / 2
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.where(np.isfinite(z), z.astype(np.longdouble) - m[:, None], -np.inf)
        p = 1 / (1 + np.exp(-d))
    return p.astype(np.float64), np.ones(z.shape[0], dtype=bool)


DFTOPK = Implementation(forward=dftopk_forward, jacobian=dftopk_jacobian, vjp=dftopk_vjp, elementwise=True)
