"""Time the array-API core on numpy arrays against the numpy engine (forward + VJP), same run.

    PYTHONPATH=. python benchmarks/xp_core.py [B] [n] [k] [repeats]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from topk_cli import api
from topk_cli.xp import DROPIN_METHODS, REAL_K_METHODS, backward, forward


def main() -> None:
    b, n, k, reps = (int(a) for a in (sys.argv[1:] + ["1000", "1000", "10", "3"][len(sys.argv) - 1:])[:4])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, n))
    g = rng.standard_normal((b, n))
    kk, tt = np.full(b, float(k)), np.ones(b)
    for method in DROPIN_METHODS:
        ratios = []
        for _ in range(reps):
            t0 = time.perf_counter()
            api.soft_topk(x, k, method)
            t1 = time.perf_counter()
            forward(x, kk, tt, method, k_static=k)
            t2 = time.perf_counter()
            ratios.append((t2 - t1) / (t1 - t0))
        vr = []
        for _ in range(reps):
            t0 = time.perf_counter()
            api.vjp(x, k, g, method, wrt=("x", "k", "tau") if method in REAL_K_METHODS else ("x", "tau"))
            t1 = time.perf_counter()
            backward(method, forward(x, kk, tt, method, k_static=k)[1], g)
            t2 = time.perf_counter()
            vr.append((t2 - t1) / (t1 - t0))
        print(f"{method:13s} forward xp/engine {min(ratios):6.2f}x (last engine {1e3 * (t1 - t0):.0f} ms)"
              f"  forward+vjp xp/engine {min(vr):6.2f}x")


if __name__ == "__main__":
    main()
