"""The public API: ``soft_topk``, ``evaluate``, ``jacobian``, ``vjp``.

Axis convention: every function acts on the last axis of ``x``; leading axes are a batch and
are computed vectorised. ``x`` is divided by the temperature ``tau`` before the operator is
applied (``z = x / tau``), so small ``tau`` means harder selections and Jacobians carry the
factor ``1/tau``. float64 in gives float64 out; float32 in gives float32 out (computed in
float64, rounded once at the end); other real dtypes give float64.

``-inf`` entries are masked: they get weight exactly 0 and the rest is computed as if they were
absent. NaN and ``+inf`` are invalid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from topk_cli.errors import InvalidArgumentError, NumericalFailureError, RowFailure, UnknownMethodError
from topk_cli.operators._base import OK, FloatArray, Forward, Implementation
from topk_cli.operators.gradtopk import RecursionTrace, grad_recursive_trace
from topk_cli.registry import METHODS, MethodSpec

DEFAULT_METHOD = "thre-laplace"


@dataclass(frozen=True)
class TopKResult:
    """Weights of one method on one input, with a per-row diagnosis instead of exceptions.

    ``weights`` has the shape and float dtype of the input (rows that failed are NaN);
    ``complement`` is ``1 - weights`` computed accurately in float64 (it tells 1 - 1e-20 from
    1); ``status`` has the batch shape and holds ``"ok"`` or a failure code per row;
    ``failures`` describes each failed row.
    """

    method: str
    k: int
    tau: float
    weights: NDArray[Any]
    complement: FloatArray
    status: NDArray[np.str_]
    failures: tuple[RowFailure, ...]

    @property
    def ok(self) -> bool:
        """True when every row was computed without numerical failure."""
        return not self.failures


@dataclass(frozen=True)
class _Prepared:
    spec: MethodSpec
    z: FloatArray  # (B, n) shifted, scaled, clipped, -inf = masked
    k: int
    tau: float
    shape: tuple[int, ...]
    out_dtype: np.dtype[Any]


def get_method(method: str) -> MethodSpec:
    """The registered spec of ``method``; :class:`UnknownMethodError` lists the valid names."""
    if not isinstance(method, str) or method not in METHODS:
        valid = ", ".join(METHODS)
        raise UnknownMethodError(f"unknown method {method!r}; valid methods: {valid}")
    return METHODS[method]


def _check_k(k: object) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        if isinstance(k, (float, np.floating)) and float(k).is_integer():
            return int(k)
        raise InvalidArgumentError(f"k must be an integer, got {k!r}")
    return int(k)


def _check_tau(tau: object) -> float:
    if isinstance(tau, (bool, np.bool_)) or not isinstance(tau, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"tau must be a finite number > 0, got {tau!r}")
    value = float(tau)
    if not (np.isfinite(value) and value > 0):
        raise InvalidArgumentError(f"tau must be a finite number > 0, got {tau!r}")
    return value


def _as_real_array(x: ArrayLike, name: str = "x") -> NDArray[Any]:
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged nested lists, odd objects
        raise InvalidArgumentError(f"{name} must be an array of real numbers: {exc}") from None
    if arr.dtype.kind not in "fiub" or arr.dtype.kind == "b":
        raise InvalidArgumentError(
            f"{name} must hold real numbers (float32, float64 or integers), got dtype {arr.dtype}"
        )
    if arr.ndim == 0:
        raise InvalidArgumentError(f"{name} must have at least one axis (a vector), got a scalar")
    if arr.shape[-1] == 0:
        raise InvalidArgumentError(f"{name} must have at least one entry on the last axis, got shape {arr.shape}")
    return arr


def _row_index(flat: int, batch_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, batch_shape)) if batch_shape else ()


def _prepare(x: ArrayLike, k: object, method: str, tau: object) -> _Prepared:
    spec = get_method(method)
    arr = _as_real_array(x)
    k_int = _check_k(k)
    tau_f = _check_tau(tau)
    out_dtype = np.dtype(np.float32) if arr.dtype == np.float32 else np.dtype(np.float64)
    shape = arr.shape
    n = shape[-1]
    if not 1 <= k_int <= n:
        raise InvalidArgumentError(f"k must satisfy 1 <= k <= n (n={n}), got {k_int}")
    x2 = arr.astype(np.float64).reshape(-1, n)
    bad = np.isnan(x2) | (x2 == np.inf)
    if bad.any():
        flat = int(np.argmax(bad.any(axis=-1)))
        col = int(np.argmax(bad[flat]))
        where = _row_index(flat, shape[:-1])
        label = f"row {where}, entry {col}" if where else f"entry {col}"
        raise InvalidArgumentError(
            f"x must not contain NaN or +inf (use -inf to mask an entry); found {x2[flat, col]} at {label}"
        )
    finite = np.isfinite(x2)
    counts = finite.sum(axis=-1)
    if (counts < k_int).any():
        flat = int(np.argmax(counts < k_int))
        where = _row_index(flat, shape[:-1])
        label = f"row {where}" if where else "the vector"
        raise InvalidArgumentError(
            f"{label} has only {counts[flat]} unmasked entries (-inf = masked), fewer than k={k_int}"
        )
    top = np.max(np.where(finite, x2, -np.inf), axis=-1, keepdims=True)
    with np.errstate(over="ignore"):  # an overflow to -inf is caught just below
        z = (x2 - top) / tau_f
    floor = spec.implementation.z_floor
    if (finite & (z < floor)).any():
        spread = float(np.max(np.where(finite, top - x2, 0.0)))
        raise InvalidArgumentError(
            f"tau={tau_f:g} is too small for the spread of x ({spread:g}): (x - max x) / tau goes below "
            f"{floor:g}, the lowest value method {spec.name!r} supports; use tau >= {spread / -floor:.3g}"
        )
    z = np.where(finite, z, -np.inf)
    return _Prepared(spec=spec, z=z, k=k_int, tau=tau_f, shape=shape, out_dtype=out_dtype)


def scaled_scores(x: ArrayLike, k: int, *, tau: float = 1.0) -> FloatArray:
    """The scores every operator sees: ``z = (x - max x) / tau`` row by row, as a ``(B, n)`` batch.

    Validates ``x``, ``k`` and ``tau`` exactly as :func:`soft_topk` does; masked entries stay
    ``-inf``; rows are flattened row-major. For analyses that work on the operators' input.

    >>> scaled_scores([[1.0, 3.0, -np.inf]], 1, tau=0.5).tolist()
    [[-4.0, 0.0, -inf]]
    """
    return _prepare(x, k, "hard", tau).z


def _average_ties(z: FloatArray, *arrays: FloatArray) -> tuple[FloatArray, ...]:
    """Replace each array's entries by their mean over groups of exactly equal ``z`` in a row."""
    order = np.argsort(z, axis=-1, kind="stable")
    zs = np.take_along_axis(z, order, axis=-1)
    starts = np.ones(zs.shape, dtype=bool)
    starts[:, 1:] = zs[:, 1:] != zs[:, :-1]
    if starts.all():
        return arrays
    group = np.cumsum(starts.ravel()) - 1
    counts = np.bincount(group)
    out = []
    for a in arrays:
        sorted_a = np.take_along_axis(a, order, axis=-1).ravel()
        means = (np.bincount(group, weights=sorted_a) / counts)[group].reshape(z.shape)
        result = np.empty_like(a)
        np.put_along_axis(result, order, means, axis=-1)
        out.append(result)
    return tuple(out)


def _forward(prep: _Prepared) -> tuple[Forward, tuple[RowFailure, ...]]:
    impl: Implementation = prep.spec.implementation
    with np.errstate(all="ignore"):  # failures are detected and reported per row below
        fwd = impl.forward(prep.z, prep.k)
    codes = fwd.codes().copy()
    nonfinite = ~np.isfinite(fwd.p).all(axis=-1) & (codes == OK)
    codes[nonfinite] = "nan"
    failures = []
    batch_shape = prep.shape[:-1]
    for b in np.flatnonzero(codes != OK):
        level = int(fwd.level[b]) if fwd.level is not None and fwd.level[b] >= 0 else None
        value = float(fwd.value[b]) if fwd.value is not None and np.isfinite(fwd.value[b]) else None
        detail = fwd.messages.get(int(b), "the result is not finite")
        failures.append(
            RowFailure(
                method=prep.spec.name, row=_row_index(int(b), batch_shape), code=str(codes[b]),
                detail=detail, level=level, value=value,
            )
        )
    fwd.code = codes
    if not impl.elementwise:
        fwd.p, fwd.q = _average_ties(prep.z, fwd.p, fwd.q)
    return fwd, tuple(failures)


def evaluate(x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0) -> TopKResult:
    """Compute ``method`` on ``x`` and diagnose every row instead of raising on failure.

    Same arguments as :func:`soft_topk`. Rows with status other than ``"ok"`` hold NaN.

    Raises:
        InvalidArgumentError: bad ``x``, ``k``, ``tau`` or ``method`` (a ``ValueError``).

    >>> r = evaluate([0.0, 50.0, 100.0], 2, "grad-recursive", tau=0.01)
    >>> r.ok, r.failures[0].code
    (False, 'log0')
    """
    prep = _prepare(x, k, method, tau)
    fwd, failures = _forward(prep)
    failed = fwd.codes() != OK
    p = np.where(failed[:, None], np.nan, fwd.p)
    q = np.where(failed[:, None], np.nan, fwd.q)
    return TopKResult(
        method=prep.spec.name, k=prep.k, tau=prep.tau,
        weights=p.reshape(prep.shape).astype(prep.out_dtype),
        complement=q.reshape(prep.shape),
        status=fwd.codes().reshape(prep.shape[:-1]),
        failures=failures,
    )


def soft_topk(x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0) -> NDArray[Any]:
    """Smooth top-k weights of ``x / tau`` along the last axis.

    Returns ``p`` of the shape of ``x``: for the exact methods, entries in [0, 1] summing to
    ``k`` that tend to the k-hot indicator of the k largest entries as ``tau -> 0``.

    Args:
        x: scores ``[..., n]``; ``-inf`` masks an entry (weight 0).
        k: how many entries to select, ``1 <= k <= n``.
        method: a name from ``METHODS`` (``softtopk methods`` lists them).
        tau: temperature > 0.

    Raises:
        InvalidArgumentError: bad arguments (a ``ValueError``).
        NumericalFailureError: the method failed on some row (an ``ArithmeticError``);
            :func:`evaluate` gives the same diagnosis without raising.

    >>> soft_topk([1.0, 2.0, 3.0], 2, "thre-exp").round(4)
    array([0.2689, 0.7311, 1.    ])
    """
    result = evaluate(x, k, method, tau=tau)
    if result.failures:
        raise NumericalFailureError(result.failures)
    return result.weights


def _checked_forward(prep: _Prepared) -> Forward:
    fwd, failures = _forward(prep)
    if failures:
        raise NumericalFailureError(failures)
    return fwd


def jacobian(x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0) -> NDArray[Any]:
    """Jacobian ``d p / d x`` of :func:`soft_topk`, shape ``[..., n, n]`` (includes ``1/tau``).

    ``J[..., i, j] = d p_i / d x_j``. Masked entries have zero rows and columns.

    Raises:
        InvalidArgumentError, NumericalFailureError: as :func:`soft_topk`.

    >>> jacobian([0.0, 0.0], 1, "thre-sigmoid")
    array([[ 0.125, -0.125],
           [-0.125,  0.125]])
    """
    prep = _prepare(x, k, method, tau)
    n = prep.shape[-1]
    if prep.z.shape[0] == 0:  # an empty batch has an empty Jacobian, whatever the method
        return np.zeros((*prep.shape, n), dtype=prep.out_dtype)
    fwd = _checked_forward(prep)
    with np.errstate(all="ignore"):
        jac = prep.spec.implementation.jacobian(fwd, prep.z, prep.k) / prep.tau
    return jac.reshape((*prep.shape, n)).astype(prep.out_dtype)


def vjp(x: ArrayLike, k: int, v: ArrayLike, method: str = DEFAULT_METHOD, *, tau: float = 1.0) -> NDArray[Any]:
    """Vector-Jacobian product ``v^T (d p / d x)`` without forming the Jacobian.

    ``v`` has the shape of ``x``; the result too. O(n) per row for threshold methods.

    Raises:
        InvalidArgumentError, NumericalFailureError: as :func:`soft_topk`.

    >>> vjp([0.0, 0.0], 1, [1.0, 0.0], "thre-sigmoid")
    array([ 0.125, -0.125])
    """
    prep = _prepare(x, k, method, tau)
    v_arr = _as_real_array(v, "v")
    if v_arr.shape != prep.shape:
        raise InvalidArgumentError(f"v must have the shape of x {prep.shape}, got {v_arr.shape}")
    v2 = v_arr.astype(np.float64).reshape(prep.z.shape)
    if not np.isfinite(v2).all():
        raise InvalidArgumentError("v must be finite (no NaN or inf)")
    if prep.z.shape[0] == 0:  # an empty batch has an empty product, whatever the method
        return np.zeros(prep.shape, dtype=prep.out_dtype)
    fwd = _checked_forward(prep)
    with np.errstate(all="ignore"):
        out = prep.spec.implementation.vjp(fwd, prep.z, prep.k, v2) / prep.tau
    return out.reshape(prep.shape).astype(prep.out_dtype)


def trace_grad_recursive(x: ArrayLike, k: int, *, tau: float = 1.0) -> RecursionTrace:
    """Trace the article's GradTopK recursion on ``x / tau`` row by row (no exception).

    Returns per-row arrays (flattened batch, row-major) with the level where the log argument
    first reached zero or went negative, its value, the value just before, and the digits lost
    to cancellation on the way. Used by ``stability-probe`` and by ``compute`` warnings.

    Raises:
        InvalidArgumentError: bad ``x``, ``k`` or ``tau``.
    """
    prep = _prepare(x, k, "grad-recursive", tau)
    with np.errstate(all="ignore"):  # the trace records log(0) and log(<0) instead of warning
        return grad_recursive_trace(prep.z, prep.k)
