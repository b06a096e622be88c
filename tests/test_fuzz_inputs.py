"""Hypothesis fuzz of the CSV and JSON readers through the CLI: no exception escapes the boundary.

Every generated file either reads (exit 0) or is refused with one ``softtopk: error:`` line and
exit 2; examples are bounded so the suite stays fast.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CELLS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.sampled_from(["", "NA", "nan", "-inf", "inf", "True", "x", "1,5", '"a,b"', "[b]", "#", "\ufeff1", "1e400"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6),
)
SEPARATORS = st.sampled_from([",", ";", "\t"])
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False),
              st.integers(min_value=-(10**400), max_value=10**400), st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=4)),
    max_leaves=12,
)


def check(name: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        result = run_cli("compute", "-m", "hard", "-k", "1", "--format", "csv", str(path))  # no exception, no internal error
    assert result.code in (0, 2), (result.code, result.err)
    if result.code == 2:
        lines = result.err.splitlines()
        assert lines[-1].startswith("softtopk: error: "), result.err  # one error line, after any notes
        assert all(line.startswith("softtopk: note: ") for line in lines[:-1]), result.err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(CELLS, min_size=1, max_size=4), min_size=1, max_size=5), SEPARATORS, st.booleans())
def test_csv_reader_never_escapes(rows: list[list[str]], sep: str, bom: bool) -> None:
    text = "\n".join(sep.join(row) for row in rows) + "\n"
    check("f.csv", (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_VALUES, st.booleans())
def test_json_reader_never_escapes(doc: object, lines: bool) -> None:
    import json

    if lines and isinstance(doc, list):
        check("f.jsonl", "\n".join(json.dumps(item) for item in doc).encode() or b"[]")
    else:
        check("f.json", json.dumps(doc).encode())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80))
def test_npy_reader_never_escapes(tail: bytes) -> None:
    check("f.npy", b"\x93NUMPY\x01\x00" + tail)
