"""A verbatim copy of ``topk_cli/operators/perturbed.py``'s estimator as it was before its passes
were cut (commit 1e86f8d): ``_row_noise``, ``_hard``, ``_blocks``, ``_pairs``, ``_centred`` and the
forward, Jacobian and VJP. The validation and the noise are imported, not copied: they are not what
changed. ``tests/test_perturbed_bits.py`` checks that the current code gives the same bits."""

from __future__ import annotations

import numpy as np

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


def _hard(w: FloatArray, k: int) -> FloatArray:
    """``T_k`` of every ``(..., n)`` slice of ``w`` (ties have probability 0 under the noise)."""
    out = np.zeros(w.shape)
    idx = np.argpartition(-w, k - 1, axis=-1)[..., :k]
    np.put_along_axis(out, idx, 1.0, axis=-1)
    return out


def _blocks(b: int, pairs: int, n: int) -> list[slice]:
    rows = max(1, _BLOCK // max(1, pairs * n))
    return [slice(s, min(b, s + rows)) for s in range(0, b, rows)]


def _pairs(z: FloatArray, k: int, noise: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(T_k(z + Z), T_k(z - Z))`` for a block of rows and its ``(rows, pairs, n)`` noise."""
    plus = _hard(z[:, None, :] + noise, k)  # masked entries stay -inf (their noise is 0)
    minus = _hard(z[:, None, :] - noise, k)
    return plus, minus


def perturbed_forward(z: FloatArray, k: int, *, samples: int = DEFAULT_SAMPLES,
                      seed: int = DEFAULT_SEED) -> Forward:
    """Monte Carlo ``p = E[T_k(z + Z)]`` with antithetic pairs and common random numbers.

    Shapes: ``z (B, n)`` -> ``Forward`` with ``p, q = 1 - p (B, n)`` and ``aux["stderr"] (B, n)``,
    the standard error of each weight. Where every pair agrees on a finite entry the sample
    variance is 0 but the estimate is not exact (a weight of 1e-4 is seen in no pair of 500 most
    of the time), so it is floored at ``1 / pairs``, the resolution of the estimate, which covers
    the 95% rule-of-three bound ``3 / pairs`` within the four standard errors checks allow; masked
    entries (-inf) have weight exactly 0 and standard error 0.

    >>> fwd = perturbed_forward(np.array([[0.0, -1.0, -8.0]]), 1, samples=2000, seed=0)
    >>> np.round(fwd.p, 2), bool(np.all(fwd.aux["stderr"] < 0.02))
    (array([[0.77, 0.23, 0.  ]]), True)
    """
    samples, seed = check_perturbed_params(samples, seed)
    b, n = z.shape
    noise = perturbation_noise(n, samples, seed)
    pairs = noise.shape[1]
    fin_all = np.isfinite(z)
    p = np.empty((b, n))
    q = np.empty((b, n))
    se = np.empty((b, n))
    potential = np.empty(b)
    for blk in _blocks(b, pairs, n):
        zb = z[blk]
        nb = _row_noise(fin_all[blk], noise)
        plus, minus = _pairs(zb, k, nb)
        obs = 0.5 * (plus + minus)  # one independent observation per pair, values 0, 1/2, 1
        p[blk] = obs.mean(axis=1)
        q[blk] = (1.0 - obs).mean(axis=1)
        se[blk] = np.where(fin_all[blk], np.maximum(obs.std(axis=1, ddof=1) / np.sqrt(pairs), 1.0 / pairs), 0.0)
        # E[sum of the k largest entries of z + Z]: its gradient is E[T_k(z + Z)] sample by sample
        fin = np.isfinite(zb)[:, None, :]
        zf = np.where(fin, zb[:, None, :], 0.0)
        top_plus = np.where(plus > 0, zf + nb, 0.0).sum(axis=2)
        top_minus = np.where(minus > 0, zf - nb, 0.0).sum(axis=2)
        potential[blk] = 0.5 * (top_plus + top_minus).mean(axis=1)
    return Forward(p=p, q=q, aux={"stderr": se, "potential": potential})


def _centred(noise: FloatArray, fin: np.ndarray) -> FloatArray:
    """``Z - mean(Z)`` over the unmasked entries of each row, 0 on masked ones: ``(rows, pairs, n)``."""
    mask = fin[:, None, :]
    mean = noise.sum(axis=2, keepdims=True) / fin.sum(axis=1)[:, None, None]
    return np.where(mask, noise - mean, 0.0)


def perturbed_jacobian_with_stderr(z: FloatArray, k: int, *, samples: int = DEFAULT_SAMPLES,
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
        plus, minus = _pairs(z[blk], k, nb)
        diff = 0.5 * (plus - minus)
        zc = _centred(nb, fin[blk])
        mean = np.einsum("rmi,rmj->rij", diff, zc) / pairs
        second = np.einsum("rmi,rmj->rij", diff * diff, zc * zc) / pairs
        jac[blk] = mean
        var = np.maximum(second - mean * mean, 0.0) * pairs / (pairs - 1)
        se[blk] = np.sqrt(var / pairs)
    return jac, se


def perturbed_jacobian(fwd: Forward, z: FloatArray, k: int, *, samples: int = DEFAULT_SAMPLES,
                       seed: int = DEFAULT_SEED) -> FloatArray:
    """The integration-by-parts estimate of ``dp/dz`` (see :func:`perturbed_jacobian_with_stderr`)."""
    return perturbed_jacobian_with_stderr(z, k, samples=samples, seed=seed)[0]


def perturbed_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray, *, samples: int = DEFAULT_SAMPLES,
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
        plus, minus = _pairs(z[blk], k, nb)
        weight = np.einsum("rmi,ri->rm", 0.5 * (plus - minus), v[blk])
        out[blk] = np.einsum("rm,rmj->rj", weight, _centred(nb, fin[blk])) / pairs
    return out


