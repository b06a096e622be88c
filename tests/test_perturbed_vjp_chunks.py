"""``perturbed``'s VJP, Jacobian (with its standard error) and ``dp/dk`` (with its standard error)
draw and reduce the samples in the forward's chunks when one row's samples exceed a block (the VJP
of n = 10^6 at 1,000 samples held 4 GB of noise, and more in its temporaries): the same bits as the
one-block estimators of ``perturbed_grad_old.py`` on every case of ``test_perturbed_bits`` (ties,
masks, spreads to 1e17, k from 1 to n), for an integer and a real k, with blocks and noise groups
small enough that every row is chunked and the noise stream is drawn again for each group of pairs;
and their memory no longer grows with the sample count."""

from __future__ import annotations

import functools

import numpy as np
import perturbed_grad_old as old
import pytest
from test_perturbed_bits import _bits, _cases

from topk_cli.analysis.bench import peak_bytes
from topk_cli.operators import perturbed as new


def _real(k: int, z: np.ndarray) -> np.ndarray:
    """A real k per row below the integer one (in ``(k - 1, k)``, > 0): ``c = k`` entries, the k-th partly."""
    return k - np.linspace(0.1, 0.9, z.shape[0]) if k > 1 else np.linspace(0.3, 0.9, z.shape[0])


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and np.array_equal(_bits(got), _bits(want))


_Outputs = tuple[np.ndarray, ...]  # vjp, jacobian, its stderr, dk, its stderr

#: (_BLOCK, _NOISE_BUDGET, the most samples, cases chunked, cases in several groups of pairs): chunks
#: of a few pairs in one group, all 76 cases; chunks of a few pairs in groups of a few (the Jacobian
#: carries its sums from group to group), all cases; one pair a chunk and a group (the stream drawn
#: again for every pair), the 36 cases of at most 200 samples.
_SETTINGS = [(8, 10**9, 1000, 69, 0), (64, 240, 1000, 54, 47), (1, 1, 200, 36, 36)]


def _outputs(module, z: np.ndarray, k: object, samples: int, seed: int,  # type: ignore[no-untyped-def]
             v: np.ndarray) -> _Outputs:
    return (
        module.perturbed_vjp(None, z, k, v, samples=samples, seed=seed),
        *module.perturbed_jacobian_with_stderr(z, k, samples=samples, seed=seed),
        *module.perturbed_dk_with_stderr(z, k, samples=samples, seed=seed),
    )


@functools.cache
def _inputs() -> list[tuple[np.ndarray, object, int, int, np.ndarray]]:
    """Every case of ``test_perturbed_bits`` with its integer k and with a real k per row, and a ``v``."""
    rng = np.random.default_rng(11)
    out = []
    for z, k, samples, seed in _cases():
        v = rng.standard_normal(z.shape)
        live = int(np.isfinite(z).sum(axis=1).min())
        out += [(z, kk, samples, seed, v) for kk in (k, _real(min(k, live), z))]
    return out


@functools.cache
def _references() -> list[_Outputs]:
    return [_outputs(old, *case) for case in _inputs()]


@pytest.mark.parametrize(("block", "budget", "most", "floor", "grouped_floor"), _SETTINGS)
def test_the_chunked_vjp_jacobian_and_dk_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, block: int,
                                                             budget: int, most: int, floor: int,
                                                             grouped_floor: int) -> None:
    monkeypatch.setattr(new, "_BLOCK", block)
    monkeypatch.setattr(new, "_NOISE_BUDGET", budget)
    names = ("vjp", "jacobian", "jacobian stderr", "dk", "dk stderr")
    chunked = grouped = 0
    for (z, k, samples, seed, v), want in zip(_inputs(), _references(), strict=True):
        if samples > most:
            continue
        pairs, n = samples // 2, z.shape[1]
        chunked += pairs * n > block
        grouped += pairs * n > block and pairs > max(1, budget // n)
        got = _outputs(new, z, k, samples, seed, v)
        found = [name for name, a, b in zip(names, got, want, strict=True) if not _same(a, b)]
        assert not found, (z.shape, k, samples, seed, found)
    assert (chunked, grouped) == (2 * floor, 2 * grouped_floor)  # each case with an integer and a real k


def test_the_default_block_chunks_a_long_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # the VJP and dp/dk of a long masked row, chunked with blocks and groups of thousands of pairs
    # and entries; the Jacobian of a shorter row whose pairs span several groups
    monkeypatch.setattr(new, "_BLOCK", 1 << 20)
    monkeypatch.setattr(new, "_NOISE_BUDGET", 1 << 22)
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 20_000)) * 3
    z[0, rng.choice(20_000, 500, replace=False)] = -np.inf
    z -= np.max(np.where(np.isfinite(z), z, -np.inf), axis=1, keepdims=True)
    v = rng.standard_normal(z.shape)
    for k in (50, np.array([49.5, 3.25])):
        assert _same(new.perturbed_vjp(None, z, k, v, samples=600, seed=1),  # type: ignore[arg-type]
                     old.perturbed_vjp(None, z, k, v, samples=600, seed=1))  # type: ignore[arg-type]
        got = new.perturbed_dk_with_stderr(z, k, samples=600, seed=1)
        want = old.perturbed_dk_with_stderr(z, k, samples=600, seed=1)
        assert all(_same(a, b) for a, b in zip(got, want, strict=True))
    monkeypatch.setattr(new, "_BLOCK", 1 << 14)
    monkeypatch.setattr(new, "_NOISE_BUDGET", 1 << 16)
    zj = z[:, :300].copy()
    zj -= np.max(np.where(np.isfinite(zj), zj, -np.inf), axis=1, keepdims=True)
    assert 1000 > (1 << 16) // 300  # 1,000 pairs in groups of 218, chunks of 54
    got = new.perturbed_jacobian_with_stderr(zj, 20, samples=2000, seed=3)
    want = old.perturbed_jacobian_with_stderr(zj, 20, samples=2000, seed=3)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True))


def test_one_pair_or_one_entry_in_a_chunk_sums_as_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # numpy's einsum over a single pair (entry) sums another way once the sum runs over more than
    # 8,192 elements: a chunk of one pair of a row of 20,000 entries (the VJP's weights), and a block
    # of one entry with 10,000 pairs (its sums over the pairs)
    rng = np.random.default_rng(9)
    monkeypatch.setattr(new, "_BLOCK", 1 << 15)  # chunks of 1 pair at n = 20,000
    z = rng.standard_normal((1, 20_000))
    z -= z.max()
    v = rng.standard_normal(z.shape)
    assert _same(new.perturbed_vjp(None, z, 30, v, samples=6, seed=2),  # type: ignore[arg-type]
                 old.perturbed_vjp(None, z, 30, v, samples=6, seed=2))  # type: ignore[arg-type]
    monkeypatch.setattr(new, "_BLOCK", 20_000)  # entries 2 at a time, the last one alone
    z = rng.standard_normal((2, 5))
    z[1, 3] = -np.inf
    z -= np.max(np.where(np.isfinite(z), z, -np.inf), axis=1, keepdims=True)
    v = rng.standard_normal(z.shape)
    assert _same(new.perturbed_vjp(None, z, 2, v, samples=20_000, seed=0),  # type: ignore[arg-type]
                 old.perturbed_vjp(None, z, 2, v, samples=20_000, seed=0))  # type: ignore[arg-type]


@pytest.mark.parametrize(("what", "n", "samples", "budget"), [("vjp", 2000, 1000, 1 << 16),
                                                             ("jacobian", 100, 8000, 1 << 14),
                                                             ("dk", 2000, 1000, 1 << 16)])
def test_the_memory_does_not_grow_with_the_samples(monkeypatch: pytest.MonkeyPatch, what: str, n: int,
                                                   samples: int, budget: int) -> None:
    # one row, noise groups of `budget` elements (512 KiB; 128 KiB for the Jacobian, whose buffers
    # hold a group twice), chunks of a quarter of that; the whole noise is 7.6 MiB (3 MiB for the
    # Jacobian) and twice that at twice the samples. The one-block code held it and several copies
    # (6 to 7 times the noise: 48 and 96 MiB for the VJP, measured); the chunked one holds a group
    # and a chunk whatever the samples (1.5 MiB)
    monkeypatch.setattr(new, "_BLOCK", budget // 4)
    monkeypatch.setattr(new, "_NOISE_BUDGET", budget)
    rng = np.random.default_rng(4)
    z = rng.standard_normal((1, n))
    z -= z.max()
    v = rng.standard_normal(z.shape)
    calls = {
        "vjp": lambda s: new.perturbed_vjp(None, z, 10, v, samples=s, seed=0),  # type: ignore[arg-type]
        "jacobian": lambda s: new.perturbed_jacobian_with_stderr(z, 10, samples=s, seed=0),
        "dk": lambda s: new.perturbed_dk_with_stderr(z, 10, samples=s, seed=0),
    }[what]
    small, large = (peak_bytes(lambda s=s: calls(s)) for s in (samples, 2 * samples))
    noise = 8 * samples // 2 * n  # bytes of the whole noise
    assert small < noise / 2, (small, noise)
    # dp/dk keeps two bits per pair and entry for its standard error, as the forward does
    bits = 2 * samples * n // 8 if what == "dk" else 0
    assert large < small * 1.1 + bits, (small, large)
