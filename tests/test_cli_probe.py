"""The stability-probe command: formats, exit codes (--strict), errors, -o."""

from __future__ import annotations

import json

from conftest import CliResult, run_cli

SMALL = ["-n", "10", "-k", "2,5", "--scales", "0.1,300", "--trials", "3"]


def _run(args: list[str]) -> CliResult:
    return run_cli("stability-probe", *args)


def test_json_has_the_spec_shape_and_exit_0_without_strict():
    r = _run([*SMALL, "-m", "grad", "-m", "grad-recursive", "--format", "json"])
    assert r.code == 0, r.output
    doc = json.loads(r.out)
    assert {"results", "boundaries"} <= set(doc)
    assert len(doc["results"]) == 2 * 2 * 2
    for row in doc["results"]:
        assert {"method", "n", "k", "scale", "trials", "failures", "kinds", "max_error"} <= set(row)
    rec = [row for row in doc["results"] if row["method"] == "grad-recursive" and row["scale"] == 300.0]
    assert all(row["failures"] == 3 and row["max_error"] is None for row in rec)
    assert all(row["detection"]["broken"] == 3 for row in rec)
    bounds = {(b["method"], b["k"]): b for b in doc["boundaries"]}
    assert bounds[("grad", 2)]["first_failing_scale"] is None
    assert bounds[("grad-recursive", 5)]["first_failing_scale"] == 300.0
    assert bounds[("grad-recursive", 5)]["predicted_scale"] == 300.0
    for b in doc["boundaries"]:
        assert {"method", "n", "k", "first_failing_scale", "predicted_scale"} <= set(b)


def test_strict_exit_codes():
    failing = _run([*SMALL, "-m", "grad-recursive", "--strict", "--format", "csv"])
    assert failing.code == 1
    assert failing.out.startswith("method,n,k,scale,trials,failures,kinds")
    clean = _run([*SMALL, "-m", "grad,thre-sigmoid", "--strict", "--format", "csv"])
    assert clean.code == 0, clean.output
    assert len(clean.out.strip().splitlines()) == 1 + 2 * 2 * 2


def test_table_is_plain_text_when_not_a_terminal():
    r = _run([*SMALL, "-m", "grad-recursive", "-k", "0.5n"])
    assert r.code == 0, r.output
    assert "\x1b[" not in r.out
    assert "grad-recursive: failed trials" in r.out
    assert "Boundaries" in r.out and "k=5" in r.out


def test_output_file_is_written(tmp_path):
    target = tmp_path / "probe.json"
    r = _run([*SMALL, "-m", "thre-exp", "--format", "json", "-o", str(target)])
    assert r.code == 0, r.output
    assert r.out == ""
    assert json.loads(target.read_text())["results"][0]["method"] == "thre-exp"


def test_usage_errors_exit_2_with_one_line():
    for args in (
        ["--scales", "1:0.1:3"],
        ["-k", "0"],
        ["-n", "ten"],
        ["--dist", "cauchy"],
        ["-m", "nope"],
        ["--trials", "0"],
    ):
        r = _run([*SMALL, *args])
        assert r.code == 2, (args, r.output)
        assert r.out == ""
        assert r.err.startswith("softtopk: error:") and r.err.count("\n") == 1
