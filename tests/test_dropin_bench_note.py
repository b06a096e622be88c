"""The drop-in bench's note explains a forward + backward time below the forward's."""

from __future__ import annotations

from topk_cli.frameworks.dropin_bench import DropinBenchReport, DropinResult, DropinTiming
from topk_cli.render.common import OutputFormat
from topk_cli.render.dropin_bench import render_dropin_bench


def _report(framework: str, fwd_bwd: float) -> DropinBenchReport:
    numpy = DropinTiming("numpy", 10.0, 12.0)
    result = DropinResult("hard", DropinTiming("hard", 9.0, fwd_bwd), numpy, 1.0)
    fields = DropinBenchReport.__dataclass_fields__
    values = {"framework": framework, "version": "0", "device": "cpu", "batch": 4, "n": 8, "k": 2.0, "tau": 1.0,
              "dtype": "float32", "repeats": 1, "results": (result,), "topk": DropinTiming("topk", 2.0, 3.0),
              "softmax": DropinTiming("softmax", 1.0, 2.0), "threads": 1, "source": "random normal scores"}
    return DropinBenchReport(**{name: values[name] for name in fields})


def test_note_explains_a_backward_below_zero() -> None:
    jax_text = render_dropin_bench(_report("jax", 0.2), OutputFormat.table)
    assert "XLA leaving out a forward" in " ".join(jax_text.split())
    torch_text = " ".join(render_dropin_bench(_report("torch", 0.2), OutputFormat.table).split())
    assert "timings' noise." in torch_text and "XLA" not in torch_text
    plain = " ".join(render_dropin_bench(_report("torch", 12.0), OutputFormat.table).split())
    assert "noise" not in plain
