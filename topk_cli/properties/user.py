"""Judging a user's own operator: the properties only a foreign implementation can break.

``softtopk verify-properties -m FILE.py:FUNCTION --reference METHOD`` runs the property suite on a
user's ``fn(x, k, tau)`` (through the framework adapter, :mod:`topk_cli.frameworks`) and adds the
rows of :data:`USER_PROPERTIES`, measured here on the same cases:

* ``matches-reference``: ``p`` against METHOD's ``p`` on the same scores and tau; ``worst`` is the
  largest absolute difference of ``p`` over the suite;
* ``vjp-matches-reference``: the operator's VJP (its framework's autodiff) against METHOD's
  exact VJP (:func:`topk_cli.vjp`), with a cotangent ``v`` drawn per row from a seeded normal;
  ``worst`` is the largest ``max |g - g_ref| / max(||g_ref||_inf, VJP_FLOOR ||v||_inf / tau)``
  (relative to the reference VJP's max-norm; the floor keeps a saturated row, whose exact VJP
  is ~0, from turning a difference of 1e-300 into a large relative one); ``holds`` is None
  for an operator without a gradient (a numpy function);
* ``same-topk-set``: the k largest entries of the operator's ``p`` are the k largest of the
  reference's, on every row where the reference decides them (its k-th and (k+1)-th largest
  weights differ by more than twice the tolerance of ``p``); ``worst`` is the share of those
  rows whose set differs;
* ``input-unchanged``: the caller's array is bit-identical after the forward and the backward;
* ``dtype-preserved``: the output has the input's dtype (float64 and float32 always, and the
  dtype of ``--dtype``);
* ``deterministic``: two calls on the same input return the same bits; ``worst`` is the largest
  difference between them.

The last three are measured on every user operator (they need no reference). At a reduced
precision (``dtype`` float32, bfloat16 or float16) the scores are rounded to that dtype first,
the operator receives them in it, and the reference computes in float64 on the very same rounded
scores: the error measured is the operator's own, not the rounding of its input. The tolerances
(:data:`TOLERANCES`) depend on the dtype; measured on correct operators (a bisection to machine
precision with a backward from the implicit function theorem, in PyTorch and in JAX, on the
default suite against ``thre-sigmoid``) they leave a margin of at least 10:

========= ============ ============== ==============================================
dtype     p (absolute) VJP (relative) a correct operator reaches (p / VJP)
========= ============ ============== ==============================================
float64   1e-9         1e-8           3.4e-14 / 9.0e-11 (1e-10 without subtracting
                                      the max first: ulp(1e6) on the offset rows)
float32   2e-4         2e-2           1.6e-5 / 1.2e-3
bfloat16  2e-2         1e-1           1.9e-3 / 9e-3 (rounding p alone: up to 2^-9)
float16   2.5e-3       2e-2           2.4e-4 / 1.8e-3
========= ============ ============== ==============================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import numpy as np
from numpy.typing import NDArray

from topk_cli.api import evaluate, get_method
from topk_cli.api import vjp as api_vjp
from topk_cli.errors import InvalidArgumentError, SoftTopKError
from topk_cli.operators._base import FloatArray
from topk_cli.properties.in_k import is_integer_k, k_applies
from topk_cli.properties.results import Case, Counterexample, PropertyResult, Tally, _Measure, _vec
from topk_cli.properties.shrinking import _shrink

#: The rows a user's operator adds, in report order.
USER_PROPERTIES: tuple[str, ...] = (
    "matches-reference",
    "vjp-matches-reference",
    "same-topk-set",
    "input-unchanged",
    "dtype-preserved",
    "deterministic",
)
#: The rows that need a reference method.
REFERENCE_PROPERTIES: tuple[str, ...] = USER_PROPERTIES[:3]
#: The rows measured on every user operator, with or without a reference; always claimed.
ALWAYS_PROPERTIES: tuple[str, ...] = USER_PROPERTIES[3:]

#: The dtypes a user's operator can be measured in.
DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")

#: Default tolerance per dtype: (absolute error of p, error of the VJP relative to its max-norm).
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-8),
    "float32": (2e-4, 2e-2),
    "bfloat16": (2e-2, 1e-1),
    "float16": (2.5e-3, 2e-2),
}
#: A VJP error is relative to ``max(||g_ref||_inf, VJP_FLOOR * ||v||_inf / tau)``.
VJP_FLOOR = 1e-6
#: The largest finite value of each dtype (scores beyond it are not representable: such rows are skipped).
_DTYPE_MAX = {"float64": float(np.finfo(np.float64).max), "float32": float(np.finfo(np.float32).max),
              "bfloat16": 3.3895313892515355e38, "float16": 65504.0}


class CallLike(Protocol):
    """What one guarded call of a user's operator reports (see ``topk_cli.frameworks.user``)."""

    @property
    def p(self) -> NDArray[np.float64] | None: ...

    @property
    def out_dtype(self) -> str: ...

    @property
    def error(self) -> tuple[str, str] | None: ...

    @property
    def input_changed(self) -> bool: ...


class OperatorLike(Protocol):
    """A user's operator as this module uses it: a name, whether it has a gradient, and guarded calls."""

    @property
    def name(self) -> str: ...

    @property
    def has_gradient(self) -> bool: ...

    def call(self, x: NDArray[np.float64], k: Any, tau: Any, *, dtype: str = "float64") -> Any: ...

    def vjp(self, x: NDArray[np.float64], k: Any, tau: Any, v: NDArray[np.float64], *, dtype: str = "float64") -> Any: ...


def check_dtype(dtype: object) -> str:
    """``dtype`` as a name of :data:`DTYPES`.

    Raises:
        InvalidArgumentError: any other value.

    >>> check_dtype("bfloat16")
    'bfloat16'
    """
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dtype


def round_to_dtype(x: FloatArray, dtype: str) -> FloatArray:
    """``x`` rounded (to nearest, ties to even) to ``dtype`` and held as float64: exactly the scores
    the operator receives in that dtype. bfloat16 is rounded through its bits (numpy has no
    bfloat16): the upper 16 bits of the float32 value. Values beyond the dtype's range become inf.

    >>> round_to_dtype(np.array([1.0 + 2.0**-9, 3.0]), "bfloat16").tolist()
    [1.0, 3.0]
    """
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return x
    with np.errstate(over="ignore"):
        if dtype == "float16":
            return x.astype(np.float16).astype(np.float64)
        f = x.astype(np.float32)
    if dtype == "float32":
        return f.astype(np.float64)
    bits = f.view(np.uint32).astype(np.uint64)
    finite = np.isfinite(f)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out_bits = np.where(finite, rounded, bits & 0xFFFF0000).astype(np.uint32)
    return out_bits.view(np.float32).astype(np.float64)


def tolerances(dtype: str, tol: float | None = None, vjp_tol: float | None = None) -> tuple[float, float]:
    """The tolerances of p and of the VJP at ``dtype``: the given ones, else :data:`TOLERANCES`."""
    default_p, default_vjp = TOLERANCES[check_dtype(dtype)]
    for name, value in (("reference tolerance", tol), ("VJP tolerance", vjp_tol)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise InvalidArgumentError(f"the {name} must be a finite number >= 0, got {value!r}")
    return (default_p if tol is None else float(tol), default_vjp if vjp_tol is None else float(vjp_tol))


@dataclass(frozen=True)
class _Group:
    """The rows of equal ``(n, k, tau)`` evaluated in one call: their cases and the rounded scores."""

    cases: tuple[Case, ...]
    x: FloatArray  # (B, n), rounded to the dtype
    k: Any
    tau: float


@dataclass(frozen=True)
class _Reference:
    p: FloatArray  # (B, n), NaN on refused rows
    ok: NDArray[np.bool_]  # (B,)
    vjp: FloatArray | None  # (B, n), NaN on refused rows


def _groups(cases: Sequence[Case], dtype: str) -> tuple[list[_Group], int]:
    """Cases batched by ``(n, k, tau)`` with scores rounded to ``dtype``; also how many cases were
    left out because their scores do not fit the dtype (beyond its largest value)."""
    by_key: dict[tuple[int, Any, float], list[Case]] = {}
    left_out = 0
    limit = _DTYPE_MAX[dtype]
    for case in cases:
        finite = case.array[np.isfinite(case.array)]
        if finite.size and np.max(np.abs(finite)) > limit:
            left_out += 1
            continue
        by_key.setdefault((len(case.x), case.k, float(case.tau)), []).append(case)
    groups = [
        _Group(tuple(cs), round_to_dtype(np.vstack([c.array for c in cs]), dtype), k, tau)
        for (_, k, tau), cs in by_key.items()
    ]
    return groups, left_out


def _reference(method: str, x: FloatArray, k: Any, tau: float, v: FloatArray | None) -> _Reference:
    """METHOD's p (and VJP with ``v``) on the rows of ``x``, NaN on the rows it refuses."""
    r = evaluate(x, k, method, tau=tau)
    p = np.asarray(r.weights, dtype=np.float64)
    ok = np.asarray(r.status) == "ok"
    g = None
    if v is not None and get_method(method).capabilities.jacobian:
        g = np.full_like(x, np.nan)
        if ok.any():
            try:
                g[ok] = np.asarray(api_vjp(x[ok], k, v[ok], method, tau=tau), dtype=np.float64)
            except SoftTopKError:  # a derivative not representable on some row: row by row
                for i in np.flatnonzero(ok):
                    try:
                        g[i] = np.asarray(api_vjp(x[i], k, v[i], method, tau=tau), dtype=np.float64)
                    except SoftTopKError:
                        pass
    return _Reference(p, ok, g)


def _p_of(result: Any, rows: int, n: int) -> FloatArray | None:
    """The weights of a call as ``(rows, n)`` float64 (NaN where a row failed; the first ``rows`` of a
    padded batch), or None when nothing usable came back (an exception on the batch, another shape)."""
    if result.p is None:
        return None
    p = np.asarray(result.p, dtype=np.float64)
    if p.ndim == 0 or p.size % n or p.size < rows * n:
        return None
    return p.reshape(-1, n)[:rows]


def _row_error(p: FloatArray, ref: FloatArray) -> float:
    with np.errstate(invalid="ignore"):
        d = np.abs(p - ref)
    return float(np.max(d)) if d.size else 0.0


def _vjp_error(g: FloatArray, ref: FloatArray, v: FloatArray, tau: float) -> float:
    scale = max(float(np.max(np.abs(ref))), VJP_FLOOR * float(np.max(np.abs(v))) / tau)
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.max(np.abs(g - ref))) / scale if scale > 0 else 0.0


def _topk_set(p: FloatArray, k: int) -> frozenset[int]:
    return frozenset(np.argsort(-p, kind="stable")[:k].tolist())


def _decides(ref: FloatArray, k: int, tol: float) -> bool:
    """The reference decides the top-k set: its k-th and (k+1)-th largest weights differ by > 2 tol."""
    if k >= ref.size:
        return False
    s = np.sort(ref)[::-1]
    return bool(s[k - 1] - s[k] > 2 * tol)


def _padded(op: OperatorLike, x: FloatArray) -> FloatArray:
    """``x`` with its rows repeated up to a power of two for a JAX operator called on whole batches:
    JAX compiles once per shape, and the suite's groups have every batch size (the extra rows are
    dropped from the results)."""
    rows = x.shape[0]
    if getattr(op, "framework", "") != "jax" or getattr(op, "row_by_row", False) or rows & (rows - 1) == 0:
        return x
    target = 1 << (rows - 1).bit_length()
    return np.vstack([x, np.repeat(x[:1], target - rows, axis=0)])


def warm_up(op: OperatorLike, cases: Sequence[Case]) -> None:
    """Call ``op`` once on a batch of two typical vectors (n >= 3, 1 < k < n when the cases have
    one), so that whether it takes a batch is decided on a vector like most of the suite's, not on
    the suite's first (one entry, where a function written for one vector may fail alone and work
    on a batch by treating it as one vector)."""
    def plain(c: Case) -> bool:  # distinct values, a spread of order 1: what any operator handles
        x = c.array
        spread = float(np.ptp(x)) if np.isfinite(x).all() else 0.0
        return len(c.x) >= 3 and is_integer_k(c.k) and 1 < c.k < len(c.x) and 0.5 <= spread <= 50 and len(set(c.x)) == len(c.x)

    typical = [c for c in cases if plain(c)] or list(cases)
    if not typical:
        return
    first = typical[0]
    same = [c for c in typical if len(c.x) == len(first.x) and c.k == first.k and c.tau == first.tau][:2]
    op.call(np.vstack([c.array for c in same] * (3 - len(same))), first.k, first.tau)


class _Judge:
    """Everything measured on one user operator: one pass over the groups, the tallies of each row."""

    def __init__(self, op: OperatorLike, reference: str | None, dtype: str, tol: float, vjp_tol: float, seed: int):
        self.op, self.reference, self.dtype = op, reference, dtype
        self.tol, self.vjp_tol, self.seed = tol, vjp_tol, seed
        self.p: Tally[_Measure] = Tally(tol)
        self.g: Tally[_Measure] = Tally(vjp_tol)
        self.topk: Tally[_Measure] = Tally(0.0)
        self.topk_decided = 0
        self.topk_differ = 0
        self.unchanged: Tally[_Measure] = Tally(0.0)
        self.dtypes: Tally[_Measure] = Tally(0.0)
        self.same: Tally[_Measure] = Tally(0.0)
        self.skipped = {prop: 0 for prop in USER_PROPERTIES}
        self.op_failed = 0

    # -- one group -------------------------------------------------------------------------------
    def group(self, grp: _Group, rng: np.random.Generator) -> None:
        rows, n = grp.x.shape
        v = round_to_dtype(rng.standard_normal((rows, n)), self.dtype)
        x_in = _padded(self.op, grp.x)
        first = self.op.call(x_in.copy(), grp.k, grp.tau, dtype=self.dtype)
        second = self.op.call(x_in.copy(), grp.k, grp.tau, dtype=self.dtype)
        self._forward_rows(grp, first, second)
        ref = _reference(self.reference, grp.x, grp.k, grp.tau, v if self.op.has_gradient else None) if self.reference else None
        p = _p_of(first, rows, n)
        if p is None and rows > 1:  # a batch that fails: row by row, to tell the rows apart
            parts = [_p_of(self.op.call(grp.x[i : i + 1].copy(), grp.k, grp.tau, dtype=self.dtype), 1, n) for i in range(rows)]
            p = np.vstack([np.full((1, n), np.nan) if q is None else q for q in parts])
        if ref is not None:
            self._reference_rows(grp, p, ref)
        if self.op.has_gradient and ref is not None and ref.vjp is not None:
            self._vjp_rows(grp, v, ref.vjp)
        elif self.op.has_gradient:  # no reference: the backward is still run for input-unchanged
            result = self.op.vjp(grp.x.copy(), grp.k, grp.tau, v, dtype=self.dtype)
            self._unchanged(grp.cases[0], result, "backward")

    def _unchanged(self, case: Case, result: Any, where: str) -> None:
        changed = bool(getattr(result, "input_changed", False))
        self.unchanged.add(case, _Measure(1.0 if changed else 0.0, detail=f"the {where} pass wrote to its input x"))

    def _forward_rows(self, grp: _Group, first: Any, second: Any) -> None:
        case = grp.cases[0]
        self._unchanged(case, first, "forward")
        if first.error is None:
            got = str(first.out_dtype)
            bad = got != self.dtype
            self.dtypes.add(case, _Measure(1.0 if bad else 0.0, detail=f"{self.dtype} in, {got} out"))
        rows, n = grp.x.shape
        a, b = _p_of(first, rows, n), _p_of(second, rows, n)
        if a is None or b is None:
            if (first.error is None) != (second.error is None):
                self.same.add(case, _Measure(math.inf, detail="one of two calls on the same input failed"))
            else:
                self.skipped["deterministic"] += rows
            return
        for i, c in enumerate(grp.cases):
            same = a[i].tobytes() == b[i].tobytes()
            diff = 0.0 if same else _row_error(a[i], b[i])
            if not same and not diff > 0:  # different bits, equal values (signed zero, NaN payload)
                diff = math.ulp(0.0)
            self.same.add(c, _Measure(diff, detail=f"two calls differ by {diff:.3g}: {_vec(a[i])} vs {_vec(b[i])}"))

    def _reference_rows(self, grp: _Group, p: FloatArray | None, ref: _Reference) -> None:
        k = grp.k
        for i, c in enumerate(grp.cases):
            if not ref.ok[i]:
                self.skipped["matches-reference"] += 1
                self.skipped["same-topk-set"] += 1
                continue
            if p is None or not np.isfinite(p[i]).all():
                self.op_failed += 1
                self.skipped["matches-reference"] += 1
                self.skipped["same-topk-set"] += 1
                continue
            err = _row_error(p[i], ref.p[i])
            self.p.add(c, _Measure(err, detail=f"|p - p_ref| = {err:.3g}: p = {_vec(p[i], 6)}, reference {_vec(ref.p[i], 6)}"))
            if is_integer_k(k) and _decides(ref.p[i], int(k), self.tol):
                self.topk_decided += 1
                mine, theirs = _topk_set(p[i], int(k)), _topk_set(ref.p[i], int(k))
                if mine != theirs:
                    self.topk_differ += 1
                self.topk.add(c, _Measure(0.0 if mine == theirs else 1.0,
                                          detail=f"top-{int(k)} set {sorted(mine)}, reference {sorted(theirs)}"))

    def _vjp_rows(self, grp: _Group, v: FloatArray, ref_g: FloatArray) -> None:
        rows, n = grp.x.shape
        x_in = _padded(self.op, grp.x)
        result = self.op.vjp(x_in.copy(), grp.k, grp.tau, _padded(self.op, v), dtype=self.dtype)
        self._unchanged(grp.cases[0], result, "backward")
        g = getattr(result, "vjp", None)
        g = None if g is None else np.asarray(g, dtype=np.float64).reshape(-1, n)[:rows]
        if g is not None and g.size != rows * n:
            g = None
        for i, c in enumerate(grp.cases):
            if g is None or not np.isfinite(ref_g[i]).all() or not np.isfinite(g.reshape(rows, n)[i]).all():
                self.skipped["vjp-matches-reference"] += 1
                continue
            gi = g.reshape(rows, n)[i]
            err = _vjp_error(gi, ref_g[i], v[i], grp.tau)
            self.g.add(c, _Measure(err, detail=f"relative VJP error {err:.3g}: {_vec(gi)} vs reference {_vec(ref_g[i])}"))

    # -- verdicts --------------------------------------------------------------------------------
    def result(self, prop: str, tally: Tally[_Measure], expected: bool, shrink: Callable[[Case], Case] | None = None) -> PropertyResult:
        name = self.op.name
        done = tally.settled(name, prop, expected, self.skipped[prop], None)
        if done is not None:
            return done
        assert tally.bad is not None
        m, case = tally.bad
        if shrink is not None:
            case = shrink(case)
        cex = Counterexample(name, case.x, case.k, case.tau, m.detail)
        return PropertyResult(name, prop, expected, False, tally.worst, cex, tally.checked, self.skipped[prop],
                              tally.violations, detail=m.detail)


def check_user_operator(
    op: OperatorLike,
    cases: Sequence[Case],
    *,
    reference: str | None = None,
    dtype: str = "float64",
    tol: float | None = None,
    vjp_tol: float | None = None,
    seed: int = 0,
) -> tuple[PropertyResult, ...]:
    """The rows of :data:`USER_PROPERTIES` for the user's operator ``op`` on ``cases``.

    Args:
        op: the user's operator (``topk_cli.frameworks.user.UserOperator``).
        cases: the suite (or the user's vectors), as :func:`topk_cli.properties.verify_properties`
            runs it; cases at a non-integer k are used only when ``reference`` takes a real k.
        reference: a registered method, or None (then only :data:`ALWAYS_PROPERTIES` are measured).
        dtype: the dtype the operator receives its scores in (:data:`DTYPES`).
        tol, vjp_tol: tolerances of p and the VJP (default: :data:`TOLERANCES` of ``dtype``).
        seed: seed of the cotangents.

    Every row is claimed (``expected`` True): the three of :data:`ALWAYS_PROPERTIES` always, the
    others when there is a reference; ``vjp-matches-reference`` is not applicable (``holds`` None)
    for an operator without a gradient or a reference without one.

    Raises:
        InvalidArgumentError: unknown reference or dtype, a negative tolerance.
    """
    dtype = check_dtype(dtype)
    tol_p, tol_g = tolerances(dtype, tol, vjp_tol)
    if reference is not None:
        get_method(reference)
        cases = [c for c in cases if k_applies(reference, c.k)]
    else:
        cases = [c for c in cases if is_integer_k(c.k)]
    judge = _Judge(op, reference, dtype, tol_p, tol_g, seed)
    groups, left_out = _groups(cases, dtype)
    rng = np.random.default_rng(seed)
    for grp in groups:
        judge.group(grp, rng)
    out: list[PropertyResult] = []
    if reference is not None:
        out.append(judge.result("matches-reference", judge.p, True, _shrinker(op, reference, dtype, tol_p)))
        if not op.has_gradient or not get_method(reference).capabilities.jacobian:
            why = (f"{op.name} has no gradient (a numpy function)" if not op.has_gradient
                   else f"{reference} has no VJP")
            out.append(PropertyResult(op.name, "vjp-matches-reference", True, None, None, None, 0, detail=why))
        else:
            out.append(judge.result("vjp-matches-reference", judge.g, True))
        topk = judge.result("same-topk-set", judge.topk, True)
        share = judge.topk_differ / judge.topk_decided if judge.topk_decided else None
        out.append(replace(topk, worst=share))
    # the dtype row also asks float64 and float32 (one row per group is enough to see the dtype)
    for other in ("float64", "float32"):
        if other != dtype:
            _probe_dtype(op, groups, other, judge)
    out.append(judge.result("input-unchanged", judge.unchanged, True))
    out.append(judge.result("dtype-preserved", judge.dtypes, True))
    out.append(judge.result("deterministic", judge.same, True))
    detail = f"{left_out} case(s) beyond the range of {dtype} left out" if left_out else ""
    tol_of = {"matches-reference": tol_p, "vjp-matches-reference": tol_g}
    return tuple(replace(r, detail=r.detail or detail, dtype=dtype, tolerance=tol_of.get(r.property)) for r in out)


def _probe_dtype(op: OperatorLike, groups: Sequence[_Group], dtype: str, judge: _Judge) -> None:
    """The output dtype of ``op`` on the first row of each group, fed in ``dtype``."""
    for grp in groups:
        if np.abs(grp.x[0][np.isfinite(grp.x[0])]).max(initial=0.0) > _DTYPE_MAX[dtype]:
            continue
        x = round_to_dtype(grp.x[:1], dtype)
        result = op.call(x.copy(), grp.k, grp.tau, dtype=dtype)
        judge._unchanged(grp.cases[0], result, "forward")
        if result.error is None:
            got = str(result.out_dtype)
            judge.dtypes.add(grp.cases[0], _Measure(1.0 if got != dtype else 0.0, detail=f"{dtype} in, {got} out"))


def _shrinker(op: OperatorLike, reference: str, dtype: str, tol: float) -> Callable[[Case], Case]:
    """Shrinks a counterexample of ``matches-reference`` (fewest entries, simplest values)."""

    def shrink(case: Case) -> Case:
        first = _error_at(op, reference, dtype, case.array, case.k, case.tau)
        floor = max(tol, 1e-2 * first) if math.isfinite(first) else tol

        def violates(y: FloatArray, kk: Any) -> bool:
            return _error_at(op, reference, dtype, y, kk, case.tau) > floor

        y, kk = _shrink(violates, case.array, case.k, budget=100)
        return Case(tuple(float(v) for v in round_to_dtype(y, dtype)), kk, case.tau, case.label)

    return shrink


def _error_at(op: OperatorLike, reference: str, dtype: str, x: FloatArray, k: Any, tau: float) -> float:
    """``max |p - p_ref|`` on one vector (NaN when either fails)."""
    y = round_to_dtype(np.asarray(x, dtype=np.float64)[None, :], dtype)
    ref = evaluate(y, k, reference, tau=tau)
    if np.asarray(ref.status)[0] != "ok":
        return math.nan
    p = _p_of(op.call(y.copy(), k, tau, dtype=dtype), 1, y.shape[1])
    if p is None or not np.isfinite(p).all():
        return math.nan
    return _row_error(p[0], np.asarray(ref.weights, dtype=np.float64)[0])


def claims_of_reference(results: Sequence[PropertyResult], op_name: str, reference: str) -> tuple[PropertyResult, ...]:
    """The results of ``op_name`` with the claims (``expected``) of ``reference``: a user's operator
    claims nothing on its own; compared with a reference it is held to what the reference claims."""
    claims = get_method(reference).guarantees
    as_dict = claims.as_dict()
    out = []
    for r in results:
        if r.method == op_name and r.property in as_dict:
            r = replace(r, expected=as_dict[r.property],
                        expected_smoothness=claims.smoothness if r.property == "smooth" else r.expected_smoothness)
        out.append(r)
    return tuple(out)


def user_operator(name: str) -> OperatorLike | None:
    """The user's operator the registry resolved ``name`` to (None for a registered method)."""
    from topk_cli.registry import _user_method, is_user_method

    if not is_user_method(name):
        return None
    known = _user_method(name)  # resolved when the method was selected (the registry keeps its adapter)
    return None if known is None else cast(OperatorLike, known[1].op)
