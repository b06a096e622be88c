"""PyTorch drop-in: :func:`soft_topk` as a differentiable operator on torch tensors.

The maths is the array-API engine :mod:`topk_cli.xp` (forward and exact vector-Jacobian products,
the same code the JAX drop-in runs); this module only checks the arguments, flattens the batch to
``(B, n)`` rows, applies the dtype policy and registers the derivative. The operator is one
``torch.library.custom_op`` (``softtopk::soft_topk``, its backward ``softtopk::soft_topk_backward``)
with a fake implementation and a registered autograd formula, so ``torch.compile`` keeps it as one
node of one graph and ``torch.library.opcheck`` checks it. Everything runs with torch operations on
the input's device: no copy to the host, no numpy.

Install with ``pip install 'softtopk[torch]'``.
"""

from __future__ import annotations

from typing import Any

import torch

from topk_cli.errors import InvalidArgumentError
from topk_cli.frameworks import dropin_common as common

__all__ = ["soft_topk"]

#: Dtypes computed in their own precision; bfloat16 and float16 are solved in float32.
_OWN_PRECISION = (torch.float32, torch.float64)
_HALF = (torch.bfloat16, torch.float16)


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _outputs(x: torch.Tensor, k: torch.Tensor, tau: torch.Tensor, method: str, st_method: str,
             k_static: int, k_max: float = 0.0) -> list[torch.Tensor]:
    """``[p, *residuals]`` of the engine, each contiguous; a residual that shares memory with an input or
    an earlier output is copied (a custom operator's outputs must not alias)."""
    from topk_cli import xp

    p, residuals = xp.forward(x, k, tau, method, st_method=st_method or None, k_static=k_static or None,
                              k_max=k_max or None)
    seen = {_storage(t) for t in (x, k, tau)}
    out = []
    for t in (p, *residuals):
        if _storage(t) in seen:
            t = t.clone()
        t = t.contiguous()  # a broadcast view (stride 0) as the fake implementation's dense layout
        seen.add(_storage(t))
        out.append(t)
    return out


@torch.library.custom_op("softtopk::soft_topk", mutates_args=())
def _soft_topk_op(x: torch.Tensor, k: torch.Tensor, tau: torch.Tensor, method: str, st_method: str,
                  k_static: int, k_max: float) -> list[torch.Tensor]:
    """``[p, *residuals]`` on ``(B, n)`` rows ``x`` with ``k`` and ``tau`` per row ``(B,)`` (x's dtype);
    ``k_static``: the integer k of a method defined for integer k only (``grad``), else 0; ``k_max``:
    a bound on every row's k known on the host (the engine's partial-selection path), else 0."""
    return _outputs(x, k, tau, method, st_method, k_static, k_max)


#: The residuals' layout of each (method, st_method): per residual, its shape with ``"B"`` and ``"n"``
#: for the rows and the row length (``"k"`` for an integer-only method's k), and its dtype (``None``: x's dtype). Measured once on a small
#: input (:func:`_layout`), so that the fake implementation needs no knowledge of the engine and the
#: engine is never traced with symbolic sizes.
_LAYOUTS: dict[tuple[str, str, bool], tuple[tuple[tuple[int | str, ...], torch.dtype | None], ...]] = {}
_PROBE_ROWS, _PROBE_N, _PROBE_K = 3, 7, 2  # sizes told apart from each other


def _layout(method: str, st_method: str, integer: bool) -> tuple[tuple[tuple[int | str, ...], torch.dtype | None], ...]:
    key = (method, st_method, integer)
    if key not in _LAYOUTS:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily(), torch.no_grad():
            x = torch.linspace(-1.0, 1.0, _PROBE_ROWS * _PROBE_N, dtype=torch.float64).reshape(_PROBE_ROWS, _PROBE_N)
            k = torch.full((_PROBE_ROWS,), float(_PROBE_K), dtype=torch.float64)
            tau = torch.ones(_PROBE_ROWS, dtype=torch.float64)
            residuals = _outputs(x, k, tau, method, st_method, _PROBE_K if integer else 0)[1:]
        named: dict[int, str] = {_PROBE_ROWS: "B", _PROBE_N: "n", **({_PROBE_K: "k"} if integer else {})}
        _LAYOUTS[key] = tuple(
            (tuple(named.get(int(d), int(d)) for d in r.shape), None if r.dtype == torch.float64 else r.dtype)
            for r in residuals
        )
    return _LAYOUTS[key]


@_soft_topk_op.register_fake
def _soft_topk_fake(x: torch.Tensor, k: torch.Tensor, tau: torch.Tensor, method: str, st_method: str,
                    k_static: int, k_max: float) -> list[torch.Tensor]:
    sizes: dict[int | str, Any] = {"B": x.shape[0], "n": x.shape[1], "k": k_static}
    out = [torch.empty_like(x)]
    for shape, dtype in _layout(method, st_method, bool(k_static)):
        out.append(x.new_empty(tuple(sizes.get(d, d) for d in shape), dtype=dtype or x.dtype))
    return out


@torch.library.custom_op("softtopk::soft_topk_backward", mutates_args=())
def _soft_topk_backward_op(residuals: list[torch.Tensor], g: torch.Tensor, method: str, st_method: str) -> list[torch.Tensor]:
    """``[gx (B, n), gk (B,), gtau (B,)]``: the vector-Jacobian products of ``g`` with respect to x, k, tau."""
    from topk_cli import xp

    gx, gk, gtau = xp.backward(method, tuple(residuals), g, st_method=st_method or None)
    return [gx, gk, gtau]


@_soft_topk_backward_op.register_fake
def _soft_topk_backward_fake(residuals: list[torch.Tensor], g: torch.Tensor, method: str, st_method: str) -> list[torch.Tensor]:
    rows = g.shape[0]
    return [torch.empty_like(g), g.new_empty((rows,)), g.new_empty((rows,))]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: list[torch.Tensor]) -> None:
    ctx.method, ctx.st_method = inputs[3], inputs[4]
    ctx.save_for_backward(*output[1:])


def _backward(ctx: Any, grads: list[torch.Tensor]) -> tuple[Any, ...]:
    gx, gk, gtau = _soft_topk_backward_op(list(ctx.saved_tensors), grads[0], ctx.method, ctx.st_method)
    return gx, gk, gtau, None, None, None, None


_soft_topk_op.register_autograd(_backward, setup_context=_setup_context)


def _tracing(x: torch.Tensor) -> bool:
    """True under torch.compile, TorchScript / FX tracing or a torch.func transform (vmap, grad):
    where the values of ``x`` cannot be read."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    if isinstance(x, torch.fx.Proxy):
        return True
    try:
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(x, FakeTensor):
            return True
        return bool(torch._C._functorch.is_functorch_wrapped_tensor(x))
    except (ImportError, AttributeError):  # a release without these internals
        return False


def _per_row(value: Any, name: str, x2: torch.Tensor, batch_shape: tuple[int, ...]) -> torch.Tensor:
    """A ``k`` or ``tau`` given as a tensor (or array-like) as ``(B,)`` rows of x's compute dtype on x's
    device; differentiable (gradients flow back through the broadcast)."""
    if isinstance(value, torch.Tensor):
        t = value
    else:
        try:
            t = torch.as_tensor(value, device=x2.device)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidArgumentError(f"{name} must be a number or a tensor of numbers: {exc}") from None
    if t.dtype == torch.bool or t.is_complex():
        common.refuse_dtype(name, t.dtype)
    shape = common.per_row_shape(name, t.shape, batch_shape)
    t = t.reshape(shape).to(device=x2.device, dtype=x2.dtype)
    return t.broadcast_to(batch_shape).reshape(x2.shape[0])


def soft_topk(
    x: torch.Tensor, k: Any, method: str = common.DEFAULT_METHOD, tau: Any = 1.0, *,
    straight_through: bool | str = False,
) -> torch.Tensor:
    """Smooth top-k weights of ``x / tau`` along the last axis, differentiable, as a torch tensor.

    The same operator and contract as :func:`topk_cli.soft_topk` on numpy arrays: weights in
    ``[0, 1]`` summing to ``k`` per row that tend to the k-hot indicator of the k largest entries as
    ``tau -> 0``; ``-inf`` entries are masked (weight exactly 0; a row needs at least ``k`` unmasked
    entries); the leading axes are a batch.

    Args:
        x: scores ``[..., n]``, a floating-point tensor on any device. float64 and float32 are
            computed in their own precision; bfloat16 and float16 are solved in float32 and the
            weights returned in the input dtype (a threshold solved in 8 or 11 significant bits
            misses the budget ``sum p = k`` by the rounding of each of the n terms and gives
            distinct scores equal weights, which breaks a router).
        k: an ``int``, a real number, or a tensor broadcastable to the batch shape ``x.shape[:-1]``:
            one ``k`` per row. ``grad`` (and ``hard`` with ``straight_through="grad"``) takes one
            integer k for every row, given as a number; its gradient with respect to k is zero.
        method: ``"hard"``, ``"thre-exp"``, ``"thre-laplace"`` (default), ``"thre-sigmoid"``,
            ``"thre-clip"``, ``"thre-cube"`` or ``"grad"`` (aliases such as ``lapsum`` work); the
            other methods run on numpy arrays through :func:`topk_cli.soft_topk`.
        tau: temperature > 0, a number or a tensor broadcastable to the batch shape.
        straight_through: only with ``method="hard"``: ``True`` (``thre-laplace``) or a soft method's
            name gives the hard forward and that method's gradient backward; ``False`` (default):
            the hard operator's gradient, zero.

    Returns:
        The weights, shaped and typed like ``x``. Differentiable with respect to ``x`` and, where
        given as floating-point tensors, ``k`` (methods that take a real k) and ``tau``.

    Raises:
        InvalidArgumentError: a method without a drop-in (the message lists those that have one),
            a bad shape or dtype, or (in eager mode) values the numpy API refuses: NaN or ``+inf``
            in ``x``, ``k`` outside ``1 <= k <= n`` (integer-only methods) or ``0 < k <= n``, fewer
            than ``k`` unmasked entries in a row, ``tau <= 0``. Under ``torch.compile``, tracing or
            ``torch.func`` transforms the value checks are skipped (the values are not known there);
            the shape, dtype and method checks still run.
    """
    name = common.check_method(method, "PyTorch")
    st_method = common.check_straight_through(name, straight_through)
    if not isinstance(x, torch.Tensor):
        raise InvalidArgumentError(
            f"x must be a torch.Tensor, got {type(x).__name__} (topk_cli.soft_topk takes numpy arrays and lists)"
        )
    if x.dtype not in _OWN_PRECISION + _HALF:
        raise InvalidArgumentError(
            f"x must be a floating-point tensor (float64, float32, bfloat16 or float16), got {x.dtype}"
        )
    batch_shape, n = common.check_shape(x.shape)
    compute = x.dtype if x.dtype in _OWN_PRECISION else torch.float32
    x2 = x.reshape(-1, n).to(compute)
    rows = x2.shape[0]
    k_method = common.k_method(name, st_method)
    k_number: int | float | None = None
    k_given: torch.Tensor | None = None
    if common.is_number(k):
        k_number = common.scalar_k(k, k_method, n)
        k_rows = torch.full((rows,), float(k_number), dtype=compute, device=x.device)
    elif not common.takes_real_k(k_method):
        common.refuse_k_array(k_method, k)
    else:
        k_rows = k_given = _per_row(k, "k", x2, batch_shape)
    k_static = 0 if common.takes_real_k(k_method) else int(k_number or 0)
    tau_given: torch.Tensor | None = None
    if common.is_number(tau):
        tau_rows = torch.full((rows,), common.scalar_tau(tau), dtype=compute, device=x.device)
    else:
        tau_rows = tau_given = _per_row(tau, "tau", x2, batch_shape)
    k_max = float(k_number) if k_number is not None else 0.0
    if not _tracing(x):
        from array_api_compat import array_namespace

        common.check_values(array_namespace(x2), x2.detach(), None if k_given is None else k_given.detach(), k_number,
                            None if tau_given is None else tau_given.detach(), batch_shape, k_method)
        if k_given is not None and rows:  # eager: the values are read anyway (above)
            k_max = float(k_given.detach().max())
    p = _soft_topk_op(x2, k_rows, tau_rows, name, st_method, k_static, k_max)[0]
    return p.reshape(x.shape).to(x.dtype)
