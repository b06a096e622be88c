"""``stability-probe``: map where each operator breaks numerically, and predict it for GradTopK.

The probe draws ``trials`` score vectors per length ``n`` (``x = offset + scale * draw``, the
draw standardised to unit variance), evaluates every method at every ``(n, k, scale)`` cell of a
grid and classifies each trial:

* numerical failures reported by the method (its status code: ``log0``, ``log-negative``,
  ``cancellation``, ``nan``, ``inf``, ...);
* violations of a property the method claims (``sum-error``, ``out-of-range``,
  ``order-violated``: a larger score got a smaller weight), judged with ``tolerance``;
* ``inaccurate``: ``max_i |p_i - ref_i| > tolerance`` against an independent reference of the
  *same* operator on the same shifted input ``z`` (see :data:`REFERENCES`).

Breaches of a property the method does *not* claim (``iterative`` exceeding 1) are counted in
``unclaimed``, not as failures. A trial fails when it has at least one failure kind.

A method whose breakdown has a model (its registry entry's ``stability``, e.g. GradTopK's
recursion ``grad-recursive``) is also traced (level of the first log of a non-positive argument,
the argument just before) and its failure is *predicted* without running it (see
``topk_cli.recursion`` for the model and how well it agrees with the trace).

Each method is judged against the reference its registry entry names (``MethodSpec.probe``);
a Monte-Carlo method within ``MONTE_CARLO_STDERRS`` standard errors of each weight (as it
reports them), since its estimate is only that close to the operator.

Axis convention: the last axis holds the ``n`` scores; leading axes are a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from topk_cli.analysis.parallel import parallel_map
from topk_cli.analysis.probe_grid import DISTRIBUTIONS as DISTRIBUTIONS
from topk_cli.analysis.probe_grid import MAX_PROBE_BYTES as MAX_PROBE_BYTES
from topk_cli.analysis.probe_grid import _check_memory, _is_int, _is_real
from topk_cli.analysis.probe_grid import draw_scores as draw_scores
from topk_cli.analysis.probe_grid import parse_scales as parse_scales
from topk_cli.analysis.probe_grid import probe_memory as probe_memory
from topk_cli.analysis.probe_grid import resolve_k as resolve_k
from topk_cli.api import check_tau, evaluate, get_method, scaled_scores
from topk_cli.errors import InvalidArgumentError
from topk_cli.operators._base import FloatArray, tie_groups
from topk_cli.operators.grad_recursive import shared_trace
from topk_cli.recursion import RecursionOutlook, recursion_outlook
from topk_cli.references import ReferenceContext
from topk_cli.registry import METHODS, MONTE_CARLO_STDERRS, MethodSpec, runs_in_process

#: Failure kinds besides the methods' own status codes, in display order.
CHECK_KINDS = ("sum-error", "out-of-range", "order-violated", "inaccurate")

#: Methods probed when none are named: those whose registry entry says so (every smooth operator).
DEFAULT_METHODS = tuple(spec.name for spec in METHODS.values() if spec.capabilities.probe_default)

#: What ``max_error`` is measured against, per method (shown by the docs and the CLI).
REFERENCES: Mapping[str, str] = MappingProxyType({
    spec.name: spec.probe.description
    + (f"; a Monte-Carlo estimate, judged within {MONTE_CARLO_STDERRS:g} of its standard errors per weight"
       if spec.capabilities.monte_carlo else "")
    for spec in METHODS.values()
})

#: A non-failed trial of a method with a stability model (``grad-recursive``) that lost at least
#: this many decimal digits (traced cancellation or predicted amplification) counts as a near failure.
NEAR_DIGITS = 12.0



# ---------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class RecursionDetection:
    """What the ``grad-recursive`` trace and the prediction say about one cell's trials.

    ``levels``: failed level -> trials (log 0 or log of a negative number, from the trace);
    ``value_before``: (min, max) of the failing entry's argument one level before the failure;
    ``max_digits_lost``: digits lost to the final subtraction (trace) on trials that did not
    break; ``near_failures``: trials that did not break but lost >= :data:`NEAR_DIGITS` digits
    (trace or prediction); ``predicted``: trials predicted to break (amplification model);
    ``saturation_predicted``: trials predicted to break by the saturation model;
    ``agreement``: trials where prediction and trace agree on break / no break;
    ``level_agreement``: broken trials whose predicted level equals the observed level (the
    prediction is otherwise usually 1-3 levels early); ``min_complement`` and
    ``predicted_digits_lost``: extremes over the trials.
    """

    broken: int
    levels: Mapping[int, int]
    value_before: tuple[float, float]
    max_digits_lost: float
    near_failures: int
    predicted: int
    saturation_predicted: int
    agreement: int
    level_agreement: int
    min_complement: float
    predicted_digits_lost: float


@dataclass(frozen=True)
class CellResult:
    """One method on one grid cell: trials, failures by kind, error against the reference.

    ``kinds`` counts trials per failure kind (a trial can have several); ``unclaimed`` counts
    breaches of properties the method does not claim (not failures); ``max_error`` is
    ``max |p - ref|`` over the trials that returned weights (NaN when there is none or no
    reference); ``detection`` is set for ``grad-recursive``.
    """

    method: str
    n: int
    k: int | float
    scale: float
    trials: int
    failures: int
    kinds: Mapping[str, int]
    unclaimed: Mapping[str, int]
    max_error: float
    detection: RecursionDetection | None = None
    #: The first message of each failure code the method reported here (e.g. the exception a user's
    #: operator raised), by code.
    examples: Mapping[str, str] = field(default_factory=dict)

    @property
    def failure_rate(self) -> float:
        """Fraction of trials that failed."""
        return self.failures / self.trials if self.trials else 0.0


@dataclass(frozen=True)
class Boundary:
    """First failing grid scale of a method at ``(n, k)``, and what the models predicted.

    ``first_failing_scale``: smallest scale with a failure of any kind (None if none);
    for ``grad-recursive`` also ``first_breaking_scale`` (log 0 / log of a negative number
    observed in the trace), ``predicted_scale`` (amplification model) and ``saturation_scale``
    (saturation model); None where nothing happened or no prediction exists.
    """

    method: str
    n: int
    k: int | float
    first_failing_scale: float | None
    predicted_scale: float | None = None
    first_breaking_scale: float | None = None
    saturation_scale: float | None = None


@dataclass(frozen=True)
class ProbeReport:
    """Everything one probe measured, in grid order (method, n, k, scale)."""

    methods: tuple[str, ...]
    ns: tuple[int, ...]
    k_specs: tuple[str, ...]
    scales: tuple[float, ...]
    dist: str
    offset: float
    trials: int
    seed: int
    tau: float
    tolerance: float
    cells: tuple[CellResult, ...]
    boundaries: tuple[Boundary, ...]

    @property
    def failed(self) -> bool:
        """True when some selected method failed somewhere on the grid (``--strict``)."""
        return any(cell.failures for cell in self.cells)


# ---------------------------------------------------------------------------------------------
# the recursion's outlook (public helper of ``compute``'s warnings and the docs)


def grad_recursive_outlook(x: ArrayLike, k: int, *, tau: float = 1.0) -> RecursionOutlook:
    """Predict, without running it, where GradTopK's recursion breaks on each row of ``x / tau``.

    From the exact tables of GradTopK's reference (no subtraction) it computes every complement
    ``c_i^(j) = 1 - p_i^(j) = e_j(w_-i) / e_j(w)`` and marginal ``p_i^(j)`` for levels
    ``j < k`` (``w = exp(z)``) and the error amplification ``R_j = (p^(j)/c^(j)) R_{j-1} +
    1/c^(j)`` of the recursion's deflation. The argument of ``log`` at level ``j + 1`` has a
    relative error of about ``u R_j``; the predicted failing level is the first ``j + 1`` with
    ``u R_j >= 1`` (agrees with the trace on 99.5% of random trials, the level usually exact or
    a few levels early; see the module docstring).
    Rows are flattened (row-major). Cost O(n k + k^3) per row.

    Raises:
        InvalidArgumentError: bad ``x``, ``k`` or ``tau`` (as :func:`topk_cli.evaluate`).

    >>> o = grad_recursive_outlook([[0.0, -1.0, -2.0], [0.0, -50.0, -100.0]], 2)
    >>> o.predicted_level.tolist(), o.saturation_level.tolist(), o.min_complement.round(4).tolist()
    ([-1, 2], [-1, 2], [0.3348, 0.0])
    """
    z = scaled_scores(x, k, tau=tau)  # validates x, k and tau exactly like the operators
    return recursion_outlook(z, int(k))


# ---------------------------------------------------------------------------------------------
# checks


@dataclass(frozen=True)
class _ScoreOrder:
    """The part of the order check that depends on the scores only (shared by every k and method)."""

    order: NDArray[np.intp]  # (B, n) stable ascending order of z
    group_start: NDArray[np.intp]  # (B, n) first sorted position of each entry's tie group


def _score_order(z: FloatArray) -> _ScoreOrder:
    order, starts = tie_groups(z)
    idx = np.broadcast_to(np.arange(z.shape[1]), z.shape)
    return _ScoreOrder(order, np.maximum.accumulate(np.where(starts, idx, 0), axis=-1))


def _order_violations(z: FloatArray, p: FloatArray, tol: float, order: _ScoreOrder | None = None) -> NDArray[np.bool_]:
    """Rows where some strictly larger score got a weight smaller by more than ``tol``
    (``order``: :func:`_score_order` of ``z``, when already computed)."""
    so = _score_order(z) if order is None else order
    ps = np.take_along_axis(p, so.order, axis=-1)
    running = np.maximum.accumulate(ps, axis=-1)  # running[i] = max p over positions <= i
    before = np.concatenate([np.full((z.shape[0], 1), -np.inf), running[:, :-1]], axis=-1)
    best_smaller = np.take_along_axis(before, so.group_start, axis=-1)  # max p over strictly smaller z
    return np.any(ps < best_smaller - tol, axis=-1)


@dataclass(frozen=True)
class _Batch:
    """Per-trial classification of one method on one cell."""

    failed: NDArray[np.bool_]
    kinds: dict[str, int]
    unclaimed: dict[str, int]
    max_error: float
    examples: dict[str, str] = field(default_factory=dict)


def _classify(spec: MethodSpec, x: FloatArray, z: FloatArray, k: float, tau: float, tol: float, ctx: ReferenceContext,
              order: _ScoreOrder) -> _Batch:
    claims = spec.guarantees
    result = evaluate(x, k, spec.name, tau=tau)
    status = np.asarray(result.status).reshape(-1)
    p = np.asarray(result.weights, dtype=np.float64).reshape(z.shape)
    # a Monte-Carlo estimate is judged within MONTE_CARLO_STDERRS of its standard errors
    slack = np.zeros_like(p)
    if spec.capabilities.monte_carlo and result.stderr is not None:
        slack = MONTE_CARLO_STDERRS * np.nan_to_num(np.asarray(result.stderr, dtype=np.float64).reshape(z.shape))
    computed = status == "ok"
    failed = ~computed
    kinds: dict[str, int] = {}
    unclaimed: dict[str, int] = {}
    for code in sorted(set(status[failed].tolist())):
        kinds[str(code)] = int(np.sum(status == code))
    examples: dict[str, str] = {}
    for failure in result.failures:
        examples.setdefault(failure.code, failure.detail)
    with np.errstate(invalid="ignore"):  # failed rows hold NaN; they are masked by `computed`
        checks = {
            "sum-error": (claims.sum, np.abs(np.sum(p, axis=-1) - k) > tol * k + np.sum(slack, axis=-1)),
            "out-of-range": (claims.range, np.any((p < -tol - slack) | (p > 1 + tol + slack), axis=-1)),
            "order-violated": (claims.monotone_weak, _order_violations(z, p, tol + float(np.max(slack, initial=0.0)), order)),
        }
    for name, (claimed, bad) in checks.items():
        bad = bad & computed
        if bad.any():
            (kinds if claimed else unclaimed)[name] = int(bad.sum())
            if claimed:
                failed |= bad
    max_error = math.nan
    if spec.probe.compute is not None:
        # a real k reaches only the methods that take one; the threshold references (a bisection on
        # sum f(z - lambda) = k) hold for any k > 0, the others are typed for an integer k
        k_ref = cast(int, k)
        if not spec.implementation.centred:  # a method of the raw scores: its reference takes x / tau too
            raw = np.asarray(x, dtype=np.float64) / tau
            ref, trusted = spec.probe.compute(raw, k_ref, ReferenceContext(raw, k_ref))
        else:
            ref, trusted = ctx.reference(spec.probe.compute, k_ref) if ctx.z is z else spec.probe.compute(z, k_ref, ctx)
        with np.errstate(invalid="ignore"):
            err = np.max(np.abs(p - ref), axis=-1)
            beyond = np.any(np.abs(p - ref) > tol + slack, axis=-1)
        usable = computed & trusted
        if usable.any():
            max_error = float(np.max(err[usable]))
        bad = usable & beyond
        if bad.any():
            kinds["inaccurate"] = int(bad.sum())
            failed |= bad
    return _Batch(failed=failed, kinds=kinds, unclaimed=unclaimed, max_error=max_error, examples=examples)


def _detect(spec: MethodSpec, z: FloatArray, k: int, ctx: ReferenceContext) -> RecursionDetection | None:
    model = spec.stability
    if model is None:
        return None
    with np.errstate(all="ignore"):  # the trace records log(0) and log(<0) instead of warning
        trace = model.trace(z, k)
    outlook = model.outlook(z, k, ctx)
    broken = trace.failed_level >= 0
    levels = np.asarray(trace.failed_level)[broken]
    before = np.asarray(trace.value_before)[broken]
    before = before[np.isfinite(before)]
    digits = np.asarray(trace.digits_lost)
    near = ~broken & ((digits >= NEAR_DIGITS) | (outlook.digits_lost >= NEAR_DIGITS))
    predicted = outlook.predicted_level >= 0
    return RecursionDetection(
        broken=int(broken.sum()),
        levels=dict({int(v): int(c) for v, c in zip(*np.unique(levels, return_counts=True), strict=True)}),
        value_before=(float(before.min()), float(before.max())) if before.size else (math.nan, math.nan),
        max_digits_lost=float(digits[~broken].max()) if (~broken).any() else math.nan,
        near_failures=int(near.sum()),
        predicted=int(predicted.sum()),
        saturation_predicted=int((outlook.saturation_level >= 0).sum()),
        agreement=int((predicted == broken).sum()),
        level_agreement=int((broken & (outlook.predicted_level == trace.failed_level)).sum()),
        min_complement=float(outlook.min_complement.min()),
        predicted_digits_lost=float(outlook.digits_lost.max()),
    )



# ---------------------------------------------------------------------------------------------
# the probe


def _first(scales: Sequence[float], counts: Sequence[int]) -> float | None:
    return next((s for s, c in zip(scales, counts, strict=True) if c > 0), None)


@dataclass(frozen=True)
class _Unit:
    """One (n, scale, methods) unit of the probe's grid: everything its cells depend on.

    ``names`` are the methods that share work on this (n, scale): those judged against the same
    reference function (``grad`` and ``grad-recursive`` share its tables,
    ``thre-sigmoid`` and ``ot-sinkhorn`` its bisection, computed once per k); every other
    method is a unit of its own, so the units are small enough to balance over the jobs.
    """

    names: tuple[str, ...]
    n: int
    ks: tuple[int | float, ...]
    scale: float
    dist: str
    offset: float
    trials: int
    seed: int
    tau: float
    tolerance: float


def _method_groups(names: Sequence[str]) -> list[tuple[str, ...]]:
    """``names`` split into the groups of :class:`_Unit`: one per reference function, in order."""
    groups: dict[object, list[str]] = {}
    for name in names:
        compute = get_method(name).probe.compute
        groups.setdefault(compute if compute is not None else name, []).append(name)
    return [tuple(group) for group in groups.values()]


def _unit_cost(u: _Unit) -> float:
    """A rough run time estimate for scheduling (largest units start first): the sequential
    methods cost O(n k) per trial, the others O(n) per k and iteration; only the order matters."""
    return float(u.trials * u.n * (sum(u.ks) + 10 * len(u.ks)) * len(u.names))


def _run_unit(u: _Unit) -> list[CellResult]:
    """The cells of one (n, scale) unit; a pure function of ``u`` (draws keyed by seed, n, dist)."""
    draws = draw_scores(u.n, u.trials, dist=u.dist, seed=u.seed)
    with np.errstate(over="ignore"):  # an overflow is refused just below
        x = u.offset + u.scale * draws
    if not np.isfinite(x).all():
        raise InvalidArgumentError(f"offset + scale * draw overflows float64 (scale={u.scale:g})")
    z = scaled_scores(x, 1, tau=u.tau)
    # one O(n kmax) GradTopK program per (n, scale), shared by every k and method
    ctx = ReferenceContext(z, math.ceil(max(u.ks)))
    order = _score_order(z)  # the scores' order, shared by every k
    cells = []
    for k in u.ks:
        for method in u.names:
            spec = get_method(method)
            try:
                with shared_trace():  # the trace of the recursion the forward pass ran, not a rerun
                    batch = _classify(spec, x, z, k, u.tau, u.tolerance, ctx, order)
                    # a stability model is that of an integer-only method (grad-recursive)
                    detection = _detect(spec, z, k, ctx) if isinstance(k, int) else None
            except MemoryError as exc:  # the estimate above covers the probe, not every method
                raise InvalidArgumentError(
                    f"the cell n={u.n}, k={k} with {u.trials} trials needs more memory than is available "
                    f"for method {method!r} ({exc}); use fewer trials or smaller n or k"
                ) from None
            cells.append(CellResult(
                method=method, n=u.n, k=k, scale=u.scale, trials=u.trials,
                failures=int(batch.failed.sum()),
                kinds=dict(batch.kinds), unclaimed=dict(batch.unclaimed),
                max_error=batch.max_error, detection=detection, examples=dict(batch.examples),
            ))
    return cells


def stability_probe(
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    ns: Sequence[int] = (10, 100, 1000),
    ks: Sequence[str | int | float] = (1, 2, 5, 10, 50),
    scales: Sequence[float] = parse_scales("0.1:1e4:13"),
    dist: str = "normal",
    offset: float = 0.0,
    trials: int = 20,
    seed: int = 0,
    tau: float = 1.0,
    tolerance: float = 1e-9,
    progress: Callable[[int, int], None] | None = None,
    jobs: int = 1,
) -> ProbeReport:
    """Evaluate ``methods`` on ``x = offset + scale * draw`` over an (n, k, scale) grid.

    Per method and cell: trials, failed trials, failures by kind, breaches of unclaimed
    properties, ``max |p - ref|`` against :data:`REFERENCES`; for a method with a stability
    model (``grad-recursive``) the traced failure level and the predicted one. ``ks`` entries are integers
    or fractions of n (``"0.1n"``); k > n is skipped. Draws are keyed by ``(seed, n, dist)``
    and shared by every k and scale (paired comparisons; deterministic for a seed).
    ``progress(done, total)`` is called after each (n, scale, method group) unit. The units run on
    ``jobs`` processes (1: in-process), largest first; the report is identical for every ``jobs``.

    Raises:
        InvalidArgumentError: unknown method or distribution, bad n, k, scale, trials, tau,
            tolerance or offset.

    >>> r = stability_probe(methods=["grad", "grad-recursive"], ns=[10], ks=[5], scales=[0.1, 100.0], trials=4)
    >>> [(c.method, c.scale, c.failures) for c in r.cells]
    [('grad', 0.1, 0), ('grad', 100.0, 0), ('grad-recursive', 0.1, 0), ('grad-recursive', 100.0, 4)]
    >>> b = r.boundaries[1]
    >>> b.first_failing_scale, b.first_breaking_scale, b.predicted_scale
    (100.0, 100.0, 100.0)
    """
    if methods is None or isinstance(methods, str):
        raise InvalidArgumentError(f"methods must be a list of method names, got {methods!r}")
    names = tuple(dict.fromkeys(get_method(m).name for m in methods))
    if not names:
        raise InvalidArgumentError("methods must name at least one method")
    if not ns or not all(_is_int(n) and n >= 1 for n in ns):
        raise InvalidArgumentError(f"n must be positive integers, got {list(ns)}")
    if not _is_int(trials) or trials < 1:
        raise InvalidArgumentError(f"trials must be an integer >= 1, got {trials!r}")
    if not _is_int(seed) or seed < 0:
        raise InvalidArgumentError(f"seed must be an integer >= 0, got {seed!r}")
    scales = list(scales)
    if not scales or not all(_is_real(s) and math.isfinite(s) and s > 0 for s in scales):
        raise InvalidArgumentError(f"scales must be finite numbers > 0, got {scales}")
    if not (_is_real(tolerance) and math.isfinite(tolerance) and tolerance > 0):
        raise InvalidArgumentError(f"tolerance must be a finite number > 0, got {tolerance!r}")
    if not (_is_real(offset) and math.isfinite(offset)):
        raise InvalidArgumentError(f"offset must be a finite number, got {offset!r}")
    check_tau(tau)
    n_list = tuple(dict.fromkeys(int(n) for n in ns))
    k_specs = tuple(str(k) for k in ks)
    if not k_specs:
        raise InvalidArgumentError("k must list at least one value")
    scale_list = tuple(sorted({float(s) for s in scales}))
    grid = {n: sorted({k for k in (resolve_k(spec, n) for spec in k_specs) if k is not None}) for n in n_list}
    if not any(grid.values()):
        raise InvalidArgumentError(f"no cell on the grid: every k in {list(k_specs)} exceeds every n in {list(n_list)}")
    _check_memory(names, grid, int(trials))
    units = [
        _Unit(group, n, tuple(grid[n]), scale, dist, float(offset), int(trials), int(seed), float(tau), float(tolerance))
        for n in n_list if grid[n] for scale in scale_list for group in _method_groups(names)
    ]
    found: dict[tuple[str, int, int | float, float], CellResult] = {}
    jobs = 1 if runs_in_process(names) else jobs  # a user's operator runs where it was loaded
    for unit_cells in parallel_map(_run_unit, units, jobs=jobs, progress=progress, cost=_unit_cost):
        for cell in unit_cells:
            found[(cell.method, cell.n, cell.k, cell.scale)] = cell
    cells = tuple(found[key] for key in sorted(found, key=lambda t: (names.index(t[0]), t[1], t[2], t[3])))
    boundaries = []
    for method in names:
        for n in n_list:
            for k in grid[n]:
                row = [found[(method, n, k, s)] for s in scale_list]
                first = _first(scale_list, [c.failures for c in row])
                det = [c.detection for c in row if c.detection is not None]
                if det:
                    boundaries.append(Boundary(
                        method=method, n=n, k=k, first_failing_scale=first,
                        predicted_scale=_first(scale_list, [d.predicted for d in det]),
                        first_breaking_scale=_first(scale_list, [d.broken for d in det]),
                        saturation_scale=_first(scale_list, [d.saturation_predicted for d in det]),
                    ))
                else:
                    boundaries.append(Boundary(method=method, n=n, k=k, first_failing_scale=first))
    return ProbeReport(
        methods=names, ns=n_list, k_specs=k_specs, scales=scale_list, dist=dist, offset=float(offset),
        trials=int(trials), seed=int(seed), tau=float(tau), tolerance=float(tolerance),
        cells=cells, boundaries=tuple(boundaries),
    )
