"""Run several methods side by side on loaded vectors: what ``softtopk compute`` shows.

:func:`build_compute_report` runs the library (``evaluate`` per method, the hard top-k, the
Jacobian of the rows that succeeded, and for ``grad-recursive`` the predicted distance to its
stability boundary) and returns a :class:`ComputeReport`; ``topk_cli.render.compute`` turns it
into text. Failures are recorded per row, never raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from topk_cli.analysis.probe import RecursionOutlook, grad_recursive_outlook
from topk_cli.api import evaluate, jacobian, soft_topk
from topk_cli.errors import InputError, InvalidArgumentError, NumericalFailureError, RowFailure
from topk_cli.inputs import LoadedInput

#: ``compute`` warns about a ``grad-recursive`` row that succeeded when the recursion is predicted
#: to lose at least this many decimal digits on it: rows that lose about 3.5 or more are already
#: refused (``cancellation``), so such a row sits just inside the stability boundary.
BOUNDARY_WARNING_DIGITS = 2.5
#: Largest Jacobian ``--jacobian`` will form (numbers over all rows and methods).
MAX_JACOBIAN_NUMBERS = 10_000_000

@dataclass(frozen=True)
class MethodRun:
    """One method on every row: weights ``(B, n)`` (NaN on failed rows), status per row.

    ``jacobian`` is ``(B, n, n)`` ``d p_i / d x_j`` (NaN on failed rows) under ``--jacobian``.
    """

    method: str
    weights: NDArray[np.float64]
    status: NDArray[np.str_]
    failures: tuple[RowFailure, ...]
    jacobian: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class ComputeReport:
    """Everything ``compute`` prints: the input, the hard top-k and one run per method."""

    k: int
    tau: float
    data: LoadedInput
    hard: NDArray[np.float64]
    runs: tuple[MethodRun, ...]
    outlook: RecursionOutlook | None = None  # set when grad-recursive is among the methods

    @property
    def failed(self) -> bool:
        """True when some method failed on some row (exit code 1)."""
        return any(run.failures for run in self.runs)


def build_compute_report(
    data: LoadedInput, *, k: int, methods: Sequence[str], tau: float, with_jacobian: bool = False
) -> ComputeReport:
    """Run every method on every row of ``data``; failures are recorded per row, not raised.

    Raises:
        InvalidArgumentError: ``k < 1``, ``tau`` not a finite number > 0, or a Jacobian too big.
        InputError: vectors shorter than ``k``, or a row with fewer than ``k`` unmasked entries.
    """
    x = data.values
    rows, n = x.shape
    if k < 1:
        raise InvalidArgumentError(f"-k must be an integer >= 1, got {k}")
    if not (np.isfinite(tau) and tau > 0):
        raise InvalidArgumentError(f"--tau must be a finite number > 0, got {tau}")
    if k > n:
        raise InputError(f"{data.source}: the vectors have n={n} entries, fewer than k={k}")
    unmasked = np.isfinite(x).sum(axis=1)
    if (unmasked < k).any():
        r = int(np.argmax(unmasked < k))
        raise InputError(
            f"{data.source}: {row_title(data, r)} has only {unmasked[r]} unmasked entries "
            f"(-inf = masked), fewer than k={k}"
        )
    if with_jacobian and rows * n * n * len(methods) > MAX_JACOBIAN_NUMBERS:
        raise InvalidArgumentError(
            f"--jacobian would hold {rows * n * n * len(methods):.3g} numbers ({rows} rows, n={n}, "
            f"{len(methods)} methods), more than {MAX_JACOBIAN_NUMBERS:.0e}; use topk_cli.vjp in Python"
        )
    hard = np.asarray(soft_topk(x, k, "hard"), dtype=np.float64)
    runs = []
    for name in methods:
        result = evaluate(x, k, name, tau=tau)
        jac = None
        status = np.asarray(result.status).reshape(rows).copy()
        failures = result.failures
        if with_jacobian:
            jac, derivative_failures = _jacobian_rows(x, k, name, tau, status)
            failures = failures + derivative_failures
        runs.append(
            MethodRun(
                method=name, weights=np.asarray(result.weights, dtype=np.float64),
                status=status, failures=failures, jacobian=jac,
            )
        )
    outlook = grad_recursive_outlook(x, k, tau=tau) if "grad-recursive" in methods else None
    return ComputeReport(k=k, tau=float(tau), data=data, hard=hard, runs=tuple(runs), outlook=outlook)


def _jacobian_rows(
    x: NDArray[np.float64], k: int, method: str, tau: float, status: NDArray[np.str_]
) -> tuple[NDArray[np.float64], tuple[RowFailure, ...]]:
    """Jacobians ``(B, n, n)`` of the rows whose weights are ok (NaN elsewhere). A row whose
    derivative fails is a per-row failure: its status (updated in place) becomes the failure's
    code, its Jacobian stays NaN, and the other rows are still computed."""
    rows, n = x.shape
    jac = np.full((rows, n, n), np.nan)
    ok = np.flatnonzero(status == "ok")
    if ok.size == 0:
        return jac, ()
    try:
        jac[ok] = jacobian(x[ok], k, method, tau=tau)
        return jac, ()
    except NumericalFailureError as exc:
        bad = {ok[f.row[0]] for f in exc.failures if f.row}
    failures = []
    for r in ok:
        if r not in bad:
            jac[r] = jacobian(x[r], k, method, tau=tau)
            continue
        try:  # the batch call named the row; confirm it alone (and get its own diagnosis)
            jac[r] = jacobian(x[r], k, method, tau=tau)
        except NumericalFailureError as exc:
            failure = exc.failures[0]
            status[r] = failure.code
            failures.append(RowFailure(method=method, row=(int(r),), code=failure.code,
                                       detail=f"Jacobian: {failure.detail}", level=failure.level, value=failure.value))
    return jac, tuple(failures)


def row_title(data: LoadedInput, row: int) -> str:
    if data.single:
        return "the vector"
    name = data.row_names[row]
    return f"row {row}" + (f" ({name})" if data.row_names_given else "")


