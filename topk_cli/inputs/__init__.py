"""Load score vectors from CSV, TSV, JSON, JSON Lines, NPY, stdin or an inline ``--values`` string.

Every loader returns a :class:`LoadedInput` whose ``values`` is a 2-D float64 array
``(rows, n)``: one row per vector, and whose ``notes`` say every layout choice that was inferred
rather than given (the CLI prints them on stderr). The layout rule of tables is in
:mod:`topk_cli.inputs.table`, the CSV text rules in :mod:`topk_cli.inputs.csvfile`, the JSON
shapes in :mod:`topk_cli.inputs.jsonfile`.

- NPY: a 1-D or 2-D array of real numbers.
- ``values="3,2,1,4"`` (``;`` separates the rows of a batch: ``"3,2,1;4,5,6"``).

``-inf`` masks an entry. Empty cells, missing-value markers (NaN, NA, null), text in numeric
cells, ragged rows, extra fields, ``+inf`` and numbers beyond the float64 range are
:class:`~topk_cli.errors.InputError` with a message naming the file, the row (1-based, with the
line number in the file) and the column. No reader imports pandas.
"""

from __future__ import annotations

import codecs
import io
import sys
from pathlib import Path

import numpy as np

from topk_cli.catalog import INPUT_FORMATS  # input formats: defined without numpy for the CLI's --help
from topk_cli.errors import InputError
from topk_cli.inputs.csvfile import load_csv
from topk_cli.inputs.jsonfile import load_json, load_jsonl
from topk_cli.inputs.model import IndexNames, LoadedInput, finish, parse_number

__all__ = ["INPUT_FORMATS", "IndexNames", "LoadedInput", "load_input"]

_SUFFIXES = {"csv": "csv", "tsv": "tsv", "tab": "tsv", "json": "json", "jsonl": "jsonl", "ndjson": "jsonl", "npy": "npy"}


def load_input(
    path: str | None,
    *,
    values: str | None = None,
    column: str | None = None,
    input_format: str | None = None,
    index_col: str | None = None,
    sep: str | None = None,
    decimal: str | None = None,
) -> LoadedInput:
    """Read the vectors of ``path`` (``"-"`` = stdin) or of the inline string ``values``.

    The format comes from ``input_format`` or the suffix (``.csv``, ``.tsv``, ``.json``,
    ``.jsonl``/``.ndjson``, ``.npy``); stdin without ``input_format`` is sniffed (``[``/``{`` =
    JSON, several JSON lines = JSON Lines, the NPY magic, else CSV). ``index_col`` (a column name
    or a 0-based position, as in pandas; ``"none"`` disables the inference), ``sep`` and
    ``decimal`` apply to CSV/TSV.

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
    if column is not None and fmt == "npy":
        raise InputError(f"{source}: --column applies to CSV and JSON tables only (this input is npy)")
    if fmt != "csv" and fmt != "tsv" and (sep is not None or decimal is not None):
        raise InputError(f"{source}: --sep and --decimal apply to CSV/TSV only (this input is {fmt})")
    if fmt == "npy":
        if index_col is not None:
            raise InputError(f"{source}: --index-col applies to tables only (this input is npy)")
        return _load_npy(data, source)
    if b"\x00" in data[:65536]:
        raise InputError(f"{source}: binary data (NUL bytes), not a {fmt.upper()} text file")
    _check_utf8(data, source)
    if fmt == "json":
        return load_json(data, source, column=column, index_col=index_col)
    text = data.decode("utf-8")
    if fmt == "jsonl":
        return load_jsonl(text, source, column=column, index_col=index_col)
    return load_csv(text, source, fmt=fmt, sep=sep, decimal=decimal, column=column, index_col=index_col)


# ---- sources and formats -------------------------------------------------------------------


def _resolve_format(path: str, input_format: str | None) -> str | None:
    if input_format is not None:
        fmt = _SUFFIXES.get(input_format.strip().lower().lstrip("."))
        if fmt is None:
            raise InputError(f"unknown --input-format {input_format!r}; valid formats: {', '.join(INPUT_FORMATS)}")
        return fmt
    if path == "-":
        return None
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    shown = f"suffix '.{suffix}'" if suffix else "no suffix"
    raise InputError(
        f"{path}: cannot tell the format from {shown}; rename it or pass --input-format {'|'.join(INPUT_FORMATS)}"
    )


def _read_bytes(path: str) -> bytes:
    if path == "-":
        if sys.stdin is None:
            raise InputError("<stdin>: stdin is closed")
        stream = getattr(sys.stdin, "buffer", None)
        try:
            if stream is not None:
                data: bytes = stream.read()
            else:  # a text-only stdin (embedding, some test runners)
                data = sys.stdin.read().encode("utf-8")
        except (OSError, ValueError) as exc:
            raise InputError(f"<stdin>: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
        if not data.strip():
            raise InputError("<stdin>: empty input")
        return data
    target = Path(path)
    try:
        if target.is_dir():
            raise InputError(f"{path}: is a directory, not a file")
        with open(target, "rb") as handle:  # works for FIFOs and /dev/stdin too
            data = handle.read()
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
    stripped = data.lstrip().removeprefix(b"\xef\xbb\xbf")
    head = stripped[:1]
    if head in (b"[", b"{"):
        lines = [line for line in stripped.splitlines() if line.strip()]
        if len(lines) > 1 and all(line.lstrip()[:1] in (b"[", b"{") and line.rstrip()[-1:] in (b"]", b"}")
                                  for line in lines[:20]):
            import json

            try:
                json.loads(stripped)
            except ValueError:
                return "jsonl"
        return "json"
    return "csv"


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


# ---- --values ------------------------------------------------------------------------------


def _parse_values(text: str) -> LoadedInput:
    rows_text = text.split(";")
    rows: list[list[float]] = []
    for r, row_text in enumerate(rows_text):
        row: list[float] = []
        for c, cell in enumerate(row_text.split(",")):
            place = f"entry {c + 1}" if len(rows_text) == 1 else f"row {r + 1}, entry {c + 1}"
            if not cell.strip():
                raise InputError(f"--values: {place} is empty (write e.g. --values 3,2,1,4)")
            value = parse_number(cell)
            if value is None:
                raise InputError(f"--values: {place}: {cell.strip()!r} is not a number")
            if value == -np.inf and cell.strip().lower() not in ("-inf", "-infinity"):
                raise InputError(f"--values: {place}: {cell.strip()!r} is beyond the float64 range")
            row.append(value)
        if rows and len(row) != len(rows[0]):
            raise InputError(
                f"--values: row {r + 1} has {len(row)} entries, row 1 has {len(rows[0])} (rows are separated by ';')"
            )
        rows.append(row)
    arr = np.asarray(rows, dtype=np.float64)

    def where(row: int, col: int) -> str:
        return f"entry {col + 1}" if len(rows) == 1 else f"row {row + 1}, entry {col + 1}"

    return finish(arr, "--values", fmt="values", where=where)


# ---- NPY -----------------------------------------------------------------------------------


def _load_npy(data: bytes, source: str) -> LoadedInput:
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises many types on a corrupted header (SyntaxError, KeyError...)
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{source}: not a valid .npy file ({detail[:120]})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iuf":
        kind = getattr(arr, "dtype", type(arr))
        raise InputError(f"{source}: expected an array of real numbers, got {kind}")
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise InputError(f"{source}: expected a non-empty 1-D vector or 2-D batch, got shape {arr.shape}")
    values = np.ascontiguousarray(arr, dtype=np.float64).reshape(-1, arr.shape[-1])
    notes: tuple[str, ...] = ()
    if arr.ndim == 2 and arr.shape[1] == 1 and arr.shape[0] > 1:  # a column: one vector
        values = values.reshape(1, -1)
        notes = (f"read the {arr.shape[0]} x 1 array as one vector of {arr.shape[0]} entries",)
        return finish(values, source, fmt="npy", where=lambda r, c: f"index [{c}, 0]", notes=notes)
    one = arr.ndim == 1

    def where(row: int, col: int) -> str:
        return f"index [{col}]" if one else f"index [{row}, {col}]"

    return finish(values, source, fmt="npy", where=where)
