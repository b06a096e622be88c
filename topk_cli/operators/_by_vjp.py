"""The Jacobian of a method from its batched VJP: ``J[b, i, :] = e_i^T dp/dz`` (one reverse pass per
row of the identity, vectorised over them), for the methods whose derivative is written only in
reverse mode (``gumbel-topk``, ``coordinate-descent``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from topk_cli.operators._base import FloatArray


def jacobian_from_vjp(vjp_many: Callable[[FloatArray], FloatArray], bsz: int, n: int) -> FloatArray:
    """``dp/dz`` of shape ``(B, n, n)`` from ``vjp_many(V)``, which maps ``V (B, C, n)`` to
    ``V dp/dz (B, C, n)``; masked rows and columns come out 0 because the VJP gives 0 there."""
    eye = np.broadcast_to(np.eye(n), (bsz, n, n))
    return vjp_many(np.ascontiguousarray(eye))
