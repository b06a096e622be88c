"""The ``softtopk`` command line: a thin Typer layer over the library.

Each command: load -> compute (library) -> render (``topk_cli.render``) -> write -> exit code.
Errors of the ``SoftTopKError`` family are caught at the boundary (the :func:`boundary`
decorator on every command) and become one line on stderr and exit code 2. Exit 1 means "ran and found a failure".
"""

from __future__ import annotations

import _signal  # signal's C core, loaded with the interpreter: the handler is in place at once
import math
import os
import sys


def _interrupted_while_loading(signum: int, frame: object) -> None:
    """Ctrl-C while this module loads (imports, building the options): nothing is open or written
    yet, so leave at once with the line and exit code of an interrupt at any later moment."""
    try:
        os.write(2, b"softtopk: interrupted\n")
    finally:
        os._exit(130)


def _catch_interrupts_while_loading() -> Any:
    """Handle SIGINT with :func:`_interrupted_while_loading` until the end of this module (until
    :func:`main` in the console script), unless the process handles SIGINT its own way (or this
    is not the main thread); returns the previous handler."""
    try:
        if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            return _signal.signal(_signal.SIGINT, _interrupted_while_loading)
    except ValueError:  # not the main thread
        pass
    return None


_HANDLER_BEFORE_LOADING = _catch_interrupts_while_loading()

import functools  # noqa: E402 (after the interrupt handler: the imports take most of the start-up)
import signal  # noqa: E402
from collections.abc import Callable, Iterable, Sequence  # noqa: E402
from enum import Enum  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar, cast  # noqa: E402

import typer  # noqa: E402
from typer.core import TyperGroup  # noqa: E402

from topk_cli import __version__  # noqa: E402
from topk_cli.catalog import INPUT_FORMAT_ALIASES, INPUT_FORMATS, METHOD_NAMES, METHOD_PARAMETERS  # noqa: E402
from topk_cli.cli_params import user_operator_options  # noqa: E402
from topk_cli.errors import InputError, InvalidArgumentError, SoftTopKError, UnknownMethodError  # noqa: E402
from topk_cli.output import check_output_path, output_format, plot_format, write_bytes, write_text  # noqa: E402
from topk_cli.render.common import FIT_WIDTH, OutputFormat, terminal_width  # noqa: E402


class SoftTopKGroup(TyperGroup):
    """The command group, run so that nothing but one line ever reaches a user on failure.

    Usage errors (``-k abc``, ``--format xml``, a missing ``-k``, an unknown option) become
    ``softtopk: error: ...`` and exit 2 instead of Click's usage block; an interrupt prints
    ``softtopk: interrupted`` and exits 130; an output that cannot be written (full disk, full
    or closed stdout) is one line and exit 2; library warnings are silenced. It holds for the
    console script, ``python -m topk_cli`` and ``CliRunner`` alike (they all call ``main``).
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        from topk_cli.cli_params import install_group

        install_group(self)  # plain values are converted without importing pydantic (start-up time)
        code = _run_group(lambda: super(SoftTopKGroup, self).main(
            args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
            windows_expand_args=windows_expand_args, **extra,
        ))
        if standalone_mode:
            sys.exit(code)
        return code


def _run_group(run: Callable[[], Any]) -> int:
    import errno
    import warnings

    from typer import Abort
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    def fail(message: str, code: int = 2) -> int:
        try:
            sys.stderr.write(f"softtopk: {message}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return code

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run()
            if sys.stdout is not None:
                sys.stdout.flush()
    except NoArgsIsHelpError as exc:
        exc.show()
        return exc.exit_code
    except ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        see = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        return fail(f"error: {' '.join(exc.format_message().split())}{see}", 2)
    except (Abort, KeyboardInterrupt):
        return fail("interrupted", 130)
    except SystemExit as exc:  # SIGTERM (see main), after the temporary files were removed
        if exc.code == 143:
            return fail("terminated", 143)
        raise
    except OSError as exc:
        _silence_stdout()
        if exc.errno == errno.EPIPE:
            return 1  # the reader went away (e.g. '| head'): nothing to report
        return fail(f"error: cannot write the output: {exc.strerror or exc}", 2)
    except MemoryError:
        return fail("error: out of memory (try a smaller input or grid)", 2)
    except Exception as exc:  # a bug: still one line, never a traceback
        if _caused_by_interrupt(exc):  # Ctrl-C inside a lazy import's class creation (Python 3.11 wraps it)
            return fail("interrupted", 130)
        return fail(f"error: internal error ({type(exc).__name__}: {exc}); please report it", 2)
    if result == 130:
        return fail("interrupted", 130)
    return int(result or 0)


def _caused_by_interrupt(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in ``exc``'s chain of causes (Python 3.11 re-raises one that hits
    a dataclass field's ``__set_name__`` as ``RuntimeError: Error calling __set_name__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _silence_stdout() -> None:
    """After a failed write, point stdout at /dev/null so the exit-time flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass

if TYPE_CHECKING:
    from topk_cli.inputs import LoadedInput
# numpy, the operators and the registry are imported inside the commands that use them, so
# parsing the arguments (and --version, --help) stays about as fast as starting Python.

app = typer.Typer(
    cls=SoftTopKGroup,
    name="softtopk",
    help=(
        "Compute, compare and stress-test smooth top-k operators.\n\n"
        "\b\nExample:\n  softtopk compute -m thre-sigmoid -k 2 sample_inputs/scores.csv"
    ),
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def usage_error(message: str) -> Exception:
    """A usage error of the command line: ``softtopk: error: MESSAGE (see ...)`` and exit 2."""
    from typer._click.exceptions import UsageError

    return UsageError(message)


def _check_seed(value: Optional[int]) -> Optional[int]:
    if value is not None and value < 0:
        raise usage_error(f"--seed must be an integer >= 0, got {value}")
    return value


#: ``--input-format`` choices: the formats the readers support (``topk_cli.catalog``).
InputFormat = Enum("InputFormat", {name: name for name in (*INPUT_FORMATS, *INPUT_FORMAT_ALIASES)}, type=str)  # type: ignore[misc]

# ---- options shared by every command (same flag, same meaning) ------------------------------

InputArg = Annotated[
    Optional[list[str]],
    typer.Argument(
        help=f"Input files ({', '.join('.' + f for f in INPUT_FORMATS)}, each also gzipped as .gz) or '-' for stdin. "
        "Omit when using --values.",
        show_default=False, metavar="INPUT",
    ),
]
ValuesOpt = Annotated[
    Optional[str],
    typer.Option(
        "--values", metavar="X,X,...", help="Inline vector instead of INPUT, e.g. --values 3,2,1,4.", show_default=False
    ),
]
ColumnOpt = Annotated[
    Optional[str],
    typer.Option("--column", metavar="NAME", help="Use this table column as the single vector.", show_default=False),
]
InputFormatOpt = Annotated[
    Optional[InputFormat],
    typer.Option(
        "--input-format", metavar="FORMAT",
        help=f"Override the format guessed from the suffix: {', '.join(INPUT_FORMATS)} "
        f"({', '.join(f'{a} = {b}' for a, b in INPUT_FORMAT_ALIASES.items())}).",
        show_default=False, case_sensitive=False,
    ),
]
IndexColOpt = Annotated[
    Optional[str],
    typer.Option(
        "--index-col", metavar="COLUMN",
        help="Row-name column, by name or 0-based position as in pandas; 'none': no row names.",
        show_default=False,
    ),
]
SepOpt = Annotated[
    Optional[str],
    typer.Option(
        "--sep", metavar="SEP", help="CSV separator (default: sniffed among ',', ';' and tab; '\\t' = tab).",
        show_default=False,
    ),
]
DecimalOpt = Annotated[
    Optional[str],
    typer.Option(
        "--decimal", metavar="MARK", help="Decimal mark of CSV numbers (default '.'; ',' is sniffed in ';' files).",
        show_default=False,
    ),
]
OrientOpt = Annotated[
    Optional[str],
    typer.Option(
        "--orient",
        help="How the keys of a JSON object are read: rows (each key one vector) or columns (each key one column).",
        show_default=False,
    ),
]
HeaderOpt = Annotated[
    Optional[bool],
    typer.Option("--header/--no-header", help="CSV: line 1 is (not) column names (default: inferred, noted).",
                 show_default=False),
]
MethodOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "-m", "--method", metavar="METHOD",
        help=f"Method (repeatable or comma-separated), or 'all': {', '.join(METHOD_NAMES)}. See 'softtopk methods'. "
        "Or your own operator fn(x, k, tau): FILE.py:FUNCTION or package.module:FUNCTION (importing it runs its code).",
        show_default=False,
    ),
]
KOpt = Annotated[
    Optional[float],
    typer.Option(
        "-k", metavar="K",
        help="How many entries to select: an integer 1 <= k <= n, or a real 0 < k <= n (e.g. -k 2.5) for the "
        "methods that take one ('softtopk methods' says which). With -m all, a real k runs those methods "
        "only and names the others skipped on stderr.",
        show_default=False,
    ),
]
KColumnOpt = Annotated[
    Optional[str],
    typer.Option(
        "--k-column", metavar="NAME",
        help="Take each row's k from this column of INPUT (CSV/TSV with a header, JSON records or an object "
        "of columns) instead of -k; the column is not a score. e.g. --k-column capacity.",
        show_default=False,
    ),
]
AxisOpt = Annotated[
    str,
    typer.Option(
        "--axis", metavar="rows|columns",
        help="rows: each row of INPUT is one vector (default); columns: each column is one vector, e.g. the "
        "top-k tokens per expert (expert-choice routing): column names label the vectors, row names the entries.",
    ),
]
TauOpt = Annotated[float, typer.Option("--tau", metavar="TAU", help="Temperature > 0: the operator acts on x / tau.")]
FormatOpt = Annotated[
    OutputFormat,
    typer.Option(
        "--format", help="Output format (default: from the suffix of -o, .csv or .json; else table).", show_default=False
    ),
]
OutputOpt = Annotated[
    Optional[Path],
    typer.Option(
        "-o", "--output", metavar="PATH", help="Write to this file (atomically) instead of stdout.", show_default=False
    ),
]
SeedOpt = Annotated[
    int,
    typer.Option(
        "--seed", metavar="SEED", callback=_check_seed,
        help="Seed of the random generator, >= 0 (results are deterministic).",
    ),
]
JobsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--jobs", "-j", metavar="N",
        help="Processes the grid is spread over (default: the cores available; 1 runs in-process). "
        "Results are identical for every value.",
        show_default=False,
    ),
]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 1 when a failure is found (for CI).")]
HardnessOpt = Annotated[
    Optional[float],
    typer.Option(
        "--hardness", metavar="H",
        help="Instead of --tau: per method, the tau at which the mean top-k mass (share of the weight on the true top-k) is H, in (k/n, 1).",
        show_default=False,
    ),
]
PlotOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--plot", metavar="PATH",
        help="Also save a plot; .png, .svg or .pdf by the suffix (needs matplotlib).", show_default=False,
    ),
]


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
    """Turn library errors (bad input, bad arguments) into one stderr line and exit code 2.

    Before the command runs, the arguments every command shares are checked together (see
    :func:`check_common_arguments`); also sets the table width: the terminal's when the result
    goes to a terminal, else natural.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        to_terminal = kwargs.get("output") is None and stdout_is_terminal()
        token = FIT_WIDTH.set(terminal_width() if to_terminal else None)
        try:
            check_common_arguments(kwargs)
            return func(*args, **kwargs)
        except SoftTopKError as exc:
            typer.echo(f"softtopk: error: {exc}", err=True)
            raise typer.Exit(code=2) from None
        finally:
            FIT_WIDTH.reset(token)

    return wrapper  # type: ignore[return-value]


def given_on_command_line(name: str) -> bool:
    """Whether the parameter ``name`` of the running command was given (not its default)."""
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def check_common_arguments(kwargs: dict[str, Any]) -> None:
    """Check, before anything is read or computed, what would otherwise fail only at the end.

    - ``--format``: when not given, the suffix of ``-o`` decides (``.csv``, ``.json``; else the
      table); a contradiction is refused. ``kwargs["fmt"]`` is replaced by the result.
    - ``-o`` and ``--plot``: each must be writable (:func:`topk_cli.output.check_output_path`),
      ``--plot`` must end in .png, .svg or .pdf, and the two must differ.
    - ``--hardness`` with ``--tau``: refused (the hardness sets each method's tau).

    Raises:
        InvalidArgumentError: any of the above.
    """
    output, plot = kwargs.get("output"), kwargs.get("plot")
    if "fmt" in kwargs:
        given = kwargs["fmt"].value if given_on_command_line("fmt") else None
        kwargs["fmt"] = OutputFormat(output_format(given, output))
    check_output_path(output, "-o")
    if plot is not None:
        check_output_path(plot, "--plot")
        plot_format(plot)
        if output is not None and str(output) != "-" and os.path.abspath(output) == os.path.abspath(plot):
            raise InvalidArgumentError(f"-o and --plot name the same file {plot}")
    if "tau" in kwargs and kwargs.get("hardness") is not None and given_on_command_line("tau"):
        raise InvalidArgumentError("give --tau or --hardness, not both (--hardness sets each method's tau)")


def method_options(*names: str, defaults: dict[str, str] | None = None) -> Callable[[F], F]:
    """Add to a command one option per method parameter (``--samples``, ``--max-iter``, ...).

    The options are generated from the methods' :class:`~topk_cli.catalog.ParamSpec` (one
    definition): ``names`` picks the parameters the command passes on (all when empty). The
    command receives the values given, as given, in ``method_params`` (a dict; a parameter not
    given is absent) and must validate them against its selected methods with
    :func:`~topk_cli.registry.check_method_params` before using them.
    ``defaults`` adds a note on a command's own default to an option's help.
    """
    import inspect

    specs: dict[str, list[tuple[str, Any]]] = {}
    for method, params in METHOD_PARAMETERS.items():
        for spec in params:
            if not names or spec.name in names:
                specs.setdefault(spec.name, []).append((method, spec))

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        extra = []
        for name, taken in specs.items():
            spec = taken[0][1]
            methods = ", ".join(method for method, _ in taken)
            default = (defaults or {}).get(name) or (
                _num(spec.default) if len(taken) == 1 else "; ".join(f"{m}: {_num(s.default)}" for m, s in taken)
            )
            help_text = f"{spec.help[0].upper()}{spec.help[1:]}: {spec.rule()} ({methods} only; default {default})."
            option = typer.Option(spec.option, metavar=name.upper().replace("_", "-"), help=help_text, show_default=False)
            extra.append(inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[Optional[spec.kind], option]
            ))
        kept = [p for p in signature.parameters.values() if p.name != "method_params"]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in specs}
            return func(*args, method_params={k: v for k, v in given.items() if v is not None}, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*kept, *extra])  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def stdout_is_terminal() -> bool:
    """Tables fit the terminal only when stdout is one."""
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def color_enabled(stream: object = None) -> bool:
    """Colour only on a terminal and when NO_COLOR is unset (https://no-color.org)."""
    target = stream if stream is not None else sys.stdout
    isatty = getattr(target, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def stderr_is_terminal() -> bool:
    """Progress bars go to stderr, and only when it is a terminal."""
    return sys.stderr.isatty()


def resolve_jobs(jobs: int | None) -> int:
    """``--jobs``: the given count (>= 1), or the cores this process may use."""
    from topk_cli.analysis.parallel import available_cores, check_jobs

    return available_cores() if jobs is None else check_jobs(jobs)


def resolve_methods(names: list[str] | None, *, default: list[str]) -> list[str]:
    """The method names of ``-m``, in the order given; ``all`` means every method (registry order).

    ``None`` or an empty list gives ``default``; duplicates are dropped; a comma-separated
    value (``-m grad,thre-exp``) is accepted too; an alias (``-m lapsum``) gives its method; a user's
    operator (``FILE.py:FUNCTION``, ``package.module:FUNCTION``) is loaded with the command's
    ``--framework`` and ``--dtype`` and keeps its name as written.

    Raises:
        UnknownMethodError: a name not in the registry (the message suggests the closest name
            and lists the valid ones).
        UserOperatorError: a user's operator that cannot be loaded (one line, ``FILE:LINE: ...``).
        InvalidArgumentError: ``--framework`` or ``--dtype`` given without a user's operator.
    """
    from topk_cli.cli_params import USER_OPTIONS
    from topk_cli.registry import METHODS, is_user_method, resolve

    framework, dtype = USER_OPTIONS.get()
    if any(not part.strip() for name in (names or []) for part in _split_methods(name)):
        raise UnknownMethodError(f"-m got an empty method name in {names!r}; name a method or 'all'")
    requested = [part.strip() for name in (names or []) for part in _split_methods(name) if part.strip()]
    if not requested:
        requested = list(default)
    out: list[str] = []
    for name in requested:
        try:
            if name == "all":
                chosen = list(METHODS)
            elif is_user_method(name):
                chosen = [resolve(name, framework=framework or "auto", dtype=dtype or "float64").name]
            else:
                chosen = [resolve(name).name]
        except UnknownMethodError as exc:
            raise UnknownMethodError(f"{exc}, or 'all' or your own operator as FILE.py:FUNCTION") from None
        out.extend(m for m in chosen if m not in out)
    if (framework is not None or dtype is not None) and not any(is_user_method(m) for m in out):
        raise InvalidArgumentError("--framework and --dtype apply to your own operator (-m FILE.py:FUNCTION); "
                                   "no selected method is one")
    return out


def check_k_one_aliases(names: list[str] | None, ks: Iterable[float] | None) -> None:
    """Refuse a name of ``-m`` that means its method at k = 1 only (``softmax``) unless every k the
    command runs (``ks``; None: several, or not known to be 1) is 1 (:func:`topk_cli.registry.check_alias_k`)."""
    from topk_cli.registry import check_alias_k

    for name in names or []:
        for part in _split_methods(name):
            check_alias_k(part.strip(), ks)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _ks_of(k_given: int | float | None, loaded: Sequence[LoadedInput]) -> list[float] | None:
    """The k a command runs: ``-k``, else every k of the ``--k-column`` of ``loaded`` (None: neither)."""
    if k_given is not None:
        return [float(k_given)]
    columns = [d.row_k.tolist() for d in loaded if d.row_k is not None]
    return [float(v) for ks in columns for v in ks] if columns else None


def _split_methods(value: str) -> list[str]:
    """``-m a,b`` as its parts; a user's operator keeps its commas when the whole value is one
    (``-m 'dir,1/ops.py:f'`` names a file)."""
    from topk_cli.registry import is_user_method

    return [value] if "," in value and is_user_method(value) and os.path.exists(value.rpartition(":")[0]) else value.split(",")


def read_vectors(
    inputs: list[str] | None,
    values: str | None,
    column: str | None = None,
    input_format: Enum | str | None = None,
    index_col: str | None = None,
    sep: str | None = None,
    decimal: str | None = None,
    orient: str | None = None,
    header: bool | None = None,
    k_column: str | None = None,
    axis: str = "rows",
) -> list[LoadedInput]:
    """Load the vectors of every INPUT, or of ``--values`` (exactly one of them), one per source.

    Every layout choice a reader inferred is announced on stderr (``softtopk: note: ...``).
    ``k_column`` (``--k-column``) gives each input's ``row_k``; ``axis="columns"`` (``--axis``)
    reads each column of the table as one vector (not with ``k_column``).

    Raises:
        InputError: both or neither of INPUT and ``--values``; unreadable or invalid input.
    """
    if inputs and values is not None:
        raise InputError("give either INPUT or --values, not both")
    if not inputs and values is None:
        raise InputError("no input: give a file (or '-' for stdin) or --values 3,2,1,4")
    if values is not None:  # a reading option beside --values would be ignored: say so instead
        given = [flag for flag, value in (
            ("--column", column), ("--input-format", input_format), ("--index-col", index_col), ("--sep", sep),
            ("--decimal", decimal), ("--orient", orient), ("--header/--no-header", header),
        ) if value is not None]
        if given:
            raise InputError(f"{', '.join(given)} read{'s' * (len(given) == 1)} INPUT files; --values takes none")
    from topk_cli.inputs import load_input

    if inputs and inputs.count("-") > 1:
        raise InputError("stdin ('-') can be read only once")
    fmt = input_format.value if isinstance(input_format, Enum) else input_format
    options = {
        "column": column, "input_format": fmt, "index_col": index_col, "sep": sep, "decimal": decimal,
        "orient": orient,
    }
    axis = check_axis(axis)
    if k_column is not None and axis == "columns":
        raise InvalidArgumentError(
            "--k-column gives one k per row, and with --axis columns each vector is a column: give one k with -k"
        )
    if not inputs:
        if k_column is not None:
            raise InputError("--k-column reads a column of an input file; --values has no columns")
        loaded = [load_input(None, values=values)]
    else:
        loaded = [load_input(path, header=header, k_column=k_column, **options) for path in inputs]
    if axis == "columns":
        from topk_cli.inputs import vectors_by_column

        loaded = [vectors_by_column(data) for data in loaded]
    for data in loaded:
        for note in data.notes:
            typer.echo(f"softtopk: note: {data.source}: {note}", err=True)
    return loaded


def check_axis(axis: str) -> str:
    """``--axis``: ``rows`` or ``columns`` (case-insensitive)."""
    value = axis.strip().lower()
    if value not in ("rows", "columns"):
        raise InvalidArgumentError(f"--axis must be rows or columns, got {axis!r}")
    return value


def k_number(k: float, option: str = "-k") -> int | float:
    """``-k`` as given: an ``int`` when it is integral (``-k 2`` prints as 2), else the real number."""
    value = float(k)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{option} must be a finite number, got {k!r}")
    if value.is_integer():
        return int(value)  # its range (1 <= k <= n) is checked with the input
    if value <= 0:
        raise InvalidArgumentError(f"{option} must satisfy 0 < k <= n for a real k, got {value:g}")
    return value


def all_requested(method: list[str] | None, *, default: list[str]) -> bool:
    """Whether ``-m`` asked for every method (``-m all``, or no ``-m`` where the default is all)."""
    parts = [part.strip() for name in (method or []) for part in name.split(",") if part.strip()]
    return "all" in (parts or default)


def methods_for_k(names: list[str], non_integer: str | None, *, asked_all: bool) -> list[str]:
    """The methods of ``names`` that can run at the k given.

    ``non_integer`` says which k is not an integer (``"-k 2.5"``), None when every k is an
    integer (then every method runs). A method defined only for an integer k is refused with a
    usage error that names the methods that accept a real k; under ``-m all`` (``asked_all``)
    such methods are skipped instead, and named on stderr, unless none would be left.
    """
    if non_integer is None:
        return names
    from topk_cli.registry import METHODS, resolve

    integer_only = [name for name in names if resolve(name).capabilities.integer_k]
    if not integer_only:
        return names
    takers = [name for name, spec in METHODS.items() if not spec.capabilities.integer_k]
    kept = [name for name in names if name not in integer_only]
    if asked_all and kept:
        typer.echo(f"softtopk: note: {non_integer} is not an integer: skipped {', '.join(integer_only)} "
                   "(defined for an integer k only)", err=True)
        return kept
    verb = "takes" if len(integer_only) == 1 else "take"
    raise usage_error(
        f"{non_integer} is not an integer, and {', '.join(integer_only)} {verb} an integer k only; "
        f"methods that accept a real k: {', '.join(takers) if takers else 'none'}"
    )


def non_integer_k(k: int | float | None, loaded: Sequence[LoadedInput] = ()) -> str | None:
    """How to name the first k that is not an integer (``-k 2.5`` or a cell of ``--k-column``), or None."""
    if k is not None:
        return None if float(k).is_integer() else f"-k {float(k)!r}"
    import numpy as np

    for data in loaded:
        if data.row_k is None:
            continue
        frac = data.row_k != np.floor(data.row_k)
        if frac.any():
            r = int(np.argmax(frac))
            return f"k = {float(data.row_k[r])!r} (--k-column {data.k_column!r}, {data.source} row {r}, 0-based)"
    return None


def _non_integer_number(text: str) -> bool:
    """``text`` is a finite number that is not an integer (``2.5``); anything else is checked later."""
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0 and not value.is_integer()


def one_k(k: float | None, k_column: str | None, *, required: bool = True) -> int | float | None:
    """``-k`` or ``--k-column``, exactly one of them (``-k`` as :func:`k_number`)."""
    if k is not None and k_column is not None:
        raise usage_error("give -k K or --k-column NAME, not both")
    if k is None and k_column is None and required:
        raise usage_error("Missing option '-k' (or --k-column NAME: a k per row from a column of INPUT)")
    return None if k is None else k_number(k)


def one_input(loaded: list[LoadedInput], command: str) -> LoadedInput:
    """The single source of a command that reads one vector or batch."""
    if len(loaded) > 1:
        raise InputError(f"{command} reads one INPUT, got {len(loaded)}: {', '.join(d.source for d in loaded)}")
    return loaded[0]


# ---- commands --------------------------------------------------------------------------------
# COMMANDS-BEGIN (each helper edits only its own command below)


@app.command(
    short_help="List the methods and what each claims.",
    epilog="\b\nExamples:\n  softtopk methods\n  softtopk methods --format json",
)
@boundary
def methods(fmt: FormatOpt = OutputFormat.table, output: OutputOpt = None) -> None:
    """List every method: summary, family, smoothness, claimed guarantees, reference."""
    from topk_cli.render.compute import render_methods

    write_text(render_methods(fmt, color=color_enabled() and output is None), output)


@app.command(
    short_help="Soft top-k weights of a vector or a batch, per method.",
    epilog=(
        "\b\nExamples:\n"
        "  softtopk compute -m thre-sigmoid -m grad -k 2 sample_inputs/scores.csv\n"
        "  softtopk compute -m all -k 2 --values 3,2,1,4\n"
        "  softtopk compute -k 2 --format json -o weights.json sample_inputs/router_logits.csv\n"
        "  cat sample_inputs/scores.json | softtopk compute -k 3 --format csv -\n"
        "  softtopk compute -m thre-sigmoid -k 2.5 sample_inputs/scores.csv\n"
        "  softtopk compute -m thre-sigmoid --k-column capacity sample_inputs/router_capacity.csv\n"
        "  softtopk compute -m thre-laplace -k 2 --axis columns sample_inputs/router_logits.csv"
    ),
)
@boundary
@user_operator_options()
@method_options()
def compute(
    k: KOpt = None,
    input: InputArg = None,
    method: MethodOpt = None,
    tau: TauOpt = 1.0,
    values: ValuesOpt = None,
    column: ColumnOpt = None,
    input_format: InputFormatOpt = None,
    index_col: IndexColOpt = None,
    sep: SepOpt = None,
    decimal: DecimalOpt = None,
    orient: OrientOpt = None,
    header: HeaderOpt = None,
    k_column: KColumnOpt = None,
    axis: AxisOpt = "rows",
    with_jacobian: Annotated[
        bool, typer.Option("--jacobian", help="Add d p / d x per row (JSON; table for n <= 8).")
    ] = False,
    with_sum: Annotated[
        bool,
        typer.Option(
            "--sum",
            help="Add the soft top-k sum per row and method: sum_i p_i x_i, and the potential whose "
            "gradient is p where the method has one.",
        ),
    ] = False,
    hardness: HardnessOpt = None,
    fmt: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
    method_params: Optional[dict[str, Any]] = None,
) -> None:
    """Soft top-k weights of every vector in INPUT, one column per method (default thre-laplace).

    Exit code 1 when a method failed numerically on some row (e.g. grad-recursive); the other
    rows and methods are still printed, and stderr names the failed rows. Method parameters
    (--samples, --seed, --max-iter, --tol, --noise, --iterations) go to the selected methods that
    take them ('softtopk methods' lists each method's parameters); naming one that no selected
    method takes is an error.
    """
    from topk_cli.api import DEFAULT_METHOD
    from topk_cli.comparison import build_compute_report
    from topk_cli.render.compute import compute_failure_summary, compute_warnings, render_compute_many

    k_given = one_k(k, k_column)
    asked_all = all_requested(method, default=[DEFAULT_METHOD])
    names = methods_for_k(resolve_methods(method, default=[DEFAULT_METHOD]), non_integer_k(k_given), asked_all=asked_all)
    loaded = read_vectors(input, values, column, input_format, index_col, sep, decimal, orient, header,
                          k_column=k_column, axis=axis)
    check_k_one_aliases(method, _ks_of(k_given, loaded))
    if k_given is None:  # --k-column: its values decide which methods can run
        names = methods_for_k(names, non_integer_k(None, loaded), asked_all=asked_all)
    from topk_cli.registry import check_method_params

    params = check_method_params(names, method_params or {})
    reports = [
        build_compute_report(
            d, k=k_given if k_given is not None else cast(Any, d.row_k), methods=names, tau=tau, with_jacobian=with_jacobian,
            with_sum=with_sum, params=params, hardness=hardness,
        )
        for d in loaded
    ]
    rendered = render_compute_many(reports, fmt, color=color_enabled() and output is None)
    write_text(rendered.text, output)
    if hardness is not None and fmt is not OutputFormat.table:
        from topk_cli.render.compute import hardness_lines

        for report in reports:
            prefix = f"{report.data.source}: " if len(reports) > 1 else ""
            for line in hardness_lines(report):
                typer.echo(f"softtopk: note: {prefix}{line}", err=True)
    for note in rendered.notes:
        typer.echo(f"softtopk: note: {note}", err=True)
    for report in reports:
        prefix = f"{report.data.source}: " if len(reports) > 1 else ""
        for warning in compute_warnings(report):
            typer.echo(f"softtopk: warning: {prefix}{warning}", err=True)
    if any(report.failed for report in reports):
        typer.echo(f"softtopk: {compute_failure_summary(reports)}", err=True)
        raise typer.Exit(code=1)


@app.command(
    "verify-properties",
    epilog=(
        "\b\nExamples:\n"
        "  softtopk verify-properties\n"
        "  softtopk verify-properties -m thre-laplace -m grad --trials 5 --seed 1 --strict\n"
        "  softtopk verify-properties -k 2 --format json sample_inputs/scores.csv"
    ),
)
@boundary
@user_operator_options(options=False)
def verify_properties_command(
    input: InputArg = None,
    method: MethodOpt = None,
    k: Annotated[
        Optional[float],
        typer.Option("-k", help="Fixed k, an integer or a real one (e.g. 2.5) for the methods that take it "
                     "(default: vary k = 1, 2, n/3, n-1, n).", show_default=False),
    ] = None,
    tau: TauOpt = 1.0,
    values: ValuesOpt = None,
    column: ColumnOpt = None,
    input_format: InputFormatOpt = None,
    index_col: IndexColOpt = None,
    sep: SepOpt = None,
    decimal: DecimalOpt = None,
    orient: OrientOpt = None,
    header: HeaderOpt = None,
    trials: Annotated[int, typer.Option("--trials", help="Size of the default suite (random vectors per size).")] = 3,
    seed: SeedOpt = 0,
    fmt: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when a property a method claims fails.")] = False,
    jobs: JobsOpt = None,
    reference: Annotated[
        Optional[str],
        typer.Option("--reference", metavar="METHOD", show_default=False,
                     help="Compare each user's operator (-m FILE.py:FUNCTION) with this method: p and VJP over the "
                          "suite (matches-reference, vjp-matches-reference, same-topk-set), and hold it to the "
                          "method's claims."),
    ] = None,
    framework: Annotated[
        Optional[str],
        typer.Option("--framework", metavar="auto|numpy|torch|jax", show_default=False,
                     help="The framework your own operator (-m FILE.py:FUNCTION) is written in (default: auto, from "
                          "what its module imports)."),
    ] = None,
    dtype: Annotated[
        str,
        typer.Option("--dtype", metavar="DTYPE",
                     help="The dtype a user's operator receives its scores in: float64, float32, bfloat16, float16 "
                          "(the reference computes in float64 on the same rounded scores)."),
    ] = "float64",
    reference_tol: Annotated[
        Optional[float],
        typer.Option("--reference-tol", metavar="TOL", show_default=False,
                     help="Largest |p - p_ref| of matches-reference (default by dtype: float64 1e-9, float32 2e-4, "
                          "bfloat16 2e-2, float16 2.5e-3)."),
    ] = None,
    vjp_tol: Annotated[
        Optional[float],
        typer.Option("--vjp-tol", metavar="TOL", show_default=False,
                     help="Largest VJP error, relative to the reference VJP's max-norm, of vjp-matches-reference "
                          "(default by dtype: float64 1e-8, float32 2e-2, bfloat16 1e-1, float16 2e-2)."),
    ] = None,
) -> None:
    """Measure range, sum, monotonicity, invariances, limits, smoothness, Jacobian and finiteness.

    Without INPUT or --values: a deterministic adversarial suite (--seed, --trials). Verdicts are
    measured; the registry's claims are only compared (disagreements are marked).
    """

    import numpy as np

    from topk_cli.api import check_k, check_real_k, check_tau
    from topk_cli.cli_params import USER_OPTIONS, check_user_options
    from topk_cli.errors import InvalidArgumentError
    from topk_cli.properties import verify_properties
    from topk_cli.registry import lookup
    from topk_cli.render.common import ProgressReporter
    from topk_cli.render.properties import render_properties, strict_properties_summary

    if trials < 1:
        raise InvalidArgumentError(f"--trials must be >= 1, got {trials}")
    check_tau(tau, name="--tau")
    k_given = None if k is None else k_number(k)
    check_user_options(framework, None)
    token = USER_OPTIONS.set((framework, None))  # the suite runs users' operators in float64; --dtype: their own rows
    try:
        names = methods_for_k(resolve_methods(method, default=["all"]), non_integer_k(k_given),
                              asked_all=all_requested(method, default=["all"]))
    finally:
        USER_OPTIONS.reset(token)
    check_k_one_aliases(method, None if k_given is None else [k_given])  # no -k: the suite runs every k
    if k_given is not None:
        if isinstance(k_given, float):
            check_real_k(k_given, name="-k")
        else:
            check_k(k_given, name="-k")
    vectors = None
    if input is not None or values is not None:
        loaded = read_vectors(input, values, column, input_format, index_col, sep, decimal, orient, header)
        widths = {d.values.shape[1] for d in loaded}
        if len(widths) > 1:
            raise InvalidArgumentError(f"the inputs hold vectors of different lengths {sorted(widths)}; check them one by one")
        vectors = np.concatenate([d.values for d in loaded])
    with ProgressReporter("verify-properties", enabled=stderr_is_terminal()) as progress:
        report = verify_properties(
            names, vectors, cast(Any, k_given), tau=tau, trials=trials, seed=seed, progress=progress, jobs=resolve_jobs(jobs),
            reference=None if reference is None else lookup(reference).name, dtype=dtype,
            reference_tol=reference_tol, vjp_tol=vjp_tol,
        )
    write_text(render_properties(report, fmt, color=color_enabled() and output is None, k=k_given), output)
    if strict and report.claim_failures:
        users = {r.method for r in report.results if r.dtype is not None}  # users' operators have rows with a dtype
        for r in report.claim_failures:
            held = f" (held to {report.reference}'s claims)" if report.reference and r.dtype is None and r.method in users else ""
            typer.echo(f"softtopk: {r.method} claims {r.property}{held} but it fails: {r.detail}", err=True)
        typer.echo(f"softtopk: {strict_properties_summary(report)}", err=True)
        raise typer.Exit(code=1)


@app.command(
    "temperature-sweep",
    epilog=(
        "\b\nExamples:\n"
        "  softtopk temperature-sweep -k 2\n"
        "  softtopk temperature-sweep -k 2 -m all --taus 1e-3:1e3:13 --match 0.9 sample_inputs/scores.csv\n"
        "  softtopk temperature-sweep -k 2 --values 3,2,1,0 --taus 0.01,0.1,1 --format json --plot sweep.png\n"
        "  softtopk temperature-sweep -k 2.5 -m thre-sigmoid,thre-laplace --values 3,2,1,0\n"
        "  softtopk temperature-sweep -m thre-laplace --k-column capacity sample_inputs/router_capacity.csv"
    ),
)
@boundary
@user_operator_options()
def temperature_sweep_command(
    k: KOpt = None,
    input: InputArg = None,
    method: MethodOpt = None,
    values: ValuesOpt = None,
    column: ColumnOpt = None,
    input_format: InputFormatOpt = None,
    index_col: IndexColOpt = None,
    sep: SepOpt = None,
    decimal: DecimalOpt = None,
    orient: OrientOpt = None,
    header: HeaderOpt = None,
    k_column: KColumnOpt = None,
    row: Annotated[
        Optional[int],
        typer.Option("--row", help="Sweep only this row of a batch (0-based); default: every row, aggregated.", show_default=False),
    ] = None,
    taus: Annotated[
        str, typer.Option("--taus", help="START:STOP:COUNT (log-spaced, endpoints included) or a list a,b,c.")
    ] = "1e-3:1e3:13",
    match: Annotated[
        Optional[float],
        typer.Option("--match", help="Also find, per method, the tau reaching this top-k mass (e.g. 0.9).", show_default=False),
    ] = None,
    plot: PlotOpt = None,
    hardness: HardnessOpt = None,
    fmt: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
) -> None:
    """Distance to hard top-k, top-k mass, entropy and gradient signal of each method across tau.

    Also the limits tau -> 0 (hard top-k or not, and the vector reached) and tau -> infinity.
    Without INPUT or --values the vector 3,2,1.5,1,0,-1 is swept. A batch is swept as a whole (the
    mean over rows of each measurement, as --hardness defines hardness) unless --row picks one row.
    """
    import dataclasses

    from topk_cli.analysis.sweep import DEFAULT_SWEEP_VECTOR, parse_taus, temperature_sweep
    from topk_cli.errors import InvalidArgumentError
    from topk_cli.render.common import ProgressReporter
    from topk_cli.render.sweep import render_plot_png, render_sweep

    k_given = one_k(k, k_column)
    asked_all = all_requested(method, default=["all"])
    names = methods_for_k(resolve_methods(method, default=["all"]), non_integer_k(k_given), asked_all=asked_all)
    if k_given is not None:
        check_k_one_aliases(method, [k_given])
    sweep_k: Any = k_given
    grid = parse_taus(taus)
    if input is None and values is None:
        if k_column is not None:
            raise InputError("--k-column reads a column of INPUT; the default vector has none")
        if row is not None and row != 0:
            raise InvalidArgumentError(f"--row selects a row of INPUT or --values; the default vector has only row 0, got {row}")
        x = list(DEFAULT_SWEEP_VECTOR)
    else:
        loaded = read_vectors(input, values, column, input_format, index_col, sep, decimal, orient, header,
                              k_column=k_column)
        data = one_input(loaded, "temperature-sweep")
        if data.row_k is not None:  # --k-column: each row's own k (one row's under --row)
            ks = data.row_k if row is None or not 0 <= row < data.row_k.size else data.row_k[row : row + 1]
            check_k_one_aliases(method, ks.tolist())
            names = methods_for_k(names, non_integer_k(None, [dataclasses.replace(data, row_k=ks)]), asked_all=asked_all)
            sweep_k = ks if row is None else float(ks[0])
        rows = data.values.shape[0]
        if row is None:
            x = data.values.tolist() if rows > 1 else data.values[0].tolist()
            if rows > 1:
                typer.echo(
                    f"softtopk: note: sweeping all {rows} rows of {data.source}: each measurement is the mean "
                    "over rows (max entry err: the max); --row N sweeps one row",
                    err=True,
                )
        elif not 0 <= row < rows:
            raise InvalidArgumentError(f"--row must satisfy 0 <= row < {rows} (rows in {data.source}), got {row}")
        else:
            x = data.values[row].tolist()
    with ProgressReporter("temperature-sweep", enabled=stderr_is_terminal()) as progress:
        result = temperature_sweep(x, sweep_k, methods=names, taus=grid, match=match, hardness=hardness, progress=progress)
    png = render_plot_png(result, plot_format(plot)) if plot is not None else None
    write_text(render_sweep(result, fmt, color=color_enabled() and output is None), output)
    if png is not None and plot is not None:
        write_bytes(png, plot)
        typer.echo(f"softtopk: note: plot written to {plot}", err=True)


@app.command(
    "stability-probe",
    epilog=(
        "\b\nExamples:\n"
        "  softtopk stability-probe\n"
        "  softtopk stability-probe -m grad-recursive -n 100 -k 2,10,0.5n --scales 0.1:100:7 --trials 50\n"
        "  softtopk stability-probe -m all --dist student-t --offset 1e6 --format json --strict\n"
        "  softtopk stability-probe -m thre-sigmoid -n 10,100 -k 1.5,2.5 --trials 5"
    ),
)
@boundary
@user_operator_options()
def stability_probe_command(
    method: MethodOpt = None,
    n: Annotated[str, typer.Option("-n", help="Vector lengths, comma-separated.")] = "10,100,1000",
    k: Annotated[
        str,
        typer.Option("-k", help="k values, comma-separated; '0.1n' is a fraction of n; k > n is skipped; a real "
                     "k (2.5) runs the methods that take one (by default the others are skipped, named on stderr)."),
    ] = "1,2,5,10,50",
    scales: Annotated[
        str, typer.Option("--scales", help="Spreads (std of x): LO:HI:COUNT log-spaced, ends included, or a,b,c.")
    ] = "0.1:1e4:13",
    dist: Annotated[str, typer.Option("--dist", help="Draw distribution: normal, uniform, laplace or student-t (3 dof).")] = "normal",
    offset: Annotated[float, typer.Option("--offset", help="Added to every score: x = offset + scale * draw.")] = 0.0,
    trials: Annotated[int, typer.Option("--trials", help="Random vectors per cell.")] = 20,
    seed: SeedOpt = 0,
    tau: TauOpt = 1.0,
    tolerance: Annotated[
        float, typer.Option("--tolerance", help="Errors above this count as failures (range, sum/k, order, vs reference).")
    ] = 1e-9,
    strict: StrictOpt = False,
    fmt: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
    jobs: JobsOpt = None,
) -> None:
    """Map where each operator fails numerically over a grid of n, k and input spread.

    Per method and cell: failed trials by kind, error against an accurate reference; for
    grad-recursive the failing recursion level and the predicted boundary. Default methods:
    every smooth one (not hard). --strict exits 1 on any failure of a selected method.
    """
    from topk_cli.analysis.probe import DEFAULT_METHODS, parse_scales, stability_probe
    from topk_cli.errors import InvalidArgumentError
    from topk_cli.render.common import ProgressReporter
    from topk_cli.render.probe import render_probe, strict_probe_summary

    try:
        ns = [int(part) for part in n.split(",") if part.strip()]
    except ValueError:
        raise InvalidArgumentError(f"-n must be positive integers separated by commas, got {n!r}") from None
    ks = [part.strip() for part in k.split(",") if part.strip()]
    names = resolve_methods(method, default=list(DEFAULT_METHODS))
    check_k_one_aliases(method, [float(part) for part in ks] if all(_is_number(part) for part in ks) else None)
    real = next((part for part in ks if not part.lower().endswith("n") and _non_integer_number(part)), None)
    names = methods_for_k(names, None if real is None else f"-k {real}", asked_all=all_requested(method, default=["all"]))
    with ProgressReporter("stability-probe", enabled=stderr_is_terminal()) as progress:
        report = stability_probe(
            methods=names, ns=ns, ks=ks, scales=parse_scales(scales), dist=dist, offset=offset,
            trials=trials, seed=seed, tau=tau, tolerance=tolerance, progress=progress, jobs=resolve_jobs(jobs),
        )
    write_text(render_probe(report, fmt, color=color_enabled() and output is None), output)
    if strict and report.failed:
        typer.echo(f"softtopk: {strict_probe_summary(report)}", err=True)
        raise typer.Exit(code=1)


@app.command(
    "train-probe",
    epilog=(
        "\b\nExamples:\n"
        "  softtopk train-probe --quick\n"
        "  softtopk train-probe --plot train_probe.png\n"
        "  softtopk train-probe --task all --steps 150 --seeds 5 --hardness 0.6,0.8,0.95\n"
        "  softtopk train-probe -m thre-laplace --taus 0.1 --no-grad-check --strict"
    ),
)
@boundary
@user_operator_options()
@method_options("samples", defaults={"samples": "32 here, fresh noise every step"})
def train_probe_command(
    method: MethodOpt = None,
    task: Annotated[
        Optional[list[str]],
        typer.Option("--task", help="select, topk-sum, knn (repeatable or comma-separated), or 'all'. Default: select,knn.", show_default=False),
    ] = None,
    hardness: Annotated[
        Optional[str],
        typer.Option("--hardness", help="Top-k masses to train at, tau calibrated per method and task (e.g. 0.8 or 0.6,0.8). Default 0.8.", show_default=False),
    ] = None,
    taus: Annotated[
        Optional[str], typer.Option("--taus", help="Fixed taus instead of (or with --hardness, as well as) calibrated ones: a,b,c or START:STOP:COUNT.", show_default=False)
    ] = None,
    n: Annotated[Optional[int], typer.Option("-n", help="Items per instance for every task (default 20).", show_default=False)] = None,
    k: Annotated[
        Optional[int], typer.Option("-k", help="Selection size for every task (default: select 3, knn 5, topk-sum 3).", show_default=False)
    ] = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", help="Paired seeds (default 3; 2 with --quick).", show_default=False)] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimiser steps (default 100; 30 with --quick).", show_default=False)] = None,
    batch: Annotated[int, typer.Option("--batch", help="Minibatch size.")] = 32,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adam or sgd.")] = "adam",
    lr: Annotated[Optional[float], typer.Option("--lr", help="Learning rate (default 0.05 for Adam, 1.0 for SGD).", show_default=False)] = None,
    scale: Annotated[
        str, typer.Option("--scale", help="fixed: row z-scores, unit-norm parameters; free: raw scores (a stress test).")
    ] = "fixed",
    straight_through: Annotated[
        bool, typer.Option("--straight-through", help="Hard top-k forward, the operator's gradient backward.")
    ] = False,
    grad_check: Annotated[
        Optional[bool],
        typer.Option("--grad-check/--no-grad-check", help="Cosine to the true gradient (default on; off with --quick).", show_default=False),
    ] = None,
    grad_check_hardness: Annotated[
        str, typer.Option("--grad-check-hardness", help="Top-k masses at which the gradient is checked.")
    ] = "0.6,0.8,0.95",
    target: Annotated[float, typer.Option("--target", help="'Reached' = metric >= target x the oracle's.")] = 0.9,
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run: select only, 30 steps, 2 seeds, no gradient check.")] = False,
    seed: SeedOpt = 0,
    plot: PlotOpt = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 when a selected method fails, is anti-aligned, unreachable or refuses > 1% of rows.")
    ] = False,
    fmt: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
    method_params: Optional[dict[str, Any]] = None,
) -> None:
    """Which operator to train through: train every method at equal hardness on tasks with a known answer.

    Per task and method: tau calibrated to the target top-k mass, learning curves of the hard
    metric on held-out data over paired seeds, the gradient's cosine to the true gradient, dead
    and refused rows, and a verdict (tied / worse / fails / anti-aligned / unreachable / baseline).
    """
    from topk_cli.analysis.sweep import parse_taus
    from topk_cli.analysis.train_probe import parse_hardness, probe_config, train_probe
    from topk_cli.registry import check_method_params
    from topk_cli.render.common import ProgressReporter
    from topk_cli.render.train_probe import render_train_probe, render_train_probe_png

    names = resolve_methods(method, default=["all"])
    check_k_one_aliases(method, None if k is None else [k])  # no -k: the tasks' own k
    params = check_method_params(names, method_params or {})
    config = probe_config(
        tasks=task, methods=names, hardness=hardness,
        taus=parse_taus(taus) if taus else (), seeds=seeds, steps=steps, quick=quick, grad_check=grad_check,
        batch=batch, optimizer=optimizer, lr=lr, straight_through=straight_through,
        grad_check_hardness=parse_hardness(grad_check_hardness), target=target, seed=seed, n=n, k=k, scale=scale,
        **({"mc_samples": params["samples"]} if "samples" in params else {}),
    )
    with ProgressReporter("train-probe", enabled=stderr_is_terminal()) as progress:
        result = train_probe(config, progress=progress)
    png = render_train_probe_png(result, plot_format(plot)) if plot is not None else None
    write_text(render_train_probe(result, fmt, color=color_enabled() and output is None), output)
    if png is not None and plot is not None:
        write_bytes(png, plot)
        typer.echo(f"softtopk: note: plot written to {plot}", err=True)
    for warning in result.warnings:
        typer.echo(f"softtopk: warning: {warning}", err=True)
    if strict and result.failed:
        for line in result.failures:
            typer.echo(f"softtopk: {line}", err=True)
        raise typer.Exit(code=1)


@app.command(
    "bench",
    epilog=(
        "\b\nExamples:\n"
        "  softtopk bench -B 1024 -n 64 -k 2\n"
        "  softtopk bench -B 1000 -n 1000 -k 10 -m thre-laplace -m grad --dtype float32 --format json\n"
        "  softtopk bench -k 2 -m all sample_inputs/router_logits.csv\n"
        "  softtopk bench -m thre-sigmoid --k-column capacity sample_inputs/router_capacity.csv"
    ),
)
@boundary
@user_operator_options(options=False)
def bench_command(
    k: KOpt = None,
    input: InputArg = None,
    batch: Annotated[int, typer.Option("-B", "--batch", help="Rows of random normal scores (without INPUT).")] = 1000,
    n: Annotated[int, typer.Option("-n", help="Length of each random vector (without INPUT).")] = 1000,
    method: MethodOpt = None,
    tau: TauOpt = 1.0,
    values: ValuesOpt = None,
    column: ColumnOpt = None,
    input_format: InputFormatOpt = None,
    index_col: IndexColOpt = None,
    sep: SepOpt = None,
    decimal: DecimalOpt = None,
    orient: OrientOpt = None,
    header: HeaderOpt = None,
    k_column: KColumnOpt = None,
    axis: AxisOpt = "rows",
    dtype: Annotated[str, typer.Option("--dtype", help="float32 or float64: the dtype timed.")] = "float64",
    repeats: Annotated[int, typer.Option("--repeats", help="Repeats per measurement (the median is shown).")] = 5,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", help="Measure peak memory (tracemalloc).")] = True,
    seed: SeedOpt = 0,
    fmt: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
    dropin_framework: Annotated[str, typer.Option(  # not "framework": the users'-operator options use that name
        "--framework", help="numpy: the numpy engine (default). torch or jax: the drop-in operators "
        "(topk_cli.torch, topk_cli.jax) forward and forward+backward, beside that framework's topk and "
        "softmax and the numpy engine.")] = "numpy",
) -> None:
    """Time forward and VJP of each method on your shape, as ratios to np.exp and np.sort.

    Scores are random normal (-B x -n, --seed) or the vectors of INPUT / --values. Also shows
    milliseconds and the peak extra memory of one call (tracemalloc). Default: every method.
    """
    from topk_cli.analysis.bench import bench, check_dtype, random_scores
    from topk_cli.render.bench import render_bench
    from topk_cli.render.common import ProgressReporter

    k_given = one_k(k, k_column)
    asked_all = all_requested(method, default=["all"])
    names = methods_for_k(resolve_methods(method, default=["all"]), non_integer_k(k_given), asked_all=asked_all)
    if k_given is not None:
        check_k_one_aliases(method, [k_given])
    bench_k: Any = k_given
    if input is None and values is None:
        if k_column is not None:
            raise InputError("--k-column reads a column of INPUT; the random scores (-B, -n) have none")
        if check_axis(axis) != "rows":
            raise InvalidArgumentError("--axis columns reads the columns of INPUT; give an INPUT file")
        x = random_scores(batch, n, seed=seed, dtype=dtype)
        source = f"random normal scores (seed {seed})"
    else:
        loaded = read_vectors(input, values, column, input_format, index_col, sep, decimal, orient, header,
                              k_column=k_column, axis=axis)
        data = one_input(loaded, "bench")
        if k_given is None:
            from topk_cli.comparison import uniform_k

            names = methods_for_k(names, non_integer_k(None, loaded), asked_all=asked_all)
            check_k_one_aliases(method, _ks_of(None, loaded))
            bench_k = uniform_k(data.row_k) if data.row_k is not None else None
        x = data.values.astype(check_dtype(dtype))
        source = data.source
    if dropin_framework != "numpy":
        _bench_dropins(x, bench_k, method, dropin_framework, tau=tau, repeats=repeats, seed=seed, source=source, fmt=fmt,
                       output=output)
        return
    with ProgressReporter("bench", enabled=stderr_is_terminal()) as progress:
        report = bench(x, bench_k, names, tau=tau, repeats=repeats, memory=memory, seed=seed, source=source,
                       progress=progress)
    write_text(render_bench(report, fmt, color=color_enabled() and output is None), output)


def _bench_dropins(x: Any, k: Any, method: list[str] | None, framework: str, *, tau: float, repeats: int,
                   seed: int, source: str, fmt: OutputFormat, output: Path | None) -> None:
    """``bench --framework torch|jax``: the drop-in operators (default: all of them) in that framework."""
    from topk_cli.frameworks.dropin_bench import bench_dropins, check_framework
    from topk_cli.frameworks.dropin_common import dropin_methods
    from topk_cli.render.common import ProgressReporter
    from topk_cli.render.dropin_bench import render_dropin_bench

    check_framework(framework)
    asked = [m for item in (method or ["all"]) for m in item.split(",") if m]
    names = list(dropin_methods()) if asked == ["all"] else asked
    with ProgressReporter("bench", enabled=stderr_is_terminal()) as progress:
        report = bench_dropins(x, 10 if k is None else k, names, framework=framework, tau=tau, repeats=repeats,
                               seed=seed, source=source, progress=progress)
    write_text(render_dropin_bench(report, fmt, color=color_enabled() and output is None), output)


@app.command(
    "inspect",
    short_help="Show how a file is read: shape, layout decisions, notes, first rows.",
    epilog=(
        "\b\nExamples:\n"
        "  softtopk inspect sample_inputs/router_logits.csv\n"
        "  softtopk inspect --format json logits.json\n"
        "  softtopk inspect --orient rows --rows 3 logits.json"
    ),
)
@boundary
def inspect_command(
    input: Annotated[str, typer.Argument(metavar="INPUT", help="The file to inspect, or '-' for stdin.", show_default=False)],
    column: ColumnOpt = None,
    input_format: InputFormatOpt = None,
    index_col: IndexColOpt = None,
    sep: SepOpt = None,
    decimal: DecimalOpt = None,
    orient: OrientOpt = None,
    header: HeaderOpt = None,
    rows: Annotated[int, typer.Option("--rows", help="How many vectors to show (the first ones; 0: none).")] = 5,
    fmt: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
) -> None:
    """Show what the other commands would read from INPUT, without computing anything.

    The format, the shape, the separator and header decisions, the row-name and label columns,
    the ignored columns, every note the reader announces, and the first vectors as read (entries
    rounded in the table; exact in --format json). Same reading options as every command.
    """
    from topk_cli.errors import InvalidArgumentError
    from topk_cli.inputs import load_input
    from topk_cli.render.inspect import render_inspect

    if rows < 0:
        raise InvalidArgumentError(f"--rows must be >= 0, got {rows}")
    fmt_in = input_format.value if isinstance(input_format, Enum) else input_format
    data = load_input(input, column=column, input_format=fmt_in, index_col=index_col, sep=sep,
                      decimal=decimal, orient=orient, header=header)
    write_text(render_inspect(data, fmt, rows=rows, color=color_enabled() and output is None), output)


# COMMANDS-END



def _restore_interrupts() -> None:
    """Ctrl-C is KeyboardInterrupt again (handled by :func:`main` and the command group)."""
    global _HANDLER_BEFORE_LOADING
    if _HANDLER_BEFORE_LOADING is not None:
        _signal.signal(_signal.SIGINT, _HANDLER_BEFORE_LOADING)
        _HANDLER_BEFORE_LOADING = None


# Loaded. The console script still runs a few lines of its own before calling main(), which
# restores the handler; in any other process (a test, a library import) it is restored now.
if Path(sys.argv[0] if sys.argv else "").stem != "softtopk":
    _restore_interrupts()


def main() -> None:
    """Entry point of the console script (``softtopk`` and ``python -m topk_cli``).

    Ctrl-C at any moment, building the command group included, ends in ``softtopk:
    interrupted`` and exit 130 (the imports of this module are covered at its top). Once the
    command has finished, Ctrl-C is ignored: the result is written and its exit code stands
    (otherwise Python's teardown would end killed by SIGINT).
    """
    try:
        _restore_interrupts()

        def terminate(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)  # unwinds: temporary files are removed, then exit 143

        signal.signal(signal.SIGTERM, terminate)
        app(prog_name="softtopk")
    except KeyboardInterrupt:
        try:
            sys.stderr.write("softtopk: interrupted\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.exit(130)
    finally:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass
