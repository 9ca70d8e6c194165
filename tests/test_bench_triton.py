"""Every triton kernel of microbench against a float32 torch reference.

Without a GPU the kernels run under TRITON_INTERPRET=1 (set before triton is
imported); the interpreter cannot do bf16 dots, so the attention kernels are
checked in fp16 and fp32 here and in bf16 by the CUDA-only test.
"""
import math
import os

import pytest

torch = pytest.importorskip("torch", reason="the GPU harness needs torch (pip install -e '.[bench]')")

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from kernelsight.microbench.providers.attn_prefill import attention_reference  # noqa: E402
from kernelsight.microbench.providers.base import relative_error  # noqa: E402
from kernelsight.microbench.triton_kernels import act, kv_write, paged_decode, prefill, rms_norm, rope  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 on a GPU: tl.dot's default input precision is TF32 (10-bit mantissa), measured 1.5e-3 on an H100;
# the interpreter computes true fp32.
TOL = {torch.float32: 5e-3 if torch.cuda.is_available() else 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def gen(seed=0):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=gen(seed), device=DEVICE).to(dtype)


@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(residual):
    x, w = randn(5, 300, dtype=torch.bfloat16), randn(300, dtype=torch.bfloat16, seed=1)
    res = randn(5, 300, dtype=torch.bfloat16, seed=2) if residual else None
    xs = x.float() + (res.float() if residual else 0)
    expected = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    out = rms_norm.rms_norm(x.clone() if residual else x, w, 1e-6, residual=res)
    assert relative_error(out, expected) < TOL[torch.bfloat16]
    if residual:
        assert relative_error(res, xs) < TOL[torch.bfloat16]


@pytest.mark.parametrize("op,fn", [("silu_mul", torch.nn.functional.silu), ("gelu_mul", torch.nn.functional.gelu),
                                   ("gelu_tanh_mul", lambda a: torch.nn.functional.gelu(a, approximate="tanh"))])
def test_act_and_mul(op, fn):
    x = randn(3, 2 * 2500, dtype=torch.bfloat16)  # 2500 > one 2048-wide block: the loop is exercised
    expected = fn(x[:, :2500].float()) * x[:, 2500:].float()
    assert relative_error(act.act_and_mul(x, op), expected) < TOL[torch.bfloat16]


@pytest.mark.parametrize("neox", [True, False])
def test_rope(neox):
    tokens, heads, kv_heads, dim = 4, 4, 2, 64
    q, k = randn(tokens, heads, dim, dtype=torch.bfloat16), randn(tokens, kv_heads, dim, dtype=torch.bfloat16, seed=1)
    pos = torch.tensor([0, 7, 99, 3], device=DEVICE)
    inv = 10000.0 ** (-torch.arange(dim // 2, device=DEVICE).float() / (dim // 2))
    ang = torch.outer(torch.arange(100, device=DEVICE).float(), inv)
    cos_sin = torch.cat([ang.cos(), ang.sin()], -1).to(torch.bfloat16)
    c, s = cos_sin[pos, :dim // 2].float()[:, None], cos_sin[pos, dim // 2:].float()[:, None]

    def ref(x):
        x = x.float()
        x1, x2 = (x[..., :dim // 2], x[..., dim // 2:]) if neox else (x[..., 0::2], x[..., 1::2])
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        return torch.cat([o1, o2], -1) if neox else torch.stack([o1, o2], -1).flatten(-2)

    eq, ek = ref(q), ref(k)
    rope.rotary_embedding(pos, q, k, cos_sin, neox=neox)
    assert relative_error(q, eq) < TOL[torch.bfloat16] and relative_error(k, ek) < TOL[torch.bfloat16]
    if neox:  # a position-0 rotation is the identity: catches swapped halves
        assert torch.equal(q[0], eq[0].to(torch.bfloat16))


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_reshape_and_cache(cache_dtype):
    tokens, kv_heads, dim, blocks, bs = 20, 2, 64, 4, 16
    scale = 0.5 if cache_dtype != torch.bfloat16 else 1.0
    # values exactly representable in the cache dtype: the write must reproduce them bit for bit
    src_k = (randn(tokens, kv_heads, dim) * 4 / scale).to(cache_dtype)
    src_v = (randn(tokens, kv_heads, dim, seed=1) * 4 / scale).to(cache_dtype)
    key, value = (src_k.float() * scale).to(torch.bfloat16), (src_v.float() * scale).to(torch.bfloat16)
    k_cache = torch.zeros(blocks, bs, kv_heads, dim, dtype=cache_dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(blocks * bs, generator=gen(), device=DEVICE)[:tokens]
    slots[3] = -1  # a padding token: must not be written
    kv_write.reshape_and_cache(key, value, k_cache, v_cache, slots, scale, scale)
    keep = slots >= 0
    assert torch.equal(k_cache.view(-1, kv_heads, dim)[slots[keep]].float(), src_k[keep].float())
    assert torch.equal(v_cache.view(-1, kv_heads, dim)[slots[keep]].float(), src_v[keep].float())
    written = torch.zeros(blocks * bs, dtype=torch.bool, device=DEVICE)
    written[slots[keep]] = True
    assert not k_cache.view(blocks * bs, -1)[~written].float().any()  # nothing else touched


def _decode_case(dtype, window=0, fp8=False, lens=(700, 5, 513)):
    batch, heads, kv_heads, dim, bs = len(lens), 8, 2, 64, 16
    pages = math.ceil(max(lens) / bs)
    k_cache = randn(batch * pages, bs, kv_heads, dim, dtype=dtype, seed=1)
    v_cache = randn(batch * pages, bs, kv_heads, dim, dtype=dtype, seed=2)
    scale = 1.0
    if fp8:
        scale = 0.05
        k_cache, v_cache = ((c.float() / scale).to(torch.float8_e4m3fn) for c in (k_cache, v_cache))
    table = torch.randperm(batch * pages, generator=gen(3), device=DEVICE).view(batch, pages).int()
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = randn(batch, heads, dim, dtype=dtype, seed=4)
    out = paged_decode.paged_decode_attention(q, k_cache, v_cache, table, seq_lens, max(lens), window=window,
                                              k_scale=scale, v_scale=scale)
    for b, length in enumerate(lens):
        slots = (table[b].long()[:, None] * bs + torch.arange(bs, device=DEVICE)).reshape(-1)[:length]
        k = k_cache.view(-1, kv_heads, dim)[slots].float() * scale
        v = v_cache.view(-1, kv_heads, dim)[slots].float() * scale
        expected = attention_reference(q[b:b + 1], k, v, length - 1, True, window)[0]
        assert relative_error(out[b], expected) < TOL[dtype], (b, length)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("window", [0, 300])
def test_paged_decode(dtype, window):
    _decode_case(dtype, window)  # 700 tokens: two KV splits merged; 5 tokens: empty splits


def test_paged_decode_fp8_cache():
    _decode_case(torch.float16, fp8=True, lens=(600, 40))


def _prefill_case(dtype, causal, window):
    q_lens, k_lens, heads, kv_heads, dim = [130, 7, 64], [130, 40, 200], 4, 2, 64
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q = randn(sum(q_lens), heads, dim, dtype=dtype)
    k, v = randn(sum(k_lens), kv_heads, dim, dtype=dtype, seed=1), randn(sum(k_lens), kv_heads, dim, dtype=dtype,
                                                                          seed=2)
    out = prefill.prefill_attention(q, k, v, cu_q, cu_k, max(q_lens), causal=causal, window=window)
    for b in range(len(q_lens)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        expected = attention_reference(q[qs], k[ks], v[ks], k_lens[b] - q_lens[b], causal, window)
        assert relative_error(out[qs], expected) < TOL[dtype], b


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("causal,window", [(True, 0), (True, 50), (False, 0)])
def test_prefill_attention(dtype, causal, window):
    _prefill_case(dtype, causal, window)  # varlen batch, prefixes (bottom-right causal), GQA, 130 > one tile


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tl.dot needs a GPU (the interpreter has no bf16)")
def test_attention_kernels_bf16_on_gpu():
    _decode_case(torch.bfloat16)
    _prefill_case(torch.bfloat16, True, 0)
