"""The core imports numpy and the standard library only; the CLI's --help stays light.

The core is every module of ``topk_cli`` but the CLI layer (``cli``, ``cli_params``,
``__main__``), ``render`` and ``inputs``. Its modules are found by walking the package (the lazy
``__getattr__`` of ``analysis`` and ``topk_cli`` would hide most of them from a plain
``import topk_cli.analysis``) and each is imported in a fresh interpreter. ruff's banned-api
(pyproject.toml) checks the same rule statically.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: What the core must not load: presentation and I/O libraries, array frameworks.
BANNED = ("pandas", "rich", "typer", "click", "matplotlib", "torch", "jax")
#: The CLI layer and the framework layer (the drop-ins and the adapters for users' PyTorch / JAX
#: operators), where these may be imported (also excluded from ruff's banned-api).
NOT_CORE = ("topk_cli.cli", "topk_cli.cli_params", "topk_cli.__main__", "topk_cli.render", "topk_cli.inputs",
            "topk_cli.frameworks", "topk_cli.torch", "topk_cli.jax")

_WALK = f"""
import importlib, json, pkgutil, sys
import topk_cli
names = ["topk_cli"] + [m.name for m in pkgutil.walk_packages(topk_cli.__path__, "topk_cli.")]
core = [n for n in names if not any(n == p or n.startswith(p + ".") for p in {NOT_CORE!r})]
print(json.dumps(core))
"""


def _core_modules() -> list[str]:
    out = subprocess.run([sys.executable, "-c", _WALK], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _banned_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return {name.split(".")[0] for name in out.split()} & set(BANNED)


def test_the_walk_finds_the_core() -> None:
    core = _core_modules()
    for name in ("topk_cli.api", "topk_cli.registry", "topk_cli.operators.sequential",
                 "topk_cli.properties.checks", "topk_cli.analysis.probe", "topk_cli.analysis.train_probe.training"):
        assert name in core, name
    assert not any(name.startswith(("topk_cli.render", "topk_cli.inputs", "topk_cli.cli")) for name in core)
    assert len(core) >= 50, len(core)


def test_core_does_not_import_presentation_or_io_libraries() -> None:
    core = _core_modules()
    loaded = _banned_after("\n".join(f"import {name}" for name in core))
    if loaded:  # name the modules that pull them in, each imported alone
        culprits = {name: sorted(found) for name in core if (found := _banned_after(f"import {name}"))}
        raise AssertionError(f"core modules import {sorted(loaded)}: {culprits}")


def test_the_import_check_can_fail() -> None:
    assert _banned_after("import topk_cli.render.common") >= {"rich"}


def test_cli_help_does_not_import_pandas() -> None:
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom topk_cli.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
        "print('pandas' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "False"]
