"""JAX drop-in: :func:`soft_topk` as a differentiable function of JAX arrays.

The maths is the array-API engine :mod:`topk_cli.xp` (forward and exact vector-Jacobian products,
the same code the PyTorch drop-in runs); this module only checks the arguments, flattens the batch
to ``(B, n)`` rows, applies the dtype policy and registers the derivative with ``jax.custom_vjp``
(the method names are non-differentiable static arguments). It works under ``jax.jit``,
``jax.vmap`` and ``jax.grad``; everything runs with ``jax.numpy`` on the input's device: no copy to
the host, no numpy. float64 needs ``jax.config.update("jax_enable_x64", True)``.

Install with ``pip install 'softtopk[jax]'``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from topk_cli.errors import InvalidArgumentError
from topk_cli.frameworks import dropin_common as common

__all__ = ["soft_topk"]


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _soft_topk_rows(x: jax.Array, k: jax.Array, tau: jax.Array, method: str, st_method: str, k_static: int,
                    k_max: float) -> jax.Array:
    """The weights of ``(B, n)`` rows ``x`` with ``k`` and ``tau`` per row ``(B,)`` (x's dtype);
    ``k_static``: the integer k of a method defined for integer k only (``grad``), else 0; ``k_max``:
    a static bound on every row's k (a scalar k: the engine's partial-selection path), else 0."""
    return _forward(x, k, tau, method, st_method, k_static, k_max)[0]


def _forward(x: jax.Array, k: jax.Array, tau: jax.Array, method: str, st_method: str,
             k_static: int, k_max: float) -> tuple[jax.Array, Any]:
    from topk_cli import xp

    return xp.forward(x, k, tau, method, st_method=st_method or None, k_static=k_static or None,
                      k_max=k_max or None)


def _backward(method: str, st_method: str, k_static: int, k_max: float, residuals: Any,
              g: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    from topk_cli import xp

    gx, gk, gtau = xp.backward(method, tuple(residuals), g, st_method=st_method or None)
    return gx, gk, gtau


_soft_topk_rows.defvjp(_forward, _backward)


def _k_grid(k: float) -> float:
    """The smallest of ``1, 1.5, 2, 3, 4, 6, 8, 12, ...`` (``2^j`` and ``1.5 2^j``) at least ``k``."""
    power = 2.0 ** math.floor(math.log2(max(k, 1.0)))
    for step in (power, 1.5 * power, 2 * power):
        if step >= k:
            return step
    return 2 * power  # unreachable: 2^(floor(log2 k) + 1) > k

#: Compiled once per shape, dtype and method: the engine is dozens of small array operations (a
#: binary search, Newton steps) that JAX would otherwise dispatch one by one in eager mode.
_soft_topk_jit = jax.jit(_soft_topk_rows, static_argnums=(3, 4, 5, 6))


def _tracing(*values: Any) -> bool:
    """True when any of ``values`` is traced (``jax.jit``, ``jax.vmap``, ``jax.grad``...): its values
    cannot be read."""
    return any(isinstance(v, jax.core.Tracer) for v in values)


def _per_row(value: Any, name: str, x2: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
    """A ``k`` or ``tau`` given as an array (or array-like) as ``(B,)`` rows of x's compute dtype."""
    try:
        a = jnp.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{name} must be a number or an array of numbers: {exc}") from None
    if a.dtype == jnp.bool_ or jnp.issubdtype(a.dtype, jnp.complexfloating):
        common.refuse_dtype(name, a.dtype)
    shape = common.per_row_shape(name, a.shape, batch_shape)
    a = jnp.broadcast_to(a.reshape(shape).astype(x2.dtype), batch_shape)
    return a.reshape(x2.shape[0])


def soft_topk(
    x: jax.Array, k: Any, method: str = common.DEFAULT_METHOD, tau: Any = 1.0, *,
    straight_through: bool | str = False,
) -> jax.Array:
    """Smooth top-k weights of ``x / tau`` along the last axis, differentiable, as a JAX array.

    The same operator and contract as :func:`topk_cli.soft_topk` on numpy arrays: weights in
    ``[0, 1]`` summing to ``k`` per row that tend to the k-hot indicator of the k largest entries as
    ``tau -> 0``; ``-inf`` entries are masked (weight exactly 0; a row needs at least ``k`` unmasked
    entries); the leading axes are a batch. Works under ``jax.jit`` and ``jax.vmap``.

    Args:
        x: scores ``[..., n]``, a floating-point array. float64 and float32 are computed in their own
            precision; bfloat16 and float16 are solved in float32 and the weights returned in the
            input dtype (a threshold solved in 8 or 11 significant bits misses the budget
            ``sum p = k`` by the rounding of each of the n terms and gives distinct scores equal
            weights, which breaks a router).
        k: an ``int``, a real number, or an array broadcastable to the batch shape ``x.shape[:-1]``:
            one ``k`` per row, which may be traced. ``grad`` (and ``hard`` with
            ``straight_through="grad"``) takes one Python ``int`` for every row: static under
            ``jax.jit`` (pass it through ``static_argnums`` or a closure; each value compiles
            anew), and its gradient is zero.
        method: ``"hard"``, ``"thre-exp"``, ``"thre-laplace"`` (default), ``"thre-sigmoid"``,
            ``"thre-clip"``, ``"thre-cube"`` or ``"grad"`` (aliases such as ``lapsum`` work); the
            other methods run on numpy arrays through :func:`topk_cli.soft_topk`.
        tau: temperature > 0, a number or an array broadcastable to the batch shape.
        straight_through: only with ``method="hard"``: ``True`` (``thre-laplace``) or a soft method's
            name gives the hard forward and that method's gradient backward; ``False`` (default):
            the hard operator's gradient, zero.

    Returns:
        The weights, shaped and typed like ``x``. Differentiable with respect to ``x`` and, where
        given as floating-point arrays, ``k`` (methods that take a real k) and ``tau``.

    Raises:
        InvalidArgumentError: a method without a drop-in (the message lists those that have one),
            a bad shape or dtype, or (outside tracing) values the numpy API refuses: NaN or ``+inf``
            in ``x``, ``k`` outside ``1 <= k <= n`` (integer-only methods) or ``0 < k <= n``, fewer
            than ``k`` unmasked entries in a row, ``tau <= 0``. Under ``jax.jit``, ``jax.vmap`` and
            other transformations the value checks are skipped (the values are not known there);
            the shape, dtype and method checks still run.
    """
    name = common.check_method(method, "JAX")
    st_method = common.check_straight_through(name, straight_through)
    if not isinstance(x, jax.Array):  # a numpy array or a list: placed on JAX's default device
        try:
            x = jnp.asarray(x)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"x must be an array of real numbers: {exc}") from None
    if x.dtype not in (jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16):
        raise InvalidArgumentError(
            f"x must be a floating-point array (float64, float32, bfloat16 or float16), got {x.dtype}"
        )
    batch_shape, n = common.check_shape(x.shape)
    compute = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    x2 = x.reshape(-1, n).astype(compute)
    k_method = common.k_method(name, st_method)
    k_number: int | float | None = None
    k_given: jax.Array | None = None
    like = x2[:, 0]  # (B,) on x's device, also under tracing
    if common.is_number(k):
        k_number = common.scalar_k(k, k_method, n)
        k_rows = jnp.full_like(like, float(k_number))
    elif not common.takes_real_k(k_method):
        common.refuse_k_array(k_method, k)
    else:
        k_rows = k_given = _per_row(k, "k", x2, batch_shape)
    k_static = 0 if common.takes_real_k(k_method) else int(k_number or 0)
    tau_given: jax.Array | None = None
    if common.is_number(tau):
        tau_rows = jnp.full_like(like, common.scalar_tau(tau))
    else:
        tau_rows = tau_given = _per_row(tau, "tau", x2, batch_shape)
    if not _tracing(x2, k_rows, tau_rows):
        common.check_values(jnp, x2, k_given, k_number, tau_given, batch_shape, k_method)
    # a scalar k bounds every row: static, rounded up to the grid 1, 1.5, 2, 3, 4, 6, 8, 12, ... (one
    # compilation per half octave of k, not per value; the partial selections stay within 1.5 k);
    # an array k is not read (it may be traced): rows are then sorted
    k_max = _k_grid(float(k_number)) if k_number is not None else 0.0
    p = _soft_topk_jit(x2, k_rows, tau_rows, name, st_method, k_static, k_max)
    return p.reshape(x.shape).astype(x.dtype)
