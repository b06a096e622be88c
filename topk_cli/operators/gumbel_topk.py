"""``gumbel-topk``: the relaxed subset of Xie & Ermon (2019), k rounds of softmax.

Xie & Ermon, "Reparameterizable subset sampling via continuous relaxations" (IJCAI 2019),
relax the k draws of weighted sampling without replacement: with keys ``w`` (log-weights, plus
Gumbel noise when sampling), round ``j`` takes ``a_j = softmax(w)`` and then lowers every key by
``log(1 - a_j)``, so that what round ``j`` selected counts less in the next one; the result is
``p = sum_j a_j``. Here the keys are ``z = (x - max x) / tau`` (the public API passes only ``z``,
and every method's weights are a function of ``z`` alone): this is the article's relaxation
with log-weights ``x / tau`` and relaxation temperature 1. The article divides the masked keys
``x + sum log(1 - a)`` by its temperature ``t``, a different map of ``(x, t)`` unless ``t = 1``.

No clamp: ``log(1 - a)`` is computed in log space, ``log1p(-a)`` for every entry but the largest
(``a <= 1/2`` there) and ``logsumexp(others) - logsumexp(all)`` for the largest, so it stays exact
where ``1 - a`` underflows. Public implementations clip ``1 - a`` at a floor (the float32 ``tiny``,
1.2e-38) before the log, which changes the map once a key leads the others by more than ~87
(``x / tau`` units); without a floor the exact relaxation is kept (e.g. ``x = 0,-2207``, ``k = 2``
gives ``0.5, 1.5``, the floor ``0, 2``). ``log(1 - a)`` is finite whenever the row has two unmasked
entries, which every round but the last of a row with ``k >= 2`` has.

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

DEFAULT_SAMPLES = 100
DEFAULT_SEED = 0


def _rounds(w0: FloatArray, k: int, record: bool = True) -> tuple[FloatArray, FloatArray, FloatArray, np.ndarray]:
    """``(a, c, ratio, tops)``: each ``(B, k, n)``, the softmax of every round, its complement ``1 - a``
    and ``ratio = a / (1 - a_top)`` off the largest entry (``e^{w_m}`` over the sum of the others than
    the largest; 0 on it); ``tops (B, k)`` the largest entry of each round (the first at a tie).
    ``record=False`` keeps one round (``O(B n)`` memory instead of ``O(B k n)``): ``a`` and ``c`` then
    hold ``p = sum_j a_j`` and ``q = (1 - a_j*) - sum_{j != j*} a_j`` (``j*`` the round with the entry's
    largest ``a``: no cancellation of a ``1 - a`` near 0) as single rounds, for the forward pass."""
    bsz, n = w0.shape
    rows = np.arange(bsz)
    kept = k if record else 1
    a_all = np.zeros((bsz, kept, n))
    c_all = np.empty((bsz, kept, n))
    r_all = np.empty((bsz, kept, n))
    tops = np.empty((bsz, kept), dtype=np.intp)
    if not record:
        a_star = np.full((bsz, n), -1.0)
        c_star = np.ones((bsz, n))
    w = w0.copy()
    for j in range(k):
        top = np.argmax(w, axis=1)
        d = w - w[rows, top][:, None]  # the largest at 0; masked -inf
        d[rows, top] = 0.0
        others = d.copy()
        others[rows, top] = -np.inf
        second = others.max(axis=1)
        alone = ~np.isfinite(second)  # one unmasked entry: it takes everything
        second[alone] = 0.0
        with np.errstate(under="ignore", invalid="ignore", divide="ignore"):
            g = others - second[:, None]  # the others relative to the second largest (0 there)
            log_rest2 = np.log(np.exp(g).sum(axis=1))  # log sum_{m != top} e^{d_m} - second, in [0, log n]
            lrest = np.where(alone, -np.inf, second + log_rest2)
            big = np.log1p(np.exp(lrest))  # log of the total, relative to the largest
            a = np.exp(d - big[:, None])
            ratio = np.where(alone[:, None], 0.0, np.exp(g - log_rest2[:, None]))
            log_c = np.log1p(-a)  # exact: a <= 1/2 off the largest entry (a = 1 only on a lone one)
        ratio[rows, top] = 0.0
        log_c[rows, top] = lrest - big  # log(1 - a_top), exact where 1 - a_top underflows
        with np.errstate(under="ignore"):
            c = np.exp(log_c)
        if record:
            a_all[:, j], c_all[:, j], r_all[:, j], tops[:, j] = a, c, ratio, top
        else:  # p and, for q, the round where the entry's a is largest (its 1 - a is then the smallest)
            a_all[:, 0] += a
            larger = a > a_star
            a_star = np.where(larger, a, a_star)
            c_star = np.where(larger, c, c_star)
        if j < k - 1:
            # the next keys relative to the second largest: the largest's is log(rest2) - big exactly
            # (- second + lrest - big), so that a gap of 1e20 does not absorb log(1 - a_top)
            w = g + log_c
            w[rows, top] = np.where(alone, 0.0, log_rest2 - big)
    if not record:
        p = a_all[:, 0]
        c_all[:, 0] = c_star - (p - a_star)
    return a_all, c_all, r_all, tops


def _vjp_rounds(a_all: FloatArray, c_all: FloatArray, r_all: FloatArray, tops: np.ndarray, v: FloatArray) -> FloatArray:
    """``V dp/dw0`` for ``V (B, C, n)`` by reverse mode through the rounds.

    Round ``j`` adds ``l_i = log(1 - a_i)`` to the keys; ``dl_i/dw_m = [m != i] a_m / (1 - a_i) - a_m``,
    so a gradient ``g`` on ``l`` gives ``a_m sum_{i != m} g_i / (1 - a_i) - a_m sum_i g_i``; the term
    of the largest entry ``t`` is ``ratio_m g_t`` (``a_m / (1 - a_t)``, bounded by 1 and exact where
    ``1 - a_t`` underflows), every other ``1 - a_i`` is at least 1/2."""
    bsz, k = a_all.shape[:2]
    rows = np.arange(bsz)
    gw = np.zeros(v.shape)
    for j in range(k - 1, -1, -1):
        a = a_all[:, j][:, None, :]
        out = gw + a * (v - (a * v).sum(axis=-1, keepdims=True))  # identity path + softmax VJP of v
        if j < k - 1:
            top = tops[:, j]  # the forward's choice: at a tie, argmax of a may pick another
            g_top = gw[rows, :, top][:, :, None]
            r = gw / c_all[:, j][:, None, :]
            r[rows, :, top] = 0.0
            out += (a * (r.sum(axis=-1, keepdims=True) - r) + r_all[:, j][:, None, :] * g_top
                    - a * gw.sum(axis=-1, keepdims=True))
        gw = out
    return gw


def _check_noise(noise: Any, samples: Any, seed: Any) -> tuple[bool, int, int]:
    if noise not in (0, 1):
        raise InvalidArgumentError(f"noise of method 'gumbel-topk' must be 0 or 1, got {noise!r}")
    return bool(noise), int(samples), int(seed)


def gumbel_noise(z: FloatArray, samples: int, seed: int) -> FloatArray:
    """``(B, S, n)`` standard Gumbel keys: draw ``j`` of the ``r``-th unmasked entry of a row is the
    same in every row (and 0 on masked entries)."""
    n = z.shape[1]
    g = -np.log(-np.log(np.random.default_rng(seed).uniform(size=(samples, n))))
    fin = np.isfinite(z)
    rank = np.cumsum(fin, axis=1) - 1
    out = np.where(fin[:, None, :], g[:, np.maximum(rank, 0)].transpose(1, 0, 2), 0.0)
    return out


def _noisy_rounds(z: FloatArray, k: int, samples: int, seed: int, record: bool = True
                  ) -> tuple[FloatArray, FloatArray, FloatArray, np.ndarray]:
    bsz, n = z.shape
    keys = (z[:, None, :] + gumbel_noise(z, samples, seed)).reshape(bsz * samples, n)
    return _rounds(keys, k, record)


def gumbel_topk_forward(z: FloatArray, k: int, *, noise: int = 0, samples: int = DEFAULT_SAMPLES,
                        seed: int = DEFAULT_SEED) -> Forward:
    """``p = sum_j a_j`` (see the module docstring); with noise, the mean over the samples.

    >>> np.round(gumbel_topk_forward(np.array([[0.0, -1.0, -2.0]]), 1).p, 4)  # k = 1: softmax
    array([[0.6652, 0.2447, 0.09  ]])
    """
    on, samples, seed = _check_noise(noise, samples, seed)
    if not on:
        a_all, c_all, _, _ = _rounds(z, k, record=False)
        return Forward(p=a_all[:, 0], q=c_all[:, 0])
    bsz, n = z.shape
    a_all, c_all, _, _ = _noisy_rounds(z, k, samples, seed, record=False)
    ps, qs = (w[:, 0].reshape(bsz, samples, n) for w in (a_all, c_all))
    se = ps.std(axis=1, ddof=1) / np.sqrt(samples) if samples > 1 else np.full((bsz, n), np.inf)
    return Forward(p=ps.mean(axis=1), q=qs.mean(axis=1), aux={"stderr": se})


#: Elements of the stored rounds (``3 k n`` per row and sample) one reverse pass holds at once.
_CHUNK = 1 << 23


def _vjp_many(z: FloatArray, k: int, v: FloatArray, noise: int, samples: int, seed: int) -> FloatArray:
    """``V dp/dz`` for ``V (B, C, n)``, rows taken in chunks that bound the stored rounds' memory."""
    per_row = 3 * k * z.shape[1] * (samples if noise else 1) + v[0].size
    step = max(1, _CHUNK // per_row)
    if z.shape[0] <= step:
        return _vjp_chunk(z, k, v, noise, samples, seed)
    return np.concatenate([_vjp_chunk(z[i:i + step], k, v[i:i + step], noise, samples, seed)
                           for i in range(0, z.shape[0], step)])


def _vjp_chunk(z: FloatArray, k: int, v: FloatArray, noise: int, samples: int, seed: int) -> FloatArray:
    on, samples, seed = _check_noise(noise, samples, seed)
    if not on:
        return _vjp_rounds(*_rounds(z, k), v)
    bsz = z.shape[0]
    vv = np.repeat(v, samples, axis=0)
    return _vjp_rounds(*_noisy_rounds(z, k, samples, seed), vv).reshape(bsz, samples, *v.shape[1:]).mean(axis=1)


def gumbel_topk_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray, *, noise: int = 0,
                    samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> FloatArray:
    """``v^T dp/dz`` by reverse mode through the rounds (the rounds are recomputed)."""
    return _vjp_many(z, k, v[:, None, :], noise, samples, seed)[:, 0]


def gumbel_topk_jacobian(fwd: Forward, z: FloatArray, k: int, *, noise: int = 0,
                         samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> FloatArray:
    """``dp/dz``, ``(B, n, n)``: the VJP of every row of the identity."""
    return jacobian_from_vjp(lambda v: _vjp_many(z, k, v, noise, samples, seed), *z.shape)


def gumbel_topk_reference(z: FloatArray, k: int, ctx: ReferenceContext) -> tuple[FloatArray, BoolArray]:
    """The definition in extended precision (``np.longdouble``), ``1 - a`` by subtraction; rows
    trusted where every ``1 - a`` stays above 1e-6 (below, the subtraction loses the digits the
    next round needs)."""
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
                w = w + np.log(c)
    return p.astype(np.float64), trusted


#: ``k`` sequential rounds over the row (``O(n k)`` time; the VJP stores them, ``24 n k`` bytes per row):
#: n k above 1e7 per row is refused before any work.
GUMBEL_TOPK = Implementation(
    forward=gumbel_topk_forward, jacobian=gumbel_topk_jacobian, vjp=gumbel_topk_vjp, elementwise=False,
    max_row_work=1e7,
)
