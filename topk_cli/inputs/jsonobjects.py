"""JSON objects: ``{label: number}``, ``{name: [...]}`` and the objects pandas writes.

Which way the keys run is decided here (see :mod:`topk_cli.inputs.jsonfile` for the rule);
``orient`` is ``--orient`` (``rows``, ``columns`` or None: inferred, announced, or refused as
ambiguous).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from topk_cli.errors import InputError
from topk_cli.inputs.jsonparts import (
    SHAPE_HELP,
    Where,
    is_text,
    no_orient,
    read_batch,
    read_cells,
    read_records,
    read_vector,
    with_note,
)
from topk_cli.inputs.model import LoadedInput, with_decisions


def from_object(
    doc: dict[str, Any], where: Where, column: str | None, index_col: str | None, orient: str | None
) -> LoadedInput:
    """Read one JSON object: pandas' split/table orients, objects of objects or of lists, {label: number}."""
    source = where.source
    if not doc:
        raise InputError(f"{source}: the object is empty ({SHAPE_HELP})")
    values = list(doc.values())
    if _is_split(doc):
        no_orient(where, orient, "pandas orient='split'")
        return _split(doc, where, column, index_col)
    if _is_series_split(doc):
        no_orient(where, orient, "pandas orient='split' of a Series")
        if column is not None:
            raise InputError(f"{source}: --column applies to CSV columns and JSON tables (this is one Series)")
        labels = [str(key) for key in doc["index"]]
        loaded = read_vector(doc["data"], where, labels, place=lambda c: f"'data'[{c}] (index {labels[c]!r})")
        return with_decisions(loaded, shape="pandas orient='split' of a Series", labels_from="'index'")
    if _is_table(doc):
        no_orient(where, orient, "pandas orient='table'")
        return _table_orient(doc, where, column, index_col)
    if all(isinstance(v, dict) for v in values):
        return _nested(doc, where, column, index_col, orient)
    if all(isinstance(v, list) for v in values):
        return _keyed_lists(doc, where, column, index_col, orient)
    if any(isinstance(v, (list, dict)) for v in values):
        raise InputError(f"{source}: the object mixes numbers, lists and objects; {SHAPE_HELP}")
    no_orient(where, orient, "an object {label: number} (one vector)")
    if column is not None:
        raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
    keys = tuple(doc)
    loaded = read_vector(values, where, keys, place=lambda c: f"key {keys[c]!r}")
    return with_decisions(loaded, shape="object {label: number}", labels_from="the keys")


def _keyed_lists(
    doc: dict[str, Any], where: Where, column: str | None, index_col: str | None, orient: str | None
) -> LoadedInput:
    """``{name: [...]}``: each key one vector (the hand-written shape), or one column of a table."""
    source = where.source
    keys = list(doc)
    values = list(doc.values())
    if len(doc) == 1 and values[0] and all(isinstance(v, dict) for v in values[0]) and orient is None:
        key = keys[0]  # {"data": [records]}, as web APIs answer
        loaded = read_records(values[0], Where(source, where.fmt, where.lines, prefix=f"key {key!r}, "), column, index_col)
        return with_decisions(loaded, shape=f"records under key {key!r}")
    if len(doc) == 1 and values[0] and all(isinstance(v, list) for v in values[0]) and orient is None:
        if column is not None:
            raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
        key = keys[0]
        loaded = read_batch(values[0], where, lambda r: f"key {key!r}, [{r}]", lambda r, c: f"key {key!r}, [{r}][{c}]")
        return with_decisions(loaded, shape=f"a batch under key {key!r}")
    given = orient is not None
    why = "--orient columns" if orient == "columns" else ""
    if orient is None:
        text = next((k for k, v in doc.items() if v and any(is_text(item) for item in v)
                     and all(is_text(item) or item is None for item in v)), None)
        if text is not None and len(doc) > 1:
            orient, why = "columns", f"key {text!r} holds text, a column of names"
        elif column is not None:
            orient, why = "columns", "--column"
        else:
            orient = "rows"
    if orient == "columns":
        length = len(values[0])
        for name, col in doc.items():
            if len(col) != length:
                raise InputError(f"{source}: key {name!r} has {len(col)} values, key {keys[0]!r} has {length}")
        if length == 0:
            raise InputError(f"{source}: the columns are empty; {SHAPE_HELP}")
        rows = [[doc[name][r] for name in keys] for r in range(length)]
        note = f"read the keys as columns ({why})"

        def place(r: int, c: int) -> str:
            return f"key {keys[c]!r}, [{r}]"

        loaded = read_cells(where, keys, rows, lambda r: f"[{r}]", place, column, index_col, (note,))
        return with_decisions(loaded, shape="object of columns {column: [values]}", orientation="columns")
    if column is not None:
        raise InputError(f"{source}: --column applies to the keys of an object read as columns (pass --orient columns)")
    if index_col is not None:
        raise InputError(f"{source}: --index-col applies to tables; here each key names one vector")
    loaded = read_batch(values, where, lambda r: f"key {keys[r]!r}", lambda r, c: f"key {keys[r]!r}, entry [{c}]",
                    names=keys, names_from="the keys")
    rows_read, n = loaded.values.shape
    if len(doc) > 1 and rows_read > 1:
        told = "--orient rows" if given else "pass --orient columns if the keys name columns"
        note = f"read each key as one vector ({rows_read} vectors of {n} entries; {told})"
        loaded = with_note(loaded, note)
    return with_decisions(loaded, shape="object of vectors {name: [numbers]}", orientation="rows")


def _is_split(doc: dict[str, Any]) -> bool:
    return (
        set(doc) >= {"columns", "data"} and set(doc) <= {"columns", "index", "data", "name"}
        and isinstance(doc["columns"], list) and isinstance(doc["data"], list)
        and all(isinstance(row, list) for row in doc["data"])
    )


def _is_series_split(doc: dict[str, Any]) -> bool:
    return (
        set(doc) >= {"index", "data"} and set(doc) <= {"index", "data", "name"}
        and isinstance(doc["index"], list) and isinstance(doc["data"], list) and len(doc["index"]) == len(doc["data"])
        and bool(doc["data"]) and not any(isinstance(item, (list, dict)) for item in doc["data"])
        and not isinstance(doc.get("name", ""), (list, dict))
    )


def _is_table(doc: dict[str, Any]) -> bool:
    schema = doc.get("schema")
    return (
        set(doc) == {"schema", "data"} and isinstance(schema, dict) and isinstance(schema.get("fields"), list)
        and isinstance(doc["data"], list) and all(isinstance(row, dict) for row in doc["data"])
    )


def _range_keys(keys: Sequence[str]) -> bool:
    return list(keys) == [str(i) for i in range(len(keys))]


def _nested(
    doc: dict[str, Any], where: Where, column: str | None, index_col: str | None, orient: str | None
) -> LoadedInput:
    """An object of objects: pandas' orient='columns' ({column: {row: v}}) or orient='index'."""
    source = where.source
    outer = list(doc)
    inner = list(doc[outer[0]])
    for name, item in doc.items():
        if list(item) != inner and set(item) != set(inner):
            raise InputError(f"{source}: key {name!r} has other inner keys than key {outer[0]!r}")
    if not inner:
        raise InputError(f"{source}: key {outer[0]!r} is an empty object; {SHAPE_HELP}")
    why = f"--orient {orient}" if orient is not None else ""
    if orient is None:
        if len(outer) == 1 or len(inner) == 1:
            orient = "columns"  # one vector whichever way it is read
        elif _range_keys(inner) and not _range_keys(outer):
            orient, why = "columns", f"pandas orient='columns': the inner keys are its default index 0..{len(inner) - 1}"
        elif _range_keys(outer) and not _range_keys(inner):
            # outer keys 0..N-1 are pandas' default index under orient='index', and just as often its
            # default column names under its default orient (a frame of unnamed columns with named rows)
            raise InputError(
                f"{source}: the outer keys are 0..{len(outer) - 1}: pandas' default index (orient='index') or its "
                "default column names (orient='columns', named rows) alike; pass --orient rows (each outer key one "
                "vector) or --orient columns (each outer key one column)"
            )
        else:
            raise InputError(
                f"{source}: cannot tell whether the outer keys of this object of objects name vectors or columns "
                "(pandas writes orient='columns' and orient='index' alike); pass --orient rows (each outer key "
                "one vector) or --orient columns (each outer key one column, pandas' default)"
            )
    if orient == "columns":
        note = "read the outer keys as columns, the inner keys as rows" + (f" ({why})" if why else "")
        rows = [[doc[name][key] for name in outer] for key in inner]
        loaded = _with_index(where, outer, rows, inner, column, index_col, note,
                             lambda r, c: f"[{json.dumps(outer[c])}][{json.dumps(inner[r])}]")
    else:
        note = f"read each outer key as one vector, the inner keys as entries ({why})"
        rows = [[doc[name][key] for key in inner] for name in outer]
        loaded = _with_index(where, inner, rows, outer, column, index_col, note,
                             lambda r, c: f"[{json.dumps(outer[r])}][{json.dumps(inner[c])}]")
    return with_decisions(loaded, shape="object of objects", orientation=orient)


def _with_index(
    where: Where, names: list[str], rows: list[list[Any]], index: list[Any], column: str | None,
    index_col: str | None, note: str, place: Callable[[int, int], str],
) -> LoadedInput:
    """A table whose rows are named by ``index`` (pandas' index), unless it is 0..N-1."""
    def row_place(r: int) -> str:
        return f"row key {json.dumps(index[r])}"

    if [str(key) for key in index] == [str(i) for i in range(len(index))] or index_col is not None:
        return read_cells(where, names, rows, row_place, place, column, index_col, (note,))
    if "" in names:
        raise InputError(f"{where.source}: a column has an empty name")
    full = ["", *names]

    def shifted(r: int, c: int) -> str:
        return f"row key {json.dumps(index[r])}" if c == 0 else place(r, c - 1)

    return read_cells(where, full, [[key, *row] for key, row in zip(index, rows, strict=True)], row_place, shifted,
                  column, None, (note,))


def _split(doc: dict[str, Any], where: Where, column: str | None, index_col: str | None) -> LoadedInput:
    source = where.source
    names = [str(n) for n in doc["columns"]]
    data = doc["data"]
    seen: dict[str, int] = {}
    for c, name in enumerate(names):
        if name in seen:
            raise InputError(f"{source}: orient='split': duplicate column name {name!r} "
                             f"('columns'[{seen[name]}] and [{c}])")
        seen[name] = c
    for r, row in enumerate(data):
        if len(row) != len(names):
            raise InputError(f"{source}: 'data'[{r}] has {len(row)} values, 'columns' has {len(names)}")
    if not data:
        raise InputError(f"{source}: orient='split' with no data rows")
    index = doc.get("index", list(range(len(data))))
    if not isinstance(index, list) or len(index) != len(data):
        raise InputError(f"{source}: 'index' must list one name per data row")
    loaded = _with_index(where, names, data, index, column, index_col, "read as pandas orient='split'",
                         lambda r, c: f"'data'[{r}][{c}] (column {names[c]!r})")
    return with_decisions(loaded, shape="pandas orient='split'")


def _table_orient(doc: dict[str, Any], where: Where, column: str | None, index_col: str | None) -> LoadedInput:
    """pandas' orient='table': records under 'data', described by 'schema' (primaryKey = index)."""
    source = where.source
    schema = doc["schema"]
    names = [str(field.get("name")) if isinstance(field, dict) else "" for field in schema["fields"]]
    if "" in names or len(set(names)) != len(names):
        raise InputError(f"{source}: orient='table': 'schema' needs one distinct name per field")
    data = doc["data"]
    if not data:
        raise InputError(f"{source}: orient='table' with no data rows")
    for r, record in enumerate(data):
        if set(record) != set(names):
            raise InputError(f"{source}: 'data'[{r}] has keys other than the schema's fields")
    key = schema.get("primaryKey")
    if index_col is None and isinstance(key, list) and len(key) == 1 and key[0] in names:
        index_col = str(key[0])
    rows = [[record[name] for name in names] for record in data]
    loaded = read_cells(where, names, rows, lambda r: f"'data'[{r}]",
                    lambda r, c: f"'data'[{r}], key {names[c]!r}", column, index_col,
                    ("read as pandas orient='table'" + (f" (index: {index_col!r})" if index_col else ""),))
    return with_decisions(loaded, shape="pandas orient='table'")
