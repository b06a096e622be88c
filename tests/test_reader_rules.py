"""Every rule the CSV reader applies, each with the file that motivates it and a look-alike read otherwise.

The files are written the way pandas, numpy, Excel and hand-typing write them. Each test reads
through ``load_input`` (the numbers, labels and row names) and, where the announcement matters,
through the CLI (the stderr note or the one error line).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from topk_cli.errors import InputError
from topk_cli.inputs import load_input

RNG = np.random.default_rng(41)
X = np.round(RNG.normal(size=(3, 4)), 4)  # non-integer scores


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", newline="")
    return str(path)


def note_of(*args: str) -> str:
    code, _, err = run_cli("compute", "-m", "hard", "-k", "1", "--format", "json", *args)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("softtopk: note:")]
    return notes[0] if notes else ""


def error_of(*args: str) -> str:
    code, _, err = run_cli("compute", "-m", "hard", "-k", "1", "--format", "json", *args)
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("softtopk: error:"), err
    return lines[0]


# ---- line ends, encodings, Excel's separator line --------------------------------------------


def test_carriage_return_line_ends_are_line_ends(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "mac.csv", "a,b\r1.5,2\r3,4.5\r"))
    np.testing.assert_array_equal(loaded.values, [[1.5, 2], [3, 4.5]])
    assert list(loaded.labels) == ["a", "b"]


def test_a_carriage_return_inside_quotes_stays_in_the_label(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "q.csv", 'label,score\n"a\rb",1.5\nc,2.5\n'))
    assert list(loaded.labels) == ["a\rb", "c"]
    np.testing.assert_array_equal(loaded.values, [[1.5, 2.5]])


def test_a_lone_carriage_return_in_a_lf_file_is_named(tmp_path: Path) -> None:
    line = error_of(write(tmp_path, "mixed.csv", "a,b\n1,2\r3\n4,5\n"))
    assert "line 2: a carriage return (CR) inside a line" in line and "universal-newline" not in line


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_is_refused_with_the_fix(tmp_path: Path, encoding: str) -> None:
    line = error_of(write(tmp_path, "u16.csv", "label,score\na,1\nb,2\n".encode(encoding)))
    assert "UTF-16 encoded text; save it as UTF-8" in line and "binary" not in line


def test_utf8_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "u8.csv", "label,score\na,1\nb,2\n".encode("utf-8-sig")))
    assert list(loaded.labels) == ["a", "b"]


def test_excel_sep_line_sets_the_separator(tmp_path: Path) -> None:
    path = write(tmp_path, "excel.csv", "sep=;\nlabel;score\na;1,5\nb;2,25\nc;3\n")
    loaded = load_input(path)
    np.testing.assert_array_equal(loaded.values, [[1.5, 2.25, 3.0]])
    assert list(loaded.labels) == ["a", "b", "c"]
    assert "separator ';' from line 1 ('sep='" in note_of(path)


def test_a_header_cell_starting_with_sep_is_a_name(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "names.csv", "sep=a,b\n1.5,2\n3,4.5\n"))
    assert list(loaded.labels) == ["sep=a", "b"] and loaded.values.shape == (2, 2)


# ---- separators --------------------------------------------------------------------------------


def test_np_savetxt_default_spaces_are_sniffed(tmp_path: Path) -> None:
    path = tmp_path / "sp.csv"
    np.savetxt(path, X)  # delimiter " ", fmt "%.18e"
    loaded = load_input(str(path))
    np.testing.assert_array_equal(loaded.values, X)
    assert "runs of spaces" in note_of(str(path))


def test_aligned_columns_with_sep_space(tmp_path: Path) -> None:
    path = write(tmp_path, "aligned.txt", "  1.5   2.0\n 10.0  -3.5\n")
    loaded = load_input(path, input_format="csv", sep=" ")
    np.testing.assert_array_equal(loaded.values, [[1.5, 2.0], [10.0, -3.5]])


def test_text_with_spaces_is_not_split_on_spaces(tmp_path: Path) -> None:
    path = write(tmp_path, "words.csv", "new york 1\nlos angeles 2\n")
    with pytest.raises(InputError, match="no numeric column"):
        load_input(path)


# ---- line 1: header or data --------------------------------------------------------------------


@pytest.mark.parametrize("ids", [[101, 2023, 2003, 2100], [1, 2, 3, 4], [0, 1, 2, 3]], ids=["tokens", "1..4", "0..3"])
def test_integer_column_ids_above_floats_are_a_header(tmp_path: Path, ids: list[int]) -> None:
    path = tmp_path / "ids.csv"
    pd.DataFrame(X, columns=ids).to_csv(path, index=False)
    loaded = load_input(str(path))
    np.testing.assert_array_equal(loaded.values, X)
    assert list(loaded.labels) == [str(i) for i in ids]
    assert f"line 1 ({ids[0]},{ids[1]},...) read as column names" in note_of(str(path))


def test_integer_line_above_integers_is_data(tmp_path: Path) -> None:
    path = write(tmp_path, "toy.csv", "0,1,2,3\n1,2,3,0\n2,3,0,1\n")  # typed by hand
    loaded = load_input(path)
    np.testing.assert_array_equal(loaded.values, [[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1]])
    note = note_of(path)
    assert "line 1 (0,1,...) read as data" in note and "--header" in note
    assert "column 1 (0..2) read as scores" in note and "--index-col 0" in note


def test_repeated_integers_above_floats_are_data(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "rep.csv", "1,1,2\n0.5,0.25,0.125\n0.5,1.5,2.5\n"))
    np.testing.assert_array_equal(loaded.values, [[1, 1, 2], [0.5, 0.25, 0.125], [0.5, 1.5, 2.5]])


def test_text_then_integer_names_above_floats_are_a_header(tmp_path: Path) -> None:
    path = write(tmp_path, "token.csv", "token,1,2,3,4\nthe,0.1,0.2,0.3,0.4\ncat,0.5,0.25,0.1,0.9\n")
    loaded = load_input(path)
    assert list(loaded.labels) == ["1", "2", "3", "4"] and list(loaded.row_names) == ["the", "cat"]
    np.testing.assert_array_equal(loaded.values, [[0.1, 0.2, 0.3, 0.4], [0.5, 0.25, 0.1, 0.9]])


def test_text_then_integers_above_integers_is_data(tmp_path: Path) -> None:
    path = write(tmp_path, "counts.csv", "token,1,2,3,4\nthe,5,3,1,0\ncat,0,2,7,1\n")
    loaded = load_input(path)
    assert list(loaded.row_names) == ["token", "the", "cat"]
    assert "read as data" in note_of(path)


def test_header_and_no_header_override_the_inference_silently(tmp_path: Path) -> None:
    toy = write(tmp_path, "toy.csv", "0,1,2,3\n1,2,3,0\n2,3,0,1\n")
    loaded = load_input(toy, header=True, index_col="none")
    assert list(loaded.labels) == ["0", "1", "2", "3"] and loaded.values.shape == (2, 4)
    assert "line 1" not in note_of(toy, "--header", "--index-col", "none")
    ids = tmp_path / "ids.csv"
    pd.DataFrame(X, columns=[5, 6, 7, 8]).to_csv(ids, index=False)
    assert load_input(str(ids), header=False).values.shape == (4, 4)
    assert "line 1" not in note_of(str(ids), "--no-header")


def test_header_option_is_for_csv_only(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--header apply to CSV/TSV only"):
        load_input(write(tmp_path, "a.json", "[1, 2]"), header=True)


# ---- row names: ids and positions --------------------------------------------------------------


@pytest.mark.parametrize(("name", "ids"), [("token_id", [5012, 77, 912]), ("pos", [1, 2, 3])])
def test_leading_unique_integers_beside_floats_are_row_names(tmp_path: Path, name: str, ids: list[int]) -> None:
    df = pd.DataFrame(X, columns=["e0", "e1", "e2", "e3"])
    df.insert(0, name, ids)
    path = tmp_path / "ids.csv"
    df.to_csv(path, index=False)
    loaded = load_input(str(path))
    np.testing.assert_array_equal(loaded.values, X)
    assert list(loaded.row_names) == [str(i) for i in ids] and list(loaded.labels) == ["e0", "e1", "e2", "e3"]
    note = note_of(str(path))
    assert f"row names from column '{name}' (unique integers beside non-integer scores: an id" in note
    assert load_input(str(path), index_col="none").values.shape == (3, 5)


@pytest.mark.parametrize("first", [[0, 1, 2, 3], [3, 1, 2, 0]], ids=["0..N-1", "unique"])
def test_a_column_named_like_its_neighbours_is_a_score(tmp_path: Path, first: list[int]) -> None:
    values = np.column_stack([first, np.round(RNG.normal(size=(4, 3)), 3)])
    path = tmp_path / "e.csv"
    pd.DataFrame(values, columns=["e0", "e1", "e2", "e3"]).astype({"e0": int}).to_csv(path, index=False)
    loaded = load_input(str(path))
    np.testing.assert_array_equal(loaded.values, values)
    assert list(loaded.labels) == ["e0", "e1", "e2", "e3"]


def test_router_batch_with_an_integer_expert_column_stays_a_batch(tmp_path: Path) -> None:
    path = write(tmp_path, "router.csv", "e0,e1\n0,0.7\n1,0.2\n2,0.5\n3,0.1\n")
    loaded = load_input(path)
    np.testing.assert_array_equal(loaded.values, [[0, 0.7], [1, 0.2], [2, 0.5], [3, 0.1]])
    assert list(loaded.labels) == ["e0", "e1"]


def test_id_and_score_is_still_one_labelled_vector(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "id.csv", "id,score\n17,0.5\n3,0.25\n99,1.5\n"))
    np.testing.assert_array_equal(loaded.values, [[0.5, 0.25, 1.5]])
    assert list(loaded.labels) == ["17", "3", "99"]


def test_an_id_named_column_among_integers_is_refused_as_ambiguous(tmp_path: Path) -> None:
    path = write(tmp_path, "amb.csv", "token_id,a,b,c\n101,3,1,2\n2023,0,5,1\n")
    line = error_of(path)
    assert "column 'token_id' holds unique integers" in line and "--index-col token_id" in line
    assert load_input(path, index_col="token_id").values.shape == (2, 3)
    assert load_input(path, index_col="none").values.shape == (2, 4)


def test_unique_integers_named_plainly_among_integers_are_scores(tmp_path: Path) -> None:
    loaded = load_input(write(tmp_path, "votes.csv", "x,a,b,c\n7,3,1,2\n4,0,5,1\n"))
    np.testing.assert_array_equal(loaded.values, [[7, 3, 1, 2], [4, 0, 5, 1]])


def test_an_id_beside_a_text_label_column_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, "lab.csv", "word,token_id,e0,e1,e2\nthe,101,0.5,0.25,0.1\ncat,2023,0.2,0.4,0.3\n")
    loaded = load_input(path)
    assert list(loaded.row_names) == ["the", "cat"] and list(loaded.labels) == ["e0", "e1", "e2"]
    assert "ignored column 'token_id' (unique integers: an id)" in note_of(path)


def test_pandas_default_index_beside_floats_is_row_names_beside_integers_scores(tmp_path: Path) -> None:
    floats = tmp_path / "f.csv"
    pd.DataFrame(X).to_csv(floats, header=False)
    assert load_input(str(floats)).values.shape == (3, 4)
    ints = write(tmp_path, "i.csv", "0,5,3\n1,2,7\n2,4,4\n")
    np.testing.assert_array_equal(load_input(ints).values, [[0, 5, 3], [1, 2, 7], [2, 4, 4]])


# ---- number-like text --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "cell", "cause"),
    [
        ("a,b\n\u22122.0,1.0\n\u22121.0,3.0\n", "'\u22122.0'", "Unicode minus sign (U+2212)"),
        ('label,score\n"1,000.5",2\n"2,000.5",3\n', "'1,000.5'", "thousands separator ','"),
        ("x,score\n1_000,2\n2_000,3\n", "'1_000'", "'_' digit grouping"),
        ("x,y\n1\u00a0000,2\n2\u00a0500,3\n", "'1\\xa0000'", "a space or apostrophe inside the number"),
        ("score\n1.5\n\u22122.5\n3.5\n", "'\u22122.5'", "Unicode minus sign"),
    ],
    ids=["minus", "thousands", "underscore", "nbsp", "one-cell-in-numbers"],
)
def test_number_like_text_is_refused_naming_the_cell(tmp_path: Path, content: str, cell: str, cause: str) -> None:
    line = error_of(write(tmp_path, "n.csv", content))
    where = "line 3, column 'score'" if content.startswith("score") else "line 2, column '"
    assert where in line and f"{cell} is not a number" in line and cause in line


def test_a_label_column_with_some_number_like_tokens_is_labels(tmp_path: Path) -> None:
    path = write(tmp_path, "vocab.csv", 'token,score\n\u2212,0.5\n"1,000",1.5\ncat,2.5\n')
    loaded = load_input(path)
    assert list(loaded.labels) == ["\u2212", "1,000", "cat"]
    np.testing.assert_array_equal(loaded.values, [[0.5, 1.5, 2.5]])


# ---- wide rows: parsed in bulk -----------------------------------------------------------------


def test_a_wide_row_is_parsed_without_one_object_per_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from topk_cli.inputs import csvfile, table

    calls = {"n": 0}
    real = getattr(table, "classify", None) or getattr(table, "_classify")

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return real(*args, **kwargs)

    for module, name in ((csvfile, "classify"), (table, "classify"), (table, "_classify")):  # before: _classify
        monkeypatch.setattr(module, name, counting, raising=False)
    x = RNG.normal(size=5000)
    path = tmp_path / "wide.csv"
    pd.DataFrame(x.reshape(1, -1), columns=[f"tok_{i}" for i in range(5000)]).to_csv(path, index=False)
    loaded = load_input(str(path))
    np.testing.assert_array_equal(loaded.values, x.reshape(1, -1))
    assert loaded.labels[4999] == "tok_4999"
    assert calls["n"] < 10, calls


def test_a_wide_row_with_a_text_name_keeps_it(tmp_path: Path) -> None:
    x = RNG.normal(size=3000)
    path = write(tmp_path, "named.csv", "sample_7," + ",".join(repr(float(v)) for v in x) + "\n")
    loaded = load_input(path)
    np.testing.assert_array_equal(loaded.values, x.reshape(1, -1))
    assert list(loaded.row_names) == ["sample_7"]


def test_a_bad_cell_far_down_a_tall_file_is_named(tmp_path: Path) -> None:
    rows = [f"{i},{i * 0.5 + 0.25}" for i in range(40_000)]
    rows[35_000] = "35000,NaN"
    path = write(tmp_path, "tall.csv", "id,score\n" + "\n".join(rows) + "\n")
    line = error_of(path)
    assert "line 35002" in line and "column 'score'" in line and "NaN" in line


def test_inspect_records_the_csv_decisions(tmp_path) -> None:
    # inspect shows the reader's decisions field by field, not "not recorded"
    from conftest import run_cli

    path = tmp_path / "ids.csv"
    path.write_text("token_id,e0,e1,e2\n101,0.5,1.5,-0.2\n2023,0.1,0.3,2.2\n7,1.0,0.0,0.25\n")
    doc = run_cli("inspect", "--format", "json", path).json()
    assert (doc["separator"], doc["decimal"], doc["header"]) == (",", ".", True)
    assert doc["row_names_from"].startswith("column 'token_id'")
    assert doc["labels_from"] == "the header"
    path = tmp_path / "lab.csv"
    path.write_text("word;score;flag\nthe;0,5;true\ncat;1,5;false\nsat;0,2;true\n")
    doc = run_cli("inspect", "--format", "json", path).json()
    assert (doc["separator"], doc["decimal"], doc["header"]) == (";", ",", True)
    assert doc["labels_from"] == "column 'word'"
    assert doc["ignored"] == ["column 'flag'"]
    assert doc["row_names_from"] == "the name of column 'score'"


def test_np_savetxt_default_txt_file_is_read(tmp_path) -> None:
    # np.savetxt("f.txt", x): a .txt name and runs of spaces; the suffix used to be refused
    x = np.random.default_rng(0).normal(size=(3, 4))
    np.savetxt(tmp_path / "f.txt", x)
    loaded = load_input(str(tmp_path / "f.txt"))
    np.testing.assert_array_equal(loaded.values, x)
    assert any("runs of spaces" in note for note in loaded.notes)
