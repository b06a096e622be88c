"""The hard top-k ``T_k`` on any array-API namespace, as the numpy engine defines it
(:mod:`topk_cli.operators.hard`): with ``c = ceil(k)``, weight 1 above the c-th largest value and
the remaining mass ``k - #above`` shared equally by the entries equal to it (computed on
``z = (x - max x) / tau``, as the engine does). Piecewise constant in ``x`` and ``tau``; piecewise
linear in ``k``: ``dT_k/dk = 1 / #at`` on the at-group (from below at an integer k)."""

from __future__ import annotations

import math
from typing import Any

from topk_cli.xp._common import Array, index_dtype, sort_descending, take, top_entries


def hard_forward(xp: Any, z: Array, fin: Array, k: Array, k_max: float | None = None) -> tuple[Array, tuple[Array, ...]]:
    """``(p, (w,))`` with ``w = dp/dk``; ``k_max``: a bound on every row's ``k`` known without reading
    ``k`` (the cut is then among the ``ceil(k_max)`` largest: a partial selection), else ``None``."""
    n = z.shape[1]
    if k_max is not None and 4 * math.ceil(k_max) <= n:
        s, _ = top_entries(xp, z, math.ceil(k_max))
    else:
        s = sort_descending(xp, z)
    c = xp.astype(xp.clip(xp.ceil(k), 1, s.shape[1]), index_dtype(xp, z)) - 1
    cut = take(xp, s, c)
    above = fin & (z > cut[:, None])
    at = fin & (z == cut[:, None])
    n_above = xp.sum(xp.astype(above, z.dtype), axis=1)
    n_at = xp.sum(xp.astype(at, z.dtype), axis=1)
    zeros = xp.zeros_like(z)
    w = xp.where(at, xp.ones_like(z), zeros) / n_at[:, None]
    p = xp.where(above, xp.ones_like(z), (k - n_above)[:, None] * w)
    return p, (w,)


def hard_backward(xp: Any, residuals: tuple[Array, ...], g: Array) -> tuple[Array, Array, Array]:
    (w,) = residuals
    gk = xp.sum(w * g, axis=1)
    return xp.zeros_like(g), gk, xp.zeros_like(gk)
