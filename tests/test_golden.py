"""The stored reference values (``tests/golden/references.json.gz``) still agree with the reference
code: a random sample of them is recomputed with mpmath on every run (a new sample each run; set
``SOFTTOPK_GOLDEN_SEED`` to repeat one), bit for bit after rounding to float64."""

from __future__ import annotations

import importlib
import os
import random

import numpy as np
import pytest
from golden_store import GOLDEN_FILE, REGISTRY, decode_args, decode_result, encode_result, mode, stored

#: How many stored values each run recomputes.
SAMPLE = 4


def _seed() -> int:
    given = os.environ.get("SOFTTOPK_GOLDEN_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**32)


def test_the_stored_file_is_there_and_compact() -> None:
    assert GOLDEN_FILE.exists(), "regenerate with: PYTHONPATH=. python tests/golden/make_golden.py"
    assert GOLDEN_FILE.stat().st_size < 5e6
    doc = stored()
    assert {"versions", "precision_digits", "seeds", "generated_by"} <= set(doc["meta"])
    names = {entry["name"] for entry in doc["entries"].values()}
    assert {"test_accuracy.reference_floats", "test_fuzz_core.ref_pq", "test_jacobians.fd_reference",
            "test_sequential.ref", "test_threshold.reference"} <= names


def test_a_random_sample_of_stored_values_matches_the_reference_code() -> None:
    seed = _seed()
    doc = stored()
    keys = sorted(doc["entries"])
    picked = random.Random(seed).sample(keys, min(SAMPLE, len(keys)))
    for key in picked:
        entry = doc["entries"][key]
        name = entry["name"]
        importlib.import_module(name.split(".")[0])  # registers the undecorated reference
        args = decode_args(entry["args"], doc["vectors"])
        fresh = encode_result(REGISTRY[name](*args))
        where = f"{name}{args!r:.200} (SOFTTOPK_GOLDEN_SEED={seed})"
        assert fresh["shape"] == entry["result"]["shape"], where
        assert fresh["data"] == entry["result"]["data"], (
            where, np.asarray(decode_result(fresh)) - np.asarray(decode_result(entry["result"])))


def test_the_store_round_trips_exactly() -> None:
    from golden_store import encode_args

    vectors: dict[str, str] = {}
    args = ("grad", (0.1, -np.inf, 5e-324, -0.0, 1e300), 3, 1e-3, [1.0, 2.0], True)
    encoded = encode_args(args, vectors)
    back = decode_args(encoded, vectors)
    assert repr(back) == repr(args)
    for value in [(0.1, -0.0, np.inf), ((1.0, 2.0), (3.0, 4.0)), ([1.0], [2.0]), np.eye(2) / 3]:
        again = decode_result(encode_result(value))
        assert type(again) is type(value) and repr(again) == repr(value)


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTTOPK_GOLDEN", "sometimes")
    with pytest.raises(ValueError, match="SOFTTOPK_GOLDEN"):
        mode()


def test_a_stored_value_is_served_and_a_missing_one_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    from golden_store import GoldenMissWarning, _key, encode_args, golden

    monkeypatch.setenv("SOFTTOPK_GOLDEN", "use")
    calls = []

    @golden("test_golden.probe")
    def probe(x: tuple[float, ...], k: int) -> tuple[float, ...]:
        calls.append((x, k))
        return tuple(v * k for v in x)

    vectors: dict[str, str] = {}
    key = _key("test_golden.probe", encode_args(((1.0, 2.0), 3), vectors))
    monkeypatch.setitem(stored()["entries"], key, {"name": "test_golden.probe", "args": [],
                                                  "result": encode_result((7.0, 8.0))})
    assert probe((1.0, 2.0), 3) == (7.0, 8.0) and calls == []  # the stored value, not a computation
    with pytest.warns(GoldenMissWarning, match="make_golden"):
        assert probe((1.0, 2.0), 2) == (2.0, 4.0)
    assert calls == [((1.0, 2.0), 2)]
    monkeypatch.setenv("SOFTTOPK_GOLDEN", "off")  # off: always the reference code
    assert probe((1.0, 2.0), 3) == (3.0, 6.0)
