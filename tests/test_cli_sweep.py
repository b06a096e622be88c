"""softtopk temperature-sweep through the CLI: formats, exit codes, plot, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import CliResult, run_cli

SAMPLES = Path(__file__).resolve().parent.parent / "sample_inputs"
def run(*args: str) -> CliResult:
    return run_cli("temperature-sweep", *args)


def test_json_on_the_default_vector() -> None:
    r = run("-k", "2", "-m", "weighted-softmax", "-m", "grad", "--taus", "1e-3,1", "--format", "json")
    assert r.code == 0, r.output
    doc = json.loads(r.out)
    assert {p["method"] for p in doc["results"]} == {"weighted-softmax", "grad"}
    assert set(doc["results"][0]) >= {"method", "tau", "l1_to_hard", "topk_mass", "jacobian_norm", "status"}
    limits = {lim["method"]: lim for lim in doc["limits"]}
    assert limits["weighted-softmax"]["converges"] is False
    assert limits["weighted-softmax"]["limit"][:2] == [1.5, 0.5]
    assert limits["grad"]["converges"] is True


def test_table_and_csv_on_a_sample_file() -> None:
    r = run(str(SAMPLES / "scores.csv"), "-k", "2", "-m", "thre-exp", "--taus", "0.1:10:3", "--match", "0.9")
    assert r.code == 0, r.output
    assert "Limits" in r.out and "top-k mass 0.9" in r.out and "\x1b[" not in r.out
    r = run("--values", "3,2,1,0", "-k", "1", "-m", "grad", "--taus", "0.1,1", "--format", "csv")
    assert r.code == 0
    lines = r.out.strip().splitlines()
    assert lines[0].startswith("method,tau,l1_to_hard")
    # one row per grid tau, then the method's limits (kind column says which)
    kinds = [line.split(",")[lines[0].split(",").index("kind")] for line in lines[1:]]
    assert kinds == ["point", "point", "limit"]


def test_batch_input_sweeps_the_selected_row() -> None:
    path = str(SAMPLES / "router_logits.csv")
    r0 = run(path, "-k", "2", "-m", "grad", "--taus", "1", "--format", "json")
    r1 = run(path, "-k", "2", "-m", "grad", "--taus", "1", "--format", "json", "--row", "1")
    assert r0.code == 0 and r1.code == 0
    assert json.loads(r0.out)["x"] != json.loads(r1.out)["x"]
    bad = run(path, "-k", "2", "--row", "100000")
    assert bad.code == 2 and "--row" in bad.err


def test_usage_errors_exit_2() -> None:
    for args in (["-k", "2", "--taus", "oops"], ["-k", "9"], ["-k", "2", "-m", "nope"], ["-k", "2", "--match", "2"]):
        r = run(*args)
        assert r.code == 2, (args, r.output)
        assert r.err.startswith("softtopk: error:") and "Traceback" not in r.output


def test_plot_writes_a_png(tmp_path: Path) -> None:
    target = tmp_path / "sweep.png"
    r = run("-k", "2", "-m", "grad", "-m", "thre-exp", "--taus", "0.1,1,10", "--plot", str(target))
    assert r.code == 0, r.output
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    target = tmp_path / "sweep.png"
    r = run("-k", "2", "-m", "grad", "--taus", "1", "--plot", str(target))
    assert r.code == 2 and "matplotlib" in r.err
    assert not target.exists() and r.out == ""
