"""weighted-softmax's faithful path against a verbatim copy of itself from before its rounds were fused
(``_ws_faithful_reference``): every output bit for bit, on single rows and batches chosen to reach
every branch (ties, masked entries, tiny and large tau, saturation, ill-conditioned rows of both
kinds, store on and off)."""

from __future__ import annotations

import warnings

import _ws_faithful_reference as old
import numpy as np
import pytest
from conftest import same_bits

from topk_cli.operators._logsigned import _RoundingErrors
from topk_cli.operators.weighted_softmax import _ws_faithful

#: x = c (3, 2, 1, 0), k = 3 passes a pole of the operator at c = POLE (see test_sequential)
POLE = 1.29767596828515988


def _rows(n: int, seed: int) -> list[np.ndarray]:
    """Rows of length ``n``: random, tied (exactly and within a small tau), masked, saturating."""
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(n), np.round(rng.standard_normal(n), 1), rng.integers(0, 3, n).astype(float)]
    if n >= 3:
        masked = rng.standard_normal(n)
        masked[rng.choice(n, size=max(1, n // 4), replace=False)] = -np.inf
        out.append(masked)
        out.append(np.concatenate([[1.0, 1.0], np.zeros(n - 2)]))  # tied maxima
        out.append(np.linspace(0.0, -1e3, n))  # saturating at every tau below 1
    return out


def _cases() -> list[tuple[np.ndarray, int]]:
    """``(z, k)`` batches (one row or several) with ``max z = 0`` per row."""
    cases = []
    for n, seed in ((1, 0), (2, 1), (3, 2), (17, 3), (200, 4)):
        rows = _rows(n, seed)
        for k in sorted({1, 2, n - 1, n} & set(range(1, n + 1))):
            # (n = 200 at k = n - 1, n: one tau each, to keep the test fast)
            taus = (1e-3, 0.05, 1.0, 10.0) if n < 200 or k <= 2 else (1.0,) if k == n - 1 else (0.05,)
            for tau in taus:
                z = np.array(rows) / tau
                z -= np.max(z, axis=-1, keepdims=True)
                z = z[np.isfinite(z).sum(axis=-1) >= k]
                if n < 17 or (n == 17 and tau == 0.05):  # single rows, as the shrinker asks for them
                    cases.extend((z[b : b + 1], k) for b in range(z.shape[0]))
                cases.append((z, k))
    pole = np.array([POLE * (1.0 + o) * np.array([3.0, 2.0, 1.0, 0.0]) for o in (0.0, 1e-5, -1e-7, 1e-2)])
    cases.append((pole - pole.max(axis=-1, keepdims=True), 3))
    cases.append((np.array([[0.0, 0.0, -100.0]]), 3))  # V_i cancels: "ill-conditioned" at round 2
    cases.append((np.array([[0.0, -3000.0, -6000.0], [0.0, 0.0, -100.0]]), 2))
    cases.append((np.array([[0.0, -1e17]]), 2))
    cases.append((np.zeros((0, 4)), 2))  # an empty batch
    return cases


CASES = _cases()


_same = same_bits


def _quiet(fn, z, k, store):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(z, k, store=store)


def _model_state(cls, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, np.ndarray]]:  # type: ignore[no-untyped-def]
    """Record the error model's final state (growth, worst and crossing rounds, every cause array) of
    each call, which the messages print only to two digits."""
    states: list[dict[str, np.ndarray]] = []
    report = cls.report

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        states.append({"growth": self.growth, "worst": self.worst, "crossed": self.crossed, **self.cause})
        return report(self, *args, **kwargs)

    monkeypatch.setattr(cls, "report", recording)
    return states


@pytest.mark.parametrize("store", [False, True])
def test_faithful_path_is_bit_identical_to_the_unfused_rounds(store: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    new_states, ref_states = _model_state(_RoundingErrors, monkeypatch), _model_state(old._RoundingErrors, monkeypatch)
    seen = set()
    for z, k in CASES:
        if z.shape[1] == 200 and k == (200 if store else 199):  # n = 200, k = n - 1 stored, k = n not (time)
            continue
        new, ref = _quiet(_ws_faithful, z, k, store), _quiet(old._ws_faithful, z, k, store)
        where = f"n={z.shape[1]} k={k} B={z.shape[0]}"
        assert _same(new.p, ref.p) and _same(new.q, ref.q), where
        assert _same(new.codes(), ref.codes()) and _same(new.level, ref.level), where
        assert _same(new.value, ref.value) and new.messages == ref.messages, where
        assert new.aux.keys() == ref.aux.keys(), where
        for name in ref.aux:
            assert _same(new.aux[name], ref.aux[name]), (where, name)
        (new_state,), (ref_state,) = new_states, ref_states
        assert new_state.keys() == ref_state.keys(), where
        assert all(_same(new_state[name], ref_state[name]) for name in ref_state), where
        new_states.clear(), ref_states.clear()
        seen.update(ref.codes().tolist())
        seen.update(m.split(":")[1].split()[0] for m in ref.messages.values())
    # both kinds of ill-conditioned row (the estimate's "step", the cancelled V's "round") were reached
    assert {"ok", "ill-conditioned", "step", "round"} <= seen
