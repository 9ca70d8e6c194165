"""Triton kernels written in this project for what torch has no fused kernel for.

Each module holds one kernel (or a two-stage pair) and a torch-facing wrapper.
On a CUDA GPU they compile; on a CPU they run under the Triton interpreter when
TRITON_INTERPRET=1 is set before the first import (the CPU sweep and the tests
do this). The interpreter stores bfloat16 as raw uint16 and cannot do bf16
arithmetic or dots, so every kernel computes in fp32 after loading; the two
attention kernels feed tl.dot in the input dtype (tensor cores on a GPU) and
are therefore checked in fp16 and fp32 under the interpreter, bf16 on a GPU.
"""
from __future__ import annotations

import os


def interpreting() -> bool:
    """True when triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
