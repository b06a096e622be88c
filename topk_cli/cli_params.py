"""Argument coercion of the command line without importing pydantic for the common values.

Typer (0.2x) converts every argument through a pydantic ``TypeAdapter``, built on first use;
importing pydantic alone costs about as much as importing numpy, so a short command
(``softtopk compute -k 2 file.csv``) would spend a quarter of its run time on it. The values
softtopk's options take are plain: an int, a float, a string, a path, a list of strings, a
choice. :func:`install` gives each parameter of the command group a coercion that converts
those values directly, exactly as the pydantic adapter does, and hands every other value (and
every value it is not sure of, e.g. ``-k 2.0`` or ``--tau 1_000``) to the adapter itself, so
results are Typer's own. A value that neither converts is refused in the tool's own words
(``-k must be an integer, got 'abc'``), never pydantic's. When Typer's internals are not the
expected ones (another version), nothing is installed and Typer's coercion runs unchanged.

:func:`install_group` also gives every option that takes a value a metavar when it has none
(its name in capitals, e.g. ``--trials TRIALS``), so help never shows a Python type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")

_INT64 = 2**63

#: What :meth:`_Fast.fast` returns when the value is left to Typer's own (pydantic) coercion.
_DEFER = object()


def _simple(info: Any) -> bool:
    """No constraint, parser or click type that the pydantic adapter would apply."""
    return (
        info.min is None and info.max is None and not info.clamp and info.parser is None
        and getattr(info, "click_type", None) is None
    )


def _kind(annotation: Any, info: Any) -> str | None:
    """The kind of value handled directly, or None (Typer's own coercion for this parameter)."""
    if not _simple(info):
        return None
    if get_origin(annotation) is list:
        args = get_args(annotation)
        return "list-str" if args == (str,) else None
    if annotation is bool or annotation is int or annotation is float or annotation is str:
        return annotation.__name__
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "choice"
    if annotation is Path and info.path_type is None:
        return "path"
    return None


def _option_name(param: Any) -> str:
    opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    return max(opts, key=len) if opts else str(getattr(param, "name", "the value")).upper()


def _refusal(param: Any, value: Any, annotation: Any) -> str:
    """The tool's message for a value the coercion refused (instead of pydantic's wording)."""
    name = _option_name(param)
    shown = value if not isinstance(value, (list, tuple)) or len(value) != 1 else value[0]
    if annotation is int:
        return f"{name} must be an integer, got {shown!r}"
    if annotation is float:
        return f"{name} must be a number, got {shown!r}"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        choices = ", ".join(str(member.value) for member in annotation)
        return f"{name} must be one of {choices}, got {shown!r}"
    if annotation is Path:
        return f"{name} must be a file path, got {shown!r}"
    return f"{name}: invalid value {shown!r}"


def _str_value(value: Any) -> Any:
    return value if type(value) is str else _DEFER


def install(params: Iterable[Any]) -> int:
    """Give each parameter in ``params`` the direct coercion where its type allows; returns how many.

    Parameters that are not Typer parameters, whose coercion is already built, or whose type is
    not one of the plain kinds above are left alone.
    """
    try:
        from typer._click.exceptions import BadParameter, UsageError
        from typer._coercion import RuntimeParam, build_runtime_param
        from typer._param_types import coerce_cli_choice, coerce_cli_path
        from typer.core import _TyperParameter
    except ImportError:
        return 0

    @dataclass(frozen=True)
    class _Fast(RuntimeParam):
        descriptor: Any = None
        kind: str = ""
        _adapter: list[Any] = field(default_factory=list)  # Typer's coercion, built on first need

        def fast(self, value: Any, param: Any, ctx: Any) -> Any:
            kind = self.kind
            if kind == "bool":  # a flag's value is a bool already (else Typer parses it)
                return value if type(value) is bool else _DEFER
            if kind == "int":
                if type(value) is int:
                    return value
                return int(value) if type(value) is str and _INT.fullmatch(value) else _DEFER
            if kind == "float":
                if type(value) is float:
                    return value
                if type(value) is int:
                    return float(value)
                if type(value) is str and _FLOAT.fullmatch(value):
                    out = float(value)
                    return out if math.isfinite(out) else _DEFER
                return _DEFER
            if kind == "str":
                return _str_value(value)
            if kind == "list-str":
                if not isinstance(value, (list, tuple)) or any(type(v) is not str for v in value):
                    return _DEFER
                return list(value)
            if kind == "choice":
                info = self.parameter_info
                return coerce_cli_choice(
                    value, choices=tuple(self.annotation), case_sensitive=info.case_sensitive, ctx=ctx
                )
            if kind == "path":  # Typer converts a string with pydantic's Path validator: Path(value)
                if type(value) is str and value and "\0" not in value:
                    value = Path(value)
                return coerce_cli_path(value, self.parameter_info, path_type=Path, param=param, ctx=ctx)
            return _DEFER  # "other": Typer's own coercion, with the tool's wording on a refusal

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                out = self.fast(value, param, ctx)
            except Exception:  # Typer's coercion gives the message (and raises the same way)
                out = _DEFER
            if out is _DEFER:
                if not self._adapter:
                    self._adapter.append(build_runtime_param(self.descriptor))
                try:
                    out = self._adapter[0]._coerce_value(value, param=param, ctx=ctx)
                except BadParameter:
                    raise UsageError(_refusal(param, value, self.annotation), ctx) from None
            if self.annotation is int and type(out) is int and not -_INT64 <= out < _INT64:
                # numpy's sizes, seeds and counts are 64-bit: a larger value would fail inside
                raise UsageError(f"{_option_name(param)} must be an integer below 2**63 in size, got {value!r}", ctx)
            return out

    count = 0
    for param in params:
        if not isinstance(param, _TyperParameter) or getattr(param, "_runtime_param", True) is not None:
            continue
        desc = getattr(param, "type_descriptor", None)
        if desc is None or desc.file_annotation is not None:
            continue
        kind = _kind(desc.annotation, desc.parameter_info) or "other"
        param._runtime_param = _Fast(
            parameter_info=desc.parameter_info, annotation=desc.annotation, descriptor=desc, kind=kind
        )
        count += 1
    return count


def install_group(group: Any) -> None:
    """:func:`install` on every parameter of a command group and of its commands, including the
    help options, which Click creates on first use (their value is None unless given)."""
    commands = [group, *getattr(group, "commands", {}).values()]
    install(p for command in commands for p in command.params)
    for command in commands:
        for param in command.params:
            _give_metavar(param)
    for command in commands:
        original = command.get_help_option

        def get_help_option(ctx: Any, _original: Any = original) -> Any:
            option = _original(ctx)
            if option is not None:
                install([option])
            return option

        command.get_help_option = get_help_option


def _give_metavar(param: Any) -> None:
    """A metavar for an option that takes a value and has none (``--trials TRIALS``); an argument
    with a metavar shows it alone (Typer would append its Python type, ``<list[str]>``)."""
    if getattr(param, "param_type_name", None) == "argument":
        if param.metavar is not None:
            param.display_type_rich = lambda ctx: None
        return
    if getattr(param, "param_type_name", None) != "option" or param.metavar is not None:
        return
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and getattr(desc, "is_choice", False):
        return  # shown as its choices, e.g. <table|csv|json>
    param.metavar = _option_name(param).lstrip("-").upper()


# ---------------------------------------------------------------------------------------------
# users' operators: --framework and --dtype, and what their calls revealed (on stderr)

#: ``(framework, dtype)`` given to the running command for the users' operators it selects
#: (None: not given); :func:`user_operator_options` sets it, ``cli.resolve_methods`` reads it.
USER_OPTIONS: ContextVar[tuple[str | None, str | None]] = ContextVar("USER_OPTIONS", default=(None, None))

_FRAMEWORK_HELP = (
    "The framework your own operator (-m FILE.py:FUNCTION or -m package.module:FUNCTION) is written in: "
    "auto (from what its module imports; the default), numpy, torch or jax."
)
_DTYPE_HELP = (
    "Run your own operator on scores in this dtype: float32, bfloat16 or float16 (default float64); "
    "its weights are read back as float64 and the dtype it returned is noted on stderr."
)


def user_operator_options(*, options: bool = True) -> Callable[[Any], Any]:
    """Give a command ``--framework`` and ``--dtype`` for the users' operators it runs (``options``),
    and print on stderr, once the command ends (also on exit 1), what their calls revealed besides
    the weights: text they printed (never on stdout, which carries data), warnings, an input modified
    in place, another dtype returned, row-by-row calls (``softtopk: note: ...``).

    Raises (from the command): InvalidArgumentError for a framework or dtype that does not exist.
    """
    import functools
    import inspect
    from typing import Annotated, Optional

    import typer

    def decorate(func: Any) -> Any:
        signature = inspect.signature(func, eval_str=True)
        extra = []
        if options:
            extra = [
                inspect.Parameter("framework", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
                    Optional[str], typer.Option("--framework", metavar="auto|numpy|torch|jax", help=_FRAMEWORK_HELP,
                                                show_default=False)]),
                inspect.Parameter("user_dtype", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
                    Optional[str], typer.Option("--dtype", metavar="float32|bfloat16|float16", help=_DTYPE_HELP,
                                                show_default=False)]),
            ]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from topk_cli.registry import clear_user_notes

            framework, dtype = kwargs.pop("framework", None), kwargs.pop("user_dtype", None)
            check_user_options(framework, dtype)
            token = USER_OPTIONS.set((framework, dtype))
            clear_user_notes()
            try:
                return func(*args, **kwargs)
            finally:
                USER_OPTIONS.reset(token)
                print_user_notes()

        wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *extra])  # type: ignore[attr-defined]
        return wrapper

    return decorate


def check_user_options(framework: str | None, dtype: str | None) -> None:
    """``--framework`` and ``--dtype`` are among their choices (checked before anything runs)."""
    from topk_cli.errors import InvalidArgumentError

    if framework is not None and framework not in ("auto", "numpy", "torch", "jax"):
        raise InvalidArgumentError(f"--framework must be auto, numpy, torch or jax, got {framework!r}")
    if dtype is not None and dtype not in ("float64", "float32", "bfloat16", "float16"):
        raise InvalidArgumentError(f"--dtype must be float32, bfloat16 or float16 (or float64), got {dtype!r}")


def print_user_notes() -> None:
    """``softtopk: note: ...`` on stderr for what the users' operators of this command revealed."""
    import typer

    from topk_cli.registry import user_notes

    for note in user_notes():
        typer.echo(f"softtopk: note: {note}", err=True)
