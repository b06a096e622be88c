"""Time ``grad`` in the array-API core on numpy arrays against the numpy engine, same run, and
print its accuracy against the engine (float64 and float32, ``p`` and the VJPs).

    PYTHONPATH=. python benchmarks/xp_grad.py [B] [n] [k] [repeats]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from topk_cli import api
from topk_cli.xp import backward, forward


def main() -> None:
    b, n, k, reps = (int(a) for a in (sys.argv[1:] + ["1000", "1000", "10", "3"][len(sys.argv) - 1:])[:4])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, n))
    g = rng.standard_normal((b, n))
    kk, tt = np.full(b, float(k)), np.ones(b)
    rows = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ref_p = api.soft_topk(x, k, "grad")
        t1 = time.perf_counter()
        p, res = forward(x, kk, tt, "grad", k_static=k)
        t2 = time.perf_counter()
        ref_x, ref_tau = api.vjp(x, k, g, "grad", wrt=("x", "tau"))
        t3 = time.perf_counter()
        p, res = forward(x, kk, tt, "grad", k_static=k)
        gx, _, gtau = backward("grad", res, g)
        t4 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        print(f"engine fwd {t1 - t0:7.3f} s  xp fwd {t2 - t1:7.3f} s  ({(t2 - t1) / (t1 - t0):5.2f}x)   "
              f"engine fwd+vjp {t3 - t2:7.3f} s  xp fwd+bwd {t4 - t3:7.3f} s  ({(t4 - t3) / (t3 - t2):5.2f}x)",
              flush=True)
    best = [min(r[i] for r in rows) for i in range(4)]
    print(f"B={b} n={n} k={k}: best of {reps}: forward xp/engine {best[1] / best[0]:.2f}x, "
          f"forward+vjp xp/engine {best[3] / best[2]:.2f}x")
    scale = max(np.abs(ref_x).max(), np.abs(ref_tau).max())
    print(f"float64 |dp| {np.abs(p - ref_p).max():.2e}  |dg_x|/scale {np.abs(gx - ref_x).max() / scale:.2e}  "
          f"|dg_tau|/scale {np.abs(gtau - ref_tau).max() / scale:.2e}")
    x32, g32 = x.astype(np.float32), g.astype(np.float32)
    p32, res32 = forward(x32, kk.astype(np.float32), tt.astype(np.float32), "grad", k_static=k)
    gx32, _, gtau32 = backward("grad", res32, g32)
    x64, g64 = x32.astype(np.float64), g32.astype(np.float64)
    rp = api.soft_topk(x64, k, "grad")
    rx, rtau = api.vjp(x64, k, g64, "grad", wrt=("x", "tau"))
    scale = max(np.abs(rx).max(), np.abs(rtau).max())
    print(f"float32 |dp| {np.abs(p32 - rp).max():.2e}  |dg_x|/scale {np.abs(gx32 - rx).max() / scale:.2e}  "
          f"|dg_tau|/scale {np.abs(gtau32 - rtau).max() / scale:.2e}")


if __name__ == "__main__":
    main()
