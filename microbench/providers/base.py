"""What a provider is, how inputs are made, and how an output is checked against the reference.

A provider is one implementation of a kernel family (torch, a triton kernel of
this project, an optional library, the kernels Inductor generates from a torch
function: inductor_provider). `build(shape, inputs)` returns the callable
that is timed; it must not allocate inputs or copy results (work done inside it
is what gets measured). Each family module supplies fresh random inputs and a
float32 reference, so every provider of a family is checked the same way.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from kernelsight.predictor.dtypes import BYTES
from kernelsight.predictor.families import Shape

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp8": torch.float8_e4m3fn}
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def _any_shape(shape: Shape, device: torch.device) -> str | None:
    return None


def _identity(shape: Shape, inputs: dict, out: Any) -> Any:
    return out


@dataclass(frozen=True)
class Provider:
    """One implementation of a family, tagged `name` in every row it produces.

    supports(shape, device): None, or why this shape cannot run here (skipped, not a row).
    requires: the import name of an optional package; the provider exists only where it imports.
    available(device): None, or why the provider cannot run on this device at all.
    unpack(shape, inputs, out): converts the provider's native output to the family's
        reference layout; runs after the timed call, never inside it.
    options: variant parameters the family reference needs too (e.g. the RoPE layout).
    graphable: False when the call syncs with the host (cannot be captured in a CUDA graph).
    always_graph: with cuda_graph=auto, replay from a CUDA graph at every size, not only below graph_below_us:
        the call's host work outlasts small kernels (timed and in the energy loop) where the engine pays none.
    cuda_only: the library has CUDA kernels only (no CPU path): unavailable on any other device.
    build_s: seconds `build` takes per shape before anything is timed (compiling), for the time estimate.
    """

    name: str
    build: Callable[[Shape, dict], Callable[[], Any]]
    supports: Callable[[Shape, torch.device], str | None] = _any_shape
    requires: str | None = None
    available: Callable[[torch.device], str | None] | None = None
    unpack: Callable[[Shape, dict, Any], Any] = _identity
    options: Mapping = field(default_factory=dict)
    graphable: bool = True
    always_graph: bool = False
    cuda_only: bool = False
    build_s: float = 0.0

    @property
    def library(self) -> str:
        return self.name.split(".")[0]

    def unavailable(self, device: torch.device) -> str | None:
        """Why this provider cannot run on `device`, or None (always None when planning for an absent GPU)."""
        if isinstance(device, PlannedDevice):
            return None
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"{self.requires} is not installed"
        if self.cuda_only and device.type != "cuda":
            return f"{self.library} runs on CUDA only"
        if self.library == "triton":
            from kernelsight.microbench.triton_kernels import interpreting
            if importlib.util.find_spec("triton") is None:
                return "triton is not installed"
            if device.type != "cuda" and not interpreting():
                return "triton kernels need a CUDA GPU or TRITON_INTERPRET=1"
        return self.available(device) if self.available else None


@dataclass(frozen=True)
class FamilyBench:
    """The benchmark side of one kernel family: inputs, reference, providers.

    make_inputs(shape, device, generator) -> dict of tensors (never all zero) and host values.
    reference(shape, inputs, options) -> float32 tensor(s); must not modify the inputs.
    observe(shape, inputs, out) -> tensor(s) comparable with the reference (e.g. the
        cache rows a kv_write wrote).
    """

    family: str
    make_inputs: Callable[[Shape, torch.device, torch.Generator], dict]
    reference: Callable[[Shape, dict, Mapping], Any]
    providers: tuple
    observe: Callable[[Shape, dict, Any], Any] = _identity


# -- helpers for the family modules ----------------------------------------------

def randn(size, dtype: str, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Standard-normal tensor of a canonical dtype (fp8: rounded from fp32, |x| <= FP8_MAX)."""
    x = torch.randn(size, generator=gen, device=device, dtype=torch.float32) * scale
    if dtype == "fp8":
        return x.clamp(-FP8_MAX, FP8_MAX).to(TORCH_DTYPES["fp8"])
    return x.to(TORCH_DTYPES[dtype])


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor fp8 (e4m3) quantisation: (x / scale) in fp8 and the float32 scale = amax / FP8_MAX."""
    scale = (x.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(TORCH_DTYPES["fp8"]), scale.reshape(())


def check_dtype(shape: Shape) -> str:
    """The least precise storage dtype of a shape: its error bound applies."""
    names = [getattr(shape, f) for f in ("dtype", "kv_dtype") if hasattr(shape, f)]
    return min(names, key=lambda d: BYTES[d])


def relative_error(actual, expected) -> float:
    """Norm-wise relative error ||actual - expected|| / ||expected|| over all output tensors (inf if non-finite)."""
    pairs = list(zip(actual, expected)) if isinstance(expected, (tuple, list)) else [(actual, expected)]
    diff = ref = 0.0
    for a, e in pairs:
        if a.shape != e.shape:
            raise ValueError(f"output shape {tuple(a.shape)} != reference shape {tuple(e.shape)}")
        a, e = a.reshape(-1), e.reshape(-1)
        for start in range(0, a.numel(), 1 << 24):  # chunks keep float64 copies small
            ac = a[start:start + (1 << 24)].double()
            ec = e[start:start + (1 << 24)].double()
            if not torch.isfinite(ac).all():
                return float("inf")
            diff += float((ac - ec).pow(2).sum())
            ref += float(ec.pow(2).sum())
    return (diff / ref) ** 0.5 if ref > 0 else (0.0 if diff == 0 else float("inf"))


@dataclass(frozen=True)
class PlannedDevice:
    """A CUDA GPU planned for but not present (dry runs on another machine): type and compute capability."""

    capability: tuple
    type: str = "cuda"


def cuda_capability_at_least(device, major: int, minor: int) -> bool:
    if device.type != "cuda":
        return False
    cap = device.capability if isinstance(device, PlannedDevice) else torch.cuda.get_device_capability(device)
    return tuple(cap) >= (major, minor)


def fp8_support(device: torch.device) -> str | None:
    """fp8 kernels need Ada/Hopper (sm89+) on CUDA; the CPU emulates them."""
    if device.type == "cuda" and not cuda_capability_at_least(device, 8, 9):
        return "fp8 needs compute capability >= 8.9"
    return None


def triton_dot_dtype(dtype: str, device) -> str | None:
    """The attention kernels' tl.dot runs in the input dtype: fp16/bf16 only; bf16 not under the interpreter."""
    from kernelsight.microbench.triton_kernels import interpreting

    if dtype not in ("fp16", "bf16"):
        return f"triton attention kernels take fp16/bf16, not {dtype}"
    if dtype == "bf16" and device.type != "cuda" and interpreting():
        return "the triton interpreter cannot compute bf16 dots (numpy has no bf16)"
    return None


# -- Inductor: the kernels vLLM V1 runs for its native layers ----------------------

# Seconds one shape's compile took on an H100 (torch 2.11: 0.6-2.5 s, about 1.5 typically; the first in a
# process 10 s, Inductor's start-up, which the estimate leaves out): data/sweeps/README.md, inductor sweeps.
INDUCTOR_BUILD_S = 1.5


def inductor_provider(name: str, native: Callable[[Shape, dict], Any], **kwargs) -> Provider:
    """A provider timing what Inductor generates from `native(shape, inputs)`, a plain torch function written
    as vLLM writes the layer's forward_native (no in-place updates: vLLM's compiled graph is functional).

    vLLM V1 compiles its model with torch.compile, and with custom ops off by default (CustomOp.default_on)
    RMSNorm, SiluAndMul and RotaryEmbedding run as the Triton kernels Inductor generates for their native
    forms (C++ kernels on a CPU). build compiles per shape (fullgraph=True, dynamic=False, Inductor's default
    mode: no CUDA graphs of its own, so the harness can capture the call) and runs the compiled call once, so
    compiling and autotuning are done before the correctness check and the timing. kwargs go to Provider.

    A compiled call spends tens of microseconds on the host (Dynamo's guards, Inductor's Python wrapper), more
    than a small kernel takes: it is always timed from a CUDA graph (always_graph), as vLLM replays these
    kernels from CUDA graphs or runs them inside one compiled region per layer, not one call per kernel.
    """
    extra = kwargs.pop("available", None)

    def available(device) -> str | None:
        return _inductor_unavailable(device) or (extra(device) if extra else None)

    return Provider(name, _inductor_build(native), available=available, always_graph=True,
                    build_s=INDUCTOR_BUILD_S, **kwargs)


def _inductor_unavailable(device) -> str | None:
    """Why torch.compile cannot make Inductor kernels on `device`, or None."""
    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return f"torch.compile is not supported by torch {torch.__version__} on this Python"
        if device.type == "cuda":
            from torch.utils._triton import has_triton

            if not has_triton():
                return "Inductor's CUDA kernels need triton and a GPU of compute capability >= 7.0"
            return None
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()  # Inductor's CPU kernels are C++ (g++ --version)
    except Exception as e:  # noqa: BLE001 - whatever stops Inductor here is the reason
        return f"torch.compile (Inductor) cannot run on {device.type}: {_one_line(_innermost(e))}"
    return None


def _innermost(e: BaseException) -> BaseException:
    """The exception at the bottom of a chain (Dynamo wraps Inductor's and the compiled call's errors)."""
    seen = {id(e)}
    while True:
        nxt = getattr(e, "inner_exception", None) or e.__cause__
        if nxt is None or id(nxt) in seen:
            return e
        seen.add(id(nxt))
        e = nxt


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _inductor_build(native: Callable[[Shape, dict], Any]) -> Callable[[Shape, dict], Callable[[], Any]]:
    def build(shape: Shape, inputs: dict) -> Callable[[], Any]:
        names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
        fixed = {k: v for k, v in inputs.items() if k not in names}

        def forward(*tensors):
            return native(shape, {**fixed, **dict(zip(names, tensors))})

        # Every build compiles the same `forward` code object for another shape: past Dynamo's recompile limit
        # (8) fullgraph refuses it (older torch ran it eagerly), so each shape starts from empty caches (the
        # previous shape's compiled call is no longer used).
        torch.compiler.reset()
        compiled = torch.compile(forward, fullgraph=True, dynamic=False)
        args = tuple(inputs[k] for k in names)
        try:
            compiled(*args)  # compile (and autotune) now, outside any timed call
        except Exception as e:  # noqa: BLE001 - a failed row says why, in one line
            cause = _innermost(e)
            if isinstance(cause, torch.OutOfMemoryError):
                raise cause from None  # the runner's out-of-memory row
            raise RuntimeError(f"torch.compile (Inductor) failed: {_one_line(cause)}") from e
        return lambda: compiled(*args)
    return build
