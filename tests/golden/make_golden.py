"""Regenerate ``tests/golden/references.json.gz``: the mpmath reference values the tests compare with.

Runs the test files that use :func:`golden_store.golden` with ``SOFTTOPK_GOLDEN=record``: every
reference they ask for is computed with mpmath (none is read from the old file) and the values of
this run, and only those, are written, with the precision and the seeds of the inputs in ``meta``.
Run it after changing a reference, a case list or a tolerance's inputs (it takes the CPU time the
references cost, several minutes)::

    PYTHONPATH=. python tests/golden/make_golden.py                       # every file
    PYTHONPATH=. python tests/golden/make_golden.py tests/test_threshold.py  # one file, merged

Every input is stored exactly (float64 bits) beside its value; ``tests/test_golden.py`` recomputes a
random sample of the stored values on every run.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "references.json.gz"

#: The test files whose references are stored (each wraps its reference with ``@golden``).
FILES = [
    "tests/test_accuracy.py",
    "tests/test_fuzz_core.py",
    "tests/test_jacobians.py",
    "tests/test_sequential.py",
    "tests/test_threshold.py",
    "tests/test_weighted_softmax_far.py",
    "tests/test_perturbed.py",
    "tests/test_projection.py",
    "tests/test_weighted_softmax_fast.py",  # asks test_sequential.ref: record it together with test_sequential.py
]


def meta() -> dict:
    import hypothesis
    import mpmath
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    import reference
    import reference_wider

    return {
        "generated_by": "tests/golden/make_golden.py",
        "files": FILES,
        "versions": {"mpmath": mpmath.__version__, "mpmath_backend": mpmath.libmp.BACKEND,
                     "numpy": np.__version__, "hypothesis": hypothesis.__version__,
                     "python": platform.python_version()},
        "precision_digits": {
            "reference.py (DPS, raised by log10 max |z|)": reference.DPS,
            "reference_wider.py (DPS; perturbed's quadrature 25)": reference_wider.DPS,
            "test_fuzz_core.ref_pq (dps for reference.py's methods)": 40,
            "test_jacobians.fd_reference (jacobian_fd: dps, step 10^-25)": 90,
            "test_sequential.ref (60 + k spread / ln 10 + log10 spread)": 60,
            "test_threshold.reference (bisection)": 60,
            "test_weighted_softmax_far.ref (reference.py DPS, certified by doubling)": 50,
            "test_perturbed.exact_weights / exact_jacobian (quadrature)": 15,
            "test_projection.regularised_argmax (interior point)": 20,
        },
        "seeds": {
            "test_accuracy": "make_vector: default_rng(seed), seeds 1.. (n <= 5), 100.. (n = 50), 1000.. and 1010.. (n = 1000)",
            "test_fuzz_core": "integer survey (no randomness); property test: hypothesis derandomize=True, 25 examples",
            "test_jacobians": "default_rng(2024)",
            "test_sequential": "default_rng(7), (3), (11), (5), (2), (0) per test (see the file)",
            "test_threshold": "CASES: default_rng(20240917)",
            "test_weighted_softmax_far": "_adversarial: default_rng(5) and the fixed rows in the file",
            "test_perturbed": "fixed CASES in the file",
            "test_projection": "fixed vectors in the file",
            "test_weighted_softmax_fast": "default_rng per test (see the file); its values are test_sequential.ref's",
        },
        "note": "each entry stores its exact inputs (float64 bits) and the reference's output rounded to float64",
    }


def main(argv: list[str]) -> int:
    """``make_golden.py``: every file of FILES; ``make_golden.py tests/test_x.py ...``: those files'
    values only, merged into the stored file (the other files' entries kept as they are)."""
    files = argv or FILES
    unknown = [f for f in files if f not in FILES]
    if unknown:
        print(f"make_golden: not a golden-backed file: {unknown} (add it to FILES)", file=sys.stderr)
        return 2
    tmp = OUT.with_suffix(".tmp.gz")
    env = {**os.environ, "SOFTTOPK_GOLDEN": "record", "SOFTTOPK_GOLDEN_OUT": str(tmp),
           "SOFTTOPK_GOLDEN_META": json.dumps(meta()), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *files]
    code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    if code != 0:
        print(f"make_golden: the tests failed (exit {code}): {OUT.name} left as it was", file=sys.stderr)
        tmp.unlink(missing_ok=True)
        return code
    if argv and OUT.exists():  # merge: replace the re-recorded files' entries, keep the others
        with gzip.open(OUT, "rt", encoding="utf-8") as fh:
            old = json.load(fh)
        with gzip.open(tmp, "rt", encoding="utf-8") as fh:
            new = json.load(fh)
        redone = {Path(f).stem for f in files}
        entries = {key: e for key, e in old["entries"].items() if e["name"].split(".")[0] not in redone}
        entries.update(new["entries"])
        used = {a["v"] for e in entries.values() for a in e["args"] if isinstance(a, dict) and "v" in a}
        vectors = {vid: data for vid, data in {**old["vectors"], **new["vectors"]}.items() if vid in used}
        doc = {"meta": new["meta"], "vectors": dict(sorted(vectors.items())), "entries": dict(sorted(entries.items()))}
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as fh:
            json.dump(doc, fh, separators=(",", ":"))
    tmp.replace(OUT)
    print(f"make_golden: wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
