"""CSV and TSV, read the way pandas, polars, numpy and Excel write them and people type them.

Before the layout rule (:mod:`topk_cli.inputs.table`) decides what the columns mean, this
module decides how the text splits, in this order:

1. A UTF-8 byte-order mark is dropped; carriage-return-only line ends (old Mac files) are line
   ends; Excel's ``sep=;`` first line sets the separator (and is not data).
2. Blank lines and lines starting with ``#`` before the first row are skipped.
3. The separator is ``--sep``, a tab for ``.tsv``, Excel's ``sep=`` line, or sniffed among ``,``
   ``;`` and tab (the one that splits every one of the first lines into the same number of fields,
   the rarer separator winning a tie); when none does and every line splits on runs of spaces into
   the same number of fields, all of them numbers below line 1 (``np.savetxt``'s default), runs of
   spaces. ``--sep ' '`` means runs of spaces too.
4. In a ``;``-separated file numbers written with a decimal comma (``1,5``) are decimals.
5. Line 1 is a header or data (``--header`` / ``--no-header`` decide; else :func:`_header`, from
   the whole file). Every row must have as many fields as line 1.

Numbers are parsed a block of rows at a time (numpy parses the block's cells in one call), into
one float matrix; the text of a column is kept only where it may be needed (text columns, the
first column, integer columns). Parsing uses the standard library and numpy (no pandas import).
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import chain

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InputError
from topk_cli.inputs.model import MASK_SPELLINGS, LoadedInput, parse_number, with_decisions
from topk_cli.inputs.table import (
    _DECIMAL_COMMA,
    _INTEGER_TEXT,
    NeedText,
    Numbers,
    RawTable,
    _Column,
    classify,
    numeric_column,
    read_table,
)

SEPARATORS = {",": "','", ";": "';'", "\t": "tab", " ": "spaces"}
_SNIFF_LINES = 50
_CHUNK_CELLS = 1 << 16  # cells parsed per numpy call
_SEP_LINE = re.compile(r"sep=([^\r\n])[ \t]*(?:\r?\n|$)")
_HEADER_INTEGER = re.compile(r"\s*\d+\s*")


def parse_sep(sep: str | None) -> str | None:
    """The separator of ``--sep`` (``\\t``, ``tab`` and a real tab all mean a tab)."""
    if sep is None:
        return None
    if sep in ("\\t", "tab", "TAB", "\t"):
        return "\t"
    if sep in ("\\s+", "space", "spaces"):
        return " "
    if len(sep) != 1 or sep in "\"\r\n":
        raise InputError(f"--sep must be one character (e.g. ',', ';', '\\t', ' '), got {sep!r}")
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
    header: bool | None = None,
) -> LoadedInput:
    """Read CSV/TSV ``text`` (already decoded) into vectors; see the module docstring.

    ``header``: True/False says whether line 1 is a header; None infers it (and says so).
    """
    try:
        return _load(text, source, fmt, sep, decimal, column, index_col, header, keep_text=index_col is not None)
    except NeedText:  # a column's text was dropped while parsing and is needed after all (rare)
        return _load(text, source, fmt, sep, decimal, column, index_col, header, keep_text=True)


def _lines(text: str, pos: int) -> Iterator[str]:
    """The lines of ``text`` from ``pos``, each with its line end (no copy of the whole text)."""
    size = len(text)
    while pos < size:
        end = text.find("\n", pos)
        end = size if end < 0 else end + 1
        yield text[pos:end]
        pos = end


def _load(
    text: str,
    source: str,
    fmt: str,
    sep: str | None,
    decimal: str | None,
    column: str | None,
    index_col: str | None,
    header: bool | None,
    *,
    keep_text: bool,
) -> LoadedInput:
    notes: list[str] = []
    text = text.removeprefix("\ufeff")
    if "\r" in text and "\n" not in text:  # classic Mac OS line ends: nothing else uses a lone CR
        text = text.replace("\r", "\n")
    delimiter = parse_sep(sep)
    pos = 0
    skipped = 0  # lines before the first row
    directive = _SEP_LINE.match(text)
    if directive is not None:  # Excel's separator directive ("sep=;" alone on line 1)
        pos = directive.end()
        skipped = 1
        if delimiter is None:
            delimiter = directive.group(1)
            notes.append(f"separator {SEPARATORS.get(delimiter, repr(delimiter))} from line 1 ('sep=', as Excel writes)")
    comments = 0
    lines = _lines(text, pos)
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            break
        comments += line.lstrip().startswith("#")
        skipped += 1
        pos += len(line)
    else:
        raise InputError(f"{source}: no data (only blank or '#' comment lines)")
    if comments:
        notes.append(f"skipped {comments} comment line{'s' * (comments > 1)} starting with '#'")
    sample: list[str] = []
    for line in _lines(text, pos):
        if line.strip():
            sample.append(line)
            if len(sample) == _SNIFF_LINES:
                break
    if delimiter is None:
        if fmt == "tsv":
            delimiter = "\t"
        else:
            delimiter, why = _sniff_separator(sample)
            if why:
                notes.append(why)
    if decimal is not None and (len(decimal) != 1 or decimal == delimiter):
        raise InputError(f"--decimal must be one character other than the separator, got {decimal!r}")
    if decimal is None:
        decimal = "."
        if delimiter == ";" and _has_decimal_commas(_split(sample, ";")):
            decimal = ","
            notes.append("decimal commas detected (';'-separated, as European Excel writes; --decimal . to refuse)")

    rows = _rows(text, pos, skipped, delimiter, source)
    first_line, first = next(rows)
    width = len(first)
    body = _Body(width, decimal, keep_text)
    chunk: list[list[str]] = []
    chunk_lines: list[int] = []
    cells = 0
    for line_number, cells_of_row in rows:
        if len(cells_of_row) != width:
            if chunk:
                body.add(chunk, chunk_lines)
            if header is None:
                classes = [classify(j, "", c, decimal) for j, c in enumerate(body.columns())]
                header = _header(first, [c.kind for c in classes], [c.integers for c in classes], body.count,
                                 decimal)[0]
            _ragged(source, body.count + (not header), line_number, cells_of_row, width, delimiter, header)
        chunk.append(cells_of_row)
        chunk_lines.append(line_number)
        cells += width
        if cells >= _CHUNK_CELLS:
            body.add(chunk, chunk_lines)
            chunk, chunk_lines, cells = [], [], 0
    if chunk:
        body.add(chunk, chunk_lines)
    del chunk, chunk_lines

    body_classes: list[_Column] | None = None
    first_values: NDArray[np.float64] | None = None
    if header is None and body.count:
        if body.good.all():
            kinds, integers = ["numeric"] * width, body.integers.tolist()
        else:
            body_classes = [classify(j, "", col, decimal) for j, col in enumerate(body.columns())]
            kinds, integers = [c.kind for c in body_classes], [c.integers for c in body_classes]
        is_header, header_note = _header(first, kinds, integers, body.count, decimal)
        if header_note:
            notes.append(header_note)
    else:
        first_values = _parse(first, decimal) if header is None else None
        is_header = header if header is not None else _header(first, [], [], 0, decimal, first_values is not None)[0]
    if is_header:
        names: list[str] | None = [cell.strip() for cell in first]
        assert names is not None
        twice = [name for name, count in Counter(names).items() if count > 1 and name]
        if twice:
            raise InputError(f"{source}: line {first_line} (header): duplicate column name {twice[0]!r}")
        line_numbers = body.line_numbers()
    else:
        names = None
        body.add_first_row(first, first_line, first_values)
        body_classes = None
        line_numbers = body.line_numbers()
    numbers: Numbers | None = None
    columns: list[Sequence[str] | _Column] = []
    if body.count and body.good.all():
        numbers = Numbers(body.matrix(), body.integers, body.text)
    elif body_classes is not None:
        columns = list(body_classes)
    else:
        columns = [classify(j, "", col, decimal) for j, col in enumerate(body.columns())]

    def row_place(row: int) -> str:
        return f"line {line_numbers[row]}"  # as editors number lines

    def place(row: int, col: int) -> str:
        name = f"column {names[col]!r}" if names is not None else f"column {col + 1}"
        return f"{row_place(row)}, {name}"

    table = RawTable(source, fmt, names, columns, place, row_place, tuple(notes), decimal, numbers)
    loaded = read_table(table, column=column, index_col=index_col)
    return with_decisions(loaded, separator=delimiter, decimal=decimal, header=bool(is_header))


def _rows(text: str, pos: int, skipped: int, delimiter: str, source: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of every non-blank row from ``pos``; blank lines are skipped."""
    if delimiter == " ":  # runs of spaces (np.savetxt, aligned columns): no quoting
        for number, line in enumerate(_lines(text, pos), start=skipped + 1):
            cells = line.split()
            if cells:
                yield number, cells
        return
    reader = csv.reader(_lines(text, pos), delimiter=delimiter, strict=True)
    previous = 0
    try:
        for cells in reader:
            line_number = previous + 1 + skipped
            previous = reader.line_num
            if not cells or (len(cells) == 1 and cells[0] and not cells[0].strip()):
                continue  # a blank line (a quoted "" is a missing value); line numbers are kept
            yield line_number, cells
    except csv.Error as exc:
        at = reader.line_num + skipped
        if "new-line character" in str(exc):  # csv's own words point at a Python file mode
            raise InputError(f"{source}: line {at}: a carriage return (CR) inside a line, outside quotes "
                             "(mixed line ends? save the file with one kind of line end)") from None
        raise InputError(f"{source}: line {at}: malformed CSV ({exc})") from None


def _ragged(source: str, row: int, line: int, cells: list[str], width: int, delimiter: str, header: bool) -> None:
    """Refuse a row with more or fewer fields than line 1."""
    kind = "ragged rows: an extra field" if len(cells) > width else "ragged rows"
    if width == 1 and delimiter == "," and _DECIMAL_COMMA.fullmatch(",".join(cells)):
        kind += "; decimal commas? pass --sep ';' --decimal ,"
    what = "the header has" if header else "line 1 has"
    raise InputError(f"{source}: line {line}: {len(cells)} fields, {what} {width} ({kind})")


class _Body:
    """The rows below line 1, parsed a block at a time into one float matrix.

    Per column: ``good`` (every cell so far a finite number or a ``-inf`` mask), ``integers``
    (every cell written as an integer), and the cells' text while it may be needed.
    """

    def __init__(self, width: int, decimal: str, keep_text: bool) -> None:
        self.width = width
        self.decimal = decimal
        self.keep_text = keep_text
        self.blocks: list[NDArray[np.float64]] = []
        self.lines: list[NDArray[np.int64]] = []
        self.good = np.ones(width, dtype=bool)
        self.integers = np.ones(width, dtype=bool)
        self.text: list[list[str] | None] = [None] * width
        self.kept: list[int] = []
        self.has_text = np.zeros(width, dtype=bool)
        self.count = 0

    def add(self, rows: list[list[str]], lines: list[int], parsed: NDArray[np.float64] | None = None) -> None:
        r, w = len(rows), self.width
        flat = list(chain.from_iterable(rows))
        values = parsed if parsed is not None else _parse(flat, self.decimal)
        good = np.ones(w, dtype=bool)
        if values is None:
            values = np.full((r, w), np.nan)
            good[:] = False
            rest = _parse([c for row in rows for c in row[1:]], self.decimal) if w > 2 else None
            if rest is not None:  # the usual case: a text column first (labels), numbers after it
                values[:, 1:] = rest.reshape(r, w - 1)
                good[1:] = True
            for j in np.flatnonzero(~good).tolist():
                col = _parse([row[j] for row in rows], self.decimal)
                if col is not None:
                    values[:, j] = col
                    good[j] = True
        else:
            values = values.reshape(r, w)
        finite = np.isfinite(values)
        for j in np.flatnonzero(good & ~finite.all(axis=0)).tolist():
            bad = np.flatnonzero(~finite[:, j]).tolist()
            if not all(rows[i][j].strip().lower() in MASK_SPELLINGS for i in bad):
                good[j] = False  # NaN, +inf, 1e400: refused later with the cell's text
        integral = good & self.integers & np.where(finite, values == np.trunc(values), False).all(axis=0)
        written = np.zeros(w, dtype=bool)
        candidates = np.flatnonzero(integral)
        if candidates.size == w and _INTEGER_TEXT.fullmatch("".join(flat)):
            written[:] = True
        else:
            for j in candidates.tolist():
                written[j] = bool(_INTEGER_TEXT.fullmatch("".join(row[j] for row in rows)))
        self.integers &= written
        self.good &= good
        keep = ~self.good | self.integers
        keep[0] = True
        if self.keep_text:
            keep[:] = True
        if not self.count:
            self.kept = np.flatnonzero(keep).tolist()
            for j in self.kept:
                self.text[j] = [row[j] for row in rows]
        else:
            if (keep & ~self.has_text).any():
                raise NeedText(int(np.argmax(keep & ~self.has_text)))
            for j in self.kept:
                kept = self.text[j]
                assert kept is not None
                if keep[j]:
                    kept.extend(row[j] for row in rows)
                else:
                    self.text[j] = None
            self.kept = [j for j in self.kept if keep[j]]
        self.has_text = keep.copy() if not self.count else self.has_text & keep
        self.blocks.append(values)
        self.lines.append(np.asarray(lines, dtype=np.int64))
        self.count += r

    def matrix(self) -> NDArray[np.float64]:
        if not self.blocks:
            return np.empty((0, self.width))
        if len(self.blocks) > 1:
            self.blocks = [np.concatenate(self.blocks)]
        return self.blocks[0]

    def line_numbers(self) -> NDArray[np.int64]:
        return np.concatenate(self.lines) if self.lines else np.empty(0, dtype=np.int64)

    def columns(self) -> list[Sequence[str] | _Column]:
        """One entry per column: its text, or its numbers (and its text where kept)."""
        if not self.count:
            return [[] for _ in range(self.width)]
        matrix = self.matrix()
        out: list[Sequence[str] | _Column] = []
        for j, good, integers, text in zip(range(self.width), self.good.tolist(), self.integers.tolist(), self.text,
                                           strict=True):
            if good:
                out.append(numeric_column(matrix, j, integers, text))
            elif text is None:
                raise NeedText(j)
            else:
                out.append(text)
        return out

    def add_first_row(self, first: list[str], line: int, parsed: NDArray[np.float64] | None = None) -> None:
        """Put line 1 (data, not a header) on top (``parsed``: its numbers, when already parsed)."""
        w = self.width
        if not self.count:
            self.add([first], [line], parsed)
            return
        parsed = _parse(first, self.decimal)
        row = parsed if parsed is not None else np.array(
            [_number_or_nan(cell, self.decimal) for cell in first], dtype=np.float64
        )
        finite = np.isfinite(row)
        ok = finite | np.array([cell.strip().lower() in MASK_SPELLINGS for cell in first])
        if parsed is None:
            ok &= np.array([parse_number(c.replace(self.decimal, ".") if self.decimal != "." else c) is not None
                            for c in first])
        integer = np.array([bool(_INTEGER_TEXT.fullmatch(cell)) and cell.strip() != "" for cell in first]) & finite
        self.good &= ok
        self.integers &= integer
        self.blocks = [np.concatenate([row.reshape(1, w), self.matrix()])]
        self.lines = [np.asarray([line], dtype=np.int64), *self.lines]
        self.count += 1
        if (~self.good & ~self.has_text).any():
            raise NeedText(int(np.argmax(~self.good & ~self.has_text)))
        for j in self.kept:
            text = self.text[j]
            assert text is not None
            text.insert(0, first[j])


def _parse(cells: list[str], decimal: str) -> NDArray[np.float64] | None:
    """The cells as float64, or None when one of them is not a number (see :func:`parse_number`)."""
    if not cells:
        return np.empty(0)
    joined = "".join(cells)
    if "_" in joined or not joined.isascii():  # numpy accepts 1_000 and non-ASCII digits: Python's float() not
        return None
    if decimal != ".":
        cells = [c.replace(decimal, ".") for c in cells]
    try:  # Python's float() is parse_number's grammar once '_' and non-ASCII are excluded, and faster than numpy's
        return np.fromiter(map(float, cells), dtype=np.float64, count=len(cells))
    except ValueError:
        return None


def _number_or_nan(cell: str, decimal: str) -> float:
    number = parse_number(cell.replace(decimal, ".") if decimal != "." else cell)
    return np.nan if number is None else number


def _sniff_separator(sample: list[str]) -> tuple[str, str | None]:
    """The separator, and the note saying how it was chosen (None for a plain comma)."""
    anywhere = [c for c in ("\t", ";", ",") if any(c in line for line in sample)]
    if len(anywhere) == 1 and all(anywhere[0] in line for line in sample):  # the only candidate: no counting
        return anywhere[0], None if anywhere[0] == "," else f"separator {SEPARATORS[anywhere[0]]} detected"
    consistent: list[str] = []
    for candidate in ("\t", ";", ","):
        if not all(candidate in line for line in sample):
            continue
        counts = {len(row) for row in _split(sample, candidate)}
        if len(counts) == 1 and counts.pop() > 1:
            consistent.append(candidate)
    if consistent:
        found = consistent[0]
        return found, None if found == "," else f"separator {SEPARATORS[found]} detected"
    present = [c for c in ("\t", ";", ",") if c in sample[0]]
    if len(present) == 1:
        return present[0], None if present[0] == "," else f"separator {SEPARATORS[present[0]]} detected"
    if not present and not any(c in line for line in sample for c in "\t;,"):
        split = [line.split() for line in sample]
        counts = {len(cells) for cells in split}
        if len(counts) == 1 and counts.pop() > 1 and all(
            parse_number(cell) is not None for cells in split[1:] for cell in cells
        ) and (len(split) > 1 or all(parse_number(cell) is not None for cell in split[0])):
            return " ", (
                "separator: runs of spaces (every line splits on spaces into the same number of numbers, "
                "as np.savetxt writes; --sep to override)"
            )
    return ",", None


def _split(sample: list[str], delimiter: str) -> list[list[str]]:
    """The sample lines split into fields ([] when they are not valid CSV: the full read says where)."""
    try:
        return list(csv.reader(sample, delimiter=delimiter))
    except csv.Error:
        return []


def _has_decimal_commas(rows: list[list[str]]) -> bool:
    for cells in rows[1:6] if len(rows) > 1 else rows:
        for cell in cells:
            if _DECIMAL_COMMA.fullmatch(cell):
                return True
    return False


def _header(
    first: list[str], kinds: Sequence[str], integers: Sequence[bool], rows: int, decimal: str,
    first_numbers: bool = False,
) -> tuple[bool, str | None]:
    """Whether line 1 is a header, from line 1 and the kind of each column below it; and the note.

    In order: one line alone is data unless it has no number; an empty first cell above named
    columns is pandas' unnamed index (a header); a text cell above a numeric column, or no number
    at all on line 1, is a header; line 1's numbers being distinct non-negative integers (at least
    two) above columns of non-integer numbers is a header (column ids: ``columns=ids``, pandas'
    default names 0..m-1); above columns of integers they are data like the rest (announced).
    Anything else is data.
    """
    width = len(first)
    if first_numbers:
        numbers = [True] * width
    else:
        numbers = [parse_number(cell.replace(decimal, ".") if decimal != "." else cell) is not None for cell in first]
    if rows == 0:  # one line: names without data (refused later), or one row of data
        return not any(numbers), None
    rest = [cell.strip() for cell in first[1:]]
    if width > 1 and not first[0].strip() and all(rest):
        return True, None  # pandas' index column has no name
    numeric_below = [kind in ("numeric", "missing") for kind in kinds]
    for cell, is_number, below in zip(first, numbers, numeric_below, strict=True):
        if not is_number and cell.strip() and below:
            return True, None  # a name above numbers
    if not any(numbers):
        return True, None  # all text above data: names
    ids = [cell.strip() for cell, is_number in zip(first, numbers, strict=True) if is_number]
    id_cols = [(kind, integer) for kind, integer, is_number in zip(kinds, integers, numbers, strict=True) if is_number]
    if len(ids) >= 2 and len(set(ids)) == len(ids) and all(_HEADER_INTEGER.fullmatch(c) for c in ids):
        shown = ",".join(ids[:2]) + (",..." if len(ids) > 2 else "")
        if all(kind == "numeric" for kind, _ in id_cols) and not all(integer for _, integer in id_cols):
            return True, (f"line 1 ({shown}) read as column names (integers above non-integer numbers; "
                          "--no-header to read it as data)")
        if all(kind == "numeric" and integer for kind, integer in id_cols):
            return False, (f"line 1 ({shown}) read as data, not column names (the numbers below are integers "
                           "too; --header to read it as names)")
    return False, None
