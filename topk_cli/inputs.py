"""Load score vectors from CSV, JSON, NPY, stdin or an inline ``--values`` string.

The only pandas importer; pandas is imported lazily (inside the CSV reader) so that
``softtopk --help`` stays fast. Every loader returns a :class:`LoadedInput` whose ``values`` is
a 2-D float64 array ``(rows, n)``: one row per vector.

Layouts (SPEC.md):

- CSV with exactly one numeric column: one vector; the first text column, if any, labels it.
- CSV with several numeric columns: every row is a vector (e.g. router logits, one row per
  token, one column per expert); the header names label the entries and the first text
  column, if any, names the rows. ``column=NAME`` selects one column as the single vector.
  A CSV whose first line is all numbers has no header.
- JSON: a list of numbers, a list of equal-length lists, or an object ``{label: number}``.
  JSON has no infinity token: write ``"-inf"`` (or ``"-Infinity"``) as a string to mask.
- NPY: a 1-D or 2-D array of real numbers.
- ``values="3,2,1,4"`` (``;`` separates the rows of a batch: ``"3,2,1;4,5,6"``).

``-inf`` masks an entry. Empty cells, text in numeric cells, ragged rows, NaN and ``+inf`` are
:class:`~topk_cli.errors.InputError` with a message naming the file, the row (1-based, with
the line number in the file) and the column (by header name).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InputError

#: Input formats, for ``--input-format`` and suffix detection.
INPUT_FORMATS = ("csv", "json", "npy")

_NUMERIC_MAJORITY = 0.5  # a text column whose cells are mostly numbers is a numeric column with bad cells


class IndexNames(Sequence[str]):
    """The names ``"0"``, ``"1"``, ... of unlabelled entries or rows, without storing them.

    A 10^7-entry vector needs no 10^7 Python strings.

    >>> names = IndexNames(3)
    >>> len(names), names[2], list(names)
    (3, '2', ['0', '1', '2'])
    """

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [str(i) for i in range(self._length)[index]]
        if not -self._length <= index < self._length:
            raise IndexError(index)
        return str(index % self._length)

    def __iter__(self) -> Iterator[str]:
        return (str(i) for i in range(self._length))

    def __repr__(self) -> str:
        return f"IndexNames({self._length})"


@dataclass(frozen=True)
class LoadedInput:
    """Vectors read from one source: ``values`` is always 2-D ``(rows, n)``.

    ``labels`` names the n entries (header names, a label column, JSON keys, or
    ``"0"..."n-1"``); ``row_names`` names the rows (a text column of a batch CSV, or
    ``"0"...``); ``source`` is the file name as given, ``"<stdin>"`` or ``"--values"``;
    ``input_format`` is ``csv``, ``json``, ``npy`` or ``values``.
    """

    values: NDArray[np.float64]
    labels: Sequence[str]  # one per entry (column), length n
    row_names: Sequence[str]  # one per row
    source: str  # file name, "<stdin>" or "--values"
    input_format: str = "values"
    row_names_given: bool = False  # True when row_names come from the data, not indexes

    @property
    def single(self) -> bool:
        """True when the source held one vector (not a batch)."""
        return self.values.shape[0] == 1


def load_input(
    path: str | None,
    *,
    values: str | None = None,
    column: str | None = None,
    input_format: str | None = None,
) -> LoadedInput:
    """Read the vectors of ``path`` (``"-"`` = stdin) or of the inline string ``values``.

    The format comes from ``input_format`` or the suffix (``.csv``, ``.json``, ``.npy``); stdin
    without ``input_format`` is sniffed (``[``/``{`` = JSON, the NPY magic, else CSV).

    Raises:
        InputError: unreadable source, unknown format, malformed content, empty cells, text in
            numeric cells, ragged rows, NaN or ``+inf``; the message names file, row and column.

    >>> loaded = load_input(None, values="3,2,-inf")
    >>> loaded.values, list(loaded.labels)
    (array([[  3.,   2., -inf]]), ['0', '1', '2'])
    """
    if values is not None:
        if path is not None:
            raise InputError("give either an input file or --values, not both")
        return _parse_values(values)
    if path is None:
        raise InputError("no input: give a file (or '-' for stdin) or --values 3,2,1,4")
    source = "<stdin>" if path == "-" else path
    data = _read_bytes(path)
    fmt = _resolve_format(path, input_format)
    if fmt is None:
        fmt = _sniff(data)
    if column is not None and fmt != "csv":
        raise InputError(f"{source}: --column applies to CSV input only (this input is {fmt})")
    if fmt == "npy":
        return _load_npy(data, source)
    if b"\x00" in data[:65536]:
        raise InputError(f"{source}: binary data (NUL bytes), not a {fmt.upper()} text file")
    _check_utf8(data, source)
    if fmt == "json":
        return _load_json(data, source)
    return _load_csv(data, source, column)


# ---- sources and formats -------------------------------------------------------------------


def _resolve_format(path: str, input_format: str | None) -> str | None:
    if input_format is not None:
        fmt = input_format.strip().lower().lstrip(".")
        if fmt not in INPUT_FORMATS:
            raise InputError(f"unknown --input-format {input_format!r}; valid formats: {', '.join(INPUT_FORMATS)}")
        return fmt
    if path == "-":
        return None
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix in INPUT_FORMATS:
        return suffix
    shown = f"suffix '.{suffix}'" if suffix else "no suffix"
    raise InputError(
        f"{path}: cannot tell the format from {shown}; rename it or pass --input-format csv|json|npy"
    )


def _read_bytes(path: str) -> bytes:
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is not None:
            data: bytes = stream.read()
        else:  # a text-only stdin (embedding, some test runners)
            data = sys.stdin.read().encode("utf-8")
        if not data.strip():
            raise InputError("<stdin>: empty input")
        return data
    target = Path(path)
    try:
        if target.is_dir():
            raise InputError(f"{path}: is a directory, not a file")
        data = target.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not data.strip():
        raise InputError(f"{path}: the file is empty")
    return data


def _sniff(data: bytes) -> str:
    if data.startswith(b"\x93NUMPY"):
        return "npy"
    head = data.lstrip()[:1]
    return "json" if head in (b"[", b"{") else "csv"


def _check_utf8(data: bytes, source: str) -> None:
    if data.isascii():
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    chunk = 1 << 20
    for start in range(0, len(data), chunk):  # chunked: no second copy of a big file
        try:
            decoder.decode(data[start : start + chunk], final=start + chunk >= len(data))
        except UnicodeDecodeError as exc:
            pos = start + exc.start
            line = data.count(b"\n", 0, pos) + 1
            raise InputError(
                f"{source}: line {line}: not UTF-8 text (byte 0x{data[pos]:02x} at offset {pos}); "
                "save the file as UTF-8"
            ) from None


def _finish(
    arr: NDArray[np.float64],
    source: str,
    *,
    fmt: str,
    labels: Sequence[str] | None = None,
    row_names: Sequence[str] | None = None,
    where: Any = None,
) -> LoadedInput:
    """Reject NaN and +inf (naming the cell through ``where(row, col)``) and wrap the result."""
    bad = np.isnan(arr) | (arr == np.inf)
    if bad.any():
        row = int(np.argmax(bad.any(axis=1)))
        col = int(np.argmax(bad[row]))
        what = "NaN" if np.isnan(arr[row, col]) else "+inf"
        place = where(row, col) if where is not None else f"row {row + 1}, entry {col + 1}"
        raise InputError(f"{source}: {place}: {what} is not allowed (use -inf to mask an entry)")
    rows, n = arr.shape
    return LoadedInput(
        values=arr,
        labels=labels if labels is not None else IndexNames(n),
        row_names=row_names if row_names is not None else IndexNames(rows),
        source=source,
        input_format=fmt,
        row_names_given=row_names is not None,
    )


def _parse_number(text: str) -> float | None:
    """A float from a user's string (``-inf``/``-Infinity`` accepted); None when not a number."""
    try:
        return float(text.strip())
    except ValueError:
        return None


# ---- --values ------------------------------------------------------------------------------


def _parse_values(text: str) -> LoadedInput:
    rows_text = [r for r in text.split(";")]
    rows: list[list[float]] = []
    for r, row_text in enumerate(rows_text):
        row: list[float] = []
        for c, cell in enumerate(row_text.split(",")):
            place = f"entry {c + 1}" if len(rows_text) == 1 else f"row {r + 1}, entry {c + 1}"
            if not cell.strip():
                raise InputError(f"--values: {place} is empty (write e.g. --values 3,2,1,4)")
            value = _parse_number(cell)
            if value is None:
                raise InputError(f"--values: {place}: {cell.strip()!r} is not a number")
            row.append(value)
        if rows and len(row) != len(rows[0]):
            raise InputError(
                f"--values: row {r + 1} has {len(row)} entries, row 1 has {len(rows[0])} (rows are separated by ';')"
            )
        rows.append(row)
    arr = np.asarray(rows, dtype=np.float64)

    def where(row: int, col: int) -> str:
        return f"entry {col + 1}" if len(rows) == 1 else f"row {row + 1}, entry {col + 1}"

    return _finish(arr, "--values", fmt="values", where=where)


# ---- NPY -----------------------------------------------------------------------------------


def _load_npy(data: bytes, source: str) -> LoadedInput:
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{source}: not a valid .npy file ({exc})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iuf":
        kind = getattr(arr, "dtype", type(arr))
        raise InputError(f"{source}: expected an array of real numbers, got {kind}")
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise InputError(f"{source}: expected a non-empty 1-D vector or 2-D batch, got shape {arr.shape}")
    values = np.ascontiguousarray(arr, dtype=np.float64).reshape(-1, arr.shape[-1])
    one = arr.ndim == 1

    def where(row: int, col: int) -> str:
        return f"index [{col}]" if one else f"index [{row}, {col}]"

    return _finish(values, source, fmt="npy", where=where)


# ---- JSON ----------------------------------------------------------------------------------

_SHAPE_HELP = "expected a list of numbers, a list of equal-length lists, or an object {label: number}"


def _json_number(item: object, source: str, place: str) -> float:
    if isinstance(item, bool) or not isinstance(item, (int, float, str)):
        kind = "a list" if isinstance(item, list) else "an object" if isinstance(item, dict) else type(item).__name__
        if isinstance(item, bool) or item is None:
            kind = json.dumps(item)
        raise InputError(f"{source}: {place}: {kind} is not a number ({_SHAPE_HELP})")
    if isinstance(item, str):
        value = _parse_number(item)
        if value is None:
            raise InputError(f"{source}: {place}: {item!r} is not a number")
        if value == -math.inf:
            return value
        if not math.isfinite(value):
            raise InputError(f"{source}: {place}: {item!r} is not allowed (only \"-inf\" strings, which mask an entry)")
        return value
    return float(item)


def _load_json(data: bytes, source: str) -> LoadedInput:
    def constant(name: str) -> float:
        if name == "-Infinity":
            return -math.inf
        raise InputError(f"{source}: {name} is not allowed (use \"-inf\" to mask an entry)")

    try:
        doc = json.loads(data, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{source}: malformed JSON: nested too deeply") from None
    if isinstance(doc, dict):
        if not doc:
            raise InputError(f"{source}: the object is empty ({_SHAPE_HELP})")
        labels = tuple(doc)
        vec = [_json_number(v, source, f"key {key!r}") for key, v in doc.items()]
        arr = np.asarray([vec], dtype=np.float64)
        return _finish(arr, source, fmt="json", labels=labels, where=lambda r, c: f"key {labels[c]!r}")
    if not isinstance(doc, list) or not doc:
        what = "an empty list" if isinstance(doc, list) else f"a {type(doc).__name__}"
        raise InputError(f"{source}: got {what}; {_SHAPE_HELP}")
    if all(isinstance(item, list) for item in doc):
        return _load_json_batch(doc, source)
    if any(isinstance(item, list) for item in doc):
        first = next(i for i, item in enumerate(doc) if isinstance(item, list) != isinstance(doc[0], list))
        raise InputError(f"{source}: item [{first}] mixes lists and numbers; {_SHAPE_HELP}")
    try:  # fast path: a plain list of numbers converts in C
        arr = np.asarray(doc, dtype=np.float64)
        if any(isinstance(item, bool) for item in doc):
            raise TypeError
    except (TypeError, ValueError):
        arr = np.asarray([_json_number(item, source, f"entry {c + 1} ([{c}])") for c, item in enumerate(doc)])
    return _finish(arr.reshape(1, -1), source, fmt="json", where=lambda r, c: f"entry {c + 1} ([{c}])")


def _load_json_batch(doc: list[Any], source: str) -> LoadedInput:
    n = len(doc[0])
    if n == 0:
        raise InputError(f"{source}: row 1 ([0]) is an empty list; {_SHAPE_HELP}")
    for r, row in enumerate(doc):
        if len(row) != n:
            raise InputError(f"{source}: row {r + 1} ([{r}]) has {len(row)} entries, row 1 has {n} (ragged rows)")
    arr = np.empty((len(doc), n), dtype=np.float64)
    for r, row in enumerate(doc):
        try:
            converted = np.asarray(row, dtype=np.float64)
            if converted.ndim != 1 or any(isinstance(item, bool) for item in row):
                raise TypeError
            arr[r] = converted
        except (TypeError, ValueError):
            arr[r] = [_json_number(item, source, f"row {r + 1}, entry {c + 1} ([{r}][{c}])") for c, item in enumerate(row)]
    return _finish(arr, source, fmt="json", where=lambda r, c: f"row {r + 1}, entry {c + 1} ([{r}][{c}])")


# ---- CSV -----------------------------------------------------------------------------------


def _raw_row(data: bytes, line: int) -> list[str] | None:
    """The cells of physical ``line`` (1-based) of a CSV text, for error messages."""
    start = 0
    for _ in range(line - 1):
        start = data.find(b"\n", start) + 1
        if start == 0:
            return None
    end = data.find(b"\n", start)
    text = data[start : end if end >= 0 else len(data)].decode("utf-8", errors="replace").rstrip("\r")
    return next(csv.reader([text]), [])


def _load_csv(data: bytes, source: str, column: str | None) -> LoadedInput:
    import pandas as pd

    first_line = data.split(b"\n", 1)[0].decode("utf-8", errors="replace").rstrip("\r")
    header_cells = next(csv.reader([first_line]), [])
    has_header = not all(_parse_number(cell) is not None for cell in header_cells if cell.strip())
    if has_header:
        stripped = [cell.strip() for cell in header_cells]
        if any(not cell for cell in stripped):
            raise InputError(f"{source}: line 1 (header): column {stripped.index('') + 1} has no name")
        twice = sorted({cell for cell in stripped if stripped.count(cell) > 1})
        if twice:
            raise InputError(f"{source}: line 1 (header): duplicate column name {twice[0]!r}")
    try:
        frame = pd.read_csv(
            io.BytesIO(data),
            header=0 if has_header else None,
            index_col=False,  # never turn a column into the index on rows with an extra field
            keep_default_na=False,  # 'nan' and 'NA' are text to reject, not silent missing values
            na_values=[""],
            skip_blank_lines=False,  # keep blank lines so that row numbers match the file's lines
            encoding="utf-8",
            low_memory=False,  # one dtype per column, decided on the whole column
        )
    except pd.errors.EmptyDataError:
        raise InputError(f"{source}: the file is empty") from None
    except pd.errors.ParserError as exc:
        raise InputError(f"{source}: malformed CSV ({_parser_message(str(exc), has_header)})") from None
    except UnicodeDecodeError:
        raise InputError(f"{source}: not UTF-8 text; save the file as UTF-8") from None
    if not has_header:
        frame.columns = [str(c) for c in range(frame.shape[1])]
    header_offset = 2 if has_header else 1  # line number of data row 0
    names = [str(c) for c in frame.columns]

    blank = frame.isna().all(axis=1).to_numpy()
    lines = np.arange(len(frame)) + header_offset
    if blank.any():  # blank lines are ignored; their line numbers are kept for messages
        frame = frame.loc[~blank]
        lines = lines[~blank]
    if len(frame) == 0:
        raise InputError(f"{source}: no data rows (only a header)" if has_header else f"{source}: no data rows")

    def cell_place(row: int, name: str) -> str:
        col = f", column {name!r}" if has_header else f", column {names.index(name) + 1}"
        return f"row {row + 1} (line {lines[row]}){col}"

    if column is not None and column not in names:
        raise InputError(f"{source}: no column {column!r}; columns: {', '.join(map(repr, names))}")
    numeric: list[str] = []
    text: list[str] = []
    bad_cells: dict[str, int] = {}  # numeric columns with text cells: first bad row
    for name in names:
        series = frame[name]
        if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
            numeric.append(name)
            continue
        parsed = pd.to_numeric(series, errors="coerce")
        filled = series.notna().to_numpy()
        unparsed = parsed.isna().to_numpy() & filled
        share = 1.0 - float(unparsed[filled].mean()) if filled.any() else 0.0
        if share >= _NUMERIC_MAJORITY or name == column:
            numeric.append(name)
            if unparsed.any():
                bad_cells[name] = int(np.argmax(unparsed))
        else:
            text.append(name)
    chosen = [column] if column is not None else numeric
    if not chosen:
        raise InputError(
            f"{source}: no numeric column (columns: {', '.join(map(repr, names))}); the scores must be numbers"
        )
    for name in chosen:
        if name in bad_cells:
            row = bad_cells[name]
            raise InputError(f"{source}: {cell_place(row, name)}: {_describe_text(str(frame[name].iloc[row]))}")

    for name in chosen:
        series = frame[name]
        missing = series.isna().to_numpy()
        if missing.any():
            row = int(np.argmax(missing))
            cells = _raw_row(data, int(lines[row]))
            if cells is not None and len(cells) < len(names):
                raise InputError(
                    f"{source}: row {row + 1} (line {lines[row]}): {len(cells)} fields, the header has "
                    f"{len(names)} (ragged rows)"
                )
            raise InputError(f"{source}: {cell_place(row, name)}: empty cell")

    label_col = next((name for name in text if name != column), None)
    if len(chosen) == 1:
        arr = frame[chosen[0]].to_numpy(dtype=np.float64).reshape(1, -1)
        labels: Sequence[str] | None = None
        if label_col is not None:
            labels = _labels(frame[label_col], source, label_col, lines)
        single_name = chosen[0]
        return _finish(
            arr, source, fmt="csv", labels=labels, row_names=(single_name,),
            where=lambda r, c: cell_place(c, single_name),
        )
    arr = frame[chosen].to_numpy(dtype=np.float64)
    row_names = _labels(frame[label_col], source, label_col, lines) if label_col is not None else None
    return _finish(
        arr, source, fmt="csv", labels=tuple(chosen), row_names=row_names,
        where=lambda r, c: cell_place(r, chosen[c]),
    )


def _labels(series: Any, source: str, name: str, lines: NDArray[np.int64]) -> tuple[str, ...]:
    missing = series.isna().to_numpy()
    if missing.any():
        row = int(np.argmax(missing))
        raise InputError(f"{source}: row {row + 1} (line {lines[row]}), column {name!r}: empty label")
    return tuple(str(v) for v in series.tolist())


def _describe_text(cell: str) -> str:
    value = _parse_number(cell)
    if value is not None and math.isnan(value):
        return f"{cell!r} (NaN) is not allowed (use -inf to mask an entry)"
    return f"{cell!r} is not a number"


def _parser_message(message: str, has_header: bool) -> str:
    """pandas' 'Expected 3 fields in line 5, saw 4' -> a ragged-row message with the line."""
    match = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
    if match:
        expected, line, saw = match.groups()
        return f"line {line}: {saw} fields, the header has {expected} (ragged rows)"
    return message.strip().splitlines()[-1] if message.strip() else "parser error"
