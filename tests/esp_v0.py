"""Verbatim copy of the GradTopK reference tables, weights and recursion outlook as they were
before positions whose weight rounds to 0 were skipped: the new code must give these bits."""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from topk_cli.operators._base import FloatArray
from topk_cli.operators._logspace import logsumexp
from topk_cli.recursion import _LOG_U, RecursionOutlook
from topk_cli.references import EspTables


def esp_tables(z: FloatArray, kmax: int, prefix_len: int) -> EspTables:
    order = np.argsort(-z, axis=-1, kind="stable")
    s = np.take_along_axis(z, order, axis=-1).astype(np.longdouble)
    rows, n = s.shape
    empty = np.full((rows, kmax + 1), -np.inf, dtype=np.longdouble)
    empty[:, 0] = 0.0
    suffix = np.empty((n + 1, rows, kmax + 1), dtype=np.longdouble)
    suffix[n] = empty
    for i in range(n - 1, -1, -1):
        suffix[i, :, 0] = 0.0
        suffix[i, :, 1:] = np.logaddexp(suffix[i + 1, :, 1:], s[:, i, None] + suffix[i + 1, :, :-1])
    prefix = np.empty((prefix_len + 1, rows, kmax + 1), dtype=np.longdouble)
    prefix[0] = empty
    for i in range(prefix_len):
        prefix[i + 1, :, 0] = 0.0
        prefix[i + 1, :, 1:] = np.logaddexp(prefix[i, :, 1:], s[:, i, None] + prefix[i, :, :-1])
    return EspTables(s=s, order=order, prefix=prefix, suffix=suffix, total=suffix[0])


def esp_weights(tab: EspTables, k: int) -> FloatArray:
    if k in tab.memo:
        return tab.memo[k]
    rows, n = tab.s.shape
    if k == n:
        return tab.memo.setdefault(k, np.ones((rows, n)))
    terms = cast(FloatArray, tab.prefix[:n, :, :k] + tab.suffix[1:, :, k - 1 :: -1])
    loo = logsumexp(terms, axis=-1, buf=terms)
    with np.errstate(invalid="ignore"):
        p_sorted = np.exp(tab.s + loo.T - tab.total[:, k, None]).astype(np.float64)
    p = np.empty_like(p_sorted)
    np.put_along_axis(p, tab.order, np.minimum(p_sorted, 1.0), axis=-1)
    return tab.memo.setdefault(k, p)


def _loo(prefix: FloatArray, suffix: FloatArray, degree: int) -> FloatArray:
    out = np.empty((*prefix.shape[:2], degree + 1))
    for j in range(degree + 1):
        out[..., j] = logsumexp(prefix[..., : j + 1] + suffix[..., j::-1], axis=-1)
    return out


def outlook_from_tables(tab: EspTables, k: int) -> RecursionOutlook:
    rows, n = tab.s.shape
    pred = np.full(rows, -1, dtype=np.int64)
    sat = np.full(rows, -1, dtype=np.int64)
    if k == 1:
        return RecursionOutlook(pred, sat, np.ones(rows), np.zeros(rows))
    m = min(n, 2 * k, tab.prefix.shape[0] - 1)
    loo = _loo(tab.prefix[:m].astype(np.float64), tab.suffix[1 : m + 1].astype(np.float64), k - 1)
    levels = np.arange(1, k)
    with np.errstate(invalid="ignore"):
        log_c = loo[:, :, 1:] - tab.total[None, :, 1:k]
        log_p = tab.s.T[:m, :, None].astype(np.float64) + loo[:, :, :-1] - tab.total[None, :, 1:k]
    finite = np.isfinite(tab.s.T[:m])[:, :, None]
    log_c = np.where(finite, np.minimum(log_c, 0.0), 0.0)
    log_p = np.where(finite, np.minimum(log_p, 0.0), -np.inf)
    log_r = np.full(log_c.shape[:2], -np.inf)
    worst = np.full(rows, -np.inf)
    for idx, _ in enumerate(levels):
        log_r = np.logaddexp(log_p[:, :, idx] - log_c[:, :, idx] + log_r, -log_c[:, :, idx])
        top = np.max(log_r, axis=0)
        worst = np.maximum(worst, top)
        breaks = (pred < 0) & (top + _LOG_U >= 0)
        pred[breaks] = idx + 2
        saturates = (sat < 0) & (np.min(log_c[:, :, idx], axis=0) < _LOG_U)
        sat[saturates] = idx + 2
    min_c = np.exp(np.min(log_c[:, :, -1], axis=0)).astype(np.float64)
    digits = np.maximum(worst / math.log(10.0), 0.0).astype(np.float64)
    return RecursionOutlook(pred, sat, min_c, digits)
