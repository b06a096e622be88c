"""JSON and JSON Lines, in the shapes numpy, pandas, polars, jq and people write.

Vectors:

- a list of numbers (one vector); a list of equal-length lists (a batch, pandas' ``orient="values"``;
  a text first entry in every row names the rows);
- an object ``{label: number}`` (one labelled vector, ``Series.to_json()``);
- an object ``{name: [numbers]}`` (``json.dump({token: logits.tolist()})``): each key one vector,
  named by the key (announced). No pandas orient writes lists under keys; ``df.to_dict("list")``
  does, keyed by column: a key holding text (a label column) makes it a table of columns, and
  ``--orient columns`` says so for all-number columns;
- an object with one key holding a batch (``{"logits": [[...], ...]}``);
- records holding one list each (``{"id": 0, "logits": [...]}``, as polars and jq write them): the
  list is the vector, the first other text or integer key names the row.

Tables, read by the layout rule of :mod:`topk_cli.inputs.table`: records (``orient="records"``),
``orient="split"``, ``orient="table"`` and the two objects of objects pandas writes:
``orient="columns"`` (its default, ``{column: {row: value}}``) and ``orient="index"``
(``{row: {column: value}}``). The two look alike; pandas' default index (keys ``"0".."N-1"``) on one
level tells them apart, else ``--orient rows|columns`` must (an object of objects with named rows
and named columns is refused as ambiguous, never transposed by a guess).

JSON Lines (``.jsonl``/``.ndjson``): one list, record or number per line. JSON has no infinity:
write ``"-inf"`` as a string to mask. ``null``, duplicate keys or column names and numbers beyond
the float64 range are refused. Places in messages: ``[i]`` / ``[i][j]`` (JSON paths), ``key 'a'``,
``record [i]``, ``line L`` (JSON Lines, 1-based).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from topk_cli.errors import InputError
from topk_cli.inputs.jsonobjects import from_object
from topk_cli.inputs.jsonparts import SHAPE_HELP, Where, no_orient, read_batch, read_records, read_vector
from topk_cli.inputs.model import LoadedInput, with_decisions

#: ``--orient`` values: how the keys of a JSON object are read.
ORIENTS = ("rows", "columns")
_MAX_DIGITS = 309  # an integer with more digits is beyond float64's range


def _decoder(source: str, line: int | None = None) -> Callable[[str | bytes], Any]:
    where = f"{source}: line {line}" if line is not None else source

    def constant(name: str) -> float:
        if name == "-Infinity":
            return -math.inf
        raise InputError(f"{where}: {name} is not allowed (use \"-inf\" to mask an entry)")

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > _MAX_DIGITS or abs(int(text)) > 1.7976931348623157e308:
            raise InputError(f"{where}: the integer {text[:12]}... ({len(text)} digits) is beyond the float64 range")
        return int(text)

    def parse_float(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            raise InputError(f"{where}: the number {text[:40]} is beyond the float64 range (|x| > 1.8e308)")
        return value

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise InputError(f"{where}: duplicate key {key!r} in an object (JSON tools keep only one)")
            out[key] = value
        return out

    def decode(data: str | bytes) -> Any:
        try:
            return json.loads(
                data, parse_constant=constant, parse_int=parse_int, parse_float=parse_float, object_pairs_hook=pairs
            )
        except json.JSONDecodeError as exc:
            lineno = exc.lineno if line is None else line
            raise InputError(f"{source}: malformed JSON at line {lineno}, column {exc.colno}: {exc.msg}") from None
        except RecursionError:
            raise InputError(f"{where}: malformed JSON: nested too deeply") from None

    return decode



def load_json(
    data: bytes, source: str, *, column: str | None = None, index_col: str | None = None, orient: str | None = None
) -> LoadedInput:
    """Read one JSON document; see the module docstring."""
    doc = _decoder(source)(data)
    return _from_document(doc, Where(source, "json"), column, index_col, check_orient(orient))


def load_jsonl(
    text: str, source: str, *, column: str | None = None, index_col: str | None = None, orient: str | None = None
) -> LoadedInput:
    """Read JSON Lines: one list, record or number per non-blank line."""
    items: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        if line.strip():
            items.append(_decoder(source, number)(line))
            lines.append(number)
    if not items:
        raise InputError(f"{source}: no JSON lines")
    if orient is not None:
        raise InputError(f"{source}: --orient applies to a JSON object of vectors or columns, not to JSON Lines")
    return _from_document(items, Where(source, "jsonl", lines), column, index_col, None)


def check_orient(orient: str | None) -> str | None:
    """``--orient`` normalised (``rows`` or ``columns``); None stays None."""
    if orient is None:
        return None
    value = orient.strip().lower()
    if value not in ORIENTS:
        raise InputError(f"unknown --orient {orient!r}; valid: rows (each key one vector), columns (each key one column)")
    return value


def _from_document(doc: Any, where: Where, column: str | None, index_col: str | None, orient: str | None) -> LoadedInput:
    source = where.source
    if isinstance(doc, dict):
        return from_object(doc, where, column, index_col, orient)
    if not isinstance(doc, list) or not doc:
        what = "an empty list" if isinstance(doc, list) else f"a {type(doc).__name__}"
        raise InputError(f"{source}: got {what}; {SHAPE_HELP}")
    if all(isinstance(item, dict) for item in doc):
        no_orient(where, orient, "records")
        return read_records(doc, where, column, index_col)
    no_orient(where, orient, "a list")
    if column is not None:
        raise InputError(f"{source}: --column applies to CSV columns and JSON tables (records, an object of columns)")
    if all(isinstance(item, list) for item in doc):
        return with_decisions(read_batch(doc, where, where.item, where.entry), shape="list of lists")
    if any(isinstance(item, (list, dict)) for item in doc):
        first = next((i for i, item in enumerate(doc) if type(item) is not type(doc[0])), 0)
        kinds = "lists and numbers" if not any(isinstance(item, dict) for item in doc) else "lists, objects and numbers"
        raise InputError(f"{source}: {where.item(first)} mixes {kinds}; {SHAPE_HELP}")
    return with_decisions(read_vector(doc, where, None, place=where.item), shape="list of numbers")
