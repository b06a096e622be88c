"""softtopk bench: the measurement module and the command (keys and exit codes, no timings)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import CliResult, run_cli

from topk_cli.analysis.bench import bench, peak_bytes, random_scores, seconds_per_call
from topk_cli.errors import InvalidArgumentError
from topk_cli.render.bench import CSV_COLUMNS, RESULT_KEYS

SAMPLES = Path(__file__).resolve().parent.parent / "sample_inputs"
FAST = ["--repeats", "1", "--no-memory"]


def run(*args: str) -> CliResult:
    return run_cli("bench", *args)


def test_json_has_the_documented_keys() -> None:
    r = run("-B", "3", "-n", "6", "-k", "2", "-m", "thre-laplace", "-m", "grad", "--repeats", "1", "--format", "json")
    assert r.code == 0, r.output
    doc = json.loads(r.out)
    assert {"batch", "n", "k", "tau", "dtype", "repeats", "seed", "source", "memory_method", "baselines",
            "results"} <= set(doc)
    assert (doc["batch"], doc["n"], doc["k"], doc["dtype"], doc["memory_method"]) == (3, 6, 2, "float64", "tracemalloc")
    assert set(doc["baselines"]) == {"exp_ms", "sort_ms", "partition_ms"}
    assert [res["method"] for res in doc["results"]] == ["thre-laplace", "grad"]
    for res in doc["results"]:
        assert set(res) == set(RESULT_KEYS)
        assert res["status"] == "ok" and res["failed_rows"] == 0
        assert res["forward_ms"] > 0 and res["vjp_ms"] > 0 and res["peak_forward_mib"] > 0
        assert res["forward_vs_exp"] == pytest.approx(res["forward_ms"] / doc["baselines"]["exp_ms"])


def test_csv_is_tidy_and_table_is_plain_text() -> None:
    r = run("-B", "2", "-n", "5", "-k", "1", "-m", "hard,thre-exp", "--dtype", "float32", *FAST, "--format", "csv")
    assert r.code == 0, r.output
    lines = r.out.strip().splitlines()
    assert lines[0].split(",") == list(CSV_COLUMNS) and len(lines) == 3
    assert ",float32," in lines[1]
    r = run("-B", "2", "-n", "5", "-k", "1", "-m", "thre-sigmoid", *FAST)
    assert r.code == 0 and "thre-sigmoid" in r.out and "\x1b[" not in r.out


def test_input_file_and_failing_rows() -> None:
    r = run(str(SAMPLES / "wide_spread.csv"), "-k", "2", "-m", "grad-recursive", "-m", "grad", *FAST, "--format", "json")
    assert r.code == 0, r.output
    doc = json.loads(r.out)
    rec, exact = doc["results"]
    assert rec["failed_rows"] == 1 and rec["vjp_ms"] is None and "VJP not timed" in rec["status"]
    assert exact["status"] == "ok" and doc["source"].endswith("wide_spread.csv")


@pytest.mark.parametrize(
    "args", [("-B", "0", "-n", "3", "-k", "1"), ("-n", "3", "-k", "4"), ("-n", "3", "-k", "1", "--dtype", "int8"),
             ("-n", "3", "-k", "1", "-m", "nope"), ("-n", "3", "-k", "1", "--repeats", "0")]
)
def test_bad_arguments_exit_2_with_one_line(args: tuple[str, ...]) -> None:
    r = run(*args)
    assert r.code == 2
    assert r.err.startswith("softtopk: error:") and r.err.count("\n") == 1


def test_library_helpers() -> None:
    x = random_scores(2, 4, seed=1, dtype="float32")
    assert x.dtype == np.float32 and np.array_equal(x, random_scores(2, 4, seed=1, dtype="float32"))
    calls = []
    assert seconds_per_call(lambda: calls.append(1), repeats=3, min_time=0.0) >= 0 and len(calls) == 3
    assert peak_bytes(lambda: np.ones(1 << 20)) >= 8 << 20
    report = bench(x, 2, ["hard"], repeats=1, min_time=0.0, with_vjp=False, memory=False)
    assert report.results[0].vjp_ms is None and report.results[0].peak_forward_bytes is None
    with pytest.raises(InvalidArgumentError, match="shape"):
        bench(x[0], 2, ["hard"])


def test_interleaved_seconds_takes_the_repeats_in_turn() -> None:
    """One repeat of each function per round (calibrated first), medians per function: a drift
    of the clock during the measurement falls on every function alike."""
    from topk_cli.analysis.bench import interleaved_seconds

    now = [0.0]
    calls: list[str] = []

    def clock() -> float:
        return now[0]

    def make(name: str, cost: float) -> Callable[[], None]:
        def fn() -> None:
            calls.append(name)
            now[0] += cost * (1 + len(calls) / 1000)  # a slow drift: later calls cost more

        return fn

    out = interleaved_seconds([make("a", 0.05), make("b", 0.1)], repeats=3, min_time=0.02, clock=clock)
    # a warm-up call each (both above min_time: one call per repeat), then a, b, a, b, a, b
    assert calls == ["a", "b", "a", "b", "a", "b", "a", "b"]
    assert out[0] == pytest.approx(0.05 * (1 + 5 / 1000)) and out[1] == pytest.approx(0.1 * (1 + 6 / 1000))
