"""The command-line surface: shared options, output paths and formats, help text, messages.

Every command is found from the Typer app itself, so a new command or option is covered too.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import ROOT, SAMPLES, run_cli

from topk_cli.cli import app
from topk_cli.registry import METHODS

SCORES = str(SAMPLES / "scores.csv")
PYDANTIC_WORDING = ("Input should be", "Value error", "unable to parse", "valid integer", "valid number")


def _commands() -> dict[str, Any]:
    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def _options(command: Any) -> dict[str, Any]:
    return {opt: p for p in command.params if p.param_type_name == "option" for opt in p.opts}


def _needs_k(command: Any) -> list[str]:
    """``-k 2`` for a command that needs a k: -k required, or -k or --k-column (one of them)."""
    needed = any(p.required and "-k" in p.opts for p in command.params) or any(
        "--k-column" in p.opts for p in command.params)
    return ["-k", "2"] if needed else []


def _needs_input(command: Any) -> list[str]:
    return [SCORES] if any(p.required and p.param_type_name == "argument" for p in command.params) else []


def _one_line_error(err: str, needle: str) -> None:
    assert err.count("\n") == 1 and err.startswith("softtopk: error: ") and needle in err, err


# ---- --seed: one definition, >= 0, for every command that takes it ----------------------------


def test_every_command_with_a_seed_refuses_a_negative_seed_in_one_line() -> None:
    checked = 0
    for name, command in _commands().items():
        if "--seed" not in _options(command):
            continue
        args = [name, *_needs_k(command), "--seed", "-1"]
        if name == "compute":  # --seed is the Monte-Carlo method's parameter here (its ParamSpec)
            args += ["-m", "perturbed", "--values", "3,2,1,4"]
        code, out, err = run_cli(*args)
        assert code == 2 and out == "", (name, err)
        _one_line_error(err, "must be an integer >= 0, got -1")
        checked += 1
    assert checked >= 5  # compute, verify-properties, stability-probe, train-probe, bench


# ---- method parameters: generated from ParamSpec, validated the same way everywhere ------------


def test_method_parameter_options_are_generated_from_the_registry() -> None:
    compute = _options(_commands()["compute"])
    for spec in METHODS.values():
        for param in spec.parameters:
            assert param.option in compute, param.option
            assert spec.name in (compute[param.option].help or ""), param.option


@pytest.mark.parametrize("command", ["compute", "train-probe"])
def test_a_method_parameter_is_validated_by_its_paramspec(command: str) -> None:
    k = ["-k", "2", "--values", "3,2,1,4"] if command == "compute" else []
    code, out, err = run_cli(command, *k, "-m", "perturbed", "--samples", "5")
    assert code == 2 and out == ""
    _one_line_error(err, "samples of method 'perturbed' must be an even integer in [4, 10000000], got 5")


@pytest.mark.parametrize("command", ["compute", "train-probe"])
def test_a_parameter_no_selected_method_takes_is_refused_naming_the_takers(command: str) -> None:
    k = ["-k", "2", "--values", "3,2,1,4"] if command == "compute" else []
    code, out, err = run_cli(command, *k, "-m", "grad", "--samples", "6")
    assert code == 2 and out == ""
    _one_line_error(err, "--samples applies to perturbed, gumbel-topk, and no selected method takes it")


# ---- output paths: checked before anything is computed -----------------------------------------


def test_a_bad_plot_path_is_refused_before_the_output_is_written(tmp_path: Path) -> None:
    out_file = tmp_path / "out.txt"
    code, _out, err = run_cli(
        "temperature-sweep", "-k", "2", "--taus", "0.1,1", "-o", out_file, "--plot", tmp_path / "no" / "p.png"
    )
    assert code == 2 and not out_file.exists()
    _one_line_error(err, "--plot")


def test_every_output_option_is_checked_before_computing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    bad = {
        tmp_path / "missing" / "out.txt": "does not exist",
        tmp_path: "is a directory",
        tmp_path / "file" / "out.txt": "is not a directory",
    }
    checked = 0
    for name, command in _commands().items():
        options = _options(command)
        for flag in ("-o", "--plot"):
            if flag not in options:
                continue
            for path, needle in bad.items():
                target = path if flag == "-o" else Path(str(path).replace("out.txt", "p.png"))
                code, out, err = run_cli(name, *_needs_k(command), *_needs_input(command), flag, target)
                assert code == 2 and out == "", (name, flag, err)
                _one_line_error(err, needle)
                checked += 1
    assert checked >= 7 * 3 + 2 * 3


@pytest.mark.parametrize("suffix", [".txt", ".jpg", ""])
def test_a_plot_suffix_that_is_no_image_format_is_refused_before_computing(tmp_path: Path, suffix: str) -> None:
    out_file = tmp_path / "out.json"
    code, _, err = run_cli("temperature-sweep", "-k", "2", "-o", out_file, "--plot", tmp_path / f"plot{suffix}")
    assert code == 2 and not out_file.exists()
    _one_line_error(err, "must end in .png, .svg or .pdf")


@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG"), (".svg", b"<svg"), (".pdf", b"%PDF")])
def test_the_plot_format_follows_the_suffix(tmp_path: Path, suffix: str, magic: bytes) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / f"sweep{suffix}"
    code, _, err = run_cli("temperature-sweep", "-k", "2", "-m", "thre-laplace", "--taus", "0.1,1", "--plot", plot)
    assert code == 0, err
    head = plot.read_bytes()[:2000]
    assert magic in head, head[:40]


# ---- the output format follows the suffix of -o ------------------------------------------------


def test_output_suffix_sets_the_format(tmp_path: Path) -> None:
    args = ("compute", "-k", "2", "--values", "3,2,1,4")
    assert run_cli(*args, "-o", tmp_path / "w.csv").code == 0
    rows = list(csv.reader(io.StringIO((tmp_path / "w.csv").read_text())))
    assert len(rows) >= 2 and all("┃" not in cell and "│" not in cell for row in rows for cell in row)
    assert run_cli(*args, "-o", tmp_path / "w.json").code == 0
    assert json.loads((tmp_path / "w.json").read_text())["results"]
    for plain in ("w.txt", "w"):
        assert run_cli(*args, "-o", tmp_path / plain).code == 0
        assert "┃" in (tmp_path / plain).read_text(encoding="utf-8")
    assert run_cli(*args, "--format", "csv", "-o", tmp_path / "given.txt").code == 0  # --format wins
    assert "┃" not in (tmp_path / "given.txt").read_text(encoding="utf-8")


def test_a_format_contradicting_the_suffix_is_refused(tmp_path: Path) -> None:
    code, out, err = run_cli("compute", "-k", "2", "--values", "3,2,1", "--format", "json", "-o", tmp_path / "x.csv")
    assert code == 2 and out == "" and not (tmp_path / "x.csv").exists()
    _one_line_error(err, "--format json contradicts")


# ---- --hardness with --tau --------------------------------------------------------------------


def test_hardness_with_tau_is_refused_wherever_both_exist() -> None:
    checked = 0
    for name, command in _commands().items():
        options = _options(command)
        if "--tau" not in options or "--hardness" not in options:
            continue
        code, out, err = run_cli(name, *_needs_k(command), "--hardness", "0.8", "--tau", "2", "--values", "3,2,1,4")
        assert code == 2 and out == ""
        _one_line_error(err, "give --tau or --hardness, not both")
        checked += 1
    assert checked >= 1
    code, _, err = run_cli("compute", "-k", "2", "--hardness", "0.8", "--values", "3,2,1,4")
    assert code == 0, err


# ---- help text and messages -------------------------------------------------------------------


def test_no_help_shows_a_python_type_as_metavar() -> None:
    python_types = ("<list[", "<str>", "<int>", "<float>", "<path>", "<bool>", "<Path>", "<Optional")
    for name in ["", *_commands()]:
        code, out, _ = run_cli(*([name] if name else []), "--help")
        assert code == 0
        for bad in python_types:
            assert bad not in out, (name, bad, out)


def test_method_help_lists_every_method_and_input_format_is_a_choice() -> None:
    method = _options(_commands()["compute"])["-m"]
    assert all(name in (method.help or "") for name in METHODS)
    code, _, err = run_cli("compute", "-k", "2", "--input-format", "xls", SCORES)
    assert code == 2
    _one_line_error(err, "--input-format must be one of csv, tsv, json, jsonl, npy, npz, tab, ndjson, txt, got 'xls'")
    assert run_cli("compute", "-k", "2", "--input-format", "CSV", SCORES).code == 0



def test_input_format_aliases_reach_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "scores.txt"
    path.write_text("a\tb\tc\n3\t1\t2\n")
    for alias in ("tab", "tsv"):
        code, out, err = run_cli("compute", "-k", "1", "-m", "hard", "--input-format", alias, "--format", "json", path)
        assert code == 0, err
        assert json.loads(out)["results"][0]["weights"] == [[1.0, 0.0, 0.0]]


@pytest.mark.parametrize("columns", ["80", "60"])
def test_the_root_example_does_not_wrap(columns: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": columns}
    out = subprocess.run(
        [sys.executable, "-m", "topk_cli", "--help"], check=True, capture_output=True, text=True, env=env
    ).stdout
    lines = [line for line in out.splitlines() if "softtopk compute" in line]
    assert lines and all("sample_inputs/scores.csv" in line for line in lines), out


#: Per command, options that make a valid run cheap (a flag-value pair per entry).
CHEAP = {
    "bench": [("--repeats", "1"), ("--no-memory",), ("-m", "hard")],
    "verify-properties": [("--trials", "1"), ("-m", "hard")],
}


def test_no_bad_option_value_gets_pydantic_wording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # '-o abc' is a valid output path: written here, not in the checkout
    checked = 0
    for name, command in _commands().items():
        for param in command.params:
            if param.param_type_name != "option" or getattr(param, "is_flag", False):
                continue
            opt = max(param.opts, key=len)
            # the least work a command does when the value turns out valid (the value under test comes
            # after these, so it wins): the check is about parsing, not about running the command
            cheap = [a for pair in CHEAP.get(name, []) if pair[0] not in param.opts for a in pair]
            for bad in ("abc", "1.5x", ""):
                code, _out, err = run_cli(name, *_needs_k(command), *cheap, opt, bad, "--values", "3,2,1,4")
                assert "internal error" not in err
                for phrase in PYDANTIC_WORDING:
                    assert phrase not in err, (name, opt, bad, err)
                checked += 1
    assert checked >= 100
    code, _, err = run_cli("compute", "-k", "abc", "--values", "3,2,1")
    assert code == 2
    _one_line_error(err, "-k must be a number, got 'abc'")
    code, _, err = run_cli("compute", "-k", "2", "--tau", "x", "--values", "3,2,1")
    _one_line_error(err, "--tau must be a number, got 'x'")
    code, _, err = run_cli("compute", "-k", "2", "--format", "xml", "--values", "3,2,1")
    _one_line_error(err, "--format must be one of table, csv, json, got 'xml'")


@pytest.mark.parametrize("argv", [["--help"], ["compute", "--help"], ["--version"]])
def test_help_and_version_import_neither_numpy_nor_the_registry(argv: list[str]) -> None:
    """``--help`` stays about as fast as starting Python: the method list comes from the catalog."""
    code = (
        "import sys, io, contextlib\nfrom topk_cli.cli import main\n"
        f"sys.argv = ['softtopk', *{argv!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main()\n    except SystemExit as exc:\n        assert exc.code == 0, exc.code\n"
        "print(sorted(m for m in ('numpy', 'topk_cli.registry', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout
    assert out.split() == ["[]"]


# ---- rows and lines ----------------------------------------------------------------------------


def test_a_row_in_a_message_says_it_is_0_based(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("a,b,c\n1,2,3\n1,-inf,-inf\n")
    code, _, err = run_cli("compute", "-k", "2", path)
    assert code == 2
    assert "row 1 (0-based) has only 1 unmasked entries" in err, err


def test_an_integer_beyond_64_bits_is_a_usage_error_not_an_internal_error() -> None:
    code, out, err = run_cli("bench", "-k", "1", "-n", "99999999999999999999", "-m", "hard")
    assert code == 2 and out == ""
    _one_line_error(err, "-n must be an integer below 2**63 in size, got '99999999999999999999'")


@pytest.mark.parametrize("row", ["-1", "1"])
def test_sweep_row_without_input_is_refused_not_ignored(row: str) -> None:
    code, out, err = run_cli("temperature-sweep", "-k", "2", "--row", row)
    assert code == 2 and out == ""
    _one_line_error(err, "the default vector has only row 0")


def test_an_empty_method_name_is_refused() -> None:
    # '-m ""' (an unset shell variable) used to run the default method as if no -m were given
    for value in ("", "grad,", " , "):
        code, out, err = run_cli("compute", "-k", "2", "-m", value, "--values", "3,2,1")
        assert code == 2 and out == ""
        _one_line_error(err, "empty method name")


def test_a_reading_option_beside_values_is_refused() -> None:
    # --sep, --column, ... read INPUT files: beside --values they were silently ignored
    checked = 0
    for flag, value in (("--sep", ";"), ("--column", "a"), ("--index-col", "0"), ("--decimal", ","),
                        ("--orient", "rows"), ("--header", None), ("--input-format", "csv")):
        extra = [flag] if value is None else [flag, value]
        code, out, err = run_cli("compute", "-k", "2", *extra, "--values", "3,2,1")
        assert code == 2 and out == "", (flag, err)
        _one_line_error(err, f"{flag.split('/')[0]}")
        assert "--values takes none" in err
        checked += 1
    assert checked == 7
