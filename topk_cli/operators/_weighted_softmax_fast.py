"""``weighted-softmax`` in plain float64 with a rigorous forward error bound: the certified fast path
in front of the faithful signed-log-space computation of :mod:`~topk_cli.operators.weighted_softmax`.

Rows this path cannot certify are recomputed faithfully by the caller, row by row.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from topk_cli.operators._base import FloatArray, Forward
from topk_cli.operators._logsigned import _UNIT, _total_without_largest
from topk_cli.operators._logspace import exp_new

#: A row is returned from the fast path only if its certified bound on the absolute error of ``p`` is
#: at most this (the faithful path is measured within 1e-12 on the rows it returns) ...
FAST_P_BOUND = 1e-12
#: ... and the bound on the relative error of every ``1 - p_i`` is at most this (the complement is
#: reported relatively accurately, as the faithful path does).
FAST_Q_BOUND = 1e-10
#: Entries ``z_j >= -FAST_MAX_GAP`` ("near") have a normal ``e^{z_j}`` (``e^{-700}`` is 2^-1010), which
#: keeps its relative accuracy (products ``q_j e^{z_j}`` are guarded separately, see :data:`_TINY`);
#: the others ("far") may have a subnormal or zero ``e^{z_j}``, whose errors the bound of
#: :func:`ws_fast` takes as absolute (:data:`_EXP_ABS`).
FAST_MAX_GAP = 700.0
#: Error allowed for one float64 ``np.exp``, in units of ``u``: 4 ulps (8 u), a generous margin over
#: the < 1 ulp of glibc's ``exp`` and numpy's vectorised one (``exp(0) = 1`` is exact).
_EXP_ERR = 8.0
#: Absolute error allowed for ``np.exp`` at a far entry (``z < -``:data:`FAST_MAX_GAP`): 8 * 2^-1022.
#: Where ``e^z >= 2^-1022`` the 8 ``u`` above give at most ``8 u e^{-700} < 2^-1059``; below, the exact
#: value is under 2^-1022, so this holds for any result in ``[0, 7 * 2^-1022]``: even for an ``exp``
#: that loses every digit of a subnormal result (this is 2^55 subnormal ulps). Measured (numpy 2.4,
#: this machine's SIMD ``exp``, 350,001 points of ``[-746, -700]`` against mpmath): at most 0.502 ulp,
#: 2049 * 2^-1074 absolute (in the normal part), about 2^44 times below this.
_EXP_ABS = 8.0 * 2.0**-1022
#: Absolute rounding error of one float64 product or quotient whose result is subnormal (bounded
#: generously: half of it would do).
_SUBNORMAL = 2.0**-1074
#: Smallest ``|q_i| e^{z_i}`` (a lower bound, per row) the relative bounds hold for: products and
#: quotients above the float64 normal range (2^-1022) round to ``u`` relative.
_TINY = 2.0**-1020


def ws_fast(z: FloatArray, k: int, *, store: bool = True) -> Forward:
    """The ``k`` rounds of ``weighted-softmax`` in linear float64, with a certified error bound per row.

    Rows must be free of masked entries and have ``max z = 0``; entries below ``-``:data:`FAST_MAX_GAP`
    ("far", set ``F``) are allowed, see the last part of the bound.
    One ``exp`` pass for the whole computation: ``w = e^z`` (``w_top = 1`` exactly for the first
    maximal entry, "top"). Per round, ``u = q w``, ``X = sum_{j != top} u_j`` (:func:`_tree_sum`),
    ``S = X + q_top``, ``s = u / S``, ``p <- p + s`` and ``q_i <- q_i f_i`` with ``f_i = 1 - w_i / S``
    (``= V_i / S``, ``V_i = S - w_i``), except for the top entry, whose ``V_top = X - (1 - q_top)`` is
    formed without subtracting ``w_top`` from a sum that contains it (``f_top`` is relatively accurate
    even when the top entry saturates). ``q`` is thus carried as a product, never as ``1 - p``.

    The bound (each float64 operation ``u = 2^-53`` relative; ``exp`` :data:`_EXP_ERR` ``u``; a sum of
    ``m`` terms in any order ``(m - 1) u`` of the sum of the magnitudes, ``gamma`` for :func:`_tree_sum`)
    tracks per row ``r`` (non-top entries) and ``r_top``, bounds on the relative errors of ``q``, and
    ``e_p``, a bound on the absolute error of ``p``. With ``A = sum_{j != top} |u_j|``:

    * ``|dS| <= (r + eps_exp + u + gamma) A + r_top |q_top| + u |S|``; ``rho_S = |dS| / |S|``;
    * non-top ``f_i = 1 - w_i / S``: relative error ``G (eps_exp + rho_S + 2 u) + u`` with
      ``G = max_{i != top} w_i / |S f_i|`` (first order: ``d f_i / f_i = (w_i / V_i)(dS / S - dw_i / w_i)``);
      where ``S > w_2`` (the largest non-top ``w``), ``G = w_2 / (S - w_2)`` with no pass over the row;
    * ``f_top = (X - (1 - q_top)) / S``: relative error ``(|dX| + r_top |q_top|) / |S V_top| + u
      |1 - q_top| / |V_top| + 4 u`` (``S - V_top = 1``: errors of ``X`` and ``q_top`` enter both and
      mostly cancel);
    * ``r <- r + (error of f) + u``, likewise ``r_top``;
    * ``s_top = q_top / (q_top + X)``: relative error ``r_top |1 - s_top| + |dX| / |S| + 3 u`` (the error
      of ``q_top`` enters ``S`` too: a saturated ``s_top`` stays accurate to ``O(u)``);
    * ``e_p <- e_p + max(|s_top| (error of s_top), (kappa_S - |s_top|)(r + eps_exp + rho_S + 3 u)) + u P``,
      ``kappa_S = (A + |q_top|) / |S| = sum_i |s_i|`` (so ``kappa_S - |s_top| >= max_{i != top} |s_i|``)
      and ``P = sum kappa_S >= max |p_i|``; where every ``q_i`` stays positive, every ``s_i >= 0`` and
      ``p_i = sum_t s_i < 1``, so ``e_p`` is also at most the largest relative error of an ``s_i`` plus
      ``k u`` (the smaller of the two is kept: the second does not grow as ``k^2``).

    First-order terms carry a factor 1.01: a row is only certified when every relative error above is
    below 1e-6 (those of ``q`` and ``f`` by the final checks, those of ``S`` and ``V_top`` by checks in
    every round), so the neglected second-order terms are below 1e-6 of the first-order ones.
    ``|q_i| w_i`` stays above :data:`_TINY` (tracked through the lower bound ``min |f_i|``), so no
    product underflows; a subnormal ``s_i`` adds at most ``2^-1074`` to ``p``, far inside the final
    ``1 + 32 k u``, which covers the rounding of the bound itself.

    Far entries (``z_j < -``:data:`FAST_MAX_GAP`): ``w_j = e^{z_j}`` may be subnormal or 0, so its error
    is taken as absolute, ``|dw_j| <= E`` (:data:`_EXP_ABS`), and every product or quotient with a
    subnormal result as ``u`` relative plus ``eta = 2^-1074`` absolute (:data:`_SUBNORMAL`). The terms above
    stay as they are (their relative ``eps_exp`` is then only an over-estimate for these entries) and
    these are added, per row with ``|F| > 0`` (rows without far entries get exactly today's bound):

    * computed far ``q_j`` are bounded: ``q_j = 1`` at first, and each round's ``f_j = fl(1 - fl(w_j
      fl(1 / S)))`` (``S`` of either sign: a top entry's ``q`` may go negative) lies within ``1 +- g``,
      ``g = w_F |fl(1 / S)| (1 + 8 u)``, ``w_F`` the largest computed far ``w``; so ``0 < f_F = (1 - g)(1
      - 4 u) <= f_j`` and ``|q_j f_j| <= |q_j| (1 + g)(1 + 4 u)`` (rounding included), and ``Q``, the
      product of those factors over the earlier rounds, bounds ``|q_j|``. A row is certified only if
      ``f_F > 0`` in every round (so the products ``q_j f_j`` never underflow either);
    * ``u_j = fl(q_j w_j)`` errs, beyond the relative terms (``r``, ``u``) already in ``|dS|``, by
      ``|q_j| |dw_j| + eta <= Q E + eta``: ``|dS|`` (through ``|dX|``) gains ``delta_F = |F| (Q E + eta)``,
      and ``rho_S``, ``f_top``, ``s_top`` and the non-top ``s_i`` follow from ``|dS|`` as above;
    * far ``s_j = fl(u_j fl(1 / S))`` errs, beyond its relative terms, by ``(Q E + eta) / |S| + eta``:
      ``e_p`` gains that per round (also in the sum-of-``s`` form for all-positive rows);
    * far ``f_j``: ``fl(w_j fl(1 / S))`` errs, beyond the ``G`` terms, by ``E / |S| + eta``, so the
      relative error of ``f_j`` (and the non-top ``r``) gains ``(E / |S| + eta) / f_F``;
    * the :data:`_TINY` guard ``min |q_i| min w_i`` runs over the near entries only (far products may be
      subnormal: their error is charged above).

    Rows where the far entries carry a share of ``S`` that matters are not certified: ``S`` is then
    within a factor ~10^12 of ``delta_F`` (at least 8 * 2^-1022), so ``rho_S`` or ``e_p`` exceeds the limits
    below, or ``q_top`` fell under :data:`_TINY` (``[0, -1000]`` at ``k = 2``, where the far entry gets half
    a unit in round two); they go to the faithful path.

    A row is returned (``aux["fast"] = 1``) when ``e_p <=`` :data:`FAST_P_BOUND` and ``r, r_top <=``
    :data:`FAST_Q_BOUND`; ``aux["error_estimate"]`` is then ``e_p``. ``aux`` holds ``s`` and ``f`` per
    round as the faithful path does, but ``rho = e^z / S`` and ``c = 1 - s`` only compactly: ``1 / S``
    (``inv``) and ``c_top = X / S`` per round and the ``top`` entry (fewer pages to fault in: see
    :func:`_ws_rounds`), and none of the log-space copies (see
    :func:`~topk_cli.operators.weighted_softmax._ws_log_aux`). Without ``store``, ``aux`` holds only
    ``fast`` and ``error_estimate`` (the rounds run in two reused ``(B, n)`` buffers, the same bits).
    """
    return _ws_fast_w(z, k, store)[0]


def _ws_fast_w(z: FloatArray, k: int, store: bool) -> tuple[Forward, FloatArray]:
    """:func:`ws_fast` and its ``w = e^z`` (``w_top = 1``), which the VJP reads. Rows run in blocks of
    :data:`_FWD_BLOCK` entries (every round of a block in cache); without ``store`` into two reused
    scratch buffers."""
    bsz, n = z.shape
    top, w, w_min, w2 = _ws_weights(z)
    far = _ws_far(z, w)
    p, q = np.zeros_like(z), np.ones_like(z)
    rec = _Record(bsz, k)
    aux: dict[str, FloatArray] = {}
    if store:
        aux = {"s": np.empty((bsz, k, n)), "f": np.empty((bsz, k, n)), "inv": np.empty((bsz, k)),
               "c_top": np.empty((bsz, k))}
    step = max(1, _FWD_BLOCK // n)
    width = min(step, bsz)
    scratch = np.empty((width, n)), np.empty((width, n))
    for lo in range(0, bsz, step):
        b = slice(lo, lo + step)
        nb = min(step, bsz - lo)
        out = {name: val[b] for name, val in aux.items()} if store else None
        _ws_run(w[b], top[b], w2[b], k, p[b], q[b], rec.view(b), out, (scratch[0][:nb], scratch[1][:nb]))
    e_p, certified = _ws_bound(rec, w2, w_min, q[np.arange(bsz), top], k, n, far)
    fwd = Forward(p=p, q=q)
    if store:
        aux["top"] = top.astype(np.float64)
    fwd.aux = {**aux, "error_estimate": e_p, "fast": certified.astype(np.float64)}
    return fwd, w


#: Entries ``rows x n`` of one row block of :func:`ws_fast`: every round of a block runs on arrays that
#: stay in cache.
_FWD_BLOCK = 2**16
#: Largest number of entries of one row block's stored rounds (``s``, ``rows x k x n``) in
#: :func:`ws_fast_vjp` (its blocks are otherwise those of the forward): 2^23 (64 MiB) whatever the
#: batch, so the memory of a VJP is ``O(B n)`` plus this.
_VJP_BLOCK = 2**23


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
    # reused: no fresh pages per block. ``s`` is laid out round-major, ``(k, rows, n)`` seen as ``(rows, k, n)``,
    # so each round's ``s[:, t]`` is one contiguous slab for the forward's writes and the reverse pass's
    # reads (not rows of n entries k n apart): the same operations, ~15-20 % less time at k = 100
    bufs = {"s": np.empty((k, step, n)).transpose(1, 0, 2), "inv": np.empty((step, k)),
            "c_top": np.empty((step, k)), "f_top": np.empty((step, k))}
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


def _ws_weights(z: FloatArray) -> tuple[NDArray[np.intp], FloatArray, FloatArray, FloatArray]:
    """``top`` (the first maximal entry), ``w = e^z`` with ``w_top = 1`` exactly, ``min w`` over the near
    entries (``z >= -``:data:`FAST_MAX_GAP`) and ``w_2`` (the largest non-top ``w``), per row."""
    bsz, n = z.shape
    rows = np.arange(bsz)
    top = np.argmax(z, axis=-1)
    w = exp_new(z)  # far rows: most entries below -750
    w[rows, top] = 1.0
    w_min = np.min(w, axis=-1)
    w_rest = w.copy()
    w_rest[rows, top] = -np.inf
    w2 = np.maximum(np.max(w_rest, axis=-1), 0.0) if n > 1 else np.zeros(bsz)  # largest non-top w
    is_far = z < -FAST_MAX_GAP
    if is_far.any():
        w_min = np.where(is_far.any(axis=-1), np.min(np.where(is_far, np.inf, w), axis=-1), w_min)
    return top, w, w_min, w2


def _ws_far(z: FloatArray, w: FloatArray) -> tuple[FloatArray, FloatArray] | None:
    """Per row, the number of far entries (``z < -``:data:`FAST_MAX_GAP`) and their largest computed ``w``;
    None when no row has one (the bound then runs without the far terms at all)."""
    is_far = z < -FAST_MAX_GAP
    if not is_far.any():
        return None
    return is_far.sum(axis=-1).astype(np.float64), np.max(np.where(is_far, w, 0.0), axis=-1)


class _Record:
    """What the bound of :func:`ws_fast` reads of each round, ``(k, B)`` per quantity: ``q_top``, ``X``,
    whether the shortcut held, whether every non-top ``q`` stayed positive, and on the rows without the
    shortcut the row terms of :func:`_general_terms` (``A``, ``G``, ``min |f_i|``)."""

    def __init__(self, bsz: int, k: int, arrays: dict[str, np.ndarray] | None = None) -> None:
        self.arrays = arrays if arrays is not None else {
            name: np.zeros((k, bsz), dtype=bool if name in ("shortcut", "positive") else np.float64)
            for name in ("q_top", "x_sum", "shortcut", "positive", "a_sum", "g_max", "f_low")
        }

    def view(self, b: slice) -> _Record:
        return _Record(0, 0, {name: val[:, b] for name, val in self.arrays.items()})

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


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


def _ws_bound(
    rec: _Record, w2: FloatArray, w_min: FloatArray, q_top_end: FloatArray, k: int, n: int,
    far: tuple[FloatArray, FloatArray] | None = None,
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """The bound of :func:`ws_fast` from the rounds' record (the docstring there): ``e_p`` (``1 + 32 k
    u`` included) and whether the row is certified. Terms that do not depend on the propagated errors
    are formed for every round at once. ``far`` (per row: number of far entries, their largest ``w``)
    adds the far entries' absolute terms; on rows without far entries those are exact zeros, added
    to the same values, so those rows' bits are those of the bound without them."""
    u = _UNIT
    eps_w = _EXP_ERR * u
    gamma = 1.01 * (_tree_sum_depth(n) + 1) * u
    q_top, x_sum, shortcut = rec["q_top"], rec["x_sum"], rec["shortcut"]
    bsz = w2.shape[0]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # blown-up bounds: not certified
        total = x_sum + q_top
        inv = 1.0 / total
        one_minus = 1.0 - q_top
        v_top = x_sum - one_minus
        c_top = np.abs(x_sum * inv)
        s_abs = np.abs(total)
        a_sum = np.where(shortcut, x_sum * (1.0 + gamma), rec["a_sum"])
        # computed f_i = fl(1 - fl(w_i fl(1 / S))) >= (1 - (w_2 / S)(1 + 3 u))(1 - u) > 0 where the shortcut holds
        g_max = np.where(shortcut, w2 / (total - w2 * (1.0 + 4.0 * u)) * (1.0 + 4.0 * u), rec["g_max"])
        f_low = np.where(shortcut, (1.0 - w2 * inv * (1.0 + 8.0 * u)) * (1.0 - 4.0 * u), rec["f_low"])
        abs_q_top, v_abs, abs_one_minus = np.abs(q_top), np.abs(v_top), np.abs(one_minus)
        kappa = (a_sum + abs_q_top) / s_abs
        s_top = np.abs(q_top * inv)
        tiny_top = abs_q_top >= _TINY
        all_positive = (rec["positive"] & (q_top > 0) & (total > 0)).all(axis=0)
        r = np.zeros(bsz)  # relative error of the non-top q
        r_top = np.zeros(bsz)  # relative error of q_top
        e_p = np.zeros(bsz)  # absolute error of p
        p_max = np.zeros(bsz)  # bound on max |p|
        q_low = np.ones(bsz)  # lower bound on min_{i != top} |q_i|
        err_s_max = np.zeros(bsz)  # largest relative error of an s_i so far
        ok = np.ones(bsz, dtype=bool)
        abs_sum = np.zeros(bsz)  # the far s_j's absolute errors, summed over the rounds
        if far is not None:
            n_far, w_far = far
            has = n_far > 0
            gain = w_far * np.abs(inv) * (1.0 + 8.0 * u)
            f_far = (1.0 - gain) * (1.0 - 4.0 * u)  # bounds on the computed far f_j (and q_j f_j), (k, B)
            q_far = np.cumprod(np.vstack([np.ones((1, bsz)), (1.0 + gain[:-1]) * (1.0 + 4.0 * u)]), axis=0)
            ok &= ~has | (f_far > 0).all(axis=0)
            abs_u = q_far * _EXP_ABS + _SUBNORMAL  # absolute error of a far u_j beyond its relative terms
            d_far = np.where(has, 1.01 * n_far * abs_u, 0.0)
            err_f_far = np.where(has, 1.01 * (_EXP_ABS / s_abs + _SUBNORMAL) / f_far, 0.0)
            err_s_far = np.where(has, 1.01 * abs_u / s_abs + _SUBNORMAL, 0.0)
        for t in range(k):
            d_x = (1.01 * (r + eps_w + u) + gamma) * a_sum[t]
            if far is not None:
                d_x = d_x + d_far[t]
            d_top = d_x + r_top * abs_q_top[t]
            rho_s = (d_top + u * s_abs[t]) / s_abs[t]
            err_f = 1.01 * g_max[t] * (eps_w + rho_s + 2.0 * u) + u
            if far is not None:
                err_f = err_f + err_f_far[t]
            err_v_top = (d_top + u * abs_one_minus[t]) / v_abs[t]
            err_f_top = 1.01 * (d_top / (s_abs[t] * v_abs[t]) + u * abs_one_minus[t] / v_abs[t]) + 4.0 * u
            p_max += kappa[t]
            err_s_top = r_top * c_top[t] + d_x / s_abs[t] + 3.0 * u
            err_s = r + eps_w + rho_s + 3.0 * u  # relative error of the non-top s_i
            e_p += 1.01 * np.maximum(s_top[t] * err_s_top, (kappa[t] - s_top[t]) * err_s) + u * p_max
            if far is not None:
                e_p += err_s_far[t]
                abs_sum += err_s_far[t]
            err_s_max = np.maximum(err_s_max, np.maximum(err_s_top, err_s))
            r = r + 1.01 * err_f + u
            r_top = r_top + err_f_top + u
            ok &= (err_v_top <= 1e-6) & (rho_s <= 1e-6) & tiny_top[t] & (q_low * w_min >= _TINY)
            q_low = q_low * f_low[t]
        # with every q_i > 0 in every round, every s_i >= 0 and p_i = sum_t s_i < 1: the errors of the
        # s_i add up to at most the largest relative one (and the additions to p to k u)
        all_positive &= rec["positive"][k - 1] & (q_top_end > 0)
        e_p = np.where(all_positive, np.minimum(e_p, 1.01 * err_s_max + k * u + abs_sum), e_p)
        slack = 1.0 + 32.0 * k * u
        e_p *= slack
        certified = (ok & (e_p <= FAST_P_BOUND) & (slack * r <= FAST_Q_BOUND) & (slack * r_top <= FAST_Q_BOUND)
                     & (np.abs(q_top_end) >= _TINY) & (q_low * w_min >= _TINY))
    return e_p, certified


def _general_terms(
    uu: FloatArray, w: FloatArray, f: FloatArray, top: np.ndarray, s_abs: FloatArray, gamma: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """The round's row terms of :func:`ws_fast` by passes over the entries (rows where the shortcut
    ``S > w_2``, all ``q > 0`` does not hold): ``A = sum_{j != top} |u_j|`` (bounded above, ``u_top`` is
    0 in ``uu``), ``G = max_{i != top} w_i / |S f_i|``, ``min_{i != top} |f_i|`` and ``min_{i != top} f_i``."""
    rows = np.arange(uu.shape[0])
    a_sum = _tree_sum(np.abs(uu)) * (1.0 + gamma)
    f_nt = f.copy()
    f_nt[rows, top] = np.inf
    f_abs = np.abs(f_nt)
    ratio = w / f_abs
    ratio[rows, top] = 0.0
    g_max = np.max(ratio, axis=-1) / s_abs * (1.0 + 8.0 * _UNIT)
    f_low = np.min(f_abs, axis=-1) * (1.0 - 8.0 * _UNIT)
    return a_sum, g_max, f_low, np.min(f_nt, axis=-1)


# --------------------------------------------------------------------------- the compact rounds


def _ws_w(fwd: Forward, z: FloatArray) -> FloatArray | None:
    """``w = e^z`` as the fast path formed it (``w_top = 1``), when ``fwd.aux`` is the fast path's compact
    form (no stored ``rho``); else None."""
    if "rho" in fwd.aux:
        return None
    rows, top = np.arange(z.shape[0]), fwd.aux["top"].astype(np.int64)
    w = exp_new(z)  # far rows: most entries below -750
    w[rows, top] = 1.0
    return w


def _ws_rounds(
    fwd: Forward, z: FloatArray, t: int, w: FloatArray | None = None
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Round ``t``'s ``s``, ``f``, ``rho = e^z / S`` and ``c = 1 - s`` (``(B, n)`` each): stored, or
    formed from the fast path's compact aux exactly as it formed them (``rho = w fl(1 / S)``, ``c = 1 -
    s`` but ``c_top = X / S``; ``w`` from :func:`_ws_w`)."""
    aux = fwd.aux
    if "rho" in aux:
        return aux["s"][:, t], aux["f"][:, t], aux["rho"][:, t], aux["c"][:, t]
    w = _ws_w(fwd, z) if w is None else w
    assert w is not None
    s = aux["s"][:, t]
    rho = w * aux["inv"][:, t, None]
    c = 1.0 - s
    rows = np.arange(z.shape[0])
    c[rows, aux["top"].astype(np.int64)] = aux["c_top"][:, t]
    return s, aux["f"][:, t], rho, c


def _ws_expand(fwd: Forward, z: FloatArray, k: int) -> None:
    """Replace the fast path's compact aux by stored ``rho`` and ``c`` stacks (as the faithful path keeps
    them), in place: needed before merging with faithful rows."""
    if "rho" in fwd.aux:
        return
    w = _ws_w(fwd, z)
    rho, c = np.empty_like(fwd.aux["s"]), np.empty_like(fwd.aux["s"])
    for t in range(k):
        _, _, rho[:, t], c[:, t] = _ws_rounds(fwd, z, t, w)
    for name in ("inv", "c_top", "top"):
        del fwd.aux[name]
    fwd.aux["rho"], fwd.aux["c"] = rho, c


def _ws_expand_rows(fwd: Forward, z: FloatArray, rows: NDArray[np.bool_]) -> dict[str, FloatArray]:
    """The ``s``, ``f``, ``rho``, ``c`` stacks ``(b, k, n)`` on ``rows`` (formed from the compact aux if
    need be, as :func:`_ws_rounds` does)."""
    aux = fwd.aux
    out = {name: aux[name][rows] for name in ("s", "f")}
    if "rho" in aux:
        out["rho"], out["c"] = aux["rho"][rows], aux["c"][rows]
        return out
    w = _ws_w(fwd, z)
    assert w is not None
    out["rho"] = w[rows][:, None, :] * aux["inv"][rows][:, :, None]
    c = 1.0 - out["s"]
    top = aux["top"][rows].astype(np.int64)
    c[np.arange(top.size), :, top] = aux["c_top"][rows]
    out["c"] = c
    return out


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


#: Terms added per level by :func:`_tree_sum`.
_TREE_WIDTH = 16


def _tree_sum(x: FloatArray) -> FloatArray:
    """Row sums of ``x`` (``(B, n)``) in levels of :data:`_TREE_WIDTH` terms: each level adds ``16``
    contiguous slices elementwise (the leftover columns onto the first ones, at most ``m`` at a time), until ``16`` or fewer
    partial sums are left. Whatever order numpy adds in within each level, the error is at most
    ``_tree_sum_depth(n) u`` times the sum of the magnitudes (``m`` terms in any order: ``(m - 1) u``);
    for ``n = 1000`` the depth is 34, against 93 for a two-level sum of ``sqrt(n)`` terms."""
    bsz, n = x.shape
    while n > _TREE_WIDTH:
        m = n // _TREE_WIDTH
        head = x[:, : m * _TREE_WIDTH].reshape(bsz, _TREE_WIDTH, m).sum(axis=1)
        for start in range(m * _TREE_WIDTH, n, m):  # the leftover columns, at most m at a time
            stop = min(start + m, n)
            head[:, : stop - start] += x[:, start:stop]
        x, n = head, m
    return x.sum(axis=-1)


def _tree_sum_depth(n: int) -> int:
    """Additions on the longest path of :func:`_tree_sum` for ``n`` terms."""
    depth = 0
    while n > _TREE_WIDTH:
        m = n // _TREE_WIDTH
        depth += _TREE_WIDTH - 1 + -(-(n - m * _TREE_WIDTH) // m)
        n = m
    return depth + max(n - 1, 0)
