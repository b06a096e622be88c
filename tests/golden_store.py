"""Stored outputs of the mpmath references (``tests/golden/references.json.gz``), so that the suite
does not recompute them on every run.

A test wraps a deterministic reference computation with :func:`golden`::

    @golden("test_accuracy.reference_floats")
    def _reference_floats(name: str, x: tuple[float, ...], k: int, tau: float) -> tuple[float, ...]:
        ...

Each call is looked up by its name and its exact arguments (floats bit for bit, vectors by content).
``SOFTTOPK_GOLDEN`` selects the mode:

* unset or ``use``: the stored value when there is one, else the reference is computed (a
  :class:`GoldenMissWarning` says so: regenerate the file with ``tests/golden/make_golden.py``);
* ``off``: always compute (the references as they were, every run);
* ``record``: always compute, and write every value computed in this process to
  ``SOFTTOPK_GOLDEN_OUT`` at exit (what ``make_golden.py`` runs).

The stored values are the reference's own outputs, rounded to float64 exactly as the tests round
them; ``tests/test_golden.py`` recomputes a random sample of them on every run.
"""

from __future__ import annotations

import atexit
import base64
import functools
import gzip
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

GOLDEN_FILE = Path(__file__).resolve().parent / "golden" / "references.json.gz"

#: name -> the undecorated reference computation (filled as test modules are imported).
REGISTRY: dict[str, Callable[..., Any]] = {}
#: name -> module that defines it (the sample test imports it to fill REGISTRY).
MODULES: dict[str, str] = {}


class GoldenMissWarning(UserWarning):
    """A reference value was not in the stored file and was computed (slow)."""


def mode() -> str:
    value = os.environ.get("SOFTTOPK_GOLDEN", "use") or "use"
    if value not in ("use", "off", "record"):
        raise ValueError(f"SOFTTOPK_GOLDEN must be use, off or record, got {value!r}")
    return value


# -- encoding: exact, compact, content-addressed -----------------------------------------------


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f8").tobytes()).decode("ascii")


def _unb64(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<f8").copy()


def _is_vector(v: Any) -> bool:
    """A non-empty tuple or list of floats (ints that float64 holds exactly are stored as floats)."""
    return (isinstance(v, (tuple, list)) and len(v) > 0
            and all(isinstance(e, float) or (type(e) is int and abs(e) <= 2**53) for e in v))


def encode_args(args: tuple[Any, ...], vectors: dict[str, str]) -> list[Any]:
    """JSON-able form of the arguments; float vectors go to ``vectors`` (id -> base64) by content."""
    out: list[Any] = []
    for v in args:
        if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
            out.append(v)
        elif isinstance(v, float):
            out.append({"f": float.hex(v)})
        elif _is_vector(v):
            data = _b64(np.asarray(v, dtype=np.float64))
            vid = hashlib.sha256(data.encode()).hexdigest()[:20]
            vectors[vid] = data
            out.append({"v": vid, "list": isinstance(v, list)})
        elif isinstance(v, (tuple, list)) and len(v) == 0:
            out.append({"empty": isinstance(v, list)})
        else:
            raise TypeError(f"golden: cannot key an argument of type {type(v).__name__}")
    return out


def decode_args(encoded: list[Any], vectors: dict[str, str]) -> tuple[Any, ...]:
    out: list[Any] = []
    for v in encoded:
        if isinstance(v, dict) and "f" in v:
            out.append(float.fromhex(v["f"]))
        elif isinstance(v, dict) and "v" in v:
            vals = [float(e) for e in _unb64(vectors[v["v"]])]
            out.append(vals if v["list"] else tuple(vals))
        elif isinstance(v, dict) and "empty" in v:
            out.append([] if v["empty"] else ())
        else:
            out.append(v)
    return tuple(out)


def _key(name: str, encoded: list[Any]) -> str:
    return hashlib.sha256(json.dumps([name, encoded], sort_keys=True).encode()).hexdigest()[:32]


def encode_result(value: Any) -> dict[str, Any]:
    """A result: a tuple or list of floats (``vec``), a pair or list of such (``rows``), an array."""
    if isinstance(value, np.ndarray):
        kind = "array"
    elif isinstance(value, (tuple, list)) and value and isinstance(value[0], (tuple, list)):
        kind = "rows-" + type(value).__name__ + "-" + type(value[0]).__name__
    else:
        kind = "vec-" + type(value).__name__
    arr = np.asarray(value, dtype=np.float64)
    return {"kind": kind, "shape": list(arr.shape), "data": _b64(arr)}


def decode_result(entry: dict[str, Any]) -> Any:
    arr = _unb64(entry["data"]).reshape(entry["shape"])
    kind = entry["kind"]
    if kind == "array":
        return arr
    if kind.startswith("rows-"):
        _, outer, inner = kind.split("-")
        rows = [(tuple if inner == "tuple" else list)(float(v) for v in row) for row in arr]
        return tuple(rows) if outer == "tuple" else rows
    values = [float(v) for v in arr]
    return tuple(values) if kind == "vec-tuple" else values


# -- the store ----------------------------------------------------------------------------------


@functools.cache
def stored() -> dict[str, Any]:
    """The stored file: ``{"meta", "vectors", "entries": {key: {name, args, result}}}``."""
    if not GOLDEN_FILE.exists():
        return {"meta": {}, "vectors": {}, "entries": {}}
    with gzip.open(GOLDEN_FILE, "rt", encoding="utf-8") as fh:
        return json.load(fh)


_RECORDED: dict[str, Any] = {"vectors": {}, "entries": {}}


def golden(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Serve ``fn``'s results from the stored file (see the module docstring)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY[name] = fn
        MODULES[name] = fn.__module__

        @functools.wraps(fn)
        def cached(*args: Any) -> Any:
            how = mode()
            if how == "off":
                return fn(*args)
            vectors: dict[str, str] = {}
            encoded = encode_args(args, vectors)
            key = _key(name, encoded)
            if how == "use":
                entry = stored()["entries"].get(key)
                if entry is not None:
                    return decode_result(entry["result"])
                warnings.warn(f"golden: no stored value for {name}{_short(args)}: computed with mpmath "
                              "(regenerate tests/golden/references.json.gz with tests/golden/make_golden.py)",
                              GoldenMissWarning, stacklevel=2)
                return fn(*args)
            value = fn(*args)
            _RECORDED["vectors"].update(vectors)
            _RECORDED["entries"][key] = {"name": name, "args": encoded, "result": encode_result(value)}
            return value

        return cached

    return wrap


def _short(args: tuple[Any, ...]) -> str:
    text = repr(args)
    return text if len(text) < 120 else text[:117] + "..."


def write_recorded(path: Path, meta: dict[str, Any]) -> int:
    """Write what this process recorded (``record`` mode); the number of entries."""
    doc = {"meta": meta, "vectors": dict(sorted(_RECORDED["vectors"].items())),
           "entries": dict(sorted(_RECORDED["entries"].items()))}
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return len(doc["entries"])


def _write_at_exit() -> None:
    out = os.environ.get("SOFTTOPK_GOLDEN_OUT")
    if mode() == "record" and out and _RECORDED["entries"]:
        meta = json.loads(os.environ.get("SOFTTOPK_GOLDEN_META", "{}"))
        write_recorded(Path(out), meta)


atexit.register(_write_at_exit)
