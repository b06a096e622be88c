"""JSON and JSON Lines, in the shapes numpy, pandas and jq write.

Vectors: a list of numbers (one vector), a list of equal-length lists (a batch), an object
``{label: number}`` (one labelled vector, e.g. ``Series.to_json()``), an object with one key
holding either of the list forms (``{"logits": [[...], ...]}``). Tables, read by the layout rule
of :mod:`topk_cli.inputs.table`: a list of records (``orient="records"``), an object of columns
(``orient="columns"``, pandas' default: ``{column: {row: value}}``, or ``{column: [values]}``),
``orient="split"`` (``{"columns", "index", "data"}``). JSON Lines (``.jsonl``/``.ndjson``):
one list, record or number per line. JSON has no infinity: write ``"-inf"`` as a string to mask.
Duplicate keys and numbers beyond the float64 range are refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from topk_cli.errors import InputError
from topk_cli.inputs.model import LoadedInput, check_value, finish, parse_number
from topk_cli.inputs.table import RawTable, read_table

SHAPE_HELP = (
    "expected a list of numbers, a list of equal-length lists, an object {label: number}, "
    "records [{column: value}], or pandas' orient='columns'/'split'"
)
_MAX_DIGITS = 309  # an integer with more digits is beyond float64's range


def _decoder(source: str, line: int | None = None) -> Callable[[str | bytes], Any]:
    where = f"{source}: line {line}" if line is not None else source

    def constant(name: str) -> float:
        if name == "-Infinity":
            return -math.inf
        raise InputError(f"{where}: {name} is not allowed (use \"-inf\" to mask an entry)")

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > _MAX_DIGITS or abs(int(text)) > 1.7976931348623157e308:
            raise InputError(f"{where}: the integer {text[:12]}... ({len(text)} digits) is beyond the float64 range")
        return int(text)

    def parse_float(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            raise InputError(f"{where}: the number {text[:40]} is beyond the float64 range (|x| > 1.8e308)")
        return value

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise InputError(f"{where}: duplicate key {key!r} in an object (JSON tools keep only one)")
            out[key] = value
        return out

    def decode(data: str | bytes) -> Any:
        try:
            return json.loads(
                data, parse_constant=constant, parse_int=parse_int, parse_float=parse_float, object_pairs_hook=pairs
            )
        except json.JSONDecodeError as exc:
            lineno = exc.lineno if line is None else line
            raise InputError(f"{source}: malformed JSON at line {lineno}, column {exc.colno}: {exc.msg}") from None
        except RecursionError:
            raise InputError(f"{where}: malformed JSON: nested too deeply") from None

    return decode


def _number(item: object, source: str, place: str) -> float:
    if isinstance(item, bool) or not isinstance(item, (int, float, str)):
        kind = "a list" if isinstance(item, list) else "an object" if isinstance(item, dict) else type(item).__name__
        if isinstance(item, bool) or item is None:
            kind = json.dumps(item)
        raise InputError(f"{source}: {place}: {kind} is not a number ({SHAPE_HELP})")
    if isinstance(item, str):
        value = parse_number(item)
        if value is None:
            raise InputError(f"{source}: {place}: {item!r} is not a number")
        if math.isinf(value) and value < 0 and item.strip().lower() in ("-inf", "-infinity"):
            return value
        if not math.isfinite(value):
            what = "NaN" if math.isnan(value) else "+inf"
            raise InputError(f"{source}: {place}: {what} is not allowed (only \"-inf\" strings, which mask an entry)")
        return check_value(value, item, source, place)
    return float(item)


def _cell(item: object) -> str:
    """A JSON value as table text (null -> missing, true/false kept as words)."""
    if item is None:
        return ""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, (int, str)):
        return str(item)
    if isinstance(item, float):
        return repr(item)
    raise TypeError


def load_json(data: bytes, source: str, *, column: str | None = None, index_col: str | None = None) -> LoadedInput:
    """Read one JSON document; see the module docstring."""
    doc = _decoder(source)(data)
    return _from_document(doc, source, "json", column, index_col, lambda r: f"row {r + 1} ([{r}])")


def load_jsonl(text: str, source: str, *, column: str | None = None, index_col: str | None = None) -> LoadedInput:
    """Read JSON Lines: one list, record or number per non-blank line."""
    items: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        if line.strip():
            items.append(_decoder(source, number)(line))
            lines.append(number)
    if not items:
        raise InputError(f"{source}: no JSON lines")
    return _from_document(items, source, "jsonl", column, index_col, lambda r: f"row {r + 1} (line {lines[r]})")


def _from_document(
    doc: Any, source: str, fmt: str, column: str | None, index_col: str | None, row_place: Callable[[int], str]
) -> LoadedInput:
    if isinstance(doc, dict):
        return _from_object(doc, source, fmt, column, index_col)
    if not isinstance(doc, list) or not doc:
        what = "an empty list" if isinstance(doc, list) else f"a {type(doc).__name__}"
        raise InputError(f"{source}: got {what}; {SHAPE_HELP}")
    if all(isinstance(item, dict) for item in doc):
        return _records(doc, source, fmt, column, index_col, row_place)
    if column is not None:
        raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
    if all(isinstance(item, list) for item in doc):
        return _batch(doc, source, fmt, row_place)
    if any(isinstance(item, (list, dict)) for item in doc):
        first = next((i for i, item in enumerate(doc) if type(item) is not type(doc[0])), 0)
        kinds = "lists and numbers" if not any(isinstance(item, dict) for item in doc) else "lists, objects and numbers"
        raise InputError(f"{source}: item [{first}] mixes {kinds}; {SHAPE_HELP}")
    return _vector(doc, source, fmt, None)


def _vector(items: list[Any], source: str, fmt: str, labels: Sequence[str] | None) -> LoadedInput:
    if labels is None:
        def place(c: int) -> str:
            return f"entry {c + 1} ([{c}])"
    else:
        def place(c: int) -> str:
            return f"key {labels[c]!r}"
    try:  # fast path: a plain list of numbers converts in C
        if any(isinstance(item, bool) for item in items):
            raise TypeError
        arr = np.asarray(items, dtype=np.float64)
        if arr.ndim != 1:
            raise TypeError
    except (TypeError, ValueError, OverflowError):
        arr = np.asarray([_number(item, source, place(c)) for c, item in enumerate(items)], dtype=np.float64)
    return finish(arr.reshape(1, -1), source, fmt=fmt, labels=labels, where=lambda r, c: place(c))


def _batch(doc: list[Any], source: str, fmt: str, row_place: Callable[[int], str]) -> LoadedInput:
    n = len(doc[0])
    if n == 0:
        raise InputError(f"{source}: {row_place(0)} is an empty list; {SHAPE_HELP}")
    for r, row in enumerate(doc):
        if len(row) != n:
            raise InputError(f"{source}: {row_place(r)} has {len(row)} entries, row 1 has {n} (ragged rows)")
    notes: list[str] = []
    row_names: list[str] | None = None
    offset = 0
    if n > 1 and all(isinstance(row[0], str) and parse_number(row[0]) is None for row in doc):
        row_names = [row[0] for row in doc]  # pandas' orient="values" of a frame with a text column
        offset, n = 1, n - 1
        notes.append("row names from the first entry of each row (text)")

    def entry_place(r: int, c: int) -> str:
        if fmt == "json":
            return f"row {r + 1}, entry {c + 1 + offset} ([{r}][{c + offset}])"
        return f"{row_place(r)}, entry {c + 1 + offset}"

    arr = np.empty((len(doc), n), dtype=np.float64)
    for r, full in enumerate(doc):
        row = full[offset:]
        try:
            if any(isinstance(item, bool) for item in row):
                raise TypeError
            converted = np.asarray(row, dtype=np.float64)
            if converted.ndim != 1:
                raise TypeError
            arr[r] = converted
        except (TypeError, ValueError, OverflowError):
            arr[r] = [_number(item, source, entry_place(r, c)) for c, item in enumerate(row)]
    if n == 1 and len(doc) > 1:  # a column: one vector, as a one-column CSV
        note = f"read the {len(doc)} one-entry rows as one vector of {len(doc)} entries"
        return finish(arr.reshape(1, -1), source, fmt=fmt, labels=row_names, where=lambda r, c: entry_place(c, 0),
                      notes=("; ".join([note, *notes]),))
    if n <= 3 and len(doc) > 1:
        notes.insert(0, f"read {len(doc)} vectors of {n} entries")
    return finish(arr, source, fmt=fmt, row_names=row_names, where=entry_place,
                  notes=("; ".join(notes),) if notes else ())


def _table(
    source: str, fmt: str, names: list[str], rows: list[list[Any]], row_place: Callable[[int], str],
    column: str | None, index_col: str | None, notes: tuple[str, ...] = (),
) -> LoadedInput:
    try:
        columns = [[_cell(row[c]) for row in rows] for c in range(len(names))]
    except TypeError:
        raise InputError(f"{source}: a cell holds a list or an object; {SHAPE_HELP}") from None

    def place(row: int, col: int) -> str:
        return f"{row_place(row)}, key {names[col]!r}"

    table = RawTable(source, fmt, names, columns, place, row_place, notes)  # type: ignore[arg-type]
    return read_table(table, column=column, index_col=index_col)


def _records(
    doc: list[dict[str, Any]], source: str, fmt: str, column: str | None, index_col: str | None,
    row_place: Callable[[int], str],
) -> LoadedInput:
    names = list(doc[0])
    if not names:
        raise InputError(f"{source}: {row_place(0)} is an empty object; {SHAPE_HELP}")
    for r, record in enumerate(doc):
        if list(record) != names and set(record) != set(names):
            missing = sorted(set(names) - set(record))
            extra = sorted(set(record) - set(names))
            what = f"lacks key {missing[0]!r}" if missing else f"has an extra key {extra[0]!r}"
            raise InputError(f"{source}: {row_place(r)} {what} (row 1 has {', '.join(map(repr, names))})")
    rows = [[record[name] for name in names] for record in doc]
    return _table(source, fmt, names, rows, row_place, column, index_col)


def _from_object(doc: dict[str, Any], source: str, fmt: str, column: str | None, index_col: str | None) -> LoadedInput:
    if not doc:
        raise InputError(f"{source}: the object is empty ({SHAPE_HELP})")
    values = list(doc.values())
    if set(doc) >= {"columns", "data"} and set(doc) <= {"columns", "index", "data", "name"}:
        return _split(doc, source, fmt, column, index_col)
    if all(isinstance(v, dict) for v in values):  # pandas orient="columns": {column: {row: value}}
        names = list(doc)
        index = list(values[0])
        for name, inner in doc.items():
            if list(inner) != index and set(inner) != set(index):
                raise InputError(f"{source}: column {name!r} has other row keys than column {names[0]!r}")
        rows = [[doc[name][key] for name in names] for key in index]
        return _with_index(source, fmt, names, rows, index, column, index_col,
                           "read as pandas orient='columns' (outer keys = columns, inner keys = rows)")
    if all(isinstance(v, list) for v in values):
        if len(doc) == 1 and values[0] and all(isinstance(v, list) for v in values[0]):
            return _batch(values[0], source, fmt, lambda r: f"row {r + 1} ([{r}])")
        length = len(values[0])
        for name, col in doc.items():
            if len(col) != length:
                raise InputError(f"{source}: column {name!r} has {len(col)} values, {next(iter(doc))!r} has {length}")
        if length == 0:
            raise InputError(f"{source}: the columns are empty; {SHAPE_HELP}")
        rows = [[doc[name][r] for name in doc] for r in range(length)]
        return _table(source, fmt, list(doc), rows, lambda r: f"row {r + 1} ([{r}])", column, index_col)
    if any(isinstance(v, (list, dict)) for v in values):
        raise InputError(f"{source}: the object mixes numbers, lists and objects; {SHAPE_HELP}")
    if column is not None:
        raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
    return _vector(values, source, fmt, tuple(doc))


def _with_index(
    source: str, fmt: str, names: list[str], rows: list[list[Any]], index: list[Any],
    column: str | None, index_col: str | None, note: str,
) -> LoadedInput:
    """A table whose rows are named by ``index`` (pandas' index), unless it is 0..N-1."""
    if [str(key) for key in index] == [str(i) for i in range(len(index))] or index_col is not None:
        return _table(source, fmt, names, rows, lambda r: f"row {r + 1} ({index[r]!r})", column, index_col, (note,))
    if "" in names:
        raise InputError(f"{source}: a column has an empty name")
    full = ["", *names]
    return _table(source, fmt, full, [[key, *row] for key, row in zip(index, rows, strict=True)],
                  lambda r: f"row {r + 1} ({index[r]!r})", column, None, (note,))


def _split(doc: dict[str, Any], source: str, fmt: str, column: str | None, index_col: str | None) -> LoadedInput:
    names, data = doc["columns"], doc["data"]
    if not isinstance(names, list) or not isinstance(data, list) or not all(isinstance(r, list) for r in data):
        raise InputError(f"{source}: orient='split' needs a list 'columns' and a list of lists 'data'")
    names = [str(n) for n in names]
    for r, row in enumerate(data):
        if len(row) != len(names):
            raise InputError(f"{source}: data row {r + 1} ([{r}]) has {len(row)} values, 'columns' has {len(names)}")
    index = doc.get("index", list(range(len(data))))
    if not isinstance(index, list) or len(index) != len(data):
        raise InputError(f"{source}: 'index' must list one name per data row")
    return _with_index(source, fmt, names, data, index, column, index_col, "read as pandas orient='split'")
