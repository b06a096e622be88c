"""The fused VJP of ``weighted-softmax``'s fast path (:func:`ws_fast_vjp`) keeps the same bits whatever
the layout of its stored rounds: against the code before its ``s`` buffer was laid out round-major (each
round one contiguous slab), kept below verbatim (as of commit 097c335) as the oracle. The oracle forms
each round's ``f`` again from ``w``, ``1 / S`` and ``f_top``, as the current code does (storing ``f`` too
was measured slower: more memory traffic than the two passes it saves)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_same_bits
from numpy.typing import NDArray

import topk_cli as st
from topk_cli.operators import _weighted_softmax_fast as wsf
from topk_cli.operators._base import FloatArray, Forward
from topk_cli.operators._logsigned import _UNIT, _total_without_largest
from topk_cli.operators._weighted_softmax_fast import (
    _FWD_BLOCK,
    _general_terms,
    _Record,
    _tree_sum,
    _tree_sum_depth,
    _ws_bound,
    _ws_far,
    _ws_weights,
)
from topk_cli.operators.weighted_softmax import _eligible

_VJP_BLOCK = 2**23

# --------------------------------------------------------------------------- the oracle (verbatim)


def ws_fast_vjp(z: FloatArray, k: int, v: FloatArray) -> tuple[Forward, FloatArray]:
    """:func:`ws_fast` (without ``store``) and, on every row, the VJP of its rounds: each block of rows
    runs the rounds with their ``s`` stored into one reused buffer (``f`` is formed again from ``w``,
    ``1 / S`` and ``f_top``, as the forward formed it) and then :func:`_ws_vjp_compact`, so the ``k`` rounds are never held for the whole batch. The bound is
    formed once for the whole batch. Every operation of a row is the one :func:`ws_fast` and
    :func:`_ws_vjp_compact` do on the whole batch: the same bits. Only the certified rows' VJP is
    meaningful (``aux["fast"]``); the caller recomputes the others."""
    bsz, n = z.shape
    top, w, w_min, w2 = _ws_weights(z)
    far = _ws_far(z, w)
    p, q, out = np.zeros_like(z), np.ones_like(z), np.empty_like(z)
    rec = _Record(bsz, k)
    step = max(1, min(_FWD_BLOCK // n, _VJP_BLOCK // (n * k), bsz))
    # reused: no fresh pages per block
    bufs = {"s": np.empty((step, k, n)), "inv": np.empty((step, k)), "c_top": np.empty((step, k)),
            "f_top": np.empty((step, k))}
    scratch = np.empty((step, n)), np.empty((step, n))
    for lo in range(0, bsz, step):
        b = slice(lo, lo + step)
        nb = min(step, bsz - lo)
        blk = {name: val[:nb] for name, val in bufs.items()}
        _ws_run(w[b], top[b], w2[b], k, p[b], q[b], rec.view(b), blk, (scratch[0][:nb], scratch[1][:nb]))
        fwd = Forward(p=p[b], q=q[b])
        fwd.aux = {**blk, "top": top[b].astype(np.float64)}
        with np.errstate(over="ignore", invalid="ignore"):  # uncertified rows may overflow: recomputed
            out[b] = _ws_vjp_compact(fwd, w[b], k, -v[b])
    e_p, certified = _ws_bound(rec, w2, w_min, q[np.arange(bsz), top], k, n, far)
    whole = Forward(p=p, q=q)
    whole.aux = {"error_estimate": e_p, "fast": certified.astype(np.float64)}
    return whole, out


def _ws_run(
    w: FloatArray, top: NDArray[np.intp], w2: FloatArray, k: int, p: FloatArray, q: FloatArray, rec: _Record,
    out: dict[str, FloatArray] | None, scratch: tuple[FloatArray, FloatArray],
) -> None:
    """The ``k`` linear rounds of :func:`ws_fast` on a block of rows (``p`` and ``q`` updated in place),
    recording in ``rec`` what the bound reads. With ``out``, each round's ``1 / S`` and ``c_top = X / S``
    go to ``out["inv"]`` and ``out["c_top"]`` (``(b, k)``), ``s`` and ``f`` to ``out["s"]`` and
    ``out["f"]`` (``(b, k, n)``) if present (else to ``scratch``) and ``f_top`` to ``out["f_top"]`` if
    present."""
    u = _UNIT
    rows = np.arange(w.shape[0])
    gamma = 1.01 * (_tree_sum_depth(w.shape[1]) + 1) * u
    positive = np.ones(w.shape[0], dtype=bool)  # every non-top q > 0 (then A = X)
    uu = np.empty_like(w)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # blown-up bounds: not certified
        for t in range(k):
            q_top = q[rows, top]
            np.multiply(q, w, out=uu)
            uu[rows, top] = 0.0
            x_sum = _tree_sum(uu)
            total = x_sum + q_top
            inv = 1.0 / total
            s = out["s"][:, t] if out is not None and "s" in out else scratch[0]
            f = out["f"][:, t] if out is not None and "f" in out else scratch[1]
            np.multiply(uu, inv[:, None], out=s)
            s[rows, top] = q_top * inv
            np.multiply(w, -inv[:, None], out=f)  # -fl(w / S), exactly
            f += 1.0
            f[rows, top] = (x_sum - (1.0 - q_top)) * inv
            if out is not None:
                out["inv"][:, t], out["c_top"][:, t] = inv, x_sum * inv
                if "f_top" in out:
                    out["f_top"][:, t] = f[rows, top]
            shortcut = positive & (total > w2 * (1.0 + 8.0 * u))
            slow = np.flatnonzero(~shortcut)
            if slow.size:  # S below some w_i, or some q_i < 0: per-entry passes on those rows
                rec["a_sum"][t, slow], rec["g_max"][t, slow], rec["f_low"][t, slow], f_min = _general_terms(
                    uu[slow], w[slow], f[slow], top[slow], np.abs(total[slow]), gamma)
                positive[slow] &= f_min > 0
            rec["q_top"][t], rec["x_sum"][t], rec["shortcut"][t], rec["positive"][t] = q_top, x_sum, shortcut, positive
            p += s
            q *= f


def _ws_vjp_compact(fwd: Forward, w: FloatArray, k: int, qbar: FloatArray) -> FloatArray:
    """:func:`~topk_cli.operators.weighted_softmax._ws_vjp` on the fast path's compact aux (``qbar = -v``, updated in place): the same reverse
    mode, with ``rho = w / S`` and ``c = 1 - s`` folded into the updates (``s_i X_i - c_i g_i = s_i
    total - g_i`` where ``X_i = total - g_i``), so that neither is formed as an array. Without a stored
    ``f``, each round's is formed again from ``w``, ``1 / S`` and ``aux["f_top"]``, the same bits."""
    aux = fwd.aux
    rows = np.arange(w.shape[0])
    top = aux["top"].astype(np.int64)
    zbar = np.zeros_like(qbar)
    g, tmp = np.empty_like(qbar), np.empty_like(qbar)
    f_buf = None if "f" in aux else np.empty_like(qbar)
    for t in reversed(range(k)):
        s, c_top = aux["s"][:, t], aux["c_top"][:, t]
        if f_buf is None:
            f = aux["f"][:, t]
        else:  # f = fl(1 - fl(w fl(1 / S))) and f_top, as the forward formed them
            f = np.multiply(w, -aux["inv"][:, t, None], out=f_buf)
            f += 1.0
            f[rows, top] = aux["f_top"][:, t]
        np.multiply(s, qbar, out=g)  # minus the cotangent of c dz - X
        # X_i = sum_{j != i} g_j is total - g_i except at the entry of largest |g|: rest there
        total, big, rest = _total_without_largest(g, rows, tmp)
        g_big = g[rows, big]
        s_big, s_top, g_top = s[rows, big], s[rows, top], g[rows, top]
        zbar_big, zbar_top = zbar[rows, big], zbar[rows, top]
        zbar += np.multiply(s, total[:, None], out=tmp)
        zbar -= g
        # the two entries with their own terms: the top (c_top = X / S, stored), then the entry of largest
        # |g| (X = rest; its c is c_top if it is the top)
        zbar[rows, top] = zbar_top + s_top * (total - g_top) - c_top * g_top
        zbar[rows, big] = zbar_big + s_big * rest - np.where(big == top, c_top, 1.0 - s_big) * g_big
        qbar *= f
        qbar += np.multiply(w, (aux["inv"][:, t] * total)[:, None], out=tmp)
    return zbar


# --------------------------------------------------------------------------- the tests


def _batches() -> list[tuple[np.ndarray, int]]:
    """Seeded batches (``max z = 0`` per row, as the fast path takes them): n in 1..300, k in 1..n,
    spreads from 0.1 to 60 (some rows uncertified, the top saturating), rows with far entries (below
    -700, several below -745 where ``e^z`` is 0), ties, and rows near a pole (uncertified)."""
    rng = np.random.default_rng(20261124)
    out = []
    for n in (1, 2, 3, 7, 31, 64, 150, 300):
        for spread in (0.1, 1.0, 8.0, 60.0):
            bsz = int(rng.integers(3, 9))
            z = spread * rng.standard_normal((bsz, n))
            if n > 2:
                z[0, : n // 2] = z[0, n // 2]  # ties
                z[1, rng.integers(0, n, size=max(1, n // 4))] = -700.0 - rng.choice([1e-9, 5.0, 45.0, 1e4])
            z -= z.max(axis=-1, keepdims=True)
            for k in sorted({1, n, int(rng.integers(1, n + 1)), max(1, n // 2)}):
                out.append((z, k))
    # a pole (k >= 3: the faithful path refuses it) and saturated tops: uncertified rows in a batch
    pole = 1.29767596828515988 * (1.0 + 1e-5) * np.array([3.0, 2.0, 1.0, 0.0])
    z = np.vstack([pole, [0.1, 0.4, -0.3, 0.2], [0.0, -1000.0, -1.0, -2.0], [40.0, 0.0, -3.0, -0.5]])
    out.append((z - z.max(axis=-1, keepdims=True), 3))
    return out


def _fast_rows(z: np.ndarray) -> np.ndarray:
    assert _eligible(z).all()
    return z


def _same(new: tuple[Forward, FloatArray], old: tuple[Forward, FloatArray]) -> None:
    (a, g_a), (b, g_b) = new, old
    for name in ("p", "q"):
        assert_same_bits(getattr(a, name), getattr(b, name), name)
    assert set(a.aux) == set(b.aux) == {"fast", "error_estimate"}
    for name in ("fast", "error_estimate"):
        assert_same_bits(a.aux[name], b.aux[name], name)
    # every row: on uncertified ones too (the caller discards them, but they are the same operations)
    assert_same_bits(g_a, g_b, "vjp")


def test_the_fused_vjp_keeps_the_bits_of_the_oracle() -> None:
    rng = np.random.default_rng(7)
    certified = uncertified = far = 0
    for z, k in _batches():
        v = rng.standard_normal(z.shape)
        with np.errstate(all="ignore"):
            new, old = wsf.ws_fast_vjp(_fast_rows(z), k, v), ws_fast_vjp(z, k, v)
        _same(new, old)
        ok = new[0].aux["fast"] > 0
        certified += int(ok.sum())
        uncertified += int((~ok).sum())
        far += int((ok & (z < -700.0).any(axis=-1)).sum())
    assert certified > 100 and uncertified > 10 and far > 5  # every kind of row was exercised


@pytest.mark.parametrize("blocks", [(1, 1), (2000, 2**14)])
def test_row_blocks_leave_the_bits(monkeypatch: pytest.MonkeyPatch, blocks: tuple[int, int]) -> None:
    # blocks of one row (and of a few rows) against the oracle's blocks
    rng = np.random.default_rng(3)
    z = st.scaled_scores(rng.standard_normal((13, 120)), 20, tau=0.2)
    z -= z.max(axis=-1, keepdims=True)
    v = rng.standard_normal(z.shape)
    with np.errstate(all="ignore"):
        old = ws_fast_vjp(z, 20, v)
        monkeypatch.setattr(wsf, "_FWD_BLOCK", blocks[0])
        monkeypatch.setattr(wsf, "_VJP_BLOCK", blocks[1])
        _same(wsf.ws_fast_vjp(z, 20, v), old)
    assert 0 < old[0].aux["fast"].sum()
