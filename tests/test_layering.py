"""The core imports numpy and the standard library only; the CLI's --help stays light."""

from __future__ import annotations

import subprocess
import sys

CORE = [
    "topk_cli",
    "topk_cli.api",
    "topk_cli.registry",
    "topk_cli.method_spec",
    "topk_cli.properties",
    "topk_cli.analysis",
    "topk_cli.references",
    "topk_cli.recursion",
]


def _loaded_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_core_does_not_import_presentation_or_io_libraries() -> None:
    loaded = _loaded_after("\n".join(f"import {name}" for name in CORE))
    assert not {"pandas", "rich", "typer", "click", "matplotlib"} & loaded


def test_cli_help_does_not_import_pandas() -> None:
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom topk_cli.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
        "print('pandas' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "False"]
