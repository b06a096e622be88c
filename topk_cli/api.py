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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NoReturn, Union, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from topk_cli.errors import InvalidArgumentError, NumericalFailureError, RowFailure
from topk_cli.operators._base import (
    OK,
    DkFn,
    FloatArray,
    Forward,
    GroupedForward,
    Implementation,
    KArg,
    average_ties,
    grouped_by_k,
)
from topk_cli.operators.grad_recursive import RecursionTrace, grad_recursive_trace
from topk_cli.registry import BASELINE_METHOD, DEFAULT_METHOD, METHODS, MethodSpec, check_alias_k, resolve

#: What ``method=`` takes: a registered name or alias, ``FILE.py:FUNCTION``, ``package.module:FUNCTION``
#: or a callable ``fn(x, k, tau)`` (a user's operator).
MethodArg = Union[str, Callable[..., Any]]


@dataclass(frozen=True)
class TopKResult:
    """Weights of one method on one input, with a per-row diagnosis instead of exceptions.

    ``weights`` has the shape and float dtype of the input (rows that failed are NaN);
    ``complement`` is ``1 - weights`` computed accurately in float64 (it tells 1 - 1e-20 from
    1); ``status`` has the batch shape and holds ``"ok"`` or a failure code per row;
    ``failures`` describes each failed row. ``stderr`` holds the standard error of each weight
    for a Monte-Carlo method (None for exact ones); ``params`` the method's parameters used.
    ``k`` and ``tau`` are the scalars used when every row had the same one (``k`` an ``int`` when
    integer), else arrays of the batch shape with each row's value. ``log_weights`` and
    ``log_complement`` (``log p`` and ``log(1 - p)``, accurate where ``p`` or ``1 - p`` underflows)
    are filled when :func:`evaluate` is asked for them (``logs=True``), else None.
    """

    method: str
    k: int | float | FloatArray
    tau: float | FloatArray
    weights: NDArray[Any]
    complement: FloatArray
    status: NDArray[np.str_]
    failures: tuple[RowFailure, ...]
    stderr: FloatArray | None = None
    params: Mapping[str, int | float] = field(default_factory=dict)
    log_weights: NDArray[Any] | None = None
    log_complement: NDArray[Any] | None = None

    @property
    def ok(self) -> bool:
        """True when every row was computed without numerical failure."""
        return not self.failures


@dataclass(frozen=True)
class _Prepared:
    spec: MethodSpec
    impl: Implementation  # the spec's implementation with its parameters bound (grouped by k if needed)
    params: Mapping[str, int | float]
    z: FloatArray  # (B, n) shifted, scaled, clipped, -inf = masked
    k: KArg  # as the implementation takes it: one int, or (B,) real k per row
    tau: float | FloatArray  # one float, or (B, 1) per row
    shape: tuple[int, ...]  # the batch shape (axis moved last) + (n,)
    out_dtype: np.dtype[Any]
    x2: FloatArray | None = None  # the input as float64 rows (read only), for z's residual
    top: FloatArray | None = None  # its row maxima (B, 1)
    k_rows: FloatArray | None = None  # (B,) k of every row
    k_out: int | float | FloatArray = 0  # k as results report it (scalar when uniform)
    tau_out: float | FloatArray = 1.0  # tau as results report it
    axis: int | None = None  # the axis of x selected along, when not the last one

    def rows_k(self) -> FloatArray:
        """``k`` of every row, ``(B,)`` float64."""
        if self.k_rows is not None:
            return self.k_rows
        return np.full(self.z.shape[0], float(cast(int, self.k)))

    def rows_tau(self) -> FloatArray:
        """``tau`` of every row, ``(B,)`` float64."""
        return np.broadcast_to(np.asarray(self.tau, dtype=np.float64).reshape(-1), (self.z.shape[0],))

    def restore(self, a: NDArray[Any]) -> NDArray[Any]:
        """``a`` (shaped like the moved input) with the selected axis put back where it was."""
        return a if self.axis is None else np.moveaxis(a, -1, self.axis)


def get_method(method: object) -> MethodSpec:
    """The spec of ``method``: a registered name or alias (``lapsum``), or a user's operator
    (``FILE.py:FUNCTION``, ``package.module:FUNCTION``, a callable; see :func:`topk_cli.registry.resolve`).

    Raises:
        UnknownMethodError: the message suggests the closest name and lists the valid ones.
        UserOperatorError: a user's operator that cannot be loaded (one line, ``FILE:LINE: ...``).
    """
    return resolve(method)


def check_k(k: object, n: int | None = None, *, name: str = "k") -> int:
    """``k`` as an ``int`` after checking ``1 <= k <= n`` (``n=None``: only ``k >= 1``): the check of
    an integer ``k`` in the package (CLI, properties, sweeps), with one wording. ``name`` is how
    the caller spells it (``"-k"`` on the command line). Integral floats are accepted.

    Raises:
        InvalidArgumentError: ``k must be an integer, got 2.5`` or
            ``k must satisfy 1 <= k <= n (n=5), got 7``.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        if isinstance(k, (float, np.floating)) and float(k).is_integer():
            k = int(k)
        else:
            raise InvalidArgumentError(f"{name} must be an integer, got {k!r}")
    value = int(cast(Any, k))
    if value < 1 or (n is not None and value > n):
        bound = f" <= n (n={n})" if n is not None else " <= n"
        raise InvalidArgumentError(f"{name} must satisfy 1 <= k{bound}, got {value}")
    return value


def check_real_k(k: object, n: int | None = None, *, name: str = "k") -> float:
    """``k`` as a ``float`` after checking ``0 < k <= n`` (``n=None``: only ``k > 0``): the check of a
    real ``k`` (methods that take one), with the wording of :func:`check_k`.

    Raises:
        InvalidArgumentError: ``k must be a real number, got 'a'`` or
            ``k must satisfy 0 < k <= n (n=5), got 7.5``.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name} must be a real number, got {k!r}")
    value = float(k)
    if not (np.isfinite(value) and value > 0 and (n is None or value <= n)):
        bound = f" <= n (n={n})" if n is not None else " <= n"
        raise InvalidArgumentError(f"{name} must satisfy 0 < k{bound}, got {_number(value)}")
    return value


def _is_scalar(value: object) -> bool:
    """True for a Python or numpy scalar (or anything that is not an array or a sequence)."""
    if isinstance(value, np.ndarray):
        return False
    try:
        return bool(np.ndim(cast(Any, value)) == 0)
    except ValueError:  # a ragged nested sequence: an array-like, refused by the array checks
        return False


def _number(value: float) -> str:
    return str(int(value)) if np.isfinite(value) and float(value).is_integer() else repr(float(value))


def real_k_methods() -> tuple[str, ...]:
    """The registered methods that take a real k (and a k per row), in registry order."""
    return tuple(name for name, spec in METHODS.items() if not spec.capabilities.integer_k)


def _integer_only(spec: MethodSpec, shown: object) -> NoReturn:
    raise InvalidArgumentError(
        f"k must be an integer for method {spec.name!r} (defined for integer k only), got {shown!r}; "
        f"methods that take a real k: {', '.join(real_k_methods())}"
    )


def _per_row(value: object, name: str, batch_shape: tuple[int, ...]) -> FloatArray:
    """An array-like ``value`` (``k`` or ``tau``) as float64 with one entry per row, ``(B,)``, after
    broadcasting it to ``batch_shape`` (a trailing axis of length 1 is dropped: ``k[..., None]``
    beside ``x``); the range is the caller's to check."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nested lists, odd objects
        raise InvalidArgumentError(f"{name} must be a number or an array of numbers: {exc}") from None
    if arr.dtype.kind not in "iuf":
        raise InvalidArgumentError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim == len(batch_shape) + 1 and arr.shape[-1] == 1:  # kept dims
        arr = arr[..., 0]
    try:
        return np.broadcast_to(arr.astype(np.float64), batch_shape).reshape(-1)
    except ValueError:
        raise InvalidArgumentError(
            f"{name} of shape {arr.shape} does not broadcast to the batch shape {batch_shape} "
            "(x without its selected axis)"
        ) from None


def _k_plan(
    k: object, spec: MethodSpec, batch_shape: tuple[int, ...], n: int
) -> tuple[KArg, FloatArray | None, int | float | FloatArray]:
    """``(k for the implementation, (B,) k per row or None, k as results report it)`` after
    checking ``k`` (a number, or an array broadcastable to ``batch_shape``) against the method:
    an integer-only method takes ``1 <= k <= n``, the others ``0 < k <= n`` (rows' masks are
    checked by the caller)."""
    integer = spec.capabilities.integer_k
    if _is_scalar(k):  # a Python or numpy scalar (or junk)
        if integer:
            if isinstance(k, (float, np.floating)) and np.isfinite(k) and not float(k).is_integer():
                _integer_only(spec, k)
            return (value := check_k(k, n)), None, value
        real = check_real_k(k, n)
        if real.is_integer():
            return int(real), None, int(real)
        filled = np.full(int(np.prod(batch_shape)), real)
        return filled, filled, real
    rows = _per_row(k, "k", batch_shape)
    bad = ~np.isfinite(rows) | (rows > n) | ((rows < 1) if integer else (rows <= 0))
    if bad.any():
        flat = int(np.argmax(bad))
        shown = _number(float(rows[flat]))
        low = "1 <= k" if integer else "0 < k"
        raise InvalidArgumentError(
            f"k must satisfy {low} <= n (n={n}) in every row, got {shown} at row {_row_index(flat, batch_shape)}"
        )
    if integer and not (whole := rows == np.floor(rows)).all():
        _integer_only(spec, float(rows[int(np.argmin(whole))]))
    uniform = rows.size > 0 and bool((rows == rows[0]).all())
    if uniform and float(rows[0]).is_integer():
        return int(rows[0]), None, int(rows[0])
    if rows.size == 0:
        return (np.zeros(0) if not integer else 1), rows, np.zeros(batch_shape)
    out: int | float | FloatArray = float(rows[0]) if uniform else rows.reshape(batch_shape).copy()
    return rows, rows, out


def check_tau(tau: object, *, name: str = "tau") -> float:
    """``tau`` as a ``float`` after checking it is a finite number ``> 0``: the one check of a
    temperature in the package, with one wording (``tau must be a finite number > 0, got 0.0``)."""
    if isinstance(tau, (bool, np.bool_)) or not isinstance(tau, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name} must be a finite number > 0, got {tau!r}")
    value = float(tau)
    if not (np.isfinite(value) and value > 0):
        raise InvalidArgumentError(f"{name} must be a finite number > 0, got {tau!r}")
    return value


def _tau_plan(tau: object, batch_shape: tuple[int, ...]) -> tuple[float | FloatArray, float | FloatArray]:
    """``(tau for the computation: a float or (B, 1) per row, tau as results report it)``."""
    if _is_scalar(tau):
        value = check_tau(tau)
        return value, value
    rows = _per_row(tau, "tau", batch_shape)
    bad = ~(np.isfinite(rows) & (rows > 0))
    if bad.any():
        flat = int(np.argmax(bad))
        raise InvalidArgumentError(
            f"tau must be a finite number > 0 in every row, got {float(rows[flat])!r} at row {_row_index(flat, batch_shape)}"
        )
    if rows.size and bool((rows == rows[0]).all()):
        return float(rows[0]), float(rows[0])
    return rows.reshape(-1, 1).copy(), rows.reshape(batch_shape).copy()


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


DBL_MAX = float(np.finfo(np.float64).max)


def _raise_below_floor(x2: FloatArray, top: FloatArray, tau_f: float, floor: float, name: str) -> NoReturn:
    finite = np.isfinite(x2)
    with np.errstate(over="ignore"):  # a spread beyond float64 is inf: reported as such below
        spread = float(np.max(np.where(finite, top - x2, 0.0)))
    if not np.isfinite(spread):
        # halves of finite float64 values never overflow: the spread's true size, and the factor
        # that brings it within float64 at this tau
        half = float(np.max(np.where(finite, top / 2 - x2 / 2, 0.0)))
        with np.errstate(over="ignore"):
            factor = 2.0 * (half / -floor) / tau_f
        raise InvalidArgumentError(
            f"the spread of x overflows float64 (max x - min x = {_twice(half)} > {DBL_MAX:.6g}); "
            f"rescale the scores: divide x by at least {_round_up(factor)} to use tau={tau_f:g} with method {name!r}"
        )
    raise InvalidArgumentError(
        f"tau={tau_f:g} is too small for the spread of x ({spread:g}): (x - max x) / tau goes below "
        f"{floor:g}, the lowest value method {name!r} supports; use tau >= {_round_up(spread / -floor)}"
    )


def _twice(half: float) -> str:
    """``2 * half`` printed with 3 significant digits, also where it overflows float64."""
    exponent = int(np.floor(np.log10(half) + np.log10(2.0)))
    return f"{half / 10.0**exponent * 2:.3g}e+{exponent}"


def _round_up(value: float) -> str:
    """``value`` with 3 significant digits, rounded up (a bound the caller may use as printed)."""
    text = f"{value:.3g}"
    if np.isfinite(value) and float(text) < value:
        text = f"{float(text) + 10.0 ** (np.floor(np.log10(value)) - 2):.3g}"
    return text


def _check_axis(axis: object, ndim: int) -> int | None:
    """``axis`` normalised (None: the last axis, nothing to move)."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise InvalidArgumentError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= int(axis) < ndim:
        raise InvalidArgumentError(f"axis must satisfy {-ndim} <= axis < {ndim} for x with {ndim} axes, got {axis}")
    value = int(axis) % ndim
    return None if value == ndim - 1 else value


def _prepare(
    x: ArrayLike, k: object, method: MethodArg, tau: object, params: Mapping[str, object] | None = None, axis: object = -1
) -> _Prepared:
    spec = get_method(method)
    impl = spec.bind(params)
    bound = spec.resolve_params(params)
    arr = _as_real_array(x)
    moved = _check_axis(axis, arr.ndim)
    if moved is not None:
        arr = np.moveaxis(arr, moved, -1)
    shape = arr.shape
    n = shape[-1]
    k_impl, k_rows, k_out = _k_plan(k, spec, shape[:-1], n)
    check_alias_k(method, [cast(int, k_impl)] if k_rows is None else np.unique(k_rows))  # "softmax": k = 1 only
    tau_v, tau_out = _tau_plan(tau, shape[:-1])
    k_max = float(np.max(k_rows)) if k_rows is not None and k_rows.size else float(cast(int, k_impl))
    if isinstance(k_impl, np.ndarray) and not impl.row_k:
        impl = grouped_by_k(impl)
    limit = impl.max_row_work
    if limit is not None and n * k_max > limit:
        raise InvalidArgumentError(
            f"method {spec.name!r} runs k sequential rounds over the row (cost O(n k) per row): n*k = "
            f"{n * k_max:.3g} (n={n}, k={_number(k_max)}) exceeds its limit {limit:.3g}, beyond which one row can "
            f"take minutes; use k <= {int(limit // n)} at this n, or a method of cost O(n log n) such as thre-exp"
        )
    out_dtype = np.dtype(np.float32) if arr.dtype == np.float32 else np.dtype(np.float64)
    x2 = np.asarray(arr, dtype=np.float64).reshape(-1, n)  # read only: z below is a new array
    floor = impl.z_floor
    # A finite sum proves there is no NaN and no +-inf (either would make it NaN or infinite);
    # a sum that merely overflows takes the full checks, which then find nothing.
    with np.errstate(over="ignore", invalid="ignore"):
        all_finite = bool(np.isfinite(np.sum(x2)))
    if not all_finite:
        bad = np.isnan(x2) | (x2 == np.inf)
        if bad.any():
            flat = int(np.argmax(bad.any(axis=-1)))
            col = int(np.argmax(bad[flat]))
            where = _row_index(flat, shape[:-1])
            label = f"row {where}, entry {col}" if where else f"entry {col}"
            raise InvalidArgumentError(
                f"x must not contain NaN or +inf (use -inf to mask an entry); found {x2[flat, col]} at {label}"
            )
        counts = np.isfinite(x2).sum(axis=-1)
        need = k_max if k_rows is None else k_rows
        # a row needs at least one unmasked entry and at least k of them
        short = (counts < need) | (counts == 0)
        if short.any():
            flat = int(np.argmax(short))
            where = _row_index(flat, shape[:-1])
            label = f"row {where}" if where else "the vector"
            shown = _number(float(need if k_rows is None else k_rows[flat]))
            raise InvalidArgumentError(
                f"{label} has only {counts[flat]} unmasked entries (-inf = masked), fewer than k={shown}"
            )
    top = np.max(x2, axis=-1, keepdims=True)
    if impl.takes_x:  # x and tau reach the implementation as given; derivatives come with respect to x
        taken: Any = impl  # its functions take tau as a keyword (Implementation.takes_x)
        impl = replace(
            impl, forward=partial(taken.forward, tau=tau_v), jacobian=partial(taken.jacobian, tau=tau_v),
            vjp=partial(taken.vjp, tau=tau_v),
        )
        return _Prepared(
            spec=spec, impl=impl, params=bound, z=x2, k=k_impl, tau=1.0, shape=shape, out_dtype=out_dtype, x2=x2,
            top=top, k_rows=k_rows, k_out=k_out, tau_out=tau_out, axis=moved,
        )
    if not impl.centred:  # z = x / tau, not shifted (a method of the raw scores): the shift is 0
        top = np.zeros_like(top)
    # every non-finite entry left is -inf (masked) and each row has k > 0 finite ones: the row
    # maximum is finite, and z is -inf exactly on the masked entries
    with np.errstate(over="ignore"):  # an overflow to -inf is caught just below
        z = np.subtract(x2, top)
        if not isinstance(tau_v, float) or tau_v != 1.0:  # z / 1 = z exactly
            np.divide(z, tau_v, out=z)
    if not impl.centred:
        _refuse_overflow(x2, z, tau_v, spec.name)
    if all_finite:
        too_low = bool(z.size) and bool(np.min(z) < floor)
    else:  # masked entries (-inf) are below any floor by design
        too_low = bool((np.isfinite(x2) & (z < floor)).any())
    if too_low:
        if isinstance(tau_v, float):
            _raise_below_floor(x2, top, tau_v, floor, spec.name)
        low = (np.isfinite(x2) & (z < floor)).any(axis=-1)
        b = int(np.argmax(low))
        _raise_below_floor(x2[b : b + 1], top[b : b + 1], float(tau_v[b, 0]), floor, spec.name)
    return _Prepared(
        spec=spec, impl=impl, params=bound, z=z, k=k_impl, tau=tau_v, shape=shape, out_dtype=out_dtype, x2=x2,
        top=top, k_rows=k_rows, k_out=k_out, tau_out=tau_out, axis=moved,
    )


def _refuse_overflow(x2: FloatArray, z: FloatArray, tau_v: float | FloatArray, name: str) -> None:
    """Refuse an uncentred ``z = x / tau`` (``Implementation.centred`` False) that overflows float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.sum(np.abs(z))):  # no overflow (a finite sum proves it)
            return
    over = np.isfinite(x2) & ~np.isfinite(z)
    if not over.any():
        return
    b = int(np.argmax(over.any(axis=-1)))
    tau_b = tau_v if isinstance(tau_v, float) else float(tau_v[b, 0])
    big = float(np.max(np.abs(np.where(np.isfinite(x2[b]), x2[b], 0.0))))
    raise InvalidArgumentError(
        f"tau={tau_b:g} is too small for the magnitude of x ({big:g}): method {name!r} computes on x / tau "
        f"(not shifted: it is not shift-invariant), which overflows float64; use tau >= "
        f"{_round_up(big / float(np.finfo(np.float64).max))}"
    )


def _z_residual(prep: _Prepared, rows: NDArray[np.intp]) -> FloatArray:
    """``lo`` on ``rows`` with ``z + lo = (x - max x) / tau`` to about ``u^2`` relative (error-free
    transformations: TwoSum of ``x - max x``, the exact product ``z tau`` by Veltkamp splitting); 0 on
    masked entries and wherever a step could overflow (``|z| > 1e290``)."""
    assert prep.x2 is not None and prep.top is not None
    x, top, z = prep.x2[rows], prep.top[rows], prep.z[rows]
    with np.errstate(all="ignore"):
        s = x - top  # TwoSum: s + e1 = x - top exactly
        bb = s - x
        e1 = (x - (s - bb)) + (-top - bb)
        if isinstance(prep.tau, float) and prep.tau == 1.0:
            lo = e1
        else:
            tau = prep.tau if isinstance(prep.tau, float) else prep.tau[rows]
            split = 134217729.0  # 2^27 + 1
            ph = z * tau
            zc = split * z
            zh = zc - (zc - z)
            zl = z - zh
            tc = split * tau
            th = tc - (tc - tau)
            tl = tau - th
            pl = ((zh * th - ph) + zh * tl + zl * th) + zl * tl  # z tau = ph + pl exactly
            lo = ((s - ph) - pl + e1) / tau
    ok = np.isfinite(x) & np.isfinite(lo) & (np.abs(z) < 1e290)
    return np.where(ok, lo, 0.0)


def scaled_scores(x: ArrayLike, k: object, *, tau: object = 1.0, axis: int = -1) -> FloatArray:
    """The scores every centred operator sees: ``z = (x - max x) / tau`` row by row, as a ``(B, n)``
    batch (the methods defined on raw scores, ``Implementation.centred`` False, see ``x / tau``).

    Validates ``x``, ``k`` and ``tau`` exactly as :func:`soft_topk` does (``tau`` may differ per row);
    masked entries stay ``-inf``; rows are flattened row-major (after moving ``axis`` last). For
    analyses that work on the operators' input.

    >>> scaled_scores([[1.0, 3.0, -np.inf]], 1, tau=0.5).tolist()
    [[-4.0, 0.0, -inf]]
    """
    return _prepare(x, k, BASELINE_METHOD, tau, axis=axis).z


def _forward(prep: _Prepared) -> tuple[Forward, tuple[RowFailure, ...]]:
    impl = prep.impl
    with np.errstate(all="ignore"):  # failures are detected and reported per row below
        fwd = impl.forward(prep.z, prep.k)
        if impl.refine is not None and prep.x2 is not None:
            fwd = impl.refine(fwd, prep.z, prep.k, lambda rows: _z_residual(prep, rows))
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
    if not impl.elementwise and not impl.takes_x:
        # rows whose weights the forward computed elementwise already give ties equal bits
        rows = None if fwd.elementwise_rows is None else np.flatnonzero(~fwd.elementwise_rows)
        if "stderr" in fwd.aux:
            fwd.p, fwd.q, fwd.aux["stderr"] = average_ties(prep.z, fwd.p, fwd.q, fwd.aux["stderr"], rows=rows)
        else:
            fwd.p, fwd.q = average_ties(prep.z, fwd.p, fwd.q, rows=rows)
    return fwd, tuple(failures)


def evaluate(
    x: ArrayLike, k: object, method: MethodArg = DEFAULT_METHOD, *, tau: object = 1.0, axis: int = -1, logs: bool = False,
    **params: Any,
) -> TopKResult:
    """Compute ``method`` on ``x`` and diagnose every row instead of raising on failure.

    Same arguments as :func:`soft_topk`. Rows with status other than ``"ok"`` hold NaN.
    ``logs=True`` also fills ``log_weights`` and ``log_complement`` (see :func:`log_soft_topk`).

    Raises:
        InvalidArgumentError: bad ``x``, ``k``, ``tau`` or ``method`` (a ``ValueError``).

    >>> r = evaluate([0.0, 50.0, 100.0], 2, "grad-recursive", tau=0.01)
    >>> r.ok, r.failures[0].code
    (False, 'log0')
    """
    prep = _prepare(x, k, method, tau, params, axis)
    fwd, failures = _forward(prep)
    stderr = fwd.aux.get("stderr")
    failed = fwd.codes() != OK
    if failures:
        p = np.where(failed[:, None], np.nan, fwd.p)
        q = np.where(failed[:, None], np.nan, fwd.q)
        if stderr is not None:
            stderr = np.where(failed[:, None], np.nan, stderr)
    else:  # no row failed: nothing to blank out
        p, q = fwd.p, fwd.q
    if stderr is not None:
        stderr = prep.restore(stderr.reshape(prep.shape))
    logp = logq = None
    if logs:
        logp, logq = _logs(prep, fwd)
        if failures:
            logp, logq = np.where(failed[:, None], np.nan, logp), np.where(failed[:, None], np.nan, logq)
        logp = prep.restore(logp.reshape(prep.shape).astype(prep.out_dtype, copy=False))
        logq = prep.restore(logq.reshape(prep.shape).astype(prep.out_dtype, copy=False))
    # the weights never share memory with the complement (the forward's own arrays otherwise)
    fresh = failures or p.dtype != prep.out_dtype or not np.may_share_memory(p, q)
    return TopKResult(
        method=prep.spec.name, k=prep.k_out, tau=prep.tau_out,
        weights=prep.restore(p.reshape(prep.shape).astype(prep.out_dtype, copy=not fresh)),
        complement=prep.restore(q.reshape(prep.shape)),
        status=fwd.codes().reshape(prep.shape[:-1]),
        failures=failures,
        stderr=stderr,
        params=dict(prep.params),
        log_weights=logp,
        log_complement=logq,
    )


def _logs(prep: _Prepared, fwd: Forward) -> tuple[FloatArray, FloatArray]:
    """``(log p, log q)`` of a forward pass: the method's own (accurate where ``p`` or ``q``
    underflows) or the logarithms of ``p`` and of the accurate ``q``."""
    hook = prep.impl.log_weights
    with np.errstate(all="ignore"):
        if hook is not None:
            return hook(fwd, prep.z, prep.k)
        return np.log(fwd.p), np.log(fwd.q)


def log_soft_topk(
    x: ArrayLike, k: object, method: MethodArg = DEFAULT_METHOD, *, tau: object = 1.0, axis: int = -1, **params: Any
) -> tuple[NDArray[Any], NDArray[Any]]:
    """``(log p, log(1 - p))`` of :func:`soft_topk`, for losses on the weights (a binary
    cross-entropy on a mask, the log-likelihood of a subset).

    Computed in log space by the methods that have a closed form for it (the threshold methods:
    ``log p = log F(z - lambda)``), so both stay finite and accurate where ``p`` or ``1 - p`` is
    below the smallest normal float64 (about 2.2e-308) or rounds to 1; the other methods give the
    logarithms of ``p`` and of their accurately computed ``1 - p``. Masked entries: ``-inf`` and 0.

    Raises:
        InvalidArgumentError, NumericalFailureError: as :func:`soft_topk`.

    >>> logp, logq = log_soft_topk([0.0, -800.0], 1, "thre-exp")
    >>> float(logp[1]), float(logq[0])
    (-800.0, -800.0)
    """
    result = evaluate(x, k, method, tau=tau, axis=axis, logs=True, **params)
    if result.failures:
        raise NumericalFailureError(result.failures)
    assert result.log_weights is not None and result.log_complement is not None
    return result.log_weights, result.log_complement


def soft_topk(
    x: ArrayLike, k: object, method: MethodArg = DEFAULT_METHOD, *, tau: object = 1.0, axis: int = -1,
    **params: Any,
) -> NDArray[Any]:
    """Smooth top-k weights of ``x / tau`` along ``axis`` (the last one by default).

    Returns ``p`` of the shape of ``x``: for the exact methods, entries in [0, 1] summing to
    ``k`` that tend to the k-hot indicator of the k largest entries as ``tau -> 0``.

    Args:
        x: scores ``[..., n]``; ``-inf`` masks an entry (weight 0).
        k: how many entries to select: a number, or an array broadcastable to the batch shape
            (``x``'s shape without ``axis``; a trailing axis of length 1 is allowed, as in
            ``k[..., None]``) giving each row its own k. Methods defined for a real
            k (``METHODS[name].capabilities.integer_k`` False: the threshold methods, ``hard``,
            ``ot-sinkhorn``, ``perturbed``) take ``0 < k <= n``; the others an integer
            ``1 <= k <= n``. A row needs at least k unmasked entries.
        method: a name from ``METHODS`` or an alias (``softtopk methods`` lists them), or your own
            operator: ``"FILE.py:FUNCTION"``, ``"package.module:FUNCTION"`` or a callable
            ``fn(x, k, tau)`` in numpy, PyTorch or JAX (importing a file runs its code).
        tau: temperature > 0, a number or an array broadcastable to the batch shape.
        axis: the axis selected along (``axis=0`` on a tokens x experts matrix selects the
            top-k tokens of each expert).
        params: the method's extra parameters (``METHODS[name].parameters``, e.g. ``samples``,
            ``seed``); a parameter the method does not take is an error.

    Raises:
        InvalidArgumentError: bad arguments (a ``ValueError``).
        NumericalFailureError: the method failed on some row (an ``ArithmeticError``);
            :func:`evaluate` gives the same diagnosis without raising.

    >>> soft_topk([1.0, 2.0, 3.0], 2, "thre-exp").round(4)
    array([0.2689, 0.7311, 1.    ])
    >>> soft_topk([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], [1, 2], "hard")
    array([[0., 0., 1.],
           [0., 1., 1.]])
    """
    result = evaluate(x, k, method, tau=tau, axis=axis, **params)
    if result.failures:
        raise NumericalFailureError(result.failures)
    return result.weights


def _checked_forward(prep: _Prepared, computed: Forward | None = None) -> Forward:
    """The forward pass of ``prep``, raising on the first failed row.

    ``computed``: a forward pass the implementation already ran (``forward_vjp``); its rows
    are diagnosed exactly as ``_forward`` diagnoses a fresh one, without averaging ties (only the
    failures are used, not the weights).
    """
    if computed is not None:
        done = computed
        prep = replace(prep, impl=replace(prep.impl, forward=lambda z, k: done, elementwise=True, refine=None))
    fwd, failures = _forward(prep)
    if failures:
        raise NumericalFailureError(failures)
    return fwd


Wrt = str | tuple[str, ...]
_WRT = ("x", "k", "tau")


def _check_wrt(wrt: object) -> tuple[tuple[str, ...], bool]:
    """``(names, single)``: the variables asked for, and whether one array (not a tuple) is returned."""
    names = (wrt,) if isinstance(wrt, str) else wrt
    if not isinstance(names, tuple) or not names or not all(isinstance(w, str) and w in _WRT for w in names):
        raise InvalidArgumentError(f"wrt must be one of 'x', 'k', 'tau' or a tuple of them, got {wrt!r}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"wrt names a variable twice: {wrt!r}")
    return names, isinstance(wrt, str)


def _require_tau_derivative(prep: _Prepared, names: tuple[str, ...]) -> None:
    """Refuse ``wrt="tau"`` for an implementation that takes ``x`` and ``tau`` as given (a user's
    operator): its autodiff gives the derivative with respect to ``x`` only."""
    if "tau" in names and prep.impl.takes_x:
        raise InvalidArgumentError(
            f"the derivative with respect to tau of {prep.spec.name!r} is not available (a user's operator: "
            "its framework's autodiff gives the derivative with respect to x)"
        )


def _require_dk(prep: _Prepared) -> DkFn:
    """The method's ``dp/dk``, or an error saying it has none."""
    hook = prep.impl.dk
    if hook is None or prep.spec.capabilities.integer_k:
        why = "it is defined for integer k only" if prep.spec.capabilities.integer_k else "none is implemented"
        raise InvalidArgumentError(
            f"method {prep.spec.name!r} has no derivative with respect to k ({why}); methods that have one: "
            f"{', '.join(_dk_methods()) or 'none'}"
        )
    return hook


def _dk(prep: _Prepared, fwd: Forward) -> FloatArray:
    """``dp/dk`` of every entry, ``(B, n)``."""
    hook = _require_dk(prep)
    with np.errstate(all="ignore"):
        return hook(fwd, prep.z, prep.k)


def _dk_methods() -> tuple[str, ...]:
    return tuple(
        name for name, spec in METHODS.items() if not spec.capabilities.integer_k and spec.implementation.dk is not None
    )


def _finite_z(prep: _Prepared) -> FloatArray:
    """``z`` with masked entries as 0 (their derivatives are 0: no ``0 * inf``); ``z`` itself when
    nothing is masked (a finite sum proves it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.sum(prep.z)):
            return prep.z
    return np.where(np.isfinite(prep.z), prep.z, 0.0)


def _z_for_tau(prep: _Prepared, fwd: Forward) -> FloatArray:
    """What ``dz/dtau = -z / tau`` is multiplied by: ``z`` (masked entries 0), centred per row on the
    entry of largest ``p q`` (the weight nearest 1/2: at the threshold) for a shift-invariant operator.

    ``p(z + c) = p(z)`` gives ``J_z 1 = 0`` and ``1^T J_z = 0`` for the symmetric Jacobians, so
    ``J_z z = J_z (z - c)`` and ``g_z . z = g_z . (z - c)`` exactly; in floating point the sums of
    ``J_z``'s rows and of ``g_z`` are only 0 to rounding, an error that ``z`` multiplies: at
    ``|z| = 1e3`` and a row whose weights sit on both sides of the threshold it reached 1e-9 of
    ``g_tau`` (a free entry's error in ``g_z`` is its ``f'`` times the rounding of a mean of ``g``,
    so the error is that rounding times ``sum_i f'_i (z_i - c)``). Centred at the threshold, the entries
    that carry the derivative have ``|z - c|`` of order 1. (tests/test_tau_derivative_centring.py checks ``J_z 1 = 0`` for every method it is used for.)
    """
    z = _finite_z(prep)
    if not (prep.impl.centred and prep.spec.guarantees.shift_invariant):
        return z
    fin = np.isfinite(prep.z)
    j = np.argmax(np.where(fin, fwd.p * fwd.q, -1.0), axis=1)
    c = np.take_along_axis(z, j[:, None], axis=1)
    return np.where(fin, z - c, 0.0)


def jacobian(
    x: ArrayLike, k: object, method: MethodArg = DEFAULT_METHOD, *, tau: object = 1.0, wrt: Wrt = "x", axis: int = -1,
    **params: Any,
) -> Any:
    """Jacobian ``d p / d x`` of :func:`soft_topk`, shape ``[..., n, n]`` (includes ``1/tau``).

    ``J[..., i, j] = d p_i / d x_j``. Masked entries have zero rows and columns. With an
    ``axis`` other than the last, the leading axes are the batch axes in order and the last two
    the selected one. ``wrt="k"`` gives ``d p / d k`` and ``wrt="tau"`` ``d p / d tau``, each shaped
    like ``x`` (per row, for that row's k and tau); a tuple of names gives a tuple in that order.

    Raises:
        InvalidArgumentError, NumericalFailureError: as :func:`soft_topk`; also a method without
            a derivative with respect to k.

    >>> jacobian([0.0, 0.0], 1, "thre-sigmoid")
    array([[ 0.125, -0.125],
           [-0.125,  0.125]])
    >>> jacobian([0.0, 0.0], 1.5, "thre-sigmoid", wrt="k")
    array([0.5, 0.5])
    """
    names, single = _check_wrt(wrt)
    prep = _prepare(x, k, method, tau, params, axis)
    _require_tau_derivative(prep, names)
    n = prep.shape[-1]
    if "k" in names:
        _require_dk(prep)  # before any work
    if prep.z.shape[0] == 0:  # an empty batch has an empty Jacobian, whatever the method
        empty = {"x": np.zeros((*prep.shape, n), dtype=prep.out_dtype)}
        empty["k"] = empty["tau"] = prep.restore(np.zeros(prep.shape, dtype=prep.out_dtype))
        return empty[names[0]] if single else tuple(empty[w] for w in names)
    fwd = _checked_forward(prep)
    results: dict[str, NDArray[Any]] = {}
    with np.errstate(all="ignore"):
        jac_z = prep.impl.jacobian(fwd, prep.z, prep.k) if ("x" in names or "tau" in names) else None
        if "x" in names:
            assert jac_z is not None
            results["x"] = _divided_by_tau(prep, jac_z, "Jacobian").reshape((*prep.shape, n))
        if "tau" in names:
            assert jac_z is not None
            # z = (x - max x) / tau: dz/dtau = -z / tau, so dp/dtau = J_z (-z) / tau
            d_tau = -np.einsum("bij,bj->bi", jac_z, _z_for_tau(prep, fwd))
            results["tau"] = prep.restore(_divided_by_tau(prep, d_tau, "derivative with respect to tau").reshape(prep.shape))
        if "k" in names:
            d_k = _dk(prep, fwd)
            results["k"] = prep.restore(_finite_or_raise(prep, d_k, "derivative with respect to k").reshape(prep.shape))
    return results[names[0]] if single else tuple(results[w] for w in names)


def _finite_or_raise(prep: _Prepared, out: FloatArray, what: str) -> NDArray[Any]:
    """``out`` (rows first, not divided by tau) in the output dtype, refusing the rows with an entry
    that is not finite."""
    bad = np.flatnonzero(~np.isfinite(out.reshape(out.shape[0], -1)).all(axis=-1))
    if bad.size:
        raise NumericalFailureError(tuple(
            RowFailure(method=prep.spec.name, row=_row_index(int(b), prep.shape[:-1]), code="nan",
                       detail=f"the {what} is not finite at this input (not computable in float64)")
            for b in bad
        ))
    return out.astype(prep.out_dtype, copy=False)


def vjp(
    x: ArrayLike, k: object, v: ArrayLike, method: MethodArg = DEFAULT_METHOD, *, tau: object = 1.0, wrt: Wrt = "x",
    axis: int = -1, **params: Any,
) -> Any:
    """Vector-Jacobian product ``v^T (d p / d x)`` without forming the Jacobian.

    ``v`` has the shape of ``x``; the result too. O(n) per row for threshold methods.
    ``wrt`` picks the variables: ``"x"`` (default), ``"k"`` (``sum_i v_i dp_i/dk`` per row),
    ``"tau"`` (``sum_i v_i dp_i/dtau`` per row), or a tuple of them, giving a tuple in that order,
    all from one forward pass; the products with respect to k and tau have the batch shape.

    Raises:
        InvalidArgumentError, NumericalFailureError: as :func:`soft_topk`; also a method without
            a derivative with respect to k.

    >>> vjp([0.0, 0.0], 1, [1.0, 0.0], "thre-sigmoid")
    array([ 0.125, -0.125])
    >>> g_x, g_tau = vjp([0.0, 1.0], 1, [1.0, 0.0], "thre-sigmoid", wrt=("x", "tau"))
    """
    names, single = _check_wrt(wrt)
    prep = _prepare(x, k, method, tau, params, axis)
    _require_tau_derivative(prep, names)
    v_arr = _as_real_array(v, "v")
    if prep.axis is not None and v_arr.ndim == len(prep.shape):
        v_arr = np.moveaxis(v_arr, prep.axis, -1)
    if v_arr.shape != prep.shape:
        shown = prep.restore(np.empty(prep.shape, dtype=np.int8)).shape
        raise InvalidArgumentError(f"v must have the shape of x {shown}, got {prep.restore(v_arr).shape}")
    if "k" in names:
        _require_dk(prep)  # before any work
    # Read only (no copy when v is already float64): the operators never write to v.
    v2 = np.asarray(v_arr, dtype=np.float64).reshape(prep.z.shape)
    # As for x: a finite sum proves every entry finite; only a NaN, an inf or an overflowing
    # sum takes the entrywise check.
    with np.errstate(over="ignore", invalid="ignore"):
        if not np.isfinite(np.sum(v2)) and not np.isfinite(v2).all():
            raise InvalidArgumentError("v must be finite (no NaN or inf)")
    if prep.z.shape[0] == 0:  # an empty batch has an empty product, whatever the method
        empty = {"x": prep.restore(np.zeros(prep.shape, dtype=prep.out_dtype))}
        empty["k"] = empty["tau"] = np.zeros(prep.shape[:-1], dtype=prep.out_dtype)
        return empty[names[0]] if single else tuple(empty[w] for w in names)
    if names == ("x",):
        fused = prep.impl.forward_vjp
        with np.errstate(all="ignore"):
            if fused is not None and not prep.params:  # one pass for both (parameters are not bound to it)
                fwd, out = fused(prep.z, prep.k, v2)
                _checked_forward(prep, fwd)
                return _finish_vjp(prep, out, v_arr)
            return _vjp_of(prep, _checked_forward(prep), v2, v_arr)
    results: dict[str, NDArray[Any]] = {}
    fused = prep.impl.forward_vjp if ("x" in names or "tau" in names) and not prep.params else None
    g_z: FloatArray | None = None
    with np.errstate(all="ignore"):
        if fused is not None:  # one pass for the forward and the z-VJP, as above
            computed, g_z = fused(prep.z, prep.k, v2)
            fwd = _checked_forward(prep, computed)
        else:
            fwd = _checked_forward(prep)
            g_z = prep.impl.vjp(fwd, prep.z, prep.k, v2) if ("x" in names or "tau" in names) else None
        if "tau" in names:
            assert g_z is not None
            # z = (x - max x) / tau: dz/dtau = -z / tau, so v . dp/dtau = -(v^T J_z) . z / tau
            g_tau = -np.einsum("bi,bi->b", g_z, _z_for_tau(prep, fwd)) / prep.rows_tau()
            results["tau"] = _finite_or_raise(prep, g_tau, "vector-Jacobian product with respect to tau").reshape(prep.shape[:-1])
        if "x" in names:
            assert g_z is not None
            results["x"] = _finish_vjp(prep, g_z, v_arr)
        if "k" in names:
            fast = prep.impl.vjp_k
            if fast is not None:
                g_k = fast(fwd, prep.z, prep.k, v2)
            else:
                g_k = np.einsum("bi,bi->b", v2, _dk(prep, fwd))
            results["k"] = _finite_or_raise(prep, g_k, "vector-Jacobian product with respect to k").reshape(prep.shape[:-1])
    return results[names[0]] if single else tuple(results[w] for w in names)


def _vjp_of(prep: _Prepared, fwd: Forward, v2: FloatArray, v: NDArray[Any]) -> NDArray[Any]:
    """The method's VJP applied to ``fwd``, the forward pass of ``prep`` (what :func:`vjp` does
    after computing it); ``v2`` is ``v`` as float64 rows."""
    with np.errstate(all="ignore"):
        return _finish_vjp(prep, prep.impl.vjp(fwd, prep.z, prep.k, v2), v)


def _finish_vjp(prep: _Prepared, out: FloatArray, v: NDArray[Any]) -> NDArray[Any]:
    """``out`` (with respect to ``z``) divided by ``tau``, in the caller's shape and dtype, and
    never a view of the caller's ``v`` (``x`` never reaches an operator)."""
    out = prep.restore(_divided_by_tau(prep, out, "vector-Jacobian product").reshape(prep.shape))
    if np.may_share_memory(out, v):
        out = out.copy()
    return out


def _divided_by_tau(prep: _Prepared, out: FloatArray, what: str) -> NDArray[Any]:
    """A derivative ``out`` with respect to ``z`` (``(B, n)`` or ``(B, n, n)``) divided by ``tau``, in
    the output dtype; raises :class:`NumericalFailureError` naming every row where a result entry is
    not finite (never an inf or NaN returned as a derivative).

    At small ``tau`` a finite ``d p / d z`` (e.g. at exactly tied entries, where it does not depend on
    ``tau``) can exceed the largest float64 (or float32) once divided by ``tau``: such a row is refused
    with code ``"overflow"`` and the smallest ``tau`` at which its derivative is representable."""
    with np.errstate(all="ignore"):
        if isinstance(prep.tau, float):
            result = out / prep.tau if prep.tau != 1.0 else out
        else:
            result = out / prep.tau.reshape(-1, *([1] * (out.ndim - 1)))
        if result.dtype != prep.out_dtype:
            result = result.astype(prep.out_dtype)
    flat = result.reshape(result.shape[0], -1)
    with np.errstate(over="ignore", invalid="ignore"):
        all_finite = bool(np.isfinite(np.sum(flat)))  # as for x: a finite sum proves every entry finite
    if all_finite:
        return result
    bad = np.flatnonzero(~np.isfinite(flat).all(axis=-1))
    if bad.size == 0:
        return result
    limit = float(np.finfo(prep.out_dtype).max)
    taus = prep.rows_tau()
    failures = []
    for b in bad:
        row = np.asarray(out[b], dtype=np.float64).ravel()
        if np.isfinite(row).all():
            largest = float(np.max(np.abs(row)))
            code = "overflow"
            detail = (
                f"the {what} overflows {prep.out_dtype} at tau={taus[b]:g}: its largest entry with respect to "
                f"z = x / tau is {largest:.3g}, and d / dx = (d / dz) / tau exceeds {limit:.6g}; the smallest "
                f"tau at which it is representable is {_round_up(largest / limit)}"
            )
        else:
            code = "nan"
            detail = f"the {what} is not finite at this input (not computable in float64)"
        failures.append(
            RowFailure(method=prep.spec.name, row=_row_index(int(b), prep.shape[:-1]), code=code, detail=detail)
        )
    raise NumericalFailureError(tuple(failures))


def trace_grad_recursive(x: ArrayLike, k: int, *, tau: float = 1.0) -> RecursionTrace:
    """Trace the article's GradTopK recursion on ``x / tau`` row by row (no exception).

    Returns per-row arrays (flattened batch, row-major) with the level where the log argument
    first reached zero or went negative, its value, the value just before, and the digits lost
    to cancellation on the way. Used by ``stability-probe`` and by ``compute`` warnings.

    Raises:
        InvalidArgumentError: bad ``x``, ``k`` or ``tau``.
    """
    z = scaled_scores(x, k, tau=tau)
    with np.errstate(all="ignore"):  # the trace records log(0) and log(<0) instead of warning
        return grad_recursive_trace(z, int(k))


@dataclass(frozen=True)
class TopKSum:
    """The soft top-k sum of one method on one input, per row (batch shape).

    ``value`` is ``sum_i p_i x_i``; ``potential`` the method's potential ``Phi`` with
    ``grad_x Phi = p`` (e.g. ``tau log e_k(e^{x/tau})`` for GradTopK), or None when the method
    is not the gradient of a potential. Both are NaN on failed rows; both tend to the sum of the
    k largest entries of ``x`` as the selection hardens. ``k`` and ``tau`` as in :class:`TopKResult`.
    """

    method: str
    k: int | float | FloatArray
    tau: float | FloatArray
    value: FloatArray
    potential: FloatArray | None
    status: NDArray[np.str_]
    failures: tuple[RowFailure, ...]


def evaluate_sum(
    x: ArrayLike, k: object, method: MethodArg = DEFAULT_METHOD, *, tau: object = 1.0, axis: int = -1,
    **params: Any,
) -> TopKSum:
    """The smooth sum of the k largest entries of ``x``, per row, without raising on failure.

    Same arguments as :func:`soft_topk`. Masked entries (``-inf``) contribute nothing.

    Raises:
        InvalidArgumentError: bad arguments (a ``ValueError``).

    >>> s = evaluate_sum([1.0, 2.0, 3.0], 2, "thre-sigmoid", tau=0.01)
    >>> round(float(s.value), 6), round(float(s.potential), 6)
    (5.0, 5.0)
    """
    prep = _prepare(x, k, method, tau, params, axis)
    fwd, failures = _forward(prep)
    failed = fwd.codes() != OK
    finite = np.isfinite(prep.z)
    assert prep.x2 is not None and prep.top is not None
    x64 = prep.x2
    taus = prep.rows_tau()
    shift = prep.top[:, 0]  # z = (x - shift) / tau, shift = max x
    with np.errstate(invalid="ignore"):  # failed rows hold NaN
        value = np.sum(np.where(finite, fwd.p * np.where(finite, x64, 0.0), 0.0), axis=-1)
    value = np.where(failed, np.nan, value)
    potential = None
    potential_fn = prep.spec.capabilities.potential
    if potential_fn is not None:
        with np.errstate(all="ignore"):
            if isinstance(fwd, GroupedForward):  # one k per call: each group of rows alone
                phi = np.zeros(prep.z.shape[0])
                for rows, kv, part in fwd.parts:
                    phi[rows] = potential_fn(part, prep.z[rows], kv)
            else:
                phi = potential_fn(fwd, prep.z, cast(Any, prep.k))  # a real-k method: its k array
        potential = np.where(failed, np.nan, taus * phi + prep.rows_k() * shift)
        potential = potential.reshape(prep.shape[:-1])
    return TopKSum(
        method=prep.spec.name, k=prep.k_out, tau=prep.tau_out, value=value.reshape(prep.shape[:-1]),
        potential=potential, status=fwd.codes().reshape(prep.shape[:-1]), failures=failures,
    )


def soft_topk_sum(
    x: ArrayLike, k: object, method: MethodArg = DEFAULT_METHOD, *, tau: object = 1.0, axis: int = -1,
    **params: Any,
) -> tuple[FloatArray, FloatArray | None]:
    """``(sum_i p_i x_i, potential or None)`` per row: two smooth sums of the k largest entries.

    The potential ``Phi`` (declared per method in the registry) has gradient exactly ``p``:
    ``tau log e_k(e^{x/tau})`` for GradTopK, the regularised maximum
    ``max_{p in D(n,k)} <p, x> - tau R(p)`` for the threshold operators.

    Raises:
        InvalidArgumentError: bad arguments. NumericalFailureError: the method failed on a row.

    >>> value, potential = soft_topk_sum([1.0, 2.0, 3.0], 1, "grad")
    >>> round(float(value), 4), round(float(potential), 4)
    (2.5752, 3.4076)
    """
    result = evaluate_sum(x, k, method, tau=tau, axis=axis, **params)
    if result.failures:
        raise NumericalFailureError(result.failures)
    return result.value, result.potential
