"""GradTopK's reference tables and weights, and the recursion outlook built on them: the faster
code gives the bits of the previous one (kept verbatim in ``esp_v0``)."""

from __future__ import annotations

import esp_v0 as old
import numpy as np
import pytest

from topk_cli.analysis.probe_grid import draw_scores
from topk_cli.api import scaled_scores
from topk_cli.recursion import outlook_from_tables
from topk_cli.references import ReferenceContext, esp_tables, esp_weights, weights_len


def _batches() -> list[np.ndarray]:
    out = []
    for n, scale in ((9, 0.5), (120, 2.0), (120, 40.0), (160, 700.0), (160, 9000.0)):
        z = scaled_scores(scale * draw_scores(n, 5, dist="normal", seed=3), 1)
        z[1, 3] = z[1, 4]  # a tie
        z[2, n - 2] = -np.inf  # a masked entry
        z[3, : n - 4] = -np.inf  # fewer finite entries than the larger k
        z[3] -= np.max(z[3])
        out.append(z)
    return out


@pytest.mark.parametrize("z", _batches(), ids=lambda z: f"n{z.shape[1]}")
def test_weights_and_outlook_keep_their_bits(z: np.ndarray) -> None:
    n = z.shape[1]
    ks = [k for k in (1, 2, 3, 7, 12) if k <= n]
    before = old.esp_tables(z, max(ks), n)
    ctx = ReferenceContext(z, max(ks))
    for k in ks:
        assert esp_weights(ctx.esp(), k).tobytes() == old.esp_weights(before, k).tobytes(), k
        with np.errstate(invalid="ignore"):  # rows with few finite entries (as before)
            a, b = old.outlook_from_tables(before, k), outlook_from_tables(ctx.esp(), k)
        for field in ("predicted_level", "saturation_level", "min_complement", "digits_lost"):
            assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), (k, field)


def test_skipped_weights_are_zero() -> None:
    """Positions past ``weights_len`` have weight 0 in the full computation too, and some are cut."""
    z = scaled_scores(3000.0 * draw_scores(60, 4, dist="normal", seed=5), 1)
    full = old.esp_tables(z, 5, 60)
    for k in (1, 2, 5):
        m = weights_len(esp_tables(z, 5).s, k)
        assert k <= m < 60
        p_sorted = np.take_along_axis(old.esp_weights(full, k), full.order, axis=-1)
        assert (p_sorted[:, m:] == 0).all()
