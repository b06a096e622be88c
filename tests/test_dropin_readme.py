"""The README's section "Use it in training" runs: each of its Python blocks is executed as written
(``torch.compile`` with the ``aot_eager`` backend, which traces the same graph without generating
C++ code, to keep the test fast, and ``fullgraph=True``: a graph break fails), and ``bench --framework`` answers on a small shape."""

from __future__ import annotations

import functools
import os
import re

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest
from conftest import ROOT, run_cli

SECTION = "## Use it in training"


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_the_section_has_a_torch_and_a_jax_example() -> None:
    blocks = _blocks()
    assert any("topk_cli.torch" in b for b in blocks) and any("topk_cli.jax" in b for b in blocks), len(blocks)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_readme_example_runs(framework: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = pytest.importorskip(framework)
    if framework == "torch":
        monkeypatch.setattr(module, "compile", functools.partial(module.compile, backend="aot_eager", fullgraph=True))
    (code,) = [b for b in _blocks() if f"topk_cli.{framework}" in b]
    exec(compile(code, f"README.md ({framework} example)", "exec"), {"__name__": "readme_example"})


def test_bench_framework_torch_json() -> None:
    pytest.importorskip("torch")
    code, out, err = run_cli("bench", "--framework", "torch", "-B", "8", "-n", "16", "-k", "2.5", "--repeats", "1",
                             "-m", "thre-exp,hard", "--dtype", "float32", "--format", "json")
    assert code == 0, err
    import json

    doc = json.loads(out)
    assert doc["framework"] == "torch" and doc["dtype"] == "float32" and doc["k"] == 2.5
    assert [r["method"] for r in doc["results"]] == ["thre-exp", "hard"]
    for r in doc["results"]:
        assert r["torch"]["forward_ms"] > 0 and r["numpy"]["forward_backward_ms"] > 0
        assert r["forward_vs_numpy"] > 0 and r["forward_vs_softmax"] > 0
    assert doc["baselines"]["topk"]["forward_ms"] > 0 and doc["baselines"]["softmax"]["forward_backward_ms"] > 0


@pytest.mark.parametrize(("args", "words"), [
    (["-m", "ot-sinkhorn"], "has no PyTorch drop-in"),
    (["--framework", "tensorflow"], "--framework must be numpy, torch or jax"),
])
def test_bench_framework_refusals(args: list[str], words: str) -> None:
    pytest.importorskip("torch")
    base = ["bench", "--framework", "torch", "-B", "4", "-n", "8", "-k", "2", "--repeats", "1"]
    code, _out, err = run_cli(*base, *args)
    assert code == 2 and words in err, (code, err)
