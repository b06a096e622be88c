"""The cost of a k per row against one scalar k, per method, in one run.

For each shape and method: the forward pass (``st.evaluate``) and the VJP with a scalar k, with a
k per row (integers around k for the integer-only methods, reals around k for the others), and
the VJP with respect to x, k and tau at once (``wrt=("x", "k", "tau")``) against the VJP with
respect to x alone. Each figure is the best of ``--repeats`` timings (interleaved, so that a load
on the machine affects both sides alike); the ratios are what to read.

    python benchmarks/k_rows.py                       # the default shapes, every method
    python benchmarks/k_rows.py -m thre-exp --shape 1000x1000x10 --repeats 7
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import topk_cli as st

SHAPES = ("1000x1000x10", "1000x1000x100", "16384x64x2")


def best(fn: Callable[[], Any], repeats: int = 7) -> float:
    """The shortest of `repeats` timed calls of `fn`, in seconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def timings(x: np.ndarray, v: np.ndarray, k: int, kr: np.ndarray, name: str, tau: float,
            wrt: tuple[str, ...], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each variant, ``repeats`` rounds interleaved (a load affects all alike)."""
    calls: dict[str, Callable[[], Any]] = {
        "fwd": lambda: st.evaluate(x, k, name, tau=tau),
        "fwd_rows": lambda: st.evaluate(x, kr, name, tau=tau),
        "vjp": lambda: st.vjp(x, k, v, name, tau=tau),
        "vjp_rows": lambda: st.vjp(x, kr, v, name, tau=tau),
        "vjp_all": lambda: st.vjp(x, kr, v, name, tau=tau, wrt=wrt),
    }
    out: dict[str, list[float]] = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            out[key].append(best(fn, 1))
    return out


def per_row_k(name: str, b: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if st.METHODS[name].capabilities.integer_k:  # integers k - 1, k, k + 1 (at least 1)
        return np.maximum(1, k + rng.integers(-1, 2, size=b)).astype(np.float64)
    return np.maximum(0.5, k + rng.uniform(-0.5, 0.5, size=b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--method", action="append", help="method (repeatable; default: every fast method)")
    ap.add_argument("--shape", action="append", help="BxNxK (repeatable)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tau", type=float, default=0.1)
    args = ap.parse_args()
    methods = args.method or [
        m for m in st.METHODS if m not in ("iterative", "weighted-softmax", "grad-recursive", "perturbed")
    ]
    rng = np.random.default_rng(0)
    print(f"{'shape':>15} {'method':>13} {'fwd ms':>8} {'row-k fwd':>9} {'vjp ms':>8} {'row-k vjp':>9} {'x,k,tau/x':>9}")
    for shape in args.shape or SHAPES:
        b, n, k = (int(v) for v in shape.split("x"))
        x = rng.normal(size=(b, n))
        v = rng.normal(size=(b, n))
        for name in methods:
            kr = per_row_k(name, b, k, rng)
            wrt: tuple[str, ...] = ("x", "tau") if st.METHODS[name].capabilities.integer_k else ("x", "k", "tau")
            t = timings(x, v, k, kr, name, args.tau, wrt, args.repeats)
            m = {key: min(val) for key, val in t.items()}
            label = "x,k,tau/x" if "k" in wrt else "x,tau/x"
            print(f"{shape:>15} {name:>13} {m['fwd'] * 1e3:8.2f} {m['fwd_rows'] / m['fwd']:8.2f}x "
                  f"{m['vjp'] * 1e3:8.2f} {m['vjp_rows'] / m['vjp']:8.2f}x {m['vjp_all'] / m['vjp_rows']:8.2f}x"
                  + ("" if "k" in wrt else f"  ({label})"))


if __name__ == "__main__":
    main()
