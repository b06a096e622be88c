"""The pieces every JSON shape is read with: places, numbers, vectors, batches, record tables.

:mod:`topk_cli.inputs.jsonfile` decodes a document and dispatches on its shape;
:mod:`topk_cli.inputs.jsonobjects` reads the objects (keyed vectors and pandas' orients) with these.
Places in messages: ``[i]`` / ``[i][j]`` (JSON paths), ``key 'a'``, ``record [i]``, ``line L``
(JSON Lines, 1-based).
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
from topk_cli.inputs.table import RawTable, read_table, requested_k_column, with_row_k

SHAPE_HELP = (
    "expected a list of numbers, a list of equal-length lists, an object {label: number} or "
    "{name: [numbers]}, records [{column: value}], or a pandas orient ('columns', 'index', 'split', 'table')"
)


@dataclass(frozen=True)
class Where:
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


def kind_of(item: object) -> str:
    """How a message names a JSON value that is not a number."""
    if isinstance(item, bool) or item is None:
        return json.dumps(item)
    return "a list" if isinstance(item, list) else "an object" if isinstance(item, dict) else type(item).__name__


def to_number(item: object, source: str, place: str) -> float:
    """One JSON value as a score: a number, or a string spelling one (\"-inf\" masks); else InputError."""
    if item is None:
        raise InputError(f"{source}: {place}: null is not allowed (a missing value; write \"-inf\" to mask an entry)")
    if isinstance(item, bool) or not isinstance(item, (int, float, str)):
        raise InputError(f"{source}: {place}: {kind_of(item)} is not a number ({SHAPE_HELP})")
    if isinstance(item, str):
        value = parse_number(item)
        if value is None:
            raise InputError(f"{source}: {place}: {item!r} is not a number")
        return check_value(value, item, source, place)  # NaN, +inf, beyond float64 ('-1e400' is no mask)
    return float(item)


def to_floats(items: list[Any], source: str, place: Callable[[int], str]) -> NDArray[np.float64]:
    """The numbers of one JSON list; anything but plain numbers goes through :func:`to_number`."""
    if all(type(item) is float or type(item) is int for item in items):  # bool, None and strings: no
        return np.asarray(items, dtype=np.float64)  # C conversion; JSON numbers are finite here
    return np.asarray([to_number(item, source, place(c)) for c, item in enumerate(items)], dtype=np.float64)


def to_cell(item: object) -> str:
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


def is_text(item: object) -> bool:
    """A text item that is no number: a label, never a score."""
    return isinstance(item, bool) or (isinstance(item, str) and parse_number(item) is None)


def no_orient(where: Where, orient: str | None, shape: str) -> None:
    """Refuse --orient on a shape whose keys do not run either way."""
    if orient is not None:
        raise InputError(
            f"{where.source}: --orient applies to a JSON object whose keys name vectors or columns "
            f"({{name: [...]}}, {{name: {{...}}}}), not to {shape}"
        )



def read_vector(items: list[Any], where: Where, labels: Sequence[str] | None, place: Callable[[int], str]) -> LoadedInput:
    """A list of numbers: one vector (labelled by ``labels`` when given)."""
    arr = to_floats(items, where.source, place)
    return finish(arr.reshape(1, -1), where.source, fmt=where.fmt, labels=labels, where=lambda r, c: place(c))


def read_batch(
    doc: list[Any], where: Where, item_place: Callable[[int], str], entry_place: Callable[[int, int], str],
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
        arr[r] = to_floats(full[offset:] if offset else full, source, lambda c, r=r: place(r, c))  # type: ignore[misc]
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


def read_cells(
    where: Where, names: list[str], rows: list[list[Any]], row_place: Callable[[int], str],
    place: Callable[[int, int], str], column: str | None, index_col: str | None, notes: tuple[str, ...] = (),
) -> LoadedInput:
    """Rows of JSON values as a table of text cells, read by the layout rule of :mod:`topk_cli.inputs.table`."""
    source = where.source
    try:
        columns = [[to_cell(row[c]) for row in rows] for c in range(len(names))]
    except TypeError:
        r, c = next((r, c) for r, row in enumerate(rows) for c, item in enumerate(row) if isinstance(item, (list, dict)))
        raise InputError(f"{source}: {place(r, c)}: {kind_of(rows[r][c])} in a table cell; {SHAPE_HELP}") from None
    table = RawTable(source, where.fmt, names, columns, place, row_place, notes)  # type: ignore[arg-type]
    loaded = read_table(table, column=column, index_col=index_col)
    nulls = [c for c in range(len(names)) if any(row[c] is None for row in rows)]
    for c in nulls:  # a null read as the text 'null' must not name an entry or a row
        for named in (loaded.labels, loaded.row_names):
            if len(named) == len(rows) and list(named) == columns[c]:
                r = next(r for r, row in enumerate(rows) if row[c] is None)
                raise InputError(f"{source}: {place(r, c)}: null is not allowed as a name (a missing value)")
    return loaded


def read_records(doc: list[dict[str, Any]], where: Where, column: str | None, index_col: str | None) -> LoadedInput:
    """A list of objects: a table (the layout rule), or one vector per record when they hold a list."""
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
        return read_list_records(doc, where, names, lists, column, index_col)
    rows = [[record[name] for name in names] for record in doc]

    def place(r: int, c: int) -> str:
        return f"{where.record(r)}, key {names[c]!r}"

    return with_decisions(read_cells(where, names, rows, where.record, place, column, index_col), shape="records")


def read_list_records(
    doc: list[dict[str, Any]], where: Where, names: list[str], lists: list[str], column: str | None,
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
            raise InputError(f"{source}: {where.record(r)}, key {key!r}: {kind_of(record[key])}, "
                             f"not a list as in {where.record(0)}")
    others = [name for name in names if name != key]
    k_key = requested_k_column()
    row_k = None
    if k_key is not None:  # --k-column: a number beside each record's list
        if k_key not in others:
            raise InputError(f"{source}: --k-column: no key {k_key!r} beside the vector; "
                             f"keys: {', '.join(map(repr, others)) or 'none'}")
        if index_col is not None and index_col == k_key:
            raise InputError(f"{source}: --k-column {k_key!r} is also --index-col: a key is either k or row names")
        row_k = np.empty(len(doc))
        for r, rec in enumerate(doc):
            value = rec[k_key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError(f"{source}: {where.record(r)}, key {k_key!r}: --k-column {k_key!r}: "
                                 f"{kind_of(value)} is not a finite number")
            row_k[r] = value
        others = [name for name in others if name != k_key]
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
            raise InputError(f"{source}: {where.record(bad)}, key {name_key!r}: {kind_of(doc[bad][name_key])} "
                             "cannot name a row (text or an integer)")
    row_names = [str(rec[name_key]) for rec in doc] if name_key is not None else None
    ignored = tuple(name for name in others if name != name_key)
    loaded = read_batch(
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
    out = with_decisions(
        with_note(loaded, note), shape="records with a list (one vector per record)", ignored=ignored,
    )
    if row_k is not None:
        assert k_key is not None
        if out.values.shape[0] != len(doc):
            raise InputError(f"{source}: --k-column {k_key!r} gives one k per record, but the records' lists are read "
                             f"as one vector of {out.values.shape[1]} entries; --k-column needs a batch")
        out = with_row_k(out, row_k, k_key, lambda r: f"{where.record(r)}, key {k_key!r}")
    return out


def with_note(loaded: LoadedInput, note: str) -> LoadedInput:
    """``loaded`` with ``note`` as its one note."""
    import dataclasses

    return dataclasses.replace(loaded, notes=(note,))
