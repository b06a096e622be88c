"""Peak memory and time of one forward call (or VJP) on one random row (the large shapes of the Speed section).

Usage (from the source tree to measure; ``--no-trace`` for the resident set alone):
    /usr/bin/time -v python benchmarks/peak_memory.py perturbed -n 1000000 -k 1000 --tau 0.1 --no-trace
    python benchmarks/peak_memory.py iterative -n 100000 -k 300 --tau 1
    /usr/bin/time -v python benchmarks/peak_memory.py perturbed -n 1000000 -k 1000 --vjp --no-trace

Prints the status, the wall time and the tracemalloc peak (numpy's buffers; tracing slows numpy's
allocations a little). ``/usr/bin/time -v`` reports the maximum resident set size of the process.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

import topk_cli as st


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("method")
    parser.add_argument("-n", type=int, default=100_000)
    parser.add_argument("-k", type=int, default=300)
    parser.add_argument("--tau", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-trace", action="store_true", help="do not run tracemalloc")
    parser.add_argument("--vjp", action="store_true", help="time st.vjp (forward included) with a random v")
    args = parser.parse_args(argv)
    x = np.random.default_rng(args.seed).standard_normal((1, args.n))
    if not args.no_trace:
        tracemalloc.start()
    start = time.perf_counter()
    if args.vjp:
        v = np.random.default_rng(args.seed + 1).standard_normal((1, args.n))
        summary = f"vjp sum {float(st.vjp(x, args.k, v, args.method, tau=args.tau).sum()):.12g}"
    else:
        res = st.evaluate(x, args.k, args.method, tau=args.tau)
        summary = f"status {res.status[0]}, sum {float(res.weights.sum()):.12g}"
    elapsed = time.perf_counter() - start
    peak = "" if args.no_trace else f", tracemalloc peak {tracemalloc.get_traced_memory()[1] / 2**20:.1f} MiB"
    print(f"{args.method} n={args.n} k={args.k} tau={args.tau}: {summary}, {elapsed:.2f} s{peak}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
