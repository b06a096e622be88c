"""A user's operator as a method: the :class:`~topk_cli.method_spec.MethodSpec` the registry resolves
``FILE.py:FUNCTION``, ``package.module:FUNCTION`` or a callable into, so that it goes everywhere a
registered method goes (the API, every command, every analysis).

It claims nothing (every :class:`Guarantees` flag False, smoothness ``discontinuous``): what it does is
measured, never assumed. Its capabilities: a real k (passed to the function as given), a Jacobian and
VJP when its framework has autodiff (PyTorch, JAX), no potential, not probed by default. Its
implementation receives ``x`` and ``tau`` as given (``Implementation.takes_x``): the API neither shifts
nor scales the scores, nor averages ties, so what the function returns is what the user sees.

What the calls revealed besides the weights (text printed on stdout, warnings, an input modified in
place, an output that still requires grad, another dtype back, row-by-row calls) is collected per
operator in :attr:`UserMethodLog.notes`, for the CLI to print on stderr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topk_cli.errors import InvalidArgumentError, NumericalFailureError, RowFailure
from topk_cli.frameworks.user import CallResult, UserOperator
from topk_cli.method_spec import Capabilities, FailureCode, Guarantees, MethodSpec, ProbeReference
from topk_cli.operators._base import OK, FloatArray, Forward, Implementation

#: The failure codes a user's operator may get per row (beside the API's ``nan``).
USER_FAILURES = (
    FailureCode("exception", "the user's function raised an exception on this row"),
    FailureCode("wrong-shape", "the user's function returned an array of another shape than its input"),
    FailureCode("not-an-array", "the user's function returned something that is not an array of its framework"),
    FailureCode("wrong-dtype", "the user's function returned an array that is not real floating point"),
)

#: A user's operator claims nothing.
NO_CLAIMS = Guarantees(
    range=False, sum=False, monotone_weak=False, monotone_strict=False, shift_invariant=False,
    permutation_equivariant=False, hard_limit=False, softmax_at_k1=False, jacobian=False, finite=False,
    smoothness="discontinuous",
)


@dataclass
class UserMethodLog:
    """What the calls of one user's operator revealed besides the weights, in order, each once."""

    notes: list[str] = field(default_factory=list)
    printed: list[str] = field(default_factory=list)
    #: Wall seconds spent inside the user's code over every call so far (the tool's overhead is the rest).
    seconds: float = 0.0

    def add(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def record(self, op: UserOperator, result: CallResult, dtype: str) -> None:
        self.seconds += result.seconds
        if result.stdout:
            self.printed.append(result.stdout)
        for w in result.warnings:
            self.add(f"it warned: {w}")
        if result.input_changed:
            self.add("it modified its input array in place (the tool passes it a copy)")
        if result.requires_grad:
            self.add("its output still requires grad outside a gradient computation (a leaf or parameter "
                     "created inside the function?)")
        if result.out_dtype is not None and result.out_dtype != dtype:
            self.add(f"it returned {result.out_dtype} for {dtype} scores"
                     + (" (JAX without x64 computes float64 in float32: set JAX_ENABLE_X64=1)"
                        if op.framework == "jax" and dtype == "float64" and result.out_dtype == "float32" else ""))
        if op.row_by_row:
            self.add(f"it is called row by row: {op.row_reason}")


@dataclass(frozen=True)
class UserMethod:
    """A user's operator with the dtype its scores are given in, and its log."""

    op: UserOperator
    dtype: str = "float64"
    log: UserMethodLog = field(default_factory=UserMethodLog)
    framework_asked: str = "auto"  # what the caller asked for (the framework detected is op.framework)

    def _record(self, result: CallResult) -> CallResult:
        self.log.record(self.op, result, self.dtype)
        return result

    def forward(self, z: FloatArray, k: Any, *, tau: Any = 1.0) -> Forward:
        result = self._record(self.op.call(z, k, tau, dtype=self.dtype))
        bsz, n = z.shape
        p = result.p if result.p is not None and result.p.shape == z.shape else np.full((bsz, n), np.nan)
        codes = np.full(bsz, OK, dtype="<U16")
        messages: dict[int, str] = {}
        errors = result.row_errors or ({b: result.error for b in range(bsz)} if result.error else {})
        for b, (kind, message) in errors.items():
            if kind != "nan-inf":
                codes[b] = kind
            messages[b] = message  # a non-finite weight keeps code ok here: the API gives it its "nan" code
        failed = bool((codes != OK).any())
        return Forward(p=p, q=1.0 - p, code=codes if failed else None, messages=messages)

    def _derivative(self, result: CallResult, values: FloatArray | None, z: FloatArray, what: str) -> FloatArray:
        self._record(result)
        if values is not None and result.error is None:
            return values
        kind, message = result.error or ("exception", "no derivative came back")
        if kind == "no-gradient":
            raise InvalidArgumentError(f"the {what} of {self.op.name!r} is not available: {message}")
        bsz = z.shape[0]
        rows = sorted(result.row_errors) or list(range(bsz))
        raise NumericalFailureError(tuple(
            RowFailure(method=self.op.name, row=(b,) if bsz > 1 else (), code=kind if kind != "nan-inf" else "nan",
                       detail=f"the {what}: {(result.row_errors.get(b) or (kind, message))[1]}")
            for b in rows
        ))

    def jacobian(self, fwd: Forward, z: FloatArray, k: Any, *, tau: Any = 1.0) -> FloatArray:
        result = self.op.jacobian(z, k, tau, dtype=self.dtype)
        return self._derivative(result, result.jacobian, z, "Jacobian")

    def vjp(self, fwd: Forward, z: FloatArray, k: Any, v: FloatArray, *, tau: Any = 1.0) -> FloatArray:
        result = self.op.vjp(z, k, tau, v, dtype=self.dtype)
        return self._derivative(result, result.vjp, z, "vector-Jacobian product")

    def spec(self) -> MethodSpec:
        op = self.op
        where = f", defined at {op.source}" if op.source else ""
        dtype = f", run in {self.dtype}" if self.dtype != "float64" else ""
        gradient = "gradients by its autodiff" if op.has_gradient else "no gradient (numpy)"
        return MethodSpec(
            name=op.name,
            summary=f"Your own operator: {op.framework}{dtype}, {gradient}.",
            family="user",
            guarantees=NO_CLAIMS,
            reference=f"the user's function {op.name}{where}",
            notes="Importing it ran its code. It claims nothing: every property is measured.",
            implementation=Implementation(
                forward=self.forward, jacobian=self.jacobian, vjp=self.vjp, row_k=True, takes_x=True,
            ),
            capabilities=Capabilities(jacobian=op.has_gradient, integer_k=False, probe_default=False),
            probe=ProbeReference("none: a user's operator has no reference of its own"),
            failures=USER_FAILURES,
        )
