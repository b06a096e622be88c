"""Speed of every registered operator, as ratios against numpy baselines measured in the same run.

Usage:
    python benchmarks/bench_operators.py            # full grid (about a minute)
    python benchmarks/bench_operators.py --quick    # smaller grid, fewer repeats

For each shape (batch B x n) and k, times ``soft_topk`` (forward) and ``vjp`` per method and
divides by the time of two numpy baselines on the same array: a row-wise softmax (max-shift,
exp, sum, divide) and ``np.sort`` along the last axis. Ratios, not seconds, are the numbers to
quote: they travel between machines far better. Timing = median of repeats, each repeat long
enough (>= 20 ms) to swamp timer resolution. Peak extra memory of one forward call is measured
with tracemalloc (numpy reports its buffers to it) and given as a multiple of the input size.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable
from functools import partial

import numpy as np

import topk_cli as st


def _seconds(fn: Callable[[], object], *, repeats: int, min_time: float = 0.02) -> float:
    """Median seconds per call, each repeat looping enough calls to last ``min_time``."""
    fn()  # warm-up
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            break
        calls *= 2
    samples = [elapsed / calls]
    for _ in range(repeats - 1):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _peak_ratio(fn: Callable[[], object], nbytes: int) -> float:
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / nbytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller grid and fewer repeats")
    parser.add_argument("--methods", default=",".join(st.METHODS), help="comma-separated method names")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 7
    grid = [(1024, 64, 2), (1024, 64, 8), (64, 1024, 32), (8, 10_000, 100)]
    if args.quick:
        grid = [(256, 64, 2), (16, 1024, 32)]
    methods = [m for m in args.methods.split(",") if m]
    rng = np.random.default_rng(0)
    print(f"numpy {np.__version__}; times are medians of {repeats} repeats; ratio = operator / baseline")
    print()
    print("| B x n | k | method | forward ms | / softmax | / sort | vjp / forward | peak mem / input |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch, n, k in grid:
        x = rng.standard_normal((batch, n))
        v = rng.standard_normal((batch, n))
        t_softmax = _seconds(partial(_softmax, x), repeats=repeats)
        t_sort = _seconds(partial(np.sort, x, axis=-1), repeats=repeats)
        print(f"| {batch} x {n} | {k} | (softmax) | {t_softmax * 1e3:.3f} | 1 | {t_softmax / t_sort:.2f} | | |")
        print(f"| {batch} x {n} | {k} | (np.sort) | {t_sort * 1e3:.3f} | {t_sort / t_softmax:.2f} | 1 | | |")
        for method in methods:
            if method == "grad-recursive":
                status = st.evaluate(x, k, method)
                if not status.ok:
                    print(f"| {batch} x {n} | {k} | {method} | fails on {len(status.failures)} rows | | | | |")
                    continue
            forward = partial(st.soft_topk, x, k, method)
            t_fwd = _seconds(forward, repeats=repeats)
            t_vjp = _seconds(partial(st.vjp, x, k, v, method), repeats=repeats)
            mem = _peak_ratio(forward, x.nbytes)
            print(
                f"| {batch} x {n} | {k} | {method} | {t_fwd * 1e3:.3f} | {t_fwd / t_softmax:.1f} | "
                f"{t_fwd / t_sort:.1f} | {t_vjp / t_fwd:.2f} | {mem:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
