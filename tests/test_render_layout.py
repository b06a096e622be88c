"""Table layout off a terminal: every line bounded, key columns in every block, numbers right-aligned,
long prose as numbered notes, paste-able commands never wrapped.

The bound is 120 columns (``OFF_TERMINAL_WIDTH``): what a wide terminal, a CI log viewer or a
code review page shows without wrapping, and wide enough for the widest table of numbers (the
sweep's, about 115) to stay one block. The only lines allowed past it are commands meant to be
pasted (indented ``softtopk ...``), which must never be wrapped.
"""

from __future__ import annotations

import re

import pytest
from conftest import SAMPLES, run_cli
from rich.table import Table

from topk_cli.render.common import OFF_TERMINAL_WIDTH, renderables_to_text

BOUND = 120
COMMANDS = [
    ["methods"],
    ["compute", "-m", "all", "-k", "2", str(SAMPLES / "router_logits.csv")],
    ["compute", "-m", "all", "-k", "2", "--jacobian", str(SAMPLES / "scores.csv")],
    ["temperature-sweep", "-k", "2", "--taus", "1e-2:1e2:5", "--match", "0.9", "--hardness", "0.95"],
    ["stability-probe", "-m", "all", "-n", "10,100", "-k", "2,5", "--scales", "1,100", "--trials", "3"],
    ["verify-properties", "-m", "weighted-softmax", "-m", "iterative", "-m", "grad", "--values", "3,2,1,0", "-k", "2"],
    ["bench", "-k", "2", "-B", "4", "-n", "16", "-m", "grad", "-m", "thre-exp"],
    ["inspect", str(SAMPLES / "router_logits.csv")],
]


def _is_command(line: str) -> bool:
    return line.startswith("  softtopk ")


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0] + ("-jac" if "--jacobian" in a else ""))
def test_every_line_off_a_terminal_is_bounded(args: list[str]) -> None:
    assert OFF_TERMINAL_WIDTH == BOUND
    code, out, _ = run_cli(*args)  # CliRunner: stdout is not a terminal
    assert code in (0, 1), out
    lines = out.splitlines()
    assert len(lines) > 5
    too_wide = [line for line in lines if len(line) > BOUND and not _is_command(line)]
    assert not too_wide, too_wide[:3]
    assert "…" not in out  # nothing cut


def test_counterexample_commands_are_never_wrapped() -> None:
    values = ",".join(str(v) for v in range(60, 0, -1))  # a command far wider than the bound
    code, out, _ = run_cli("verify-properties", "-m", "weighted-softmax", "--values", values, "-k", "2")
    assert code == 0
    commands = [line for line in out.splitlines() if _is_command(line)]
    assert commands, out
    for line in commands:
        assert re.fullmatch(r"  softtopk compute -m \S+ -k \d+ --tau \S+ --values=\S+", line), line
    # the table refers to them by number instead of holding them
    assert "cmd 1" in out and "Commands that reproduce each counterexample:" in out


def test_long_prose_becomes_a_numbered_note() -> None:
    table = Table(title="t")
    table.add_column("method")
    table.add_column("reference")
    long = "an independent program in extended precision that checks the result on every row it can compute"
    table.add_row("a", long)
    table.add_row("b", "short text")
    table.add_row("c", long)
    out = renderables_to_text([table], color=False)
    assert "│ [1]" in out and out.count("[1]") == 3  # two cells and the note (one note per distinct text)
    note = out[out.index("\n[1] "):]
    assert " ".join(note.split()).startswith("[1] " + long)
    assert "short text" in out


def test_split_tables_repeat_every_key_column() -> None:
    table = Table(title="wide")
    for name in ("method", "n", "k", "scale", *[f"measurement {i}" for i in range(12)]):
        table.add_column(name)
    for r in range(3):
        table.add_row(f"method-{r}", "100", "5", "1e+03", *[f"{1.5 * i + r:.4f}" for i in range(12)])
    out = renderables_to_text([table], color=False, width=80)
    headers = [line for line in out.splitlines() if line.startswith("┃")]
    assert len(headers) >= 3
    for header in headers:
        cells = [c.strip() for c in header.strip("┃").split("┃")]
        assert cells[:4] == ["method", "n", "k", "scale"], cells
        assert len(header) <= 80


def test_split_stability_probe_blocks_keep_n_k_and_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    from topk_cli import cli

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(cli, "stdout_is_terminal", lambda: True)
    _, out, _ = run_cli("stability-probe", "-m", "grad-recursive", "-n", "10", "-k", "2", "--scales", "30,100,300", "--trials", "4")
    blocks = [line for line in out.splitlines() if line.startswith("┃") and "scale" in line and " n " in line]
    assert len(blocks) >= 2 and all(" k " in b for b in blocks)


def test_numbers_are_right_aligned() -> None:
    table = Table()
    table.add_column("method")
    table.add_column("worst")  # declared left: a column of numbers is right-aligned anyway
    table.add_column("declared right", justify="right")
    table.add_row("a", "0.5", "1")
    table.add_row("bbbbbbbbbbbbbbbbbbbbbbbbb", "0.0843", "1234567")
    for width in (None, 80):
        rows = [line for line in renderables_to_text([table], color=False, width=width).splitlines() if line.startswith("│ a")]
        assert rows and "│    0.5 │" in rows[0] and "│              1 │" in rows[0], rows


def test_sweep_numbers_right_aligned_off_a_terminal() -> None:
    _, out, _ = run_cli("temperature-sweep", "-k", "2", "-m", "grad", "--taus", "0.1,1")
    row = next(line for line in out.splitlines() if line.startswith("│ grad"))
    assert re.search(r"│ +0\.1 │ +0\.0135 │", row), row
