"""weighted-softmax's Jacobian on a 340-row adversarial grid against a 60-digit mpmath reference.

Usage: ``PYTHONPATH=.:tests python benchmarks/ws_jacobian_grid.py [--ref-seconds 20]`` (about 30 minutes
on a loaded machine, nearly all of it the reference; rows whose reference takes longer are skipped).

Rows: n in 2..10; random, tied, outlier and two-cluster rows; spreads 1..1e6; offsets 0 and 1e6;
k in {1, 2, n//2, n-1, n}; tau in {1, 0.1, 1e-3} (seeded). The reference is the forward-mode recurrence
of ``tests/ws_jacobian_reference.py`` on exact ``x``. Prints how many Jacobians are refused with the
exact decimal computation disabled (the behaviour before it) and enabled, and the worst errors of the
returned ones: relative to the largest entry, and relative to ``max(max |J|, 1e-3 / tau)`` (the float64
paths are accurate in absolute terms, in units of ``1/tau``, where the whole Jacobian is tiny).
"""

from __future__ import annotations

import argparse
import signal

import numpy as np
import ws_jacobian_reference as W

import topk_cli as st
from topk_cli.operators import weighted_softmax as ws


def grid() -> list[tuple[tuple[float, ...], int, float]]:
    rng = np.random.default_rng(2026)
    out = []
    while len(out) < 340:
        n = int(rng.integers(2, 11))
        kind = rng.choice(["random", "ties", "outlier", "twoclusters"])
        spread = float(rng.choice([1.0, 30.0, 1e3, 1e4, 1e5, 1e6]))
        offset = float(rng.choice([0.0, 0.0, 1e6]))
        x = rng.standard_normal(n) * spread
        if kind == "ties":
            x[: max(2, n // 2)] = x[0]
        if kind == "outlier":
            x[int(rng.integers(n))] += spread * float(rng.choice([10, 100]))
        if kind == "twoclusters":
            x = np.where(rng.random(n) < 0.5, 0.0, -spread) + rng.standard_normal(n)
        x = x + offset
        k = min(max(int(rng.choice([1, 2, max(1, n // 2), n - 1, n])), 1), n)
        out.append((tuple(x.tolist()), k, float(rng.choice([1.0, 0.1, 1e-3]))))
    return out


class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref-seconds", type=int, default=20)
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    refused = {"before": 0, "after": 0}
    no_ref = 0
    worst_rel: list[tuple[float, str]] = []
    worst_abs: list[tuple[float, str]] = []
    for x, k, tau in grid():
        got = {}
        for label, work in (("before", 0.0), ("after", 1e5)):
            ws.DECIMAL_MAX_WORK = work
            try:
                got[label] = st.jacobian(np.array(x), k, "weighted-softmax", tau=tau)
            except st.NumericalFailureError:
                refused[label] += 1
        if "after" not in got:
            continue
        signal.alarm(args.ref_seconds)
        try:
            ref = np.array([[float(v) for v in row] for row in W.jacobian_weighted_softmax(list(x), k, tau)])
        except (_Timeout, RuntimeError):
            no_ref += 1
            continue
        finally:
            signal.alarm(0)
        err = float(np.abs(got["after"] - ref).max())
        big = float(np.abs(ref).max())
        name = f"n={len(x)} k={k} tau={tau:g} spread={np.ptp(x):.3g}{'' if 'before' in got else ' (was refused)'}"
        worst_rel.append((err / big if big > 0 else (0.0 if err == 0 else np.inf), name))
        worst_abs.append((err / max(big, 1e-3 / tau), name))
    print(f"refused: {refused['before']} of 340 before, {refused['after']} after; returned without a reference: {no_ref}")
    for title, rows in (("err / max|J|", worst_rel), ("err / max(max|J|, 1e-3/tau)", worst_abs)):
        rows.sort(key=lambda r: -r[0])
        print(title + ": " + "; ".join(f"{e:.3g} at {name}" for e, name in rows[:3]))


if __name__ == "__main__":
    main()
