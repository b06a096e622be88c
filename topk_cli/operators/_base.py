"""The contract between the public API (``topk_cli.operators``) and each operator family.

Every family module exposes, per method, an :class:`Implementation`: three pure functions on
a 2-D float64 batch ``z`` of shape ``(B, n)`` that the public API has already validated,
shifted and scaled:

* ``z = (x - max_finite(x)) / tau`` row by row, so the largest finite entry of every row is 0
  (``z = x / tau``, not shifted, for an implementation declared ``centred=False``);
* masked entries (``x = -inf``) are ``-inf``; every other entry is finite and
  ``>= implementation.z_floor``; every row has at least ``k`` finite entries;
* ``k`` is what the implementation declared it takes (:attr:`Implementation.row_k`): a Python
  ``int`` with ``1 <= k <= #finite`` in every row (every implementation, when all rows share one
  integer k), or, for an implementation with ``row_k=True``, a ``(B,)`` float64 array holding one
  real ``k`` per row, ``0 < k[b] <= #finite entries of row b`` (an integer-only method gets
  integer values there). The API groups the rows of an implementation without ``row_k`` by their
  k (:func:`grouped_by_k`) so that it only ever sees one ``int``.

``forward(z, k)`` returns a :class:`Forward`; ``jacobian(fwd, z, k)`` returns ``dp/dz`` of shape
``(B, n, n)``; ``vjp(fwd, z, k, v)`` returns ``v^T dp/dz`` of shape ``(B, n)``. The public API
multiplies both by ``1/tau``. Masked entries have weight 0, complement 1, and zero rows and
columns in the Jacobian.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

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


#: ``k`` as an implementation receives it: one ``int`` for every row, or (``row_k`` implementations
#: only) a ``(B,)`` float64 array with one real k per row.
KArg = Union[int, FloatArray]
ForwardFn = Callable[[FloatArray, Any], Forward]
JacobianFn = Callable[[Forward, FloatArray, Any], FloatArray]
VjpFn = Callable[[Forward, FloatArray, Any, FloatArray], FloatArray]
ForwardVjpFn = Callable[[FloatArray, Any, FloatArray], tuple[Forward, FloatArray]]
#: ``dk(fwd, z, k)``: ``dp/dk`` of every entry, shape ``(B, n)`` (0 on masked entries).
DkFn = Callable[[Forward, FloatArray, Any], FloatArray]
#: ``vjp_k(fwd, z, k, v)``: ``sum_i v_i dp_i/dk`` per row, ``(B,)`` (what ``dk`` gives, without forming it).
VjpKFn = Callable[[Forward, FloatArray, Any, FloatArray], FloatArray]
#: ``log_weights(fwd, z, k)``: ``(log p, log(1 - p))``, each ``(B, n)``, accurate where ``p`` or
#: ``1 - p`` is below the smallest normal float64 (``log p = -inf`` on masked entries).
LogWeightsFn = Callable[[Forward, FloatArray, Any], tuple[FloatArray, FloatArray]]
#: ``residual(rows)``: per entry of those rows, the rounding error ``lo`` of ``z`` (``z + lo`` is
#: ``(x - max x) / tau`` to about ``u^2`` relative; 0 where it cannot be computed exactly).
ResidualFn = Callable[[NDArray[np.intp]], FloatArray]
RefineFn = Callable[[Forward, FloatArray, Any, ResidualFn], Forward]


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
    ``takes_x``: the implementation receives the validated input rows themselves (``(B, n)`` float64,
    neither shifted nor scaled, masked entries ``-inf``) in place of ``z``, and ``tau`` as a keyword
    argument of ``forward``, ``jacobian`` and ``vjp`` (a float, or ``(B, 1)`` per row); its derivatives
    are with respect to ``x`` (the API divides nothing by ``tau``) and the API averages no ties: what
    it returns is what the caller gets (a user's own operator).
    ``refine(fwd, z, k, residual)``, when given, returns ``fwd`` recomputed on the rows where the
    rounding of ``z = (x - max x) / tau`` itself matters (scores far below the row maximum, where
    ``ulp(z)`` exceeds what ``x`` determines), using ``residual(rows)``, the rounding error of ``z``.
    ``centred``: True (the default) when the implementation receives ``z = (x - max x) / tau`` (largest
    finite entry 0), which makes every such method shift-invariant; False when it receives ``z = x / tau``
    uncentred (a method defined on raw scores that a shift changes, e.g. ``scaled-sigmoid``): every
    other rule above holds (``z_floor`` bounds that ``z``, derivatives are with respect to it, the API
    divides them by ``tau``, and ``dz/dtau = -z / tau`` still gives the derivative with respect to tau).
    """

    forward: ForwardFn
    jacobian: JacobianFn
    vjp: VjpFn
    elementwise: bool = False
    z_floor: float = Z_FLOOR
    forward_vjp: ForwardVjpFn | None = None
    refine: RefineFn | None = None
    max_row_work: float | None = None
    row_k: bool = False
    dk: DkFn | None = None
    vjp_k: VjpKFn | None = None
    log_weights: LogWeightsFn | None = None
    takes_x: bool = False
    centred: bool = True


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


@dataclass
class GroupedForward(Forward):
    """The forward pass of an implementation without ``row_k`` on a batch whose rows have
    different k: ``p``, ``q`` and the diagnosis of the whole batch, and ``parts``, one
    ``(rows, k, fwd)`` per distinct k, whose ``fwd`` the derivatives of that group use."""

    parts: list[tuple[NDArray[np.intp], int, Forward]] = field(default_factory=list)
    #: ``p`` and ``q`` as merged from the parts (the API replaces ``p``/``q`` when it averages ties)
    merged: tuple[FloatArray, FloatArray] | None = field(default=None, repr=False)


def _k_groups(k: FloatArray) -> list[tuple[NDArray[np.intp], int]]:
    values, inverse = np.unique(k, return_inverse=True)
    return [(np.flatnonzero(inverse == g), int(v)) for g, v in enumerate(values)]


def _merged(bsz: int, parts: list[tuple[NDArray[np.intp], int, Forward]]) -> GroupedForward:
    """One forward for ``bsz`` rows from the forwards of disjoint row groups (``aux`` stays per part:
    its arrays may be shaped by k)."""
    first = parts[0][2]
    out = GroupedForward(p=np.zeros((bsz, *first.p.shape[1:])), q=np.zeros((bsz, *first.q.shape[1:])), parts=parts)
    failed = any(fwd.code is not None for _, _, fwd in parts)
    code = np.full(bsz, OK, dtype="<U16")
    level = np.full(bsz, -1, dtype=np.int64)
    value = np.full(bsz, np.nan)
    elementwise = np.zeros(bsz, dtype=bool)
    shared = set.intersection(*(set(fwd.aux) for _, _, fwd in parts))
    for rows, _, fwd in parts:
        out.p[rows], out.q[rows] = fwd.p, fwd.q
        code[rows] = fwd.codes()
        level[rows] = -1 if fwd.level is None else fwd.level
        value[rows] = np.nan if fwd.value is None else fwd.value
        elementwise[rows] = False if fwd.elementwise_rows is None else fwd.elementwise_rows
        out.messages.update({int(rows[b]): msg for b, msg in fwd.messages.items()})
    # per-entry aux of the same shape in every part (e.g. a Monte-Carlo stderr) is merged too
    for name in shared:
        arrays = [fwd.aux[name] for _, _, fwd in parts]
        if all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
            merged = np.zeros((bsz, *arrays[0].shape[1:]), dtype=arrays[0].dtype)
            for (rows, _, _), a in zip(parts, arrays, strict=True):
                merged[rows] = a
            out.aux[name] = merged
    if failed:
        out.code, out.level, out.value = code, level, value
    if any(fwd.elementwise_rows is not None for _, _, fwd in parts):
        out.elementwise_rows = elementwise
    out.merged = (out.p, out.q)
    return out


def grouped_by_k(impl: Implementation) -> Implementation:
    """``impl`` (which takes one ``int`` k) as a ``row_k`` implementation: rows are grouped by
    their k (integer values), each group is computed by ``impl`` with that k, and the parts merged.
    Results are bitwise those of ``impl`` called on each group alone. Only the forward, the
    derivatives with respect to z and the fused forward+VJP are carried: an implementation with a
    ``dk``, ``vjp_k``, ``log_weights`` or ``refine`` hook takes a real k per row itself (``row_k``),
    which the registry checks."""
    if any(hook is not None for hook in (impl.dk, impl.vjp_k, impl.log_weights, impl.refine)):
        raise ValueError("grouped_by_k: an implementation with dk, vjp_k, log_weights or refine must be row_k")

    def part(fwd: Forward, rows: NDArray[np.intp], sub: Forward) -> Forward:
        # the API may have averaged p and q over ties on the merged forward: the parts see it
        assert isinstance(fwd, GroupedForward)
        if fwd.merged is None or fwd.p is not fwd.merged[0]:
            sub.p = fwd.p[rows]
        if fwd.merged is None or fwd.q is not fwd.merged[1]:
            sub.q = fwd.q[rows]
        return sub

    def forward(z: FloatArray, k: Any) -> Forward:
        if not isinstance(k, np.ndarray):
            return impl.forward(z, k)
        return _merged(z.shape[0], [(rows, kv, impl.forward(z[rows], kv)) for rows, kv in _k_groups(k)])

    def each(fwd: Forward, fn: Callable[[Forward, NDArray[np.intp], int], FloatArray], shape: tuple[int, ...]) -> FloatArray:
        assert isinstance(fwd, GroupedForward)
        out = np.zeros(shape)
        for rows, kv, sub in fwd.parts:
            out[rows] = fn(part(fwd, rows, sub), rows, kv)
        return out

    def jacobian(fwd: Forward, z: FloatArray, k: Any) -> FloatArray:
        if not isinstance(fwd, GroupedForward):
            return impl.jacobian(fwd, z, k)
        return each(fwd, lambda sub, rows, kv: impl.jacobian(sub, z[rows], kv), (*z.shape, z.shape[1]))

    def vjp(fwd: Forward, z: FloatArray, k: Any, v: FloatArray) -> FloatArray:
        if not isinstance(fwd, GroupedForward):
            return impl.vjp(fwd, z, k, v)
        return each(fwd, lambda sub, rows, kv: impl.vjp(sub, z[rows], kv, v[rows]), z.shape)

    forward_vjp = None
    if impl.forward_vjp is not None:
        inner_fused = impl.forward_vjp

        def forward_vjp_fn(z: FloatArray, k: Any, v: FloatArray) -> tuple[Forward, FloatArray]:
            if not isinstance(k, np.ndarray):
                return inner_fused(z, k, v)
            parts, out = [], np.zeros(z.shape)
            for rows, kv in _k_groups(k):
                sub, out[rows] = inner_fused(z[rows], kv, v[rows])
                parts.append((rows, kv, sub))
            return _merged(z.shape[0], parts), out

        forward_vjp = forward_vjp_fn
    return Implementation(
        forward=forward, jacobian=jacobian, vjp=vjp, elementwise=impl.elementwise, z_floor=impl.z_floor,
        forward_vjp=forward_vjp, max_row_work=impl.max_row_work, row_k=True, centred=impl.centred,
    )
