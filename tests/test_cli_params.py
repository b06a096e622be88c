"""The command line's direct argument coercion gives exactly Typer's own results, and refuses the
values Typer refuses, in the tool's own words (never pydantic's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import run_cli
from typer._click.exceptions import BadParameter, UsageError

from topk_cli.cli import app
from topk_cli.cli_params import install_group

RAW: list[Any] = [
    "2", "0", "-3", "007", "-0", "2.0", "2.5", "1e3", "1E-3", "1e-400", ".5", "1.", "-0.0", "inf", "-inf", "nan",
    "1e400", "123456789012345678901234", " 2", "2 ", "+2", "0x10", "1_000", "abc", "", "table", "JSON", "Csv",
    "x.csv", "-", "a,b", "./a b/c.json", "~/x", 2, 0, 2.5, -0.0, True, False, ("a", "b"), ["a"], ("1",), (),
]


def _installed() -> list[tuple[Any, Any]]:
    group = typer.main.get_command(app)
    install_group(group)
    out = []
    for command in [group, *group.commands.values()]:
        ctx = typer.Context(command, info_name="softtopk")
        params = list(command.params)
        helper = command.get_help_option(ctx)
        if helper is not None:
            params.append(helper)
        out.extend((p, ctx) for p in params if getattr(p, "_runtime_param", None) is not None)
    return out


def _outcome(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        out = runtime.coerce(value, param=param, ctx=ctx)
    except (BadParameter, UsageError) as exc:
        return "error", exc.format_message()
    except Exception as exc:  # pragma: no cover - shown by the comparison
        return "raised", f"{type(exc).__name__}: {exc}"
    return type(out).__name__, out


def test_every_parameter_of_every_command_coerces_as_typer_does() -> None:
    from typer._coercion import build_runtime_param

    installed = _installed()
    kinds = {runtime_kind for runtime_kind in (getattr(p._runtime_param, "kind", None) for p, _ in installed)}
    assert {"int", "float", "str", "list-str", "choice", "path", "bool"} <= kinds
    for param, ctx in installed:
        typer_own = build_runtime_param(param.type_descriptor)
        for value in RAW:
            got = _outcome(param._runtime_param, value, param, ctx)
            want = _outcome(typer_own, value, param, ctx)
            if got[0] == "error" and want[0] == "int" and abs(want[1]) >= 2**63:
                assert "below 2**63" in got[1], got  # numpy's integers are 64-bit: refused up front
                continue
            if got[0] == want[0] == "error":  # refused alike; the message is the tool's own
                assert "Input should be" not in got[1] and "Value error" not in got[1], (param.name, value, got)
                continue
            same = got == want or (got[0] == want[0] == "float" and got[1] != got[1] and want[1] != want[1])
            assert same, (param.name, value, got, want)


@pytest.mark.parametrize(
    "argv",
    [["compute", "-k", "2", "--values", "3,2,1", "-o", "{tmp}/out.txt"], ["compute", "--help"], ["--help"]],
)
def test_plain_arguments_do_not_import_pydantic(argv: list[str], tmp_path: Path) -> None:
    """Start-up time: Typer's pydantic adapters are built only for values the direct path defers."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = (
        "import sys, io, contextlib\nfrom topk_cli.cli import main\n"
        f"sys.argv = ['softtopk', *{argv!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main()\n    except SystemExit as exc:\n        assert exc.code == 0, exc.code\n"
        "print('pydantic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False"]


def test_deferred_values_are_refused_in_the_tools_words() -> None:
    r = run_cli("verify-properties", "--trials", "2.5", "--values", "3,2,1")  # -k takes a real k; --trials does not
    assert r.code == 2
    assert r.err == "softtopk: error: --trials must be an integer, got '2.5' (see 'softtopk verify-properties --help')\n"
    r = run_cli("compute", "-k", "2.0", "--values", "3,2,1", "--format", "json")
    assert r.code == 0, r.err
