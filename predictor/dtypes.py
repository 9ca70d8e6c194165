"""Canonical dtype names and their storage sizes, shared by every family."""
from __future__ import annotations

from .errors import KernelsightError

BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}

_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "fp8_block": "fp8",
    "nvfp4": "fp4", "mxfp4": "fp4",
}


def canonical_dtype(name) -> str:
    """'bfloat16' -> 'bf16'; unknown names are an error, never a silent default."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in BYTES:
        raise KernelsightError(f"unknown dtype {name!r}: expected one of {sorted(BYTES)}")
    return key


def dtype_bytes(name) -> float:
    return BYTES[canonical_dtype(name)]
