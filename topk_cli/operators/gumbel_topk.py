"""``gumbel-topk``: the relaxed subset of Xie & Ermon (2019), k rounds of softmax.

Xie & Ermon, "Reparameterizable subset sampling via continuous relaxations" (IJCAI 2019),
relax the k draws of weighted sampling without replacement: with keys ``w`` (log-weights, plus
Gumbel noise when sampling), round ``j`` takes ``a_j = softmax(w)`` and then lowers every key by
``log(1 - a_j)``, so that what round ``j`` selected counts less in the next one; the result is
``p = sum_j a_j``. Here the keys are ``z = (x - max x) / tau`` (the public API passes only ``z``,
and every method's weights are a function of ``z`` alone): this is the article's relaxation
with log-weights ``x / tau`` and relaxation temperature 1. The article divides the masked keys
``x + sum log(1 - a)`` by its temperature ``t``, a different map of ``(x, t)`` unless ``t = 1``.

Clamp: ``log(1 - a)`` is ``log(max(1 - a, tiny))`` with ``tiny`` the smallest normal float64
(``2.2e-308``), as public implementations clip ``1 - a`` at a floor (the float32 ``tiny``) before
the log; where the clamp acts its derivative is 0 (the clip's). ``1 - a`` is computed without
cancellation: ``1 - a_i`` for the entries whose ``a_i <= 1/2`` (every one but the largest), and
the sum of the other exponentials over the total for the largest.

Noise (``noise=1``): Gumbel keys ``G`` are added to ``z`` once (``x / tau + G``), ``samples``
draws from ``seed``, tied to the rank of the entry among the unmasked ones of its row (masking an
entry is removing it) and shared by every row (common random numbers, as ``perturbed``). ``p`` is
the mean of the relaxed subsets, ``aux["stderr"]`` the standard error of each weight; the
derivatives are the pathwise ones (the mean of the samples' exact derivatives).

Derivatives: exact, by reverse mode through the k rounds (the VJP, ``O(k n)`` per row, with the
exclusive sum for the largest entry); the Jacobian is the VJP of every row of the identity.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray, Forward, Implementation
from topk_cli.operators._by_vjp import jacobian_from_vjp
from topk_cli.references import BoolArray, ReferenceContext

#: Floor of ``1 - a`` before its log (the smallest normal float64).
FLOOR = float(np.finfo(np.float64).tiny)
DEFAULT_SAMPLES = 100
DEFAULT_SEED = 0


def _rounds(w0: FloatArray, k: int) -> tuple[FloatArray, FloatArray]:
    """``(a, c)``, each ``(B, k, n)``: the softmax of every round and its accurate complement."""
    bsz, n = w0.shape
    rows = np.arange(bsz)
    a_all = np.empty((bsz, k, n))
    c_all = np.empty((bsz, k, n))
    w = w0.copy()
    for j in range(k):
        top = np.argmax(w, axis=1)
        with np.errstate(under="ignore", invalid="ignore"):
            e = np.exp(w - w[rows, top][:, None])  # masked: exp(-inf) = 0; the largest: 1
        e[rows, top] = 0.0
        rest = e.sum(axis=1)
        e[rows, top] = 1.0
        total = 1.0 + rest
        a = e / total[:, None]
        c = 1.0 - a  # exact to rounding: a <= 1/2 off the largest entry
        c[rows, top] = rest / total
        a_all[:, j], c_all[:, j] = a, c
        if j < k - 1:
            w = w + np.log(np.maximum(c, FLOOR))  # masked: -inf + log 1 stays -inf
    return a_all, c_all


def _weights(a_all: FloatArray, c_all: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``p = sum_j a_j`` and ``q = 1 - p`` as ``(1 - a_j*) - sum_{j != j*} a_j``, ``j*`` the round
    with the largest ``a`` of the entry (no cancellation of a ``1 - a`` near 0)."""
    p = a_all.sum(axis=1)
    star = np.argmax(a_all, axis=1)[:, None, :]
    a_star = np.take_along_axis(a_all, star, axis=1)[:, 0]
    c_star = np.take_along_axis(c_all, star, axis=1)[:, 0]
    q = c_star - (p - a_star)
    return p, q


def _vjp_rounds(a_all: FloatArray, c_all: FloatArray, v: FloatArray) -> FloatArray:
    """``V dp/dw0`` for ``V (B, C, n)`` by reverse mode through the rounds."""
    bsz, k, n = a_all.shape
    rows = np.arange(bsz)
    gw = np.zeros(v.shape)
    for j in range(k - 1, -1, -1):
        a = a_all[:, j][:, None, :]
        out = gw + a * (v - (a * v).sum(axis=-1, keepdims=True))  # identity path + softmax VJP of v
        if j < k - 1:
            c = c_all[:, j]
            free = (c > FLOOR)[:, None, :]
            g = np.where(free, gw, 0.0)  # the gradient reaching log(1 - a_j)
            r = g / c[:, None, :]
            # sum_{i != m} g_i / c_i: by subtraction except for the largest entry (small c), summed directly
            excl = r.sum(axis=-1, keepdims=True) - r
            top = np.argmax(a_all[:, j], axis=1)
            r_top = r[rows, :, top].copy()
            r[rows, :, top] = 0.0
            excl[rows, :, top] = r.sum(axis=-1)
            r[rows, :, top] = r_top
            out += a * (excl - g.sum(axis=-1, keepdims=True))
        gw = out
    return gw


def _check_noise(noise: Any, samples: Any, seed: Any) -> tuple[bool, int, int]:
    if noise not in (0, 1):
        raise InvalidArgumentError(f"noise of method 'gumbel-topk' must be 0 or 1, got {noise!r}")
    return bool(noise), int(samples), int(seed)


def gumbel_noise(z: FloatArray, samples: int, seed: int) -> FloatArray:
    """``(B, S, n)`` standard Gumbel keys: draw ``j`` of the ``r``-th unmasked entry of a row is the
    same in every row (and 0 on masked entries)."""
    bsz, n = z.shape
    g = -np.log(-np.log(np.random.default_rng(seed).uniform(size=(samples, n))))
    fin = np.isfinite(z)
    rank = np.cumsum(fin, axis=1) - 1
    out = np.where(fin[:, None, :], g[:, np.maximum(rank, 0)].transpose(1, 0, 2), 0.0)
    return out


def _noisy_rounds(z: FloatArray, k: int, samples: int, seed: int) -> tuple[FloatArray, FloatArray]:
    bsz, n = z.shape
    keys = (z[:, None, :] + gumbel_noise(z, samples, seed)).reshape(bsz * samples, n)
    return _rounds(keys, k)


def gumbel_topk_forward(z: FloatArray, k: int, *, noise: int = 0, samples: int = DEFAULT_SAMPLES,
                        seed: int = DEFAULT_SEED) -> Forward:
    """``p = sum_j a_j`` (see the module docstring); with noise, the mean over the samples.

    >>> np.round(gumbel_topk_forward(np.array([[0.0, -1.0, -2.0]]), 1).p, 4)  # k = 1: softmax
    array([[0.6652, 0.2447, 0.09  ]])
    """
    on, samples, seed = _check_noise(noise, samples, seed)
    if not on:
        a_all, c_all = _rounds(z, k)
        p, q = _weights(a_all, c_all)
        return Forward(p=p, q=q)
    bsz, n = z.shape
    a_all, c_all = _noisy_rounds(z, k, samples, seed)
    ps, qs = (w.reshape(bsz, samples, n) for w in _weights(a_all, c_all))
    se = ps.std(axis=1, ddof=1) / np.sqrt(samples) if samples > 1 else np.full((bsz, n), np.inf)
    return Forward(p=ps.mean(axis=1), q=qs.mean(axis=1), aux={"stderr": se})


def _vjp_many(z: FloatArray, k: int, v: FloatArray, noise: int, samples: int, seed: int) -> FloatArray:
    on, samples, seed = _check_noise(noise, samples, seed)
    if not on:
        a_all, c_all = _rounds(z, k)
        return _vjp_rounds(a_all, c_all, v)
    bsz, n = z.shape
    a_all, c_all = _noisy_rounds(z, k, samples, seed)
    vv = np.repeat(v, samples, axis=0)
    return _vjp_rounds(a_all, c_all, vv).reshape(bsz, samples, *v.shape[1:]).mean(axis=1)


def gumbel_topk_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray, *, noise: int = 0,
                    samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> FloatArray:
    """``v^T dp/dz`` by reverse mode through the rounds (the rounds are recomputed)."""
    return _vjp_many(z, k, v[:, None, :], noise, samples, seed)[:, 0]


def gumbel_topk_jacobian(fwd: Forward, z: FloatArray, k: int, *, noise: int = 0,
                         samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> FloatArray:
    """``dp/dz``, ``(B, n, n)``: the VJP of every row of the identity."""
    return jacobian_from_vjp(lambda v: _vjp_many(z, k, v, noise, samples, seed), *z.shape)


def gumbel_topk_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The definition in extended precision (``np.longdouble``): ``1 - a`` by subtraction, the
    floor at the float64 one; rows trusted where every ``1 - a`` stays above 1e-6 (below, the
    subtraction loses the digits the next round needs)."""
    w = z.astype(np.longdouble)
    p = np.zeros(z.shape, dtype=np.longdouble)
    trusted = np.ones(z.shape[0], dtype=bool)
    with np.errstate(under="ignore", invalid="ignore", divide="ignore"):
        for j in range(k):
            e = np.exp(w - w.max(axis=1, keepdims=True))
            a = e / e.sum(axis=1, keepdims=True)
            p += a
            c = 1 - a
            if j < k - 1:
                trusted &= (c > 1e-6).all(axis=1)
                w = w + np.log(np.maximum(c, np.longdouble(FLOOR)))
    return p.astype(np.float64), trusted


GUMBEL_TOPK = Implementation(
    forward=gumbel_topk_forward, jacobian=gumbel_topk_jacobian, vjp=gumbel_topk_vjp, elementwise=False,
)
