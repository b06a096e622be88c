"""Load score vectors from CSV, TSV, JSON, JSON Lines, NPY, stdin or an inline ``--values`` string.

Every loader returns a :class:`LoadedInput` whose ``values`` is a 2-D float64 array
``(rows, n)``: one row per vector, and whose ``notes`` say every layout choice that was inferred
rather than given (the CLI prints them on stderr). The layout rule of tables is in
:mod:`topk_cli.inputs.table`, the CSV text rules in :mod:`topk_cli.inputs.csvfile`, the JSON
shapes in :mod:`topk_cli.inputs.jsonfile`.

- NPY: a 1-D or 2-D array of real numbers; NPZ: an archive holding exactly one such array.
- gzip: ``.csv.gz``, ``.tsv.gz``, ``.json.gz``, ``.jsonl.gz``, ``.npy.gz`` (and gzip data on stdin)
  are decompressed first (standard library), then read as their inner format.
- Parquet, Feather, Excel, pickle and HDF5 are not read: the message says how to convert them.
- ``values="3,2,1,4"`` (``;`` separates the rows of a batch: ``"3,2,1;4,5,6"``).

``-inf`` masks an entry. Empty cells, missing-value markers (NaN, NA, null), text in numeric
cells, ragged rows, extra fields, ``+inf`` and numbers beyond the float64 range are
:class:`~topk_cli.errors.InputError` with a message naming the place: in a text file its line
(1-based, as editors number lines) and column, in JSON its path (``[2][1]``, ``key 'b'``), in
``--values`` the row and entry (0-based, as the output labels them). No reader imports pandas.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from topk_cli.catalog import (  # input formats: defined without numpy for the CLI's --help
    INPUT_FORMAT_ALIASES,
    INPUT_FORMATS,
)
from topk_cli.errors import InputError
from topk_cli.inputs.csvfile import load_csv
from topk_cli.inputs.jsonfile import ORIENTS, check_orient, load_json, load_jsonl
from topk_cli.inputs.model import (
    IndexNames,
    LoadedInput,
    ReadDecisions,
    finish,
    parse_number,
    vectors_by_column,
    with_decisions,
)
from topk_cli.inputs.table import k_column_of

__all__ = ["INPUT_FORMATS", "ORIENTS", "IndexNames", "LoadedInput", "ReadDecisions", "load_input", "vectors_by_column"]

#: Suffixes (and --input-format names) -> format: the formats and their aliases.
_SUFFIXES = {**{name: name for name in INPUT_FORMATS}, **INPUT_FORMAT_ALIASES}
_GZIP_MAGIC = b"\x1f\x8b"
#: Formats that are not read, by suffix: (name, the pandas reader, its to_csv arguments).
_UNSUPPORTED = {
    "parquet": ("Parquet", "read_parquet", ""), "pq": ("Parquet", "read_parquet", ""),
    "feather": ("Feather", "read_feather", ""), "arrow": ("Arrow IPC", "read_feather", ""),
    "xlsx": ("Excel", "read_excel", ", index=False"), "xls": ("Excel", "read_excel", ", index=False"),
    "ods": ("OpenDocument", "read_excel", ", index=False"),
    "h5": ("HDF5", "read_hdf", ""), "hdf5": ("HDF5", "read_hdf", ""),
    "pkl": ("pickle", "read_pickle", ""), "pickle": ("pickle", "read_pickle", ""),
}


def load_input(
    path: str | None,
    *,
    values: str | None = None,
    column: str | None = None,
    input_format: str | None = None,
    index_col: str | None = None,
    sep: str | None = None,
    decimal: str | None = None,
    orient: str | None = None,
    header: bool | None = None,
    k_column: str | None = None,
) -> LoadedInput:
    """Read the vectors of ``path`` (``"-"`` = stdin) or of the inline string ``values``.

    The format comes from ``input_format`` or the suffix (``.csv``, ``.tsv``, ``.json``,
    ``.jsonl``/``.ndjson``, ``.npy``, ``.npz``, each optionally ``.gz``), decided from the name
    before the file is opened (a FIFO is opened only when its format is known); stdin without
    ``input_format`` is sniffed (``[``/``{`` = JSON, several JSON lines = JSON Lines, the NPY
    magic, else CSV). ``index_col`` (a column name or a 0-based position, as in pandas;
    ``"none"`` disables the inference), ``sep`` and ``decimal`` apply to CSV/TSV; ``orient``
    (``"rows"`` or ``"columns"``) says how the keys of a JSON object are read. ``k_column``
    names a column of a table (CSV/TSV with a header, JSON records, an object of columns) that
    holds each row's k: it is not read as scores, and becomes ``row_k`` of the result.

    Raises:
        InputError: unreadable source, unknown format, malformed content, empty cells, text in
            numeric cells, ragged rows, NaN or ``+inf``; the message names file, row and column.

    >>> loaded = load_input(None, values="3,2,-inf")
    >>> loaded.values, list(loaded.labels)
    (array([[  3.,   2., -inf]]), ['0', '1', '2'])
    """
    if orient is not None:
        orient = check_orient(orient)
    if k_column is not None:
        if values is not None:
            raise InputError("--k-column reads a column of an input file; --values has no columns")
        with k_column_of(k_column):
            loaded = load_input(path, column=column, input_format=input_format, index_col=index_col, sep=sep,
                                decimal=decimal, orient=orient, header=header)
        if loaded.row_k is None:
            raise InputError(
                f"{loaded.source}: --k-column {k_column!r}: this {loaded.input_format} input has no named columns "
                "(CSV or TSV with a header, JSON records or an object of columns have them)"
            )
        return loaded
    if values is not None:
        if path is not None:
            raise InputError("give either an input file or --values, not both")
        return _parse_values(values)
    if path is None:
        raise InputError("no input: give a file (or '-' for stdin) or --values 3,2,1,4")
    source = "<stdin>" if path == "-" else path
    if path != "-":
        _check_path(path)
    fmt = _resolve_format(path, input_format)  # from the name: before opening (a FIFO would block)
    data = _read_bytes(path)
    compressed = data.startswith(_GZIP_MAGIC)
    if compressed:
        data = _gunzip(data, source)
    elif path != "-" and path.lower().endswith(".gz"):
        raise InputError(f"{source}: not gzip data, though the name ends in .gz")
    if fmt is None:
        fmt = _sniff(data)
    loaded = _load_format(data, source, fmt, column=column, index_col=index_col, sep=sep, decimal=decimal,
                          orient=orient, header=header)
    return with_decisions(loaded, compression="gzip") if compressed else loaded


def _load_format(
    data: bytes, source: str, fmt: str, *, column: str | None, index_col: str | None, sep: str | None,
    decimal: str | None, orient: str | None, header: bool | None,
) -> LoadedInput:
    if column is not None and fmt in ("npy", "npz"):
        raise InputError(f"{source}: --column applies to CSV and JSON tables only (this input is {fmt})")
    if fmt != "csv" and fmt != "tsv" and (sep is not None or decimal is not None or header is not None):
        raise InputError(f"{source}: --sep, --decimal and --header apply to CSV/TSV only (this input is {fmt})")
    if orient is not None and fmt != "json":
        raise InputError(f"{source}: --orient applies to JSON objects only (this input is {fmt})")
    if fmt in ("npy", "npz"):
        if index_col is not None:
            raise InputError(f"{source}: --index-col applies to tables only (this input is {fmt})")
        return _load_npz(data, source) if fmt == "npz" else _load_npy(data, source)
    if _is_utf16(data):
        raise InputError(f"{source}: UTF-16 encoded text; save it as UTF-8 (Excel: 'CSV UTF-8')")
    if b"\x00" in data[:65536]:
        raise InputError(f"{source}: binary data (NUL bytes), not a {fmt.upper()} text file")
    _check_utf8(data, source)
    if fmt == "json":
        return load_json(data, source, column=column, index_col=index_col, orient=orient)
    text = data.decode("utf-8")
    del data  # a big file's bytes need not stay beside its text
    if fmt == "jsonl":
        return load_jsonl(text, source, column=column, index_col=index_col)
    return load_csv(text, source, fmt=fmt, sep=sep, decimal=decimal, column=column, index_col=index_col, header=header)


# ---- sources and formats -------------------------------------------------------------------


def _resolve_format(path: str, input_format: str | None) -> str | None:
    if input_format is not None:
        fmt = _SUFFIXES.get(input_format.strip().lower().lstrip("."))
        if fmt is None:
            raise InputError(f"unknown --input-format {input_format!r}; valid formats: {', '.join(INPUT_FORMATS)}")
        return fmt
    if path == "-":
        return None
    name = Path(path).name
    stem = name[:-3] if name.lower().endswith(".gz") else name
    suffix = Path(stem).suffix.lower().lstrip(".")
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if suffix in _UNSUPPORTED:
        what, reader, options = _UNSUPPORTED[suffix]
        csv_name = str(Path(path).with_name(Path(stem).stem + ".csv"))
        trust = " (loading a pickle can run code); convert one you trust" if what == "pickle" else "; convert it"
        raise InputError(
            f"{path}: {what} files are not supported{trust} to CSV first, e.g. "
            f"python -c \"import pandas as pd; pd.{reader}({path!r}).to_csv({csv_name!r}{options})\""
        )
    shown = f"suffix '.{suffix}'" if suffix else "no suffix"
    if stem != name:
        shown = f"suffix '.{suffix}.gz'" if suffix else "no suffix before '.gz'"
    raise InputError(
        f"{path}: cannot tell the format from {shown}; rename it or pass --input-format {'|'.join(INPUT_FORMATS)}"
    )


def _gunzip(data: bytes, source: str) -> bytes:
    import gzip
    import zlib

    try:
        out = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{source}: not valid gzip data ({exc})") from None
    if not out.strip():
        raise InputError(f"{source}: the file is empty (after gzip decompression)")
    return out


@contextlib.contextmanager
def _os_errors(path: str) -> Iterator[None]:
    """An ``OSError`` while looking at or reading ``path`` becomes one ``InputError`` line."""
    try:
        yield
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _check_path(path: str) -> None:
    """Refuse a missing path or a directory without opening anything (stat only)."""
    with _os_errors(path):
        if Path(path).is_dir():
            raise InputError(f"{path}: is a directory, not a file")
        Path(path).stat()


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
    with _os_errors(path), open(target, "rb") as handle:  # works for FIFOs and /dev/stdin too
        data = handle.read()
    if not data.strip():
        raise InputError(f"{path}: the file is empty")
    return data


def _sniff(data: bytes) -> str:
    if data.startswith(b"\x93NUMPY"):
        return "npy"
    if data.startswith(b"PK\x03\x04"):
        return "npz"
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


def _is_utf16(data: bytes) -> bool:
    """A UTF-16 byte-order mark, or text with a NUL byte beside every ASCII character (no mark)."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True
    head = data[: min(len(data), 64) // 2 * 2]
    low, high = head[0::2], head[1::2]
    return len(head) >= 4 and (
        (not high.strip(b"\x00") and b"\x00" not in low) or (not low.strip(b"\x00") and b"\x00" not in high)
    )


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
            place = f"entry {c} (0-based)" if len(rows_text) == 1 else f"row {r}, entry {c} (0-based)"
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
                f"--values: row {r} (0-based) has {len(row)} entries, row 0 has {len(rows[0])} "
                "(rows are separated by ';')"
            )
        rows.append(row)
    arr = np.asarray(rows, dtype=np.float64)

    def where(row: int, col: int) -> str:
        return f"entry {col} (0-based)" if len(rows) == 1 else f"row {row}, entry {col} (0-based)"

    return finish(arr, "--values", fmt="values", where=where)


# ---- NPY -----------------------------------------------------------------------------------


def _load_npz(data: bytes, source: str) -> LoadedInput:
    """An ``.npz`` archive holding exactly one array (``np.savez("f.npz", x)``), read as NPY."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            names = list(archive.files)
            if len(names) != 1:
                listed = ", ".join(map(repr, names[:5])) + (", ..." if len(names) > 5 else "")
                first = names[0] if names else "x"
                raise InputError(
                    f"{source}: an .npz archive of {len(names)} arrays ({listed or 'none'}); save the one to read "
                    f"as .npy, e.g. python -c \"import numpy as np; "
                    f"np.save({str(Path(source).with_suffix('.npy'))!r}, np.load({source!r})[{first!r}])\""
                )
            arr = archive[names[0]]
    except InputError:
        raise
    except Exception as exc:  # zipfile and numpy raise many types on a corrupted archive
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{source}: not a valid .npz file ({detail[:120]})") from None
    loaded = _npy_array(arr, source, "npz")
    return with_decisions(loaded, shape=f"the one array {names[0]!r} of an .npz archive")


def _load_npy(data: bytes, source: str) -> LoadedInput:
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises many types on a corrupted header (SyntaxError, KeyError...)
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{source}: not a valid .npy file ({detail[:120]})") from None
    return _npy_array(arr, source, "npy")


def _npy_array(arr: object, source: str, fmt: str) -> LoadedInput:
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
        return finish(values, source, fmt=fmt, where=lambda r, c: f"index [{c}, 0]", notes=notes)
    one = arr.ndim == 1

    def where(row: int, col: int) -> str:
        return f"index [{col}]" if one else f"index [{row}, {col}]"

    return finish(values, source, fmt=fmt, where=where)
