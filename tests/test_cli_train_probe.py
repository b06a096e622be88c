"""softtopk train-probe through the CLI: formats, exit codes, --strict, --plot, errors."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import CliResult, run_cli

SMALL = ["--task", "select", "--seeds", "2", "--steps", "10", "--no-grad-check"]


def run(*args: str) -> CliResult:
    return run_cli("train-probe", *args)


def test_json_is_one_document_and_nothing_else() -> None:
    r = run(*SMALL, "-m", "thre-laplace", "-m", "hard", "--format", "json")
    assert r.code == 0, r.output
    doc = json.loads(r.out)
    assert set(doc) >= {"config", "tasks", "temperatures", "runs", "grad_check", "summary", "elapsed_s"}
    assert doc["config"]["steps"] == 10 and doc["config"]["methods"] == ["thre-laplace", "hard"]
    verdicts = {s["method"]: s["verdict"] for s in doc["summary"]}
    assert verdicts["hard"] == "baseline"
    assert len(doc["runs"]) == 4 and doc["runs"][0]["curve"][0][0] == 0
    assert r.err == ""


def test_table_and_csv() -> None:
    r = run(*SMALL, "-m", "thre-exp,grad-recursive")
    assert r.code == 0, r.output
    assert "verdict" in r.out and "unreachable" in r.out and "\x1b[" not in r.out
    assert "grad-recursive: refuses more than 1% of the rows" in r.out
    r = run(*SMALL, "-m", "thre-exp", "--format", "csv")
    lines = r.out.strip().splitlines()
    assert lines[0].startswith("task,method,label,tau,seed,final,auc") and len(lines) == 3


def test_strict_exit_codes() -> None:
    ok = run(*SMALL, "-m", "thre-laplace", "--taus", "0.2", "--steps", "60", "--strict")
    assert ok.code == 0, ok.output
    bad = run(*SMALL, "-m", "iterative", "--strict")
    assert bad.code == 1
    assert "iterative on select at mass 0.8: fails" in bad.err
    assert run(*SMALL, "-m", "iterative").code == 0  # without --strict a finding is not an error


def test_plot_is_written(tmp_path: Path) -> None:
    target = tmp_path / "probe.png"
    r = run(*SMALL, "-m", "thre-laplace", "--plot", str(target), "--format", "json")
    assert r.code == 0, r.output
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in r.err
    json.loads(r.out)


def test_n_and_k_override_the_task_sizes() -> None:
    r = run(*SMALL, "-m", "thre-laplace", "-n", "12", "-k", "2", "--steps", "5", "--format", "json")
    assert r.code == 0, r.output
    (task,) = json.loads(r.out)["tasks"]
    assert (task["n"], task["k"], task["chance"]) == (12, 2, 2 / 12)
    bad = run(*SMALL, "-n", "12", "-k", "12")
    assert bad.code == 2 and "-k must satisfy 1 <= k < n" in bad.err


def test_usage_errors_exit_2() -> None:
    for args in (
        ["--task", "nope"], ["--hardness", "0.1"], ["--hardness", "x"], ["--optimizer", "rmsprop"],
        ["--seeds", "0"], ["-m", "nope"], ["--taus", "-1"], ["--grad-check-hardness", "2"],
    ):
        r = run(*SMALL, *args)
        assert r.code == 2, (args, r.output)
        assert r.err.startswith("softtopk: error:") and "Traceback" not in r.output
