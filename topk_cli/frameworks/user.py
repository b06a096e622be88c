"""A user's own operator: loaded from ``FILE.py:FUNCTION``, ``package.module:FUNCTION`` or a callable,
and run guarded, in numpy, PyTorch or JAX.

The function is called as ``fn(x, k, tau)`` and returns weights of ``x``'s shape. ``x`` reaches it as
the framework's array (numpy ``ndarray``, ``torch.Tensor``, ``jax.Array``) of the requested dtype
(float64 unless asked otherwise; JAX without x64 gives float32, and the dtype that came back is
reported, never hidden); ``k`` and ``tau`` as given: a Python number, or, when they differ per row,
an array of shape ``(B, 1)`` beside a ``(B, n)`` batch. The weights come back as numpy float64.

**Batched or one vector.** A function written for one vector is detected on its first call on a
batch: it is run on a two-row probe batch (the first row of the input and that row rolled by one
and doubled) and on each row alone. When the rows alone work but the batch raises, comes back in
another shape, or differs from the rows computed alone (a function that sums over the whole array
treats the batch as one vector), the function is called row by row from then on
(:attr:`UserOperator.row_by_row`, with the reason in :attr:`UserOperator.row_reason`).

**Guarded.** Every call captures what the function prints on stdout and the warnings it raises,
and turns an exception, an output that is not an array of the framework, of the wrong shape or
dtype, or not finite into a finding (:class:`CallResult`), never an exception of softtopk. A call
that never returns is not interrupted (Python cannot stop a running function safely); Ctrl-C
stops the command as usual.

**Gradients** come from the framework's autodiff (``torch.autograd.grad``, ``jax.vjp``); a numpy
operator has none (:attr:`UserOperator.has_gradient` is False), and no finite difference stands
in for it.

Importing a user's file runs its code, as ``python FILE.py`` would; the file's folder is first on
``sys.path`` while it is imported, so that its sibling modules import as when Python runs a script
(and last afterwards, so that a file named like a library cannot shadow what softtopk imports later).

torch and JAX are imported here only inside functions, when an operator of that framework runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import io
import os
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InvalidArgumentError

FloatArray = NDArray[np.float64]

#: The frameworks a user's operator may be written in.
FRAMEWORKS = ("numpy", "torch", "jax")
#: The dtypes a user's operator may be run in.
DTYPES = ("float64", "float32", "bfloat16", "float16")

#: Relative and absolute tolerance, per dtype, within which a batched call must agree with the
#: rows computed one at a time to count as batched (a batch may be summed in another order).
_BATCH_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "bfloat16": 5e-2, "float16": 1e-2}


class UserOperatorError(InvalidArgumentError):
    """A user's operator that cannot be loaded: a missing file, module or function, a syntax error or
    an exception while importing it. The message is one line and starts with ``FILE:LINE:`` where a
    line is known (the CLI exits with code 2)."""


@dataclass
class CallResult:
    """What one guarded call of a user's function gave.

    ``p``: the weights as numpy float64 (None when the call gave nothing usable; non-finite entries
    are kept, with ``error`` kind ``nan-inf``); ``out_dtype``: the dtype of what came back
    (``"float32"``...); ``error``: None or ``(kind, message)`` with kind ``exception``,
    ``not-an-array``, ``wrong-shape``, ``wrong-dtype``, ``nan-inf`` or, for gradients, ``no-gradient``;
    ``row_errors``: when called row by row, ``row -> (kind, message)`` of every failed row (``error``
    is the first of them); ``stdout``: the text the function printed (captured, never on softtopk's
    stdout); ``warnings``: the warnings it raised, as ``Category: message``; ``input_changed``: the
    array passed in differs after the call (after the backward pass too, for a VJP);
    ``requires_grad``: a torch output that still requires grad (outside a gradient computation);
    ``vjp``: ``v^T dp/dx`` (numpy float64) for :meth:`UserOperator.vjp`; ``jacobian``: ``dp/dx``
    ``(B, n, n)`` for :meth:`UserOperator.jacobian`; ``seconds``: wall time spent inside the user's
    code (forward, and backward for derivatives), the rest of a call being the tool's overhead.
    """

    p: FloatArray | None = None
    out_dtype: str | None = None
    error: tuple[str, str] | None = None
    row_errors: dict[int, tuple[str, str]] = field(default_factory=dict)
    stdout: str = ""
    warnings: list[str] = field(default_factory=list)
    input_changed: bool = False
    requires_grad: bool = False
    vjp: FloatArray | None = None
    jacobian: FloatArray | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the call gave finite weights of the right shape (and the derivative asked for)."""
        return self.error is None

    def absorb(self, other: CallResult) -> None:
        """Add ``other``'s side effects (printed text, warnings, input changes, time) to this one."""
        self.stdout += other.stdout
        self.warnings.extend(w for w in other.warnings if w not in self.warnings)
        self.input_changed = self.input_changed or other.input_changed
        self.requires_grad = self.requires_grad or other.requires_grad
        self.seconds += other.seconds


# ---------------------------------------------------------------------------------------------
# framework backends: array conversion and autodiff (torch and JAX imported here, lazily)


class _Backend:
    name = "numpy"
    has_gradient = False

    def array(self, x: NDArray[Any], dtype: str) -> Any:
        """A new array of the framework holding ``x`` in ``dtype``."""
        return np.array(x, dtype=_numpy_dtype(dtype))

    def is_array(self, out: object) -> bool:
        return isinstance(out, np.ndarray)

    def dtype_name(self, out: Any) -> str:
        return str(out.dtype)

    def is_real_float(self, out: Any) -> bool:
        return bool(out.dtype.kind == "f" or str(out.dtype) == "bfloat16")

    def to_numpy(self, out: Any) -> FloatArray:
        return np.array(out, dtype=np.float64)

    def requires_grad(self, out: Any) -> bool:
        return False

    def snapshot(self, arr: Any, *, copy: bool = True) -> FloatArray:
        """``arr``'s values as float64 (``copy=False``: a view where it already is float64 in memory)."""
        if not copy and isinstance(arr, np.ndarray) and arr.dtype == np.float64:
            return arr
        return self.to_numpy(arr)

    def vjp(self, fn: Callable[[Any], Any], xa: Any, v: FloatArray) -> tuple[Any, Callable[[], Any]]:
        raise NotImplementedError

    def jacobian(self, fn: Callable[[Any], Any], xa: Any) -> tuple[Any, Callable[[], Any]]:
        raise NotImplementedError


def _numpy_dtype(dtype: str) -> Any:
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


class _NoGradient(Exception):
    """The output does not depend differentiably on the input (no graph to differentiate)."""


class _Torch(_Backend):
    name = "torch"
    has_gradient = True

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def array(self, x: NDArray[Any], dtype: str) -> Any:
        torch = self.torch
        return torch.from_numpy(np.array(x, dtype=np.float64)).to(getattr(torch, dtype))

    def is_array(self, out: object) -> bool:
        return isinstance(out, self.torch.Tensor)

    def dtype_name(self, out: Any) -> str:
        return str(out.dtype).removeprefix("torch.")

    def is_real_float(self, out: Any) -> bool:
        return bool(out.dtype.is_floating_point)

    def to_numpy(self, out: Any) -> FloatArray:
        converted = out.detach().to("cpu", self.torch.float64)
        values: FloatArray = converted.numpy()
        # one copy: the user's tensor's own memory is never handed on (it may be changed later)
        return values.copy() if converted.data_ptr() == out.data_ptr() else values

    def requires_grad(self, out: Any) -> bool:
        return bool(out.requires_grad)

    def snapshot(self, arr: Any, *, copy: bool = True) -> FloatArray:
        if not copy and arr.dtype == self.torch.float64 and arr.device.type == "cpu":
            values: FloatArray = arr.detach().numpy()
            return values
        return self.to_numpy(arr)

    def _traced(self, fn: Callable[[Any], Any], xa: Any) -> Any:
        """``fn(xa)`` recorded by autograd (the user's forward, once, for the derivatives that follow)."""
        xa.requires_grad_(True)
        with self.torch.enable_grad():
            return fn(xa)

    def _grad(self, out: Any, xa: Any, cotangent: Any, *, retain: bool = False) -> Any:
        """``cotangent^T d out / d xa`` (zeros where ``out`` does not depend on ``xa``)."""
        if not out.requires_grad:
            raise _NoGradient("the output does not require grad: it is not computed from x by torch operations")
        (g,) = self.torch.autograd.grad(out, xa, grad_outputs=cotangent, retain_graph=retain, allow_unused=True)
        return self.torch.zeros_like(xa) if g is None else g

    def vjp(self, fn: Callable[[Any], Any], xa: Any, v: FloatArray) -> tuple[Any, Callable[[], Any]]:
        out = self._traced(fn, xa)
        return out, lambda: self._grad(out, xa, self.torch.from_numpy(v).to(out.dtype))

    def jacobian(self, fn: Callable[[Any], Any], xa: Any) -> tuple[Any, Callable[[], Any]]:
        torch = self.torch
        out = self._traced(fn, xa)

        def backward() -> Any:
            n = out.shape[-1]
            rows = []
            for i in range(n):  # one VJP per one-hot cotangent, the whole batch at once
                e = torch.zeros_like(out)
                e[..., i] = 1
                rows.append(self._grad(out, xa, e, retain=i < n - 1))
            return torch.stack(rows, dim=-2)

        return out, backward


class _Jax(_Backend):
    name = "jax"
    has_gradient = True

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp

    def array(self, x: NDArray[Any], dtype: str) -> Any:
        with warnings.catch_warnings():  # float64 without x64 becomes float32: reported as the dtype that came back
            warnings.simplefilter("ignore")
            return self.jnp.asarray(np.array(x, dtype=np.float64), dtype=getattr(self.jnp, dtype))

    def is_array(self, out: object) -> bool:
        return isinstance(out, self.jax.Array)

    def is_real_float(self, out: Any) -> bool:
        return bool(self.jnp.issubdtype(out.dtype, self.jnp.floating))

    def to_numpy(self, out: Any) -> FloatArray:
        return np.array(np.asarray(out), dtype=np.float64)

    def snapshot(self, arr: Any, *, copy: bool = True) -> FloatArray:
        return np.empty(0)  # a jax.Array is immutable: nothing can change it in place

    def vjp(self, fn: Callable[[Any], Any], xa: Any, v: FloatArray) -> tuple[Any, Callable[[], Any]]:
        out, pullback = self.jax.vjp(fn, xa)

        def backward() -> Any:
            (g,) = pullback(self.jnp.asarray(v, dtype=out.dtype))
            return g

        return out, backward

    def jacobian(self, fn: Callable[[Any], Any], xa: Any) -> tuple[Any, Callable[[], Any]]:
        out, pullback = self.jax.vjp(fn, xa)

        def backward() -> Any:
            jnp = self.jnp
            n = out.shape[-1]
            eye = jnp.eye(n, dtype=out.dtype)
            cotangents = jnp.broadcast_to(eye[:, None, :] if out.ndim == 2 else eye, (n, *out.shape))
            try:
                (rows,) = self.jax.vmap(pullback)(cotangents)  # (n, B, n): row i = e_i^T dp/dx
            except Exception:  # a pullback vmap cannot batch: one VJP at a time
                rows = jnp.stack([pullback(c)[0] for c in cotangents])
            return jnp.moveaxis(rows, 0, -2)

        return out, backward


_BACKENDS: dict[str, _Backend] = {}


def _backend(name: str) -> _Backend:
    if name not in _BACKENDS:
        _BACKENDS[name] = {"numpy": _Backend, "torch": _Torch, "jax": _Jax}[name]()
    return _BACKENDS[name]


# ---------------------------------------------------------------------------------------------
# the operator


@dataclass
class UserOperator:
    """A user's function ``fn(x, k, tau)`` with the framework it is written in.

    ``name`` is the spec as the user wrote it (``ops.py:my_topk``); ``row_by_row`` becomes True on
    the first call on a batch if the function works on one vector only (see the module docstring,
    ``row_reason`` says why); ``has_gradient``: the framework gives a VJP (PyTorch, JAX).
    """

    name: str
    framework: str
    fn: Callable[..., Any] = field(repr=False)
    row_by_row: bool = False
    row_reason: str = ""
    source: str = ""  # where the function is defined, FILE:LINE when known
    origin: str = ""  # what the spec resolved to when loaded (see :func:`spec_origin`)
    _detected: bool = field(default=False, repr=False)

    @property
    def has_gradient(self) -> bool:
        return self.framework != "numpy"

    @property
    def backend(self) -> _Backend:
        return _backend(self.framework)

    # -- calls ---------------------------------------------------------------------------------

    def call(self, x: NDArray[Any], k: Any, tau: Any, *, dtype: str = "float64") -> CallResult:
        """Run the function on ``x`` (numpy, converted to the framework's array of ``dtype``), guarded.

        ``x`` is one vector ``(n,)`` or a batch ``(B, n)``; ``k`` and ``tau`` numbers, or arrays with one
        value per row (passed as ``(B, 1)`` arrays of the framework). A function found to work on one
        vector only is called row by row.
        """
        return self._dispatch("forward", x, k, tau, None, dtype)

    def vjp(self, x: NDArray[Any], k: Any, tau: Any, v: NDArray[Any], *, dtype: str = "float64") -> CallResult:
        """The forward pass and ``v^T dp/dx`` by the framework's autodiff (``.vjp``), guarded; error kind
        ``no-gradient`` for a numpy operator or an output autodiff cannot differentiate."""
        return self._dispatch("vjp", x, k, tau, np.asarray(v, dtype=np.float64), dtype)

    def jacobian(self, x: NDArray[Any], k: Any, tau: Any, *, dtype: str = "float64") -> CallResult:
        """The forward pass and ``dp/dx`` (``.jacobian``, shape ``(*x.shape, n)``) from one VJP per one-hot
        cotangent, each on the whole batch."""
        return self._dispatch("jacobian", x, k, tau, None, dtype)

    def _dispatch(self, mode: str, x: NDArray[Any], k: Any, tau: Any, v: FloatArray | None, dtype: str) -> CallResult:
        if dtype not in DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        x = np.asarray(x, dtype=np.float64)
        if mode != "forward" and not self.has_gradient:  # the forward alone, and why there is no derivative
            out = self._dispatch("forward", x, k, tau, None, dtype)
            out.error = ("no-gradient", "a numpy function has no gradient (write it in PyTorch or JAX for one); "
                                        "no finite difference stands in for it")
            return out
        if x.ndim != 2:
            return self._once(mode, x, k, tau, v, dtype)
        side = CallResult()
        if not self._detected:
            self._detect(x, k, tau, dtype, side)
        if not self.row_by_row:
            out = self._once(mode, x, _rows_arg(k), _rows_arg(tau), v, dtype)
            out.absorb(side)
            out.seconds -= side.seconds  # the detection's time is not this call's
            return out
        result = self._by_rows(mode, x, k, tau, v, dtype)
        result.absorb(side)
        result.seconds -= side.seconds
        return result

    def _by_rows(self, mode: str, x: FloatArray, k: Any, tau: Any, v: FloatArray | None, dtype: str) -> CallResult:
        bsz, n = x.shape
        out = CallResult(p=np.full((bsz, n), np.nan))
        if mode == "vjp":
            out.vjp = np.full((bsz, n), np.nan)
        if mode == "jacobian":
            out.jacobian = np.full((bsz, n, n), np.nan)
        for b in range(bsz):
            r = self._once(mode, x[b], _row_value(k, b), _row_value(tau, b), None if v is None else v[b], dtype)
            out.absorb(r)
            out.out_dtype = out.out_dtype or r.out_dtype
            if r.p is not None and r.p.shape == (n,):
                out.p[b] = r.p  # type: ignore[index]
            if r.vjp is not None and out.vjp is not None:
                out.vjp[b] = r.vjp
            if r.jacobian is not None and out.jacobian is not None:
                out.jacobian[b] = r.jacobian
            if r.error is not None:
                out.row_errors[b] = r.error
                if out.error is None:
                    out.error = (r.error[0], f"row {b}: {r.error[1]}")
        if all(kind != "nan-inf" for kind, _ in out.row_errors.values()) and len(out.row_errors) == bsz:
            out.p = out.vjp = out.jacobian = None  # nothing usable came back
        return out

    def _detect(self, x: FloatArray, k: Any, tau: Any, dtype: str, side: CallResult) -> None:
        """Decide once whether the function takes a batch (see the module docstring)."""
        self._detected = True
        x0 = x[0]
        probe = np.stack([x0, 2.0 * np.roll(x0, 1)])
        k0, tau0 = _row_value(k, 0), _row_value(tau, 0)
        batched = self._once("forward", probe, k0, tau0, None, dtype)
        rows = [self._once("forward", probe[i], k0, tau0, None, dtype) for i in range(2)]
        for r in (batched, *rows):
            side.absorb(r)
        n = x.shape[1]
        if not all(r.p is not None and r.p.shape == (n,) and (r.error is None or r.error[0] == "nan-inf") for r in rows):
            return  # one vector alone does not work either: call with the batch, findings as they come
        if batched.p is None or batched.p.shape != probe.shape:
            self.row_by_row = True
            why = batched.error[1] if batched.error else "it returned another shape"
            self.row_reason = f"it fails on a (B, n) batch but works on one row ({why})"
            return
        single = np.stack([r.p for r in rows if r.p is not None])
        tol = _BATCH_TOLERANCE[dtype]
        if not np.allclose(batched.p, single, rtol=tol, atol=tol, equal_nan=True):
            self.row_by_row = True
            self.row_reason = (
                "on a (B, n) batch its rows differ from the rows computed one at a time (it treats the "
                "batch as one vector)"
            )

    def _once(self, mode: str, x: FloatArray, k: Any, tau: Any, v: FloatArray | None, dtype: str) -> CallResult:
        """One guarded call on ``x`` as it is (one vector or a batch)."""
        res = CallResult()
        try:
            backend = self.backend
            xa = backend.array(x, dtype)
            ka, taua = (backend.array(a, dtype) if isinstance(a, np.ndarray) else a for a in (k, tau))
            # float64 scores are x itself (which the user never sees); other dtypes are rounded copies
            before = x if dtype == "float64" and backend.name != "jax" else backend.snapshot(xa)
        except Exception as exc:  # ml_dtypes missing, a framework that fails to import
            res.error = ("exception", f"could not convert the input to {self.framework} {dtype}: {_one_line(exc)}")
            return res

        def fn(a: Any) -> Any:
            return self.fn(a, ka, taua)

        backward: Callable[[], Any] | None = None
        out: Any = None
        buffer = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buffer):
            warnings.simplefilter("always")
            start = time.perf_counter()
            try:
                if mode == "forward":
                    out = fn(xa)
                elif not backend.has_gradient:
                    out = fn(xa)
                elif mode == "vjp":
                    assert v is not None
                    out, backward = backend.vjp(fn, xa, v)
                else:
                    out, backward = backend.jacobian(fn, xa)
            except (Exception, SystemExit) as exc:  # the user's code raised: a finding
                res.error = ("exception", _describe(exc))
            finally:
                res.seconds = time.perf_counter() - start
        res.stdout = buffer.getvalue()
        res.warnings = [f"{w.category.__name__}: {w.message}" for w in caught]
        if res.error is None:
            self._check_output(res, out, x.shape, backend)
            if mode != "forward":
                res.requires_grad = False  # differentiated on purpose: its output requires grad
        if mode != "forward" and res.error is None:
            self._derivative(res, mode, backend, backward, x.shape)
        res.input_changed = _changed(before, _safe_snapshot(backend, xa))
        return res

    def _check_output(self, res: CallResult, out: Any, shape: tuple[int, ...], backend: _Backend) -> None:
        if not backend.is_array(out):
            expected = {"numpy": "a numpy.ndarray", "torch": "a torch.Tensor", "jax": "a jax.Array"}[self.framework]
            res.error = ("not-an-array", f"returned {type(out).__module__}.{type(out).__qualname__}, not {expected}")
            return
        res.out_dtype = backend.dtype_name(out)
        res.requires_grad = backend.requires_grad(out)
        if tuple(out.shape) != tuple(shape):
            res.error = ("wrong-shape", f"returned shape {tuple(out.shape)} for an input of shape {tuple(shape)}")
            return
        if not backend.is_real_float(out):
            res.error = ("wrong-dtype", f"returned dtype {res.out_dtype}, not a real floating-point dtype")
            return
        try:
            res.p = backend.to_numpy(out)
        except Exception as exc:
            res.error = ("not-an-array", f"its output could not be read as numbers: {_one_line(exc)}")
            return
        with np.errstate(over="ignore", invalid="ignore"):
            finite = bool(np.isfinite(np.sum(res.p)))  # a finite sum proves every entry finite
        if not finite and not np.isfinite(res.p).all():
            bad = np.argwhere(~np.isfinite(res.p))[0]
            res.error = ("nan-inf", f"returned {res.p[tuple(bad)]} at index {tuple(int(i) for i in bad)}")

    def _derivative(self, res: CallResult, mode: str, backend: _Backend, backward: Callable[[], Any] | None,
                    shape: tuple[int, ...]) -> None:
        if backward is None:
            res.error = ("no-gradient", f"{self.name} has no gradient")
            return
        start = time.perf_counter()
        buffer = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buffer):
            warnings.simplefilter("always")
            try:
                g = backward()
            except _NoGradient as exc:
                res.error = ("no-gradient", str(exc))
                return
            except (Exception, SystemExit) as exc:
                res.error = ("exception", "in the backward pass: " + _describe(exc))
                return
            finally:
                res.seconds += time.perf_counter() - start
                res.stdout += buffer.getvalue()
                res.warnings.extend(f"{w.category.__name__}: {w.message}" for w in caught)
        try:
            values = backend.to_numpy(g)
        except Exception as exc:
            res.error = ("exception", f"in the backward pass: could not read the gradient: {_one_line(exc)}")
            return
        if mode == "vjp":
            res.vjp = values
        else:
            res.jacobian = values
        if not np.isfinite(values).all() and res.error is None:
            res.error = ("nan-inf", "the gradient is not finite")


def _changed(before: FloatArray, after: FloatArray) -> bool:
    """Whether two float64 snapshots differ in any bit (NaN payloads and signed zeros included)."""
    if before.shape != after.shape:
        return True
    return not np.array_equal(before.view(np.uint64), after.view(np.uint64))


def _safe_snapshot(backend: _Backend, xa: Any) -> FloatArray:
    try:
        return backend.snapshot(xa, copy=False)
    except Exception:  # the user replaced the storage with something unreadable
        return np.full(1, np.nan)


def _rows_arg(value: Any) -> Any:
    """``k`` or ``tau`` for a batched call: a number, or a ``(B, 1)`` array when rows differ."""
    if isinstance(value, np.ndarray):
        flat = np.asarray(value, dtype=np.float64).reshape(-1)
        if flat.size and bool((flat == flat[0]).all()):
            return float(flat[0])
        return flat.reshape(-1, 1)
    return value


def _row_value(value: Any, b: int) -> Any:
    """``k`` or ``tau`` of row ``b``: the number itself, or that row's entry of a per-row array."""
    if isinstance(value, np.ndarray):
        return float(np.asarray(value, dtype=np.float64).reshape(-1)[b])
    return value


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."


def _describe(exc: BaseException) -> str:
    """``ExcType: message (at FILE:LINE)`` of an exception raised in user code, one line."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith(_PACKAGE_DIR)]
    if user:
        where = f" (at {user[-1].filename}:{user[-1].lineno})"
    message = _one_line(exc)
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


# ---------------------------------------------------------------------------------------------
# loading


_MODULES: dict[str, types.ModuleType] = {}


def load_user_operator(spec: str | Callable[..., Any], *, framework: str = "auto") -> UserOperator:
    """The user's operator named by ``spec``: ``FILE.py:FUNCTION`` (a path, relative or absolute),
    ``package.module:FUNCTION`` (importable) or a callable; ``framework`` ``auto`` detects numpy,
    PyTorch or JAX from what the function's module imports.

    Raises:
        UserOperatorError: a missing file, module or function, a syntax error or an exception while
            importing (one line, ``FILE:LINE: ...``), or a framework that cannot be detected.
    """
    if framework not in ("auto", *FRAMEWORKS):
        raise InvalidArgumentError(f"--framework must be one of auto, {', '.join(FRAMEWORKS)}, got {framework!r}")
    if callable(spec) and not isinstance(spec, str):
        fn = spec
        name = _callable_name(fn)
    elif isinstance(spec, str):
        name = spec
        fn = _load_function(spec)
    else:
        raise InvalidArgumentError(f"a method is a name, FILE.py:FUNCTION, package.module:FUNCTION or a callable, got {spec!r}")
    chosen = detect_framework(fn, name) if framework == "auto" else framework
    if chosen != "numpy":
        try:
            _backend(chosen)
        except ImportError as exc:
            raise UserOperatorError(f"{name}: runs in {chosen}, which is not installed ({_one_line(exc)}); "
                                    f"install softtopk[{chosen}]") from None
    origin = spec_origin(spec) if isinstance(spec, str) else ""
    return UserOperator(name=name, framework=chosen, fn=fn, source=_source_of(fn), origin=origin)


def spec_origin(spec: str) -> str:
    """What a spec string names from here: ``ABSOLUTE_FILE:FUNCTION`` for a file (a relative path
    depends on the working directory), the spec itself for a module."""
    left, _, fname = spec.rpartition(":")
    if _is_file_spec(left.strip()):
        return f"{Path(left.strip()).expanduser().resolve()}:{fname.strip()}"
    return spec


def is_user_spec(name: object) -> bool:
    """True for what names a user's operator rather than a registered method: a callable, or a string
    of the form ``FILE.py:FUNCTION`` / ``package.module:FUNCTION``."""
    if callable(name) and not isinstance(name, str):
        return True
    if not isinstance(name, str) or ":" not in name:
        return False
    left, _, right = name.rpartition(":")
    return bool(left.strip()) and right.strip().isidentifier()


def _callable_name(fn: Callable[..., Any]) -> str:
    qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}:{qual}" if module and module != "__main__" else str(qual)


def _source_of(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""


def _is_file_spec(left: str) -> bool:
    return left.endswith(".py") or "/" in left or os.sep in left or (os.altsep is not None and os.altsep in left)


def _load_function(spec: str) -> Callable[..., Any]:
    left, _, fname = spec.rpartition(":")
    left, fname = left.strip(), fname.strip()
    module = _load_file(left) if _is_file_spec(left) else _load_module(left)
    where = left
    if not hasattr(module, fname):
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        listed = f" (functions defined there: {', '.join(defined)})" if defined else " (it defines no function)"
        raise UserOperatorError(f"{where}: no function {fname!r}{listed}")
    fn = getattr(module, fname)
    if not callable(fn):
        raise UserOperatorError(f"{where}: {fname!r} is a {type(fn).__name__}, not a function")
    return fn


def _load_file(path_text: str) -> types.ModuleType:
    path = Path(path_text).expanduser()
    if not path.is_file():
        what = "is a folder, not a Python file" if path.is_dir() else "no such file"
        raise UserOperatorError(f"{path_text}: {what}")
    resolved = str(path.resolve())
    if resolved in _MODULES:
        return _MODULES[resolved]
    folder = str(path.resolve().parent)
    # First on sys.path while the file is imported, so that its sibling modules import as when Python
    # runs it as a script; then last, so that a file of the user's folder named like a library
    # (json.py, rich.py) cannot shadow what softtopk imports later, while a sibling the function
    # imports when called is still found.
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:10]
    mod_name = f"_softtopk_user_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    if spec is None or spec.loader is None:
        raise UserOperatorError(f"{path_text}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        _exec_import(lambda: spec.loader.exec_module(module), path_text, resolved)  # type: ignore[union-attr]
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.append(folder)
    _MODULES[resolved] = module
    return module


def _load_module(name: str) -> types.ModuleType:
    module: types.ModuleType = _exec_import(lambda: importlib.import_module(name), name, None)
    return module


def _exec_import(run: Callable[[], Any], shown: str, resolved: str | None) -> Any:
    """Run an import, turning what the user's code raises into one :class:`UserOperatorError` line
    naming the file and line (stdout of the imported code goes to stderr: softtopk's stdout carries data)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return run()
    except SyntaxError as exc:
        where = f"{exc.filename or shown}:{exc.lineno}" if exc.lineno else (exc.filename or shown)
        raise UserOperatorError(f"{where}: syntax error: {exc.msg}") from None
    except ModuleNotFoundError as exc:
        if resolved is None and exc.name is not None and (shown == exc.name or shown.startswith(exc.name + ".")):
            raise UserOperatorError(f"{shown}: no module named {exc.name!r} (not importable from here; "
                                    "name a file as FILE.py:FUNCTION)") from None
        raise UserOperatorError(f"{_where(exc, shown)}: {type(exc).__name__}: {_one_line(exc)}") from None
    except (Exception, SystemExit) as exc:
        raise UserOperatorError(f"{_where(exc, shown)}: {type(exc).__name__}: {_one_line(exc)}") from None


def _where(exc: BaseException, shown: str) -> str:
    """``FILE:LINE`` of the innermost frame outside Python's import machinery and softtopk."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "importlib" not in f.filename and not f.filename.startswith(_PACKAGE_DIR) and not f.filename.startswith("<")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else shown


def detect_framework(fn: Callable[..., Any], name: str = "") -> str:
    """``numpy``, ``torch`` or ``jax``: the framework a function's module (its globals) imports.

    Raises:
        UserOperatorError: it imports both torch and JAX (``--framework`` decides).
    """
    found: set[str] = set()
    target = _unwrap(fn)
    namespace = getattr(target, "__globals__", None)
    if namespace is None:
        module = sys.modules.get(getattr(target, "__module__", "") or "")
        namespace = vars(module) if module is not None else {}
    for value in list(namespace.values()):
        root = _root_module(value)
        if root in ("torch", "jax", "jaxlib", "flax", "equinox"):
            found.add("torch" if root == "torch" else "jax")
    module_name = getattr(target, "__module__", "") or ""
    for framework in ("torch", "jax"):
        if module_name == framework or module_name.startswith(framework + "."):
            found.add(framework)
    if len(found) > 1:
        raise UserOperatorError(f"{name or _callable_name(fn)}: its module imports both torch and jax: "
                                "say which one it runs in with --framework torch|jax")
    return found.pop() if found else "numpy"


def _unwrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    import functools
    import inspect

    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.unwrap(fn)


def _root_module(value: object) -> str | None:
    if isinstance(value, types.ModuleType):
        return value.__name__.split(".")[0]
    module = getattr(value, "__module__", None)
    if isinstance(module, str) and (isinstance(value, type) or callable(value)):
        return module.split(".")[0]
    return None
