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


def assert_same_bits(a: Any, b: Any) -> None:
    """Arrays equal bit for bit (NaN payloads and signed zeros included), same dtype and shape."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.tobytes() == b.tobytes(), f"differ at {np.argwhere(a.view(np.uint8).reshape(-1) != b.view(np.uint8).reshape(-1))[:5].ravel()}"
