"""Shared helpers of the array-API core: namespaces, gathers, counts, the breakpoint search.

Everything here takes a namespace ``xp`` (from :func:`array_api_compat.array_namespace`) and
arrays of that namespace; nothing converts to numpy or reads a value back from an accelerator
(:func:`branch` is ``lax.cond`` under JAX, a host read on the CPU only), so the same code runs on
numpy, PyTorch and ``jax.numpy`` arrays (also under ``jax.jit``: loops run a count fixed by the
shapes).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import array_api_compat

Array = Any


def namespace(*arrays: Array) -> Any:
    """The array-API namespace of ``arrays`` (numpy arrays get ``array_api_compat.numpy``)."""
    return array_api_compat.array_namespace(*arrays)


def device(x: Array) -> Any:
    return array_api_compat.device(x)


def index_dtype(xp: Any, x: Array) -> Any:
    """The namespace's default index dtype on ``x``'s device (int64, or int32 in JAX without x64)."""
    return xp.__array_namespace_info__().default_dtypes(device=device(x))["indexing"]


def take(xp: Any, a: Array, idx: Array) -> Array:
    """``a[b, idx[b]]`` for every row ``b`` (``a`` of shape ``(B, n)``, ``idx`` of shape ``(B,)``)."""
    return xp.take_along_axis(a, idx[:, None], axis=1)[:, 0]


def count(xp: Any, mask: Array, dtype: Any) -> Array:
    """``#True`` per row of a ``(B, n)`` mask, in ``dtype``."""
    return xp.sum(xp.astype(mask, dtype), axis=1)


def positions(xp: Any, x: Array, n: int) -> Array:
    """``[0, 1, ..., n - 1]`` as a ``(1, n)`` index row on ``x``'s device."""
    return xp.arange(n, dtype=index_dtype(xp, x), device=device(x))[None, :]


def safe_max(xp: Any, a: Array) -> Array:
    """Row maxima of ``a`` with rows that are entirely ``-inf`` given 0 (a shift that changes nothing)."""
    top = xp.max(a, axis=1)
    return xp.where(xp.isfinite(top), top, xp.zeros_like(top))


def search(xp: Any, count_finite: Array, size: int, below: Callable[[Array], Array], idx_like: Array) -> Array:
    """``#{j < count_finite : below(j)}`` per row, for a predicate ``below(j)`` (``(B,)`` int -> ``(B,)``
    bool) that holds for ``j`` under some per-row bound and fails above it: a binary search of
    ``ceil(log2(size + 1))`` steps (static), each evaluating ``below`` once on every row.
    """
    lo = xp.zeros_like(count_finite)
    hi = count_finite
    for _ in range(max(1, math.ceil(math.log2(size + 1)))):
        mid = xp.bitwise_right_shift(lo + hi, 1)  # (lo + hi) // 2, a cheaper operation on every backend
        active = lo < hi
        ok = below(xp.minimum(mid, size - 1))
        lo = xp.where(active & ok, mid + 1, lo)
        hi = xp.where(active & ~ok, mid, hi)
    return lo


def scaled(xp: Any, x: Array, tau: Array) -> tuple[Array, Array]:
    """``(z, finite)``: ``z = (x - max x) / tau`` per row (``-inf`` on masked entries) and the mask of
    unmasked entries."""
    fin = xp.abs(x) < math.inf  # isfinite (NaN compares false), at a third of its cost in torch on CPU
    top = safe_max(xp, x)
    z = (x - top[:, None]) / tau[:, None]
    return z, fin


def sort_descending(xp: Any, a: Array) -> Array:
    """The rows of ``a`` (``(B, n)``) sorted descending (values only: stability buys nothing); under JAX
    behind an optimization barrier, as :func:`top_entries`."""
    s = xp.sort(a, axis=1, descending=True, stable=False)
    if array_api_compat.is_jax_namespace(xp):
        s = importlib.import_module("jax.lax").optimization_barrier(s)
    return s


def top_entries(xp: Any, a: Array, m: int) -> tuple[Array, Array]:
    """``(values, indices)``: the ``m`` largest entries of each row of ``a`` (``(B, n)``, ``1 <= m <= n``),
    sorted descending, and their positions; ties at the m-th value are broken arbitrarily.

    The array API standard has no top-k: PyTorch's ``Tensor.topk`` and JAX's ``jax.lax.top_k`` (the
    partial selections their ``partition`` functions use) are called directly; other namespaces
    sort the whole row (``argsort``), as array-api-extra's ``argpartition`` does for them.
    """
    if array_api_compat.is_torch_namespace(xp):
        values, indices = a.topk(m, dim=1, largest=True, sorted=True)
        return values, indices
    if array_api_compat.is_jax_namespace(xp):  # JAX is loaded already: its arrays are here
        lax = importlib.import_module("jax.lax")
        if a.dtype == xp.float64:
            return _jax_top_float64(xp, lax, a, m)
        # the barrier keeps XLA (on CPU) from fusing the selection into the elementwise passes that
        # read its values: it then recomputes it per element (20x slower at n = 1000, k = 16)
        values, indices = lax.optimization_barrier(lax.top_k(a, m))
        return values, indices
    order = xp.argsort(a, axis=1, descending=True, stable=False)[:, :m]
    return xp.take_along_axis(a, order, axis=1), order


def _jax_top_float64(xp: Any, lax: Any, a: Array, m: int) -> tuple[Array, Array]:
    """:func:`top_entries` of float64 JAX rows through a float32 selection: XLA's CPU top-k is fast
    in float32 only (1000 x 1000, m = 16: 6 ms, against 240 ms in float64, a full sort).

    Rounding to float32 keeps the order (``a > b`` implies ``f32(a) >= f32(b)``), so the entries
    whose float32 key is above the m-th key ``v`` are among the m largest; the selection is exact
    when no entry left out has key ``v`` (``#{key >= v} = m``) or when every entry with key ``v``
    has the same float64 value (a tie any choice of which is right). The m float64 values are
    then sorted. A batch where a row fails both (float64 values closer than float32 resolves at
    the boundary) takes the float64 top-k instead (``lax.cond``: computed only then)."""
    key = xp.astype(a, xp.float32)
    kv, idx = lax.optimization_barrier(lax.top_k(key, m))
    values = xp.take_along_axis(a, idx, axis=1)
    neg, idx = lax.sort((-values, idx), dimension=1, num_keys=1)
    cut = kv[:, -1:]
    at = key == cut
    hi = xp.max(xp.where(at, a, -math.inf), axis=1)
    lo = xp.min(xp.where(at, a, math.inf), axis=1)
    exact = xp.all((xp.sum(xp.astype(key >= cut, xp.int32), axis=1) == m) | (hi == lo))

    def selected() -> tuple[Array, Array]:
        return -neg, idx

    def full() -> tuple[Array, Array]:
        values, indices = lax.optimization_barrier(lax.top_k(a, m))
        return values, xp.astype(indices, idx.dtype)

    return lax.cond(exact, selected, full)


def decides_cheaply(xp: Any, a: Array) -> bool:
    """Whether :func:`branch` on ``a``'s arrays costs no device synchronisation: under JAX it is
    ``lax.cond`` (no value leaves the device), numpy and PyTorch on the CPU read one boolean; a
    PyTorch tensor on an accelerator would wait for the device, so the callers take their
    branch-free path there."""
    if array_api_compat.is_torch_namespace(xp):
        return bool(a.device.type == "cpu")
    return True


def branch(xp: Any, pred: Array, if_true: Callable[[], Any], if_false: Callable[[], Any]) -> Any:
    """``if_true()`` if the 0-d boolean ``pred`` holds, else ``if_false()`` (both give arrays of the
    same shapes): ``lax.cond`` under JAX (traceable by ``jax.jit``; both run under ``jax.vmap``),
    else one boolean read on the host (see :func:`decides_cheaply`)."""
    if array_api_compat.is_jax_namespace(xp):
        return importlib.import_module("jax.lax").cond(pred, if_true, if_false)
    return if_true() if bool(pred) else if_false()


def set_entries(xp: Any, a: Array, idx: Array, values: Array) -> Array:
    """A copy of ``a`` (``(B, n)``) with ``a[b, idx[b]] = values[b]`` for every row ``b``."""
    import array_api_extra as xpx

    rows = xp.arange(a.shape[0], dtype=idx.dtype, device=device(a))
    if array_api_compat.is_torch_namespace(xp):  # array-api-extra's copy goes through torch.asarray,
        out = a.clone()  # which warns about requires_grad inside an autograd formula
        out[rows, idx] = values
        return out
    return xpx.at(a)[rows, idx].set(values, copy=True)
