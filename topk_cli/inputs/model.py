"""What every reader returns (:class:`LoadedInput`) and the one number grammar they share."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np
from numpy.typing import NDArray

from topk_cli.errors import InputError

#: Cells that mean "missing" (pandas' default NA markers): never a score, never a label.
MISSING_MARKERS = frozenset(
    m.lower()
    for m in ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
              "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")
)
#: How a user writes a masked entry.
MASK_SPELLINGS = frozenset(("-inf", "-infinity"))


class IndexNames(Sequence[str]):
    """The names ``"0"``, ``"1"``, ... of unlabelled entries or rows, without storing them
    (``start=1``: ``"1"``, ``"2"``, ..., the columns of a headerless table as people count them).

    A 10^7-entry vector needs no 10^7 Python strings.

    >>> names = IndexNames(3)
    >>> len(names), names[2], list(names)
    (3, '2', ['0', '1', '2'])
    >>> list(IndexNames(3, start=1))
    ['1', '2', '3']
    """

    def __init__(self, length: int, start: int = 0) -> None:
        self._length = length
        self._start = start

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [str(i + self._start) for i in range(self._length)[index]]
        if not -self._length <= index < self._length:
            raise IndexError(index)
        return str(index % self._length + self._start)

    def __iter__(self) -> Iterator[str]:
        return (str(i + self._start) for i in range(self._length))

    def __repr__(self) -> str:
        return f"IndexNames({self._length})" if not self._start else f"IndexNames({self._length}, start={self._start})"


@dataclass(frozen=True)
class ReadDecisions:
    """How a source was read, decision by decision, for ``softtopk inspect``.

    Each reader fills what it decided (given or inferred); a field left at its default means
    "does not apply to this format" or "not recorded". ``notes`` on :class:`LoadedInput` keeps the
    one-line account printed on stderr; this record is the same facts, field by field.
    """

    shape: str | None = None  # the layout recognised, e.g. "records", "pandas orient='split'"
    compression: str | None = None  # "gzip" when the bytes were decompressed
    separator: str | None = None  # CSV/TSV field separator
    decimal: str | None = None  # CSV/TSV decimal mark
    header: bool | None = None  # CSV/TSV: line 1 read as column names
    orientation: str | None = None  # JSON objects: "rows" (each key one vector) or "columns"
    row_names_from: str | None = None  # what names the rows (a column, a key, the JSON keys)
    labels_from: str | None = None  # what names the entries
    ignored: tuple[str, ...] = ()  # columns or keys read and not used


def with_decisions(loaded: LoadedInput, **changes: object) -> LoadedInput:
    """``loaded`` with these fields of its :class:`ReadDecisions` set (the others kept)."""
    import dataclasses

    return dataclasses.replace(loaded, decisions=dataclasses.replace(loaded.decisions, **changes))  # type: ignore[arg-type]


@dataclass(frozen=True)
class LoadedInput:
    """Vectors read from one source: ``values`` is always 2-D ``(rows, n)``.

    ``labels`` names the n entries (header names, a label column, JSON keys, or
    ``"0"..."n-1"``); ``row_names`` names the rows (a row-name column of a batch, or
    ``"0"...``); ``source`` is the file name as given, ``"<stdin>"`` or ``"--values"``;
    ``input_format`` is ``csv``, ``tsv``, ``json``, ``jsonl``, ``npy`` or ``values``; ``notes``
    says every layout choice the reader inferred (one sentence each, for stderr); ``decisions``
    records the same choices field by field (separator, header, orientation, row-name column...).
    ``row_k`` holds one k per row, read from the column ``k_column`` (``--k-column``), checked to be
    finite and in ``0 < k <= m`` (``m`` the row's unmasked entries); None without ``--k-column``.
    """

    values: NDArray[np.float64]
    labels: Sequence[str]  # one per entry (column), length n
    row_names: Sequence[str]  # one per row
    source: str  # file name, "<stdin>" or "--values"
    input_format: str = "values"
    row_names_given: bool = False  # True when row_names come from the data, not indexes
    notes: tuple[str, ...] = field(default=())
    decisions: ReadDecisions = field(default_factory=ReadDecisions)
    row_k: NDArray[np.float64] | None = None
    k_column: str | None = None

    @property
    def single(self) -> bool:
        """True when the source held one vector (not a batch)."""
        return self.values.shape[0] == 1


def parse_number(text: str) -> float | None:
    """A float from a user's string, or None when it is not one.

    Python's float syntax without its extensions that no data tool writes (``1_000``, non-ASCII
    digits). NaN and infinities are returned as such; callers decide what they mean.

    >>> parse_number(" 2.5 "), parse_number("1_0"), parse_number("-inf")
    (2.5, None, -inf)
    """
    if "_" in text or not text.isascii():
        return None
    try:
        return float(text)
    except ValueError:
        return None


def check_value(value: float, text: str, source: str, place: str) -> float:
    """Refuse NaN, +inf and numbers beyond float64's range; accept -inf only as written."""
    if math.isnan(value):
        raise InputError(f"{source}: {place}: {text.strip()!r} (NaN) is not allowed (use -inf to mask an entry)")
    if math.isinf(value):
        spelled = text.strip().lower()
        if spelled.lstrip("+") in ("inf", "infinity"):
            raise InputError(f"{source}: {place}: +inf is not allowed (use -inf to mask an entry)")
        if spelled not in MASK_SPELLINGS:
            raise InputError(f"{source}: {place}: {_short(text)} is beyond the float64 range (|x| > 1.8e308)")
    return value


def _short(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= 40 else text[:20] + "..." + text[-8:])


def finish(
    arr: NDArray[np.float64],
    source: str,
    *,
    fmt: str,
    labels: Sequence[str] | None = None,
    row_names: Sequence[str] | None = None,
    where: Callable[[int, int], str] | None = None,
    notes: Sequence[str] = (),
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
        notes=tuple(notes),
    )


def vectors_by_column(loaded: LoadedInput) -> LoadedInput:
    """``--axis columns``: every column of the table is one vector (the transpose of ``loaded``).

    The column names (the entry labels) name the vectors, and the row names label the entries:
    a table of tokens x experts gives one vector per expert, over the tokens. Announced in one note.

    Raises:
        InputError: ``loaded`` is one vector (there is nothing to read by column).
    """
    import dataclasses

    rows, n = loaded.values.shape
    if rows == 1:
        raise InputError(
            f"{loaded.source}: --axis columns reads each column of a batch as one vector; this input is one vector "
            f"of {n} entries (read it without --axis)"
        )
    values = np.ascontiguousarray(loaded.values.T)
    named = not isinstance(loaded.labels, IndexNames)
    note = (f"--axis columns: read {n} vectors (one per column) of {rows} entries (one per row)"
            + ("" if loaded.row_names_given else "; entries named by row index (0-based)"))
    return dataclasses.replace(
        loaded, values=values, labels=loaded.row_names, row_names=loaded.labels, row_names_given=named,
        notes=(*loaded.notes, note), row_k=None, k_column=None,
    )
