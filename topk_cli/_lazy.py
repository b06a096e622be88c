"""Lazy public names of a package (PEP 562): each is imported from its module on first use."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (start-up time of the CLI)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_getattr(package: str, where: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``where[name]`` is the module that defines ``name``;
    the value is stored in ``namespace`` (the package's globals), so each name is looked up once."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
