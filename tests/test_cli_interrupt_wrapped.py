"""Ctrl-C that Python re-raises wrapped in another exception is still an interrupt, not a bug.

Python 3.11 turns an exception raised while a class is created (a dataclass field's
``__set_name__``) into ``RuntimeError: Error calling __set_name__ ...`` with the original as its
cause: a Ctrl-C that lands while a lazy import defines a dataclass reached the command boundary
as a RuntimeError and was reported as an internal error.
"""

from __future__ import annotations

import pytest

from topk_cli import cli


def _wrapped_interrupt() -> None:
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        raise RuntimeError("Error calling __set_name__ on 'Field' instance 'implementation' in 'MethodSpec'") from exc


def test_a_wrapped_interrupt_is_one_line_and_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli._run_group(_wrapped_interrupt) == 130
    assert capsys.readouterr().err == "softtopk: interrupted\n"


def test_an_interrupt_in_the_context_counts_too(capsys: pytest.CaptureFixture[str]) -> None:
    def run() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("while handling it")  # the interrupt is its __context__

    assert cli._run_group(run) == 130
    assert capsys.readouterr().err == "softtopk: interrupted\n"


def test_a_plain_bug_is_still_an_internal_error(capsys: pytest.CaptureFixture[str]) -> None:
    def run() -> None:
        raise RuntimeError("boom")

    assert cli._run_group(run) == 2
    assert "internal error (RuntimeError: boom)" in capsys.readouterr().err
