"""Wall-clock time of ``softtopk compute`` on wide and long CSV files, as a ratio to pandas.read_csv.

For each shape the file is written once, then timed (best of ``--repeat``): the whole command
(``python -m topk_cli compute -m hard -k 1 --format csv -o /dev/null FILE``, a fresh process) and
``pandas.read_csv(FILE)`` in a fresh process (import included, as a user would run it).
Usage: ``python benchmarks/read_speed.py [--repeat 3] [--shapes 3x20000,100000x64,1x1000000]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def best(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shapes", default="3x20000,100000x64,1x1000000")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.shapes.split(","):
            rows, cols = map(int, spec.split("x"))
            path = Path(tmp) / f"{spec}.csv"
            header = ",".join(f"c{i}" for i in range(cols))
            np.savetxt(path, rng.normal(size=(rows, cols)), delimiter=",", header=header, comments="", fmt="%.6g")
            ours = best([sys.executable, "-m", "topk_cli", "compute", "-m", "hard", "-k", "1", "--format", "csv",
                         "-o", "/dev/null", str(path)], args.repeat)
            pandas = best([sys.executable, "-c", f"import pandas; pandas.read_csv({str(path)!r})"], args.repeat)
            print(f"{spec}: softtopk compute {ours:.2f} s, pandas.read_csv {pandas:.2f} s, ratio {ours / pandas:.2f}")


if __name__ == "__main__":
    main()
