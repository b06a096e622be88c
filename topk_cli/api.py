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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from topk_cli.errors import InvalidArgumentError, NumericalFailureError, RowFailure
from topk_cli.operators._base import OK, FloatArray, Forward, Implementation, average_ties
from topk_cli.operators.grad_recursive import RecursionTrace, grad_recursive_trace
from topk_cli.registry import BASELINE_METHOD, DEFAULT_METHOD, MethodSpec, lookup


@dataclass(frozen=True)
class TopKResult:
    """Weights of one method on one input, with a per-row diagnosis instead of exceptions.

    ``weights`` has the shape and float dtype of the input (rows that failed are NaN);
    ``complement`` is ``1 - weights`` computed accurately in float64 (it tells 1 - 1e-20 from
    1); ``status`` has the batch shape and holds ``"ok"`` or a failure code per row;
    ``failures`` describes each failed row. ``stderr`` holds the standard error of each weight
    for a Monte-Carlo method (None for exact ones); ``params`` the method's parameters used.
    """

    method: str
    k: int
    tau: float
    weights: NDArray[Any]
    complement: FloatArray
    status: NDArray[np.str_]
    failures: tuple[RowFailure, ...]
    stderr: FloatArray | None = None
    params: Mapping[str, int | float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every row was computed without numerical failure."""
        return not self.failures


@dataclass(frozen=True)
class _Prepared:
    spec: MethodSpec
    impl: Implementation  # the spec's implementation with its parameters bound
    params: Mapping[str, int | float]
    z: FloatArray  # (B, n) shifted, scaled, clipped, -inf = masked
    k: int
    tau: float
    shape: tuple[int, ...]
    out_dtype: np.dtype[Any]
    x2: FloatArray | None = None  # the input as float64 rows (read only), for z's residual
    top: FloatArray | None = None  # its row maxima (B, 1)


def get_method(method: str) -> MethodSpec:
    """The registered spec of ``method`` (a name or an alias such as ``lapsum``).

    Raises:
        UnknownMethodError: the message suggests the closest name and lists the valid ones.
    """
    return lookup(method)


def check_k(k: object, n: int | None = None, *, name: str = "k") -> int:
    """``k`` as an ``int`` after checking ``1 <= k <= n`` (``n=None``: only ``k >= 1``): the one
    check of ``k`` in the package (API, CLI, properties, sweeps), with one wording. ``name`` is how
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


def check_tau(tau: object, *, name: str = "tau") -> float:
    """``tau`` as a ``float`` after checking it is a finite number ``> 0``: the one check of a
    temperature in the package, with one wording (``tau must be a finite number > 0, got 0.0``)."""
    if isinstance(tau, (bool, np.bool_)) or not isinstance(tau, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name} must be a finite number > 0, got {tau!r}")
    value = float(tau)
    if not (np.isfinite(value) and value > 0):
        raise InvalidArgumentError(f"{name} must be a finite number > 0, got {tau!r}")
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


def _prepare(x: ArrayLike, k: object, method: str, tau: object, params: Mapping[str, object] | None = None) -> _Prepared:
    spec = get_method(method)
    impl = spec.bind(params)
    bound = spec.resolve_params(params)
    arr = _as_real_array(x)
    shape = arr.shape
    n = shape[-1]
    k_int = check_k(k, n)
    tau_f = check_tau(tau)
    limit = impl.max_row_work
    if limit is not None and n * k_int > limit:
        raise InvalidArgumentError(
            f"method {spec.name!r} runs k sequential rounds over the row (cost O(n k) per row): n*k = "
            f"{n * k_int:.3g} (n={n}, k={k_int}) exceeds its limit {limit:.3g}, beyond which one row can take "
            f"minutes; use k <= {int(limit // n)} at this n, or a method of cost O(n log n) such as thre-exp"
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
        if (counts < k_int).any():
            flat = int(np.argmax(counts < k_int))
            where = _row_index(flat, shape[:-1])
            label = f"row {where}" if where else "the vector"
            raise InvalidArgumentError(
                f"{label} has only {counts[flat]} unmasked entries (-inf = masked), fewer than k={k_int}"
            )
    # every non-finite entry left is -inf (masked) and each row has k >= 1 finite ones: the row
    # maximum is finite, and z is -inf exactly on the masked entries
    top = np.max(x2, axis=-1, keepdims=True)
    with np.errstate(over="ignore"):  # an overflow to -inf is caught just below
        z = np.subtract(x2, top)
        if tau_f != 1.0:  # z / 1 = z exactly
            np.divide(z, tau_f, out=z)
    if all_finite:
        too_low = bool(z.size) and bool(np.min(z) < floor)
    else:  # masked entries (-inf) are below any floor by design
        too_low = bool((np.isfinite(x2) & (z < floor)).any())
    if too_low:
        _raise_below_floor(x2, top, tau_f, floor, spec.name)
    return _Prepared(
        spec=spec, impl=impl, params=bound, z=z, k=k_int, tau=tau_f, shape=shape, out_dtype=out_dtype, x2=x2, top=top
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
        if prep.tau == 1.0:
            lo = e1
        else:
            tau = prep.tau
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


def scaled_scores(x: ArrayLike, k: int, *, tau: float = 1.0) -> FloatArray:
    """The scores every operator sees: ``z = (x - max x) / tau`` row by row, as a ``(B, n)`` batch.

    Validates ``x``, ``k`` and ``tau`` exactly as :func:`soft_topk` does; masked entries stay
    ``-inf``; rows are flattened row-major. For analyses that work on the operators' input.

    >>> scaled_scores([[1.0, 3.0, -np.inf]], 1, tau=0.5).tolist()
    [[-4.0, 0.0, -inf]]
    """
    return _prepare(x, k, BASELINE_METHOD, tau).z


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
    if not impl.elementwise:
        # rows whose weights the forward computed elementwise already give ties equal bits
        rows = None if fwd.elementwise_rows is None else np.flatnonzero(~fwd.elementwise_rows)
        if "stderr" in fwd.aux:
            fwd.p, fwd.q, fwd.aux["stderr"] = average_ties(prep.z, fwd.p, fwd.q, fwd.aux["stderr"], rows=rows)
        else:
            fwd.p, fwd.q = average_ties(prep.z, fwd.p, fwd.q, rows=rows)
    return fwd, tuple(failures)


def evaluate(
    x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0, **params: int | float
) -> TopKResult:
    """Compute ``method`` on ``x`` and diagnose every row instead of raising on failure.

    Same arguments as :func:`soft_topk`. Rows with status other than ``"ok"`` hold NaN.

    Raises:
        InvalidArgumentError: bad ``x``, ``k``, ``tau`` or ``method`` (a ``ValueError``).

    >>> r = evaluate([0.0, 50.0, 100.0], 2, "grad-recursive", tau=0.01)
    >>> r.ok, r.failures[0].code
    (False, 'log0')
    """
    prep = _prepare(x, k, method, tau, params)
    fwd, failures = _forward(prep)
    stderr = fwd.aux.get("stderr")
    if failures:
        failed = fwd.codes() != OK
        p = np.where(failed[:, None], np.nan, fwd.p)
        q = np.where(failed[:, None], np.nan, fwd.q)
        if stderr is not None:
            stderr = np.where(failed[:, None], np.nan, stderr)
    else:  # no row failed: nothing to blank out
        p, q = fwd.p, fwd.q
    if stderr is not None:
        stderr = stderr.reshape(prep.shape)
    # the weights never share memory with the complement (the forward's own arrays otherwise)
    fresh = failures or p.dtype != prep.out_dtype or not np.may_share_memory(p, q)
    return TopKResult(
        method=prep.spec.name, k=prep.k, tau=prep.tau,
        weights=p.reshape(prep.shape).astype(prep.out_dtype, copy=not fresh),
        complement=q.reshape(prep.shape),
        status=fwd.codes().reshape(prep.shape[:-1]),
        failures=failures,
        stderr=stderr,
        params=dict(prep.params),
    )


def soft_topk(
    x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0, **params: int | float
) -> NDArray[Any]:
    """Smooth top-k weights of ``x / tau`` along the last axis.

    Returns ``p`` of the shape of ``x``: for the exact methods, entries in [0, 1] summing to
    ``k`` that tend to the k-hot indicator of the k largest entries as ``tau -> 0``.

    Args:
        x: scores ``[..., n]``; ``-inf`` masks an entry (weight 0).
        k: how many entries to select, ``1 <= k <= n``.
        method: a name from ``METHODS`` or an alias (``softtopk methods`` lists them).
        tau: temperature > 0.
        params: the method's extra parameters (``METHODS[name].parameters``, e.g. ``samples``,
            ``seed``); a parameter the method does not take is an error.

    Raises:
        InvalidArgumentError: bad arguments (a ``ValueError``).
        NumericalFailureError: the method failed on some row (an ``ArithmeticError``);
            :func:`evaluate` gives the same diagnosis without raising.

    >>> soft_topk([1.0, 2.0, 3.0], 2, "thre-exp").round(4)
    array([0.2689, 0.7311, 1.    ])
    """
    result = evaluate(x, k, method, tau=tau, **params)
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


def jacobian(
    x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0, **params: int | float
) -> NDArray[Any]:
    """Jacobian ``d p / d x`` of :func:`soft_topk`, shape ``[..., n, n]`` (includes ``1/tau``).

    ``J[..., i, j] = d p_i / d x_j``. Masked entries have zero rows and columns.

    Raises:
        InvalidArgumentError, NumericalFailureError: as :func:`soft_topk`.

    >>> jacobian([0.0, 0.0], 1, "thre-sigmoid")
    array([[ 0.125, -0.125],
           [-0.125,  0.125]])
    """
    prep = _prepare(x, k, method, tau, params)
    n = prep.shape[-1]
    if prep.z.shape[0] == 0:  # an empty batch has an empty Jacobian, whatever the method
        return np.zeros((*prep.shape, n), dtype=prep.out_dtype)
    fwd = _checked_forward(prep)
    with np.errstate(all="ignore"):
        jac = _divided_by_tau(prep, prep.impl.jacobian(fwd, prep.z, prep.k), "Jacobian")
    return jac.reshape((*prep.shape, n))


def vjp(
    x: ArrayLike, k: int, v: ArrayLike, method: str = DEFAULT_METHOD, *, tau: float = 1.0, **params: int | float
) -> NDArray[Any]:
    """Vector-Jacobian product ``v^T (d p / d x)`` without forming the Jacobian.

    ``v`` has the shape of ``x``; the result too. O(n) per row for threshold methods.

    Raises:
        InvalidArgumentError, NumericalFailureError: as :func:`soft_topk`.

    >>> vjp([0.0, 0.0], 1, [1.0, 0.0], "thre-sigmoid")
    array([ 0.125, -0.125])
    """
    prep = _prepare(x, k, method, tau, params)
    v_arr = _as_real_array(v, "v")
    if v_arr.shape != prep.shape:
        raise InvalidArgumentError(f"v must have the shape of x {prep.shape}, got {v_arr.shape}")
    # Read only (no copy when v is already float64): the operators never write to v.
    v2 = np.asarray(v_arr, dtype=np.float64).reshape(prep.z.shape)
    # As for x: a finite sum proves every entry finite; only a NaN, an inf or an overflowing
    # sum takes the entrywise check.
    with np.errstate(over="ignore", invalid="ignore"):
        if not np.isfinite(np.sum(v2)) and not np.isfinite(v2).all():
            raise InvalidArgumentError("v must be finite (no NaN or inf)")
    if prep.z.shape[0] == 0:  # an empty batch has an empty product, whatever the method
        return np.zeros(prep.shape, dtype=prep.out_dtype)
    fused = prep.impl.forward_vjp
    with np.errstate(all="ignore"):
        if fused is not None and not prep.params:  # one pass for both (parameters are not bound to it)
            fwd, out = fused(prep.z, prep.k, v2)
            _checked_forward(prep, fwd)
            return _finish_vjp(prep, out, v_arr)
        return _vjp_of(prep, _checked_forward(prep), v2, v_arr)


def _vjp_of(prep: _Prepared, fwd: Forward, v2: FloatArray, v: NDArray[Any]) -> NDArray[Any]:
    """The method's VJP applied to ``fwd``, the forward pass of ``prep`` (what :func:`vjp` does
    after computing it); ``v2`` is ``v`` as float64 rows."""
    with np.errstate(all="ignore"):
        return _finish_vjp(prep, prep.impl.vjp(fwd, prep.z, prep.k, v2), v)


def _finish_vjp(prep: _Prepared, out: FloatArray, v: NDArray[Any]) -> NDArray[Any]:
    """``out`` (with respect to ``z``) divided by ``tau``, in the caller's shape and dtype, and
    never a view of the caller's ``v`` (``x`` never reaches an operator)."""
    out = _divided_by_tau(prep, out, "vector-Jacobian product").reshape(prep.shape)
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
        result = out / prep.tau if prep.tau != 1.0 else out
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
    failures = []
    for b in bad:
        row = np.asarray(out[b], dtype=np.float64).ravel()
        if np.isfinite(row).all():
            largest = float(np.max(np.abs(row)))
            code = "overflow"
            detail = (
                f"the {what} overflows {prep.out_dtype} at tau={prep.tau:g}: its largest entry with respect to "
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
    k largest entries of ``x`` as the selection hardens.
    """

    method: str
    k: int
    tau: float
    value: FloatArray
    potential: FloatArray | None
    status: NDArray[np.str_]
    failures: tuple[RowFailure, ...]


def evaluate_sum(
    x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0, **params: int | float
) -> TopKSum:
    """The smooth sum of the k largest entries of ``x``, per row, without raising on failure.

    Same arguments as :func:`soft_topk`. Masked entries (``-inf``) contribute nothing.

    Raises:
        InvalidArgumentError: bad arguments (a ``ValueError``).

    >>> s = evaluate_sum([1.0, 2.0, 3.0], 2, "thre-sigmoid", tau=0.01)
    >>> round(float(s.value), 6), round(float(s.potential), 6)
    (5.0, 5.0)
    """
    prep = _prepare(x, k, method, tau, params)
    fwd, failures = _forward(prep)
    failed = fwd.codes() != OK
    finite = np.isfinite(prep.z)
    top = np.max(np.where(finite, prep.z, -np.inf), axis=-1)  # 0: z is shifted
    x64 = _as_real_array(x).astype(np.float64).reshape(prep.z.shape)
    shift = np.max(np.where(finite, x64, -np.inf), axis=-1) - top * prep.tau
    with np.errstate(invalid="ignore"):  # failed rows hold NaN
        value = np.sum(np.where(finite, fwd.p * np.where(finite, x64, 0.0), 0.0), axis=-1)
    value = np.where(failed, np.nan, value)
    potential = None
    potential_fn = prep.spec.capabilities.potential
    if potential_fn is not None:
        with np.errstate(all="ignore"):
            phi = potential_fn(fwd, prep.z, prep.k)
        potential = np.where(failed, np.nan, prep.tau * phi + prep.k * shift)
        potential = potential.reshape(prep.shape[:-1])
    return TopKSum(
        method=prep.spec.name, k=prep.k, tau=prep.tau, value=value.reshape(prep.shape[:-1]),
        potential=potential, status=fwd.codes().reshape(prep.shape[:-1]), failures=failures,
    )


def soft_topk_sum(
    x: ArrayLike, k: int, method: str = DEFAULT_METHOD, *, tau: float = 1.0, **params: int | float
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
    result = evaluate_sum(x, k, method, tau=tau, **params)
    if result.failures:
        raise NumericalFailureError(result.failures)
    return result.value, result.potential
