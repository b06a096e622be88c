"""What ``softtopk bench --framework torch|jax`` measures: the drop-in operators on one shape, beside the
same framework's ``topk`` and ``softmax`` and the numpy engine, in the same run.

Each drop-in method is timed forward (``soft_topk``) and forward + backward (the gradient of
``sum(p * v)`` with respect to ``x``, a fixed standard normal ``v``). PyTorch runs eagerly; JAX runs
through ``jax.jit`` (compiled in the warm-up call, as in training), each result waited for with
``block_until_ready``; one untimed call first (compilation, lazy imports). The baselines are timed the same way: ``torch.topk`` / ``jax.lax.top_k`` at
``ceil(k)`` (backward through the values) and ``softmax`` along the last axis, and the numpy engine
(:func:`topk_cli.evaluate` forward, :func:`topk_cli.vjp` forward + VJP). Times are medians of
``repeats`` repeats, the repeats of a method's four timings (and of the four baselines) taken in
turn (:func:`topk_cli.analysis.bench.interleaved_seconds`); the ratios (to the numpy
engine, to the framework's softmax, backward to forward) travel between machines better than
milliseconds. Pure measurement: no printing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from topk_cli.errors import InvalidArgumentError

FRAMEWORKS = ("torch", "jax")

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class DropinTiming:
    """Milliseconds per call of one operator: forward, and forward + backward (None: not timed)."""

    name: str
    forward_ms: float
    forward_backward_ms: float | None

    @property
    def backward_ms(self) -> float | None:
        """The backward pass alone: forward + backward minus forward (at least 0)."""
        if self.forward_backward_ms is None:
            return None
        return max(0.0, self.forward_backward_ms - self.forward_ms)


@dataclass(frozen=True)
class DropinResult:
    """One drop-in method: its framework timing, the numpy engine's, and the ratios the targets read."""

    method: str
    framework: DropinTiming
    numpy: DropinTiming
    softmax_forward_ms: float

    @property
    def forward_vs_numpy(self) -> float:
        return self.framework.forward_ms / self.numpy.forward_ms

    @property
    def forward_vs_softmax(self) -> float:
        return self.framework.forward_ms / self.softmax_forward_ms

    @property
    def backward_vs_forward(self) -> float | None:
        bwd = self.framework.backward_ms
        return None if bwd is None else bwd / self.framework.forward_ms


@dataclass(frozen=True)
class DropinBenchReport:
    """Everything ``bench --framework`` shows: the shape, the framework's baselines, one result per method."""

    framework: str
    version: str
    device: str
    threads: int | None
    batch: int
    n: int
    k: int | float
    tau: float
    dtype: str
    repeats: int
    source: str
    topk: DropinTiming
    softmax: DropinTiming
    results: tuple[DropinResult, ...]


def check_framework(framework: str) -> str:
    if framework not in FRAMEWORKS:
        raise InvalidArgumentError(f"--framework must be numpy, torch or jax, got {framework!r}")
    return framework


class _Torch:
    """The timed calls on PyTorch tensors (CPU, eager)."""

    def __init__(self, x: Any, v: Any) -> None:
        import torch

        import topk_cli.torch as dropin

        self.torch, self.dropin = torch, dropin
        self.x = torch.from_numpy(x)
        self.v = torch.from_numpy(v)
        self.version = str(torch.__version__)
        self.device = "cpu"
        self.threads: int | None = int(torch.get_num_threads())

    def forward(self, method: str, k: Any, tau: float) -> Callable[[], object]:
        return lambda: self.dropin.soft_topk(self.x, k, method, tau)

    def forward_backward(self, method: str, k: Any, tau: float) -> Callable[[], object]:
        torch = self.torch

        def run() -> object:
            x = self.x.detach().requires_grad_(True)
            return torch.autograd.grad(self.dropin.soft_topk(x, k, method, tau), x, self.v)

        return run

    def baselines(self, k_int: int) -> tuple[Callable[[], object], ...]:
        torch = self.torch

        def topk_bwd() -> object:
            x = self.x.detach().requires_grad_(True)
            values = torch.topk(x, k_int, dim=-1).values
            return torch.autograd.grad(values, x, self.v[:, :k_int])

        def softmax_bwd() -> object:
            x = self.x.detach().requires_grad_(True)
            return torch.autograd.grad(torch.softmax(x, dim=-1), x, self.v)

        return (lambda: torch.topk(self.x, k_int, dim=-1), topk_bwd,
                lambda: torch.softmax(self.x, dim=-1), softmax_bwd)


class _Jax:
    """The timed calls on JAX arrays, each function compiled by ``jax.jit`` in its warm-up call."""

    def __init__(self, x: Any, v: Any) -> None:
        import jax

        if str(x.dtype) == "float64":
            jax.config.update("jax_enable_x64", True)  # float64 in JAX needs it
        import jax.numpy as jnp

        import topk_cli.jax as dropin

        self.jax, self.jnp, self.dropin = jax, jnp, dropin
        self.x = jnp.asarray(x)
        self.v = jnp.asarray(v)
        self.version = str(jax.__version__)
        self.device = str(self.x.devices().pop().platform) if hasattr(self.x, "devices") else "cpu"
        self.threads = None

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Callable[[], object]:
        compiled = self.jax.jit(fn)
        return lambda: self.jax.block_until_ready(compiled(*args))

    def forward(self, method: str, k: Any, tau: float) -> Callable[[], object]:
        return self._timed(lambda x: self.dropin.soft_topk(x, k, method, tau), self.x)

    def forward_backward(self, method: str, k: Any, tau: float) -> Callable[[], object]:
        jnp = self.jnp
        return self._timed(self.jax.grad(lambda x, v: jnp.sum(self.dropin.soft_topk(x, k, method, tau) * v)),
                           self.x, self.v)

    def baselines(self, k_int: int) -> tuple[Callable[[], object], ...]:
        jax, jnp = self.jax, self.jnp
        top_k = lambda x: jax.lax.top_k(x, k_int)[0]  # noqa: E731
        return (
            self._timed(top_k, self.x),
            self._timed(jax.grad(lambda x, v: jnp.sum(top_k(x) * v[:, :k_int])), self.x, self.v),
            self._timed(lambda x: jax.nn.softmax(x, axis=-1), self.x),
            self._timed(jax.grad(lambda x, v: jnp.sum(jax.nn.softmax(x, axis=-1) * v)), self.x, self.v),
        )


def bench_dropins(
    x: Any, k: int | float, methods: Sequence[str], *, framework: str, tau: float = 1.0, repeats: int = 5,
    min_time: float = 0.02, seed: int | None = 0, source: str = "random normal scores",
    progress: ProgressFn | None = None,
) -> DropinBenchReport:
    """Time the drop-ins ``methods`` on the ``(B, n)`` numpy batch ``x`` (float32 or float64) in
    ``framework``, beside its topk and softmax and the numpy engine.

    Raises:
        InvalidArgumentError: an unknown framework, a method without a drop-in, a per-row ``k``, bad
            ``k`` or ``tau`` (checked by the first call), or ``repeats < 1``.
    """
    import numpy as np

    from topk_cli.analysis.bench import interleaved_seconds
    from topk_cli.api import evaluate, vjp
    from topk_cli.frameworks.dropin_common import check_method

    check_framework(framework)
    label = {"torch": "PyTorch", "jax": "JAX"}[framework]
    names = [check_method(m, label) for m in methods]
    if not names:
        raise InvalidArgumentError("bench needs at least one method")
    if repeats < 1:
        raise InvalidArgumentError(f"--repeats must be >= 1, got {repeats}")
    if x.ndim != 2:
        raise InvalidArgumentError(f"bench needs a (batch, n) array, got shape {x.shape}")
    if not isinstance(k, (int, float)) or isinstance(k, bool):
        raise InvalidArgumentError("bench --framework takes one k for every row (a number), not a k per row")
    v = np.random.default_rng(0 if seed is None else seed).standard_normal(x.shape).astype(x.dtype)
    ops: _Torch | _Jax = _Torch(x, v) if framework == "torch" else _Jax(x, v)
    evaluate(x[:1], k, names[0], tau=tau)  # the numpy API's checks of k and tau, before any timing

    def ms(*fns: Callable[[], object]) -> list[float]:
        for fn in fns:
            fn()  # first-call costs (compilation, lazy imports, autograd set-up) are not what is timed
        # the repeats of the timings compared with each other taken in turn: the process's first
        # seconds (the allocator's thresholds settling) made whichever ran first up to 2x slower
        return [s * 1e3 for s in interleaved_seconds(fns, repeats=repeats, min_time=min_time)]

    k_int = max(1, math.ceil(float(k)))
    topk_f, topk_fb, soft_f, soft_fb = ops.baselines(k_int)
    base = ms(topk_f, topk_fb, soft_f, soft_fb)
    topk = DropinTiming("topk", base[0], base[1])
    softmax = DropinTiming("softmax", base[2], base[3])
    results = []
    for i, name in enumerate(names):
        if progress is not None:
            progress(i, len(names))
        t = ms(ops.forward(name, k, tau), ops.forward_backward(name, k, tau),
               partial(evaluate, x, k, name, tau=tau), partial(vjp, x, k, v, name, tau=tau))
        fw, ref = DropinTiming(name, t[0], t[1]), DropinTiming(name, t[2], t[3])
        results.append(DropinResult(method=name, framework=fw, numpy=ref, softmax_forward_ms=softmax.forward_ms))
    if progress is not None:
        progress(len(names), len(names))
    return DropinBenchReport(
        framework=framework, version=ops.version, device=ops.device, threads=ops.threads, batch=int(x.shape[0]),
        n=int(x.shape[1]), k=k, tau=tau, dtype=str(x.dtype), repeats=repeats, source=source, topk=topk,
        softmax=softmax, results=tuple(results),
    )


def dropin_bench_document(report: DropinBenchReport) -> dict[str, Any]:
    """The report as one JSON-able document."""

    def timing(t: DropinTiming) -> dict[str, Any]:
        return {"forward_ms": t.forward_ms, "forward_backward_ms": t.forward_backward_ms, "backward_ms": t.backward_ms}

    return {
        "framework": report.framework, "version": report.version, "device": report.device,
        "threads": report.threads, "batch": report.batch, "n": report.n, "k": report.k, "tau": report.tau,
        "dtype": report.dtype, "repeats": report.repeats, "source": report.source,
        "baselines": {"topk": timing(report.topk), "softmax": timing(report.softmax)},
        "results": [
            {"method": r.method, report.framework: timing(r.framework), "numpy": timing(r.numpy),
             "forward_vs_numpy": r.forward_vs_numpy, "forward_vs_softmax": r.forward_vs_softmax,
             "backward_vs_forward": r.backward_vs_forward}
            for r in report.results
        ],
    }
