"""The one exception family of softtopk.

Every error the library raises derives from :class:`SoftTopKError`, so a caller (and the CLI
boundary) can catch the whole family at once. Argument and input problems are also
``ValueError``; numerical failures of an operator are also ``ArithmeticError``.
"""

from __future__ import annotations

from dataclasses import dataclass


class SoftTopKError(Exception):
    """Base class of every error raised by softtopk."""


class InvalidArgumentError(SoftTopKError, ValueError):
    """A bad argument: wrong k, tau, shape, dtype or values (NaN, +inf)."""


class UnknownMethodError(InvalidArgumentError):
    """A method name that is not in the registry; the message lists the valid names."""


class ResourceError(SoftTopKError, MemoryError):
    """A computation that does not fit in memory; the message names the size and what to do."""


class InputError(SoftTopKError, ValueError):
    """An unreadable or invalid input file; the message names file, row and column."""


@dataclass(frozen=True)
class RowFailure:
    """Diagnosis of one row on which an operator failed numerically.

    ``row`` indexes the batch (``()`` for a single vector), ``code`` is a short machine
    code (``"log0"``, ``"log-negative"``, ``"nan"``, ``"inf"``), ``level`` the recursion
    level where it happened when the method has levels, ``value`` the offending quantity
    (e.g. the log argument) and ``detail`` a sentence for humans.
    """

    method: str
    row: tuple[int, ...]
    code: str
    detail: str
    level: int | None = None
    value: float | None = None

    def describe(self) -> str:
        where = f"row {self.row[0] if len(self.row) == 1 else self.row}" if self.row else "the vector"
        level = f" at recursion level {self.level}" if self.level is not None else ""
        return f"{self.method}: {self.code} on {where}{level}: {self.detail}"


class NumericalFailureError(SoftTopKError, ArithmeticError):
    """An operator could not compute an accurate result for at least one row.

    ``failures`` holds one :class:`RowFailure` per failed row. Use
    :func:`topk_cli.evaluate` to get the same diagnosis per row without an exception.
    """

    def __init__(self, failures: tuple[RowFailure, ...]) -> None:
        self.failures = failures
        first = failures[0].describe() if failures else "unknown failure"
        more = f" (and {len(failures) - 1} more rows)" if len(failures) > 1 else ""
        super().__init__(first + more)
