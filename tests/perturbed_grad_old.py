"""A verbatim copy of ``topk_cli/operators/perturbed.py``'s VJP, Jacobian and ``dp/dk`` as they were
before they drew their samples in chunks (commit cae0eda), with the helpers they call: each held
the whole noise of a row at once. The validation, the noise, ``_BLOCK`` and the dtypes are imported,
not copied: they are not what changed. ``tests/test_perturbed_vjp_chunks.py`` checks that the
chunked code gives the same bits."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward
from topk_cli.operators.perturbed import (
    DEFAULT_SAMPLES,
    DEFAULT_SEED,
    check_perturbed_params,
    perturbation_noise,
)

_BLOCK = 1 << 22


def _row_noise(fin: np.ndarray, noise: FloatArray) -> FloatArray:
    """``(rows, pairs, n)`` noise of a block: unmasked entry ``i`` gets row ``rank(i)`` of ``noise``."""
    rank = np.cumsum(fin, axis=1) - 1
    return np.where(fin[:, None, :], np.transpose(noise[np.maximum(rank, 0)], (0, 2, 1)), 0.0)


def _mark(neg: FloatArray, k: int, out: np.ndarray) -> np.ndarray:
    """Set ``out`` (C-contiguous, all False or 0, shape of ``neg``) to 1 at the ``k`` entries of every
    ``(..., n)`` slice of ``neg`` that ``argpartition(neg, k - 1)`` puts first: ``T_k(-neg)``.

    ``neg`` is the negated perturbed score, formed as ``-z - Z`` (or ``Z - z``), which is exactly
    ``-(z + Z)`` (``-(z - Z)``): IEEE rounding is symmetric, so the selection is the one
    ``argpartition(-(z + Z))`` makes, ties included, without a negated copy.
    """
    n = neg.shape[-1]
    if k == n:  # every entry is selected, whichever order argpartition would give
        out.fill(1)
        return out
    idx = np.argpartition(neg, k - 1, axis=-1)
    rows = np.arange(0, out.size, n).reshape((*neg.shape[:-1], 1))
    if 2 * k <= n:
        out.reshape(-1)[idx[..., :k] + rows] = 1
    else:  # fewer writes: every entry, then 0 on the n - k that argpartition puts after the k-th
        out.fill(1)
        out.reshape(-1)[idx[..., k:] + rows] = 0
    return out


def _blocks(b: int, pairs: int, n: int) -> list[slice]:
    rows = max(1, _BLOCK // max(1, pairs * n))
    return [slice(s, min(b, s + rows)) for s in range(0, b, rows)]


def _selections(z: FloatArray, k: int, noise: FloatArray) -> tuple[FloatArray, np.ndarray]:
    """``(neg, sel)`` for a block of rows and its ``(rows, pairs, n)`` noise, both ``(2, rows, pairs, n)``:
    the negated scores ``-(z + Z)``, ``-(z - Z)`` (masked entries ``+inf``: their noise is 0) and
    their selections ``T_k(z + Z)``, ``T_k(z - Z)`` as 0/1 ``uint8`` (ties have probability 0 under
    the noise). The negated scores are formed exactly as ``-z - Z`` and ``Z - z``."""
    zb = z[:, None, :]
    neg = np.empty((2, *np.broadcast_shapes(zb.shape, noise.shape)))
    np.subtract(-zb, noise, out=neg[0])
    np.subtract(noise, zb, out=neg[1])
    return neg, _mark(neg, k, np.zeros(neg.shape, dtype=np.uint8))


def _is_int(k: Any) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def _real_k(k: Any, b: int) -> tuple[NDArray[np.intp], FloatArray]:
    """``(c, g)`` of a real k per row: ``c = ceil(k)`` entries are selected and the c-th gets
    ``1 - g``, ``g = c - k`` in ``[0, 1)``."""
    kv = np.broadcast_to(np.asarray(k, dtype=np.float64).reshape(-1), (b,))
    c = np.ceil(kv).astype(np.intp)
    return c, c - kv


def _selections_real(z: FloatArray, c: NDArray[np.intp], noise: FloatArray) -> tuple[FloatArray, np.ndarray,
                                                                                       np.ndarray, NDArray[np.intp]]:
    """:func:`_selections` for ``c[r]`` entries in row ``r``, with ``(neg, sel, last, pos)``: ``last``
    (0/1 ``uint8``) marks the c-th largest entry of each sample and ``pos`` (``(2, rows, pairs, 1)``) is
    its index. One ``argpartition`` of every sample at all the positions ``c - 1`` of the block."""
    zb = z[:, None, :]
    neg = np.empty((2, *np.broadcast_shapes(zb.shape, noise.shape)))
    np.subtract(-zb, noise, out=neg[0])
    np.subtract(noise, zb, out=neg[1])
    sel = np.zeros(neg.shape, dtype=np.uint8)
    last = np.zeros(neg.shape, dtype=np.uint8)
    cmax = int(c.max())
    idx = np.argpartition(neg, np.unique(c - 1), axis=-1)[..., :cmax]
    cb = c[None, :, None, None]
    np.put_along_axis(sel, idx, (np.arange(cmax) < cb).astype(np.uint8), axis=-1)
    pos = np.take_along_axis(idx, np.broadcast_to(cb - 1, (*idx.shape[:-1], 1)), axis=-1)
    np.put_along_axis(last, pos, np.uint8(1), axis=-1)
    return neg, sel, last, pos


def _real_weights(sel: np.ndarray, last: np.ndarray, g: FloatArray) -> FloatArray:
    """``T_k(z + Z)``, ``T_k(z - Z)`` of a real k as floats: ``sel - g last``."""
    return np.subtract(sel, g[None, :, None, None] * last)


def _half_difference(sel: np.ndarray) -> FloatArray:
    """``(T_k(z + Z) - T_k(z - Z)) / 2`` from :func:`_selections`: values -1/2, 0, 1/2."""
    diff = np.subtract(sel[0], sel[1], dtype=np.float64)
    diff *= 0.5
    return diff


def _centred(noise: FloatArray, fin: np.ndarray) -> FloatArray:
    """``Z - mean(Z)`` over the unmasked entries of each row, 0 on masked ones: ``(rows, pairs, n)``."""
    mask = fin[:, None, :]
    mean = noise.sum(axis=2, keepdims=True) / fin.sum(axis=1)[:, None, None]
    return np.where(mask, noise - mean, 0.0)


def _block_difference(z: FloatArray, k: Any, blk: slice, noise: FloatArray) -> FloatArray:
    """``(T_k(z + Z) - T_k(z - Z)) / 2`` of the rows ``blk`` and their noise, ``(rows, pairs, n)``."""
    if _is_int(k):
        return _half_difference(_selections(z[blk], k, noise)[1])
    c, g = _real_k(k, z.shape[0])
    _, sel, last, _ = _selections_real(z[blk], c[blk], noise)
    t = _real_weights(sel, last, g[blk])
    diff = np.subtract(t[0], t[1])
    diff *= 0.5
    return diff


def perturbed_jacobian_with_stderr(z: FloatArray, k: Any, *, samples: int = DEFAULT_SAMPLES,
                                   seed: int = DEFAULT_SEED) -> tuple[FloatArray, FloatArray]:
    """``(J, stderr)``: the integration-by-parts estimate of ``dp/dz`` and its standard error.

    ``J[b, i, j] = mean over pairs of D_i Zc_j`` with ``D = (T_k(z + Z) - T_k(z - Z)) / 2`` and
    ``Zc`` the centred noise; shapes ``(B, n, n)``. Masked entries have zero rows and columns.
    """
    samples, seed = check_perturbed_params(samples, seed)
    b, n = z.shape
    noise = perturbation_noise(n, samples, seed)
    pairs = noise.shape[1]
    fin = np.isfinite(z)
    jac = np.empty((b, n, n))
    se = np.empty((b, n, n))
    for blk in _blocks(b, pairs, n):
        nb = _row_noise(fin[blk], noise)
        diff = _block_difference(z, k, blk, nb)
        zc = _centred(nb, fin[blk])
        mean = np.einsum("rmi,rmj->rij", diff, zc) / pairs
        second = np.einsum("rmi,rmj->rij", diff * diff, zc * zc) / pairs
        jac[blk] = mean
        var = np.maximum(second - mean * mean, 0.0) * pairs / (pairs - 1)
        se[blk] = np.sqrt(var / pairs)
    return jac, se


def perturbed_vjp(fwd: Forward, z: FloatArray, k: Any, v: FloatArray, *, samples: int = DEFAULT_SAMPLES,
                  seed: int = DEFAULT_SEED) -> FloatArray:
    """``v^T dp/dz`` estimated as ``mean over pairs of (v . D) Zc`` in O(samples n) per row."""
    samples, seed = check_perturbed_params(samples, seed)
    b, n = z.shape
    noise = perturbation_noise(n, samples, seed)
    pairs = noise.shape[1]
    fin = np.isfinite(z)
    out = np.empty((b, n))
    for blk in _blocks(b, pairs, n):
        nb = _row_noise(fin[blk], noise)
        diff = _block_difference(z, k, blk, nb)
        weight = np.einsum("rmi,ri->rm", diff, v[blk])
        out[blk] = np.einsum("rm,rmj->rj", weight, _centred(nb, fin[blk])) / pairs
    return out


def perturbed_dk_with_stderr(z: FloatArray, k: Any, *, samples: int = DEFAULT_SAMPLES,
                             seed: int = DEFAULT_SEED) -> tuple[FloatArray, FloatArray]:
    """``(dp/dk, stderr)``, each ``(B, n)``: ``E[dT_k/dk]``, the frequency with which each entry is the
    ``ceil(k)``-th largest of a sample (at an integer k the k-th: the derivative from below), from the
    forward's samples (same seed, same noise). Exactly the derivative in k of the estimated ``p``
    (linear in k between integers for a fixed seed), unbiased for that of the expectation. The
    standard error is the forward's: the standard deviation of the pair observations
    ``(1[c-th of z + Z] + 1[c-th of z - Z]) / 2`` over ``sqrt(pairs)``, floored at ``1 / pairs`` on
    unmasked entries.

    >>> dk, se = perturbed_dk_with_stderr(np.array([[0.0, -1.0, -8.0]]), np.array([1.5]), samples=2000)
    >>> np.round(dk, 2), float(dk.sum())
    (array([[0.23, 0.77, 0.  ]]), 1.0)
    """
    samples, seed = check_perturbed_params(samples, seed)
    b, n = z.shape
    noise = perturbation_noise(n, samples, seed)
    pairs = noise.shape[1]
    fin = np.isfinite(z)
    c = np.full(b, k, dtype=np.intp) if _is_int(k) else _real_k(k, b)[0]
    dk = np.empty((b, n))
    se = np.empty((b, n))
    rse = np.sqrt(pairs)
    for blk in _blocks(b, pairs, n):
        fb = fin[blk]
        nb = np.ascontiguousarray(noise.T)[None] if fb.all() else _row_noise(fb, noise)
        last = _selections_real(z[blk], c[blk], nb)[2]
        obs = np.add(last[0], last[1], dtype=np.float64)
        obs *= 0.5
        dk[blk] = mean = obs.sum(axis=1) / pairs
        obs -= mean[:, None, :]
        np.square(obs, out=obs)
        std = np.sqrt(np.add.reduce(obs, axis=1) / (pairs - 1))
        se[blk] = np.where(fb, np.maximum(std / rse, 1.0 / pairs), 0.0)
    return dk, se
