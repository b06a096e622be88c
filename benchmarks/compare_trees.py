"""Forward / np.exp, VJP / forward and peak memory of some methods in two source trees, alternated.

Usage:
    git archive <old-commit> topk_cli | tar -x -C /tmp/old      # the baseline tree
    python benchmarks/compare_trees.py --old /tmp/old --new . -m thre-clip -m thre-cube \\
        --shape 1000x1000x10 --shape 1x1000000x1000 --tau 0.1 --pairs 3

Each measurement is one ``softtopk bench --format json`` subprocess with ``PYTHONPATH`` set to one
tree, so its ratios are to ``np.exp`` measured in that same process; old and new runs alternate
(``--pairs`` times per shape), which keeps a loaded machine's drift out of the comparison. Prints a
Markdown table of the medians and the range over the pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def _run(tree: str, method: list[str], batch: int, n: int, k: int, tau: float, repeats: int,
         memory: bool) -> list[dict[str, object]]:
    cmd = [sys.executable, "-m", "topk_cli", "bench", "-B", str(batch), "-n", str(n), "-k", str(k),
           "--tau", repr(tau), "--repeats", str(repeats), "--format", "json",
           "--memory" if memory else "--no-memory"]
    for m in method:
        cmd += ["-m", m]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    # cwd: ``python -m`` puts the working directory first on sys.path
    out = subprocess.run(cmd, env=env, cwd=os.path.abspath(tree), capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)["results"]


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.3g}" if len(values) == 1 else f"{med:.3g} ({min(values):.3g}-{max(values):.3g})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--old", required=True, help="baseline source tree (holds topk_cli/)")
    parser.add_argument("--new", default=".", help="source tree under test")
    parser.add_argument("-m", "--method", action="append", required=True)
    parser.add_argument("--shape", action="append", default=None, help="BxNxK (repeatable)")
    parser.add_argument("--tau", type=float, default=0.1)
    parser.add_argument("--pairs", type=int, default=3, help="old/new alternations per shape")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args(argv)
    shapes = args.shape or ["1000x1000x10", "1x1000000x1000"]
    print("| shape | method | tree | forward / exp | VJP / forward | peak fwd MiB | peak VJP MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in shapes:
        batch, n, k = (int(v) for v in shape.split("x"))
        got: dict[tuple[str, str], list[dict[str, object]]] = {}
        for _ in range(args.pairs):
            for label, tree in (("old", args.old), ("new", args.new)):
                for r in _run(tree, args.method, batch, n, k, args.tau, args.repeats, not args.no_memory):
                    got.setdefault((str(r["method"]), label), []).append(r)
        for method in args.method:
            for label in ("old", "new"):
                rs = got.get((method, label), [])

                def col(key: str, rs: list[dict[str, object]] = rs) -> str:
                    return _fmt([float(v) for r in rs if (v := r.get(key)) is not None])  # type: ignore[arg-type]

                print(f"| {shape} | {method} | {label} | {col('forward_vs_exp')} | {col('vjp_vs_forward')} | "
                      f"{col('peak_forward_mib')} | {col('peak_vjp_mib')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
