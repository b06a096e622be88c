"""softtopk train-probe through the CLI: formats, exit codes, --strict, --plot, errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from topk_cli.cli import app

runner = CliRunner()
SMALL = ["--task", "select", "--seeds", "2", "--steps", "10", "--no-grad-check"]


def run(*args: str):
    return runner.invoke(app, ["train-probe", *args])


def test_json_is_one_document_and_nothing_else() -> None:
    r = run(*SMALL, "-m", "thre-laplace", "-m", "hard", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) >= {"config", "tasks", "temperatures", "runs", "grad_check", "summary", "elapsed_s"}
    assert doc["config"]["steps"] == 10 and doc["config"]["methods"] == ["thre-laplace", "hard"]
    verdicts = {s["method"]: s["verdict"] for s in doc["summary"]}
    assert verdicts["hard"] == "baseline"
    assert len(doc["runs"]) == 4 and doc["runs"][0]["curve"][0][0] == 0
    assert r.stderr == ""


def test_table_and_csv() -> None:
    r = run(*SMALL, "-m", "thre-exp,grad-recursive")
    assert r.exit_code == 0, r.output
    assert "verdict" in r.stdout and "unreachable" in r.stdout and "\x1b[" not in r.stdout
    assert "grad-recursive: refuses more than 1% of the rows" in r.stdout
    r = run(*SMALL, "-m", "thre-exp", "--format", "csv")
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("task,method,label,tau,seed,final,auc") and len(lines) == 3


def test_strict_exit_codes() -> None:
    ok = run(*SMALL, "-m", "thre-laplace", "--taus", "0.2", "--steps", "60", "--strict")
    assert ok.exit_code == 0, ok.output
    bad = run(*SMALL, "-m", "iterative", "--strict")
    assert bad.exit_code == 1
    assert "iterative on select at mass 0.8: fails" in bad.stderr
    assert run(*SMALL, "-m", "iterative").exit_code == 0  # without --strict a finding is not an error


def test_plot_is_written(tmp_path: Path) -> None:
    target = tmp_path / "probe.png"
    r = run(*SMALL, "-m", "thre-laplace", "--plot", str(target), "--format", "json")
    assert r.exit_code == 0, r.output
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in r.stderr
    json.loads(r.stdout)


def test_n_and_k_override_the_task_sizes() -> None:
    r = run(*SMALL, "-m", "thre-laplace", "-n", "12", "-k", "2", "--steps", "5", "--format", "json")
    assert r.exit_code == 0, r.output
    (task,) = json.loads(r.stdout)["tasks"]
    assert (task["n"], task["k"], task["chance"]) == (12, 2, 2 / 12)
    bad = run(*SMALL, "-n", "12", "-k", "12")
    assert bad.exit_code == 2 and "-k must satisfy 1 <= k < n" in bad.stderr


def test_usage_errors_exit_2() -> None:
    for args in (
        ["--task", "nope"], ["--hardness", "0.1"], ["--hardness", "x"], ["--optimizer", "rmsprop"],
        ["--seeds", "0"], ["-m", "nope"], ["--taus", "-1"], ["--grad-check-hardness", "2"],
    ):
        r = run(*SMALL, *args)
        assert r.exit_code == 2, (args, r.output)
        assert r.stderr.startswith("softtopk: error:") and "Traceback" not in r.output
