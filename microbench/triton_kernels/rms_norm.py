"""Fused RMSNorm, optionally with the residual add (vLLM's rms_norm / fused_add_rms_norm).

One program per row, the tile of predictor's norm cost model. With a residual
the kernel works in place like vLLM: residual <- x + residual, x <- norm(residual) * w.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import next_pow2


@triton.jit
def _rms_norm_kernel(X, RES, W, OUT, n_cols, eps, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(X + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(RES + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(RES + row * n_cols + offs, x.to(RES.dtype.element_ty), mask=mask)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + row * n_cols + offs, (x * rstd * w).to(OUT.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of each row of x [tokens, hidden]; with `residual`, fused add in place (returns x)."""
    tokens, hidden = x.shape
    block = next_pow2(hidden)
    out = x if residual is not None else torch.empty_like(x)
    _rms_norm_kernel[(tokens,)](x, residual if residual is not None else x, weight, out, hidden, eps,
                                BLOCK=block, HAS_RESIDUAL=residual is not None,
                                num_warps=16 if block >= 8192 else 8 if block >= 2048 else 4)
    return out
