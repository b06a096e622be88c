"""The one layout rule for tables (CSV, TSV, JSON records/columns/split, JSON Lines of records).

A table is a header (or none) and columns of text cells (or of numbers already parsed, see
:func:`numeric_column`). Every column is classified from all its cells: *numeric* (every cell a
number; NaN/missing cells make it an error when it is used), *text*, or *true/false*. Then, in
this order:

1. Row names: ``index_col`` when given; else pandas' unnamed first column (empty first header
   cell, as ``df.to_csv()`` writes the index); else a first column holding exactly the integers
   0..N-1 (pandas' default index written with a name or without a header) beside another numeric
   column that is not all integers; else a leading numeric column of unique integers (an id: a
   token id, a position 1..N) beside at least two numeric columns that are not all integers. A
   column named like its neighbour (``e0`` beside ``e1``, ``0`` beside ``1``) is one of the scores,
   never row names. A leading column of unique integers named like an id (``id``, ``token_id``,
   ``pos``...) beside integer columns is refused as ambiguous (``--index-col`` decides).
2. Two numeric columns left, one of them unique integers (an id, a rank) and the other not:
   one vector, labelled by the id column (unless they are named alike).
3. One numeric column: one vector, labelled by the row-name column or else the first text
   column. Several: a batch, one vector per row, the header names label the entries and the
   row-name column or else the first text column names the rows.
4. A text column whose every cell is a number but for a typing convention (``−2`` with a
   Unicode minus, ``1,000.5``, ``1_000``, ``1 000``) is refused, naming the cell and the cause.
   Other text and true/false columns are ignored. Every inferred choice is reported in one note.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InputError
from topk_cli.inputs.model import (
    MISSING_MARKERS,
    IndexNames,
    LoadedInput,
    check_value,
    finish,
    parse_number,
    with_decisions,
)

_NUMERIC_MAJORITY = 0.5  # a column whose cells are mostly numbers is numeric with bad cells
_INTEGER_TEXT = re.compile(r"[\s+\-0-9]*")
_DECIMAL_COMMA = re.compile(r"\s*[+-]?\d*,\d+(?:[eE][+-]?\d+)?\s*")
_BOOLS = frozenset(("true", "false"))
_DIGIT_RUN = re.compile(r"\d+")
_ID_NAME = re.compile(
    r"(?i)(?:.*[_\s.-])?(?:id|ids|idx|index|pos|position|token|tok|rank|step|row|sample|item|no|num|number|#)"
)
_MINUSES = "\u2212\u2012\u2013\u2014\ufe63\uff0d"
_THOUSANDS = {".": re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][+-]?\d+)?"),
              ",": re.compile(r"[+-]?\d{1,3}(?:\.\d{3})+(?:,\d*)?")}
_SPACES = "\u00a0\u202f\u2009\u2007 '"

#: ``--k-column``: the column of the table being read that holds each row's k (not a score). Set
#: by :func:`k_column_of` around one read (the readers between ``load_input`` and
#: :func:`read_table` need not pass it on); every table reader honours it.
_K_COLUMN: ContextVar[str | None] = ContextVar("k_column", default=None)


@contextmanager
def k_column_of(name: str | None) -> Iterator[None]:
    """Read tables with ``name`` as the column of per-row k (``--k-column``) within this block."""
    token = _K_COLUMN.set(name)
    try:
        yield
    finally:
        _K_COLUMN.reset(token)


def requested_k_column() -> str | None:
    """The ``--k-column`` of the read in progress (None: none)."""
    return _K_COLUMN.get()


class NeedText(Exception):
    """A column's text was dropped while parsing and is needed after all: parse again, keeping it."""


def number_like(cell: str, decimal: str = ".") -> str | None:
    """Why ``cell`` is not a number although a person would read it as one; None otherwise.

    >>> number_like("\u22122.0"), number_like("1,000.5"), number_like("abc")
    ("a Unicode minus sign (U+2212); write '-'", "a thousands separator ','; write 1000.5", None)
    """
    text = cell.strip()
    if not text or parse_number(text.replace(decimal, ".") if decimal != "." else text) is not None:
        return None

    def number(candidate: str) -> bool:
        return parse_number(candidate.replace(decimal, ".") if decimal != "." else candidate) is not None

    for minus in _MINUSES:
        if minus in text and number(text.replace(minus, "-")):
            return f"a Unicode minus sign (U+{ord(minus):04X}); write '-'"
    if "_" in text and number(text.replace("_", "")):
        return f"'_' digit grouping; write {text.replace('_', '')}"
    pattern = _THOUSANDS.get(decimal)
    if pattern is not None and pattern.fullmatch(text):
        separator = "," if decimal == "." else "."
        return f"a thousands separator '{separator}'; write {text.replace(separator, '')}"
    if any(space in text for space in _SPACES) and number("".join(c for c in text if c not in _SPACES)):
        return "a space or apostrophe inside the number (digit grouping); write the digits only"
    normal = unicodedata.normalize("NFKC", text)
    if normal != text and number(normal):
        return "non-ASCII characters (full-width digits or signs); write ASCII digits"
    if decimal == "." and _DECIMAL_COMMA.fullmatch(text):
        return "a decimal comma? pass --decimal ,"
    return None


@dataclass(frozen=True)
class RawTable:
    """Cells as read. ``place(row, col)`` names a cell for messages (``line 5, column 'b'``)."""

    source: str
    fmt: str
    header: list[str] | None
    columns: list[Sequence[str] | _Column]
    place: Callable[[int, int], str]
    row_place: Callable[[int], str]
    notes: tuple[str, ...] = ()
    decimal: str = "."
    numbers: Numbers | None = None  # every column parsed already (``columns`` may then be empty)


@dataclass(frozen=True)
class Numbers:
    """A table whose every cell a parser read as a finite number or a ``-inf`` mask (checked).

    ``matrix`` is rows x width; ``integers[j]``: every cell of column j written as an integer;
    ``text[j]``: column j's cells as written, where the parser kept them (None: dropped).
    """

    matrix: NDArray[np.float64]
    integers: NDArray[np.bool_]
    text: Sequence[Sequence[str] | None]


@dataclass(eq=False, slots=True)
class _Column:
    pos: int
    name: str
    text: Sequence[str] | None  # the cells as written (None: dropped by the parser)
    kind: str  # numeric | text | bool | missing
    own_values: NDArray[np.float64] | None = None  # NaN where missing (None: the matrix's column pos)
    first_missing: int | None = None
    first_text: int | None = None
    integers: bool = False
    matrix: NDArray[np.float64] | None = None  # the parser's shared matrix (values is its column pos)

    def __len__(self) -> int:
        return len(self.values) if self.values is not None else len(self.cells)

    @property
    def values(self) -> NDArray[np.float64] | None:
        if self.own_values is None and self.matrix is not None:
            return self.matrix[:, self.pos]
        return self.own_values

    @property
    def cells(self) -> Sequence[str]:
        if self.text is None:
            raise NeedText(self.pos)
        return self.text


def numeric_column(matrix: NDArray[np.float64], pos: int, integers: bool, text: Sequence[str] | None) -> _Column:
    """A column a parser already read as numbers: every cell a finite number or a ``-inf`` mask.

    ``matrix`` (rows x width) is shared by the table's numeric columns; ``integers``: every cell
    written as an integer; ``text``: the cells as written, where the parser kept them (None: dropped).
    """
    return _Column(pos, "", text, "numeric", integers=integers, matrix=matrix)


def classify(pos: int, name: str, cells: Sequence[str] | _Column, decimal: str) -> _Column:
    """The column's kind and numbers, from all its cells."""
    if isinstance(cells, _Column):
        cells.name = name
        return cells
    parse_cells = cells if decimal == "." else [c.replace(decimal, ".") for c in cells]
    joined = "".join(parse_cells)
    values: NDArray[np.float64] | None = None
    if "_" not in joined and joined.isascii():
        try:  # fast path: numpy parses like float() (checked in the tests)
            values = np.array(parse_cells, dtype=np.float64)
        except ValueError:
            values = None
    text_rows: list[int] = []
    if values is None:
        values = np.full(len(cells), np.nan)
        for i, cell in enumerate(parse_cells):
            if cell.strip().lower() in MISSING_MARKERS:
                continue
            number = parse_number(cell)
            if number is None:
                text_rows.append(i)
            else:
                values[i] = number
    missing = np.isnan(values)
    if text_rows:
        missing[text_rows] = False
    column = _Column(pos, name, cells, "numeric", values)
    if missing.any():
        column.first_missing = int(np.argmax(missing))
    if text_rows:
        filled = len(cells) - int(missing.sum())
        if all(cells[i].strip().lower() in _BOOLS for i in text_rows) and len(text_rows) == filled:
            column.kind = "bool"
        elif (filled - len(text_rows)) / filled >= _NUMERIC_MAJORITY and filled - len(text_rows) > 0:
            column.first_text = text_rows[0]
        else:
            column.kind = "text"
        return column
    if missing.all():
        column.kind = "missing"
        return column
    if column.first_missing is None:
        column.integers = bool(_INTEGER_TEXT.fullmatch("".join(cells)))
    return column


def _is_range(column: _Column) -> bool:
    """The integers 0..N-1 in order: pandas' default index."""
    return column.integers and column.values is not None and bool(
        np.array_equal(column.values, np.arange(len(column.values)))
    )


def _is_id(column: _Column) -> bool:
    values = column.values
    return column.integers and values is not None and len(np.unique(values)) == len(values)


def _resolve_index_col(table: RawTable, index_col: str | None, names: list[str]) -> int | bool | None:
    """Position of the row-name column given by the user; False when disabled; None: infer."""
    if index_col is None:
        return None
    if index_col.strip().lower() in ("none", "false"):
        return False
    if table.header is not None and index_col in names:
        return names.index(index_col)
    if index_col.strip().isdigit():
        pos = int(index_col)
        if pos >= len(names):
            raise InputError(f"{table.source}: --index-col {pos}: the table has {len(names)} columns (counted from 0)")
        return pos
    shown = ", ".join(map(repr, names)) if table.header is not None else "none (no header)"
    raise InputError(f"{table.source}: --index-col: no column {index_col!r}; columns: {shown}")


def _names_text(names: Sequence[str], headerless: bool) -> str:
    if headerless:
        return f"columns {names[0]}..{names[-1]}" if len(names) > 1 else f"column {names[0]}"
    if len(names) > 3:
        return f"columns {names[0]}..{names[-1]}"
    return ("columns " if len(names) > 1 else "column ") + ", ".join(names)


def _named_like_neighbour(names: Sequence[str], pos: int, headerless: bool) -> bool:
    """``e0`` beside ``e1`` (or ``0`` beside ``1``): one of a series of score columns, not an id."""
    if headerless:
        return False
    stem = _DIGIT_RUN.sub("#", names[pos])
    if "#" not in stem:
        return False
    return any(_DIGIT_RUN.sub("#", names[p]) == stem for p in (pos - 1, pos + 1) if 0 <= p < len(names))


def read_table(
    table: RawTable,
    *,
    column: str | None = None,
    index_col: str | None = None,
) -> LoadedInput:
    """Apply the layout rule of this module to ``table``; see the module docstring.

    Under ``--k-column NAME`` (:func:`k_column_of`) the column NAME is taken out of the table first
    (it is neither a score, nor row names, nor labels) and becomes ``row_k`` of the result.
    """
    k_column = _K_COLUMN.get()
    if k_column is not None:
        return _read_with_k_column(table, k_column, column=column, index_col=index_col)
    return _read_table(table, column=column, index_col=index_col)


def _read_with_k_column(table: RawTable, name: str, *, column: str | None, index_col: str | None) -> LoadedInput:
    """``--k-column name``: one k per row from that column, the rest read by the layout rule."""
    source = table.source
    if table.header is None:
        raise InputError(f"{source}: --k-column {name!r}: the table has no header, so no named columns")
    names = list(table.header)
    if name not in names:
        raise InputError(f"{source}: --k-column: no column {name!r}; columns: {', '.join(map(repr, names))}")
    if column is not None:
        raise InputError(f"{source}: --k-column gives one k per row of a batch; --column reads one vector: give one of them")
    if index_col is not None and index_col == name:
        raise InputError(f"{source}: --k-column {name!r} is also --index-col: a column is either k or row names")
    pos = names.index(name)
    if index_col is not None and index_col not in names and index_col.strip().isdigit():
        given = int(index_col)  # a position counts the columns of the file, k column included
        if given == pos:
            raise InputError(f"{source}: --k-column {name!r} is also --index-col {given}: a column is either k or row names")
        index_col = str(given - 1) if given > pos else index_col
    k = _k_values(table, pos, name)
    loaded = _read_table(_drop_column(table, pos), column=None, index_col=index_col)
    rows = len(k)
    if loaded.values.shape[0] != rows:
        raise InputError(
            f"{source}: --k-column {name!r} gives one k per row, but besides it the table is read as one vector "
            f"of {loaded.values.shape[1]} entries; --k-column needs a batch (several score columns, one vector per row)"
        )
    return with_row_k(loaded, k, name, lambda r: table.place(r, pos), lambda r: _k_text(table, r, pos, float(k[r])))


def with_row_k(
    loaded: LoadedInput, k: NDArray[np.float64], name: str, place: Callable[[int], str],
    shown: Callable[[int], str] | None = None,
) -> LoadedInput:
    """``loaded`` with ``row_k = k`` read from the column (or key) ``name``, after checking each row's
    ``0 < k <= m`` (``m`` its unmasked entries; ``place(row)`` names the cell), and a note announcing it."""
    unmasked = np.isfinite(loaded.values).sum(axis=1)
    bad = (k <= 0) | (k > unmasked)
    if bad.any():
        r = int(np.argmax(bad))
        value = shown(r) if shown is not None else f"{float(k[r]):g}"
        raise InputError(
            f"{loaded.source}: {place(r)}: k = {value} is out of range: "
            f"each row's k must satisfy 0 < k <= {int(unmasked[r])} (its unmasked entries)"
        )
    low, high = float(k.min()), float(k.max())
    spread = f"k = {low:g} in every row" if low == high else f"k from {low:g} to {high:g}"
    note = f"k per row from column {name!r} ({spread}), not a score"
    return dataclasses.replace(loaded, row_k=k, k_column=name, notes=(*loaded.notes, note))


def _k_text(table: RawTable, row: int, pos: int, value: float) -> str:
    """A k cell as written when the reader kept its text, else the number."""
    cells: Sequence[str] | None = None
    if table.numbers is not None:
        cells = table.numbers.text[pos]
    elif not isinstance(table.columns[pos], _Column):
        cells = table.columns[pos]  # type: ignore[assignment]
    elif table.columns[pos].text is not None:  # type: ignore[union-attr]
        cells = table.columns[pos].text  # type: ignore[union-attr]
    if cells is not None and row < len(cells):
        return repr(str(cells[row]).strip())
    return f"{value:g}"


def _k_values(table: RawTable, pos: int, name: str) -> NDArray[np.float64]:
    """The numbers of the k column: every cell a finite number (range is checked by the caller)."""
    source = table.source
    if table.numbers is not None:
        values = np.array(table.numbers.matrix[:, pos], dtype=np.float64)
    else:
        col = classify(pos, name, table.columns[pos], table.decimal)
        if col.kind in ("text", "bool") or col.first_text is not None:
            cells = col.cells
            row = col.first_text if col.first_text is not None else next(
                (i for i, c in enumerate(cells) if parse_number(c.replace(table.decimal, ".")) is None), 0)
            raise InputError(
                f"{source}: {table.place(row, pos)}: --k-column {name!r}: {cells[row].strip()!r} is not a number"
            )
        if col.kind == "missing" or col.first_missing is not None:
            row = col.first_missing if col.first_missing is not None else 0
            raise InputError(f"{source}: {table.place(row, pos)}: --k-column {name!r}: empty or missing k")
        assert col.values is not None
        values = np.array(col.values, dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        r = int(np.argmax(bad))
        raise InputError(
            f"{source}: {table.place(r, pos)}: --k-column {name!r}: k = {_k_text(table, r, pos, float(values[r]))} "
            "is not a finite number"
        )
    return values


def _drop_column(table: RawTable, pos: int) -> RawTable:
    """``table`` without its column ``pos``; messages still name the cells by their place in the file."""
    header = None if table.header is None else [*table.header[:pos], *table.header[pos + 1 :]]
    numbers = None
    if table.numbers is not None:
        nm = table.numbers
        numbers = Numbers(np.delete(nm.matrix, pos, axis=1), np.delete(nm.integers, pos),
                          [t for j, t in enumerate(nm.text) if j != pos])
    columns: list[Sequence[str] | _Column] = []
    for j, col in enumerate(table.columns):
        if j == pos:
            continue
        if isinstance(col, _Column):  # its own copy of its numbers, at its new position
            values = col.values
            col = dataclasses.replace(col, pos=len(columns), matrix=None,
                                      own_values=None if values is None else np.asarray(values))
        columns.append(col)
    place = table.place

    def shifted(row: int, col: int) -> str:
        return place(row, col if col < pos else col + 1)

    return dataclasses.replace(table, header=header, columns=columns, numbers=numbers, place=shifted)


def _read_table(
    table: RawTable,
    *,
    column: str | None = None,
    index_col: str | None = None,
) -> LoadedInput:
    source = table.source
    if table.numbers is not None:
        rows, width = table.numbers.matrix.shape
    else:
        width = len(table.columns)
        rows = len(table.columns[0]) if table.columns else 0
    headerless = table.header is None
    names: list[str] = list(table.header) if table.header is not None else IndexNames(width, start=1)  # type: ignore[assignment]
    if rows == 0:
        raise InputError(f"{source}: no data rows (only a header)" if not headerless else f"{source}: no data rows")
    if column is not None and (headerless or column not in names):
        listing = ", ".join(map(repr, names)) if not headerless else "none (no header)"
        raise InputError(f"{source}: no column {column!r}; columns: {listing}")
    notes: list[str] = list(table.notes)
    given = _resolve_index_col(table, index_col, names)
    why: str | None = None  # how the row-name (label) column was chosen, when inferred
    index_pos: int | None = given if isinstance(given, int) and given is not False else None
    if given is None and table.header is not None and names[0] == "" and width > 1:
        index_pos = 0
        why = "the unnamed first column (the index pandas writes)"
    if not headerless and "" in names:
        for pos, name in enumerate(names):
            if name == "" and pos != index_pos:
                raise InputError(f"{source}: header: column {pos + 1} has no name")

    if table.numbers is not None and column is None:
        return _read_numbers(table, table.numbers, names, given, index_pos, why, notes)
    if table.numbers is not None:
        numbers = table.numbers
        cols = [_Column(j, names[j], numbers.text[j], "numeric", integers=bool(numbers.integers[j]),
                        matrix=numbers.matrix) for j in range(width)]
    else:
        cols = [classify(pos, names[pos], cells, table.decimal) for pos, cells in enumerate(table.columns)]

    def shown(col: _Column) -> str:
        return f"column {col.pos + 1}" if headerless else f"column {col.name!r}"

    def is_value(col: _Column) -> bool:
        return col.kind in ("numeric", "missing") and col.pos != index_pos

    numeric = [c for c in cols if c.kind in ("numeric", "missing")]
    ignored_ids: list[_Column] = []
    if given is None and index_pos is None and rows > 1 and numeric and column is None:
        lead = numeric[0]
        found, found_why = _lead_rule(source, lead, len(numeric) - 1, all(c.integers for c in numeric[1:]),
                                      names, headerless, rows, notes)
        if found is not None and lead.pos > 0 and any(c.kind == "text" for c in cols[: lead.pos]):
            ignored_ids.append(lead)  # an id beside a text column of row names: neither scores nor names
        elif found is not None:
            index_pos, why = found, found_why
    label_pos: int | None = index_pos
    if column is not None:
        value_cols = [cols[names.index(column)]]
        if value_cols[0].kind in ("text", "bool"):
            value_cols[0].kind = "numeric"
            value_cols[0].first_text = next(
                i for i, c in enumerate(value_cols[0].cells) if parse_number(c) is None
            )
    else:
        value_cols = [c for c in cols if is_value(c) and c not in ignored_ids]
        if given is None and label_pos is None and len(value_cols) == 2:
            a, b = value_cols
            ids = _pair_rule(a, b, names, headerless, rows)
            if len(ids) == 1:
                label_pos = ids[0].pos
                value_cols = [c for c in value_cols if c is not ids[0]]
                why = f"{shown(ids[0])} (unique integers: an id, not a score)"
    if not value_cols:
        listed = ", ".join(repr(n) for n in names) if not headerless else f"{width} columns"
        raise InputError(f"{source}: no numeric column (columns: {listed}); the scores must be numbers")
    for col in value_cols:
        if col.first_text is not None:
            cell = col.cells[col.first_text]
            cause = number_like(cell, table.decimal)
            hint = f" ({cause})" if cause else ""
            raise InputError(f"{source}: {table.place(col.first_text, col.pos)}: {cell.strip()!r} is not a number{hint}")
        if col.kind == "missing" or col.first_missing is not None:
            row = col.first_missing if col.first_missing is not None else 0
            cell = col.cells[row].strip()
            kind = "NaN" if parse_number(cell) is not None else "a missing value"
            what = "empty cell" if not cell else f"{cell!r} ({kind}) is not allowed (use -inf to mask an entry)"
            raise InputError(f"{source}: {table.place(row, col.pos)}: {what}")
    text_cols = [c for c in cols if c.kind == "text" and c.pos != index_pos]
    for col in text_cols:
        _refuse_number_like(table, col)
    if label_pos is None and text_cols:
        label_pos = text_cols[0].pos
    used = {c.pos for c in value_cols}  # positions: comparing columns would be quadratic
    ignored = [c for c in cols if c.pos != label_pos and c.pos not in used and (column is None or c.kind != "numeric")]
    if ignored and column is None:
        notes.append("ignored " + ", ".join(f"{shown(c)} ({_kind_text(c, ignored_ids)})" for c in ignored))

    labels_text: list[str] | None = None
    if label_pos is not None:
        label_cells = cols[label_pos].cells
        for i, cell in enumerate(label_cells):
            if not cell.strip():
                raise InputError(f"{source}: {table.place(i, label_pos)}: empty label")
        labels_text = [cell.strip() for cell in label_cells]

    for col in value_cols:
        assert col.values is not None
        if col.matrix is not None:
            continue  # the parser checked its infinities (only -inf masks, as written)
        infinite = np.flatnonzero(np.isinf(col.values))
        for i in infinite.tolist():
            check_value(float(col.values[i]), col.cells[i].replace(table.decimal, "."), source, table.place(i, col.pos))

    if len(value_cols) == 1:
        only = value_cols[0]
        assert only.values is not None
        arr = np.ascontiguousarray(only.values).reshape(1, -1)
        if notes or why or len(cols) > 2:
            notes.insert(0, f"read 1 vector of {rows} entries from {shown(only)}"
                         + (f"; labels from {why or shown(cols[label_pos])}" if label_pos is not None else ""))
        loaded = finish(
            arr, source, fmt=table.fmt, labels=labels_text, row_names=(only.name,),
            where=lambda r, c: table.place(c, only.pos), notes=_one_note(notes),
        )
        return with_decisions(
            loaded, row_names_from=f"the name of {shown(only)}",
            labels_from=(why or shown(cols[label_pos])) if label_pos is not None else None,
            ignored=tuple(shown(c) for c in ignored),
        )
    arr = _stack(value_cols, width)
    n_rows = arr.shape[0]
    entry_names = [c.name for c in value_cols]
    n = len(value_cols)
    if notes or why or n <= 3:
        what = f"read {n_rows} vector{'s' * (n_rows != 1)} of {n} entries ({_names_text(entry_names, headerless)})"
        if label_pos is not None:
            what += f"; row names from {why or shown(cols[label_pos])}"
        notes.insert(0, what)
    loaded = finish(
        arr, source, fmt=table.fmt,
        labels=None if headerless else tuple(entry_names),
        row_names=labels_text,
        where=lambda r, c: table.place(r, value_cols[c].pos),
        notes=_one_note(notes),
    )
    return with_decisions(
        loaded, row_names_from=(why or shown(cols[label_pos])) if label_pos is not None else None,
        labels_from=None if headerless else _header_source(table.fmt), ignored=tuple(shown(c) for c in ignored),
    )


def _shown(pos: int, names: Sequence[str], headerless: bool) -> str:
    return f"column {pos + 1}" if headerless else f"column {names[pos]!r}"


def _lead_rule(
    source: str, lead: _Column, others: int, others_integers: bool, names: Sequence[str], headerless: bool,
    rows: int, notes: list[str],
) -> tuple[int | None, str | None]:
    """The first numeric column as row names: pandas' default index 0..N-1, or an id (see the module)."""
    if _named_like_neighbour(names, lead.pos, headerless):
        return None, None
    shown = _shown(lead.pos, names, headerless)
    if lead.pos == 0 and others and _is_range(lead):
        if others_integers:
            notes.append(f"{shown} (0..{rows - 1}) read as scores, not pandas' default index: the other "
                         "columns are integers too; --index-col 0 to read it as row names")
            return None, None
        return 0, f"{shown} (the integers 0..{rows - 1}, pandas' default index)"
    if others >= 2 and _is_id(lead):
        if not others_integers:
            return lead.pos, (f"{shown} (unique integers beside non-integer scores: an id; "
                              "--index-col none to read it as scores)")
        if not headerless and _ID_NAME.fullmatch(lead.name):
            raise InputError(
                f"{source}: column {lead.name!r} holds unique integers, and so do the other numeric columns: "
                f"an id or scores? pass --index-col {lead.name} (row names) or --index-col none (scores)"
            )
    return None, None


def _pair_rule(a: _Column, b: _Column, names: Sequence[str], headerless: bool, rows: int) -> list[_Column]:
    """Of two numeric columns, the one that is an id (unique integers, not named like the other)."""
    ids = [c for c in (a, b) if _is_id(c) and not _named_like_neighbour(names, c.pos, headerless)]
    if len(ids) == 2:  # both integers: an id is 0..N-1 or 1..N
        ids = [c for c in (a, b) if c.values is not None and (
            np.array_equal(c.values, np.arange(rows)) or np.array_equal(c.values, np.arange(1, rows + 1)))]
    return ids


def _read_numbers(
    table: RawTable, numbers: Numbers, names: list[str], given: int | bool | None, index_pos: int | None,
    why: str | None, notes: list[str],
) -> LoadedInput:
    """:func:`read_table` for a table of numbers only, without one Python object per column."""
    matrix = numbers.matrix
    rows, width = matrix.shape
    headerless = table.header is None

    def column(pos: int) -> _Column:
        return _Column(pos, names[pos], numbers.text[pos], "numeric", integers=bool(numbers.integers[pos]),
                       matrix=matrix)

    if given is None and index_pos is None and rows > 1 and width > 1:
        index_pos, why = _lead_rule(table.source, column(0), width - 1, bool(numbers.integers[1:].all()),
                                    names, headerless, rows, notes)
        if index_pos is None and width == 2:
            ids = _pair_rule(column(0), column(1), names, headerless, rows)
            if len(ids) == 1:
                index_pos = ids[0].pos
                why = f"{_shown(index_pos, names, headerless)} (unique integers: an id, not a score)"
    labels_text: list[str] | None = None
    if index_pos is not None:
        label_cells = column(index_pos).cells
        for i, cell in enumerate(label_cells):
            if not cell.strip():
                raise InputError(f"{table.source}: {table.place(i, index_pos)}: empty label")
        labels_text = [cell.strip() for cell in label_cells]
        positions = np.delete(np.arange(width), index_pos)
        arr = np.delete(matrix, index_pos, axis=1)
        entry_names = names[:index_pos] + names[index_pos + 1 :]
    else:
        positions = np.arange(width)
        arr = matrix
        entry_names = names
    if arr.shape[1] == 0:
        raise InputError(f"{table.source}: no numeric column besides the row names")
    label_from = why or (_shown(index_pos, names, headerless) if index_pos is not None else None)
    if arr.shape[1] == 1:
        only = int(positions[0])
        if notes or why or width > 2:
            notes.insert(0, f"read 1 vector of {rows} entries from {_shown(only, names, headerless)}"
                         + (f"; labels from {label_from}" if label_from else ""))
        loaded = finish(
            np.ascontiguousarray(arr).reshape(1, -1), table.source, fmt=table.fmt, labels=labels_text,
            row_names=(names[only],), where=lambda r, c: table.place(c, only), notes=_one_note(notes),
        )
        return with_decisions(loaded, row_names_from=f"the name of {_shown(only, names, headerless)}",
                              labels_from=label_from)
    n = arr.shape[1]
    if notes or why or n <= 3:
        what = f"read {rows} vector{'s' * (rows != 1)} of {n} entries ({_names_text(entry_names, headerless)})"
        if label_from:
            what += f"; row names from {label_from}"
        notes.insert(0, what)
    loaded = finish(
        arr, table.source, fmt=table.fmt,
        labels=None if headerless else tuple(entry_names),
        row_names=labels_text,
        where=lambda r, c: table.place(r, int(positions[c])),
        notes=_one_note(notes),
    )
    return with_decisions(loaded, row_names_from=label_from, labels_from=None if headerless else _header_source(table.fmt))


def _header_source(fmt: str) -> str:
    return "the header" if fmt in ("csv", "tsv") else "the keys"


def _kind_text(col: _Column, ids: list[_Column]) -> str:
    if col in ids:
        return "unique integers: an id"
    return "true/false" if col.kind == "bool" else "text"


def _stack(value_cols: list[_Column], width: int) -> NDArray[np.float64]:
    """The value columns side by side: the parser's matrix itself when they are all of it."""
    matrix = value_cols[0].matrix
    if matrix is not None and all(c.matrix is matrix for c in value_cols):
        positions = [c.pos for c in value_cols]
        if positions == list(range(matrix.shape[1])):
            return matrix
        return matrix[:, positions]
    return np.column_stack([c.values for c in value_cols if c.values is not None])


def _refuse_number_like(table: RawTable, col: _Column) -> None:
    """A text column of numbers written with a typing convention (a Unicode minus, 1,000.5): refused."""
    causes: list[tuple[int, str]] = []
    for i, cell in enumerate(col.cells):
        if cell.strip().lower() in MISSING_MARKERS or parse_number(
            cell.replace(table.decimal, ".") if table.decimal != "." else cell
        ) is not None:
            continue
        cause = number_like(cell, table.decimal)
        if cause is None:
            return  # real text: a label column
        causes.append((i, cause))
    if causes:
        row, cause = causes[0]
        raise InputError(
            f"{table.source}: {table.place(row, col.pos)}: {col.cells[row].strip()!r} is not a number ({cause})"
        )


def _one_note(notes: list[str]) -> tuple[str, ...]:
    """Every inferred choice in one line (deduplicated, in order)."""
    seen: list[str] = []
    for note in notes:
        if note not in seen:
            seen.append(note)
    return ("; ".join(seen),) if seen else ()
