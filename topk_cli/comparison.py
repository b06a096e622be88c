"""Run several methods side by side on loaded vectors: what ``softtopk compute`` shows.

:func:`build_compute_report` runs the library (``evaluate`` per method, the hard top-k, the
Jacobian of the rows that succeeded, under ``--sum`` the soft top-k sums, and for a method with a
stability model (``grad-recursive``) the predicted distance to its stability boundary) and
returns a :class:`ComputeReport`; ``topk_cli.render.compute`` turns it
into text. Failures are recorded per row, never raised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.analysis.hardness import HardnessMatch, tau_for_hardness
from topk_cli.api import (
    check_k,
    check_tau,
    evaluate,
    evaluate_sum,
    get_method,
    jacobian,
    scaled_scores,
    soft_topk,
)
from topk_cli.errors import InputError, InvalidArgumentError, NumericalFailureError, RowFailure
from topk_cli.inputs import LoadedInput
from topk_cli.recursion import RecursionOutlook
from topk_cli.registry import BASELINE_METHOD, METHODS

#: ``compute`` warns about a row of a method with a stability model (``grad-recursive``) that succeeded when the recursion is predicted
#: to lose at least this many decimal digits on it: rows that lose about 3.5 or more are already
#: refused (``cancellation``), so such a row sits just inside the stability boundary.
BOUNDARY_WARNING_DIGITS = 2.5
#: Largest Jacobian ``--jacobian`` will form (numbers over all rows and methods).
MAX_JACOBIAN_NUMBERS = 10_000_000

@dataclass(frozen=True)
class MethodRun:
    """One method on every row: weights ``(B, n)`` (NaN on failed rows), status per row.

    ``jacobian`` is ``(B, n, n)`` ``d p_i / d x_j`` (NaN on failed rows) under ``--jacobian``;
    ``sums`` ``(B,)`` is ``sum_i p_i x_i`` and ``potential`` ``(B,)`` the method's potential (None
    when it has none) under ``--sum``; ``stderr`` ``(B, n)`` the standard errors of a Monte-Carlo
    method; ``params`` the method's parameters used; ``outlook`` the predicted distance to the
    stability boundary of a method with a stability model.
    """

    method: str
    weights: NDArray[np.float64]
    status: NDArray[np.str_]
    failures: tuple[RowFailure, ...]
    jacobian: NDArray[np.float64] | None = None
    sums: NDArray[np.float64] | None = None
    potential: NDArray[np.float64] | None = None
    stderr: NDArray[np.float64] | None = None
    params: Mapping[str, int | float] | None = None
    outlook: RecursionOutlook | None = None
    #: Under ``--hardness``: the calibration; ``tau`` is its tau (None when unreachable).
    match: HardnessMatch | None = None
    tau: float | None = None
    #: Under ``--jacobian``, for a method that has none (a user's numpy operator): why (``jacobian`` is None).
    jacobian_note: str | None = None


@dataclass(frozen=True)
class ComputeReport:
    """Everything ``compute`` prints: the input, the hard top-k and one run per method."""

    #: One k for every row (an int, or a float for a real k), or one per row (``--k-column``
    #: values that differ): a ``(rows,)`` array.
    k: int | float | NDArray[np.float64]
    tau: float
    data: LoadedInput
    hard: NDArray[np.float64]
    runs: tuple[MethodRun, ...]
    with_sum: bool = False
    hardness: float | None = None  # --hardness: tau chosen per method (run.tau)

    @property
    def unreachable(self) -> tuple[MethodRun, ...]:
        """Methods that cannot reach ``--hardness`` (not computed; the reason is in ``match``)."""
        return tuple(run for run in self.runs if run.match is not None and run.match.tau is None and run.match.status != "constant")

    @property
    def failed(self) -> bool:
        """True when some method failed on some row or cannot reach ``--hardness`` (exit code 1)."""
        return any(run.failures for run in self.runs) or bool(self.unreachable)


def build_compute_report(
    data: LoadedInput,
    *,
    k: int | float | NDArray[np.float64],
    methods: Sequence[str],
    tau: float,
    with_jacobian: bool = False,
    with_sum: bool = False,
    params: Mapping[str, int | float] | None = None,
    hardness: float | None = None,
) -> ComputeReport:
    """Run every method on every row of ``data``; failures are recorded per row, not raised.

    ``params`` (e.g. ``{"samples": 1000}``) go to the methods that declare them; naming one
    that no selected method takes is an error (it would silently do nothing). With ``hardness``
    each method runs at its own tau, the largest at which its mean top-k mass over the rows
    equals ``hardness`` (:func:`topk_cli.tau_for_hardness`); a method that cannot reach it is not
    computed (weights NaN, status ``unreachable``).

    Raises:
        InvalidArgumentError: ``k < 1``, ``tau`` not a finite number > 0, a Jacobian too big,
            or a parameter no selected method takes.
        InputError: vectors shorter than ``k``, or a row with fewer than ``k`` unmasked entries.
    """
    x = data.values
    rows, n = x.shape
    k = uniform_k(k)
    check_tau(tau, name="--tau")
    if not isinstance(k, np.ndarray):
        if isinstance(k, float):  # a real k: 0 < k <= n (the method's own rule is checked by the API)
            if not (math.isfinite(k) and k > 0):
                raise InvalidArgumentError(f"-k must satisfy 0 < k <= n for a real k, got {k:g}")
        else:
            check_k(k, name="-k")
        if k > n:
            raise InputError(f"{data.source}: the vectors have n={n} entries, fewer than k={k:g}")
        unmasked = np.isfinite(x).sum(axis=1)
        if (unmasked < k).any():
            r = int(np.argmax(unmasked < k))
            raise InputError(
                f"{data.source}: {row_label(data, r)} has only {unmasked[r]} unmasked entries "
                f"(-inf = masked), fewer than k={k:g}"
            )
    if with_jacobian and rows * n * n * len(methods) > MAX_JACOBIAN_NUMBERS:
        raise InvalidArgumentError(
            f"--jacobian would hold {rows * n * n * len(methods):.3g} numbers ({rows} rows, n={n}, "
            f"{len(methods)} methods), more than {MAX_JACOBIAN_NUMBERS:.0e}; use topk_cli.vjp in Python"
        )
    given = dict(params or {})
    specs = [get_method(name) for name in methods]
    for key in given:
        if not any(key in {p.name for p in spec.parameters} for spec in specs):
            takers = sorted({spec.name for spec in METHODS.values() if key in {p.name for p in spec.parameters}})
            option = "--" + key.replace("_", "-")
            raise InvalidArgumentError(
                f"{option} applies to {', '.join(takers) if takers else 'no method'}, and no selected method takes it"
            )
    hard = np.asarray(soft_topk(x, k, BASELINE_METHOD), dtype=np.float64)
    runs = []
    for spec in specs:
        name = spec.name
        own: dict[str, Any] = {key: value for key, value in given.items() if key in {p.name for p in spec.parameters}}
        match = tau_for_hardness(x, k, name, hardness, **own) if hardness is not None else None
        run_tau = tau if match is None or match.status == "constant" else match.tau
        if run_tau is None:  # cannot reach --hardness: nothing to compute
            runs.append(
                MethodRun(
                    method=name, weights=np.full((rows, n), np.nan), status=np.full(rows, "unreachable"),
                    failures=(), jacobian=np.full((rows, n, n), np.nan) if with_jacobian else None, match=match,
                )
            )
            continue
        result = evaluate(x, k, name, tau=run_tau, **own)
        jac = None
        status = np.asarray(result.status).reshape(rows).copy()
        failures = result.failures
        jacobian_note = None
        if with_jacobian and not spec.capabilities.jacobian:
            jacobian_note = f"{name} has no Jacobian (a numpy operator has no gradient; nothing stands in for it)"
        elif with_jacobian:
            jac, derivative_failures = _jacobian_rows(x, k, name, run_tau, status, own)
            failures = failures + derivative_failures
        sums = potential = None
        if with_sum:
            total = evaluate_sum(x, k, name, tau=run_tau, **own)
            sums = np.asarray(total.value, dtype=np.float64).reshape(rows)
            if total.potential is not None:
                potential = np.asarray(total.potential, dtype=np.float64).reshape(rows)
        outlook = None
        if spec.stability is not None and isinstance(k, int):  # the model takes one integer k
            with np.errstate(all="ignore"):
                outlook = spec.stability.outlook(scaled_scores(x, k, tau=run_tau), k, None)
        runs.append(
            MethodRun(
                method=name, weights=np.asarray(result.weights, dtype=np.float64),
                status=status, failures=failures, jacobian=jac,
                sums=sums, potential=potential,
                stderr=None if result.stderr is None else np.asarray(result.stderr, dtype=np.float64).reshape(rows, n),
                params=dict(result.params), outlook=outlook,
                match=match, tau=match.tau if match is not None else None, jacobian_note=jacobian_note,
            )
        )
    return ComputeReport(
        k=k, tau=float(tau), data=data, hard=hard, runs=tuple(runs), with_sum=with_sum, hardness=hardness
    )


def uniform_k(k: int | float | NDArray[np.float64]) -> int | float | NDArray[np.float64]:
    """``k`` as one number when every row has the same (an ``int`` when integral), else the ``(rows,)`` array."""
    if isinstance(k, np.ndarray):
        values = np.asarray(k, dtype=np.float64).reshape(-1)
        if values.size and bool(np.all(values == values[0])):
            k = float(values[0])
        else:
            return values
    if isinstance(k, (float, np.floating)) and float(k).is_integer():
        return int(k)
    return k


def _jacobian_rows(
    x: NDArray[np.float64], k: Any, method: str, tau: float, status: NDArray[np.str_], params: dict[str, Any]
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
        jac[ok] = jacobian(x[ok], _rows_k(k, ok), method, tau=tau, **params)
        return jac, ()
    except NumericalFailureError as exc:
        bad = {ok[f.row[0]] for f in exc.failures if f.row}
    failures = []
    for r in ok:
        if r not in bad:
            jac[r] = jacobian(x[r], _rows_k(k, r), method, tau=tau, **params)
            continue
        try:  # the batch call named the row; confirm it alone (and get its own diagnosis)
            jac[r] = jacobian(x[r], _rows_k(k, r), method, tau=tau, **params)
        except NumericalFailureError as exc:
            failure = exc.failures[0]
            status[r] = failure.code
            failures.append(RowFailure(method=method, row=(int(r),), code=failure.code,
                                       detail=f"Jacobian: {failure.detail}", level=failure.level, value=failure.value))
    return jac, tuple(failures)


def _rows_k(k: Any, rows: Any) -> Any:
    """The k of ``rows`` (an index array or one row): per-row k is indexed, one k is shared."""
    return k[rows] if isinstance(k, np.ndarray) else k


def row_title(data: LoadedInput, row: int) -> str:
    """A row of the batch as a table title: its 0-based index (as in the JSON results) and name."""
    if data.single:
        return "the vector"
    name = data.row_names[row]
    return f"row {row}" + (f" ({name})" if data.row_names_given else "")


def row_label(data: LoadedInput, row: int) -> str:
    """A row of the batch in a message on stderr: ``row 3 (0-based)``, with its name if it has one.

    A "row" is always the 0-based index of a vector in the batch (as in the JSON results and
    :attr:`~topk_cli.errors.RowFailure.row`); a position in a file is a "line". Said so in
    messages, where a reader of a file would otherwise count from 1.
    """
    if data.single:
        return "the vector"
    name = data.row_names[row]
    return f"row {row} (0-based" + (f", named {name!r})" if data.row_names_given else ")")


