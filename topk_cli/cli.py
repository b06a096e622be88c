"""The ``softtopk`` command line: a thin Typer layer over the library.

Each command: load -> compute (library) -> render (``topk_cli.render``) -> write -> exit code.
Errors of the ``SoftTopKError`` family are caught at the boundary (the :func:`boundary`
decorator on every command) and become one line on stderr and exit code 2. Exit 1 means "ran and found a failure".
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from topk_cli import __version__
from topk_cli.errors import SoftTopKError
from topk_cli.render.common import OutputFormat

app = typer.Typer(
    name="softtopk",
    help=(
        "Compute, compare and stress-test smooth top-k operators.\n\n"
        "Example: softtopk compute --method thre-sigmoid -k 2 sample_inputs/scores.csv"
    ),
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# ---- options shared by every command (same flag, same meaning) ------------------------------

InputArg = Annotated[
    Optional[str],
    typer.Argument(help="Input file (.csv, .json, .npy) or '-' for stdin. Omit when using --values.", show_default=False),
]
ValuesOpt = Annotated[
    Optional[str],
    typer.Option("--values", help="Inline vector instead of INPUT, e.g. --values 3,2,1,4.", show_default=False),
]
ColumnOpt = Annotated[
    Optional[str], typer.Option("--column", help="Use this CSV column as the single vector.", show_default=False)
]
InputFormatOpt = Annotated[
    Optional[str],
    typer.Option("--input-format", help="Override the format guessed from the suffix: csv, json or npy.", show_default=False),
]
MethodOpt = Annotated[
    Optional[list[str]],
    typer.Option("-m", "--method", help="Method name (repeatable), or 'all'. See 'softtopk methods'.", show_default=False),
]
TauOpt = Annotated[float, typer.Option("--tau", help="Temperature > 0: the operator acts on x / tau.")]
FormatOpt = Annotated[OutputFormat, typer.Option("--format", help="Output format.")]
OutputOpt = Annotated[
    Optional[Path], typer.Option("-o", "--output", help="Write to this file (atomically) instead of stdout.", show_default=False)
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the random generator (results are deterministic).")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 1 when a failure is found (for CI).")]


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"softtopk {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Compute, compare and stress-test smooth top-k operators."""


F = TypeVar("F", bound=Callable[..., Any])


def boundary(func: F) -> F:
    """Turn library errors (bad input, bad arguments) into one stderr line and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SoftTopKError as exc:
            typer.echo(f"softtopk: error: {exc}", err=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def color_enabled(stream: object = None) -> bool:
    """Colour only on a terminal and when NO_COLOR is unset (https://no-color.org)."""
    target = stream if stream is not None else sys.stdout
    isatty = getattr(target, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def stderr_is_terminal() -> bool:
    """Progress bars go to stderr, and only when it is a terminal."""
    return sys.stderr.isatty()


# ---- commands --------------------------------------------------------------------------------
# COMMANDS-BEGIN (each helper edits only its own command below)


# COMMANDS-END


def main() -> None:
    """Entry point of the console script (``softtopk`` and ``python -m topk_cli``)."""
    app()
