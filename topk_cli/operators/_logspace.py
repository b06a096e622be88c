"""Log-space helpers shared by the operator families (sums of exponentials without overflow,
underflow or cancellation)."""

from __future__ import annotations

import numpy as np

from topk_cli.operators._base import FloatArray

#: Below this, the float64 ``exp`` is exactly 0: e^-750 is 0.004 of the smallest subnormal
#: 2^-1074 (rounding to nearest gives 0 below half of it, e^-745.13), so an ``exp`` with an
#: error under 0.99 ulp returns 0 there (checked on a dense grid by the tests).
EXP_ZERO_BELOW = -750.0

#: Arrays smaller than this are passed to ``exp`` whole (the check costs more than it saves).
_EXP_CHECK_SIZE = 512
#: :func:`exp_into` guesses the share of arguments below the cut from every this-many-th entry of
#: a contiguous array (every 16th entry of the last axis of another), so the guess reads a small
#: fraction of the array's cache lines; only the speed depends on it.
_EXP_SAMPLE_STEP = 127


def exp_into(a: FloatArray, out: FloatArray) -> FloatArray:
    """``np.exp(a, out=out)``, the same bits, without the slow underflow path of ``exp``.

    A float64 argument below :data:`EXP_ZERO_BELOW` gets the 0 its ``exp`` rounds to without
    calling ``exp``, which takes a slow path there (about 3x a normal call: the underflow
    exception and ``errno``). Every other entry (NaN, +-inf, the subnormal results above it)
    is ``np.exp`` of it; other dtypes are plain ``np.exp``. ``out`` may be ``a``."""
    if a.dtype != np.float64 or a.size < _EXP_CHECK_SIZE:  # the check would cost more than it saves
        return np.exp(a, out=out)
    sample = a.reshape(-1)[::_EXP_SAMPLE_STEP] if a.flags.c_contiguous else a[..., ::16]
    if 4 * np.count_nonzero(sample < EXP_ZERO_BELOW) < sample.size:  # exp with a sparse mask is slower
        return np.exp(a, out=out)
    low = a < EXP_ZERO_BELOW  # False for NaN, which goes to exp
    np.exp(a, out=out, where=~low)
    np.copyto(out, 0.0, where=low)
    return out


def exp_new(a: FloatArray) -> FloatArray:
    """``np.exp(a)`` into a new array, the same bits, through :func:`exp_into` (for the arrays where
    many arguments lie far below the float64 range of ``exp``: wide rows, log-space tables)."""
    return exp_into(a, np.empty_like(a))

def logsumexp(a: FloatArray, axis: int = -1, *, buf: FloatArray | None = None) -> FloatArray:
    """``log(sum(exp(a)))`` along ``axis``; ``-inf`` for an all ``-inf`` slice, never NaN.

    ``buf``, an array of ``a``'s shape, is used as scratch (same operations, no temporaries)."""
    m = np.max(a, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    shifted = np.subtract(a, m_safe, out=buf)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the right answer for empty sums
        out = np.log(np.sum(exp_into(shifted, shifted), axis=axis, keepdims=True)) + m_safe
    return np.squeeze(out, axis=axis)


def logsumexp_exclusive(a: FloatArray) -> FloatArray:
    """``out[..., i] = log(sum_{j != i} exp(a[..., j]))`` along the last axis, accurately.

    Subtracting one term from the total cancels only when that term dominates the sum, which
    can happen for the largest term alone: every other term is at most half the total, where
    ``log1p(-r)`` is well conditioned. The largest term's exclusive sum is summed directly.
    """
    total = logsumexp(a)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):  # -inf entries and empty rows
        ratio = np.exp(a - np.where(np.isfinite(total), total, 0.0))
        out = total + np.log1p(-np.minimum(ratio, 1.0))
    top = np.argmax(a, axis=-1)[..., None]
    without_top = a.copy()
    np.put_along_axis(without_top, top, -np.inf, axis=-1)
    np.put_along_axis(out, top, logsumexp(without_top)[..., None], axis=-1)
    return np.where(np.isfinite(total), out, -np.inf)
