"""What a provider is, how inputs are made, and how an output is checked against the reference.

A provider is one implementation of a kernel family (torch, a triton kernel of
this project, an optional library). `build(shape, inputs)` returns the callable
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
    cuda_only: the library has CUDA kernels only (no CPU path): unavailable on any other device.
    """

    name: str
    build: Callable[[Shape, dict], Callable[[], Any]]
    supports: Callable[[Shape, torch.device], str | None] = _any_shape
    requires: str | None = None
    available: Callable[[torch.device], str | None] | None = None
    unpack: Callable[[Shape, dict, Any], Any] = _identity
    options: Mapping = field(default_factory=dict)
    graphable: bool = True
    cuda_only: bool = False

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
