"""The sparse projection beside a peer library in one process: softtopk's ``thre-clip`` (the Euclidean
projection onto the capped simplex) and entmax's ``budget_bisect`` (the same map, by 50 bisections,
PyTorch on the CPU, float64, one thread), as ratios to ``np.exp`` on the same array.

Neither torch nor entmax is a dependency of softtopk; run it from a separate environment:

    python -m venv /tmp/peers && /tmp/peers/bin/pip install torch entmax numpy
    PYTHONPATH=. /tmp/peers/bin/python benchmarks/peers.py
"""

import entmax
import numpy as np
import torch
from k_rows import best  # this folder is on sys.path when the script runs

import topk_cli as st

torch.set_num_threads(1)


def run(b: int, n: int, k: int, rng: np.random.Generator) -> str:
    x = rng.normal(size=(b, n))
    tau = 0.1
    xt = torch.tensor(x / tau, dtype=torch.float64)
    v = np.ones_like(x)
    e = best(lambda: np.exp(x))
    clip = best(lambda: st.evaluate(x, k, "thre-clip", tau=tau))
    clipv = best(lambda: st.vjp(x, k, v, "thre-clip", tau=tau))
    ent = best(lambda: entmax.budget_bisect(xt, budget=k))

    def ent_fb():
        xx = xt.clone().requires_grad_(True)
        entmax.budget_bisect(xx, budget=k).backward(torch.ones_like(xx))

    entv = best(ent_fb)
    diff = float(np.max(np.abs(entmax.budget_bisect(xt, budget=k).numpy() - st.soft_topk(x, k, "thre-clip", tau=tau))))
    return (f"{b}x{n} k={k}: np.exp {e * 1e3:.1f} ms | thre-clip forward {clip / e:.1f}x, forward+VJP {clipv / e:.1f}x"
            f" | entmax budget_bisect forward {ent / e:.1f}x, forward+backward {entv / e:.1f}x | max |p diff| {diff:.1e}")


def main() -> None:
    rng = np.random.default_rng(0)
    for b, n, k in [(1000, 1000, 10), (1, 1000000, 1000)]:
        print(run(b, n, k, rng))


if __name__ == "__main__":
    main()
