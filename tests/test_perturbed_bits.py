"""``perturbed`` gives the same bits as before its passes were cut (the verbatim copy in
``perturbed_old.py``): ``p``, ``q``, ``stderr``, ``potential``, the VJP and the Jacobian with its
standard error, compared as raw 64-bit patterns (so even the sign of a zero counts), on rows with
ties, masked entries, spreads from 1e-3 to 1e17 (where z + Z ties exactly), n from 1 to 60 with k
from 1 to n, several rows, sample counts from 4 to 1000 and several seeds."""

from __future__ import annotations

import functools
import inspect

import numpy as np
import perturbed_old as old
import pytest

from topk_cli.operators import perturbed as new
from topk_cli.operators._base import Forward

Case = tuple[np.ndarray, int, int, int]  # z, k, samples, seed


def _row(rng: np.random.Generator, n: int, spread: float, kind: str) -> np.ndarray:
    """One row of ``z`` with largest finite entry 0 (masked entries ``-inf``, at least one finite)."""
    x = rng.standard_normal(n)
    if kind == "ties":  # exact ties in groups (at a large spread z + Z ties too)
        x = np.round(x * 2.0) / 2.0
    elif kind == "equal":
        x = np.zeros(n)
    z = x * spread
    if kind == "masked" and n > 1:
        z[rng.choice(n, size=rng.integers(1, n), replace=False)] = -np.inf
    return z - z[np.isfinite(z)].max()


@functools.cache
def _cases() -> list[Case]:
    rng = np.random.default_rng(20261124)
    cases: list[Case] = []
    kinds = ("plain", "ties", "masked", "equal")
    for n in (1, 2, 3, 5, 9, 17, 33, 60):
        for spread in (1e-3, 1.0, 30.0, 1e6, 1e17):
            kind = kinds[len(cases) % len(kinds)]
            rows = np.stack([_row(rng, n, spread, kind) for _ in range(int(rng.integers(1, 4)))])
            live = int(np.isfinite(rows).sum(axis=1).min())
            k = int(rng.integers(1, live + 1))
            samples = int(rng.choice([4, 6, 10, 50, 200, 1000]))
            cases.append((rows, k, samples, int(rng.integers(0, 5))))
        for k in sorted({1, 2, n // 2, n // 2 + 1, n - 1, n} & set(range(1, n + 1))):
            # every n with k at its ends and around n / 2 (where the marking switches to the complement)
            rows = np.stack([_row(rng, n, 1.0, "plain"), _row(rng, n, 1e17, "ties")])
            cases.append((rows, k, 1000, 0))
    # a batch mixing every kind (masks in some rows only), the default samples; one of its rows has
    # fewer than k unmasked entries (the API never passes such a row: the same bits all the same)
    mix = np.stack([_row(rng, 12, s, kind) for s in (1e-3, 1.0, 1e6) for kind in kinds])
    cases.append((mix, 3, 1000, 0))
    return cases


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def _forward_differences(fwd: Forward, ref: Forward) -> list[str]:
    out = [name for name in ("p", "q") if not np.array_equal(_bits(getattr(fwd, name)), _bits(getattr(ref, name)))]
    if fwd.aux.keys() != ref.aux.keys():
        return [*out, "aux keys"]
    return out + [name for name in ref.aux if not np.array_equal(_bits(fwd.aux[name]), _bits(ref.aux[name]))]


@functools.cache
def _reference() -> list[Forward]:
    return [old.perturbed_forward(z, k, samples=s, seed=seed) for z, k, s, seed in _cases()]


def test_the_cases_cover_ties_masks_and_every_k() -> None:
    cases = _cases()
    assert any(np.isneginf(z).any() for z, *_ in cases)
    assert {k for z, k, *_ in cases if k == z.shape[1]} and {1} <= {k for _, k, *_ in cases}
    assert {4, 1000} <= {s for *_, s, _ in cases}
    z, k, *_ = cases[-1]
    assert np.isfinite(z).sum(axis=1).min() < k  # a masked entry is selected in that row
    # at a spread of 1e17 the noise vanishes in z + Z, which ties exactly (argpartition's choice among
    # ties is what is compared there)
    tied = 0
    for z, k, samples, seed in cases:
        if k < z.shape[1] and np.isfinite(z).all():
            scores = z[:, None, :] + new.perturbation_noise(z.shape[1], samples, seed).T
            top = np.sort(scores, axis=-1)[..., ::-1]
            tied += int(np.sum(top[..., k - 1] == top[..., k]))
    assert tied > 1000


def test_the_forward_gives_the_same_bits_as_before() -> None:
    for (z, k, samples, seed), ref in zip(_cases(), _reference(), strict=True):
        fwd = new.perturbed_forward(z, k, samples=samples, seed=seed)
        assert not _forward_differences(fwd, ref), (z.shape, k, samples, seed, _forward_differences(fwd, ref))


def test_the_forward_gives_the_same_bits_over_several_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # blocks of a few rows: masked and unmasked rows fall in separate and shared blocks
    monkeypatch.setattr(new, "_BLOCK", 3 * 500 * 12)
    monkeypatch.setattr(old, "_BLOCK", 3 * 500 * 12)
    z, k, samples, seed = _cases()[-1]
    fwd = new.perturbed_forward(z, k, samples=samples, seed=seed)
    assert len(new._blocks(z.shape[0], samples // 2, z.shape[1])) == 4
    assert not _forward_differences(fwd, old.perturbed_forward(z, k, samples=samples, seed=seed))


def test_the_vjp_and_the_jacobian_give_the_same_bits_as_before() -> None:
    rng = np.random.default_rng(5)
    for z, k, samples, seed in _cases()[::3]:
        v = rng.standard_normal(z.shape)
        fwd = new.perturbed_forward(z, k, samples=samples, seed=seed)
        got = new.perturbed_vjp(fwd, z, k, v, samples=samples, seed=seed)
        want = old.perturbed_vjp(fwd, z, k, v, samples=samples, seed=seed)
        assert np.array_equal(_bits(got), _bits(want)), (z.shape, k, samples, seed)
        jac = new.perturbed_jacobian_with_stderr(z, k, samples=samples, seed=seed)
        ref = old.perturbed_jacobian_with_stderr(z, k, samples=samples, seed=seed)
        assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(jac, ref, strict=True)), (z.shape, k)


@pytest.mark.parametrize("masked", [False, True])
def test_a_top_k_sum_of_zero_keeps_its_sign(masked: bool) -> None:
    # the selected perturbed scores 0.5 and -0.5 cancel (in the first pair of z + Z, in the second of
    # z - Z): their sum is +0, so is the sum of the negated scores, whose negation -0 would be one bit
    # off (the fallback restores +0)
    z = np.array([[0.0, -1.0, -3.0, -np.inf if masked else -4.0]])
    noise = np.array([[[0.5, 0.5, 5.0, 0.0], [-0.5, -0.5, 1.0, 0.0]]])
    sel = np.array([[[1, 1, 0, 0], [1, 1, 0, 0]]] * 2, dtype=np.uint8)[:, None]
    neg = np.stack([-z[:, None, :] - noise, noise - z[:, None, :]])
    zf = np.where(np.isfinite(z), z, 0.0)[:, None, :]
    want = np.stack([np.where(sel[0] > 0, zf + noise, 0.0).sum(axis=2), np.where(sel[1] > 0, zf - noise, 0.0).sum(axis=2)])
    unguarded = np.negative(np.where(sel, neg, 0.0).sum(axis=-1))
    assert np.array_equal(unguarded, want) and not np.array_equal(_bits(unguarded), _bits(want))
    assert np.array_equal(_bits(new._top_sums(neg, sel, z, noise, masked)), _bits(want))


def _mutated_forward(old_text: str, new_text: str):  # type: ignore[no-untyped-def]
    """The current forward with one piece of its source (or of its top-k sums') replaced: a mutant."""
    namespace = dict(vars(new))
    sources = [inspect.getsource(f) for f in (new._top_sums, new.perturbed_forward)]
    assert sum(source.count(old_text) for source in sources) == 1
    for source in sources:  # the forward last: it calls the namespace's _top_sums
        exec(source.replace(old_text, new_text), namespace)
    return namespace["perturbed_forward"]


@pytest.mark.parametrize(
    ("old_text", "new_text", "changed"),
    [
        ("axis=1) / (pairs - 1)", "axis=1) * (1.0 / (pairs - 1))", ["stderr"]),  # at most one ulp off
        ("half / pairs", "half * (1.0 / pairs)", ["p", "stderr"]),  # at most one ulp off
        ("~np.isfinite(top) | (top == 0.0)", "top == 0.0", ["potential"]),  # a masked entry's score
    ],
)
def test_the_comparison_sees_a_one_ulp_change(old_text: str, new_text: str, changed: list[str]) -> None:
    mutant = _mutated_forward(old_text, new_text)
    found = [
        _forward_differences(mutant(z, k, samples=samples, seed=seed), ref)
        for (z, k, samples, seed), ref in zip(_cases(), _reference(), strict=True)
    ]
    assert changed in found
