"""Fuzz the core API against the independent mpmath reference (``tests/reference.py``).

Usage: ``python benchmarks/fuzz_core.py [--cases N] [--seed S] [--methods a,b]`` (about a minute
per 100 cases; not run in CI). Point ``PYTHONPATH`` at another checkout to fuzz that version of
``topk_cli`` with this reference, e.g. to compare before and after a change.

Each case draws a shape (a vector, a batch, or an empty batch ``(0, n)``), ``n`` in 1..6, ``k``
in 1..n, ``tau`` log-uniform in 1e-300..1e3 (plus the values 1e-20 and 1), and values of one of
several adversarial kinds (small integers with ties, near-ties a few ulps apart, huge offsets,
wide spreads, tiny spreads, masked entries), then runs ``evaluate``, ``jacobian`` and ``vjp`` of
every registered method on it and counts:

* ``exceptions``: any exception that is not a ``SoftTopKError`` (a crash, for a user);
* ``wrong ok``: rows reported ``"ok"`` whose weights differ from the reference by more than
  ``1e-9 * max(1, |p|)`` (also given: more than 1e-12), or than ``4 tol`` for a method converged
  to a ``tol`` parameter, or than 5 standard errors for a Monte Carlo one; the reference is
  evaluated on the operator's actual input ``z = fl((x - max) / tau)``, as in ``tests/test_accuracy.py``;
* ``wrong complement``: ok rows whose ``complement`` differs from ``1 - p`` of the reference by
  more than ``min(1e-9, 1e-3 |1 - p|)`` (it must tell ``1 - 1e-20`` from 1);
* ``inf derivative``: ``jacobian`` / ``vjp`` calls that returned a non-finite entry;
* ``refused derivative``: ``jacobian`` / ``vjp`` calls refused with a numerical failure although
  every row's forward pass was ``"ok"`` (not wrong, but counted).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import reference as ref
import reference_wider

import topk_cli as st
from topk_cli.api import scaled_scores
from topk_cli.errors import NumericalFailureError, SoftTopKError

KINDS = ("small-int", "ties", "near-ties", "offset", "wide", "tiny-spread", "masked")


def draw_case(rng: np.random.Generator) -> tuple[np.ndarray, int, float, str]:
    """One random case: ``x`` (any batch shape), ``k``, ``tau`` and its kind."""
    n = int(rng.integers(1, 7))
    kind = str(rng.choice(KINDS))
    shape_kind = rng.choice(["vector", "batch", "batch2", "empty"], p=[0.5, 0.3, 0.1, 0.1])
    rows = {"vector": 1, "batch": int(rng.integers(1, 4)), "batch2": 4, "empty": 0}[str(shape_kind)]

    def row() -> np.ndarray:
        if kind in ("small-int", "masked"):
            x = rng.integers(-3, 4, size=n).astype(np.float64)
        elif kind == "ties":
            x = rng.choice(rng.normal(size=max(1, n // 2)), size=n)
        elif kind == "near-ties":
            base = rng.normal()
            x = base + rng.integers(-2, 3, size=n) * np.spacing(base) * rng.integers(1, 4)
        elif kind == "offset":
            x = rng.normal(size=n) + 10.0 ** rng.uniform(3, 300) * rng.choice([-1.0, 1.0])
        elif kind == "wide":
            x = rng.normal(size=n) * 10.0 ** rng.uniform(2, 300)
        else:
            x = 1.0 + rng.normal(size=n) * 10.0 ** rng.uniform(-16, -8)
        if kind == "masked" and n > 1:
            x[rng.random(n) < 0.3] = -np.inf
        return x

    batch = np.stack([row() for _ in range(max(rows, 1))])[:rows]
    if shape_kind == "vector":
        x = batch[0]
    elif shape_kind == "batch2":
        x = batch.reshape(2, 2, n)
    else:
        x = batch
    live = np.isfinite(x.reshape(-1, n)).sum(axis=-1)
    k_max = int(live.min()) if live.size else n
    k = int(rng.integers(1, max(k_max, 1) + 1))
    tau_kind = rng.random()
    tau = 1.0 if tau_kind < 0.1 else 1e-20 if tau_kind < 0.2 else float(10.0 ** rng.uniform(-300, 3))
    return x, k, tau, kind


class Counts:
    def __init__(self) -> None:
        self.by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.examples: dict[tuple[str, str], str] = {}

    def add(self, method: str, what: str, example: str, n: int = 1) -> None:
        self.by[method][what] += n
        self.examples.setdefault((method, what), example)


_REF_CACHE: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}


def reference_pq(method: str, z: tuple[float, ...], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference ``p`` and ``1 - p`` (both to float) on the operator's input ``z``."""
    name = "grad" if method == "grad-recursive" else method
    key = (name, z, k)
    if key not in _REF_CACHE:
        if name == "weighted-softmax":
            p, q = ref.weighted_softmax_with_complement(z, k, 1.0, dps=40)
        elif name == "grad":
            p, q = ref.grad_with_complement_esp(z, k, 1.0, dps=40)
        elif name in ref.REFERENCES:
            p = ref.reference(name, z, k, 1.0, dps=40)
            with ref.mp.workdps(60):
                q = [1 - ref.mpf(v) for v in p]
        else:  # the wider field's methods (tests/reference_wider.py)
            p = reference_wider.REFERENCES[name](z, k, 1.0)
            with ref.mp.workdps(60):
                q = [1 - ref.mpf(v) for v in p]
        _REF_CACHE[key] = ([float(v) for v in p], [float(v) for v in q])
    p, q = _REF_CACHE[key]
    return np.array(p), np.array(q)


def stated_tolerance(method: str) -> float:
    """A method converged to a ``tol`` parameter states its rows to about that (4 tol allowed)."""
    tols = [float(p.default) for p in st.METHODS[method].parameters if p.name == "tol"]
    return 4.0 * tols[0] if tols else 0.0


def row_bounds(method: str, res: Any, b: int, n: int) -> np.ndarray | None:
    """The error a Monte Carlo method states for row ``b`` (its standard errors), else None."""
    if not st.METHODS[method].capabilities.monte_carlo:
        return None
    from topk_cli.registry import MONTE_CARLO_STDERRS

    se = np.asarray(res.stderr, dtype=np.float64).reshape(-1, n)[b]
    return (MONTE_CARLO_STDERRS + 1.0) * se + 1e-12


def fuzz_one(method: str, x: np.ndarray, k: int, tau: float, counts: Counts, rng: np.random.Generator) -> None:
    label = f"{method} x={x.tolist()!r} k={k} tau={tau!r}"
    counts.add(method, "calls", label)
    try:
        res = st.evaluate(x, k, method, tau=tau)
    except SoftTopKError:
        counts.add(method, "refused (argument)", label)
        return
    except Exception as exc:
        counts.add(method, "exceptions", f"{label}: evaluate: {type(exc).__name__}: {exc}")
        return
    n = x.shape[-1]
    if x.size:
        z_rows = scaled_scores(x, k, tau=tau)
        status = np.asarray(res.status).reshape(-1)
        p_rows = np.asarray(res.weights, dtype=np.float64).reshape(-1, n)
        q_rows = np.asarray(res.complement, dtype=np.float64).reshape(-1, n)
        for b in range(z_rows.shape[0]):
            if status[b] != "ok":
                counts.add(method, "refused rows", f"{label} row {b}: {status[b]}")
                continue
            counts.add(method, "ok rows", label)
            try:
                p_ref, q_ref = reference_pq(method, tuple(z_rows[b].tolist()), k)
            except RuntimeError as exc:  # the reference itself gave up: say so, do not guess
                counts.add(method, "reference failed", f"{label} row {b} z={z_rows[b].tolist()}: {str(exc)[:80]}")
                continue
            bound = row_bounds(method, res, b, n)
            if bound is not None:  # an estimate: judged within its stated standard errors
                for what, got, want in (("wrong ok", p_rows[b], p_ref), ("wrong complement", q_rows[b], q_ref)):
                    if (np.abs(got - want) > bound).any():
                        counts.add(method, what, f"{label} row {b}: {got.tolist()} ref={want.tolist()}")
                continue
            err = np.max(np.abs(p_rows[b] - p_ref) / np.maximum(1.0, np.abs(p_ref)))
            stated = stated_tolerance(method)
            if err > max(1e-12, stated):
                counts.add(method, "wrong ok >1e-12", f"{label} row {b}: err {err:.2e}")
            if err > max(1e-9, stated):
                counts.add(method, "wrong ok", f"{label} row {b}: p={p_rows[b].tolist()} ref={p_ref.tolist()}")
            # the references of weighted-softmax and grad carry 1 - p relatively, the others give it
            # to 40 digits absolute (1e-30 below)
            floor = 0.0 if method in ("weighted-softmax", "grad", "grad-recursive") else 1e-30
            q_err = np.abs(q_rows[b] - q_ref) - np.maximum(np.minimum(1e-9, np.maximum(1e-3 * np.abs(q_ref), floor)),
                                                       stated_tolerance(method))
            if (q_err > 0).any():
                counts.add(method, "wrong complement",
                           f"{label} row {b}: q={q_rows[b].tolist()} ref={q_ref.tolist()}")
    all_ok = bool((np.asarray(res.status) == "ok").all())
    v = rng.normal(size=x.shape)
    for name, call in (("jacobian", lambda: st.jacobian(x, k, method, tau=tau)),
                       ("vjp", lambda: st.vjp(x, k, v, method, tau=tau))):
        try:
            out = call()
        except NumericalFailureError as exc:
            if all_ok:
                counts.add(method, "refused derivative", f"{label}: {name}: {exc}")
            continue
        except SoftTopKError:
            continue
        except Exception as exc:
            counts.add(method, "exceptions", f"{label}: {name}: {type(exc).__name__}: {exc}")
            continue
        if not np.isfinite(out).all():
            counts.add(method, "inf derivative", f"{label}: {name}")


SURVEY_TAUS = (1e-3, 1e-5, 1e-10, 1e-20, 1e-50, 1e-100, 1e-200, 1e-300)


def survey(methods: list[str]) -> None:
    """Every small-integer vector (n 2..4, entries 0..3 up to order), every k, tau 1e-3..1e-300:
    per method, rows returned "ok" and how many of those are wrong (> 1e-9 * max(1, |p|))."""
    import itertools

    print("survey: small-integer vectors x tau in " + ", ".join(f"{t:g}" for t in SURVEY_TAUS))
    print("method".ljust(18) + "rows".rjust(7) + "ok".rjust(7) + "wrong ok".rjust(10) + "  example")
    for method in methods:
        rows = ok = wrong = 0
        example = ""
        for n in (2, 3, 4):
            for x in itertools.combinations_with_replacement(range(4), n):
                for k in range(1, n + 1):
                    for tau in SURVEY_TAUS:
                        rows += 1
                        res = st.evaluate(np.array(x, dtype=np.float64), k, method, tau=tau)
                        if res.status != "ok":
                            continue
                        ok += 1
                        z = scaled_scores(np.array(x, dtype=np.float64), k, tau=tau)[0]
                        p_ref, _ = reference_pq(method, tuple(z.tolist()), k)
                        p = np.asarray(res.weights, dtype=np.float64)
                        bound = row_bounds(method, res, 0, n)
                        if bound is not None:
                            bad = bool((np.abs(p - p_ref) > bound).any())
                        else:
                            err = np.max(np.abs(p - p_ref) / np.maximum(1.0, np.abs(p_ref)))
                            bad = err > max(1e-9, stated_tolerance(method))
                        if bad:
                            wrong += 1
                            example = example or f"x={list(x)} k={k} tau={tau:g}: {p.round(4).tolist()} vs {p_ref.round(4).tolist()}"
        print(method.ljust(18) + str(rows).rjust(7) + str(ok).rjust(7) + str(wrong).rjust(10) + "  " + example)


COLUMNS = ("calls", "exceptions", "ok rows", "refused rows", "wrong ok", "wrong ok >1e-12", "wrong complement",
           "inf derivative", "refused derivative", "reference failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="")
    parser.add_argument("--examples", action="store_true", help="print one example per finding")
    parser.add_argument("--survey", action="store_true", help="run the small-integer survey instead")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m] or list(st.METHODS)
    if args.survey:
        survey(methods)
        return
    rng = np.random.default_rng(args.seed)
    counts = Counts()
    start = time.perf_counter()
    for _ in range(args.cases):
        x, k, tau, _kind = draw_case(rng)
        for method in methods:
            fuzz_one(method, x, k, tau, counts, rng)
    print(f"{args.cases} cases, seed {args.seed}, topk_cli from {Path(st.__file__).parent}, "
          f"{time.perf_counter() - start:.0f} s")
    print("method".ljust(18) + "".join(c.rjust(len(c) + 2) for c in COLUMNS))
    total: collections.Counter[str] = collections.Counter()
    for method in methods:
        c = counts.by[method]
        total.update(c)
        print(method.ljust(18) + "".join(str(c[col]).rjust(len(col) + 2) for col in COLUMNS))
    print("total".ljust(18) + "".join(str(total[col]).rjust(len(col) + 2) for col in COLUMNS))
    if args.examples:
        for (method, what), ex in sorted(counts.examples.items()):
            if what not in ("calls", "ok rows"):
                print(f"[{method}] {what}: {ex[:400]}")


if __name__ == "__main__":
    main()
