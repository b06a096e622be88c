"""Fuzz the input readers through the CLI: files written by pandas, numpy and json, then mutated.

Every case is a random table written the way users' tools write it (``df.to_csv`` with or without
index/header, ``;`` + decimal comma, tabs, a BOM, ``df.to_json`` in every orient, JSON Lines,
``np.save``), sometimes with NaN cells, an id column, a text column, or a byte-level mutation.
Each is run as ``softtopk compute -m hard -k 1 --format csv FILE`` in-process (``CliRunner``) and
classified:

- traceback: an exception other than ``SystemExit`` escaped the CLI;
- wrong exit code: not 0/2, or 0 for a file with NaN (must be refused), or stderr not one line
  on exit 2;
- silent misread: exit 0 but the values read differ from the table written (checked from the
  tidy CSV output), for the unmutated cases whose layout is unambiguous.

Run against any checkout (``PYTHONPATH=/path/to/checkout python benchmarks/fuzz_inputs.py``);
prints one JSON line of counts. ``--cases N`` (default 2000), ``--seed S``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from topk_cli.cli import app

counts_ambiguous = [0]


def make_case(rng: np.random.Generator, folder: Path, i: int) -> tuple[Path, np.ndarray | None, bool]:
    """A file, the matrix it holds (None when unknown), and whether it holds a NaN."""
    rows = int(rng.integers(1, 6))
    cols = int(rng.integers(1, 6))
    values = np.round(rng.normal(size=(rows, cols)) * 10.0 ** int(rng.integers(-3, 4)), int(rng.integers(1, 6)))
    if rng.random() < 0.15:
        values = np.round(values)
    names = [f"c{j}" for j in range(cols)] if rng.random() < 0.7 else list(range(cols))
    df = pd.DataFrame(values.copy(), columns=names)
    nan = False
    if rng.random() < 0.1:
        df.iloc[int(rng.integers(rows)), int(rng.integers(cols))] = np.nan
        nan = True
    extra = rng.random()
    if extra < 0.1:
        df.insert(0, "label", [f"r{j}" for j in range(rows)])
    elif extra < 0.15:
        df.index.name = "sample"
    expected: np.ndarray | None = values.copy()
    # a single numeric column is one vector (entries = the rows)
    if cols == 1:
        expected = values.reshape(1, -1)
    kind = int(rng.integers(0, 9))
    path = folder / f"case{i}"
    if kind == 0:
        path = path.with_suffix(".csv")
        df.to_csv(path)
    elif kind == 1:
        path = path.with_suffix(".csv")
        df.to_csv(path, index=False)
    elif kind == 2:
        path = path.with_suffix(".csv")
        df.to_csv(path, header=False)
        if extra < 0.1:
            expected = None  # label column without header: layout depends on the labels
    elif kind == 3:
        path = path.with_suffix(".csv")
        df.to_csv(path, sep=";", decimal=",", index=False)
    elif kind == 4:
        path = path.with_suffix(".tsv")
        df.to_csv(path, sep="\t", index=False)
    elif kind == 5:
        path = path.with_suffix(".csv")
        path.write_bytes(b"\xef\xbb\xbf" + df.to_csv(index=False, header=bool(rng.random() < 0.5)).encode())
    elif kind == 6:
        path = path.with_suffix(".json")
        df.to_json(path, orient=str(rng.choice(["records", "columns", "split", "values"])))
    elif kind == 7:
        path = path.with_suffix(".jsonl")
        df.to_json(path, orient="records", lines=True)
    else:
        path = path.with_suffix(".npy")
        saved = df[names].to_numpy(dtype=np.float64)
        np.save(path, saved if cols > 1 else saved[:, 0])
    if (kind == 2 and rows == 1) or (kind in (1, 4, 5) and cols == 1 and names == [0]):
        expected = None  # ambiguous by construction: '0,3.2,1.5' or a first line '0' can be data
        counts_ambiguous[0] += 1
    if rng.random() < 0.25:  # byte-level mutation: no oracle, only "no traceback, right exit code"
        data = bytearray(path.read_bytes())
        for _ in range(int(rng.integers(1, 4))):
            if not data:
                break
            op = rng.random()
            pos = int(rng.integers(len(data)))
            if op < 0.3:
                del data[pos]
            elif op < 0.6:
                data.insert(pos, int(rng.choice(list(b',;\t"\n[]{}:-e.0123456789 xN\x00\xff'))))
            else:
                data[pos] = int(rng.integers(256))
        if rng.random() < 0.05:
            data += b"1" + b"0" * 400 + b"\n"
        path.write_bytes(bytes(data))
        return path, None, False  # mutated: no oracle (the NaN may be gone)
    return path, expected, nan


def values_from_csv(text: str) -> np.ndarray:
    frame = pd.read_csv(io.StringIO(text))
    frame = frame[frame["method"] == "hard"]
    rows = int(frame["row"].max()) + 1
    n = int(frame["entry"].max()) + 1
    out = np.full((rows, n), np.nan)
    out[frame["row"].to_numpy(), frame["entry"].to_numpy()] = frame["value"].to_numpy(dtype=float)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    runner = CliRunner()
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i in range(args.cases):
            path, expected, nan = make_case(rng, folder, i)
            result = runner.invoke(app, ["compute", "-m", "hard", "-k", "1", "--format", "csv", str(path)])
            counts["cases"] += 1
            problem = None
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                problem = "tracebacks"
            elif result.exit_code not in (0, 2) or (result.exit_code == 2 and result.stderr.count("\n") != 1):
                problem = "wrong_exit_codes"
            elif result.exit_code == 0 and nan:
                problem = "silent_misreads"
            elif result.exit_code == 0 and expected is not None:
                got = values_from_csv(result.stdout)
                if got.shape != expected.shape or not np.array_equal(got, expected):
                    problem = "silent_misreads"
            elif result.exit_code == 2 and expected is not None and not nan:
                counts["refused_valid"] += 1
                examples.setdefault("refused_valid", f"{path.name}: {result.stderr.strip()[:160]}")
            if problem:
                counts[problem] += 1
                detail = repr(result.exception) if problem == "tracebacks" else result.stderr.strip()[:160]
                examples.setdefault(problem, f"{path.name}: {detail}")
            os.unlink(path)
    for key in ("tracebacks", "wrong_exit_codes", "silent_misreads", "refused_valid"):
        counts.setdefault(key, 0)
    counts["ambiguous_unchecked"] = counts_ambiguous[0]
    print(json.dumps({**counts, "examples": examples}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
