"""The CLI boundary: one error line, exit codes that say why, the width policy, special outputs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CliResult, run_cli

import topk_cli.cli as cli
from topk_cli.output import write_text

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_inputs"


def run(*args: str) -> CliResult:
    return run_cli(*args)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["compute", "-k", "abc", "--values", "1,2"], "-k must be a number, got 'abc'"),
        (["compute", "-k", "1", "--format", "xml", "--values", "1,2"], "--format must be one of table, csv, json, got 'xml'"),
        (["compute", "--values", "1,2"], "Missing option '-k'"),
        (["compute", "-k", "1", "--bogus", "--values", "1,2"], "No such option: --bogus"),
        (["stability-probe", "--seed", "-1"], "seed must be an integer >= 0, got -1"),
        (["verify-properties", "--tau", "0", "-m", "hard"], "--tau must be a finite number > 0, got 0.0"),
        (["verify-properties", "--tau", "nan", "-m", "hard"], "--tau must be a finite number > 0"),
        (["nonsense"], "No such command 'nonsense'"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], needle: str) -> None:
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("softtopk: error: ") and needle in err, err
    assert "Usage:" not in err


def test_usage_error_through_python_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "topk_cli", "compute", "-k", "abc", "--values", "1,2"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("softtopk: error: -k must be a number, got 'abc'") and done.stderr.count("\n") == 1


def test_full_stdout_and_closed_stdin_are_one_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "topk_cli", "compute", "-k", "1", "--values", "3,1"],
                              stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    assert done.returncode == 2 and done.stderr == "softtopk: error: cannot write the output: No space left on device\n"
    done = subprocess.run([sys.executable, "-m", "topk_cli", "compute", "-k", "1", "-"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and done.stderr == "softtopk: error: <stdin>: empty input\n"


def test_sigint_prints_interrupted_and_exits_130(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "topk_cli", "stability-probe", "-m", "all", "--trials", "200"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4.0)  # past the imports: the interrupt lands in the command
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "softtopk: interrupted\n"


def test_no_library_warning_reaches_stderr(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("a;b\n1;2\n3;4\n")  # pandas would warn about the separator
    code, _, err = run("compute", "-k", "1", str(path))
    assert code == 0 and "Warning" not in err


def test_compute_exit_1_ends_with_a_summary_line() -> None:
    code, _, err = run("compute", "-m", "all", "-k", "3", str(SAMPLES / "wide_spread.csv"))
    assert code == 1
    assert err.splitlines()[-1].startswith("softtopk: failed: grad-recursive on 1/1 rows")


def test_strict_probe_ends_with_a_summary_line() -> None:
    code, _, err = run("stability-probe", "-m", "grad-recursive", "-n", "100", "-k", "50", "--scales", "1",
                       "--trials", "4", "--strict")
    assert code == 1 and err.splitlines()[-1] == "softtopk: strict: grad-recursive failed 4/4 trials"


def test_strict_properties_ends_with_a_summary_line() -> None:
    import dataclasses

    from topk_cli.registry import METHODS

    spec = METHODS["thre-exp"]
    honest = spec.guarantees
    object.__setattr__(spec, "guarantees", dataclasses.replace(honest, monotone_strict=True))  # a false claim
    try:
        code, _, err = run("verify-properties", "-m", "thre-exp", "--trials", "1", "--strict")
    finally:
        object.__setattr__(spec, "guarantees", honest)
    assert code == 1
    last = err.splitlines()[-1]
    assert last.startswith("softtopk: strict: thre-exp failed monotone-strict (") and last.endswith(" cases)")


# ---- one width policy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["methods"],
        ["compute", "-m", "all", "-k", "2", str(SAMPLES / "router_logits.csv")],
        ["temperature-sweep", "-k", "2", "-m", "grad", "-m", "weighted-softmax", "--taus", "0.1,1", "--values", "3,2,1,0"],
        ["stability-probe", "-m", "all", "-n", "10", "-k", "2", "--scales", "1,10", "--trials", "2"],
        ["verify-properties", "-m", "grad", "-m", "thre-exp", "--values", "3,2,1,0", "-k", "2"],
    ],
    ids=lambda a: a[0],
)
def test_every_command_fits_80_columns_on_a_terminal(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(cli, "stdout_is_terminal", lambda: True)
    code, out, _ = run(*args)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out  # nothing cut


def test_methods_keeps_every_name_and_header_whole_at_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(cli, "stdout_is_terminal", lambda: True)
    _, out, _ = run("methods")
    for name in ("weighted-softmax", "grad-recursive", "monotone-strict", "permutation-equivariant", "softmax-at-k1"):
        assert name in out
    assert "(continued: columns 2/" in out  # the wide claims table became blocks of columns


def test_pipes_get_a_fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    from topk_cli.render.common import OFF_TERMINAL_WIDTH

    monkeypatch.setenv("COLUMNS", "40")  # ignored: stdout is not a terminal
    _, out, _ = run("methods")
    widths = [len(line) for line in out.splitlines()]
    assert 80 < max(widths) <= OFF_TERMINAL_WIDTH == 120


# ---- -o onto special files -------------------------------------------------------------------


def test_output_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    code, _, _ = run("compute", "-k", "1", "--values", "3,1", "--format", "csv", "-o", str(link))
    assert code == 0 and link.is_symlink() and real.read_text().startswith("row,")


def test_output_to_a_fifo_and_a_device_writes_through(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    code, _, _ = run("compute", "-k", "1", "--values", "3,1", "--format", "csv", "-o", str(fifo))
    out = reader.communicate(timeout=30)[0]
    assert code == 0 and out.startswith("row,") and fifo.exists() and not fifo.is_file()
    code, _, _ = run("compute", "-k", "1", "--values", "3,1", "-o", os.devnull)
    assert code == 0 and Path(os.devnull).is_char_device()


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    def chunks():
        yield "a\n"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_text(chunks(), tmp_path / "out.txt")
    assert list(tmp_path.iterdir()) == []


def test_temperature_sweep_subnormal_gap_and_match_beyond_small_tau_failures() -> None:
    code, _, err = run("temperature-sweep", "-k", "1", "--values", "3,0,5e-324", "--taus", "1")
    assert code == 0, err
    from topk_cli.analysis.sweep import temperature_sweep

    x = np.array([0.0, -1.0, -30.0, -60.0, -90.0])  # grad-recursive fails at small tau only
    result = temperature_sweep(x, 2, methods=["grad-recursive", "grad"], taus=[1.0], match=0.9)
    taus = {m.method: m.tau for m in result.matches}
    assert taus["grad-recursive"] is not None and taus["grad"] is not None
    assert abs(taus["grad-recursive"] - taus["grad"]) <= 1e-6 * taus["grad"]
