"""Files as users' tools write them (pandas, numpy, json, Excel's conventions), read right or refused.

Each case writes its input with the tool, then checks the numbers read (``load_input``) and the
CLI's stdout (the JSON document), stderr (the one note or the one error line) and exit code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from topk_cli.errors import InputError
from topk_cli.inputs import load_input

RNG = np.random.default_rng(7)
SCORES = np.round(RNG.normal(size=(4, 10)), 4)
CLASSES = [f"class_{i}" for i in range(10)]


def frame() -> pd.DataFrame:
    return pd.DataFrame(SCORES.copy(), columns=CLASSES)


def compute(path: Path, *extra: str) -> tuple[int, dict, str]:
    result = run_cli("compute", "-m", "hard", "-k", "1", "--format", "json", *extra, str(path))
    doc = json.loads(result.out) if result.code == 0 else {}
    return result.code, doc, result.err


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("softtopk: note:")]


# ---- the batch written by pandas in every way ------------------------------------------------


def _default(p: Path) -> None:
    frame().to_csv(p)


def _named_index(p: Path) -> None:
    df = frame()
    df.index.name = "sample"
    df.to_csv(p)


def _no_header(p: Path) -> None:
    frame().to_csv(p, header=False)


def _integer_columns(p: Path) -> None:
    pd.DataFrame(SCORES.copy()).to_csv(p)


def _integer_columns_no_index(p: Path) -> None:
    pd.DataFrame(SCORES.copy()).to_csv(p, index=False)


def _european(p: Path) -> None:
    frame().to_csv(p, sep=";", decimal=",", index=False)


def _tabs_in_csv(p: Path) -> None:
    frame().to_csv(p, sep="\t", index=False)


def _records(p: Path) -> None:
    frame().to_json(p, orient="records")


def _columns(p: Path) -> None:
    frame().to_json(p)  # pandas' default orient="columns"


def _split(p: Path) -> None:
    frame().to_json(p, orient="split")


def _lines(p: Path) -> None:
    frame().to_json(p, orient="records", lines=True)


def _lists_ndjson(p: Path) -> None:
    p.write_text("\n".join(json.dumps(row) for row in SCORES.tolist()) + "\n")


def _one_key(p: Path) -> None:
    p.write_text(json.dumps({"logits": SCORES.tolist()}))


def _npy(p: Path) -> None:
    np.save(p, SCORES)


BATCHES = [
    # (writer, file name, note substring or None, labels are the class names)
    (_default, "default.csv", "the unnamed first column", True),
    (_named_index, "named.csv", "column 'sample' (the integers 0..3, pandas' default index)", True),
    (_no_header, "noheader.csv", "column 1 (the integers 0..3, pandas' default index)", False),
    (_integer_columns, "intcols.csv", "the unnamed first column", False),
    (_integer_columns_no_index, "intcols_noindex.csv", "line 1 (0,1,...) read as column names", False),
    (_european, "european.csv", "decimal commas detected", True),
    (_tabs_in_csv, "tabs.csv", "separator tab detected", True),
    (_tabs_in_csv, "plain.tsv", None, True),
    (_records, "records.json", None, True),
    (_columns, "columns.json", "orient='columns'", True),
    (_split, "split.json", "orient='split'", True),
    (_lines, "lines.jsonl", None, True),
    (_lists_ndjson, "lists.ndjson", None, False),
    (_one_key, "onekey.json", None, False),
    (_npy, "batch.npy", None, False),
]


@pytest.mark.parametrize(("writer", "name", "note", "named"), BATCHES, ids=[b[1] for b in BATCHES])
def test_batch_written_by_tools_is_read_exactly(tmp_path: Path, writer, name: str, note: str | None, named: bool) -> None:
    path = tmp_path / name
    writer(path)
    loaded = load_input(str(path))
    np.testing.assert_array_equal(loaded.values, SCORES)  # exact: not an extra column, not a lost row
    if named:
        assert list(loaded.labels) == CLASSES
    code, doc, err = compute(path)
    assert code == 0
    assert doc["rows"] == 4 and doc["n"] == 10 and len(doc["results"][0]["weights"]) == 4
    hard = np.asarray(doc["hard"])
    np.testing.assert_array_equal(hard.argmax(axis=1), SCORES.argmax(axis=1))
    lines = notes(err)
    if note is None:
        assert lines == [], err
    else:
        assert len(lines) == 1 and note in lines[0] and "read 4 vectors of 10 entries" in lines[0], err
    assert err.count("\n") == len(lines)  # nothing else on stderr (no library warning)


# ---- one vector with an id, a rank, a flag ---------------------------------------------------

VECTOR = np.array([0.1, 0.5, 0.2, 0.9, 0.3])


@pytest.mark.parametrize(
    ("columns", "labels", "note"),
    [
        ({"id": range(5), "score": VECTOR}, ["0", "1", "2", "3", "4"], "labels from column 'id'"),
        ({"score": VECTOR, "rank": [5, 2, 4, 1, 3]}, ["5", "2", "4", "1", "3"], "labels from column 'rank'"),
        ({"id": [17, 3, 99, 42, 8], "score": VECTOR}, ["17", "3", "99", "42", "8"], "labels from column 'id'"),
        ({"score": VECTOR, "flag": [True, False, True, True, False]}, None, "ignored column 'flag' (true/false)"),
    ],
    ids=["id-range", "rank", "id-unique", "true-false"],
)
def test_id_like_column_labels_one_vector(tmp_path: Path, columns: dict, labels: list[str] | None, note: str) -> None:
    path = tmp_path / "v.csv"
    pd.DataFrame(columns).to_csv(path, index=False)
    loaded = load_input(str(path))
    np.testing.assert_array_equal(loaded.values, [VECTOR])  # one vector, not 5 vectors of 2 entries
    if labels is not None:
        assert list(loaded.labels) == labels
    code, doc, err = compute(path)
    assert code == 0 and doc["rows"] == 1 and doc["n"] == 5
    assert doc["results"][0]["weights"][0][3] == 1.0  # the hard top-1 is the 0.9 score
    assert len(notes(err)) == 1 and note in err and "read 1 vector of 5 entries from column 'score'" in err


def test_series_to_csv_and_to_json_are_labelled_vectors(tmp_path: Path) -> None:
    series = pd.Series(VECTOR, index=list("abcde"))
    series.to_csv(tmp_path / "s.csv")
    series.to_json(tmp_path / "s.json")
    for name in ("s.csv", "s.json"):
        loaded = load_input(str(tmp_path / name))
        np.testing.assert_array_equal(loaded.values, [VECTOR])
        assert list(loaded.labels) == list("abcde")


def test_excel_bom_without_header_keeps_the_first_value(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("1.5\n2.5\n3.5\n".encode("utf-8-sig"))  # Excel's "CSV UTF-8"
    np.testing.assert_array_equal(load_input(str(path)).values, [[1.5, 2.5, 3.5]])
    path.write_bytes("name,score\na,1\nb,2\n".encode("utf-8-sig"))
    loaded = load_input(str(path))
    assert list(loaded.labels) == ["a", "b"] and loaded.row_names[0] == "score"


def test_comment_lines_before_the_header_are_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("# exported 2024-01-01\n# by a tool\nlabel,score\nx,1\ny,2\nz,0\n")
    code, doc, err = compute(path)
    assert code == 0 and doc["labels"] == ["x", "y", "z"]
    assert "skipped 2 comment lines starting with '#'" in err


# ---- refused, never silently reinterpreted ---------------------------------------------------


@pytest.mark.parametrize("share", [0.0, 0.75, 1.0], ids=["one-nan", "mostly-nan", "all-nan"])
def test_nan_is_an_error_whatever_its_share(tmp_path: Path, share: float) -> None:
    df = frame()
    rows = max(1, int(share * len(df)))
    df.iloc[len(df) - rows :, 3] = np.nan
    path = tmp_path / "nan.csv"
    df.to_csv(path, index=False)
    code, _, err = compute(path)
    first = len(df) - rows + 1
    assert code == 2 and err.count("\n") == 1
    assert f"line {first + 1}, column 'class_3': empty cell" in err


def test_nan_in_the_only_row_and_in_json_is_an_error(tmp_path: Path) -> None:
    df = frame().iloc[:1].copy()
    df.iloc[0, 2] = np.nan
    df.to_csv(tmp_path / "one.csv", index=False)
    df.to_json(tmp_path / "one.json", orient="records")
    single = pd.DataFrame({"score": [0.1, np.nan, 0.3]})
    single.to_csv(tmp_path / "single.csv", index=False)  # pandas writes "" for NaN in one column
    for name, needle in [("one.csv", "column 'class_2'"), ("one.json", "key 'class_2'"), ("single.csv", "line 3")]:
        code, _, err = compute(tmp_path / name)
        assert code == 2 and needle in err, err


def test_duplicate_json_keys_and_extra_csv_fields_are_errors(tmp_path: Path) -> None:
    (tmp_path / "dup.json").write_text('{"a": 1, "b": 2, "a": 3}')
    (tmp_path / "extra.csv").write_text("a,b\n1,2,3\n4,5\n")
    code, _, err = compute(tmp_path / "dup.json")
    assert code == 2 and "duplicate key 'a'" in err
    code, _, err = compute(tmp_path / "extra.csv")
    assert code == 2 and "line 2: 3 fields, the header has 2" in err


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("huge.json", "[1, " + "1" + "0" * 400 + "]", "beyond the float64 range"),
        ("huge.csv", "a,b\n1," + "1" + "0" * 400 + "\n2,3\n", "beyond the float64 range"),
        ("neg.csv", "a,b\n1,-1e400\n2,3\n", "'-1e400' is beyond the float64 range"),  # not a mask
        ("float.json", "[1, 1e400]", "beyond the float64 range"),
    ],
)
def test_numbers_beyond_float64_are_refused_not_overflowed(tmp_path: Path, name: str, content: str, needle: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    code, _, err = compute(path)
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_corrupted_npy_header_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.npy"
    np.save(path, SCORES)
    data = bytearray(path.read_bytes())
    data[20:30] = b"{{{{{{{{{{"
    path.write_bytes(bytes(data))
    code, _, err = compute(path)
    assert code == 2 and err.startswith("softtopk: error:") and "not a valid .npy file" in err


def test_brackets_in_labels_and_file_names_print_as_written(tmp_path: Path) -> None:
    path = tmp_path / "[run 1].csv"
    pd.DataFrame({"label": ["[bold]x", "y[/]"], "score": [1.0, 2.0]}).to_csv(path, index=False)
    result = run_cli("compute", "-k", "1", str(path))
    assert result.code == 0, result.err
    assert "[bold]x" in result.out and "y[/]" in result.out and "[run 1].csv" in result.out


def test_reading_options(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    frame().to_csv(path, sep="|", decimal=",")
    loaded = load_input(str(path), input_format="csv", sep="|", decimal=",", index_col="0")
    np.testing.assert_array_equal(loaded.values, SCORES)
    named = tmp_path / "named.csv"
    _named_index(named)
    assert list(load_input(str(named), index_col="sample").row_names) == ["0", "1", "2", "3"]
    with_ids = load_input(str(named), index_col="none")  # the user says: no row names
    assert with_ids.values.shape == (4, 11)
    with pytest.raises(InputError, match="--index-col: no column 'nope'"):
        load_input(str(named), index_col="nope")


def test_several_inputs_are_labelled_by_source(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.json"
    _default(a)
    _records(b)
    one = run_cli("compute", "-k", "2", "--format", "json", str(a))
    assert set(json.loads(one.out)) >= {"k", "tau", "labels", "results"}  # one file: unchanged shape
    both = run_cli("compute", "-k", "2", "--format", "json", str(a), str(b))
    doc = json.loads(both.out)
    assert [d["source"] for d in doc["inputs"]] == [str(a), str(b)]
    assert doc["inputs"][0]["results"][0]["weights"] == doc["inputs"][1]["results"][0]["weights"]
    csv_text = run_cli("compute", "-k", "2", "--format", "csv", str(a), str(b)).out
    parsed = pd.read_csv(pd.io.common.StringIO(csv_text))
    assert parsed.columns[0] == "source" and set(parsed["source"]) == {str(a), str(b)}
    table = run_cli("compute", "-k", "2", str(a), str(b)).out
    assert f"soft top-k of {a}" in table and f"soft top-k of {b}" in table
