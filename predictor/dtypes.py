"""Canonical dtype and weight-format names, their storage sizes, and the math each format runs in.

A *compute dtype* (fp32 ... fp4) names a tensor-core rate in the hardware catalog. A *weight
format* is how a checkpoint stores its linear weights: a compute dtype plus the scales it carries.
Every format states its bytes per weight (scales included), the dtype its math runs in where the
GPU has tensor cores for it, and the dtype it falls back to where it has not (vLLM then runs the
weights through a weight-only kernel: Marlin dequantises them to 16 bits in registers).

| format    | storage                                   | math where supported | elsewhere |
|-----------|-------------------------------------------|----------------------|-----------|
| fp8       | e4m3, one fp32 scale per tensor            | fp8                  | bf16      |
| fp8_block | e4m3, one fp32 scale per 128x128 block     | fp8                  | bf16      |
| nvfp4     | e2m1, one e4m3 scale per 16 weights        | fp4                  | bf16      |
| mxfp4     | e2m1, one e8m0 scale per 32 weights        | fp4                  | bf16      |
| w4a16     | int4, one bf16 scale per group of 128      | bf16                 | fp16      |
| w4a16_mxfp4 | MXFP4 weights, 16-bit activations (Marlin) | bf16               | bf16      |
| w4a8_mxfp4  | MXFP4 weights, MXFP8 activations           | fp8                  | bf16      |

int4 weight-only math runs in fp16 on a GPU without bf16 (V100, T4: vLLM's AWQ / GPTQ kernels); the fp8 and
fp4 formats' weight-only kernels (Marlin) need Ampere, so they have no fallback there (no bf16 peak: refused).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import KernelsightError

#: Compute dtypes: the keys of a GPU's peak table (bytes per element).
COMPUTE_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}


@dataclass(frozen=True)
class WeightFormat:
    """How weights are stored and which math prices them."""

    name: str
    bytes: float        # per weight, scales included
    compute: str        # dtype of the math on a GPU with a peak for it
    fallback: str       # dtype of the math elsewhere (weight-only dequantisation)
    act_bytes: float    # bytes per activation element the kernel reads (quantised activations and their scales)


FORMATS: dict[str, WeightFormat] = {f.name: f for f in (
    *(WeightFormat(d, b, d, d, b) for d, b in COMPUTE_BYTES.items()),
    WeightFormat("fp8_block", 1.0 + 4.0 / (128 * 128), "fp8", "bf16", 1.0 + 4.0 / 128),
    WeightFormat("nvfp4", 0.5 + 1.0 / 16, "fp4", "bf16", 0.5 + 1.0 / 16),
    WeightFormat("mxfp4", 0.5 + 1.0 / 32, "fp4", "bf16", 0.5 + 1.0 / 32),
    WeightFormat("w4a16", 0.5 + 2.0 / 128, "bf16", "fp16", 2.0),
    WeightFormat("w4a16_mxfp4", 0.5 + 1.0 / 32, "bf16", "bf16", 2.0),
    WeightFormat("w4a8_mxfp4", 0.5 + 1.0 / 32, "fp8", "bf16", 1.0 + 1.0 / 32),
)}
# fp8 weights on a GPU without fp8 tensor cores run weight-only (Marlin), as the 4-bit formats do.
FORMATS["fp8"] = WeightFormat("fp8", 1.0, "fp8", "bf16", 1.0)

#: Bytes per element (per weight for formats) of every canonical name.
BYTES = {name: f.bytes for name, f in FORMATS.items()}

_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8",
    "fp8_blockwise": "fp8_block", "fp8_block_scaled": "fp8_block",
    "int4_wo": "w4a16", "int4_awq": "w4a16", "int4_gptq": "w4a16", "w4a16_int4": "w4a16",
    "w4a8_mxfp4_mxfp8": "w4a8_mxfp4", "nvfp4_awq": "nvfp4",
}


def canonical_dtype(name) -> str:
    """'bfloat16' -> 'bf16', 'int4_wo' -> 'w4a16'; unknown names are an error, never a silent default."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise KernelsightError(f"unknown dtype {name!r}: expected one of {sorted(FORMATS)}")
    return key


def dtype_bytes(name) -> float:
    return BYTES[canonical_dtype(name)]


def weight_format(name) -> WeightFormat:
    return FORMATS[canonical_dtype(name)]


def compute_dtype(name, supported) -> str:
    """The dtype whose peak prices `name`'s math on a GPU whose peaks are known for `supported`."""
    fmt = weight_format(name)
    return fmt.compute if fmt.compute in supported else fmt.fallback
