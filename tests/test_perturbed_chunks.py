"""``perturbed``'s forward draws and reduces the samples in chunks when one row's samples exceed a
block (n = 10^6 at 1,000 samples needed 3.7 GiB of noise at once): the same bits as the one-block
estimator of ``perturbed_old.py`` on every case of ``test_perturbed_bits`` (ties, masks, spreads to
1e17, k from 1 to n), with blocks and noise groups small enough that every row is chunked and the
noise stream is drawn again for each group of pairs."""

from __future__ import annotations

import numpy as np
import perturbed_old as old
import pytest
from test_perturbed_bits import _cases, _forward_differences, _reference

from topk_cli.operators import perturbed as new


def test_noise_columns_are_columns_of_the_noise() -> None:
    full = new.perturbation_noise(37, 50, 3)
    np.testing.assert_array_equal(new._noise_columns(37, 50, 3, slice(4, 11)), full[:, 4:11])


@pytest.mark.parametrize(("block", "budget", "floor"), [(8, 40, 60), (64, 10**9, 40), (1, 1, 76)])
def test_the_chunked_forward_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch, block: int, budget: int,
                                                floor: int) -> None:
    monkeypatch.setattr(new, "_BLOCK", block)
    monkeypatch.setattr(new, "_NOISE_BUDGET", budget)
    chunked = 0
    for (z, k, samples, seed), ref in zip(_cases(), _reference(), strict=True):
        chunked += (samples // 2) * z.shape[1] > block
        fwd = new.perturbed_forward(z, k, samples=samples, seed=seed)
        assert not _forward_differences(fwd, ref), (z.shape, k, samples, seed, _forward_differences(fwd, ref))
    assert chunked >= floor  # of 76 cases (a small n with few samples fits a block)


def test_the_default_block_chunks_a_long_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # n * pairs = 2 * 10^6 / 2 > 2^22 / 4: chunked with the real block, against the one-block oracle
    monkeypatch.setattr(new, "_BLOCK", 1 << 20)
    monkeypatch.setattr(new, "_NOISE_BUDGET", 1 << 22)
    rng = np.random.default_rng(0)
    z = rng.standard_normal((1, 20_000)) * 3
    z[0, rng.choice(20_000, 500, replace=False)] = -np.inf
    z -= z[np.isfinite(z)].max()
    fwd = new.perturbed_forward(z, 50, samples=200, seed=1)
    assert not _forward_differences(fwd, old.perturbed_forward(z, 50, samples=200, seed=1))
