"""What ``softtopk bench`` measures: speed and peak memory of the operators on one shape.

Every method is timed through the public API (:func:`topk_cli.evaluate` for the forward pass,
:func:`topk_cli.vjp` for the vector-Jacobian product), so validation, shifting and scaling count.
Times are divided by two numpy baselines measured on the same array in the same run: ``np.exp``
(one transcendental pass) and ``np.sort`` along the last axis. Ratios travel between machines far
better than milliseconds; both are reported. A time is the median of ``repeats`` repeats, each
repeat looping the call enough times to last ``min_time`` seconds (timer resolution). Peak memory
is the largest extra allocation traced by :mod:`tracemalloc` during one call (numpy reports its
buffers to it); it counts the buffers of this process, not the resident set of the interpreter.

A Monte-Carlo method is timed at :data:`MC_SAMPLES` samples per call unless told otherwise (its
time grows linearly with the sample count; at its usual default of 1000 one such method took most of
a default run); each result records the parameters it was timed with and says so.

Pure measurement: no printing, no files, randomness only through an explicit generator.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.api import evaluate, get_method, vjp
from topk_cli.errors import InvalidArgumentError, NumericalFailureError
from topk_cli.registry import user_seconds

#: How peak memory is measured (reported in every result).
MEMORY_METHOD = "tracemalloc"

DTYPES = ("float32", "float64")

#: Samples per call at which a Monte-Carlo method (one with a ``samples`` parameter) is timed by
#: default. Its time grows about linearly with the samples.
MC_SAMPLES = 16

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class Baselines:
    """Milliseconds per call of the numpy baselines on the benchmarked array."""

    exp_ms: float
    sort_ms: float
    partition_ms: float


@dataclass(frozen=True)
class BenchResult:
    """Speed and memory of one method. Ratios are to the baselines of the same run.

    ``vjp_ms`` and the VJP ratios are None when the forward pass failed on some row
    (``failed_rows > 0``: the VJP is undefined there) or when ``vjp`` was not requested.
    Peak memory is in bytes (None when not measured).
    """

    method: str
    forward_ms: float
    forward_vs_exp: float
    forward_vs_sort: float
    vjp_ms: float | None
    vjp_vs_exp: float | None
    vjp_vs_forward: float | None
    peak_forward_bytes: int | None
    peak_vjp_bytes: int | None
    failed_rows: int
    status: str
    #: The method's extra parameters the times were measured with (empty: its defaults).
    parameters: Mapping[str, int | float] = dataclasses.field(default_factory=dict)
    #: What the reader must know about these parameters ("" when there is nothing to say).
    note: str = ""
    #: A user's operator: milliseconds per forward call spent inside its own code, and the rest of
    #: the call (validation, conversion to its framework and back, the checks of its output): the
    #: tool's overhead. None for a registered method.
    operator_ms: float | None = None
    overhead_ms: float | None = None


@dataclass(frozen=True)
class BenchReport:
    """Everything ``softtopk bench`` shows: the shape, the baselines and one result per method."""

    batch: int
    n: int
    k: Any  # one k (int, or float for a real k), or a (batch,) array: one per row (--k-column)
    tau: float
    dtype: str
    repeats: int
    seed: int | None
    source: str
    input_bytes: int
    baselines: Baselines
    results: tuple[BenchResult, ...]
    memory_method: str = MEMORY_METHOD


def random_scores(batch: int, n: int, *, seed: int, dtype: str = "float64") -> NDArray[Any]:
    """Standard normal scores of shape ``(batch, n)`` from ``numpy.random.default_rng(seed)``.

    >>> random_scores(2, 3, seed=0).shape
    (2, 3)
    """
    check_shape(batch, n)
    return np.random.default_rng(seed).standard_normal((batch, n)).astype(check_dtype(dtype))


def check_shape(batch: int, n: int) -> None:
    """Raise :class:`InvalidArgumentError` unless ``batch >= 1`` and ``n >= 1``."""
    if batch < 1:
        raise InvalidArgumentError(f"the batch size -B must be >= 1, got {batch}")
    if n < 1:
        raise InvalidArgumentError(f"the vector length -n must be >= 1, got {n}")


def check_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype of ``dtype`` (``float32`` or ``float64``)."""
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return np.dtype(dtype)


def seconds_per_call(fn: Callable[[], object], *, repeats: int, min_time: float = 0.02,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` repeats (after one warm-up call).

    Each repeat loops the call as many times as needed (doubling) to last ``min_time``.
    """
    start = clock()
    fn()  # warm-up (and the length of one call)
    first = clock() - start
    calls = 1
    if first < min_time:
        while True:
            start = clock()
            for _ in range(calls):
                fn()
            elapsed = clock() - start
            if elapsed >= min_time:
                break
            calls *= 2
        samples = [elapsed / calls]
    else:
        samples = [first]
    for _ in range(repeats - 1):
        start = clock()
        for _ in range(calls):
            fn()
        samples.append((clock() - start) / calls)
    return statistics.median(samples)


def interleaved_seconds(fns: Sequence[Callable[[], object]], *, repeats: int, min_time: float = 0.02,
                        clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Median seconds per call of each of ``fns``, their repeats taken in turn (one repeat of each,
    then the next round), so that a drift of the machine or of the process during the measurement
    (the allocator's thresholds settling, memory reclaimed in the background) falls on all of them
    alike rather than on whichever was timed first. Each function is warmed up and calibrated as in
    :func:`seconds_per_call` (calls per repeat doubled until a repeat lasts ``min_time``)."""
    counts = []
    for fn in fns:
        start = clock()
        fn()  # warm-up (and the length of one call)
        calls = 1
        if clock() - start < min_time:
            while True:
                start = clock()
                for _ in range(calls):
                    fn()
                if clock() - start >= min_time:
                    break
                calls *= 2
        counts.append(calls)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, calls, got in zip(fns, counts, samples, strict=True):
            start = clock()
            for _ in range(calls):
                fn()
            got.append((clock() - start) / calls)
    return [statistics.median(got) for got in samples]


def peak_bytes(fn: Callable[[], object]) -> int:
    """Largest extra memory traced by :mod:`tracemalloc` during one call of ``fn`` (bytes)."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, peak - base)


def numpy_baselines(x: NDArray[Any], k: int, *, repeats: int, min_time: float = 0.02) -> Baselines:
    """``np.exp(x)``, ``np.sort(x, axis=-1)`` and ``np.partition`` at k, in milliseconds per call."""
    n = x.shape[-1]
    with np.errstate(all="ignore"):  # raw scores above ~709 overflow: the time is what is measured
        exp_s = seconds_per_call(lambda: np.exp(x), repeats=repeats, min_time=min_time)
    sort_s = seconds_per_call(lambda: np.sort(x, axis=-1), repeats=repeats, min_time=min_time)
    kth = max(0, n - k - 1) if k < n else n - 1
    part_s = seconds_per_call(lambda: np.partition(x, kth, axis=-1), repeats=repeats, min_time=min_time)
    return Baselines(exp_ms=exp_s * 1e3, sort_ms=sort_s * 1e3, partition_ms=part_s * 1e3)


def bench_parameters(name: str) -> dict[str, int | float]:
    """The extra parameters ``bench`` times ``name`` with by default: ``samples = MC_SAMPLES`` for a
    Monte-Carlo method whose own default is larger, nothing otherwise.

    >>> bench_parameters("grad")
    {}
    """
    spec = get_method(name)
    if not spec.capabilities.monte_carlo:
        return {}
    samples = [p for p in spec.parameters if p.name == "samples"]
    if not samples or samples[0].default <= MC_SAMPLES:
        return {}
    return {"samples": MC_SAMPLES}


def _parameters_note(name: str, parameters: Mapping[str, int | float]) -> str:
    defaults = {p.name: p.default for p in get_method(name).parameters}
    changed = [f"{key} = {value:g} (its default: {defaults[key]:g})" for key, value in parameters.items()
               if key in defaults and value != defaults[key]]
    if not changed:
        return ""
    tail = "; its time grows about linearly with samples" if "samples" in parameters else ""
    return f"{name} timed with {', '.join(changed)}{tail}"


def bench(
    x: NDArray[Any],
    k: Any,
    methods: Sequence[str],
    *,
    tau: float = 1.0,
    repeats: int = 5,
    min_time: float = 0.02,
    with_vjp: bool = True,
    memory: bool = True,
    seed: int | None = 0,
    source: str = "random normal scores",
    progress: ProgressFn | None = None,
    parameters: Mapping[str, Mapping[str, int | float]] | None = None,
) -> BenchReport:
    """Time forward and VJP of ``methods`` on the ``(B, n)`` batch ``x`` against numpy baselines.

    ``x`` is used as given (its dtype, float32 or float64, is the one timed). The cotangent of
    the VJP is standard normal from ``default_rng(seed)`` (``seed=None``: 0). A method that fails
    on some rows (e.g. ``grad-recursive`` on wide spreads) is timed on its forward pass only.
    ``parameters`` maps a method to its extra parameters (e.g. ``{"samples": 1000}``); a method not
    in it is timed with :func:`bench_parameters` (a Monte-Carlo method at :data:`MC_SAMPLES` samples).

    Raises:
        InvalidArgumentError: bad ``k``, ``tau``, method name, shape, or ``repeats < 1``.
    """
    if x.ndim != 2:
        raise InvalidArgumentError(f"bench needs a (batch, n) array, got shape {x.shape}")
    if repeats < 1:
        raise InvalidArgumentError(f"--repeats must be >= 1, got {repeats}")
    if not methods:
        raise InvalidArgumentError("bench needs at least one method")
    for name in methods:
        get_method(name)
    batch, n = x.shape
    evaluate(x[:1], k[:1] if isinstance(k, np.ndarray) else k, methods[0], tau=tau)  # validates k, tau, values
    # np.partition at the largest k (a real k reaches into its ceiling's entry)
    base = numpy_baselines(x, math.ceil(float(np.max(k))), repeats=repeats, min_time=min_time)
    v = np.random.default_rng(0 if seed is None else seed).standard_normal(x.shape).astype(x.dtype)
    results = []
    for i, name in enumerate(methods):
        if progress is not None:
            progress(i, len(methods))
        chosen = dict(parameters[name]) if parameters is not None and name in parameters else bench_parameters(name)
        results.append(_bench_one(x, v, k, name, tau, base, repeats, min_time, with_vjp, memory, chosen))
    if progress is not None:
        progress(len(methods), len(methods))
    return BenchReport(
        batch=batch, n=n, k=k, tau=tau, dtype=str(x.dtype), repeats=repeats, seed=seed, source=source,
        input_bytes=int(x.nbytes), baselines=base, results=tuple(results),
    )


def _bench_one(x: NDArray[Any], v: NDArray[Any], k: Any, name: str, tau: float, base: Baselines,
               repeats: int, min_time: float, with_vjp: bool, memory: bool,
               params: Mapping[str, Any]) -> BenchResult:
    first = evaluate(x, k, name, tau=tau, **params)
    failed = len(first.failures)
    fwd_s = seconds_per_call(lambda: evaluate(x, k, name, tau=tau, **params), repeats=repeats, min_time=min_time)
    fwd_ms = fwd_s * 1e3
    peak_fwd = peak_bytes(lambda: evaluate(x, k, name, tau=tau, **params)) if memory else None
    operator_ms, overhead_ms = _user_split(x, k, name, tau, repeats)
    vjp_ms = vjp_vs_exp = vjp_vs_fwd = None
    peak_vjp = None
    status = "ok" if not failed else f"forward failed on {failed} of {x.shape[0]} rows; VJP not timed"
    if with_vjp and not failed and not get_method(name).capabilities.jacobian:
        status = "no VJP: the method has no gradient"
    elif with_vjp and not failed:
        try:
            vjp_s = seconds_per_call(lambda: vjp(x, k, v, name, tau=tau, **params), repeats=repeats, min_time=min_time)
        except NumericalFailureError as exc:  # defensive: the forward pass succeeded above
            status = f"VJP failed: {exc}"
        else:
            vjp_ms = vjp_s * 1e3
            vjp_vs_exp = vjp_ms / base.exp_ms
            vjp_vs_fwd = vjp_ms / fwd_ms
            peak_vjp = peak_bytes(lambda: vjp(x, k, v, name, tau=tau, **params)) if memory else None
    return BenchResult(
        method=name, forward_ms=fwd_ms, forward_vs_exp=fwd_ms / base.exp_ms, forward_vs_sort=fwd_ms / base.sort_ms,
        vjp_ms=vjp_ms, vjp_vs_exp=vjp_vs_exp, vjp_vs_forward=vjp_vs_fwd,
        peak_forward_bytes=peak_fwd, peak_vjp_bytes=peak_vjp, failed_rows=failed, status=status,
        parameters=dict(params), note=_parameters_note(name, params),
        operator_ms=operator_ms, overhead_ms=overhead_ms,
    )


def _user_split(x: NDArray[Any], k: Any, name: str, tau: float, repeats: int) -> tuple[float | None, float | None]:
    """``(ms inside the user's code, ms of the rest)`` per forward call of a user's operator, from
    ``max(repeats, 3)`` calls timed whole while the adapter times the user's code; ``(None, None)``
    for a registered method. The overhead is the difference of two clocks around the same calls."""
    if user_seconds(name) is None:
        return None, None
    calls = max(repeats, 3)
    inside_before = user_seconds(name) or 0.0
    start = time.perf_counter()
    for _ in range(calls):
        evaluate(x, k, name, tau=tau)
    total = time.perf_counter() - start
    inside = (user_seconds(name) or 0.0) - inside_before
    return inside / calls * 1e3, max(total - inside, 0.0) / calls * 1e3
