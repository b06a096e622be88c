"""The adversarial inputs on which the PyTorch and JAX drop-ins are compared with the numpy engine.

Each case is numpy data (float64): scores ``x``, ``k`` (a number or one per row), ``tau`` (a number
or one per row) and a cotangent ``v``; the drop-in tests convert them to their framework. The
reference is :func:`topk_cli.soft_topk` and :func:`topk_cli.vjp` on the same float64 data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import topk_cli as st
from topk_cli.frameworks.dropin_common import takes_real_k


@dataclass(frozen=True)
class Case:
    name: str
    x: np.ndarray
    k: Any  # a number, or an array of the batch shape
    tau: Any  # a number, or an array of the batch shape
    v: np.ndarray

    @property
    def per_row_k(self) -> bool:
        return isinstance(self.k, np.ndarray)

    @property
    def real_k(self) -> bool:
        k = np.asarray(self.k, dtype=float)
        return bool((k != np.floor(k)).any())

    def applies_to(self, method: str) -> bool:
        """Integer-only methods take one integer k (static under jax.jit)."""
        return takes_real_k(method) or not (self.per_row_k or self.real_k)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def cases() -> list[Case]:
    out = []

    def add(name: str, x: np.ndarray, k: Any, tau: Any = 1.0, seed: int = 0) -> None:
        v = _rng(100 + seed).standard_normal(x.shape)
        out.append(Case(name, np.asarray(x, dtype=np.float64), k, tau, v))

    add("offset 1e6", 1e6 + _rng(1).standard_normal((4, 9)), 3, 0.5, 1)
    add("spread 1e3", 1e3 * _rng(2).standard_normal((4, 9)), 2, 50.0, 2)
    add("ties straddling rank k", np.array([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0], [5.0, 5.0, 5.0, 1.0, 0.0, -1.0]]), 2, 0.7, 3)
    add("k = 1", _rng(4).standard_normal((3, 7)), 1, 0.3, 4)
    add("k = n", _rng(5).standard_normal((3, 7)), 7, 1.0, 5)
    masked = _rng(6).standard_normal((3, 8))
    masked[0, [1, 4]] = -np.inf
    masked[2, [0, 2, 3, 5]] = -np.inf
    add("masks", masked, 2, 0.5, 6)
    add("real k", _rng(7).standard_normal((3, 8)), 2.5, 0.4, 7)
    add("per-row k and tau", _rng(8).standard_normal((4, 10)), np.array([1.0, 2.5, 4.0, 9.5]),
        np.array([0.2, 1.0, 3.0, 0.05]), 8)
    add("batch (2, 3, n)", _rng(9).standard_normal((2, 3, 6)), 2, 0.8, 9)
    add("batch (2, 3, n), per-row k", _rng(10).standard_normal((2, 3, 6)),
        np.array([[1.0, 1.5, 2.0], [3.0, 5.5, 6.0]]), 0.6, 10)
    add("vector", _rng(11).standard_normal(12), 4, 0.25, 11)
    return out


def reference(case: Case, method: str, st_method: str = "") -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The numpy engine's weights and VJPs ``{"x", "k", "tau"}`` (``k``: zeros for integer-only methods)
    for ``method`` (with ``st_method``: the hard forward and that method's VJPs)."""
    p = st.soft_topk(case.x, case.k, method, tau=case.tau)
    grad_method = st_method or method
    batch = case.x.shape[:-1]
    if takes_real_k(grad_method):
        gx, gk, gtau = st.vjp(case.x, case.k, case.v, grad_method, tau=case.tau, wrt=("x", "k", "tau"))
    else:
        gx, gtau = st.vjp(case.x, case.k, case.v, grad_method, tau=case.tau, wrt=("x", "tau"))
        gk = np.zeros(batch)
    return p, {"x": gx, "k": np.broadcast_to(gk, batch), "tau": np.broadcast_to(gtau, batch)}


def error(got: Any, want: np.ndarray) -> float:
    """The largest error of ``got`` relative to the max-norm of ``want`` (at least 1); 0 when equal."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    return float(np.max(np.abs(got - want))) / scale if want.size else 0.0


def stacked(method: str) -> Case:
    """Every case that applies to ``method`` as one ``(R, N)`` batch: rows padded with ``-inf`` (masked,
    so the operator sees the case's rows unchanged), ``k`` and ``tau`` per row. Integer-only methods
    take the cases with ``k = 2`` (one static k). One call instead of one per case: a JAX function is
    compiled once per shape."""
    chosen = [c for c in cases() if c.applies_to(method) and (takes_real_k(method) or c.k == 2)]
    width = max(c.x.shape[-1] for c in chosen)
    xs, ks, taus, vs = [], [], [], []
    for c in chosen:
        x = c.x.reshape(-1, c.x.shape[-1])
        rows, n = x.shape
        pad = np.full((rows, width - n), -np.inf)
        xs.append(np.concatenate([x, pad], axis=1))
        vs.append(np.concatenate([c.v.reshape(rows, n), np.zeros((rows, width - n))], axis=1))
        ks.append(np.broadcast_to(c.k, c.x.shape[:-1]).reshape(rows))
        taus.append(np.broadcast_to(c.tau, c.x.shape[:-1]).reshape(rows))
    k: Any = np.concatenate(ks) if takes_real_k(method) else 2
    return Case(f"{len(chosen)} cases stacked", np.concatenate(xs), k, np.concatenate(taus), np.concatenate(vs))
