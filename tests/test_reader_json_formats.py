"""JSON shapes, file formats and ``softtopk inspect``: each file read right, or refused in one line.

The JSON orientation rule comes from the shapes pandas writes (``DataFrame.to_json`` orients
columns, index, records, split, values, table) and from what people write by hand
(``json.dump({token: logits.tolist()})``). Each orient has a pair of cases: the file that
motivates the rule and one that looks like it but must be read otherwise.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from topk_cli.errors import InputError
from topk_cli.inputs import load_input

SCORES = np.round(np.random.default_rng(3).normal(size=(4, 5)), 3)
EXPERTS = [f"e{i}" for i in range(5)]
TOKENS = ["The", "cat", "sat", "down"]


def frame(index: list[str] | None = None) -> pd.DataFrame:
    return pd.DataFrame(SCORES.copy(), columns=EXPERTS, index=index)


def read(path: Path, **options: str) -> tuple[np.ndarray, list[str], list[str], tuple[str, ...]]:
    loaded = load_input(str(path), **options)
    return loaded.values, list(loaded.labels), list(loaded.row_names), loaded.notes


def refused(path: Path, **options: str) -> str:
    with pytest.raises(InputError) as info:
        load_input(str(path), **options)
    message = str(info.value)
    assert "\n" not in message
    return message


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("softtopk: note:")]


# ---- {name: [numbers]}: the hand-written shape ---------------------------------------------


def test_object_of_lists_reads_each_key_as_one_vector(tmp_path: Path) -> None:
    path = tmp_path / "logits.json"
    path.write_text(json.dumps(dict(zip(TOKENS, SCORES.tolist(), strict=True))))
    values, labels, rows, told = read(path)
    np.testing.assert_array_equal(values, SCORES)  # not transposed: one vector per token
    assert rows == TOKENS and labels == ["0", "1", "2", "3", "4"]
    assert len(told) == 1 and "read each key as one vector (4 vectors of 5 entries" in told[0]
    assert "--orient columns" in told[0]
    code, out, err = run_cli("compute", "-m", "hard", "-k", "1", "--format", "json", str(path))
    assert code == 0, err
    np.testing.assert_array_equal(np.argmax(json.loads(out)["hard"], axis=1), SCORES.argmax(axis=1))
    assert len(notes(err)) == 1 and "read each key as one vector" in err


def test_object_of_lists_with_a_text_key_is_a_table_of_columns(tmp_path: Path) -> None:
    # json.dump(df.to_dict("list")): keyed by column; the text column cannot be a vector of scores
    df = frame()
    df.insert(0, "token", TOKENS)
    path = tmp_path / "to_dict.json"
    path.write_text(json.dumps(df.to_dict("list")))
    values, labels, rows, told = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS and rows == TOKENS
    assert "read the keys as columns (key 'token' holds text" in told[0]


def test_orient_columns_reads_an_all_number_object_of_lists_as_columns(tmp_path: Path) -> None:
    path = tmp_path / "cols.json"
    path.write_text(json.dumps(frame().to_dict("list")))
    values, _, rows, _ = read(path)
    np.testing.assert_array_equal(values, SCORES.T)
    assert rows == EXPERTS  # by default: each key one vector (announced)
    values, labels, _, told = read(path, orient="columns")
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS and "--orient columns" in told[0]
    code, out, err = run_cli("compute", "-k", "2", "--orient", "columns", "--format", "json", str(path))
    assert code == 0 and json.loads(out)["rows"] == 4, err


def test_object_of_lists_keeps_the_single_key_batch_and_labelled_vector(tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"logits": SCORES.tolist()}))
    values, _, _, told = read(one)
    np.testing.assert_array_equal(values, SCORES)
    assert told == ()  # nothing inferred: the one key holds the batch
    column = tmp_path / "column.json"
    column.write_text(json.dumps({"a": [1.0], "b": [3.0], "c": [2.0]}))  # one entry per key: one vector
    values, labels, _, _ = read(column)
    np.testing.assert_array_equal(values, [[1.0, 3.0, 2.0]])
    assert labels == ["a", "b", "c"]
    ragged = tmp_path / "ragged.json"
    ragged.write_text(json.dumps({"a": [1, 2], "b": [3]}))
    assert "key 'b' has 1 entries, key 'a' has 2" in refused(ragged)


# ---- pandas orient='columns' and orient='index' (objects of objects) -----------------------


def test_orient_columns_with_pandas_default_index(tmp_path: Path) -> None:
    path = tmp_path / "columns.json"
    frame().to_json(path)  # {"e0": {"0": ..., "1": ...}, ...}
    values, labels, _, told = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS and "pandas orient='columns'" in told[0]


def test_outer_keys_0_to_n_are_refused_as_ambiguous(tmp_path: Path) -> None:
    # {"0": {"e0": ...}} is orient='index' of a frame with pandas' default index ...
    index_path = tmp_path / "index.json"
    frame().to_json(index_path, orient="index")
    # ... and, just as well, the default orient of a frame with named rows and default column names:
    # {"0": {"The": ...}} (a guess either way transposes one of them)
    columns_path = tmp_path / "columns.json"
    pd.DataFrame(SCORES.copy(), index=TOKENS).to_json(columns_path)
    for path in (index_path, columns_path):
        message = refused(path)
        assert "the outer keys are 0.." in message and "--orient rows" in message and "--orient columns" in message
    values, labels, _, _ = read(index_path, orient="rows")
    np.testing.assert_array_equal(values, SCORES)  # was read transposed: 5 vectors of 4 entries
    assert labels == EXPERTS
    values, labels, rows, _ = read(columns_path, orient="columns")
    np.testing.assert_array_equal(values, SCORES)
    assert rows == TOKENS and labels == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("orient", ["columns", "index"])
def test_object_of_objects_with_named_rows_and_columns_is_refused_as_ambiguous(tmp_path: Path, orient: str) -> None:
    path = tmp_path / f"{orient}.json"
    frame(TOKENS).to_json(path, orient=orient)
    message = refused(path)
    assert "cannot tell whether the outer keys" in message and "--orient rows" in message
    code, out, err = run_cli("compute", "-k", "2", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and "--orient columns" in err
    # the user says which: read exactly
    values, labels, rows, _ = read(path, orient="columns" if orient == "columns" else "rows")
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS and rows == TOKENS
    values, _, _, _ = read(path, orient="rows" if orient == "columns" else "columns")
    np.testing.assert_array_equal(values, SCORES.T)


def test_hand_written_object_of_objects_needs_orient(tmp_path: Path) -> None:
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({t: dict(zip(EXPERTS, row, strict=True)) for t, row in zip(TOKENS, SCORES.tolist(), strict=True)}))
    assert "--orient" in refused(path)
    values, labels, rows, told = read(path, orient="rows")
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS and rows == TOKENS and "read each outer key as one vector" in told[0]


# ---- records, split, values, table ---------------------------------------------------------


def test_orient_records_is_a_table(tmp_path: Path) -> None:
    path = tmp_path / "records.json"
    frame().to_json(path, orient="records")
    values, labels, _, _ = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS


def test_records_holding_a_list_read_the_list_as_the_vector(tmp_path: Path) -> None:
    path = tmp_path / "records.json"
    path.write_text(json.dumps([{"token": t, "logits": row} for t, row in zip(TOKENS, SCORES.tolist(), strict=True)]))
    values, _, rows, told = read(path)
    np.testing.assert_array_equal(values, SCORES)  # was: "a cell holds a list or an object"
    assert rows == TOKENS and "list under key 'logits'" in told[0] and "row names from key 'token'" in told[0]


def test_orient_split_is_a_table(tmp_path: Path) -> None:
    path = tmp_path / "split.json"
    frame(TOKENS).to_json(path, orient="split")
    values, labels, rows, _ = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS and rows == TOKENS


def test_orient_split_with_duplicate_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    df = pd.DataFrame([[1.0, 2.0, 3.0]], columns=["a", "a", "b"])
    df.to_json(path, orient="split")
    message = refused(path)  # was read as 1 vector from one 'a', the other 'a' taken as labels
    assert "duplicate column name 'a'" in message and "[0] and [1]" in message


def test_hand_written_columns_and_data_keys_are_not_split(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"columns": [3, 1, 2], "data": [0, 5, 4]}))
    values, _, rows, _ = read(path)
    np.testing.assert_array_equal(values, [[3, 1, 2], [0, 5, 4]])
    assert rows == ["columns", "data"]


def test_orient_values_is_a_batch(tmp_path: Path) -> None:
    path = tmp_path / "values.json"
    frame().to_json(path, orient="values")
    values, _, rows, told = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert rows == ["0", "1", "2", "3"] and told == ()


def test_orient_values_with_a_text_column_names_the_rows(tmp_path: Path) -> None:
    df = frame()
    df.insert(0, "token", TOKENS)
    path = tmp_path / "values.json"
    df.to_json(path, orient="values")
    values, _, rows, told = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert rows == TOKENS and "row names from the first entry" in told[0]


@pytest.mark.parametrize("index", [None, TOKENS], ids=["default-index", "named-index"])
def test_orient_table_is_a_table_named_by_its_primary_key(tmp_path: Path, index: list[str] | None) -> None:
    path = tmp_path / "table.json"
    frame(index).to_json(path, orient="table")
    values, labels, rows, told = read(path)
    np.testing.assert_array_equal(values, SCORES)  # was: "the object mixes numbers, lists and objects"
    assert labels == EXPERTS and rows == (index or ["0", "1", "2", "3"])
    assert "orient='table'" in told[0]


def test_hand_written_schema_and_data_keys_are_not_a_table(tmp_path: Path) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"schema": [1, 2], "data": [3, 4]}))
    values, _, rows, _ = read(path)
    np.testing.assert_array_equal(values, [[1, 2], [3, 4]])
    assert rows == ["schema", "data"]


def test_orient_is_refused_where_it_does_not_apply(tmp_path: Path) -> None:
    lists = tmp_path / "lists.json"
    lists.write_text("[[1, 2], [3, 4]]")
    assert "--orient applies to a JSON object" in refused(lists, orient="columns")  # never a silent no-op
    csv = tmp_path / "a.csv"
    csv.write_text("a,b\n1,2\n")
    assert "--orient applies to JSON objects only (this input is csv)" in refused(csv, orient="rows")
    assert "unknown --orient 'index'" in refused(lists, orient="index")


# ---- null, -1e400 --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "place"),
    [
        ("v.json", "[1, null, 3]", ": [1]: null"),
        ("b.json", "[[1, 2], [3, null]]", ": [1][1]: null"),
        ("o.json", '{"a": 1, "b": null}', ": key 'b': null"),
        ("r.json", '[{"a": 1, "b": 2}, {"a": null, "b": 4}]', "record [1], key 'a': 'null'"),
        ("l.jsonl", "[1, 2]\n[3, null]\n", ": line 2, entry [1]: null"),
        ("n.jsonl", "1\n\nnull\n", ": line 3: null"),
    ],
)
def test_null_is_named_null_with_its_place(tmp_path: Path, name: str, content: str, place: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    message = refused(path)
    assert place in message and "NaN" not in message, message


def test_null_cannot_name_a_row(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"name": "a", "x": 1, "y": 2}, {"name": None, "x": 3, "y": 4}]))
    assert "record [1], key 'name': null is not allowed as a name" in refused(path)


def test_a_negative_overflow_string_is_not_a_mask(tmp_path: Path) -> None:
    path = tmp_path / "v.json"
    path.write_text('[1, "-1e400", "-inf"]')
    assert "[1]: '-1e400' is beyond the float64 range" in refused(path)  # was read as -inf (a mask)


# ---- JSON Lines of records holding a list --------------------------------------------------


def test_jsonl_records_with_a_list_as_polars_and_jq_write_them(tmp_path: Path) -> None:
    path = tmp_path / "logits.jsonl"
    path.write_text("".join(json.dumps({"id": i, "logits": row}) + "\n" for i, row in enumerate(SCORES.tolist())))
    values, _, rows, told = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert rows == ["0", "1", "2", "3"] and "row names from key 'id'" in told[0]
    text = tmp_path / "tokens.ndjson"
    text.write_text("".join(json.dumps({"logits": row, "token": t, "score": 0.5}) + "\n"
                            for t, row in zip(TOKENS, SCORES.tolist(), strict=True)))
    values, _, rows, told = read(text)
    np.testing.assert_array_equal(values, SCORES)
    assert rows == TOKENS and "ignored key 'score'" in told[0]
    code, out, err = run_cli("compute", "-k", "2", "--format", "json", str(path))
    assert code == 0 and json.loads(out)["rows"] == 4, err


def test_jsonl_records_with_two_lists_need_column(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    path.write_text('{"a": [1, 2], "b": [3, 4]}\n{"a": [5, 6], "b": [7, 8]}\n')
    assert "several lists (keys 'a', 'b'); pass --column NAME" in refused(path)
    values, _, _, _ = read(path, column="b")
    np.testing.assert_array_equal(values, [[3, 4], [7, 8]])
    ragged = tmp_path / "ragged.jsonl"
    ragged.write_text('{"id": 0, "x": [1, 2]}\n{"id": 1, "x": [3]}\n')
    assert "line 2, key 'x' has 1 entries, line 1, key 'x' has 2" in refused(ragged)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 0, "x": [1, 2]}\n{"id": 1, "x": [3, "a"]}\n')
    assert "line 2, key 'x', entry [1]: 'a' is not a number" in refused(bad)


# ---- formats: unsupported, npz, gzip -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("data.parquet", "pd.read_parquet("),
        ("data.xlsx", "pd.read_excel("),
        ("data.pkl", "pd.read_pickle("),
        ("data.feather", "pd.read_feather("),
    ],
)
def test_unsupported_formats_say_how_to_convert(tmp_path: Path, name: str, needle: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"PAR1\x00\x01")
    code, out, err = run_cli("compute", "-k", "1", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "files are not supported" in err and "to CSV first, e.g. python -c" in err and needle in err
    assert "rename it" not in err


def test_npz_with_one_array_is_read_and_with_several_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "one.npz", SCORES)
    values, _, _, _ = read(tmp_path / "one.npz")
    np.testing.assert_array_equal(values, SCORES)
    np.savez_compressed(tmp_path / "two.npz", logits=SCORES, mask=SCORES > 0)
    message = refused(tmp_path / "two.npz")
    assert "an .npz archive of 2 arrays ('logits', 'mask')" in message and "np.save(" in message


@pytest.mark.parametrize("suffix", ["csv", "tsv", "json", "jsonl", "npy"])
def test_gzip_files_are_read_as_their_inner_format(tmp_path: Path, suffix: str) -> None:
    plain = tmp_path / f"f.{suffix}"
    if suffix == "npy":
        np.save(plain, SCORES)
    elif suffix == "jsonl":
        frame().to_json(plain, orient="records", lines=True)
    elif suffix == "json":
        frame().to_json(plain, orient="split")
    else:
        frame().to_csv(plain, sep="\t" if suffix == "tsv" else ",")
    packed = tmp_path / f"f.{suffix}.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_input(str(plain)), load_input(str(packed))
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(b.values, SCORES)
    assert list(a.labels) == list(b.labels) and a.notes == b.notes
    assert b.decisions.compression == "gzip" and a.decisions.compression is None


def test_gzip_on_stdin_and_a_false_gz_name(tmp_path: Path) -> None:
    code, out, err = run_cli("compute", "-k", "1", "--format", "json", "-", input=gzip.compress(b"[3, 1, 2]"))
    assert code == 0 and json.loads(out)["n"] == 3, err
    fake = tmp_path / "f.csv.gz"
    fake.write_text("a,b\n1,2\n")
    assert "not gzip data" in refused(fake)


# ---- FIFOs ---------------------------------------------------------------------------------


def _in_thread(target, timeout: float = 20.0):
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = target()
        except BaseException as exc:  # reported by the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return thread, box


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_without_suffix_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread, box = _in_thread(lambda: run_cli("compute", "-k", "1", str(fifo)))
    if thread.is_alive():  # blocked in open(): unblock it, then fail
        with open(fifo, "wb") as writer:
            writer.write(b"1,2\n")
        thread.join(10)
        pytest.fail("the reader opened a FIFO whose format it cannot tell (it blocked waiting for a writer)")
    code, out, err = box["value"]  # type: ignore[misc]
    assert code == 2 and out == "" and "cannot tell the format from no suffix" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_with_a_known_suffix_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as writer:
            writer.write(b"label,score\na,3\nb,1\nc,2\n")

    writer, _ = _in_thread(write, timeout=0)
    thread, box = _in_thread(lambda: load_input(str(fifo)))
    writer.join(10)
    assert not thread.is_alive() and "error" not in box, box
    np.testing.assert_array_equal(box["value"].values, [[3, 1, 2]])  # type: ignore[attr-defined]


# ---- softtopk inspect ----------------------------------------------------------------------


def test_inspect_shows_what_was_read(tmp_path: Path) -> None:
    path = tmp_path / "logits.json"
    path.write_text(json.dumps(dict(zip(TOKENS, SCORES.tolist(), strict=True))))
    code, out, err = run_cli("inspect", "--rows", "2", str(path))
    assert code == 0 and err == "", err
    for needle in ("json", "4 vectors of 5 entries (4 x 5)", "object of vectors", "rows: each key one vector",
                   "row names", "the keys", "read each key as one vector", "first 2 of 4 vectors as read", "The", "cat"):
        assert needle in out, (needle, out)
    assert "sat" not in out  # only the first 2 rows
    assert f"{SCORES[0, 0]:.3f}".rstrip("0") in out


def test_inspect_json_document(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"token": t, "logits": row}) + "\n"
                            for t, row in zip(TOKENS, SCORES.tolist(), strict=True)))
    code, out, err = run_cli("inspect", "--format", "json", str(path))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "jsonl" and (doc["rows"], doc["n"]) == (4, 5)
    assert doc["row_names_from"] == "key 'token'" and doc["notes"] and doc["layout"].startswith("records with a list")
    assert [row["name"] for row in doc["head"]] == TOKENS
    assert doc["head"][1]["values"] == SCORES[1].tolist()  # exact, not rounded


def test_inspect_masked_gzip_csv_and_csv_output(tmp_path: Path) -> None:
    path = tmp_path / "s.csv.gz"
    path.write_bytes(gzip.compress(b"label,score\na,3\nb,-inf\nc,2\n"))
    code, out, err = run_cli("inspect", str(path))
    assert code == 0, err
    assert "csv (gzip)" in out and "1 vector of 3 entries" in out and "1 masked (-inf)" in out
    code, out, _ = run_cli("inspect", "--format", "csv", str(path))
    assert code == 0 and out.splitlines()[0] == "row,row_name,entry,label,value" and "b,-inf" in out
    code, out, _ = run_cli("inspect", "--format", "json", str(path))
    assert json.loads(out)["head"][0]["values"] == [3.0, "-inf", 2.0] and json.loads(out)["compression"] == "gzip"


@pytest.mark.parametrize("args", [["missing.csv"], ["bad.json"], ["--rows", "-1", "ok.json"], ["--orient", "rows", "ok.csv"]])
def test_inspect_unreadable_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "bad.json").write_text("[1, 2,")
    (tmp_path / "ok.json").write_text("[1, 2]")
    (tmp_path / "ok.csv").write_text("a,b\n1,2\n")
    *options, name = args
    code, out, err = run_cli("inspect", *options, str(tmp_path / name))
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("softtopk: error:"), err
    assert (name in err) != (options == ["--rows", "-1"]), err  # the file is named, or the bad option is


def test_inspect_passes_orient(tmp_path: Path) -> None:
    path = tmp_path / "nested.json"
    frame(TOKENS).to_json(path, orient="index")
    code, _, err = run_cli("inspect", str(path))
    assert code == 2 and "--orient" in err
    code, out, err = run_cli("inspect", "--orient", "rows", "--format", "json", str(path))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["orientation"] == "rows" and doc["labels"] == EXPERTS and doc["head"][0]["name"] == "The"


def test_series_orients_are_one_labelled_vector(tmp_path: Path) -> None:
    series = pd.Series([0.3, 0.1, 0.5], index=["a", "b", "c"], name="score")
    for orient in ("split", "index", "table"):
        path = tmp_path / f"{orient}.json"
        series.to_json(path, orient=orient)
        values, labels, _, _ = read(path)
        np.testing.assert_array_equal(values, [[0.3, 0.1, 0.5]])
        assert labels == ["a", "b", "c"], orient


def test_records_under_one_key_are_a_table(tmp_path: Path) -> None:
    path = tmp_path / "api.json"
    path.write_text(json.dumps({"data": frame().to_dict("records")}))  # as web APIs answer
    values, labels, _, _ = read(path)
    np.testing.assert_array_equal(values, SCORES)
    assert labels == EXPERTS
    path.write_text(json.dumps({"data": [{"a": 1, "b": 2}, {"a": 3}]}))
    assert "key 'data', record [1] lacks key 'b'" in refused(path)


def test_object_of_objects_with_both_levels_numbered_is_ambiguous(tmp_path: Path) -> None:
    path = tmp_path / "plain.json"
    pd.DataFrame(SCORES.copy()).to_json(path)  # {"0": {"0": ...}}: rows and columns both 0..N-1
    assert "--orient rows" in refused(path)
    values, _, _, _ = read(path, orient="columns")
    np.testing.assert_array_equal(values, SCORES)


def test_a_list_in_a_table_cell_is_named(tmp_path: Path) -> None:
    path = tmp_path / "cell.json"
    path.write_text(json.dumps({"a": {"x": 1, "y": [2]}, "b": {"x": 3, "y": 4}}))
    assert '["a"]["y"]: a list in a table cell' in refused(path, orient="rows")
