"""What the PyTorch and JAX drop-ins share: the method and argument checks, written once against the
Python array API (array-api-compat), so that :mod:`topk_cli.torch` and :mod:`topk_cli.jax` refuse the
inputs :func:`topk_cli.api.soft_topk` refuses, with the same error classes and wording.

Axis convention: the operator acts on the last axis of ``x``; the other axes are a batch, flattened
to ``(B, n)`` rows for the computation. ``k`` and ``tau`` are numbers or arrays broadcastable to the
batch shape (a trailing axis of length 1, ``k[..., None]`` beside ``x``, is accepted).

Shape, dtype and method checks always run. Value checks (NaN or ``+inf`` in ``x``, the range of ``k``
and ``tau`` per row, at least ``k`` unmasked entries per row) read the data: they run in eager mode
only, where they cost one reduction and one scalar read back from the device, and are skipped under
tracing (``torch.compile``, ``jax.jit``, ``jax.vmap``), where the values are not known yet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn

from topk_cli.errors import InvalidArgumentError, UnknownMethodError

#: The method a drop-in computes when none is named (the numpy API's default too).
DEFAULT_METHOD = "thre-laplace"

#: The soft method whose gradient ``straight_through=True`` uses.
DEFAULT_STRAIGHT_THROUGH = "thre-laplace"


def dropin_methods() -> tuple[str, ...]:
    """The methods the drop-ins compute (those the array-API engine implements), in its order."""
    from topk_cli.xp import DROPIN_METHODS

    return tuple(DROPIN_METHODS)


def real_k_methods() -> tuple[str, ...]:
    """The drop-in methods that take a real ``k`` and a ``k`` per row."""
    from topk_cli.xp import REAL_K_METHODS

    return tuple(m for m in dropin_methods() if m in REAL_K_METHODS)


def takes_real_k(method: str) -> bool:
    return method in real_k_methods()


def check_method(method: object, framework: str) -> str:
    """The registered name of ``method`` (aliases such as ``lapsum`` resolved) after checking that it
    has a drop-in.

    Raises:
        UnknownMethodError: not a method name (the message lists the drop-in methods).
        InvalidArgumentError: a method of the numpy engine without a drop-in.
    """
    from topk_cli.registry import ALIASES, METHODS

    available = ", ".join(dropin_methods())
    name = ALIASES.get(method, method) if isinstance(method, str) else method
    if not isinstance(name, str) or name not in METHODS:
        raise UnknownMethodError(f"unknown method {method!r}; drop-in methods: {available}")
    if name not in dropin_methods():
        raise InvalidArgumentError(
            f"method {name!r} has no {framework} drop-in; drop-in methods: {available} "
            "(topk_cli.soft_topk computes every method on numpy arrays)"
        )
    return name


def check_straight_through(method: str, straight_through: object) -> str:
    """The soft method whose gradient a hard forward uses (``""``: none) from the ``straight_through``
    argument: ``False``, ``True`` (:data:`DEFAULT_STRAIGHT_THROUGH`) or a soft drop-in method's name.

    Raises:
        InvalidArgumentError: straight-through asked with a method other than ``"hard"``, or a value
            that is not a soft drop-in method.
    """
    if straight_through is False or straight_through is None:
        return ""
    soft = tuple(m for m in dropin_methods() if m != "hard")
    if straight_through is True:
        chosen = DEFAULT_STRAIGHT_THROUGH
    elif isinstance(straight_through, str):
        from topk_cli.registry import ALIASES

        chosen = ALIASES.get(straight_through, straight_through)
        if chosen not in soft:
            raise InvalidArgumentError(
                f"straight_through must be False, True or a soft drop-in method ({', '.join(soft)}), "
                f"got {straight_through!r}"
            )
    else:
        raise InvalidArgumentError(
            f"straight_through must be False, True or a soft drop-in method ({', '.join(soft)}), got {straight_through!r}"
        )
    if method != "hard":
        raise InvalidArgumentError(
            f"straight_through applies to method='hard' only (hard forward, the soft method's gradient "
            f"backward), got method={method!r}"
        )
    return chosen


def k_method(method: str, st_method: str) -> str:
    """The method whose rules ``k`` follows: ``st_method`` when it takes integer k only (a hard
    forward with ``grad``'s gradient needs grad's integer k), else ``method``."""
    return st_method if st_method and not takes_real_k(st_method) else method


def refuse_k_array(method: str, k: object) -> NoReturn:
    raise InvalidArgumentError(
        f"k must be a number for method {method!r} (one integer k for every row, static under tracing: "
        f"its dynamic program's shapes depend on it), got {type(k).__name__}; drop-in methods that take "
        f"a k per row: {', '.join(real_k_methods())}"
    )


def check_shape(shape: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """``(batch shape, n)`` of an input of shape ``shape``, after checking it is a vector or a batch of
    non-empty vectors."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        raise InvalidArgumentError("x must have at least one axis (a vector), got a scalar")
    if shape[-1] == 0:
        raise InvalidArgumentError(f"x must have at least one entry on the last axis, got shape {shape}")
    return shape[:-1], shape[-1]


def is_number(value: object) -> bool:
    """True for a Python or numpy real scalar (bool excluded): a ``k`` or ``tau`` given as a number."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    kind = getattr(getattr(value, "dtype", None), "kind", None)  # numpy scalars, without importing numpy
    cls = type(value)
    return cls.__module__ == "numpy" and cls.__name__ != "ndarray" and kind in ("i", "u", "f")


def scalar_k(k: object, method: str, n: int) -> int | float:
    """A number ``k`` checked against ``method`` and ``n``: an ``int`` for an integer-only method
    (``1 <= k <= n``), else a float or an int (``0 < k <= n``). Plain Python (no numpy), so that
    ``torch.compile`` traces it without a graph break; the wording is :func:`topk_cli.api.check_k`'s
    and :func:`topk_cli.api.check_real_k`'s."""
    value = float(k)  # type: ignore[arg-type]
    if not takes_real_k(method):
        if math.isfinite(value) and not value.is_integer():
            integer_only(method, k)
        if not value.is_integer():
            raise InvalidArgumentError(f"k must be an integer, got {k!r}")
        if not 1 <= value <= n:
            raise InvalidArgumentError(f"k must satisfy 1 <= k <= n (n={n}), got {int(value)}")
        return int(value)
    if not (math.isfinite(value) and 0 < value <= n):
        raise InvalidArgumentError(f"k must satisfy 0 < k <= n (n={n}), got {_number(value)}")
    return int(value) if value.is_integer() else value


def integer_only(method: str, shown: object) -> NoReturn:
    raise InvalidArgumentError(
        f"k must be an integer for method {method!r} (defined for integer k only), got {shown!r}; "
        f"drop-in methods that take a real k: {', '.join(real_k_methods())}"
    )


def scalar_tau(tau: object) -> float:
    """A number ``tau`` after checking it is finite and ``> 0`` (:func:`topk_cli.api.check_tau`'s
    wording, in plain Python)."""
    value = float(tau)  # type: ignore[arg-type]
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgumentError(f"tau must be a finite number > 0, got {tau!r}")
    return value


def per_row_shape(name: str, shape: Sequence[int], batch_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a per-row ``k`` or ``tau`` of shape ``shape`` is read as (a trailing axis of length 1
    beside the batch dropped), after checking it broadcasts to ``batch_shape``."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == len(batch_shape) + 1 and shape[-1] == 1:  # kept dims
        shape = shape[:-1]
    ok = len(shape) <= len(batch_shape) and all(
        a in (1, b) for a, b in zip(reversed(shape), reversed(batch_shape), strict=False)
    )
    if not ok:
        raise InvalidArgumentError(
            f"{name} of shape {shape} does not broadcast to the batch shape {batch_shape} (x without its last axis)"
        )
    return shape


def refuse_dtype(name: str, dtype: object) -> NoReturn:
    raise InvalidArgumentError(f"{name} must hold real numbers, got dtype {dtype}")


def row_label(flat: int, batch_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The batch index of flattened row ``flat`` (row-major)."""
    index = []
    for size in reversed(batch_shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


def _number(value: float) -> str:
    return str(int(value)) if math.isfinite(value) and value.is_integer() else repr(value)


def _first(xp: Any, bad: Any) -> int:
    """The first index where the boolean vector ``bad`` is true (one scalar read)."""
    return int(xp.argmax(xp.astype(bad, xp.int32)))


def check_values(
    xp: Any, x2: Any, k_rows: Any | None, k_number: int | float | None, tau_rows: Any | None,
    batch_shape: tuple[int, ...], method: str,
) -> None:
    """Check the values of one call in eager mode, as :func:`topk_cli.api.soft_topk` does.

    ``x2`` is the ``(B, n)`` input, ``k_rows`` the ``(B,)`` k per row when given as an array (else
    ``k_number``, already range-checked), ``tau_rows`` the ``(B,)`` tau per row when given as an array.
    One reduction decides whether anything is wrong (one scalar read back); only then are the rows
    searched for the message.
    """
    n = int(x2.shape[-1])
    integer = not takes_real_k(method)
    if bool(xp.isfinite(xp.sum(x2))):
        # no NaN, no inf (a finite sum proves it; one fast reduction, where the entrywise tests below
        # cost several passes): every row has n >= k unmasked entries
        bad_x = short = xp.zeros_like(x2[..., 0], dtype=xp.bool)
        counts = xp.full_like(x2[..., 0], n, dtype=xp.int32)
    else:
        finite = xp.isfinite(x2)
        counts = xp.sum(xp.astype(finite, xp.int32), axis=-1)
        bad_x = xp.any(xp.isnan(x2) | (x2 == math.inf), axis=-1)
        need = k_rows if k_rows is not None else float(k_number or 1)
        short = (xp.astype(counts, x2.dtype) < need) | (counts == 0)
    flags = [bad_x, short]
    bad_k = bad_tau = None
    if k_rows is not None:
        low = (k_rows < 1) if integer else (k_rows <= 0)
        bad_k = ~xp.isfinite(k_rows) | (k_rows > n) | low
        flags.append(bad_k)
        if integer:
            flags.append(k_rows != xp.floor(k_rows))
    if tau_rows is not None:
        bad_tau = ~(xp.isfinite(tau_rows) & (tau_rows > 0))
        flags.append(bad_tau)
    anything = flags[0]
    for flag in flags[1:]:
        anything = anything | flag
    if not bool(xp.any(anything)):  # the one read in the usual case
        return
    if k_rows is not None and bad_k is not None:
        if bool(xp.any(bad_k)):
            b = _first(xp, bad_k)
            low_text = "1 <= k" if integer else "0 < k"
            raise InvalidArgumentError(
                f"k must satisfy {low_text} <= n (n={n}) in every row, got {_number(float(k_rows[b]))} "
                f"at row {row_label(b, batch_shape)}"
            )
        if integer:
            fractional = k_rows != xp.floor(k_rows)
            if bool(xp.any(fractional)):
                integer_only(method, float(k_rows[_first(xp, fractional)]))
    if tau_rows is not None and bad_tau is not None and bool(xp.any(bad_tau)):
        b = _first(xp, bad_tau)
        raise InvalidArgumentError(
            f"tau must be a finite number > 0 in every row, got {float(tau_rows[b])!r} at row {row_label(b, batch_shape)}"
        )
    if bool(xp.any(bad_x)):
        b = _first(xp, bad_x)
        row = x2[b, ...]
        col = _first(xp, xp.isnan(row) | (row == math.inf))
        where = row_label(b, batch_shape)
        label = f"row {where}, entry {col}" if where else f"entry {col}"
        raise InvalidArgumentError(
            f"x must not contain NaN or +inf (use -inf to mask an entry); found {float(row[col])} at {label}"
        )
    b = _first(xp, short)
    where = row_label(b, batch_shape)
    label = f"row {where}" if where else "the vector"
    shown = _number(float(k_rows[b]) if k_rows is not None else float(k_number or 1))
    raise InvalidArgumentError(
        f"{label} has only {int(counts[b])} unmasked entries (-inf = masked), fewer than k={shown}"
    )
