"""The drop-in operators' maths written once, against the Python array API standard.

:func:`forward` and :func:`backward` take ``(B, n)`` arrays of any array-API namespace (numpy through
``array_api_compat.numpy``, PyTorch, ``jax.numpy``) in float32 or float64, compute on the input's
device in its dtype, and never read a value back from an accelerator, so they run under ``jax.jit``
and on accelerators (the one data-dependent choice, whether ``thre-clip``'s and ``thre-cube``'s
partial selection holds their threshold's support, is ``lax.cond`` under JAX and one boolean read on
the CPU; on an accelerator PyTorch sorts instead). The adapters (``topk_cli.frameworks``) validate and shape the inputs (last axis, batch
flattened to B rows) and wire :func:`backward` into their autodiff; these functions do maths only.
The numpy engine (``topk_cli.operators``) stays the reference they are tested against.

Conventions: ``x`` may hold ``-inf`` (masked: weight exactly 0; ``k`` counts unmasked entries only);
``k`` and ``tau`` are ``(B,)`` arrays of ``x``'s dtype, ``tau > 0``, ``0 < k <= #unmasked``. ``z = (x - max x) / tau`` per row.
"""

from __future__ import annotations

from topk_cli.xp._common import Array, namespace, scaled
from topk_cli.xp._grad import grad_backward, grad_forward
from topk_cli.xp._hard import hard_backward, hard_forward
from topk_cli.xp._threshold import SOLVERS, threshold_backward, threshold_forward

#: The methods these functions compute.
DROPIN_METHODS: tuple[str, ...] = (
    "hard", "thre-exp", "thre-laplace", "thre-sigmoid", "thre-clip", "thre-cube", "grad",
)
#: Those that take a real ``k`` (and one per row); ``grad`` takes one integer ``k`` for every row
#: (``forward``'s ``k_static``).
REAL_K_METHODS: tuple[str, ...] = ("hard", "thre-exp", "thre-laplace", "thre-sigmoid", "thre-clip", "thre-cube")


def _check_method(method: str, st_method: str | None) -> None:
    if method not in DROPIN_METHODS:
        raise ValueError(f"unknown method {method!r}; the array-API core computes {', '.join(DROPIN_METHODS)}")
    if st_method is not None:
        if method != "hard":
            raise ValueError(f"st_method is for method 'hard' only, got method {method!r}")
        if st_method not in DROPIN_METHODS or st_method == "hard":
            raise ValueError(f"st_method must be a soft method of {', '.join(DROPIN_METHODS[1:])}, got {st_method!r}")


def _grad_k(k_static: int | None, n: int) -> int:
    if k_static is None:
        raise ValueError("method 'grad' needs k_static, its integer k (the same for every row, static under jax.jit)")
    if isinstance(k_static, bool) or not isinstance(k_static, int) or not 1 <= k_static <= n:
        raise ValueError(f"k_static must be an integer in [1, n={n}] for method 'grad', got {k_static!r}")
    return k_static


def forward(x: Array, k: Array, tau: Array, method: str, *, st_method: str | None = None,
            k_static: int | None = None, k_max: float | None = None) -> tuple[Array, tuple[Array, ...]]:
    """``(p, residuals)`` of ``method`` on the rows of ``x`` (``(B, n)``), ``k`` and ``tau`` (``(B,)``).

    ``p`` has ``x``'s shape and dtype; ``residuals`` is a tuple of arrays, what :func:`backward`
    needs. ``st_method`` (``method="hard"`` only): the soft method whose gradient a straight-through
    estimator uses; then the residuals are that method's.

    ``k_static`` (``grad`` only, required there): ``k`` as a Python ``int``, the same for every row
    (``k`` must hold that value; it is not read, so that nothing goes back to the host) and static
    under ``jax.jit``: the program's shapes depend on it.

    ``k_max``: a Python number with ``k <= k_max`` on every row, known without reading ``k`` (the
    adapters pass a scalar ``k``). With it, ``hard``, ``thre-exp``, ``thre-laplace`` and
    ``thre-sigmoid`` select the few largest entries of each row (``ceil(k_max)``, or
    ``floor(2 k_max) + 2``) instead of sorting it, when that is at most a quarter of the row; the
    result is the same to rounding. Without it (a ``k`` array whose values are not read) rows are sorted.
    """
    _check_method(method, st_method)
    xp = namespace(x, k, tau)
    z, fin = scaled(xp, x, tau)
    if method == "hard":
        p, residuals = hard_forward(xp, z, fin, k, k_max)
        if st_method is not None:
            _, residuals = forward(x, k, tau, st_method, k_static=k_static, k_max=k_max)
        return p, residuals
    if method == "grad":
        return grad_forward(xp, z, _grad_k(k_static, x.shape[1]), tau)  # masked entries: pi = 0, p = 0
    if method in SOLVERS:
        return threshold_forward(xp, method, z, fin, k, tau, k_max)
    raise NotImplementedError(f"method {method!r} is not implemented yet in the array-API core")


def backward(method: str, residuals: tuple[Array, ...], g: Array, *,
             st_method: str | None = None) -> tuple[Array, Array, Array]:
    """``(g_x, g_k, g_tau)``: the vector-Jacobian products of :func:`forward`'s ``p`` with the
    cotangent ``g`` (``(B, n)``) with respect to ``x`` (``(B, n)``), ``k`` and ``tau`` (``(B,)``).

    ``hard`` is piecewise constant in ``x`` and ``tau`` (``g_x``
    and ``g_tau`` are 0) and piecewise linear in ``k``: ``g_k = sum_at g / #at`` over the entries
    tied at the cut (from below at an integer k), as the numpy engine's ``dp/dk``. With ``st_method`` the products are that method's
    (straight-through: hard forward, soft backward).

    ``grad``: ``g_k`` is 0 (``k`` is an integer) and ``g_x``, ``g_tau`` are exact, by forward mode
    through the program (the Jacobian is symmetric); its residuals carry ``k_static`` in a shape,
    so :func:`backward` needs nothing more.
    """
    _check_method(method, st_method)
    xp = namespace(g, *residuals)
    name = st_method if st_method is not None else method
    if name == "hard":
        return hard_backward(xp, residuals, g)
    if name == "grad":
        return grad_backward(xp, residuals, g)
    if name in SOLVERS:
        return threshold_backward(xp, residuals, g)
    raise NotImplementedError(f"method {name!r} is not implemented yet in the array-API core")


__all__ = ["DROPIN_METHODS", "REAL_K_METHODS", "backward", "forward"]
