"""Accuracy table: every method against the independent mpmath reference (tests/reference.py).

Usage: ``python benchmarks/accuracy.py [--quick] [--wider] [-m METHOD ...]``. By default it measures the
methods ``tests/test_accuracy.py`` grades on these grids (``test_accuracy.METHOD_NAMES``); ``--quick``
skips n = 1000; ``--wider`` adds the methods whose references live in ``tests/reference_wider.py``
(about a minute or more each); ``-m`` picks methods by name. Monte-Carlo methods are never measured
here: their reference is their exact expectation, judged within their standard error by
``tests/test_perturbed.py``, and it alone took over 30 CPU-minutes on these grids.

Over the adversarial case set of ``tests/test_accuracy.py`` (n in {1, 2, 5, 50, 1000}, k in
{1, 2, n//2, n-1, n}, spreads 1e-6..1e3, offsets 0 and 1e6, ties and near-ties, tau in {1e-3,
0.1, 1, 100}) it prints, per method:

* ``f64 op``: max |p - p_ref| in float64, the reference taken on the operator's input
  ``z = fl((x - max) / tau)`` (what the tests assert, tolerance 1e-12);
* ``f64 e2e``: the same against the reference on exact ``x`` (adds the effect of that one
  rounding of ``z``, which no float64 implementation avoids);
* ``f32``: max error with float32 input (reference on the float32 values; tolerance 1e-5;
  includes the float32 rounding of the output, ~3e-8 on fractional weights, even for hard);
* ``fails``: rows the method reported as numerical failures (excluded from the errors);
* ``jac``: max |J - J_ref| / max(1, |J_ref|) over the Jacobian cases of ``tests/test_jacobians.py``
  (finite differences of the reference at 90 digits);
* the worst float64 case.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_accuracy as acc
import test_jacobians as jt

import topk_cli as st


def _error(method: str, case: acc.Case, dtype: np.dtype, *, end_to_end: bool) -> float | None:
    """Max abs error of the public API on ``case``; None when the row reported a failure."""
    x = np.asarray(case.x, dtype=np.float64).astype(dtype)
    x64 = x.astype(np.float64)
    if method == "hard" and acc.hard_is_ambiguous(x64, case.tau):
        return 0.0
    result = st.evaluate(x, case.k, method, tau=case.tau)
    if str(result.status) != "ok":
        return None
    if end_to_end:
        want = np.asarray(acc.reference_floats(method, tuple(x64.tolist()), case.k, case.tau))
    else:
        want = acc.operator_reference(method, x64, case.k, case.tau)
    return float(np.max(np.abs(result.weights.astype(np.float64) - want)))


def _jacobian_error(method: str) -> float:
    worst = 0.0
    for _, x, k, tau in jt.CASES:
        if method == "thre-exp" and jt._thre_exp_near_kink(x, k, tau):
            continue
        res = st.evaluate(np.array(x), k, method, tau=tau)
        if not res.ok:
            continue
        want = jt.fd_reference(method, x, k, tau)
        got = st.jacobian(np.array(x), k, method, tau=tau)
        worst = max(worst, float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want)))))
    return worst


def _methods(argv: list[str]) -> list[str]:
    chosen = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-m", "--method")]
    if chosen:
        return chosen
    if "--wider" in argv:
        return [m for m in st.METHODS if not st.METHODS[m].capabilities.monte_carlo]
    return list(acc.METHOD_NAMES)


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    methods = _methods(argv)
    skipped = [m for m in st.METHODS if m not in methods]
    blocks = ["small", "medium"] + ([] if quick else ["large", "large-slow"])
    header = f"{'method':18} {'cases':>5} {'f64 op':>9} {'f64 e2e':>9} {'f32':>9} {'fails':>5} {'jac':>9}  worst float64 case"
    print(header)
    print("-" * len(header))
    for method in methods:
        start = time.perf_counter()
        cases = [c for block in blocks for c in acc.cases_for(method, block)]
        op64 = e2e = f32 = 0.0
        worst_case, fails = "", 0
        for case in cases:
            err = _error(method, case, np.dtype(np.float64), end_to_end=False)
            if err is None:
                fails += 1
                continue
            if err > op64:
                op64, worst_case = err, case.name
            e2e = max(e2e, _error(method, case, np.dtype(np.float64), end_to_end=True) or 0.0)
            if case.x and max(abs(v) for v in case.x) < 1e30:
                f32 = max(f32, _error(method, case, np.dtype(np.float32), end_to_end=False) or 0.0)
        jac = _jacobian_error(method) if method != "hard" else 0.0
        elapsed = time.perf_counter() - start
        print(
            f"{method:18} {len(cases):5d} {op64:9.2e} {e2e:9.2e} {f32:9.2e} {fails:5d} {jac:9.2e}  "
            f"{worst_case}  [{elapsed:.0f}s]",
            flush=True,
        )
    print("\ntolerances asserted by tests/test_accuracy.py: 1e-12 (float64, 'f64 op'), 1e-5 (float32)")
    if skipped:
        print(f"not measured: {', '.join(skipped)} (--wider adds the non-Monte-Carlo ones; -m NAME picks any)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
