"""What every command's renderer shares: the output formats and text conversion helpers."""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
import math
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from enum import Enum
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.control import strip_control_codes
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Column, Row, Table
from rich.text import Text


class OutputFormat(str, Enum):
    """``--format`` choices shared by every command."""

    table = "table"
    csv = "csv"
    json = "json"


def jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats into strict-JSON values (NaN/inf -> null)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


def render_json(document: Mapping[str, Any]) -> str:
    """One strict JSON document (no NaN tokens), newline-terminated."""
    return json.dumps(jsonable(document), indent=2, allow_nan=False) + "\n"


def render_csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Tidy CSV text with a header; floats written with repr precision, None as empty."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _csv_cell(row.get(key)) for key in columns})
    return buffer.getvalue()


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else repr(value))
    return value


#: Where tables go: the terminal's width (set by the CLI when stdout is a terminal), or None for
#: a pipe or a file, where output is fitted to :data:`OFF_TERMINAL_WIDTH`.
FIT_WIDTH: ContextVar[int | None] = ContextVar("softtopk_fit_width", default=None)
#: The width of every line written to a pipe, a file or a CI log (where no terminal says how wide
#: to be). 120 columns: what a wide terminal, a CI log viewer or a code review page shows without
#: wrapping, and wide enough that the widest table of numbers (the sweep's nine columns, about
#: 115) stays one block. The one exception: a command meant to be pasted is never wrapped.
OFF_TERMINAL_WIDTH = 120
_NATURAL_MAX = 100_000
_PROSE = 30  # a cell with spaces and longer than this is prose: it may wrap between words
#: A prose cell longer than this moves under its table as a numbered note (``[1]``).
NOTE_LENGTH = 60
#: Headers of the columns that identify a row: repeated in every block of a split table.
KEY_COLUMNS = frozenset({"method", "n", "k", "scale", "property", "task", "label", "row", "entry", "tau"})
_NUMBER = re.compile(
    r"^\s*(?:[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?|[-+]?inf|nan|-|<1%|\d+/\d+)\s*$"
)


class Command(str):
    """A command line meant to be pasted: printed on a line of its own and never wrapped."""


def terminal_width() -> int:
    """The terminal's width in columns (``COLUMNS`` wins, as in every Unix tool)."""
    return max(shutil.get_terminal_size((80, 24)).columns, 20)


def renderables_to_text(renderables: Sequence[RenderableType], *, color: bool, width: int | None = None) -> str:
    """Render rich objects to a string; plain text (no ANSI codes) when ``color`` is False.

    The one width policy of every command: every line fits the target width (``width``, else
    :data:`FIT_WIDTH`: the terminal's, else :data:`OFF_TERMINAL_WIDTH` for a pipe, a file or a
    CI log) without ever cutting a number, a name or a header: prose cells wrap between words,
    a prose cell longer than :data:`NOTE_LENGTH` moves under its table as a numbered note, a
    table still too wide is split into blocks of columns, each repeating the key columns
    (:data:`KEY_COLUMNS`), and columns of numbers are right-aligned. A :class:`Command` is
    printed on its own line and never wrapped (the only line that may be wider). A single
    atomic column wider than the target is left whole. Rich markup is off: labels and file
    names are printed as they are, brackets included.
    """
    target = width if width is not None else FIT_WIDTH.get()
    if target is None:
        target = OFF_TERMINAL_WIDTH
    console = Console(
        file=io.StringIO(),
        force_terminal=color,
        no_color=not color,
        color_system="auto" if color else None,
        width=target or _NATURAL_MAX,
        highlight=False,
        soft_wrap=False,
        markup=False,
        emoji=False,
    )
    notes: list[str] = []
    with console.capture() as capture:
        for item in _flatten(renderables):
            if isinstance(item, Command):
                console.width = max(target, cell_len(item), 1)
                console.print(Text(str(item)), no_wrap=True, overflow="ignore", crop=False)
                continue
            table_notes: list[tuple[int, str]] = []
            if isinstance(item, Table):
                item, table_notes = _with_notes(item, console, notes)
                _align_numbers(item)
            parts = fit_table(item, console, target) if target is not None and isinstance(item, Table) else [item]
            for part in parts:
                if target is None:
                    part = _stacked(part, fitted=False)
                    console.width = max(min(_natural_width(console, part), _NATURAL_MAX), 1)
                elif isinstance(part, Table):  # a column wider than the terminal stays whole
                    if part.title:  # wrapped at the target width, not at the (narrower) table's
                        console.width = target
                        title = str(part.title)
                        head, sep, tail = title.rpartition(" (")
                        if cell_len(title) > target and sep and tail.endswith(")"):
                            title = f"{head}\n({tail}"  # the block's "(continued: ...)" stays whole
                        console.print(Text(title, style="table.title"))
                        part = copy.copy(part)
                        part.title = None
                    console.width = max(target, _minimum_width(console, part))
                    part = _stacked(part, fitted=True)
                else:  # text wraps between words
                    console.width = target
                console.print(part)
            if table_notes:
                console.width = target
                for number, text in table_notes:
                    note = Text(f"[{number}] {text}")
                    console.print(_hanging(note, len(f"[{number}] "), console, target))
    return capture.get()


def _hanging(text: Text, indent: int, console: Console, width: int) -> Text:
    """``text`` wrapped at ``width``, continuation lines indented by ``indent`` spaces."""
    lines = text.wrap(console, max(width - indent, 10))
    out = Text()
    for i, line in enumerate(lines):
        if i:
            out.append("\n" + " " * indent)
        line.rstrip()
        out.append_text(line)
    return out


def _with_notes(table: Table, console: Console, notes: list[str]) -> tuple[Table, list[tuple[int, str]]]:
    """``table`` with every prose cell longer than :data:`NOTE_LENGTH` replaced by ``[n]``; the
    texts, numbered on from ``notes`` (one number per distinct text), to print under it."""
    own: list[tuple[int, str]] = []
    changed: list[Column] = []
    touched = False
    for column in table.columns:
        cells = list(column.cells)
        new_cells: list[RenderableType] = []
        for cell in cells:
            plain = _plain(cell) if type(cell) in (str, Text) else None  # type: ignore[arg-type]
            if plain is not None and " " in plain and cell_len(plain) > NOTE_LENGTH and "\n" not in plain.strip("\n"):
                text = " ".join(plain.split())
                if text not in notes:
                    notes.append(text)
                number = notes.index(text) + 1
                if (number, text) not in own:
                    own.append((number, text))
                style = cell.style if isinstance(cell, Text) else ""
                new_cells.append(Text(f"[{number}]", style=style))
                touched = True
            else:
                new_cells.append(cell)
        changed.append(dataclasses.replace(column, _cells=new_cells))
    if not touched:
        return table, own
    out = copy.copy(table)
    out.columns = changed
    return out, own


def _align_numbers(table: Table) -> None:
    """Right-align every column whose cells are all numbers (``-`` for none, ``nan``, ``3/20``)."""
    for column in table.columns:
        every = list(column.cells)
        cells = [_plain(c) for c in every if isinstance(c, (str, Text))]
        if len(cells) != len(every) or not cells:
            continue
        if all(_NUMBER.match(c) or not c.strip() for c in cells) and any(any(ch.isdigit() for ch in c) for c in cells):
            column.justify = "right"


def _flatten(renderables: Sequence[RenderableType]) -> list[RenderableType]:
    """The items of rich ``Group``s, so that every table is fitted on its own."""
    out: list[RenderableType] = []
    for item in renderables:
        if isinstance(item, Group):
            out.extend(_flatten(list(item.renderables)))
        else:
            out.append(item)
    return out


def _stacked(item: RenderableType, *, fitted: bool) -> RenderableType:
    """``item``, a table of one-line text rows, as one row of stacked cells: the same text.

    Rich measures and renders every cell on its own, the bulk of a long table's time; a column
    of lines costs one cell. Only where no cell can wrap, so every row stays one line high:
    one-line cells (``str``, or ``Text`` with one style and no settings of its own), no row
    styles, separators or footer, no width limits; under a target width, no prose column
    (only prose wraps there).
    """
    if not isinstance(item, Table) or item.row_count < 2:
        return item
    if item.row_styles or item.show_lines or item.leading or item.show_footer or item.highlight:
        return item
    if any(row.style or row.end_section for row in item.rows):
        return item
    for column in item.columns:
        if column.width is not None or column.max_width is not None or column.ratio or column.highlight:
            return item
        if fitted and not column.no_wrap:  # fit_table's prose column: its cells may wrap
            return item
        if not all(_one_line(cell) for cell in column.cells):
            return item
    stacked = copy.copy(item)
    stacked.columns = [
        dataclasses.replace(c, _cells=[_StackedCells(list(c.cells))]) for c in item.columns  # type: ignore[arg-type]
    ]
    stacked.rows = [Row()]
    return stacked


def _one_line(cell: RenderableType) -> bool:
    if type(cell) is Text:
        settings = (cell.justify, cell.overflow, cell.no_wrap, cell.tab_size, cell.spans, cell.end)
        if settings != (None, None, None, None, [], "\n"):
            return False
    elif type(cell) is not str:
        return False
    plain = _plain(cell)
    return "\t" not in plain and plain.splitlines() in ([], [plain])


def _plain(cell: str | Text) -> str:
    """The characters rich prints of a text cell (it drops control codes such as carriage returns)."""
    return cell.plain if isinstance(cell, Text) else strip_control_codes(cell)


class _StackedCells:
    """One-line cells (one per row) rendered as one cell, line for line as rich renders each.

    Per line, as rich's ``Text.wrap`` does for a line that fits its width: no change under
    ``overflow="ignore"``; else justified right or centre (after stripping trailing spaces) or
    left, the padding in the line's style.
    """

    def __init__(self, cells: list[str | Text]) -> None:
        self._lines = [(_plain(c), c.style if isinstance(c, Text) else "") for c in cells]
        widths = [cell_len(line) for line, _ in self._lines]
        words = [max((cell_len(w) for w in line.split()), default=n) for (line, _), n in zip(self._lines, widths, strict=True)]
        self._measurement = Measurement(max(words, default=0), max(widths, default=0))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return self._measurement.with_maximum(options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        justify = None if options.overflow == "ignore" else options.justify
        newline = Segment("\n")
        for line, style in self._lines:
            if justify in ("right", "center"):
                line = line.rstrip()
                spare = width - cell_len(line)
                left = spare if justify == "right" else spare // 2
                line = " " * left + line + " " * (spare - left)
            elif justify == "left":
                line += " " * (width - cell_len(line))
            if line:
                yield Segment(line, console.get_style(style, default=Style.null()) if style else None)
            yield newline


def _cell_width(console: Console, cell: RenderableType) -> int:
    if type(cell) in (str, Text):  # what rich measures of text, without building and measuring a Text
        lines = _plain(cell).splitlines()  # type: ignore[arg-type]
        return min(max((cell_len(line) for line in lines), default=0), _NATURAL_MAX)
    return Measurement.get(console, console.options.update(width=_NATURAL_MAX), cell).maximum


def _natural_width(console: Console, item: RenderableType) -> int:
    return Measurement.get(console, console.options.update(width=_NATURAL_MAX), item).maximum


def _is_prose(console: Console, cells: Sequence[RenderableType]) -> bool:
    return any(" " in str(cell) and _cell_width(console, cell) > _PROSE for cell in cells)


def _column_need(console: Console, column: Column) -> int:
    """Columns a table column needs: all of an atomic column, the longest word of prose."""
    cells = [column.header, *column.cells]
    if _is_prose(console, list(column.cells)):
        words = [len(word) for cell in cells for word in str(cell).split()]
        return max([_PROSE, *words]) if words else _PROSE
    return max((_cell_width(console, cell) for cell in cells), default=1)


def _minimum_width(console: Console, item: RenderableType) -> int:
    if not isinstance(item, Table):
        return _natural_width(console, item)
    return _table_width(item, [_column_need(console, c) for c in item.columns])


def _table_width(table: Table, needs: Sequence[int]) -> int:
    left, right = table.padding[3], table.padding[1]
    borders = (len(needs) + 1) if table.box is not None else 0
    edge = 0 if table.pad_edge else -(left + right)
    return sum(needs) + len(needs) * (left + right) + borders + edge


def _key_columns(table: Table) -> list[int]:
    """The leading columns that identify a row (headers in :data:`KEY_COLUMNS`; at least one)."""
    keys = []
    for index, column in enumerate(table.columns):
        header = _plain(column.header).strip().lower() if type(column.header) in (str, Text) else ""  # type: ignore[arg-type]
        if header not in KEY_COLUMNS:
            break
        keys.append(index)
    return keys or [0]


def fit_table(table: Table, console: Console, width: int) -> list[Table]:
    """``table`` made to fit ``width`` columns without cutting a number, a name or a header.

    Atomic columns (numbers, names) never wrap; prose columns wrap between words. When the
    atomic columns alone do not fit, the table is split into blocks of columns, each block
    repeating the key columns (the leading ones named in :data:`KEY_COLUMNS`, at least the
    first). A single column wider than ``width`` is left whole (the line is then longer than
    the terminal, never cut).
    """
    for column in table.columns:
        if _is_prose(console, list(column.cells)):
            column.overflow = "fold"
        else:
            column.no_wrap = True
            # "fold", not "ignore": rich justifies no cell under "ignore" (numbers came out left-
            # aligned); min_width keeps the column whole, so nothing is ever folded or cut
            column.overflow = "fold"
            column.min_width = _column_need(console, column)
    needs = [_column_need(console, c) for c in table.columns]
    if _table_width(table, needs) <= width or len(table.columns) <= 2:
        return [table]
    keys = _key_columns(table)
    if len(table.columns) <= len(keys) + 1:
        return [table]
    blocks: list[list[int]] = []
    current: list[int] = []
    for index in range(len(keys), len(table.columns)):
        trial = [*keys, *current, index]
        if current and _table_width(table, [needs[i] for i in trial]) > width:
            blocks.append(current)
            current = [index]
        else:
            current.append(index)
    blocks.append(current)
    parts = []
    for number, block in enumerate(blocks):
        part = copy.copy(table)
        part.columns = [copy.copy(table.columns[i]) for i in (*keys, *block)]
        if number:
            part.title = f"{table.title} (continued: columns {number + 1}/{len(blocks)})" if table.title else None
        elif len(blocks) > 1 and table.title:
            part.title = f"{table.title} (columns 1/{len(blocks)})"
        parts.append(part)
    return parts


def format_float(value: float, digits: int = 6) -> str:
    """Compact fixed/scientific formatting for tables (``nan`` and ``inf`` spelled out)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-4 <= magnitude < 1e6:
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:.0f}"
    return f"{value:.{max(digits - 3, 2)}e}"


class ProgressReporter:
    """A progress bar on stderr for long runs, shown only when stderr is a terminal.

    Use as a context manager; call the instance with ``(done, total)`` from the analysis's
    ``progress`` callback. When disabled it does nothing, so callers need no branches.
    """

    def __init__(self, description: str, *, enabled: bool) -> None:
        self._description = description
        self._enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> ProgressReporter:
        if self._enabled:
            from rich.progress import Progress

            self._progress = Progress(console=Console(stderr=True), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task(self._description, total=None)
        return self

    def __call__(self, done: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
