"""Time the array-API core against the numpy engine (and the framework's softmax), same run.

    PYTHONPATH=. python benchmarks/xp_core.py [B] [n] [k] [repeats] [--ns numpy,torch] [--dtype float64,float32]
        [--methods m1,m2] [--threads N] [--cpu]

For every method, namespace and dtype: the best of ``repeats`` times of the engine's forward
(``api.soft_topk``, float64: the engine computes in float64), the core's forward, the core's
forward + VJP, and the namespace's softmax over the last axis; printed as milliseconds and as
ratios measured in the same run (the machine may be loaded: the ratios are what to compare).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from topk_cli import api
from topk_cli.xp import DROPIN_METHODS, backward, forward

CLOCK = time.perf_counter


def _time(fn: Callable[..., Any], *args: Any) -> float:
    t0 = CLOCK()
    fn(*args)
    return CLOCK() - t0


def _forward(x: Any, kk: Any, tt: Any, method: str, k: int) -> Any:
    return forward(x, kk, tt, method, k_static=k)


def _fwd_bwd(x: Any, kk: Any, tt: Any, method: str, g: Any, k: int) -> Any:
    return backward(method, forward(x, kk, tt, method, k_static=k)[1], g)


def _convert(ns: str, threads: int | None) -> tuple[Callable[[np.ndarray], Any], Callable[[Any], Any]]:
    """``(to_namespace, softmax)`` for the namespace ``ns``."""
    if ns == "torch":
        import torch

        if threads:
            torch.set_num_threads(threads)
        return torch.from_numpy, lambda a: torch.softmax(a, dim=1)

    def softmax(a: np.ndarray) -> np.ndarray:
        e = np.exp(a - a.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return lambda a: a, softmax


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", type=int, default=[])
    ap.add_argument("--ns", default="numpy")
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--methods", default=",".join(DROPIN_METHODS))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cpu", action="store_true",
                    help="time the process's CPU time (steadier on a loaded machine; single-threaded runs only)")
    args = ap.parse_args()
    global CLOCK
    if args.cpu:
        CLOCK = time.process_time
    b, n, k, reps = (args.sizes + [1000, 1000, 10, 3][len(args.sizes):])[:4]
    rng = np.random.default_rng(0)
    x64 = rng.standard_normal((b, n))
    g64 = rng.standard_normal((b, n))
    print(f"B={b} n={n} k={k} best of {reps}; times in ms; ratios in the same run")
    print(f"{'method':13s} {'ns':6s} {'dtype':8s} {'engine':>7s} {'softmax':>7s} {'fwd':>7s} {'fwd+vjp':>7s}"
          f" {'fwd/eng':>7s} {'fwd/smax':>8s} {'f+b/eng':>7s} {'f+b/fwd':>7s}")
    for ns in args.ns.split(","):
        conv, softmax = _convert(ns, args.threads)
        for dtype in args.dtype.split(","):
            x, g = conv(x64.astype(dtype)), conv(g64.astype(dtype))
            kk, tt = conv(np.full(b, float(k), dtype=dtype)), conv(np.ones(b, dtype=dtype))
            for method in args.methods.split(","):
                t_eng, t_fwd, t_fb, t_sm = (float("inf"),) * 4
                for _ in range(reps):  # interleaved, so that a load change hits every figure alike
                    t_eng = min(t_eng, _time(api.soft_topk, x64, k, method))
                    t_sm = min(t_sm, _time(softmax, x))
                    t_fwd = min(t_fwd, _time(_forward, x, kk, tt, method, k))
                    t_fb = min(t_fb, _time(_fwd_bwd, x, kk, tt, method, g, k))
                print(f"{method:13s} {ns:6s} {dtype:8s} {1e3 * t_eng:7.1f} {1e3 * t_sm:7.1f} {1e3 * t_fwd:7.1f}"
                      f" {1e3 * t_fb:7.1f} {t_fwd / t_eng:7.2f} {t_fwd / t_sm:8.1f} {t_fb / t_eng:7.2f} {t_fb / t_fwd:7.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
