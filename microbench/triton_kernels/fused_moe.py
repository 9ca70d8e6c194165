"""Fused mixture-of-experts MLP in the style of vLLM's Triton fused_moe: route, align, two grouped GEMMs.

1. route: per token, softmax top-k over the router logits (renormalised), and a histogram of the
   (token, expert) pairs that land on this GPU's experts (atomics).
2. align (moe_align_block_size): the pairs sorted by expert, each expert's rows padded to BLOCK_M,
   so every BLOCK_M-row block belongs to one expert; written with atomics, no host sync, so the
   whole layer is CUDA-graph capturable (buffers are sized for the worst case of the shape).
3. gate-up GEMM: one launch over (row block, column block) tiles; each tile gathers its tokens' rows,
   reads its block's expert weights (gate and up columns) and applies SiLU-and-mul in the epilogue.
4. down GEMM: one launch, the same tiling, the top-k routing weight multiplied in the epilogue.
5. sum: each token's top-k rows added (pairs routed to other GPUs' experts are skipped).

Experts 0..E_LOCAL-1 of the router are the ones this GPU holds (w1, w2 hold only them), as vLLM's
expert_map makes of one EP rank's experts. Loop bounds are compile-time constants: the Triton
interpreter cannot index with a runtime scalar under numpy 2.4.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import interpreting, next_pow2


@dataclass(frozen=True)
class MoeConfig:
    """Tile sizes of the two GEMMs (BLOCK_M also pads each expert's rows)."""

    block_m: int
    gate_up_n: int
    down_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def pick_config(rows_per_expert: float) -> MoeConfig:
    """Tiles by the mean rows per local expert: small-M tiles for decode, 128-row tiles for prefill."""
    if rows_per_expert <= 16:
        return MoeConfig(16, 64, 64, 128, 1, 4, 4)
    if rows_per_expert <= 64:
        return MoeConfig(32, 64, 64, 128, 4, 4, 4)
    if rows_per_expert <= 256:
        return MoeConfig(64, 64, 128, 64, 8, 4, 3)
    return MoeConfig(128, 64, 128, 64, 8, 8, 3)


@triton.jit
def _route_kernel(LOGITS, IDS, WEIGHTS, COUNTS, E: tl.constexpr, E_POW2: tl.constexpr, TOP_K: tl.constexpr,
                  K_POW2: tl.constexpr, E_LOCAL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E_POW2)
    x = tl.load(LOGITS + t * E + offs, mask=offs < E, other=-float("inf")).to(tl.float32)
    top = tl.max(x, axis=0)
    slots = tl.arange(0, K_POW2)
    ids = tl.zeros((K_POW2,), dtype=tl.int32)
    vals = tl.zeros((K_POW2,), dtype=tl.float32)
    work = x
    for j in tl.static_range(TOP_K):
        best = tl.argmax(work, axis=0)
        ids = tl.where(slots == j, best, ids)
        vals = tl.where(slots == j, tl.exp(tl.max(work, axis=0) - top), vals)
        work = tl.where(offs == best, -float("inf"), work)
    # softmax then top-k then renormalise == exp(l - max) over the chosen experts only
    vals = vals / tl.sum(vals, axis=0)
    keep = slots < TOP_K
    tl.store(IDS + t * TOP_K + slots, ids, mask=keep)
    tl.store(WEIGHTS + t * TOP_K + slots, vals, mask=keep)
    tl.atomic_add(COUNTS + ids, 1, mask=keep & (ids < E_LOCAL))


@triton.jit
def _align_kernel(COUNTS, CURSOR, EXPERT_IDS, NUM_POST, max_blocks, E_LOCAL: tl.constexpr, E_POW2: tl.constexpr,
                  BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    e = tl.arange(0, E_POW2)
    count = tl.load(COUNTS + e, mask=e < E_LOCAL, other=0)
    padded = (count + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    first = (e * 0 + tl.program_id(0)) == 0  # a vector of bools: a scalar comparison would mask as int32
    tl.store(CURSOR + e, end - padded, mask=(e < E_LOCAL) & first)
    tl.store(NUM_POST + e, tl.sum(padded, axis=0), mask=(e == 0) & first)
    end_block = tl.where(e < E_LOCAL, end // BLOCK_M, max_blocks)
    b = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    # the owner of block b is the first expert whose rows end after it
    owner = tl.sum((end_block[None, :] <= b[:, None]).to(tl.int32), axis=1)
    tl.store(EXPERT_IDS + b, owner, mask=b < max_blocks)


@triton.jit
def _scatter_kernel(IDS, CURSOR, SORTED, num_pairs, E_LOCAL: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = p < num_pairs
    e = tl.load(IDS + p, mask=ok, other=E_LOCAL)
    ok = ok & (e < E_LOCAL)
    slot = tl.atomic_add(CURSOR + e, 1, mask=ok)
    tl.store(SORTED + slot, p, mask=ok)


@triton.jit
def _tile(pid, n_cols: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of a program, row blocks grouped so neighbours share weight columns."""
    num_n = (n_cols + BLOCK_N - 1) // BLOCK_N
    num_m = tl.num_programs(0) // num_n
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit
def _gate_up_kernel(X, W1, H, SORTED, EXPERT_IDS, NUM_POST, num_pairs,
                    N: tl.constexpr, K: tl.constexpr, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_FP32: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(NUM_POST):
        return
    pair = tl.load(SORTED + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    token = (pair // TOP_K).to(tl.int64)
    expert = tl.load(EXPERT_IDS + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    a_ptr = X + token[:, None] * K + offs_k[None, :]
    g_ptr = W1 + expert * (2 * N * K) + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptr, mask=valid[:, None] & k_ok[None, :], other=0.0)
        g = tl.load(g_ptr, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        u = tl.load(g_ptr + N * K, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_FP32:
            a, g, u = a.to(tl.float32), g.to(tl.float32), u.to(tl.float32)
        acc_g = tl.dot(a, g, acc_g)
        acc_u = tl.dot(a, u, acc_u)
        a_ptr += BLOCK_K
        g_ptr += BLOCK_K
    y = acc_g * tl.sigmoid(acc_g) * acc_u
    out = H + pair.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(out, y.to(H.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(A, W2, Y, WEIGHTS, SORTED, EXPERT_IDS, NUM_POST, num_pairs,
                 N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_FP32: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(NUM_POST):
        return
    pair = tl.load(SORTED + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    row = pair.to(tl.int64)
    expert = tl.load(EXPERT_IDS + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    a_ptr = A + row[:, None] * K + offs_k[None, :]
    w_ptr = W2 + expert * (N * K) + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptr, mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_FP32:
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc)
        a_ptr += BLOCK_K
        w_ptr += BLOCK_K
    acc = acc * tl.load(WEIGHTS + row, mask=valid, other=0.0)[:, None]
    tl.store(Y + row[:, None] * N + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _sum_kernel(Y, IDS, OUT, N: tl.constexpr, TOP_K: tl.constexpr, E_LOCAL: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        local = (offs * 0 + tl.load(IDS + t * TOP_K + j)) < E_LOCAL  # a vector of bools, as the mask needs
        acc += tl.load(Y + (t * TOP_K + j) * N + offs, mask=ok & local, other=0.0).to(tl.float32)
    tl.store(OUT + t * N + offs, acc.to(OUT.dtype.element_ty), mask=ok)


def route(logits: torch.Tensor, top_k: int, e_local: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert ids [T, k] int32, renormalised weights [T, k] fp32, pairs per local expert [e_local] int32)."""
    tokens, experts = logits.shape
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    counts = torch.zeros(e_local, dtype=torch.int32, device=logits.device)
    _route_kernel[(tokens,)](logits, ids, weights, counts, E=experts, E_POW2=next_pow2(experts), TOP_K=top_k,
                             K_POW2=max(next_pow2(top_k), 2), E_LOCAL=e_local, num_warps=1 if experts <= 128 else 2)
    return ids, weights, counts


def max_blocks(pairs: int, e_local: int, block_m: int) -> int:
    """Row blocks in the worst case: every pair kept, each hit expert's last block one row full."""
    return triton.cdiv(pairs + min(e_local, pairs) * (block_m - 1), block_m)


def align(ids: torch.Tensor, counts: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_align_block_size: (pair ids grouped by expert and padded to block_m with the sentinel `pairs`,
    the expert of each block, the padded row count [1])."""
    pairs, e_local = ids.numel(), counts.numel()
    blocks = max_blocks(pairs, e_local, block_m)
    device = ids.device
    cursor = torch.empty(e_local, dtype=torch.int32, device=device)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=device)
    num_post = torch.empty(1, dtype=torch.int32, device=device)
    _align_kernel[(triton.cdiv(blocks, 64),)](counts, cursor, expert_ids, num_post, blocks, E_LOCAL=e_local,
                                              E_POW2=next_pow2(e_local), BLOCK_M=block_m, CHUNK=64, num_warps=4)
    sorted_ids = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    _scatter_kernel[(triton.cdiv(pairs, 1024),)](ids, cursor, sorted_ids, pairs, E_LOCAL=e_local, BLOCK=1024,
                                                 num_warps=4)
    return sorted_ids, expert_ids, num_post


def fused_moe(x: torch.Tensor, logits: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, top_k: int,
              config: MoeConfig | None = None) -> torch.Tensor:
    """x [T, H], router logits [T, E] over all experts, w1 [E_local, 2I, H] (gate rows then up rows),
    w2 [E_local, H, I]; experts 0..E_local-1 are this GPU's. Returns [T, H] in x's dtype."""
    tokens, hidden = x.shape
    e_local, two_i, _ = w1.shape
    inter = two_i // 2
    pairs = tokens * top_k
    cfg = config or pick_config(pairs / e_local)
    dot_fp32 = interpreting()
    ids, weights, counts = route(logits, top_k, e_local)
    sorted_ids, expert_ids, num_post = align(ids, counts, cfg.block_m)
    blocks = expert_ids.numel()
    act = torch.empty((pairs, inter), dtype=x.dtype, device=x.device)
    _gate_up_kernel[(blocks * triton.cdiv(inter, cfg.gate_up_n),)](
        x, w1, act, sorted_ids, expert_ids, num_post, pairs, N=inter, K=hidden, TOP_K=top_k,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.gate_up_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, DOT_FP32=dot_fp32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    y = torch.empty((pairs, hidden), dtype=x.dtype, device=x.device)
    _down_kernel[(blocks * triton.cdiv(hidden, cfg.down_n),)](
        act, w2, y, weights, sorted_ids, expert_ids, num_post, pairs, N=hidden, K=inter,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.down_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, DOT_FP32=dot_fp32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    block = min(next_pow2(hidden), 1024)
    _sum_kernel[(tokens, triton.cdiv(hidden, block))](y, ids, out, N=hidden, TOP_K=top_k, E_LOCAL=e_local,
                                                        BLOCK=block, num_warps=4)
    return out
