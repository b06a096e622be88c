"""What ``softtopk inspect`` shows: how a source was read, and its first vectors as read.

A table (the decisions, one per line, then the first rows with entries rounded), one JSON
document (the same facts; the shown entries exact, ``-inf`` written ``"-inf"`` as JSON inputs
write it) or tidy CSV (one row per shown entry). Never prints.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from topk_cli.inputs.model import IndexNames
from topk_cli.render.common import OutputFormat, format_float, render_csv, render_json, renderables_to_text

if TYPE_CHECKING:
    from topk_cli.inputs import LoadedInput

#: Entries of each shown row: all of them up to this many, else the first ones.
TABLE_ENTRIES = 8
JSON_ENTRIES = 50
CSV_COLUMNS = ("row", "row_name", "entry", "label", "value")
_SEPARATORS = {",": "','", ";": "';'", "\t": "tab", " ": "space", "|": "'|'"}


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else ("-inf" if value < 0 else str(value))


def inspect_document(data: LoadedInput, *, rows: int = 5) -> dict[str, Any]:
    """The JSON document: format, shape, every recorded decision, the notes, the first rows."""
    d = data.decisions
    count, n = data.values.shape
    shown_rows = min(rows, count)
    shown = min(n, JSON_ENTRIES)
    labels_given = not isinstance(data.labels, IndexNames)
    return {
        "source": data.source,
        "format": data.input_format,
        "compression": d.compression,
        "rows": count,
        "n": n,
        "layout": d.shape,
        "separator": d.separator,
        "decimal": d.decimal,
        "header": d.header,
        "orientation": d.orientation,
        "row_names_from": d.row_names_from or ("the data (see notes)" if data.row_names_given else None),
        "labels_from": d.labels_from or ("the data (see notes)" if labels_given else None),
        "ignored": list(d.ignored),
        "notes": list(data.notes),
        "masked": int((data.values == -math.inf).sum()),
        "labels": list(data.labels[:shown]),
        "entries_shown": shown,
        "head": [
            {"row": r, "name": data.row_names[r], "values": [_number(float(v)) for v in data.values[r, :shown]]}
            for r in range(shown_rows)
        ],
    }


def _facts(data: LoadedInput, doc: dict[str, Any]) -> Text:
    """One decision per line: ``name  value`` (no table: a long note wraps, no padding)."""
    count, n = data.values.shape
    lines: list[tuple[str, str]] = []
    lines.append(("format", doc["format"] + (f" ({doc['compression']})" if doc["compression"] else "")))
    what = f"{count} vectors of {n} entries" if count != 1 else f"1 vector of {n} entries"
    lines.append(("shape", f"{what} ({count} x {n})" + (f"; {doc['masked']} masked (-inf)" if doc["masked"] else "")))
    if doc["layout"]:
        lines.append(("layout", doc["layout"]))
    if data.input_format in ("csv", "tsv"):
        sep = doc["separator"]
        lines.append(("separator", _SEPARATORS.get(sep, repr(sep)) if sep is not None else "not recorded (see notes)"))
        if doc["decimal"] is not None:
            lines.append(("decimal mark", repr(doc["decimal"])))
        header = doc["header"]
        lines.append(("header", "not recorded (see notes)" if header is None else ("line 1" if header else "none")))
    if doc["orientation"]:
        lines.append(("orientation", {"rows": "rows: each key one vector",
                                      "columns": "columns: each key one column"}.get(doc["orientation"], doc["orientation"])))
    lines.append(("row names", doc["row_names_from"] or f"none (numbered 0..{count - 1})"))
    lines.append(("labels", doc["labels_from"] or f"none (numbered 0..{n - 1})"))
    lines.append(("ignored", ", ".join(doc["ignored"]) if doc["ignored"] else "-"))
    lines += [("notes" if i == 0 else "", note) for i, note in enumerate(doc["notes"] or ["none"])]
    width = max(len(key) for key, _ in lines) + 2
    text = Text(data.source)
    for key, value in lines:
        text.append("\n")
        text.append(key.ljust(width), style="bold")
        text.append(value)
    return text


def _head(data: LoadedInput, rows: int) -> Table:
    count, n = data.values.shape
    shown_rows = min(rows, count)
    shown = min(n, TABLE_ENTRIES)
    title = f"first {shown_rows} of {count} vectors as read" if shown_rows < count else "the vectors as read"
    if shown < n:
        title += f" (first {shown} of {n} entries)"
    table = Table(title=title, title_justify="left")
    table.add_column("row", justify="right")
    table.add_column("name")
    for c in range(shown):
        table.add_column(str(data.labels[c]), justify="right")
    if shown < n:
        table.add_column("...")
    for r in range(shown_rows):
        cells = [format_float(float(v), 4) for v in data.values[r, :shown]]
        table.add_row(str(r), str(data.row_names[r]), *cells, *(["..."] if shown < n else []))
    return table


def render_inspect(data: LoadedInput, fmt: OutputFormat, *, rows: int = 5, color: bool = False) -> str:
    """How ``data`` was read, as text in ``fmt``."""
    doc = inspect_document(data, rows=rows)
    if fmt is OutputFormat.json:
        return render_json(doc)
    if fmt is OutputFormat.csv:
        count, n = data.values.shape
        out = [
            {"row": r, "row_name": data.row_names[r], "entry": c, "label": data.labels[c], "value": _number(float(v))}
            for r in range(min(rows, count)) for c, v in enumerate(data.values[r, : min(n, JSON_ENTRIES)])
        ]
        return render_csv(out, CSV_COLUMNS)
    parts: list[Any] = [_facts(data, doc)]
    if rows > 0:
        parts += [Text(""), _head(data, rows)]
    return renderables_to_text(parts, color=color)
