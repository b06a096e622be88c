"""The README's method table ("## The methods") is split into groups by what the methods claim, and
the group of every row, and the ``misses`` column of the second group, follow from the registry's
claims and capabilities: a claim that changes moves its row, or this test fails."""

from __future__ import annotations

import re

from conftest import ROOT

from topk_cli.registry import BASELINE_METHOD, METHODS, MethodSpec

README = ROOT / "README.md"

#: The claims (``Guarantees`` field, README name) an exact map onto the capped simplex makes, besides
#: continuity (``smoothness`` other than discontinuous; ``hard`` is the discontinuous limit itself).
EXACT_CLAIMS = [
    ("range", "range"), ("sum", "sum"), ("monotone_weak", "monotone-weak"), ("shift_invariant", "shift-invariant"),
    ("permutation_equivariant", "permutation-equivariant"), ("hard_limit", "hard-limit"), ("finite", "finite"),
    ("jacobian", "jacobian"),
]
HEADINGS = {
    "exact": "**Exact maps onto the capped simplex**",
    "misses": "**Maps that miss a property**",
    "stochastic": "**Stochastic estimators**",
}


def misses(spec: MethodSpec) -> list[str]:
    """The claims of the first group that ``spec`` does not make, in README order."""
    g = spec.guarantees
    out = [label for attr, label in EXACT_CLAIMS if not getattr(g, attr)]
    if g.smoothness == "discontinuous" and spec.name != BASELINE_METHOD:
        out.append("continuous")
    return out


def expected_group(spec: MethodSpec) -> str:
    if spec.capabilities.monte_carlo:
        return "stochastic"
    return "misses" if misses(spec) else "exact"


def _section() -> list[str]:
    text = README.read_text()
    start = text.index("\n## The methods\n")
    end = text.index("**The soft top-k sum**", start)
    return text[start:end].splitlines()


def _rows_by_group() -> dict[str, list[list[str]]]:
    groups: dict[str, list[list[str]]] = {}
    current = None
    for line in _section():
        heading = next((g for g, h in HEADINGS.items() if line.startswith(h)), None)
        if heading is not None:
            assert heading not in groups, f"two headings {HEADINGS[heading]}"
            current, groups[heading] = heading, []
            continue
        if line.startswith("| `"):
            assert current is not None, f"a method row before the first group heading: {line[:60]}"
            groups[current].append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return groups


def test_every_method_is_in_the_group_its_claims_give() -> None:
    groups = _rows_by_group()
    assert set(groups) == set(HEADINGS)
    seen: list[str] = []
    for group, rows in groups.items():
        assert rows, f"group {group} has no row"
        for cells in rows:
            name = cells[0].strip("`")
            assert name in METHODS, name
            assert expected_group(METHODS[name]) == group, (name, group, misses(METHODS[name]))
            if group == "misses":
                assert cells[1] == ", ".join(misses(METHODS[name])), (name, cells[1])
            seen.append(name)
    assert sorted(seen) == sorted(METHODS)  # every method once


def test_the_groups_are_the_expected_ones_today() -> None:
    """A sanity floor on the rule itself (not on the README): the baseline and the exact threshold maps
    keep every promise, a Monte Carlo method is stochastic, and a method failing one claim misses."""
    assert expected_group(METHODS["hard"]) == "exact" and expected_group(METHODS["grad"]) == "exact"
    assert expected_group(METHODS["thre-sigmoid"]) == "exact"
    assert expected_group(METHODS["perturbed"]) == "stochastic"
    assert misses(METHODS["topk-softmax"]) == ["continuous"]
    assert "shift-invariant" in misses(METHODS["scaled-sigmoid"])
