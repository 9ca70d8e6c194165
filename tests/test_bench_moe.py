"""The MoE benchmark: routing generators against the cost model's routing, the fused kernels against the
float32 reference (Triton under its interpreter on a CPU), the providers' refusals, the energy sweep grid."""
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the GPU harness needs torch (pip install -e '.[bench]')")

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from hydra import compose, initialize_config_dir  # noqa: E402

from kernelsight.cli import bench as commands  # noqa: E402
from kernelsight.microbench import planning  # noqa: E402
from kernelsight.microbench.providers import BENCHES, get_bench  # noqa: E402
from kernelsight.microbench.providers import moe  # noqa: E402
from kernelsight.microbench.providers.base import PlannedDevice, relative_error  # noqa: E402
from kernelsight.predictor.families import make_shape  # noqa: E402
from kernelsight.predictor.families.moe import DRAWS, TILE, local_routing  # noqa: E402
from kernelsight.predictor.hardware import load_hardware  # noqa: E402
from kernelsight.predictor.paths import conf_dir  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU = torch.device("cpu")


def shape(**kw):
    base = dict(tokens=37, experts=16, top_k=4, hidden=64, intermediate=96, dtype="bf16")
    return make_shape("moe", **{**base, **kw})


def rank_stats(loads: np.ndarray, ep: int) -> np.ndarray:
    """(pairs, hit experts, 128-row tiles) on the local rank: the first experts / ep experts."""
    local = loads[: loads.size // ep]
    return np.array([local.sum(), np.count_nonzero(local), np.ceil(local / TILE).sum()], dtype=float)


def routed(logits: torch.Tensor, top_k: int) -> np.ndarray:
    return moe.route(logits, top_k)[1].cpu().numpy()


# -- routing ----------------------------------------------------------------------------

@pytest.mark.parametrize("tokens,experts,top_k,ep", [(64, 128, 8, 1), (64, 128, 8, 4), (256, 128, 8, 8),
                                                     (64, 256, 8, 8), (4096, 256, 8, 4), (16, 8, 2, 2)])
@pytest.mark.parametrize("alpha", [1.01, 1.2])
def test_power_law_loads_are_local_routings_draws(tokens, experts, top_k, ep, alpha):
    """Fed local_routing's own uniform draws, the generator's most loaded rank is the one it prices."""
    rng = np.random.default_rng(0)
    mean = np.zeros(3)
    for _ in range(DRAWS):
        loads = moe.power_law_loads(rng.random(experts), tokens, top_k, ep, alpha)
        assert loads.sum() == tokens * top_k and loads.max() <= tokens
        per_rank = loads.reshape(ep, -1).sum(axis=1)
        assert per_rank[0] == per_rank.max()  # the measured rank is the most loaded
        mean += rank_stats(loads, ep) / DRAWS
    np.testing.assert_allclose(mean, local_routing(tokens, experts, top_k, ep, f"power_law_{alpha}"), rtol=1e-12)


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 128, 4), (1024, 8, 2), (16384, 32, 4)])
def test_power_law_keeps_each_expert_under_tokens(tokens, experts, top_k):
    """Where a drawn load exceeds the tokens (no token picks an expert twice), the excess moves to other
    experts, and the router's top-k realises exactly the loads."""
    u = np.random.default_rng(3).random(experts)
    loads = moe.power_law_loads(u, tokens, top_k, 1, 1.2)
    assert loads.sum() == tokens * top_k and loads.max() <= tokens
    ids = moe.ids_from_loads(loads, tokens, top_k)
    assert all(len(set(row)) == top_k for row in ids.tolist())
    np.testing.assert_array_equal(np.bincount(ids.reshape(-1), minlength=experts), loads)
    if tokens == 1:  # a single token hits top_k distinct experts, picked by the draw, not by expert id
        assert np.count_nonzero(loads) == top_k and set(np.flatnonzero(loads)) != set(range(top_k))


@pytest.mark.parametrize("tokens,experts,top_k,ep", [(1, 128, 8, 1), (4, 128, 8, 2), (64, 128, 8, 1),
                                                     (1024, 256, 8, 8), (16, 8, 2, 1), (256, 32, 4, 4)])
def test_balanced_routing_is_aiconfigurators(tokens, experts, top_k, ep):
    s = shape(tokens=tokens, experts=experts, top_k=top_k, moe_ep=ep, distribution="balanced")
    ids = routed(moe.routing_logits(s, CPU, torch.Generator().manual_seed(0)), top_k)
    stride = -(-experts // top_k)
    t, i = np.arange(tokens)[:, None], np.arange(top_k)[None, :]
    first = t if tokens >= stride else t * stride // tokens
    np.testing.assert_array_equal(np.sort(ids, 1), np.sort((first + i * stride) % experts, 1))
    loads = np.bincount(ids.reshape(-1), minlength=experts)
    pairs, hit, _ = local_routing(tokens, experts, top_k, ep, "balanced")
    np.testing.assert_allclose(rank_stats(loads, ep)[:2], [pairs, hit])


@pytest.mark.parametrize("tokens,experts,top_k,ep", [(16, 128, 8, 1), (64, 128, 8, 4), (4, 32, 4, 1)])
def test_uniform_routing_matches_the_expectation(tokens, experts, top_k, ep):
    s = shape(tokens=tokens, experts=experts, top_k=top_k, moe_ep=ep, distribution="uniform")
    stats = np.mean([rank_stats(np.bincount(routed(moe.routing_logits(s, CPU, torch.Generator().manual_seed(seed)),
                                                   top_k).reshape(-1), minlength=experts), ep)
                     for seed in range(200)], axis=0)
    np.testing.assert_allclose(stats[:2], local_routing(tokens, experts, top_k, ep, "uniform")[:2], rtol=0.05)


@pytest.mark.parametrize("distribution", ["uniform", "balanced", "power_law_1.01", "power_law_1.2"])
def test_routing_is_a_function_of_the_seed(distribution):
    s = shape(tokens=64, experts=32, top_k=4, moe_ep=2, distribution=distribution)

    def ids(seed):
        return routed(moe.routing_logits(s, CPU, torch.Generator().manual_seed(seed)), s.top_k)
    np.testing.assert_array_equal(ids(5), ids(5))
    if distribution != "balanced":
        assert not np.array_equal(ids(5), ids(6))
    if distribution.startswith("power_law"):  # the logits realise the generator's loads, local rank first
        gen = torch.Generator().manual_seed(5)
        u = torch.rand(32, generator=gen, dtype=torch.float64).numpy()
        loads = moe.power_law_loads(u, 64, 4, 2, float(distribution.removeprefix("power_law_")))
        np.testing.assert_array_equal(np.bincount(ids(5).reshape(-1), minlength=32), loads)


# -- kernels against the float32 reference ------------------------------------------------------

CASES = [dict(), dict(distribution="power_law_1.2", moe_ep=2), dict(distribution="balanced", moe_tp=2),
         dict(tokens=1, experts=32, top_k=8, hidden=72, intermediate=40), dict(dtype="fp16", tokens=70)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_triton_fused_moe_matches_the_reference(case):
    pytest.importorskip("triton")
    s = shape(**case)
    inputs = moe.make_inputs(s, DEVICE, torch.Generator(device=DEVICE).manual_seed(1))
    expected = moe.reference(s, inputs, {})
    out = moe._triton_build(s, inputs)()
    assert out.shape == expected.shape and out.dtype == inputs["x"].dtype
    assert relative_error(out, expected) < 1.5e-2


def test_triton_align_pads_every_expert_to_its_own_blocks():
    pytest.importorskip("triton")
    from kernelsight.microbench.triton_kernels import fused_moe as fm

    ids = torch.tensor([[0, 3], [3, 5], [0, 3], [6, 2]], dtype=torch.int32, device=DEVICE)  # 5, 6: other rank
    counts = torch.bincount(ids[ids < 4].long(), minlength=4).int()
    sorted_ids, expert_ids, num_post = fm.align(ids.reshape(-1), counts, block_m=16)
    assert int(num_post) == 48  # experts 0, 2, 3 hit: three padded blocks
    rows = sorted_ids.view(-1, 16).cpu()
    assert expert_ids[:3].tolist() == [0, 2, 3]
    assert sorted(rows[0][rows[0] < 8].tolist()) == [0, 4] and rows[1][rows[1] < 8].tolist() == [7]
    assert sorted(rows[2][rows[2] < 8].tolist()) == [1, 2, 5]
    assert (rows[3:] == 8).all()


def test_grouped_mm_path_matches_the_reference():
    s = shape(distribution="power_law_1.2", moe_ep=2)
    inputs = moe.make_inputs(s, DEVICE, torch.Generator(device=DEVICE).manual_seed(2))
    try:
        out = moe._grouped_build(s, inputs)()
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch {torch.__version__} has no grouped_mm here: {e}")
    assert relative_error(out, moe.reference(s, inputs, {})) < 1e-2


def test_fp8_path_scales_rows_and_columns(monkeypatch):
    """The fp8 call's layout (rowwise activation scales [M], weight scales [experts, N]) against an emulation
    of torch._scaled_grouped_mm where the real kernel has no CPU implementation."""
    def emulated(a, b, scale_a, scale_b, offs, out_dtype, use_fast_accum):
        out = torch.zeros((a.shape[0], b.shape[-1]), dtype=torch.float32)
        start = 0
        for g, end in enumerate(offs.tolist()):
            out[start:end] = (a[start:end].float() * scale_a[start:end, None]) @ (b[g].float() * scale_b[g][None, :])
            start = end
        return out.to(out_dtype)

    if DEVICE.type == "cpu":
        monkeypatch.setattr(torch, "_scaled_grouped_mm", emulated, raising=False)
    s = shape(dtype="fp8", hidden=64, intermediate=96, moe_ep=2, distribution="uniform")
    inputs = moe.make_inputs(s, DEVICE, torch.Generator(device=DEVICE).manual_seed(3))
    assert inputs["w1"].dtype == torch.float8_e4m3fn and inputs["w1_scale"].shape == (8, 192)
    assert relative_error(moe._grouped_build(s, inputs)(), moe.reference(s, inputs, {})) < 8e-2


# -- refusals -----------------------------------------------------------------------------

def _provider(name):
    return next(p for p in get_bench("moe").providers if p.name == name)


@pytest.mark.parametrize("name,kw,device,reason", [
    ("torch.grouped_mm", {}, CPU, "runs on CUDA GPUs only"),
    ("torch.grouped_mm", {}, PlannedDevice((8, 0)), "compute capability >= 9.0"),
    ("torch.grouped_mm", {}, PlannedDevice((9, 0)), None),
    ("torch.grouped_mm", dict(dtype="fp16"), PlannedDevice((9, 0)), "bf16 only, not fp16"),
    ("torch.grouped_mm", dict(hidden=100), PlannedDevice((9, 0)), "divisible by 8"),
    ("torch.scaled_grouped_mm", {}, PlannedDevice((9, 0)), "the fp8 path"),
    ("torch.scaled_grouped_mm", dict(dtype="fp8"), PlannedDevice((9, 0)), None),
    ("torch.scaled_grouped_mm", dict(dtype="fp8"), PlannedDevice((8, 9)), "compute capability >= 9.0"),
    ("torch.scaled_grouped_mm", dict(dtype="fp8", intermediate=72), PlannedDevice((9, 0)), "divisible by 16"),
    ("triton.fused_moe", dict(dtype="fp8"), PlannedDevice((9, 0)), "bf16/fp16 weights, not fp8"),
    ("triton.fused_moe", dict(dtype="fp16"), CPU, None),
    ("vllm.fused_moe", dict(moe_ep=2), PlannedDevice((9, 0)), "moe_ep must be 1"),
])
def test_providers_say_why_they_skip_a_shape(name, kw, device, reason):
    why = _provider(name).supports(shape(**kw), device)
    assert why is None if reason is None else reason in why, why


def test_the_interpreter_refuses_real_models_expert_weights(monkeypatch):
    """It copies every argument to the host at each launch: a 1.2 GB expert stack takes minutes per call."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton_moe = _provider("triton.fused_moe")
    assert "copies every argument" in triton_moe.supports(shape(experts=128, hidden=2048, intermediate=768), CPU)
    assert triton_moe.supports(shape(experts=128, hidden=2048, intermediate=768), PlannedDevice((9, 0))) is None
    assert triton_moe.supports(shape(), CPU) is None


def test_scaled_grouped_mm_missing_from_torch_is_a_reason(monkeypatch):
    monkeypatch.delattr(torch, "_scaled_grouped_mm", raising=False)
    why = _provider("torch.scaled_grouped_mm").supports(shape(dtype="fp8"), PlannedDevice((9, 0)))
    assert "has no _scaled_grouped_mm" in why


# -- sweep grids -------------------------------------------------------------------------------

def compose_bench(overrides):
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        return compose(config_name="bench", overrides=overrides)


MODELS = {(128, 4, 2880, 2880, 1), (32, 4, 2880, 2880, 1), (256, 8, 3072, 1536, 1), (128, 8, 2048, 768, 1),
          (128, 8, 4096, 1536, 4), (8, 2, 4096, 14336, 1)}


def test_energy_sweep_fits_seven_minutes_and_covers_every_family():
    cfg = compose_bench(["sweep=energy"])
    plan = commands.plan(cfg, PlannedDevice(capability=(9, 0)))
    est = commands.estimate(cfg, plan.items, plan.collectives, load_hardware("h100_sxm"))
    assert 60 < est["total"] <= 7 * 60, est
    families = set(BENCHES)  # every kernel family the harness can time
    assert {i.family for i in plan.items} == families
    energy = planning.energy_policy(commands.container(cfg.sweep)["energy"])
    assert all(0.2 <= energy(f) <= 0.5 for f in families)
    bf16 = {(i.shape, i.provider.name) for i in plan.items if i.family == "moe" and i.shape.dtype == "bf16"}
    shapes = {s for s, _ in bf16}
    assert bf16 == {(s, p) for s in shapes for p in ("torch.grouped_mm", "triton.fused_moe")}
    ep1 = {s for s in shapes if s.moe_ep == 1}
    assert {(s.experts, s.top_k, s.hidden, s.intermediate, s.moe_tp) for s in ep1} == MODELS
    assert {s.tokens for s in ep1} == {1, 16, 64, 256, 1024, 4096, 16384}
    assert {s.distribution for s in ep1} == {"uniform", "balanced", "power_law_1.2"}
    assert len(ep1) == 7 * 6 * 3 and not plan.dropped_large.get("moe")
    assert any(i.provider.name == "torch.scaled_grouped_mm" for i in plan.items)


def test_energy_sweep_on_a_cpu_turns_energy_off_and_keeps_small_shapes():
    sweep = commands.container(compose_bench(["sweep=energy", "device=cpu"]).sweep)
    assert sweep["energy"]["enabled"] is False and sweep["max_shape_bytes"] == 1e8
    assert sweep["timing"]["max_reps"] <= 3
    plan = commands.plan(compose_bench(["sweep=energy", "device=cpu"]), CPU)
    assert {i.family for i in plan.items} == set(BENCHES) - {"moe"}
    assert plan.dropped_large["moe"] > 0 and "torch.grouped_mm" not in {i.provider.name for i in plan.items}
    assert commands.container(compose_bench(["sweep=energy"]).sweep)["energy"]["enabled"] is True


@pytest.mark.parametrize("grid", ["quick", "full"])
def test_moe_grids_time_the_fused_providers(grid):
    plan = commands.plan(compose_bench([f"sweep={grid}"]), PlannedDevice(capability=(9, 0)))
    names = {i.provider.name for i in plan.items if i.family == "moe"}
    assert {"torch.grouped_mm", "triton.fused_moe"} <= names and "torch.moe_loop" not in names
