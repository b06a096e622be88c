"""The contract between the public API (``topk_cli.operators``) and each operator family.

Every family module exposes, per method, an :class:`Implementation`: three pure functions on
a 2-D float64 batch ``z`` of shape ``(B, n)`` that the public API has already validated,
shifted and scaled:

* ``z = (x - max_finite(x)) / tau`` row by row, so the largest finite entry of every row is 0;
* masked entries (``x = -inf``) are ``-inf``; every other entry is finite and
  ``>= implementation.z_floor``; every row has at least ``k`` finite entries;
* ``1 <= k <= n`` is a Python ``int``.

``forward(z, k)`` returns a :class:`Forward`; ``jacobian(fwd, z, k)`` returns ``dp/dz`` of shape
``(B, n, n)``; ``vjp(fwd, z, k, v)`` returns ``v^T dp/dz`` of shape ``(B, n)``. The public API
multiplies both by ``1/tau``. Masked entries have weight 0, complement 1, and zero rows and
columns in the Jacobian.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

#: Lowest finite ``z`` an implementation accepts unless it declares its own ``z_floor``. The API
#: rejects a ``tau`` so small that ``(x - max x) / tau`` would go below the method's floor rather
#: than clip (clipping would merge distinct entries into ties and silently change the answer).
Z_FLOOR = -float(np.finfo(np.float64).max)

#: Status code of a row that was computed without failure.
OK = "ok"


@dataclass
class Forward:
    """Result of one forward pass on a ``(B, n)`` batch.

    ``p`` are the weights and ``q = 1 - p`` computed accurately (not by subtraction where
    ``p`` is close to 1). ``code[b]`` is :data:`OK` or a short failure code for row ``b``;
    ``level[b]`` a recursion level (-1 when not applicable), ``value[b]`` the offending
    quantity (NaN when not applicable) and ``messages[b]`` a sentence for failed rows.
    ``aux`` holds whatever the Jacobian and VJP need (thresholds, derivatives, tables).
    ``elementwise_rows[b]`` is True when row ``b``'s ``p`` and ``q`` are functions of ``z_i`` and
    row-level quantities only (as an elementwise :class:`Implementation` computes every row), so
    exactly equal entries already have bitwise-equal weights; the API averages ties only on the
    other rows (None: on every row, unless the implementation is elementwise).
    """

    p: FloatArray
    q: FloatArray
    code: NDArray[np.str_] | None = None
    level: NDArray[np.int64] | None = None
    value: FloatArray | None = None
    messages: dict[int, str] = field(default_factory=dict)
    aux: dict[str, FloatArray] = field(default_factory=dict)
    elementwise_rows: NDArray[np.bool_] | None = None

    def codes(self) -> NDArray[np.str_]:
        """Per-row status codes, all :data:`OK` when the method reported nothing."""
        if self.code is None:
            return np.full(self.p.shape[0], OK, dtype="<U16")
        return self.code


ForwardFn = Callable[[FloatArray, int], Forward]
JacobianFn = Callable[[Forward, FloatArray, int], FloatArray]
VjpFn = Callable[[Forward, FloatArray, int, FloatArray], FloatArray]
ForwardVjpFn = Callable[[FloatArray, int, FloatArray], tuple[Forward, FloatArray]]
#: ``residual(rows)``: per entry of those rows, the rounding error ``lo`` of ``z`` (``z + lo`` is
#: ``(x - max x) / tau`` to about ``u^2`` relative; 0 where it cannot be computed exactly).
ResidualFn = Callable[[NDArray[np.intp]], FloatArray]
RefineFn = Callable[[Forward, FloatArray, int, ResidualFn], Forward]


@dataclass(frozen=True)
class Implementation:
    """The numerical implementation of one method.

    ``elementwise`` is True when ``p_i`` is a function of ``z_i`` and row-level quantities only
    (threshold methods), so equal inputs give bitwise-equal outputs by construction. For the
    others the public API averages ``p`` over groups of exactly equal entries, removing
    rounding-level asymmetries that the order of summation would otherwise introduce.
    ``z_floor`` is the lowest finite ``z`` the implementation handles (e.g. a method summing up
    to k entries of ``z`` needs ``k * z_floor`` to stay finite).
    ``forward_vjp(z, k, v)``, when given, returns what ``forward(z, k)`` and then
    ``vjp(fwd, z, k, v)`` would (same per-row codes and messages) from one shared computation;
    the API uses it for the VJP of a method without parameters.
    ``max_row_work``: for a method whose cost grows as ``n k`` per row (``k`` sequential rounds over
    the row), the largest ``n k`` the API runs (a larger one is refused before any work, as it
    could not end in reasonable time); None: no limit.
    ``refine(fwd, z, k, residual)``, when given, returns ``fwd`` recomputed on the rows where the
    rounding of ``z = (x - max x) / tau`` itself matters (scores far below the row maximum, where
    ``ulp(z)`` exceeds what ``x`` determines), using ``residual(rows)``, the rounding error of ``z``.
    """

    forward: ForwardFn
    jacobian: JacobianFn
    vjp: VjpFn
    elementwise: bool = False
    z_floor: float = Z_FLOOR
    forward_vjp: ForwardVjpFn | None = None
    refine: RefineFn | None = None
    max_row_work: float | None = None


def _combine_rows(bsz: int, parts: list[tuple[NDArray[np.int64], Forward]]) -> Forward:
    """One :class:`Forward` for ``bsz`` rows from forwards computed on row subsets: ``parts`` are
    ``(rows, fwd)`` pairs, later parts overwriting earlier ones on shared rows. Every part must
    carry the same ``aux`` keys (arrays with the row as first axis)."""
    first = parts[0][1]

    def full(a: FloatArray) -> FloatArray:
        return np.zeros((bsz, *a.shape[1:]), dtype=a.dtype)

    out = Forward(p=full(first.p), q=full(first.q))
    out.aux = {name: full(val) for name, val in first.aux.items()}
    failed = any(fwd.code is not None for _, fwd in parts)
    elementwise = np.zeros(bsz, dtype=bool)  # a part that says nothing is averaged
    code = np.full(bsz, OK, dtype="<U16")
    level = np.full(bsz, -1, dtype=np.int64)
    value = np.full(bsz, np.nan)
    for rows, fwd in parts:
        out.p[rows], out.q[rows] = fwd.p, fwd.q
        for name, val in fwd.aux.items():
            out.aux[name][rows] = val
        code[rows] = fwd.codes()
        level[rows] = -1 if fwd.level is None else fwd.level
        value[rows] = np.nan if fwd.value is None else fwd.value
        elementwise[rows] = False if fwd.elementwise_rows is None else fwd.elementwise_rows
        for b in rows:
            out.messages.pop(int(b), None)
        out.messages.update({int(rows[b]): msg for b, msg in fwd.messages.items()})
    if failed:
        out.code, out.level, out.value = code, level, value
    if any(fwd.elementwise_rows is not None for _, fwd in parts):
        out.elementwise_rows = elementwise
    return out


def tie_groups(z: FloatArray) -> tuple[NDArray[np.intp], NDArray[np.bool_]]:
    """``(order, starts)`` of a ``(B, n)`` batch: the stable ascending order of each row and, per
    sorted position, whether it starts a group of exactly equal scores."""
    order = np.argsort(z, axis=-1, kind="stable")
    zs = np.take_along_axis(z, order, axis=-1)
    starts = np.ones(zs.shape, dtype=bool)
    starts[:, 1:] = zs[:, 1:] != zs[:, :-1]
    return order, starts


def average_ties(
    z: FloatArray, *arrays: FloatArray, rows: NDArray[np.int64] | None = None
) -> tuple[FloatArray, ...]:
    """Each array (``(B, n)``, or ``(B, n, C)`` column by column) with its entries replaced by
    their mean over the groups of exactly equal ``z`` in a row; the arrays themselves when no row
    has a tie. ``rows``: average these rows only (distinct indices), leaving the others as they are."""
    if rows is not None:
        if rows.size == z.shape[0]:  # every row, in order or not: the same as all of them
            return average_ties(z, *arrays)
        if not rows.size:
            return arrays
        subset = tuple(a[rows] for a in arrays)
        averaged = average_ties(z[rows], *subset)
        if all(new is old for new, old in zip(averaged, subset, strict=True)):  # no tie there
            return arrays
        out = tuple(a.copy() for a in arrays)
        for full, part in zip(out, averaged, strict=True):
            full[rows] = part
        return out
    order, starts = tie_groups(z)
    if starts.all():
        return arrays
    group = np.cumsum(starts.ravel()) - 1
    counts = np.bincount(group)

    def mean(a: FloatArray) -> FloatArray:
        sorted_a = np.take_along_axis(a, order, axis=-1).ravel()
        means = (np.bincount(group, weights=sorted_a) / counts)[group].reshape(z.shape)
        result = np.empty_like(a)
        np.put_along_axis(result, order, means, axis=-1)
        return result

    return tuple(mean(a) if a.ndim == 2 else np.stack([mean(a[:, :, c]) for c in range(a.shape[-1])], axis=-1)
                 for a in arrays)
