"""Shrinking a counterexample: fewest entries, then simplest values, while it still fails."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray


def _shrink(violates: Callable[[FloatArray, int], bool], x: FloatArray, k: int, budget: int = 300) -> tuple[FloatArray, int]:
    """Fewest entries, then simplest values, while ``violates`` stays true."""
    calls = 0

    def attempt(y: FloatArray, kk: int) -> bool:
        nonlocal calls
        if calls >= budget or not 1 <= kk <= np.isfinite(y).sum():
            return False
        calls += 1
        try:
            return violates(y, kk)
        except InvalidArgumentError:
            return False

    def drop_entries(x: FloatArray, k: int) -> tuple[FloatArray, int]:
        changed = True
        while changed and x.size > 1:
            changed = False
            for i in range(x.size):
                y = np.delete(x, i)
                for kk in dict.fromkeys((k, k - 1, min(k, y.size))):
                    if attempt(y, kk):
                        x, k, changed = y, kk, True
                        break
                if changed:
                    break
        return x, k

    x, k = drop_entries(x, k)
    finite = np.isfinite(x)
    if finite.any():
        ranks = np.unique(x[finite], return_inverse=True)[1].astype(np.float64)
        y = x.copy()
        y[finite] = ranks
        if not np.array_equal(y, x) and attempt(y, k):
            x = y
        else:
            top = float(np.max(x[finite]))
            for shift in (top, round(top)):
                y = np.where(finite, x - shift, x)
                if shift != 0 and attempt(y, k):
                    x = y
                    break
    for decimals in (0, 1, 2, 4):
        with np.errstate(invalid="ignore"):
            y = np.where(np.isfinite(x), np.round(x, decimals), x)
        if not np.array_equal(y, x) and attempt(y, k):
            x = y
            break
    for i in range(x.size):
        for decimals in (0, 1, 2):
            if not np.isfinite(x[i]):
                break
            y = x.copy()
            y[i] = np.round(y[i], decimals)
            if y[i] != x[i] and attempt(y, k):
                x = y
                break
    x, k = drop_entries(x, k)
    return x, k
