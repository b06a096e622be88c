"""JSON and JSON Lines, in the shapes numpy, pandas, polars, jq and people write.

Vectors:

- a list of numbers (one vector); a list of equal-length lists (a batch, pandas' ``orient="values"``;
  a text first entry in every row names the rows);
- an object ``{label: number}`` (one labelled vector, ``Series.to_json()``);
- an object ``{name: [numbers]}`` (``json.dump({token: logits.tolist()})``): each key one vector,
  named by the key (announced). No pandas orient writes lists under keys; ``df.to_dict("list")``
  does, keyed by column: a key holding text (a label column) makes it a table of columns, and
  ``--orient columns`` says so for all-number columns;
- an object with one key holding a batch (``{"logits": [[...], ...]}``);
- records holding one list each (``{"id": 0, "logits": [...]}``, as polars and jq write them): the
  list is the vector, the first other text or integer key names the row.

Tables, read by the layout rule of :mod:`topk_cli.inputs.table`: records (``orient="records"``),
``orient="split"``, ``orient="table"`` and the two objects of objects pandas writes:
``orient="columns"`` (its default, ``{column: {row: value}}``) and ``orient="index"``
(``{row: {column: value}}``). The two look alike; pandas' default index (keys ``"0".."N-1"``) on one
level tells them apart, else ``--orient rows|columns`` must (an object of objects with named rows
and named columns is refused as ambiguous, never transposed by a guess).

JSON Lines (``.jsonl``/``.ndjson``): one list, record or number per line. JSON has no infinity:
write ``"-inf"`` as a string to mask. ``null``, duplicate keys or column names and numbers beyond
the float64 range are refused. Places in messages: ``[i]`` / ``[i][j]`` (JSON paths), ``key 'a'``,
``record [i]``, ``line L`` (JSON Lines, 1-based).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InputError
from topk_cli.inputs.model import LoadedInput, check_value, finish, parse_number, with_decisions
from topk_cli.inputs.table import RawTable, read_table

#: ``--orient`` values: how the keys of a JSON object are read.
ORIENTS = ("rows", "columns")

SHAPE_HELP = (
    "expected a list of numbers, a list of equal-length lists, an object {label: number} or "
    "{name: [numbers]}, records [{column: value}], or a pandas orient ('columns', 'index', 'split', 'table')"
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


@dataclass(frozen=True)
class _Where:
    """How one document names its places: JSON paths (``[2]``) or JSON Lines lines (``line 3``)."""

    source: str
    fmt: str
    lines: Sequence[int] = ()  # JSON Lines: the file line of each item
    prefix: str = ""  # records under a key: "key 'data', "

    def item(self, r: int) -> str:
        return f"line {self.lines[r]}" if self.fmt == "jsonl" else f"[{r}]"

    def record(self, r: int) -> str:
        return f"line {self.lines[r]}" if self.fmt == "jsonl" else f"{self.prefix}record [{r}]"

    def entry(self, r: int, c: int) -> str:
        return f"line {self.lines[r]}, entry [{c}]" if self.fmt == "jsonl" else f"[{r}][{c}]"


def _kind(item: object) -> str:
    if isinstance(item, bool) or item is None:
        return json.dumps(item)
    return "a list" if isinstance(item, list) else "an object" if isinstance(item, dict) else type(item).__name__


def _number(item: object, source: str, place: str) -> float:
    if item is None:
        raise InputError(f"{source}: {place}: null is not allowed (a missing value; write \"-inf\" to mask an entry)")
    if isinstance(item, bool) or not isinstance(item, (int, float, str)):
        raise InputError(f"{source}: {place}: {_kind(item)} is not a number ({SHAPE_HELP})")
    if isinstance(item, str):
        value = parse_number(item)
        if value is None:
            raise InputError(f"{source}: {place}: {item!r} is not a number")
        return check_value(value, item, source, place)  # NaN, +inf, beyond float64 ('-1e400' is no mask)
    return float(item)


def _floats(items: list[Any], source: str, place: Callable[[int], str]) -> NDArray[np.float64]:
    """The numbers of one JSON list; anything but plain numbers goes through :func:`_number`."""
    if all(type(item) is float or type(item) is int for item in items):  # bool, None and strings: no
        return np.asarray(items, dtype=np.float64)  # C conversion; JSON numbers are finite here
    return np.asarray([_number(item, source, place(c)) for c, item in enumerate(items)], dtype=np.float64)


def _cell(item: object) -> str:
    """A JSON value as table text (null -> the missing marker 'null', true/false kept as words)."""
    if item is None:
        return "null"
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, (int, str)):
        return str(item)
    if isinstance(item, float):
        return repr(item)
    raise TypeError


def _text(item: object) -> bool:
    """A text item that is no number: a label, never a score."""
    return isinstance(item, bool) or (isinstance(item, str) and parse_number(item) is None)


def load_json(
    data: bytes, source: str, *, column: str | None = None, index_col: str | None = None, orient: str | None = None
) -> LoadedInput:
    """Read one JSON document; see the module docstring."""
    doc = _decoder(source)(data)
    return _from_document(doc, _Where(source, "json"), column, index_col, check_orient(orient))


def load_jsonl(
    text: str, source: str, *, column: str | None = None, index_col: str | None = None, orient: str | None = None
) -> LoadedInput:
    """Read JSON Lines: one list, record or number per non-blank line."""
    items: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        if line.strip():
            items.append(_decoder(source, number)(line))
            lines.append(number)
    if not items:
        raise InputError(f"{source}: no JSON lines")
    if orient is not None:
        raise InputError(f"{source}: --orient applies to a JSON object of vectors or columns, not to JSON Lines")
    return _from_document(items, _Where(source, "jsonl", lines), column, index_col, None)


def check_orient(orient: str | None) -> str | None:
    """``--orient`` normalised (``rows`` or ``columns``); None stays None."""
    if orient is None:
        return None
    value = orient.strip().lower()
    if value not in ORIENTS:
        raise InputError(f"unknown --orient {orient!r}; valid: rows (each key one vector), columns (each key one column)")
    return value


def _no_orient(where: _Where, orient: str | None, shape: str) -> None:
    if orient is not None:
        raise InputError(
            f"{where.source}: --orient applies to a JSON object whose keys name vectors or columns "
            f"({{name: [...]}}, {{name: {{...}}}}), not to {shape}"
        )


def _from_document(doc: Any, where: _Where, column: str | None, index_col: str | None, orient: str | None) -> LoadedInput:
    source = where.source
    if isinstance(doc, dict):
        return _from_object(doc, where, column, index_col, orient)
    if not isinstance(doc, list) or not doc:
        what = "an empty list" if isinstance(doc, list) else f"a {type(doc).__name__}"
        raise InputError(f"{source}: got {what}; {SHAPE_HELP}")
    if all(isinstance(item, dict) for item in doc):
        _no_orient(where, orient, "records")
        return _records(doc, where, column, index_col)
    _no_orient(where, orient, "a list")
    if column is not None:
        raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
    if all(isinstance(item, list) for item in doc):
        return with_decisions(_batch(doc, where, where.item, where.entry), shape="list of lists")
    if any(isinstance(item, (list, dict)) for item in doc):
        first = next((i for i, item in enumerate(doc) if type(item) is not type(doc[0])), 0)
        kinds = "lists and numbers" if not any(isinstance(item, dict) for item in doc) else "lists, objects and numbers"
        raise InputError(f"{source}: {where.item(first)} mixes {kinds}; {SHAPE_HELP}")
    return with_decisions(_vector(doc, where, None, place=where.item), shape="list of numbers")


def _vector(items: list[Any], where: _Where, labels: Sequence[str] | None, place: Callable[[int], str]) -> LoadedInput:
    arr = _floats(items, where.source, place)
    return finish(arr.reshape(1, -1), where.source, fmt=where.fmt, labels=labels, where=lambda r, c: place(c))


def _batch(
    doc: list[Any], where: _Where, item_place: Callable[[int], str], entry_place: Callable[[int, int], str],
    names: Sequence[str] | None = None, names_from: str | None = None,
) -> LoadedInput:
    """Equal-length lists: one vector each, named by ``names`` (or by a text first entry)."""
    source, fmt = where.source, where.fmt
    n = len(doc[0])
    if n == 0:
        raise InputError(f"{source}: {item_place(0)} is an empty list; {SHAPE_HELP}")
    for r, row in enumerate(doc):
        if len(row) != n:
            raise InputError(f"{source}: {item_place(r)} has {len(row)} entries, {item_place(0)} has {n} (ragged rows)")
    notes: list[str] = []
    row_names: Sequence[str] | None = names
    offset = 0
    if names is None and n > 1 and all(isinstance(row[0], str) and parse_number(row[0]) is None for row in doc):
        row_names = [row[0] for row in doc]  # pandas' orient="values" of a frame with a text column
        offset, n = 1, n - 1
        notes.append("row names from the first entry of each row (text)")
        names_from = "the first entry of each row (text)"

    def place(r: int, c: int) -> str:
        return entry_place(r, c + offset)

    arr = np.empty((len(doc), n), dtype=np.float64)
    for r, full in enumerate(doc):
        arr[r] = _floats(full[offset:] if offset else full, source, lambda c, r=r: place(r, c))  # type: ignore[misc]
    if n == 1 and len(doc) > 1:  # a column: one vector, as a one-column CSV
        note = f"read the {len(doc)} one-entry rows as one vector of {len(doc)} entries"
        loaded = finish(arr.reshape(1, -1), source, fmt=fmt, labels=row_names, where=lambda r, c: place(c, 0),
                        notes=("; ".join([note, *notes]),))
        return with_decisions(loaded, labels_from=names_from)
    if n <= 3 and len(doc) > 1:
        notes.insert(0, f"read {len(doc)} vectors of {n} entries")
    loaded = finish(arr, source, fmt=fmt, row_names=row_names, where=place, notes=("; ".join(notes),) if notes else ())
    return with_decisions(loaded, row_names_from=names_from)


# ---- tables --------------------------------------------------------------------------------


def _table(
    where: _Where, names: list[str], rows: list[list[Any]], row_place: Callable[[int], str],
    place: Callable[[int, int], str], column: str | None, index_col: str | None, notes: tuple[str, ...] = (),
) -> LoadedInput:
    source = where.source
    try:
        columns = [[_cell(row[c]) for row in rows] for c in range(len(names))]
    except TypeError:
        r, c = next((r, c) for r, row in enumerate(rows) for c, item in enumerate(row) if isinstance(item, (list, dict)))
        raise InputError(f"{source}: {place(r, c)}: {_kind(rows[r][c])} in a table cell; {SHAPE_HELP}") from None
    table = RawTable(source, where.fmt, names, columns, place, row_place, notes)  # type: ignore[arg-type]
    loaded = read_table(table, column=column, index_col=index_col)
    nulls = [c for c in range(len(names)) if any(row[c] is None for row in rows)]
    for c in nulls:  # a null read as the text 'null' must not name an entry or a row
        for named in (loaded.labels, loaded.row_names):
            if len(named) == len(rows) and list(named) == columns[c]:
                r = next(r for r, row in enumerate(rows) if row[c] is None)
                raise InputError(f"{source}: {place(r, c)}: null is not allowed as a name (a missing value)")
    return loaded


def _records(doc: list[dict[str, Any]], where: _Where, column: str | None, index_col: str | None) -> LoadedInput:
    source = where.source
    names = list(doc[0])
    if not names:
        raise InputError(f"{source}: {where.record(0)} is an empty object; {SHAPE_HELP}")
    for r, record in enumerate(doc):
        if list(record) != names and set(record) != set(names):
            missing = sorted(set(names) - set(record))
            extra = sorted(set(record) - set(names))
            what = f"lacks key {missing[0]!r}" if missing else f"has an extra key {extra[0]!r}"
            raise InputError(f"{source}: {where.record(r)} {what} ({where.record(0)} has {', '.join(map(repr, names))})")
    lists = [name for name in names if isinstance(doc[0][name], list)]
    if lists:
        return _list_records(doc, where, names, lists, column, index_col)
    rows = [[record[name] for name in names] for record in doc]

    def place(r: int, c: int) -> str:
        return f"{where.record(r)}, key {names[c]!r}"

    return with_decisions(_table(where, names, rows, where.record, place, column, index_col), shape="records")


def _list_records(
    doc: list[dict[str, Any]], where: _Where, names: list[str], lists: list[str], column: str | None,
    index_col: str | None,
) -> LoadedInput:
    """Records holding one list each (``{"id": 0, "logits": [...]}``): the list is the vector."""
    source = where.source
    if column is not None:
        if column not in names:
            raise InputError(f"{source}: no key {column!r}; keys: {', '.join(map(repr, names))}")
        if column not in lists:
            raise InputError(f"{source}: --column {column!r}: the records' vectors are the lists under "
                             f"{', '.join(map(repr, lists))}")
        key = column
    elif len(lists) > 1:
        raise InputError(f"{source}: the records hold several lists (keys {', '.join(map(repr, lists))}); "
                         "pass --column NAME to choose the vector")
    else:
        key = lists[0]
    for r, record in enumerate(doc):
        if not isinstance(record[key], list):
            raise InputError(f"{source}: {where.record(r)}, key {key!r}: {_kind(record[key])}, "
                             f"not a list as in {where.record(0)}")
    others = [name for name in names if name != key]
    name_key: str | None = None
    if index_col is not None and index_col.strip().lower() not in ("none", "false"):
        if index_col not in others:
            raise InputError(f"{source}: --index-col: no key {index_col!r} beside the vector; "
                             f"keys: {', '.join(map(repr, others)) or 'none'}")
        name_key = index_col
    elif index_col is None:
        name_key = next((name for name in others if all(
            isinstance(rec[name], (str, int)) and not isinstance(rec[name], bool) for rec in doc)), None)
    if name_key is not None:
        bad = next((r for r, rec in enumerate(doc) if not isinstance(rec[name_key], (str, int))
                    or isinstance(rec[name_key], bool) or not str(rec[name_key]).strip()), None)
        if bad is not None:
            raise InputError(f"{source}: {where.record(bad)}, key {name_key!r}: {_kind(doc[bad][name_key])} "
                             "cannot name a row (text or an integer)")
    row_names = [str(rec[name_key]) for rec in doc] if name_key is not None else None
    ignored = tuple(name for name in others if name != name_key)
    loaded = _batch(
        [rec[key] for rec in doc], where, lambda r: f"{where.record(r)}, key {key!r}",
        lambda r, c: f"{where.record(r)}, key {key!r}, entry [{c}]",
        names=row_names, names_from=f"key {name_key!r}" if name_key is not None else None,
    )
    note = f"read the list under key {key!r} of each record as one vector"
    if loaded.values.shape[0] == 1 and len(doc) > 1:
        note = f"read the one-entry lists under key {key!r} as one vector of {len(doc)} entries"
    elif len(doc) > 1 or loaded.values.shape[0] > 1:
        note += f" ({len(doc)} vectors of {loaded.values.shape[1]} entries)"
    if name_key is not None:
        note += f"; {'labels' if loaded.values.shape[0] == 1 and len(doc) > 1 else 'row names'} from key {name_key!r}"
    if ignored:
        note += "; ignored " + ", ".join(f"key {name!r}" for name in ignored)
    return with_decisions(
        _replace_notes(loaded, note), shape="records with a list (one vector per record)", ignored=ignored,
    )


def _replace_notes(loaded: LoadedInput, note: str) -> LoadedInput:
    import dataclasses

    return dataclasses.replace(loaded, notes=(note,))


# ---- objects -------------------------------------------------------------------------------


def _from_object(
    doc: dict[str, Any], where: _Where, column: str | None, index_col: str | None, orient: str | None
) -> LoadedInput:
    source = where.source
    if not doc:
        raise InputError(f"{source}: the object is empty ({SHAPE_HELP})")
    values = list(doc.values())
    if _is_split(doc):
        _no_orient(where, orient, "pandas orient='split'")
        return _split(doc, where, column, index_col)
    if _is_series_split(doc):
        _no_orient(where, orient, "pandas orient='split' of a Series")
        if column is not None:
            raise InputError(f"{source}: --column applies to CSV columns and JSON tables (this is one Series)")
        labels = [str(key) for key in doc["index"]]
        loaded = _vector(doc["data"], where, labels, place=lambda c: f"'data'[{c}] (index {labels[c]!r})")
        return with_decisions(loaded, shape="pandas orient='split' of a Series", labels_from="'index'")
    if _is_table(doc):
        _no_orient(where, orient, "pandas orient='table'")
        return _table_orient(doc, where, column, index_col)
    if all(isinstance(v, dict) for v in values):
        return _nested(doc, where, column, index_col, orient)
    if all(isinstance(v, list) for v in values):
        return _keyed_lists(doc, where, column, index_col, orient)
    if any(isinstance(v, (list, dict)) for v in values):
        raise InputError(f"{source}: the object mixes numbers, lists and objects; {SHAPE_HELP}")
    _no_orient(where, orient, "an object {label: number} (one vector)")
    if column is not None:
        raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
    keys = tuple(doc)
    return with_decisions(_vector(values, where, keys, place=lambda c: f"key {keys[c]!r}"),
                    shape="object {label: number}", labels_from="the keys")


def _keyed_lists(
    doc: dict[str, Any], where: _Where, column: str | None, index_col: str | None, orient: str | None
) -> LoadedInput:
    """``{name: [...]}``: each key one vector (the hand-written shape), or one column of a table."""
    source = where.source
    keys = list(doc)
    values = list(doc.values())
    if len(doc) == 1 and values[0] and all(isinstance(v, dict) for v in values[0]) and orient is None:
        key = keys[0]  # {"data": [records]}, as web APIs answer
        loaded = _records(values[0], _Where(source, where.fmt, where.lines, prefix=f"key {key!r}, "), column, index_col)
        return with_decisions(loaded, shape=f"records under key {key!r}")
    if len(doc) == 1 and values[0] and all(isinstance(v, list) for v in values[0]) and orient is None:
        if column is not None:
            raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
        key = keys[0]
        loaded = _batch(values[0], where, lambda r: f"key {key!r}, [{r}]", lambda r, c: f"key {key!r}, [{r}][{c}]")
        return with_decisions(loaded, shape=f"a batch under key {key!r}")
    given = orient is not None
    why = "--orient columns" if orient == "columns" else ""
    if orient is None:
        text = next((k for k, v in doc.items() if v and any(_text(item) for item in v)
                     and all(_text(item) or item is None for item in v)), None)
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

        loaded = _table(where, keys, rows, lambda r: f"[{r}]", place, column, index_col, (note,))
        return with_decisions(loaded, shape="object of columns {column: [values]}", orientation="columns")
    if column is not None:
        raise InputError(f"{source}: --column applies to the keys of an object read as columns (pass --orient columns)")
    if index_col is not None:
        raise InputError(f"{source}: --index-col applies to tables; here each key names one vector")
    loaded = _batch(values, where, lambda r: f"key {keys[r]!r}", lambda r, c: f"key {keys[r]!r}, entry [{c}]",
                    names=keys, names_from="the keys")
    rows_read, n = loaded.values.shape
    if len(doc) > 1 and rows_read > 1:
        told = "--orient rows" if given else "pass --orient columns if the keys name columns"
        note = f"read each key as one vector ({rows_read} vectors of {n} entries; {told})"
        loaded = _replace_notes(loaded, note)
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
    doc: dict[str, Any], where: _Where, column: str | None, index_col: str | None, orient: str | None
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
            orient, why = "rows", f"pandas orient='index': the outer keys are its default index 0..{len(outer) - 1}"
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
    where: _Where, names: list[str], rows: list[list[Any]], index: list[Any], column: str | None,
    index_col: str | None, note: str, place: Callable[[int, int], str],
) -> LoadedInput:
    """A table whose rows are named by ``index`` (pandas' index), unless it is 0..N-1."""
    def row_place(r: int) -> str:
        return f"row key {json.dumps(index[r])}"

    if [str(key) for key in index] == [str(i) for i in range(len(index))] or index_col is not None:
        return _table(where, names, rows, row_place, place, column, index_col, (note,))
    if "" in names:
        raise InputError(f"{where.source}: a column has an empty name")
    full = ["", *names]

    def shifted(r: int, c: int) -> str:
        return f"row key {json.dumps(index[r])}" if c == 0 else place(r, c - 1)

    return _table(where, full, [[key, *row] for key, row in zip(index, rows, strict=True)], row_place, shifted,
                  column, None, (note,))


def _split(doc: dict[str, Any], where: _Where, column: str | None, index_col: str | None) -> LoadedInput:
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


def _table_orient(doc: dict[str, Any], where: _Where, column: str | None, index_col: str | None) -> LoadedInput:
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
    loaded = _table(where, names, rows, lambda r: f"'data'[{r}]",
                    lambda r, c: f"'data'[{r}], key {names[c]!r}", column, index_col,
                    ("read as pandas orient='table'" + (f" (index: {index_col!r})" if index_col else ""),))
    return with_decisions(loaded, shape="pandas orient='table'")
