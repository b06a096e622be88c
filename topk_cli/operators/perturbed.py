"""Perturbed top-k (Berthet et al. 2020): ``p = E[T_k(z + Z)]``, Z standard Gaussian, by Monte Carlo.

Axis convention: every function acts on a validated ``(B, n)`` batch ``z`` (see ``_base``): the
largest finite entry of each row is 0, masked entries are ``-inf`` (never selected).

Temperature: the public API passes ``z = x / tau``, so ``E[T_k(z + Z)] = E[T_k(x + tau Z)]``: the
noise scale ``sigma`` of Berthet et al. is ``tau``.

Estimator: ``samples`` draws in ``samples / 2`` antithetic pairs ``(Z, -Z)``; each pair's average
``(T_k(z + Z) + T_k(z - Z)) / 2`` is one independent observation, so ``p`` is their mean and the
standard error of each weight is their standard deviation over ``sqrt(samples / 2)``. Every
sample selects exactly k entries, so ``sum p = k`` and ``0 <= p <= 1`` hold exactly, while
monotonicity and permutation equivariance hold only in expectation (within the standard error).
The noise is a function of ``(seed, samples)`` and of the entry's rank among the unmasked
entries of its row only, shared by every row (common random numbers): the result is
deterministic for a seed, a row's weights do not depend on the other rows of the batch, masking
an entry is exactly the same as removing it, and differences between nearby inputs,
temperatures or methods are not drowned in fresh noise. The estimate is piecewise constant in ``z`` (its finite differences are
0 or jumps); the smooth object is the expectation.

Real k (one per row, ``0 < k <= m``): ``T_k`` of a sample is the real-k hard top-k (see
``hard``): weight 1 on the ``c - 1`` largest entries, ``c = ceil(k)``, and ``k - (c - 1)`` on the
c-th (samples have no ties, with probability 1). It is linear in k between integers, so the
expectation is too: ``p(k) = p(c - 1) + (k - c + 1) P(rank c)``, a kink at every integer. The same
noise as for an integer k (an integer value gives the same weights); the observations are no
longer multiples of 1/2, so their sums are rounded, still deterministically and row by row.
``dp/dk = E[dT_k/dk]``, the probability that the entry is the c-th largest of a sample, is
estimated with the same samples and its standard error as the forward's (at an integer k, the
derivative from below: the k-th largest).

Jacobian: integration by parts, ``dp/dz = E[T_k(z + Z) Z^T]`` (``/ sigma`` in ``x`` units, applied
by the API), estimated with the antithetic difference ``(T_k(z + Z) - T_k(z - Z)) / 2`` and the
noise centred over the unmasked entries (``T_k`` is shift-invariant, so centring removes a
zero-mean term exactly): rows and columns of the estimate sum to 0. Unbiased for the Jacobian
of the expectation; :func:`perturbed_jacobian_with_stderr` gives its standard error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray, Forward, Implementation

#: Default number of Monte Carlo samples (``samples / 2`` antithetic pairs).
DEFAULT_SAMPLES = 1000

#: Default seed of the noise.
DEFAULT_SEED = 0

#: Elements of one ``(rows, pairs, n)`` block (bounds the memory of a call, about 32 MiB).
_BLOCK = 1 << 22

#: Noise elements the forward holds at once when one row's samples exceed a block (256 MiB).
_NOISE_BUDGET = 1 << 25


def check_perturbed_params(samples: object, seed: object) -> tuple[int, int]:
    """Validate ``samples`` (an even integer >= 4) and ``seed`` (an integer >= 0)."""
    if isinstance(samples, (bool, np.bool_)) or not isinstance(samples, (int, np.integer)):
        raise InvalidArgumentError(f"samples must be an even integer >= 4, got {samples!r}")
    if samples < 4 or samples % 2:
        raise InvalidArgumentError(
            f"samples must be an even integer >= 4 (antithetic pairs, two pairs for a standard error), got {samples}"
        )
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidArgumentError(f"seed must be an integer >= 0, got {seed!r}")
    return int(samples), int(seed)


def perturbation_noise(n: int, samples: int, seed: int) -> FloatArray:
    """The ``(n, samples / 2)`` standard Gaussian draws: row ``j`` is the noise ``Z`` of the ``j``-th
    unmasked entry in the antithetic pairs ``(Z, -Z)``.

    Drawn row by row from ``np.random.default_rng(seed)``, so the noise of the first ``m`` entries
    does not depend on ``n``.
    """
    return np.random.default_rng(seed).standard_normal((n, samples // 2))


def _noise_columns(n: int, samples: int, seed: int, cols: slice) -> FloatArray:
    """Columns ``cols`` of :func:`perturbation_noise`: the same numbers, drawing the whole stream
    again in blocks of entries and keeping only those columns (``O(n * width)`` memory)."""
    pairs = samples // 2
    rng = np.random.default_rng(seed)
    out = np.empty((n, cols.stop - cols.start))
    step = max(1, _BLOCK // pairs)
    for start in range(0, n, step):  # consecutive draws continue one stream: the same numbers
        stop = min(n, start + step)
        out[start:stop] = rng.standard_normal((stop - start, pairs))[:, cols]
    return out


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


def _real_top_sums(neg: FloatArray, sel: np.ndarray, pos: NDArray[np.intp], g: FloatArray, z: FloatArray,
                   noise: FloatArray, masked: bool) -> FloatArray:
    """``sum_i T_k(z + s Z)_i (z_i + s Z_i)`` per ``(row, pair)`` for a real k (``neg`` overwritten): the
    sum of the ``c`` largest scores less ``g`` times the c-th."""
    kth = -np.take_along_axis(neg, pos, axis=-1)[..., 0]
    return _top_sums(neg, sel, z, noise, masked) - g[None, :, None] * kth


def _real_weights(sel: np.ndarray, last: np.ndarray, g: FloatArray) -> FloatArray:
    """``T_k(z + Z)``, ``T_k(z - Z)`` of a real k as floats: ``sel - g last``."""
    return np.subtract(sel, g[None, :, None, None] * last)


def _half_difference(sel: np.ndarray) -> FloatArray:
    """``(T_k(z + Z) - T_k(z - Z)) / 2`` from :func:`_selections`: values -1/2, 0, 1/2."""
    diff = np.subtract(sel[0], sel[1], dtype=np.float64)
    diff *= 0.5
    return diff


def _top_sums(neg: FloatArray, sel: np.ndarray, z: FloatArray, noise: FloatArray, masked: bool) -> FloatArray:
    """``sum_i T_k(z + s Z)_i (z_i + s Z_i)`` per ``(row, pair)`` for ``s = +1, -1``: ``(2, rows, pairs)``.

    ``neg`` (``(2, rows, pairs, n)``, overwritten) holds the negated scores ``-(z + s Z)`` and ``sel``
    their selections. Summing the selected negated scores (same positions, same pairwise order)
    gives exactly minus the sum of the scores, except that an exact 0 may carry the other sign: those
    sums are taken again from the scores themselves, so the result is bit for bit ``np.where(sel,
    z + s Z, 0).sum(axis=-1)`` (``z`` read as 0 on masked entries).
    """
    if masked:  # +inf * 0 would be nan
        neg = np.where(sel, neg, 0.0)
    else:  # in place; an unselected negative score gives -0, which only a zero sum can see
        np.multiply(neg, sel, out=neg)
    top = np.negative(neg.sum(axis=-1))
    # a zero, and an infinite sum (a masked entry selected, possible only in a row with fewer than
    # k unmasked entries, which the API never passes; or an overflow): summed again as the scores
    redo = ~np.isfinite(top) | (top == 0.0)
    if redo.any():
        zf = np.where(np.isfinite(z), z, 0.0)[:, None, :]
        scores = np.stack([zf + noise, zf - noise])
        top[redo] = np.where(sel, scores, 0.0).sum(axis=-1)[redo]
    return top


def perturbed_forward(z: FloatArray, k: Any, *, samples: int = DEFAULT_SAMPLES,
                      seed: int = DEFAULT_SEED) -> Forward:
    """Monte Carlo ``p = E[T_k(z + Z)]`` with antithetic pairs and common random numbers.

    ``k``: an ``int`` for every row, or a ``(B,)`` float array with one real ``k`` per row (see the
    module docstring).
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
    if (samples // 2) * n > _BLOCK:
        return _forward_by_sample_chunks(z, k, samples, seed)
    noise = perturbation_noise(n, samples, seed)
    pairs = noise.shape[1]
    fin_all = np.isfinite(z)
    real = not _is_int(k)
    c_all, g_all = _real_k(k, b) if real else (None, None)
    p = np.empty((b, n))
    q = np.empty((b, n))
    se = np.empty((b, n))
    potential = np.empty(b)
    rse = np.sqrt(pairs)
    for blk in _blocks(b, pairs, n):
        zb = z[blk]
        fb = fin_all[blk]
        # all entries unmasked: every row's noise is the (pairs, n) transpose of ``noise`` itself
        nb = np.ascontiguousarray(noise.T)[None] if fb.all() else _row_noise(fb, noise)
        if c_all is not None and g_all is not None:
            gb = g_all[blk]
            neg, sel, last, pos = _selections_real(zb, c_all[blk], nb)
            top_plus, top_minus = _real_top_sums(neg, sel, pos, gb, zb, nb, not fb.all())
        else:
            neg, sel = _selections(zb, k, nb)
            # E[sum of the k largest entries of z + Z]: its gradient is E[T_k(z + Z)] sample by sample
            top_plus, top_minus = _top_sums(neg, sel, zb, nb, not fb.all())
        potential[blk] = 0.5 * (top_plus + top_minus).mean(axis=1)
        count = np.add(sel[0], sel[1])  # 2 * observation: values 0, 1, 2
        # sums of 0, 1/2, 1 over pairs are exact in any order: numpy's mean is sum / pairs
        half = 0.5 * count.sum(axis=1)
        if real:  # observation 0.5 * count - (g / 2) * (times the entry was the c-th)
            lcount = np.add(last[0], last[1])
            gh = 0.5 * gb[:, None]
            cut = gh * lcount.sum(axis=1)
            p[blk] = pb = (half - cut) / pairs
            q[blk] = (pairs - half + cut) / pairs
        else:
            p[blk] = pb = half / pairs
            q[blk] = (pairs - half) / pairs
        # obs.std(axis=1, ddof=1) step by step as numpy computes it (the sum of squares is not
        # order-free): deviations from the mean, squared, summed over pairs, / (pairs - 1), sqrt
        dev = np.multiply(count, 0.5, out=neg[0])
        if real:
            dev -= gh[:, :, None] * lcount
        np.subtract(dev, pb[:, None, :], out=dev)
        np.square(dev, out=dev)
        std = np.sqrt(np.add.reduce(dev, axis=1) / (pairs - 1))
        se[blk] = np.where(fb, np.maximum(std / rse, 1.0 / pairs), 0.0)
    return Forward(p=p, q=q, aux={"stderr": se, "potential": potential})


def _noise_groups(n: int, samples: int, seed: int) -> Iterator[tuple[slice, FloatArray]]:
    """``(group, noise)``: the columns ``group`` of :func:`perturbation_noise`, ``_NOISE_BUDGET // n``
    pairs at a time (the stream is drawn again for each group; once when it fits)."""
    pairs = samples // 2
    width = max(1, min(pairs, _NOISE_BUDGET // n))
    for c0 in range(0, pairs, width):
        c1 = min(pairs, c0 + width)
        noise = perturbation_noise(n, samples, seed) if c1 - c0 == pairs else \
            _noise_columns(n, samples, seed, slice(c0, c1))
        yield slice(c0, c1), noise
        del noise


def _sample_chunks(z: FloatArray, samples: int, seed: int) -> Iterator[tuple[int, slice, FloatArray]]:
    """The chunks in which the forward and ``dp/dk`` draw a row's samples when they exceed a block:
    ``(r, at, part)``, the ``(n, pairs in at)`` columns of :func:`perturbation_noise` that row ``r``
    takes for the pairs ``at``: the groups of :func:`_noise_groups`, and in each group every row of
    the batch, ``_BLOCK // n`` pairs at a time, in order.
    """
    b, n = z.shape
    sub = max(1, _BLOCK // n)
    for group, noise in _noise_groups(n, samples, seed):
        for r in range(b):
            for s0 in range(0, group.stop - group.start, sub):
                part = noise[:, s0 : s0 + sub]
                yield r, slice(group.start + s0, group.start + s0 + part.shape[1]), part


def _noise_means(noise: FloatArray, live: NDArray[np.intp]) -> dict[int, FloatArray]:
    """``{m: mean of the rows [0, m) of noise}`` for every count ``m`` of unmasked entries in
    ``live``: :func:`_centred`'s means, summed as numpy sums the one-block noise over the entries
    (the entries one after the other: a cumulative sum, ``_BLOCK // pairs`` rows at a time)."""
    width = noise.shape[1]
    step = max(1, _BLOCK // width)
    counts = sorted({int(m) for m in live})
    out: dict[int, FloatArray] = {}
    acc = np.zeros((1, width))
    for start in range(0, counts[-1], step):
        run = np.cumsum(np.concatenate([acc, noise[start : start + step]]), axis=0)
        for m in counts:
            if start < m <= start + step:
                out[m] = run[m - start] / m
        acc = run[-1:]
    return out


def _chunk_noise(fb: np.ndarray, part: FloatArray) -> FloatArray:
    """The ``(1, pairs, n)`` noise of a row (``fb``: its ``(1, n)`` unmasked entries) and a chunk of
    :func:`_sample_chunks`, C-contiguous where no entry is masked."""
    return np.ascontiguousarray(part.T)[None] if fb.all() else _row_noise(fb, part)


def _sum_of_squares(bits: np.ndarray, centre: FloatArray, n: int, lbits: np.ndarray | None = None,
                    gh: FloatArray | None = None) -> FloatArray:
    """``sum over pairs of (obs - centre)^2`` for one row, from its selections kept as bits (``(2, pairs,
    bytes)`` from ``np.packbits``): ``obs = (plus + minus) / 2``, less ``gh (last+ + last-)`` when the
    bits ``lbits`` of the c-th entries are given.

    As ``obs.std(ddof=1)`` computes it over the pairs axis: deviations from the mean, squared, added
    pair after pair (the running sum is the first term of the next chunk), so the same bits as the
    one-block estimators.
    """
    pairs = bits.shape[1]
    sub = max(1, _BLOCK // n)
    acc: FloatArray | None = None
    for s0 in range(0, pairs, sub):
        s1 = min(pairs, s0 + sub)
        plus = np.unpackbits(bits[0, s0:s1], axis=-1, count=n)
        minus = np.unpackbits(bits[1, s0:s1], axis=-1, count=n)
        lead = 0 if acc is None else 1
        dev = np.empty((lead + s1 - s0, n))
        np.multiply(np.add(plus, minus), 0.5, out=dev[lead:])
        if lbits is not None and gh is not None:
            dev[lead:] -= gh * np.add(np.unpackbits(lbits[0, s0:s1], axis=-1, count=n),
                                      np.unpackbits(lbits[1, s0:s1], axis=-1, count=n))
        np.subtract(dev[lead:], centre, out=dev[lead:])
        np.square(dev[lead:], out=dev[lead:])
        if acc is not None:
            dev[0] = acc
        acc = np.add.reduce(dev, axis=0)
    assert acc is not None
    return acc


def _forward_by_sample_chunks(z: FloatArray, k: Any, samples: int, seed: int) -> Forward:
    """:func:`perturbed_forward` where one row's samples exceed a block: the same numbers, with the
    samples drawn and reduced in chunks (:func:`_sample_chunks`), one row at a time.

    Every per-pair quantity is the one the one-block computation makes; the counts are exact
    integers, the top sums are kept per pair and averaged at the end as before, and the sum of
    squared deviations (which needs the mean first) runs over the pairs in order, from the
    selections kept as two bits per pair and entry (``samples * n / 8`` bytes per row, 1/32 of the
    noise).
    """
    b, n = z.shape
    pairs = samples // 2
    fin_all = np.isfinite(z)
    real = not _is_int(k)
    c_all, g_all = _real_k(k, b) if real else (None, None)
    counts = np.zeros((b, n), dtype=np.uint64)
    tops = np.empty((2, b, pairs))
    nbytes = (n + 7) // 8
    bits = np.empty((b, 2, pairs, nbytes), dtype=np.uint8)
    # a real k: where each sample's c-th largest entry is, as bits too
    lcounts = np.zeros((b, n), dtype=np.uint64) if real else counts
    lbits = np.empty((b, 2, pairs, nbytes), dtype=np.uint8) if real else bits
    for r, at, part in _sample_chunks(z, samples, seed):
        zb = z[r : r + 1]
        fb = fin_all[r : r + 1]
        nb = _chunk_noise(fb, part)
        if c_all is not None and g_all is not None:
            neg, sel, last, pos = _selections_real(zb, c_all[r : r + 1], nb)
            top = _real_top_sums(neg, sel, pos, g_all[r : r + 1], zb, nb, not fb.all())
            lcounts[r] += np.add(last[0, 0], last[1, 0]).sum(axis=0)
            lbits[r, :, at] = np.packbits(last[:, 0], axis=-1)
        else:
            neg, sel = _selections(zb, k, nb)
            top = _top_sums(neg, sel, zb, nb, not fb.all())
        tops[:, r, at] = top[:, 0]
        counts[r] += np.add(sel[0, 0], sel[1, 0]).sum(axis=0)
        bits[r, :, at] = np.packbits(sel[:, 0], axis=-1)
    # as the one-block forward: sums of 0, 1/2, 1 over pairs are exact in any order
    half = 0.5 * counts
    gh: FloatArray | None = None
    if g_all is not None:  # as the one-block forward
        gh = 0.5 * g_all[:, None]
        cut = gh * lcounts
        p = (half - cut) / pairs
        q = (pairs - half + cut) / pairs
    else:
        p = half / pairs
        q = (pairs - half) / pairs
    potential = 0.5 * (tops[0] + tops[1]).mean(axis=1)
    se = np.empty((b, n))
    rse = np.sqrt(pairs)
    for r in range(b):
        acc = _sum_of_squares(bits[r], p[r], n, lbits[r] if real else None, None if gh is None else gh[r])
        std = np.sqrt(acc / (pairs - 1))
        se[r] = np.where(fin_all[r], np.maximum(std / rse, 1.0 / pairs), 0.0)
    return Forward(p=p, q=q, aux={"stderr": se, "potential": potential})


def perturbed_potential(fwd: Forward, z: FloatArray, k: Any) -> FloatArray:
    """``E[max_{|S| = k} sum_{i in S} (z_i + Z_i)]`` estimated with the forward's samples, ``(B,)``.

    Berthet et al.'s perturbed maximum: with the same (common) noise its gradient is exactly the
    estimated ``p`` wherever no sample sits at a tie, so it is the potential of this estimate.
    """
    return fwd.aux["potential"]


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


def _row_k(k: Any, b: int) -> Any:
    """``k`` for :func:`_block_difference` of one row at a time: an int, or the real k of every row."""
    return k if _is_int(k) else np.broadcast_to(np.asarray(k, dtype=np.float64).reshape(-1), (b,))


def _jacobian_by_sample_chunks(z: FloatArray, k: Any, samples: int,
                               seed: int) -> tuple[FloatArray, FloatArray]:
    """:func:`perturbed_jacobian_with_stderr` where one row's samples exceed a block: the samples of
    :func:`_sample_chunks`, a group of pairs at a time, with the same bits.

    A row's differences and centred noise are gathered for a group of pairs (as many elements as
    the group's noise) in the layout the one-block code gives them, and reduced by the same
    ``einsum``, which adds the pairs one after the other there. A later group carries the running
    sums in as ``n`` leading pairs (the identity against them: the products ``0 * s`` leave every
    sum as it is), so the sums over all pairs are the one-block ones, bit for bit, at the cost of
    ``n`` pairs (and an ``n x n`` block of each buffer) per later group.
    """
    b, n = z.shape
    pairs = samples // 2
    fin = np.isfinite(z)
    kr = _row_k(k, b)
    width = max(1, min(pairs, _NOISE_BUDGET // n))
    lead_max = n if width < pairs else 0
    dbuf = np.empty((1, lead_max + width, n))
    zmem = np.empty((1, n, lead_max + width))  # the centred noise with the pairs contiguous, as _row_noise
    zbuf = np.transpose(zmem, (0, 2, 1))
    if lead_max:
        dbuf[0, :n] = np.eye(n)
    jac = np.zeros((b, n, n))
    second = np.zeros((b, n, n))
    sub = max(1, _BLOCK // n)
    live = fin.sum(axis=1)
    for group, noise in _noise_groups(n, samples, seed):
        means = _noise_means(noise, live)
        lead = 0 if group.start == 0 else n
        rows = slice(lead_max - lead, lead_max + group.stop - group.start)
        body = slice(lead_max, rows.stop)
        for r in range(b):
            fb = fin[r : r + 1]
            for s0 in range(0, group.stop - group.start, sub):
                part = noise[:, s0 : s0 + sub]
                cols = slice(s0, s0 + part.shape[1])
                put = slice(lead_max + s0, lead_max + cols.stop)
                nb = _row_noise(fb, part)
                kb = kr if _is_int(kr) else kr[r : r + 1]
                dbuf[:, put] = _block_difference(z[r : r + 1], kb, slice(0, 1), nb)
                # _centred with the group's means
                zbuf[:, put] = np.where(fb[:, None, :], nb - means[live[r]][None, cols, None], 0.0)
            if lead:
                zbuf[0, :lead] = jac[r]
            jac[r] = np.einsum("rmi,rmj->rij", dbuf[:, rows], zbuf[:, rows])[0]
            np.square(dbuf[:, body], out=dbuf[:, body])
            np.square(zbuf[:, body], out=zbuf[:, body])
            if lead:
                zbuf[0, :lead] = second[r]
            second[r] = np.einsum("rmi,rmj->rij", dbuf[:, rows], zbuf[:, rows])[0]
    mean = jac / pairs
    second /= pairs
    var = np.maximum(second - mean * mean, 0.0) * pairs / (pairs - 1)
    return mean, np.sqrt(var / pairs)


def perturbed_jacobian_with_stderr(z: FloatArray, k: Any, *, samples: int = DEFAULT_SAMPLES,
                                   seed: int = DEFAULT_SEED) -> tuple[FloatArray, FloatArray]:
    """``(J, stderr)``: the integration-by-parts estimate of ``dp/dz`` and its standard error.

    ``J[b, i, j] = mean over pairs of D_i Zc_j`` with ``D = (T_k(z + Z) - T_k(z - Z)) / 2`` and
    ``Zc`` the centred noise; shapes ``(B, n, n)``. Masked entries have zero rows and columns.
    """
    samples, seed = check_perturbed_params(samples, seed)
    b, n = z.shape
    if (samples // 2) * n > _BLOCK:
        return _jacobian_by_sample_chunks(z, k, samples, seed)
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


def perturbed_jacobian(fwd: Forward, z: FloatArray, k: Any, *, samples: int = DEFAULT_SAMPLES,
                       seed: int = DEFAULT_SEED) -> FloatArray:
    """The integration-by-parts estimate of ``dp/dz`` (see :func:`perturbed_jacobian_with_stderr`)."""
    return perturbed_jacobian_with_stderr(z, k, samples=samples, seed=seed)[0]


def perturbed_vjp(fwd: Forward, z: FloatArray, k: Any, v: FloatArray, *, samples: int = DEFAULT_SAMPLES,
                  seed: int = DEFAULT_SEED) -> FloatArray:
    """``v^T dp/dz`` estimated as ``mean over pairs of (v . D) Zc`` in O(samples n) time per row.

    Where one row's samples exceed a block they are drawn in the forward's groups and chunks, with
    the same bits (see :func:`_vjp_by_sample_chunks`): the memory is then that of a group of noise
    (``2^25`` elements) and of a chunk (``2^22``), plus two floats per pair and row, whatever the
    sample count.
    """
    samples, seed = check_perturbed_params(samples, seed)
    b, n = z.shape
    if (samples // 2) * n > _BLOCK:
        return _vjp_by_sample_chunks(z, k, v, samples, seed)
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


def _two(a: FloatArray, axis: int) -> FloatArray:
    """``a`` with its only element along ``axis`` repeated, or ``a``: an ``einsum`` over one pair (one
    entry) takes another path than over several (a single sum over more than 8192 elements is summed
    in pieces), so that a chunk of one is summed as the one-block arrays are."""
    return np.repeat(a, 2, axis=axis) if a.shape[axis] == 1 else a


def _vjp_by_sample_chunks(z: FloatArray, k: Any, v: FloatArray, samples: int, seed: int) -> FloatArray:
    """:func:`perturbed_vjp` where one row's samples exceed a block, with the same bits, in two passes.

    The one-block ``einsum`` sums each entry's ``(v . D) Zc`` over all the pairs at once (in SIMD
    lanes, not pair after pair), so the sums are taken a block of entries at a time instead. First
    the forward's groups and chunks give each pair's weight ``v . D`` and noise mean (two floats per
    pair and row); then the stream is drawn once more, ``_BLOCK // pairs`` entries (all their pairs)
    at a time, and each block of entries is centred and reduced by the same ``einsum``, in the same
    layout.
    """
    b, n = z.shape
    pairs = samples // 2
    fin = np.isfinite(z)
    kr = _row_k(k, b)
    weight = np.empty((b, pairs))
    mean = np.empty((b, pairs))
    sub = max(1, _BLOCK // n)
    counts = fin.sum(axis=1)
    for group, noise in _noise_groups(n, samples, seed):
        means = _noise_means(noise, counts)
        for r in range(b):
            blk = slice(r, r + 1)
            mean[r, group] = means[counts[r]]
            for s0 in range(0, group.stop - group.start, sub):
                part = noise[:, s0 : s0 + sub]
                kb = kr if _is_int(kr) else kr[blk]
                diff = _block_difference(z[blk], kb, slice(0, 1), _row_noise(fin[blk], part))
                at = slice(group.start + s0, group.start + s0 + part.shape[1])
                weight[r, at] = np.einsum("rmi,ri->rm", _two(diff, 1), v[blk])[0, : part.shape[1]]
    out = np.zeros((b, n))  # a masked entry's sum of products with 0 is +0
    live = [np.flatnonzero(fin[r]) for r in range(b)]
    rng = np.random.default_rng(seed)
    step = max(1, _BLOCK // pairs)
    for start in range(0, max(len(pos) for pos in live), step):
        noise = rng.standard_normal((min(n, start + step) - start, pairs))  # entries by rank, in order
        for r, pos in enumerate(live):
            entries = pos[start : start + step]
            if not entries.size:
                continue
            zc = noise[: entries.size] - mean[r]  # the pairs contiguous, as the one-block centred noise
            summed = np.einsum("rm,rmj->rj", weight[r : r + 1], _two(zc, 0).T[None])
            out[r, entries] = summed[0, : entries.size]
    return out / pairs


def _dk_by_sample_chunks(z: FloatArray, c: NDArray[np.intp], samples: int,
                         seed: int) -> tuple[FloatArray, FloatArray]:
    """:func:`perturbed_dk_with_stderr` over the chunks of :func:`_sample_chunks`, with the same
    bits: the counts are exact integers and the sum of squared deviations runs over the pairs in
    order, from the c-th entries kept as two bits per pair and entry (``samples * n / 8`` bytes per
    row), as in the forward."""
    b, n = z.shape
    pairs = samples // 2
    fin = np.isfinite(z)
    counts = np.zeros((b, n), dtype=np.uint64)
    bits = np.empty((b, 2, pairs, (n + 7) // 8), dtype=np.uint8)
    for r, at, part in _sample_chunks(z, samples, seed):
        last = _selections_real(z[r : r + 1], c[r : r + 1], _chunk_noise(fin[r : r + 1], part))[2]
        counts[r] += np.add(last[0, 0], last[1, 0]).sum(axis=0)
        bits[r, :, at] = np.packbits(last[:, 0], axis=-1)
    # sums of 0, 1/2, 1 over pairs are exact in any order: the one-block obs.sum / pairs
    dk = 0.5 * counts / pairs
    se = np.empty((b, n))
    rse = np.sqrt(pairs)
    for r in range(b):
        std = np.sqrt(_sum_of_squares(bits[r], dk[r], n) / (pairs - 1))
        se[r] = np.where(fin[r], np.maximum(std / rse, 1.0 / pairs), 0.0)
    return dk, se


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
    c = np.full(b, k, dtype=np.intp) if _is_int(k) else _real_k(k, b)[0]
    if (samples // 2) * n > _BLOCK:
        return _dk_by_sample_chunks(z, c, samples, seed)
    noise = perturbation_noise(n, samples, seed)
    pairs = noise.shape[1]
    fin = np.isfinite(z)
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


def perturbed_dk(fwd: Forward, z: FloatArray, k: Any, *, samples: int = DEFAULT_SAMPLES,
                 seed: int = DEFAULT_SEED) -> FloatArray:
    """``dp/dk`` estimated with the forward's samples (see :func:`perturbed_dk_with_stderr`)."""
    return perturbed_dk_with_stderr(z, k, samples=samples, seed=seed)[0]


#: ``samples`` and ``seed`` reach forward, jacobian, vjp and dk as keyword arguments. ``k``: an int,
#: or a real k per row.
PERTURBED = Implementation(
    forward=perturbed_forward, jacobian=perturbed_jacobian, vjp=perturbed_vjp, elementwise=False, row_k=True,
    dk=perturbed_dk,
)
