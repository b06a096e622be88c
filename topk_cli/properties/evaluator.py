"""The explicit evaluator of the property checks: memoised single-vector evaluations.

Several checks look at the same case (the base vector of range, sum, monotonicity, ...), so an
:class:`Evaluator` remembers every row it computed, batching the vectors of equal ``(n, k, tau)``
into one API call. One evaluator lives as long as one ``verify_properties`` run (or one
``check_*`` call made without one): there is no module-level state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from topk_cli.api import evaluate, get_method
from topk_cli.errors import RowFailure
from topk_cli.operators._base import FloatArray
from topk_cli.operators.hard import hard_topk_weights
from topk_cli.properties.results import _Measure
from topk_cli.registry import MONTE_CARLO_STDERRS


@dataclass(frozen=True)
class _Row:
    """One evaluated row, shaped like a one-row :class:`~topk_cli.api.TopKResult`."""

    weights: FloatArray  # (1, n)
    complement: FloatArray  # (1, n)
    failures: tuple[RowFailure, ...]
    stderr: FloatArray | None = None  # (1, n), Monte-Carlo methods only


_Key = tuple[str, bytes, int, Any, float]  # k: an int, or a non-integer real k
_T = TypeVar("_T")


class Evaluator:
    """Evaluates methods on single vectors and remembers the rows (at most ``limit`` of them).

    ``slack(method, row)`` is what a Monte-Carlo method is allowed on a difference of weights:
    :data:`~topk_cli.registry.MONTE_CARLO_STDERRS` times its largest standard error on the row
    (0 for exact methods).
    """

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._rows: dict[_Key, _Row] = {}
        self._memo: dict[Hashable, Any] = {}

    @staticmethod
    def _key(method: str, x: FloatArray, k: int | float, tau: float) -> _Key:
        if x.dtype != np.float64:
            x = x.astype(np.float64)
        return (method, x.tobytes(), x.shape[-1], k, float(tau))  # tobytes: C order, for any strides

    def prefetch(self, method: str, items: Sequence[tuple[FloatArray, Any, float]]) -> None:
        """Evaluate many single vectors in batches of equal (n, k, tau): one API call per batch."""
        if len(self._rows) > self.limit:
            self._rows.clear()
        groups: dict[tuple[int, Any, float], dict[_Key, FloatArray]] = {}
        for x, k, tau in items:
            key = self._key(method, x, k, tau)
            if key not in self._rows:
                groups.setdefault((x.shape[-1], k, float(tau)), {})[key] = x
        for (_, k, tau), rows in groups.items():
            batch = np.vstack(list(rows.values()))
            r = evaluate(batch, k, method, tau=tau)
            by_row = {f.row[0]: f for f in r.failures}
            weights = np.asarray(r.weights, dtype=np.float64)
            stderr = None if r.stderr is None else np.asarray(r.stderr, dtype=np.float64)
            for i, key in enumerate(rows):
                failure = (by_row[i],) if i in by_row else ()
                se = None if stderr is None else stderr[i : i + 1]
                self._rows[key] = _Row(weights[i : i + 1], r.complement[i : i + 1], failure, se)

    def row(self, method: str, x: FloatArray, k: int | float, tau: float) -> _Row:
        """The (memoised) evaluation of ``method`` on the single vector ``x``."""
        key = self._key(method, x, k, tau)
        if key not in self._rows:
            self.prefetch(method, [(x, k, tau)])
        return self._rows[key]

    def memo(self, fn: Callable[[FloatArray, Any, float], _T], x: FloatArray, k: int | float, tau: float) -> _T:
        """``fn(x, k, tau)``, computed once for equal ``(fn, x, k, tau)``.

        For the pure, method-independent geometry of a case that both a check's prefetch list and
        its violation need (ordered pairs, the gap at the k-th value). The result is shared:
        callers must not modify it.
        """
        key = (fn, *self._key("", x, k, tau)[1:])
        if key not in self._memo:
            if len(self._memo) > self.limit:
                self._memo.clear()
            self._memo[key] = fn(x, k, tau)
        return self._memo[key]

    def cached(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, computed once per ``key`` (which must name everything it depends on,
        the method included) for as long as this evaluator lives. The result is shared."""
        if key not in self._memo:
            if len(self._memo) > self.limit:
                self._memo.clear()
            self._memo[key] = compute()
        return cast(_T, self._memo[key])

    def slack(self, method: str, *rows: _Row) -> float:
        """Allowance of a Monte-Carlo method on weights of ``rows`` (0 for an exact method)."""
        if not get_method(method).capabilities.monte_carlo:
            return 0.0
        errors = [float(np.nanmax(r.stderr)) for r in rows if r.stderr is not None and r.stderr.size]
        return MONTE_CARLO_STDERRS * max(errors, default=0.0)

    def clear(self) -> None:
        """Forget every row (and every memoised :meth:`memo` value)."""
        self._rows.clear()
        self._memo.clear()


def _z(x: FloatArray, tau: float) -> FloatArray:
    """The scaled scores the API computes: ``(x - max finite x) / tau``."""
    finite = np.isfinite(x)
    if finite.all():  # the common case, same values as below without the masking
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return (x - x.max()) / tau
    top = np.max(x[finite]) if finite.any() else 0.0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # -inf stays -inf; huge spreads saturate
        return np.where(finite, (x - top) / tau, -np.inf)


def _hard(x: FloatArray, k: int | float) -> FloatArray:
    """``T_k(x)`` with ties at the k-th value sharing the remaining mass (a real k: 1 above the
    ``ceil(k)``-th largest value, the entries equal to it sharing ``k - #above``)."""
    return hard_topk_weights(x, k)


def _softmax(z: FloatArray) -> FloatArray:
    e = np.exp(z - np.max(z))
    return e / e.sum()


def _failed(r: _Row, tau: float) -> _Measure:
    f = r.failures[0]
    return _Measure(value=math.nan, failed=True, detail=f"the method failed ({f.code}): {f.detail}", tau=tau)
