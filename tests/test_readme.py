"""The README tells the truth about the command line: every ``softtopk ...`` line of its code blocks
runs (with the exit code it documents), leaves the repository as it was, and the tables that
restate the tool's output (the guarantees table, the options table) are what the tool produces now.

Commands whose full run is slow are run with the extra flags in :data:`REDUCED` appended (a later
option overrides an earlier one of the same name; ``-m`` is only appended where the command has
none), so the line as written is parsed and every option in it is exercised. ``/tmp/`` in a
command is replaced by a fresh temporary folder. The guarantees table needs the default
``verify-properties`` suite (every method): about 14 s of CPU in one process.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / "benchmarks"))

#: Command (exactly as written in the README, trailing comment removed) -> flags appended to
#: shorten its run. Every other command runs as written.
_TRAIN = ["--steps", "6", "--seeds", "1"]
REDUCED: dict[str, list[str]] = {
    "softtopk verify-properties": ["-m", "hard", "-m", "grad", "--trials", "1"],
    "softtopk verify-properties -m grad -m thre-laplace": ["--trials", "1"],
    "softtopk stability-probe": ["-m", "grad", "-n", "10", "-k", "2", "--scales", "1", "--trials", "2"],
    "softtopk stability-probe -m all --dist student-t --offset 1e6 --format json --strict": [
        "-n", "10", "-k", "2", "--scales", "1,1e3", "--trials", "2",  # still exits 1 (grad-recursive fails at 1e3)
    ],
    "softtopk train-probe": [*_TRAIN, "--no-grad-check", "-m", "hard,grad"],
    "softtopk train-probe --plot /tmp/train_probe.png --format json -o /tmp/probe.json": [
        *_TRAIN, "--no-grad-check", "-m", "hard,grad",
    ],
    "softtopk train-probe --task all --steps 150 --seeds 5 --hardness 0.6,0.8,0.95": [*_TRAIN, "--no-grad-check", "-m", "grad"],
    "softtopk train-probe -m grad,thre-exp,thre-sigmoid,thre-laplace --hardness 0.8 --taus 0.01 --seeds 10": [
        *_TRAIN, "--no-grad-check",
    ],
    "softtopk train-probe -n 64 -k 2 --task select": [*_TRAIN, "--no-grad-check", "-m", "grad"],
    "softtopk bench -B 1024 -n 64 -k 2": ["-B", "16", "--repeats", "1", "--no-memory"],
    # a user's operator in PyTorch: the default suite takes 8 s of CPU (torch's import included)
    **{
        f"softtopk verify-properties -m tests/fixtures/user_ops/{spec}": ["--trials", "1", "-k", "2", "-j", "1"]
        for spec in (
            "example_torch_thre_sigmoid.py:soft_topk --reference thre-sigmoid --strict",
            "example_torch_thre_sigmoid.py:soft_topk --reference thre-sigmoid --dtype bfloat16 --strict",
            "defect_torch_no_threshold_grad.py:soft_topk --reference thre-sigmoid --strict",
            "example_torch_thre_sigmoid.py:soft_topk --strict",
        )
    },
}

#: Exit codes other than 0 that the README documents for a command (its trailing comment says so).
_EXIT_COMMENT = re.compile(r"#.*exit code (\d+)")


def readme_commands() -> list[tuple[int, str, int]]:
    """``(line number, command, expected exit code)`` for every ``softtopk`` line in a code block."""
    out: list[tuple[int, str, int]] = []
    in_block = False
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_block = not in_block
            continue
        stripped = line.strip()
        if in_block and re.match(r"(cat \S+ \| )?softtopk ", stripped):
            code = _EXIT_COMMENT.search(stripped)
            command = stripped.split("  #", 1)[0].strip()
            out.append((number, command, int(code.group(1)) if code else 0))
    return out


COMMANDS = readme_commands()


def _tree_state() -> str:
    """What git sees in the work tree (untracked files included), or the root's listing without git."""
    try:
        return subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "\n".join(sorted(p.name for p in ROOT.iterdir()))


def test_the_readme_has_commands_and_every_reduction_is_used() -> None:
    assert len(COMMANDS) >= 25, COMMANDS  # the parser found the README's command lines
    assert set(REDUCED) <= {c for _, c, _ in COMMANDS}, set(REDUCED) - {c for _, c, _ in COMMANDS}  # no stale entry


@pytest.mark.parametrize(("line", "command", "expected"), COMMANDS, ids=[f"README:{n}" for n, _, _ in COMMANDS])
def test_readme_command_runs(line: int, command: str, expected: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository root
    before = _tree_state()
    stdin = None
    text = command
    piped = re.match(r"cat (\S+) \| (.*)", command)
    if piped:
        stdin = (ROOT / piped.group(1)).read_text()
        text = piped.group(2)
    args = shlex.split(text.replace("/tmp/", f"{tmp_path}/"))
    assert args[0] == "softtopk"
    code, _out, err = run_cli(*args[1:], *REDUCED.get(command, []), input=stdin)
    assert code == expected, f"README line {line}: {command!r} exited {code}\n{err[-2000:]}"
    assert _tree_state() == before, f"README line {line}: {command!r} changed the repository tree"


# ---- the guarantees table ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_suite_document() -> dict:
    """``verify-properties --strict --format json`` on the default suite (every method, seed 0)."""
    code, out, err = run_cli("verify-properties", "--strict", "--format", "json", "--jobs", "1")
    assert code == 0, err[-3000:]  # --strict: no method violates a property it claims
    import json

    return json.loads(out)


def test_every_method_passes_strict_on_the_default_suite(default_suite_document: dict) -> None:
    assert default_suite_document["claim_failures"] == 0
    methods = {r["method"] for r in default_suite_document["results"]}
    from topk_cli.registry import METHODS

    assert methods == set(METHODS)


def test_readme_guarantees_table_is_the_commands_output(default_suite_document: dict) -> None:
    from guarantees_table import markdown_table, readme_table

    assert readme_table(README.read_text()) == markdown_table(default_suite_document), (
        "the README's guarantees table is stale: run python benchmarks/guarantees_table.py --update README.md"
    )


# ---- the options table -------------------------------------------------------------------------


def test_readme_options_table_is_the_apps_options() -> None:
    from options_table import command_options, markdown_table, readme_table

    options = command_options()
    assert {"compute", "verify-properties", "bench", "train-probe"} <= set(options)
    assert readme_table(README.read_text()) == markdown_table(options), (
        "the README's options table is stale: run python benchmarks/options_table.py --update README.md"
    )
