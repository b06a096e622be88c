"""Helpers shared by the test modules: one CLI runner, one bit-equality check, the sample paths.

``run_cli`` is the only way tests run the command line in-process. It fails the test when the
command ended in an exception other than ``SystemExit`` or when the boundary turned a bug into
"internal error ... please report it" (exit 2 and one line on stderr: without this check such a
bug would pass any test that expects exit 2).

The array backends a test runs on: a test that takes the ``backend`` fixture is run once per
backend selected by ``--backends`` or the environment variable ``SOFTTOPK_TEST_BACKENDS``:
``numpy`` (the default), ``all``, or a comma list such as ``numpy,torch,jax``. ``all`` skips
(with the reason) a framework that is not installed; a named one that is not installed is a
usage error. ``@pytest.mark.backends("numpy", "torch")`` limits a test to the backends it supports.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

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


# -- the backend axis -----------------------------------------------------------------------------

#: Every array backend the tests know; "numpy" is the library's own.
KNOWN_BACKENDS = ("numpy", "torch", "jax")
BACKENDS_ENV = "SOFTTOPK_TEST_BACKENDS"


def parse_backends(raw: str | None) -> tuple[list[str], bool]:
    """``(backends, explicit)`` from an option value: "" or None -> numpy; "all" -> every known one."""
    text = (raw or "numpy").strip().lower()
    if text == "all":
        return list(KNOWN_BACKENDS), False
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in KNOWN_BACKENDS]
    if unknown or not names:
        raise pytest.UsageError(f"{BACKENDS_ENV} / --backends: unknown backend {unknown or raw!r}; "
                                f"use all or a comma list of {', '.join(KNOWN_BACKENDS)}")
    return list(dict.fromkeys(names)), True


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--backends", default=None,
                     help=f"array backends for tests that take the 'backend' fixture: numpy (default), all, "
                          f"or a comma list of {', '.join(KNOWN_BACKENDS)} (also ${BACKENDS_ENV})")


def selected_backends(config: pytest.Config) -> tuple[list[str], bool]:
    return parse_backends(config.getoption("--backends") or os.environ.get(BACKENDS_ENV))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "backends(*names): the array backends a test supports (default: every one)")
    names, explicit = selected_backends(config)
    missing = [n for n in names if n != "numpy" and importlib.util.find_spec(n) is None]
    if explicit and missing:
        raise pytest.UsageError(f"{BACKENDS_ENV} / --backends names {', '.join(missing)}, which is not installed")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    names, _ = selected_backends(metafunc.config)
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None:
        names = [n for n in names if n in marker.args]
    metafunc.parametrize("backend", names, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend this run of the test is for (see the module docstring)."""
    name: str = request.param
    if name != "numpy" and importlib.util.find_spec(name) is None:
        pytest.skip(f"backend {name}: {name} is not installed")
    return name
