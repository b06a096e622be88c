"""CSV and TSV, read the way pandas writes them (``df.to_csv()``) and Excel saves them.

Before the layout rule (:mod:`topk_cli.inputs.table`) decides what the columns mean, this
module decides how the text splits: a UTF-8 byte-order mark is dropped; blank lines and lines
starting with ``#`` before the first row are skipped; the separator is ``--sep``, a tab for
``.tsv``, or sniffed among ``,`` ``;`` and tab (the one that splits every one of the first lines
into the same number of fields, the rarer separator winning a tie); in a ``;``-separated file
numbers written with a decimal comma (``1,5``) are read as decimals, as European Excel means
them. Line 1 is a header when a cell of it is text where the next line has a number, when its
first cell is empty (pandas' unnamed index), or when it is exactly ``0,1,...,m-1`` above more
rows (pandas' default column names). Every row must have as many fields as line 1.

Parsing uses the standard library only (no pandas import), in one pass over the text.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence

import numpy as np

from topk_cli.errors import InputError
from topk_cli.inputs.model import LoadedInput, parse_number
from topk_cli.inputs.table import _DECIMAL_COMMA, RawTable, read_table

SEPARATORS = {",": "','", ";": "';'", "\t": "tab"}
_SNIFF_LINES = 50


def parse_sep(sep: str | None) -> str | None:
    """The separator of ``--sep`` (``\\t``, ``tab`` and a real tab all mean a tab)."""
    if sep is None:
        return None
    if sep in ("\\t", "tab", "TAB", "\t"):
        return "\t"
    if len(sep) != 1 or sep in "\"\r\n":
        raise InputError(f"--sep must be one character (e.g. ',', ';', '\\t'), got {sep!r}")
    return sep


def load_csv(
    text: str,
    source: str,
    *,
    fmt: str = "csv",
    sep: str | None = None,
    decimal: str | None = None,
    column: str | None = None,
    index_col: str | None = None,
) -> LoadedInput:
    """Read CSV/TSV ``text`` (already decoded) into vectors; see the module docstring."""
    notes: list[str] = []
    text = text.removeprefix("\ufeff")
    lines = text.splitlines(keepends=True)
    start = 0
    comments = 0
    while start < len(lines) and (not lines[start].strip() or lines[start].lstrip().startswith("#")):
        comments += lines[start].lstrip().startswith("#")
        start += 1
    if start == len(lines):
        raise InputError(f"{source}: no data (only blank or '#' comment lines)")
    if comments:
        notes.append(f"skipped {comments} comment line{'s' * (comments > 1)} starting with '#'")
    sample = [line for line in lines[start : start + _SNIFF_LINES] if line.strip()]
    delimiter = parse_sep(sep)
    if delimiter is None:
        if fmt == "tsv":
            delimiter = "\t"
        else:
            delimiter = _sniff_separator(sample)
            if delimiter != ",":
                notes.append(f"separator {SEPARATORS[delimiter]} detected")
    if decimal is not None and (len(decimal) != 1 or decimal == delimiter):
        raise InputError(f"--decimal must be one character other than the separator, got {decimal!r}")
    body = "".join(lines[start:])
    reader = csv.reader(io.StringIO(body), delimiter=delimiter, strict=True)
    rows: list[list[str]] = []
    line_numbers: list[int] = []
    previous = 0
    try:
        for cells in reader:
            first_line = previous + 1 + start
            previous = reader.line_num
            if not cells or (len(cells) == 1 and not cells[0].strip() and '"' not in lines[first_line - 1]):
                continue  # blank lines are skipped (a quoted "" is a missing value); line numbers kept
            rows.append(cells)
            line_numbers.append(first_line)
    except csv.Error as exc:
        raise InputError(f"{source}: line {reader.line_num + start}: malformed CSV ({exc})") from None
    if decimal is None:
        decimal = "."
        if delimiter == ";" and _has_decimal_commas(rows):
            decimal = ","
            notes.append("decimal commas detected (';'-separated, as European Excel writes; --decimal . to refuse)")
    header, header_note = _header(rows, decimal)
    if header_note:
        notes.append(header_note)
    width = len(rows[0])
    data = rows[1:] if header is not None else rows
    data_lines = line_numbers[1:] if header is not None else line_numbers
    what = "the header has" if header is not None else "line 1 has"
    for r, cells in enumerate(data):
        if len(cells) != width:
            kind = "ragged rows: an extra field" if len(cells) > width else "ragged rows"
            if width == 1 and delimiter == "," and all(_DECIMAL_COMMA.fullmatch(",".join(c)) for c in data[r : r + 3]):
                kind += "; decimal commas? pass --sep ';' --decimal ,"
            raise InputError(
                f"{source}: row {r + 1} (line {data_lines[r]}): {len(cells)} fields, {what} {width} ({kind})"
            )
    if header is not None:
        header = [cell.strip() for cell in header]
        twice = [name for name, count in Counter(header).items() if count > 1 and name]
        if twice:
            raise InputError(f"{source}: line {line_numbers[0]} (header): duplicate column name {twice[0]!r}")
    columns: list[Sequence[str]] = [list(col) for col in zip(*data, strict=True)] if data else [[] for _ in range(width)]
    lines_arr = np.asarray(data_lines, dtype=np.int64)
    names = header

    def row_place(row: int) -> str:
        return f"row {row + 1} (line {lines_arr[row]})"

    def place(row: int, col: int) -> str:
        name = f"column {names[col]!r}" if names is not None else f"column {col + 1}"
        return f"{row_place(row)}, {name}"

    table = RawTable(source, fmt, header, columns, place, row_place, tuple(notes), decimal)
    return read_table(table, column=column, index_col=index_col)


def _sniff_separator(sample: list[str]) -> str:
    """The candidate splitting every sample line into the same number (> 1) of fields."""
    consistent: list[tuple[str, int]] = []
    for candidate in ("\t", ";", ","):
        if not all(candidate in line for line in sample):
            continue
        counts = {len(row) for row in csv.reader(sample, delimiter=candidate)}
        if len(counts) == 1 and counts.pop() > 1:
            consistent.append((candidate, 0))
    if consistent:
        return consistent[0][0]
    present = [c for c in ("\t", ";", ",") if c in sample[0]]
    if len(present) == 1:
        return present[0]
    return ","


def _has_decimal_commas(rows: list[list[str]]) -> bool:
    for cells in rows[1:6] if len(rows) > 1 else rows:
        for cell in cells:
            if _DECIMAL_COMMA.fullmatch(cell):
                return True
    return False


def _number(cell: str, decimal: str) -> float | None:
    return parse_number(cell.replace(decimal, ".") if decimal != "." else cell)


def _header(rows: list[list[str]], decimal: str) -> tuple[list[str] | None, str | None]:
    """Line 1 as a header, or None when it is data (see the module docstring)."""
    first = rows[0]
    second = rows[1] if len(rows) > 1 else None
    kinds = [_number(cell, decimal) is not None for cell in first]
    rest = [cell.strip() for cell in first[1:]]
    if len(first) > 1 and not first[0].strip() and all(rest) and (
        not all(kinds[1:]) or all(cell.lstrip("-").isdigit() for cell in rest)
    ):
        return first, None  # pandas' index column has no name (names are text or integers)
    numbers = [cell.strip() for cell, is_number in zip(first, kinds, strict=True) if is_number]
    if second is not None and not all(kinds) and len(numbers) >= 2 and numbers == [str(i) for i in range(len(numbers))]:
        return first, None  # text names and 0, 1, 2...: pandas' default column names after a text column
    if all(kinds):
        integers = [cell.strip() for cell in first]
        if second is not None and len(first) > 1 and integers == [str(i) for i in range(len(first))]:
            return first, "line 1 (0,1,...) read as column names (pandas' default names)"
        if second is not None and len(first) > 1 and not integers[0] and integers[1:] == [
            str(i) for i in range(len(first) - 1)
        ]:
            return first, None
        return None, None
    if second is None:  # one line: names without data (refused later), or one row of data
        return (first, None) if not any(kinds) else (None, None)
    for cell, is_number, below in zip(first, kinds, second, strict=False):
        if not is_number and cell.strip() and _number(below, decimal) is not None:
            return first, None
    if not any(kinds):
        return first, None  # all text above data: names
    return None, None
