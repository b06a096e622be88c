"""Shrinking a counterexample: fewest entries, then simplest values, while it still fails.

The shrinker tries candidates one at a time, in a fixed order, and keeps the first that still
fails. It first drops contiguous chunks of entries, halving the chunk size down to two (delta
debugging: Zeller and Hildebrandt, "Simplifying and isolating failure-inducing input", IEEE TSE
2002), so that a long counterexample loses most of its entries in a few steps instead of a chain
of one-entry steps; then single entries until none can go; then it simplifies the values, and
drops chunks and single entries again. A ``prefetch`` hook lets the caller evaluate the candidates it is
about to try in a few large batches instead (speculatively: the ones after the first success are
wasted work). The candidates of one chunk size all have the same length, so they go in one batch;
a single-entry sweep tends to succeed near where the one before it did, so it batches the
candidates up to there, then the rest. The walk, its decisions and its ``budget`` accounting do
not depend on the hook: the same ``violates`` answers give the same counterexample, only with
fewer operator calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray

_K = int | float  # an int, or a non-integer real k (the methods that take one)
#: Candidates ``(y, k)`` the shrinker is about to try, in the order it will try them.
Prefetch = Callable[[Sequence[tuple[FloatArray, Any]]], None]

#: Candidates in the second batch of a sweep (8 dropped entries with their up to 3 values of k).
NEXT_BATCH = 24


def _less(k: _K, size: int) -> _K:
    """``k - size``, at least 1 for an integer k and at least the fractional part for a real one."""
    if isinstance(k, (int, np.integer)):
        return max(1, k - size)
    return max(k - math.floor(k) or 1.0, k - size)


def _shrink(
    violates: Callable[[FloatArray, Any], bool],
    x: FloatArray,
    k: _K,
    budget: int = 300,
    prefetch: Prefetch | None = None,
) -> tuple[FloatArray, Any]:
    """Fewest entries, then simplest values, while ``violates`` stays true.

    At most ``budget`` calls of ``violates``. Unless the budget runs out, the result is
    1-minimal: dropping any single entry, with k, k - 1 or at most the entries left, no longer
    fails. ``prefetch`` (optional) is handed the candidates
    before they are tried, in batches; an error it raises is ignored (whatever went wrong happens
    again, and is handled as without the hook, when ``violates`` sees the candidate).
    """
    calls = 0

    def admissible(y: FloatArray, kk: int | float) -> bool:
        return 0 < kk <= np.isfinite(y).sum()  # an integer k >= 1, or a real k of a method taking one

    def attempt(y: FloatArray, kk: _K) -> bool:
        nonlocal calls
        if calls >= budget or not admissible(y, kk):
            return False
        calls += 1
        try:
            return violates(y, kk)
        except InvalidArgumentError:
            return False

    def first(candidates: Sequence[tuple[FloatArray, _K]], likely: int = 0) -> int | None:
        """Index of the first candidate that still fails, tried in order (None: none does).

        ``likely`` is where the caller expects it. With ``prefetch``, candidates ``0..likely`` go
        in one batch when ``likely >= 2``, else the first two one by one (a shrink is mostly a
        chain of dependent steps, and every distinct k in a batch costs one operator call);
        then, while none fails, the next :data:`NEXT_BATCH` together, then all the rest.
        """
        ahead = 0
        for j, (y, kk) in enumerate(candidates):
            if prefetch is not None and j >= ahead:
                if j == 0 and likely >= 2:
                    ahead = likely + 1
                elif j < 2:
                    ahead = j + 1
                elif ahead <= 2 or j <= likely + 1:
                    ahead = j + NEXT_BATCH
                else:
                    ahead = len(candidates)
                # exactly the candidates the walk will try if none of them fails
                batch = [c for c in candidates[j:ahead] if admissible(*c)][: max(0, budget - calls)]
                if batch:
                    try:
                        prefetch(batch)
                    except Exception:  # speculative: a real error recurs when the candidate is tried
                        pass
            if attempt(y, kk):
                return j
        return None

    def drop_entries(x: FloatArray, k: _K) -> tuple[FloatArray, _K]:
        likely = 0  # a sweep tends to succeed where the one before it did
        while x.size > 1:
            candidates = [
                (y, kk)
                for y in (np.concatenate((x[:i], x[i + 1 :])) for i in range(x.size))  # np.delete(x, i), cheaper
                for kk in dict.fromkeys((k, k - 1, min(k, y.size)))
            ]
            j = first(candidates, likely)
            if j is None:
                break
            x, k = candidates[j]
            likely = j
        return x, k

    def drop_chunks(x: FloatArray, k: _K) -> tuple[FloatArray, _K]:
        size = x.size // 2
        while size >= 2:
            size = min(size, x.size // 2)
            if size < 2:
                break
            # k as is, or less the chunk's size (as if it held selected entries, the analogue of a
            # single drop's k - 1), or at most the entries left: the same three values for every
            # chunk of a size, so a batch costs at most three operator calls
            ks = dict.fromkeys((k, _less(k, size), min(k, x.size - size)))
            candidates = [
                (y, kk)
                for y in (np.concatenate((x[:start], x[start + size :])) for start in range(0, x.size - size + 1, size))
                for kk in ks
            ]
            j = first(candidates, len(candidates) - 1)  # all of one length: one batch
            if j is None:
                size //= 2
            else:
                x, k = candidates[j]  # and again at the same size
        return x, k

    x, k = drop_entries(*drop_chunks(x, k))
    finite = np.isfinite(x)
    if finite.any():
        ranks = np.unique(x[finite], return_inverse=True)[1].astype(np.float64)
        y = x.copy()
        y[finite] = ranks
        simpler = [] if np.array_equal(y, x) else [y]
        top = float(np.max(x[finite]))
        simpler += [np.where(finite, x - shift, x) for shift in (top, round(top)) if shift != 0]
        j = first([(y, k) for y in simpler])
        if j is not None:
            x = simpler[j]
    rounded = []
    for decimals in (0, 1, 2, 4):
        with np.errstate(invalid="ignore"):
            y = np.where(np.isfinite(x), np.round(x, decimals), x)
        if not np.array_equal(y, x):
            rounded.append(y)
    j = first([(y, k) for y in rounded])
    if j is not None:
        x = rounded[j]
    for i in range(x.size):
        entry = []
        for decimals in (0, 1, 2):
            if not np.isfinite(x[i]):
                break
            y = x.copy()
            y[i] = np.round(y[i], decimals)
            if y[i] != x[i]:
                entry.append(y)
        j = first([(y, k) for y in entry])
        if j is not None:
            x = entry[j]
    x, k = drop_entries(*drop_chunks(x, k))
    return x, k
