"""softtopk verify-properties through the CLI: formats, --strict, inputs, errors."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import CliResult, run_cli

from topk_cli.properties import K_PROPERTIES, PROPERTIES, takes_real_k

SAMPLES = Path(__file__).resolve().parent.parent / "sample_inputs"
def run(*args: str) -> CliResult:
    return run_cli("verify-properties", *args)


def test_json_has_the_spec_shape() -> None:
    r = run("-m", "hard", "-m", "thre-laplace", "--trials", "1", "--format", "json")
    assert r.code == 0, r.output
    doc = json.loads(r.out)
    assert [x["property"] for x in doc["results"][: len(PROPERTIES)]] == list(PROPERTIES)
    for row in doc["results"]:
        assert {"method", "property", "expected", "holds", "worst", "counterexample"} <= set(row)
    smooth = {x["method"]: x for x in doc["results"] if x["property"] == "smooth"}
    assert smooth["hard"]["holds"] is False and smooth["hard"]["smoothness"] == "discontinuous"
    assert smooth["thre-laplace"]["smoothness"] == "C1"
    k1 = next(x for x in doc["results"] if x["method"] == "thre-laplace" and x["property"] == "softmax-at-k1")
    assert k1["holds"] is False and k1["counterexample"]["command"].startswith("softtopk compute -m thre-laplace -k 1")


def test_table_and_csv() -> None:
    r = run("-m", "thre-exp", "--trials", "1")
    assert r.code == 0
    assert "monotone-strict" in r.out and "softtopk compute -m thre-exp" in r.out
    r = run("-m", "thre-exp", "--trials", "1", "--format", "csv")
    lines = r.out.strip().splitlines()
    in_k = len(K_PROPERTIES) if takes_real_k("thre-exp") else 0  # monotone-k, continuous-k: real-k methods
    assert lines[0].startswith("method,property,expected,holds") and len(lines) == 1 + len(PROPERTIES) + in_k


def test_strict_exits_1_only_when_a_claim_fails() -> None:
    assert run("-m", "grad", "--trials", "1", "--strict").code == 0
    import dataclasses

    from topk_cli.registry import METHODS

    spec = METHODS["thre-exp"]
    honest = spec.guarantees
    object.__setattr__(spec, "guarantees", dataclasses.replace(honest, monotone_strict=True))  # a false claim
    try:
        r = run("-m", "thre-exp", "--trials", "1", "--strict")
        lenient = run("-m", "thre-exp", "--trials", "1")
    finally:
        object.__setattr__(spec, "guarantees", honest)
    assert r.code == 1 and lenient.code == 0
    assert "thre-exp claims monotone-strict" in r.err


def test_user_input_file_and_values() -> None:
    r = run(str(SAMPLES / "ties.csv"), "-m", "hard", "--format", "json")
    assert r.code == 0, r.output
    assert json.loads(r.out)["source"] == "input"
    r = run("--values", "3,1,2", "-k", "1", "-m", "thre-sigmoid", "--format", "json")
    doc = json.loads(r.out)
    assert doc["cases"] == 1 and doc["k"] == 1


def test_usage_errors_exit_2() -> None:
    for args in (["--trials", "0"], ["-m", "nope"], ["--values", "1,2", "-k", "5"], ["-k", "0"]):
        r = run(*args)
        assert r.code == 2, (args, r.output)
        assert r.err.startswith("softtopk: error:")


def test_negative_seed_is_a_usage_error_not_a_traceback() -> None:
    r = run("-m", "grad", "--seed", "-1", "--trials", "1")
    assert r.code == 2 and "seed must be an integer >= 0" in r.err and "Traceback" not in r.err
