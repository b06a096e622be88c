"""topk_cli.inputs: every input layout the README documents, and every bad input named by its place."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from topk_cli.errors import InputError
from topk_cli.inputs import IndexNames, load_input

SAMPLES = Path(__file__).resolve().parent.parent / "sample_inputs"


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


# ---- the shipped samples -------------------------------------------------------------------


def test_scores_csv_is_one_labelled_vector() -> None:
    loaded = load_input(str(SAMPLES / "scores.csv"))
    assert loaded.values.shape == (1, 6) and loaded.single
    assert list(loaded.labels) == ["apple", "banana", "cherry", "date", "elderberry", "fig"]
    assert loaded.values[0, 0] == 2.3 and loaded.input_format == "csv"


def test_scores_json_object_equals_scores_csv() -> None:
    csv_in = load_input(str(SAMPLES / "scores.csv"))
    json_in = load_input(str(SAMPLES / "scores.json"))
    np.testing.assert_array_equal(csv_in.values, json_in.values)
    assert list(csv_in.labels) == list(json_in.labels)


def test_router_logits_csv_is_a_batch_with_row_names_and_a_mask() -> None:
    loaded = load_input(str(SAMPLES / "router_logits.csv"))
    assert loaded.values.shape == (6, 8) and not loaded.single
    assert loaded.labels[0] == "expert_0" and list(loaded.row_names)[:2] == ["The", "cat"]
    assert loaded.row_names_given
    assert np.isneginf(loaded.values).sum() == 1


def test_router_logits_json_is_the_same_batch() -> None:
    a = load_input(str(SAMPLES / "router_logits.csv")).values
    b = load_input(str(SAMPLES / "router_logits.json")).values
    np.testing.assert_array_equal(a, b)


def test_column_selects_one_vector(tmp_path: Path) -> None:
    path = write(tmp_path, "r.csv", "tok,a,b\nx,1,10\ny,2,20\nz,3,30\n")
    loaded = load_input(path, column="b")
    np.testing.assert_array_equal(loaded.values, [[10.0, 20.0, 30.0]])
    assert list(loaded.labels) == ["x", "y", "z"]


def test_column_ignores_bad_cells_of_other_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "r.csv", "a,b\n1,10\nx,20\n3,30\n")
    np.testing.assert_array_equal(load_input(path, column="b").values, [[10.0, 20.0, 30.0]])


# ---- other good layouts --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3,2,1,4", [[3.0, 2.0, 1.0, 4.0]]),
        (" 3, 2 ,-inf ", [[3.0, 2.0, -np.inf]]),
        ("1,2;3,4", [[1.0, 2.0], [3.0, 4.0]]),
        ("1e-3,-Infinity", [[1e-3, -np.inf]]),
    ],
)
def test_values_string(text: str, expected: list[list[float]]) -> None:
    loaded = load_input(None, values=text)
    np.testing.assert_array_equal(loaded.values, expected)
    assert loaded.source == "--values"


def test_headerless_csv_and_blank_lines(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "v.csv", "3\n1\n\n2\n\n"))
    np.testing.assert_array_equal(loaded.values, [[3.0, 1.0, 2.0]])


def test_json_list_and_batch_with_masked_strings(tmp_path: Path) -> None:
    one = load_input(write(tmp_path, "a.json", '[1, 2.5, "-inf", -Infinity]'))
    np.testing.assert_array_equal(one.values, [[1.0, 2.5, -np.inf, -np.inf]])
    batch = load_input(write(tmp_path, "b.json", "[[1, 2], [3, 4], [5, 6]]"))
    assert batch.values.shape == (3, 2)


def test_npy_vector_and_batch(tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", np.array([1.0, 3.0, 2.0], dtype=np.float32))
    np.save(tmp_path / "b.npy", np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(load_input(str(tmp_path / "v.npy")).values, [[1.0, 3.0, 2.0]])
    assert load_input(str(tmp_path / "b.npy")).values.shape == (2, 3)


def test_input_format_overrides_the_suffix(tmp_path: Path) -> None:
    path = write(tmp_path, "data.txt", "[1, 2, 3]")
    assert load_input(path, input_format="json").values.shape == (1, 3)


@pytest.mark.parametrize(("content", "shape"), [(b"[1, 2, 3]", (1, 3)), (b"a,b\n1,2\n3,4\n", (2, 2))])
def test_stdin_is_sniffed(monkeypatch: pytest.MonkeyPatch, content: bytes, shape: tuple[int, int]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(content)))
    loaded = load_input("-")
    assert loaded.values.shape == shape and loaded.source == "<stdin>"


def test_big_unlabelled_vector_has_lazy_labels(tmp_path: Path) -> None:
    n = 200_000
    path = tmp_path / "big.csv"
    np.savetxt(path, np.linspace(-1, 1, n), header="score", comments="", fmt="%.17g")
    loaded = load_input(str(path))
    assert loaded.values.shape == (1, n)
    assert isinstance(loaded.labels, IndexNames) and loaded.labels[n - 1] == str(n - 1)
    assert loaded.values[0, -1] == 1.0


def test_index_names() -> None:
    names = IndexNames(4)
    assert list(names) == ["0", "1", "2", "3"] and names[-1] == "3" and names[1:3] == ["1", "2"]
    with pytest.raises(IndexError):
        names[4]


# ---- bad input: InputError naming file, row and column --------------------------------------

BAD_FILES = [
    # (file name, content, substrings the message must contain)
    ("empty.csv", "", ["empty.csv", "empty"]),
    ("header.csv", "label,score\n", ["header.csv", "no data rows"]),
    ("text.csv", "label,score\na,1\nb,2\nc,abc\nd,4\n", ["line 4, column", "column 'score'", "'abc' is not a number"]),
    ("cell.csv", "label,score\na,1\nb,\nc,3\n", ["line 3, column 'score'", "empty cell"]),
    ("short.csv", "a,b,c\n1,2,3\n4,5\n", ["line 3: 2 fields", "ragged"]),
    ("long.csv", "a,b,c\n1,2,3\n4,5,6,7\n", ["line 3", "4 fields", "ragged"]),
    ("nan.csv", "a,b\n1,2\n3,NaN\n", ["line 3, column 'b'", "NaN"]),
    ("pinf.csv", "a,b\n1,inf\n3,4\n", ["line 2, column 'b'", "+inf"]),
    ("words.csv", "a,b\nx,y\nz,w\n", ["no numeric column", "'a'", "'b'"]),
    ("dup.csv", "a,a\n1,2\n", ["duplicate column name 'a'"]),
    ("data.dat", "1,2,3\n", ["data.dat", "suffix '.dat'", "--input-format"]),
    ("bad.json", "[1, 2,", ["bad.json", "malformed JSON", "line 1"]),
    ("ragged.json", "[[1, 2], [3]]", ["[1] has 1 entries, [0] has 2", "ragged"]),
    ("deep.json", "[[[1]]]", ["[0][0]: a list is not a number"]),
    ("mixed.json", "[1, [2]]", ["[1]", "mixes lists and numbers"]),
    ("scalar.json", "3", ["got a int"]),
    ("emptylist.json", "[]", ["empty list"]),
    ("word.json", '{"a": 1, "b": "x"}', ["key 'b'", "'x' is not a number"]),
    ("nan.json", "[1, NaN]", ["NaN is not allowed"]),
    ("pinf.json", '[1, "inf"]', [": [1]: +inf is not allowed"]),
    ("bool.json", "[1, true]", [": [1]: true is not a number"]),
]


@pytest.mark.parametrize(("name", "content", "needles"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_input_message(tmp_path: Path, name: str, content: str, needles: list[str]) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(InputError) as info:
        load_input(path)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_missing_file_directory_binary_and_non_utf8(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_input(str(tmp_path / "missing.csv"))
    with pytest.raises(InputError, match="is a directory"):
        load_input(str(tmp_path))
    with pytest.raises(InputError, match="binary data"):
        load_input(write(tmp_path, "garbage.csv", b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe"))
    with pytest.raises(InputError, match=r"line 2: not UTF-8"):
        load_input(write(tmp_path, "latin1.csv", "name,x\ncaf\xe9,1\n".encode("latin-1")))


def test_bad_values_strings() -> None:
    with pytest.raises(InputError, match=r"entry 1 \(0-based\) is empty"):
        load_input(None, values="1,,3")
    with pytest.raises(InputError, match=r"entry 2 \(0-based\): 'x' is not a number"):
        load_input(None, values="1,2,x")
    with pytest.raises(InputError, match=r"entry 0 \(0-based\): NaN is not allowed"):
        load_input(None, values="nan,1")
    with pytest.raises(InputError, match=r"row 1 \(0-based\) has 1 entries, row 0 has"):
        load_input(None, values="1,2;3")


def test_bad_arguments(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", "a,b\n1,2\n")
    with pytest.raises(InputError, match="no column 'c'; columns: 'a', 'b'"):
        load_input(path, column="c")
    with pytest.raises(InputError, match="unknown --input-format 'xml'"):
        load_input(path, input_format="xml")
    with pytest.raises(InputError, match="--column applies to CSV"):
        load_input(write(tmp_path, "s.json", "[1]"), column="a")
    with pytest.raises(InputError, match="not both"):
        load_input(path, values="1,2")
    with pytest.raises(InputError, match="no input"):
        load_input(None)


def test_json_error_message_is_valid_for_json_tools(tmp_path: Path) -> None:
    # the object form keeps the keys as labels, in order
    loaded = load_input(write(tmp_path, "o.json", json.dumps({"z": 1, "a": 2})))
    assert list(loaded.labels) == ["z", "a"]
