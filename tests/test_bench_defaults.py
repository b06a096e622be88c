"""bench times a Monte-Carlo method at a small sample count by default, and says so.

At its own default (1000 samples) such a method took most of a default ``softtopk bench`` run; its
time grows linearly with the samples, so bench times it at ``MC_SAMPLES`` and records that in every
format (JSON/CSV ``parameters``, a note under the table).
"""

from __future__ import annotations

import json

import numpy as np
from conftest import run_cli

from topk_cli.analysis.bench import MC_SAMPLES, bench, bench_parameters
from topk_cli.registry import METHODS

MC = [name for name, spec in METHODS.items() if spec.capabilities.monte_carlo]


def test_monte_carlo_methods_are_timed_at_fewer_samples_and_the_rest_at_their_defaults() -> None:
    assert MC  # the registry has a Monte-Carlo method to check
    for name, spec in METHODS.items():
        samples = {p.name: p.default for p in spec.parameters}.get("samples")
        if name in MC and samples is not None and samples > MC_SAMPLES:
            assert bench_parameters(name) == {"samples": MC_SAMPLES}
        else:
            assert bench_parameters(name) == {}


def test_the_result_records_its_parameters_and_an_explicit_choice_wins() -> None:
    x = np.random.default_rng(0).standard_normal((3, 6))
    report = bench(x, 2, [MC[0], "grad"], repeats=1, min_time=0.0, memory=False)
    mc, exact = report.results
    assert dict(mc.parameters) == {"samples": MC_SAMPLES} and f"samples = {MC_SAMPLES}" in mc.note and "default" in mc.note
    assert dict(exact.parameters) == {} and exact.note == ""
    chosen = bench(x, 2, [MC[0]], repeats=1, min_time=0.0, memory=False, parameters={MC[0]: {"samples": 8}})
    assert dict(chosen.results[0].parameters) == {"samples": 8}


def test_the_cli_output_states_the_sample_count() -> None:
    args = ("bench", "-B", "4", "-n", "8", "-k", "2", "-m", MC[0], "--repeats", "1", "--no-memory")
    code, out, err = run_cli(*args)
    assert code == 0, err
    assert f"{MC[0]} timed with samples = {MC_SAMPLES}" in " ".join(out.split())
    code, out, err = run_cli(*args, "--format", "json")
    assert code == 0 and [r["parameters"] for r in json.loads(out)["results"]] == [{"samples": MC_SAMPLES}]
