"""``softtopk compute`` and ``softtopk methods``: every input form, format, error and exit code.

stdout and stderr are checked separately (Typer's CliRunner keeps them apart).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CliResult, run_cli

import topk_cli as st
from topk_cli.inputs import load_input
from topk_cli.render.common import format_float

SAMPLES = Path(__file__).resolve().parent.parent / "sample_inputs"
SCORES = str(SAMPLES / "scores.csv")
ROUTER = str(SAMPLES / "router_logits.csv")
WIDE = str(SAMPLES / "wide_spread.csv")


def run(*args: str, input: str | bytes | None = None) -> CliResult:
    return run_cli(*args, input=input)


def run_json(*args: str, input: str | bytes | None = None) -> dict:
    code, out, err = run(*args, "--format", "json", input=input)
    assert code == 0, err
    return json.loads(out)


# ---- every input form gives the library's weights ------------------------------------------


@pytest.mark.parametrize(
    ("args", "rows", "n"),
    [
        ([SCORES], 1, 6),
        ([str(SAMPLES / "scores.json")], 1, 6),
        ([ROUTER], 6, 8),
        ([str(SAMPLES / "router_logits.json")], 6, 8),
        ([str(SAMPLES / "ties.csv")], 1, 5),
        (["--values", "3,2,1,4"], 1, 4),
        (["--values", "3,2,-inf,4;1,2,3,4"], 2, 4),
        ([ROUTER, "--column", "expert_3"], 1, 6),
    ],
)
def test_input_forms_match_the_library(args: list[str], rows: int, n: int) -> None:
    doc = run_json("compute", "-m", "thre-sigmoid", "-k", "2", "--tau", "0.5", *args)
    loaded = load_input(
        args[0] if args[0] != "--values" else None,
        values=args[1] if args[0] == "--values" else None,
        column=args[2] if "--column" in args else None,
    )
    weights = np.array(doc["results"][0]["weights"], dtype=float)
    assert weights.shape == (rows, n) and len(doc["labels"]) == n
    np.testing.assert_array_equal(weights, st.soft_topk(loaded.values, 2, "thre-sigmoid", tau=0.5))
    assert doc["k"] == 2 and doc["tau"] == 0.5 and doc["results"][0]["status"] == ["ok"] * rows


def test_stdin_json_and_csv() -> None:
    doc = run_json("compute", "-m", "hard", "-k", "1", "-", input="[1, 5, 2]")
    assert doc["results"][0]["weights"] == [[0.0, 1.0, 0.0]] and doc["source"] == "<stdin>"
    doc = run_json("compute", "-m", "hard", "-k", "1", "-", input="label,s\na,1\nb,5\n")
    assert doc["labels"] == ["a", "b"]


def test_npy_input(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.array([[1.0, 2.0, 3.0]]))
    doc = run_json("compute", "-m", "hard", "-k", "2", str(tmp_path / "x.npy"))
    assert doc["results"][0]["weights"] == [[0.0, 1.0, 1.0]]


def test_masked_entry_gets_zero_weight() -> None:
    doc = run_json("compute", "-m", "thre-sigmoid", "-k", "2", ROUTER)
    row = doc["row_names"].index("on")
    weights = doc["results"][0]["weights"][row]
    assert weights[doc["labels"].index("expert_5")] == 0.0
    assert abs(sum(weights) - 2) < 1e-12


# ---- formats ---------------------------------------------------------------------------------


def test_default_table_on_scores() -> None:
    code, out, err = run("compute", "-k", "2", SCORES)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "thre-laplace" in lines[2] and "top-k" in lines[2]  # the default method agrees with the API
    apple = next(line for line in lines if "apple" in line)
    expected = st.soft_topk([[2.3, 0.4, 1.7, -0.5, 1.9, 0.1]], 2)[0, 0]
    assert format_float(float(expected)) in apple and "2.3" in apple
    assert any(line.split()[:2] == ["│", "sum"] for line in lines)
    assert "\x1b[" not in out  # not a terminal: plain text


def test_table_batch_has_one_block_per_vector() -> None:
    code, out, _ = run("compute", "-m", "thre-exp", "-k", "2", ROUTER)
    assert code == 0
    for r, token in enumerate(["The", "cat", "sat", "on", "the", "mat"]):
        assert f"row {r} ({token})" in out


def test_table_caps_blocks_and_entries_with_a_note() -> None:
    values = ";".join(",".join(str(i + j) for j in range(3)) for i in range(25))
    code, out, err = run("compute", "-m", "hard", "-k", "1", "--values", values)
    assert code == 0 and "row 19" in out and "row 20" not in out
    assert "first 20 of 25 vectors" in err and "--format csv" in err
    code, out, err = run("compute", "-m", "hard", "-k", "1", "--values", ",".join(map(str, range(150))))
    assert code == 0 and "... 50 more" in out and "first 100 of 150 entries" in err


def test_csv_is_tidy() -> None:
    code, out, err = run("compute", "-m", "thre-sigmoid", "-m", "hard", "-k", "2", "--format", "csv", ROUTER)
    assert code == 0 and err == ""
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["row", "row_name", "entry", "label", "value", "hard", "method", "weight", "status"]
    assert len(rows) == 6 * 8 * 2
    first = [r for r in rows if r["row"] == "0" and r["method"] == "thre-sigmoid"]
    assert sum(float(r["weight"]) for r in first) == pytest.approx(2, abs=1e-12)
    assert {r["row_name"] for r in rows} == {"The", "cat", "sat", "on", "the", "mat"}
    masked = next(r for r in rows if r["row_name"] == "on" and r["label"] == "expert_5")
    assert masked["value"] == "-inf" and float(masked["weight"]) == 0.0


def test_json_has_the_spec_keys_and_full_precision() -> None:
    doc = run_json("compute", "-m", "thre-sigmoid", "-m", "thre-exp", "-k", "3", SCORES)
    assert {"k", "tau", "labels", "results"} <= set(doc)
    assert [r["method"] for r in doc["results"]] == ["thre-sigmoid", "thre-exp"]
    for result in doc["results"]:
        assert {"method", "weights", "status"} <= set(result)
        assert isinstance(result["weights"][0], list)
    exact = st.soft_topk([2.3, 0.4, 1.7, -0.5, 1.9, 0.1], 3, "thre-exp")
    assert doc["results"][1]["weights"][0] == exact.tolist()  # repr round-trips every bit


def test_method_all_and_duplicates() -> None:
    doc = run_json("compute", "-m", "all", "-m", "grad", "-k", "2", "--values", "1,2,3,4")
    assert [r["method"] for r in doc["results"]] == list(st.METHODS)


def test_jacobian_json_and_table() -> None:
    doc = run_json("compute", "-m", "thre-sigmoid", "-k", "2", "--jacobian", "--values", "1,2,3;0,0,1")
    jac = np.array(doc["results"][0]["jacobian"])
    assert jac.shape == (2, 3, 3)
    np.testing.assert_allclose(jac, st.jacobian([[1, 2, 3], [0, 0, 1]], 2, "thre-sigmoid"), rtol=0, atol=0)
    code, out, _ = run("compute", "-m", "thre-sigmoid", "-k", "2", "--jacobian", "--values", "1,2,3")
    assert code == 0 and "Jacobian d p_i / d x_j of thre-sigmoid" in out


def test_output_file_is_written_and_stdout_stays_empty(tmp_path: Path) -> None:
    target = tmp_path / "w.json"
    code, out, _ = run("compute", "-m", "hard", "-k", "2", SCORES, "--format", "json", "-o", str(target))
    assert code == 0 and out == ""
    assert json.loads(target.read_text())["k"] == 2


def test_failed_run_leaves_an_existing_output_untouched(tmp_path: Path) -> None:
    target = tmp_path / "keep.csv"
    target.write_text("precious\n")
    code, _, err = run("compute", "-m", "hard", "-k", "9", SCORES, "-o", str(target))
    assert code == 2 and "fewer than k=9" in err
    assert target.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.csv"]  # no temporary left behind


# ---- grad-recursive failures: exit 1, other rows and methods still print ----------------------


def test_grad_recursive_failure_exit_1_with_a_warning_naming_the_row() -> None:
    code, out, err = run("compute", "-m", "grad-recursive", "-m", "grad", "-k", "3", "--format", "json", WIDE)
    assert code == 1
    doc = json.loads(out)
    failed, fine = doc["results"]
    assert failed["status"][0] != "ok" and failed["weights"][0][0] is None and failed["failures"]
    assert fine["status"] == ["ok"] and sum(fine["weights"][0]) == pytest.approx(3)
    assert "grad-recursive failed on the vector: log0" in err
    assert "-m grad" in err or "method 'grad'" in err  # points to the stable method
    assert "Traceback" not in err


def test_grad_recursive_failure_on_one_row_of_a_batch() -> None:
    wide = load_input(WIDE).values[0]
    values = ";".join(",".join(repr(float(v)) for v in row) for row in (wide / 1e3, wide))
    code, out, err = run("compute", "-m", "grad-recursive", "-k", "3", "--values", values)
    assert code == 1 and "grad-recursive failed on row 1" in err and "row 0" not in err
    assert "nan" in out  # the failed row's weights, the other row still printed


# ---- methods ---------------------------------------------------------------------------------


def test_methods_table_json_csv() -> None:
    code, out, err = run("methods")
    assert code == 0 and err == ""
    for name, spec in st.METHODS.items():
        assert name in out and spec.family in out
    doc = run_json("methods")
    assert [m["name"] for m in doc["methods"]] == list(st.METHODS)
    first = doc["methods"][0]
    assert {"summary", "family", "smoothness", "guarantees", "reference", "notes"} <= set(first)
    assert first["guarantees"] == st.METHODS[first["name"]].guarantees.as_dict()
    code, out, _ = run("methods", "--format", "csv")
    assert code == 0 and len(list(csv.DictReader(io.StringIO(out)))) == len(st.METHODS)


def test_version_and_help_have_examples() -> None:
    code, out, _ = run("--version")
    assert code == 0 and out.strip() == f"softtopk {st.__version__}"
    for command in ("compute", "methods"):
        code, out, _ = run(command, "--help")
        assert code == 0 and f"softtopk {command}" in out.split("Examples:")[1]


# ---- bad input: exit 2, one line on stderr, no traceback -------------------------------------


def bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "empty.csv": b"",
        "header.csv": b"label,score\n",
        "text.csv": b"label,score\na,1\nb,abc\nc,3\n",
        "cell.csv": b"label,score\na,1\nb,\nc,3\n",
        "ragged.csv": b"a,b,c\n1,2,3\n4,5\n",
        "nan.csv": b"a,b\n1,nan\n3,4\n",
        "pinf.csv": b"a,b\n1,+inf\n3,4\n",
        "words.csv": b"l,t\nx,y\n",
        "bad.json": b'{"a": 1,',
        "shape.json": b'{"a": [1, 2], "b": {"x": 3}}',
        "data.dat": b"1,2,3\n",
        "garbage.csv": bytes(range(256)),
        "latin1.csv": "name,x\ncaf\xe9,1\nthe,2\n".encode("latin-1"),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    return {name: tmp_path / name for name in files}


BAD_RUNS = [
    (["missing.csv"], "no such file"),
    (["."], "is a directory"),
    (["empty.csv"], "empty.csv: the file is empty"),
    (["header.csv"], "no data rows"),
    (["text.csv"], "line 3, column 'score': 'abc' is not a number"),
    (["cell.csv"], "line 3, column 'score': empty cell"),
    (["ragged.csv"], "line 3: 2 fields, the header has 3 (ragged rows)"),
    (["nan.csv"], "line 2, column 'b': 'nan' (NaN) is not allowed"),
    (["pinf.csv"], "line 2, column 'b': +inf is not allowed"),
    (["words.csv"], "no numeric column"),
    (["bad.json"], "malformed JSON at line 1"),
    (["shape.json"], "the object mixes numbers, lists and objects"),
    (["data.dat"], "suffix '.dat'; rename it or pass --input-format"),
    (["garbage.csv"], "binary data"),
    (["latin1.csv"], "line 2: not UTF-8 text"),
    (["--values", "1,2", "-k", "3"], "--values: the vectors have n=2 entries, fewer than k=3"),
    (["--values", "1,-inf,3", "-k", "3"], "has only 2 unmasked entries"),
    (["--values", "1,2", "-k", "0"], "-k must satisfy 1 <= k <= n, got 0"),
    (["--values", "1,2", "--tau", "0"], "--tau must be a finite number > 0, got 0.0"),
    (["--values", "1,2", "--tau", "-1"], "--tau must be a finite number > 0"),
    (["--values", "1,2", "-m", "nope"], "unknown method 'nope'; valid methods: hard, iterative"),
    (["--values", "1,x"], "--values: entry 1 (0-based): 'x' is not a number"),
    (["scores.csv", "--values", "1,2"], "not both"),
    ([], "no input"),
    (["--values", "1,2", "--format", "csv", "--jacobian"], "--jacobian is available with --format json"),
    (["--values", "1,2", "-o", "missing-dir/out.txt"], "directory missing-dir does not exist"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_RUNS, ids=[" ".join(a) or "none" for a, _ in BAD_RUNS])
def test_bad_input_exit_2_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], needle: str
) -> None:
    bad_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    if "-k" not in args:
        args = [*args, "-k", "1"]
    code, out, err = run("compute", "-m", "hard", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("softtopk: error: "), err
    assert needle in err, err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tau", "abc"], "--tau must be a number, got 'abc'"),
        (["-k", "two"], "-k must be a number, got 'two'"),
        ([], "Missing option '-k'"),
    ],
)
def test_usage_errors_exit_2(args: list[str], needle: str) -> None:
    code, out, err = run("compute", "--values", "1,2", *([] if args == [] else ["-k", "1"]), *args)
    assert code == 2 and out == "" and needle in err and "Traceback" not in err


# ---- the installed command, for real -----------------------------------------------------------


def test_installed_console_script_and_module(tmp_path: Path) -> None:
    exe = shutil.which("softtopk", path=str(Path(sys.executable).parent)) or shutil.which("softtopk")
    assert exe is not None
    env = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run(
        [exe, "compute", "-m", "thre-laplace", "-k", "2", SCORES, "--format", "json"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["labels"][0] == "apple"
    done = subprocess.run(
        [sys.executable, "-m", "topk_cli", "compute", "-k", "2", str(tmp_path / "nope.csv")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "nope.csv: no such file" in done.stderr


NEAR_BOUNDARY = "1.75,0.51,-0.19,-0.52,2.11,-4.50,-0.28,0.07,-2.85,0.67,-1.30,1.72,-0.25,1.34,2.44,0.77,-1.75,-3.03,3.51,-0.22,-1.38,0.29,-0.38,1.70,0.07,0.03,-1.43,0.94,-2.07,1.33"


def test_grad_recursive_near_its_boundary_warns_but_succeeds() -> None:
    code, out, err = run("compute", "-m", "grad-recursive", "-k", "8", "--values", NEAR_BOUNDARY, "--format", "csv")
    assert code == 0 and "nan" not in out
    assert "grad-recursive on the vector is close to its stability boundary" in err
    assert "use -m grad" in err


def test_grad_recursive_far_from_its_boundary_is_silent() -> None:
    code, _, err = run("compute", "-m", "grad-recursive", "-k", "2", "--values", "3,2,1,0", "--format", "csv")
    assert code == 0 and err == ""


def test_standard_errors_are_shown_to_two_significant_digits() -> None:
    """perturbed's standard error of an entry no pair selected is 1/pairs = 0.002: the table must
    not round it to 0 (it used two decimal places)."""
    code, out, _ = run("compute", "-m", "perturbed", "-k", "1", "--values", "0,0,-3,0,0")
    assert code == 0
    row = next(line for line in out.splitlines() if "-3" in line)
    assert row.split("│")[-2].strip() == "0.002", row
