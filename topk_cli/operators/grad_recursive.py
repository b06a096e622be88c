"""``grad-recursive``: GradTopK by the source article's recursion, its failures detected.

    log Z_{1,i} = z_i;  log Z_{j,i} = z_i + log(Z_{j-1} - Z_{j-1,i});
    log Z_j = logsumexp_i(log Z_{j,i}) - log j;  p = exp(log Z_{k,i} - log Z_k).

The same function as ``grad`` (:mod:`topk_cli.operators.gradtopk`), computed by subtracting
nearly equal numbers: the log argument at level j is ``1 - p_i^(j-1)``, whose relative error the
deflation multiplies by the odds ``p / (1 - p)`` at every level. Rows that reach log 0 or the log
of a negative number are reported; rows whose result differs from ``grad``'s exact program by more
than :data:`CANCELLATION_TOLERANCE` are reported as ``"cancellation"``, unless a rigorous running
error bound (:mod:`topk_cli.operators._recursion_bound`) proves that comparison cannot fail.
Derivatives come from ``grad``'s program (same function).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import OK, FloatArray, Forward, Implementation
from topk_cli.operators._logspace import exp_into, logsumexp
from topk_cli.operators._recursion_bound import RunningBound
from topk_cli.operators.gradtopk import _grad_forward, _grad_forward_vjp, _grad_jacobian, _grad_vjp

#: ``grad-recursive`` reports a row as ``"cancellation"`` when its weights differ from the exact
#: ones (``grad``, accurate to ~2e-14) by more than this, although no log argument reached 0.
#: Below 5e-13, two accepted results for permuted inputs agree to 1e-12, so the method keeps the
#: permutation equivariance it claims at the tolerance ``verify-properties`` applies.
CANCELLATION_TOLERANCE = 4e-13

#: What ``grad-recursive`` assumes of ``grad``'s error on ``p`` (absolute) when it skips the
#: comparison on a row its running error bound certifies: five times its stated accuracy (2e-14,
#: against mpmath references; 1.4e-15 on 176 rows, n <= 100, scales 0.1 to 1e3).
EXACT_ERROR = 1e-13


# ---------------------------------------------------------------------------------------------
# grad-recursive: the article's recursion, with its failures detected


@dataclass(frozen=True)
class RecursionTrace:
    """Per-row trace of the article's GradTopK recursion on a ``(B, n)`` batch.

    The log argument at level ``j`` (2 <= j <= k) for entry i is ``1 - Z_{j-1,i} / Z_{j-1}``
    (= 1 - p_i^(j-1), the complement of the level-(j-1) marginal) as the recursion computes it.
    """

    failed_level: NDArray[np.int64]  # level j where an argument first was <= 0; -1 if none
    kind: NDArray[np.str_]  # "ok", "log0" (argument == 0) or "log-negative" (argument < 0)
    argument: FloatArray  # the offending argument (0 or negative) at failure; NaN if none
    value_before: FloatArray  # that entry's argument at the level before the failure; NaN if none
    min_argument: FloatArray  # smallest positive argument seen before any failure (1.0 for k = 1)
    digits_lost: FloatArray  # max(0, -log10(min_argument)): decimal digits lost to cancellation


@dataclass(frozen=True)
class _Recursion:
    """The recursion's weights (garbage on failed rows), its trace, and where things happened."""

    p: FloatArray
    trace: RecursionTrace
    entry: NDArray[np.int64]  # entry of the failing argument; -1 if none
    min_level: NDArray[np.int64]  # level of min_argument; -1 if none
    min_entry: NDArray[np.int64]  # entry of min_argument; -1 if none
    q: FloatArray  # fl(1 - p), the level-(k+1) argument
    p_bound: FloatArray  # rigorous bound on max_i |p_i - exact p_i| per row (inf: none)
    q_bound: FloatArray  # rigorous bound on the relative error of q per row (inf: none)


def _run_recursion(z: FloatArray, k: int) -> _Recursion:
    """The article's recursion in float64, vectorised over rows, one step per level.

    ``log Z_{1,i} = z_i``, ``log Z_1 = logsumexp(z)``; for ``j = 2..k``:
    ``a_i = 1 - exp(log Z_{j-1,i} - log Z_{j-1})``,
    ``log Z_{j,i} = z_i + log Z_{j-1} + log a_i``,
    ``log Z_j = logsumexp_i(log Z_{j,i}) - log j``; finally ``p_i = exp(log Z_{k,i} - log Z_k)``.
    Masked entries have ``Z_{j,i} = 0``, hence ``a_i = 1`` exactly.
    """
    rows, n = z.shape
    every = np.arange(rows)
    failed_level = np.full(rows, -1, dtype=np.int64)
    kind = np.full(rows, OK, dtype="<U16")
    argument = np.full(rows, np.nan)
    value_before = np.full(rows, np.nan)
    entry = np.full(rows, -1, dtype=np.int64)
    min_argument = np.ones(rows)
    min_level = np.full(rows, -1, dtype=np.int64)
    min_entry = np.full(rows, -1, dtype=np.int64)
    alive = np.ones(rows, dtype=bool)
    previous = np.full((rows, n), np.nan)
    arg = np.empty((rows, n))  # buffers reused level after level (same operations, in place)
    tmp = np.empty((rows, n))
    log_z = logsumexp(z, axis=-1, buf=tmp)
    bound = RunningBound(z, log_z)
    log_zi = z  # level 1; from level 2 on, its own buffer
    buffer = np.empty((rows, n))
    # log(0) and log(< 0) are the failures under study: they are recorded, not warned about
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for j in range(2, k + 1):
            np.subtract(log_zi, log_z[:, None], out=arg)
            exp_into(arg, arg)
            np.subtract(1.0, arg, out=arg)
            worst = np.argmin(arg, axis=-1)  # the first NaN of a row that has one
            low = arg[every, worst]
            nan_rows = np.flatnonzero(np.isnan(low))  # NaN (only after a failure) is not a minimum
            if nan_rows.size:
                sub = arg[nan_rows]
                worst[nan_rows] = np.argmin(np.where(np.isnan(sub), np.inf, sub), axis=-1)
                low[nan_rows] = sub[np.arange(nan_rows.size), worst[nan_rows]]
            new = alive & (low <= 0)
            failed_level[new] = j
            kind[new] = np.where(low[new] == 0, "log0", "log-negative")
            argument[new] = low[new]
            value_before[new] = previous[new, worst[new]]
            entry[new] = worst[new]
            alive &= ~new
            better = alive & (low < min_argument)
            min_argument[better] = low[better]
            min_level[better] = j
            min_entry[better] = worst[better]
            bound.level(low, log_z)
            log_zi = np.add(z, log_z[:, None], out=buffer)
            log_zi += np.log(arg, out=tmp)
            log_z = logsumexp(log_zi, buf=tmp) - np.log(j)
            bound.lse(log_z, j)
            previous, arg = arg, previous
        p = exp_into(np.subtract(log_zi, log_z[:, None], out=arg), arg)
        q = np.subtract(1.0, p, out=tmp)
        p_bound, q_bound = bound.result(np.min(q, axis=-1))
    trace = RecursionTrace(
        failed_level=failed_level,
        kind=kind,
        argument=argument,
        value_before=value_before,
        min_argument=min_argument,
        digits_lost=np.maximum(0.0, -np.log10(min_argument)) + 0.0,
    )
    return _Recursion(
        p=p, trace=trace, entry=entry, min_level=min_level, min_entry=min_entry, q=q, p_bound=p_bound,
        q_bound=q_bound,
    )


@dataclass
class _TraceMemo:
    """The trace of the forward pass's last run of the recursion, keyed on its exact input."""

    key: tuple[str, tuple[int, ...], bytes, int] | None = None
    trace: RecursionTrace | None = None


_TRACE_MEMO: ContextVar[_TraceMemo | None] = ContextVar("grad_recursive_trace_memo", default=None)


def _memo_key(z: FloatArray, k: int) -> tuple[str, tuple[int, ...], bytes, int]:
    return z.dtype.str, z.shape, z.tobytes(), k


@contextmanager
def shared_trace() -> Iterator[None]:
    """Run the recursion once for a forward pass and its trace on the same input.

    Inside this block, the forward pass keeps the trace of its run of the recursion, and
    :func:`grad_recursive_trace` called next on an input with the same bytes, shape and ``k``
    returns it instead of running the recursion again (the same function of the same input:
    the same values). One trace is kept at a time and handed out once; leaving the block drops it.
    """
    token = _TRACE_MEMO.set(_TraceMemo())
    try:
        yield
    finally:
        _TRACE_MEMO.reset(token)


def grad_recursive_trace(z: FloatArray, k: int) -> RecursionTrace:
    """Trace the article's recursion row by row on a prepared ``(B, n)`` batch (see ``_base``).

    At level ``j`` the recursion takes ``log(1 - Z_{j-1,i}/Z_{j-1})``, the log of the complement
    of the level-(j-1) marginal, computed by subtraction. Once a marginal is within an ulp of 1
    the argument rounds to 0 (``"log0"``) or below (``"log-negative"``); before that, an
    argument ``a`` has lost about ``-log10(a)`` digits to cancellation (``digits_lost``).

    Digits lost at one level are not the whole story: the error of every level is divided by
    the arguments of the next, so it compounds over the k levels. Measured on 2e5 rows that did
    not hit log 0 (n in {3, 5, 10, 30, 100, 300, 1000}, k in {2, 3, 5, 10, 50, n/2, n-2, n-1},
    standard normal, rounded (ties), near-tied, Student-t and masked scores times 26 scales
    from 0.1 to 1e4), errors against ``grad`` of 0.05 occurred with every argument above 0.1
    (up to 0.26 for standard normal scores, n = 100, k = 50), while near-uniform rows with
    arguments near 0.5 over 500 levels stayed within 1e-13: no threshold on ``min_argument``
    separates good rows from bad ones, and a propagated first-order error bound was
    pessimistic by up to 1e100 on the latter. :data:`GRAD_RECURSIVE` therefore compares each
    row that survived with the exact program and reports it as ``"cancellation"`` when they
    differ by more than :data:`CANCELLATION_TOLERANCE` (the trace's ``kind`` stays ``"ok"``).

    >>> t = grad_recursive_trace(np.array([[0.0, -50.0, -100.0], [0.0, -1.0, -2.0]]), 2)
    >>> t.kind.tolist(), t.failed_level.tolist(), t.argument.tolist()
    (['log0', 'ok'], [2, -1], [0.0, nan])
    """
    memo = _TRACE_MEMO.get()
    if memo is not None and memo.trace is not None:
        trace, key = memo.trace, memo.key
        memo.key, memo.trace = None, None  # handed out once
        if key == _memo_key(z, k):
            return trace
    return _run_recursion(z, k).trace


def _recursion_message(kind: str, level: int, entry: int, value: float, deviation: float) -> str:
    where = (
        f"at level {level}, the log argument 1 - Z_{{{level - 1},i}}/Z_{level - 1} of entry {entry} "
        f"(1 minus its level-{level - 1} marginal)"
    )
    fix = "use method 'grad', which computes the same weights with an exact log-space dynamic program"
    if kind == "log0":
        return f"{where} is exactly 0 (the marginal rounded to 1), so log 0 = -inf; {fix}"
    if kind == "log-negative":
        return f"{where} is {value:.3g} < 0 (the marginal rounded above 1), so its log is NaN; {fix}"
    smallest = f"smallest argument {value:.3g}, at level {level}, entry {entry}" if level >= 2 else "k levels"
    return (
        f"the subtractions 1 - Z_{{j-1,i}}/Z_{{j-1}} lost digits at every level and the losses compounded "
        f"({smallest}): the weights differ from the exact ones by {deviation:.2g}, more than "
        f"{CANCELLATION_TOLERANCE:g}; {fix}"
    )


def _recursive_forward(z: FloatArray, k: int) -> Forward:
    """The recursion's weights; rows it cannot compute accurately are reported, not returned.

    Failed rows hold NaN: ``"log0"`` and ``"log-negative"`` (``level`` and ``value``: the
    failing level and argument) and ``"cancellation"``, a row whose weights differ from the
    exact ones (``grad``) by more than :data:`CANCELLATION_TOLERANCE` (``level`` and ``value``:
    the smallest argument and its level). The complement ``q`` of a row that succeeded is
    ``fl(1 - p)`` where the running bound proves it relatively accurate to
    :data:`CANCELLATION_TOLERANCE`, else ``grad``'s (see :func:`_recursive_checked`).

    >>> f = _recursive_forward(np.array([[0.0, -1.0, -2.0], [0.0, -50.0, -100.0]]), 2)
    >>> f.p.round(4).tolist(), f.code.tolist(), f.level.tolist()
    ([[0.91, 0.7553, 0.3348], [nan, nan, nan]], ['ok', 'log0'], [-1, 2])
    """
    return _recursive_checked(z, k, None)


def _recursive_checked(z: FloatArray, k: int, exact: Forward | None) -> Forward:
    """The recursion's weights, checked against ``grad``'s forward pass on ``z`` (``exact``, or
    computed here for the rows that need it).

    A row the recursion returned is compared with the exact program unless its running error
    bound (:mod:`topk_cli.operators._recursion_bound`) proves that the comparison cannot fail:
    ``bound(recursion) + EXACT_ERROR <= CANCELLATION_TOLERANCE`` for ``p``, and ``fl(1 - p)``
    relatively within ``CANCELLATION_TOLERANCE``; such a row's complement is that ``fl(1 - p)``.
    Rows that failed (log 0) need no comparison either. The rows reported, their codes, messages
    and weights are those of comparing every row. Certified and failed rows are marked
    ``elementwise_rows`` (tied entries already have equal bits; only ``grad``'s ``q`` needs its ties
    averaged).
    """
    rec = _run_recursion(z, k)
    tr = rec.trace  # read only below: its arrays are copied before any change
    memo = _TRACE_MEMO.get()
    if memo is not None:
        memo.key, memo.trace = _memo_key(z, k), tr
    code = tr.kind.copy()
    level = tr.failed_level.copy()
    value = tr.argument.copy()
    entry = rec.entry.copy()
    ok = code == OK
    certified = ok & (rec.p_bound <= CANCELLATION_TOLERANCE - EXACT_ERROR) & (rec.q_bound <= CANCELLATION_TOLERANCE)
    check = np.flatnonzero(ok & ~certified)
    deviation = np.full(z.shape[0], np.nan)  # read only on the rows reported as "cancellation"
    q = rec.q
    if check.size:
        ex = exact if exact is not None else _grad_forward(z[check], k)
        ex_p = ex.p[check] if exact is not None else ex.p
        ex_q = ex.q[check] if exact is not None else ex.q
        with np.errstate(invalid="ignore"):  # inf - inf: a non-finite result fails the check
            deviation[check] = np.max(np.abs(rec.p[check] - ex_p), axis=-1)
        q[check] = ex_q
    cancel = np.zeros(z.shape[0], dtype=bool)
    cancel[check] = ~(deviation[check] <= CANCELLATION_TOLERANCE)
    code[cancel] = "cancellation"
    level[cancel] = rec.min_level[cancel]
    value[cancel] = tr.min_argument[cancel]
    entry[cancel] = rec.min_entry[cancel]
    failed = code != OK
    messages = {
        int(b): _recursion_message(
            str(code[b]), int(level[b]), int(entry[b]), float(value[b]), float(deviation[b])
        )
        for b in np.flatnonzero(failed)
    }
    p = rec.p
    if failed.any():
        p = np.where(failed[:, None], np.nan, p)
        q = np.where(failed[:, None], np.nan, q)
    # p is the recursion's on every row (elementwise: z_i and row scalars), q too where certified
    return Forward(
        p=p, q=q, code=code, level=level, value=value, messages=messages, elementwise_rows=certified | failed
    )


def _recursive_jacobian(fwd: Forward, z: FloatArray, k: int) -> FloatArray:
    """Same function as ``grad``, so the same Jacobian, from the exact program."""
    return _grad_jacobian(fwd, z, k)


def _recursive_vjp(fwd: Forward, z: FloatArray, k: int, v: FloatArray) -> FloatArray:
    """Same function as ``grad``, so the same VJP, from the exact program."""
    return _grad_vjp(fwd, z, k, v)


def _recursive_forward_vjp(z: FloatArray, k: int, v: FloatArray) -> tuple[Forward, FloatArray]:
    """:func:`_recursive_forward` and :func:`_recursive_vjp` sharing one run of the exact program."""
    exact, out = _grad_forward_vjp(z, k, v)  # the VJP needs the exact program on every row anyway
    return _recursive_checked(z, k, exact), out


#: GradTopK by the article's recursion, failures detected and reported per row.
GRAD_RECURSIVE = Implementation(
    forward=_recursive_forward, jacobian=_recursive_jacobian, vjp=_recursive_vjp,
    forward_vjp=_recursive_forward_vjp,
)
