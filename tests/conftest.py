"""Helpers shared by the test modules: one CLI runner, one bit-equality check, the sample paths.

``run_cli`` is the only way tests run the command line in-process. It fails the test when the
command ended in an exception other than ``SystemExit`` or when the boundary turned a bug into
"internal error ... please report it" (exit 2 and one line on stderr: without this check such a
bug would pass any test that expects exit 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_inputs"


@dataclass(frozen=True)
class CliResult:
    """What one in-process run of ``softtopk`` gave: exit code, stdout and stderr, kept apart."""

    code: int
    out: str
    err: str

    def __iter__(self):  # ``code, out, err = run_cli(...)``
        return iter((self.code, self.out, self.err))

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def output(self) -> str:
        """stdout then stderr (for messages and "not anywhere in the output" checks)."""
        return self.out + self.err


def run_cli(*args: str, input: str | bytes | None = None, allow_internal_error: bool = False) -> CliResult:
    """Run ``softtopk ARGS`` in-process (Typer's CliRunner, stdout and stderr separate)."""
    from typer.testing import CliRunner

    from topk_cli.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    if not allow_internal_error:
        assert "internal error" not in result.stderr, result.stderr
    return CliResult(result.exit_code, result.stdout, result.stderr)


def same_bits(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are equal bit for bit: same dtype and shape, same bytes (NaN payloads
    and signed zeros included); object arrays (e.g. strings) element by element."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "O":
        return a.tolist() == b.tolist()
    return a.tobytes() == b.tobytes()


def assert_same_bits(a: Any, b: Any, what: str = "") -> None:
    """Arrays equal bit for bit (NaN payloads and signed zeros included), same dtype and shape."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    if a.dtype.kind == "O":
        assert a.tolist() == b.tolist(), what
        return
    assert a.tobytes() == b.tobytes(), f"{what} differ at bytes {np.flatnonzero(np.frombuffer(a.tobytes(), np.uint8) != np.frombuffer(b.tobytes(), np.uint8))[:5]}"
