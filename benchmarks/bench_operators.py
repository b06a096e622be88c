"""The speed and memory benchmark suite: ``softtopk bench`` over the workloads users have.

Usage:
    python benchmarks/bench_operators.py            # full suite (a few minutes on 2 idle cores)
    python benchmarks/bench_operators.py --quick    # smaller shapes, fewer repeats

Workloads: batch 1000 x 1000 at k = 10 and 100; a router batch 16,384 x 64 at k = 2; one vector
n = 10^6 at k = 1,000 (``grad`` only with --big: about a minute); float32 and float64; forward,
VJP and peak memory (tracemalloc); scaling of the forward time with n (10^2..10^6) and with k
(1..n/2). Every time is a ratio to ``np.exp`` on the same array in the same run (see
``topk_cli.analysis.bench``), printed as Markdown tables.
"""

from __future__ import annotations

import argparse

import numpy as np

from topk_cli.analysis.bench import BenchReport, bench, random_scores
from topk_cli.registry import METHODS

FAST = ["hard", "thre-exp", "thre-laplace", "thre-sigmoid", "grad"]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(report: BenchReport) -> list[str]:
    b = report.baselines
    lines = [
        f"**{report.batch} x {report.n}, k = {report.k}, {report.dtype}** (np.exp {b.exp_ms:.2f} ms, "
        f"np.sort {b.sort_ms:.2f} ms)",
        "",
        "| method | forward / exp | forward ms | VJP / forward | peak fwd MiB | peak VJP MiB | status |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report.results:
        mib = [None if v is None else v / 2**20 for v in (r.peak_forward_bytes, r.peak_vjp_bytes)]
        lines.append(
            f"| {r.method} | {_fmt(r.forward_vs_exp)} | {_fmt(r.forward_ms, 2)} | {_fmt(r.vjp_vs_forward, 2)} | "
            f"{_fmt(mib[0])} | {_fmt(mib[1])} | {r.status} |"
        )
    return [*lines, ""]


def _scaling(methods: list[str], ns: list[int], ks: list[int], n_for_k: int, repeats: int) -> list[str]:
    lines = ["**Forward time / np.exp, k = 10, one row of n entries**", "",
             "| method | " + " | ".join(f"n={n}" for n in ns) + " |", "|---" * (len(ns) + 1) + "|"]
    rows = {m: [] for m in methods}
    for n in ns:
        x = random_scores(1, n, seed=0)
        rep = bench(x, min(10, n), methods, repeats=repeats, with_vjp=False, memory=False)
        for r in rep.results:
            rows[r.method].append(_fmt(r.forward_vs_exp))
    lines += [f"| {m} | " + " | ".join(v) + " |" for m, v in rows.items()]
    lines += ["", f"**Forward ms, one row of n = {n_for_k}, by k** (threshold methods: flat beyond the "
              "partial sort; grad: O(n min(k, n-k)))", "",
              "| method | " + " | ".join(f"k={k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    rows = {m: [] for m in methods}
    x = random_scores(1, n_for_k, seed=0)
    for k in ks:
        rep = bench(x, k, methods, repeats=repeats, with_vjp=False, memory=False)
        for r in rep.results:
            rows[r.method].append(_fmt(r.forward_ms, 2))
    lines += [f"| {m} | " + " | ".join(v) + " |" for m, v in rows.items()]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes and fewer repeats")
    parser.add_argument("--big", action="store_true", help="also grad on one vector n = 10^6, k = 1,000")
    parser.add_argument("--methods", default=",".join(FAST), help="comma-separated methods ('all': every one)")
    args = parser.parse_args(argv)
    methods = list(METHODS) if args.methods == "all" else [m for m in args.methods.split(",") if m]
    repeats = 3 if args.quick else 5
    scale = 10 if args.quick else 1
    print(f"numpy {np.__version__}; medians of {repeats} repeats; ratios to np.exp on the same array\n")
    workloads = [(1000 // scale, 1000, 10), (1000 // scale, 1000, 100), (16384 // scale, 64, 2)]
    out: list[str] = []
    for dtype in ("float64", "float32"):
        for batch, n, k in workloads:
            x = random_scores(batch, n, seed=0, dtype=dtype)
            out += _table(bench(x, k, methods, repeats=repeats))
    big_n = 10**5 if args.quick else 10**6
    x = random_scores(1, big_n, seed=0)
    big_methods = [m for m in methods if m != "grad" or args.big]
    out += _table(bench(x, 1000, big_methods, repeats=1 if args.quick else 3))
    ns = [100, 1000, 10_000, 100_000] + ([] if args.quick else [1_000_000])
    n_k = 1000 if args.quick else 10_000
    ks = [1, 10, 100, n_k // 10, n_k // 2]
    out += _scaling(methods, ns, ks, n_k, repeats)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
