"""validate reads a row's whole layout (attention_dp_size, moe_tp_size, moe_ep_size): the experts as vLLM
spreads them, and a layout the simulator cannot represent refused with its reason, never simulated as
another, while the other rows run."""
import pandas as pd
import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.sim.model import load_model
from kernelsight.validate.rows import ValidationRow, default_csv, parallel_for, read_rows

DENSE, MOE = load_model("qwen3-32b"), load_model("qwen3-30b-a3b")


def row(**kw) -> ValidationRow:
    base = dict(row_id="t", line=3, model_path="Qwen/Qwen3-32B", precision="bf16", device="h100_sxm", isl=1024,
                osl=128, concurrency=8, tp=4, pp=1, ttft_ms=100.0, tpot_ms=10.0)
    return ValidationRow(**{**base, **kw})


def test_experts_follow_moe_ep_size_and_a_dense_model_ignores_the_moe_columns():
    assert (parallel_for(row(moe_tp=1, moe_ep=4), MOE).ep, parallel_for(row(moe_tp=1, moe_ep=4), MOE).tp) == (4, 4)
    assert parallel_for(row(moe_tp=4, moe_ep=1), MOE).ep == 1
    assert parallel_for(row(moe_tp=2, moe_ep=2), MOE).moe_tp == 2
    assert parallel_for(row(moe_tp=1, moe_ep=4), DENSE).ep == 1  # meaningless for a dense model


def test_attention_data_parallel_groups_with_experts_over_every_gpu():
    """The source's two-node MiniMax layout: four attention groups of TP 4, experts over all 16 GPUs."""
    par = parallel_for(row(attention_dp=4, moe_tp=1, moe_ep=16), MOE)
    assert (par.tp, par.attention_dp, par.ep, par.moe_tp, par.gpus_per_replica) == (4, 4, 16, 1, 16)
    assert par.moe_link == "net" and par.name == "tp4_adp4_ep16"


@pytest.mark.parametrize("kw, model, message", [
    ({"attention_dp": 4}, DENSE, "attention_dp_size=4: data-parallel attention needs a mixture-of-experts model"),
    ({"moe_tp": 1, "moe_ep": 16}, MOE, "moe_tp_size=1 x moe_ep_size=16: the experts must span the tp_size x "
                                       "attention_dp_size = 4 GPUs"),
])
def test_layouts_the_simulator_cannot_represent_are_refused(kw, model, message):
    with pytest.raises(KernelsightError, match=message):
        parallel_for(row(**kw), model)


def test_moe_columns_of_zero_mean_not_used(tmp_path):
    """Some sources write 0 for the expert columns of a dense run: read as not given, not as an error."""
    csv = tmp_path / "runs.csv"
    df = pd.read_csv(default_csv(), dtype=str, keep_default_na=False).head(2)
    df["moe_tp_size"], df["moe_ep_size"], df["attention_dp_size"] = "0", "0.0", ""
    df.to_csv(csv, index=False)
    assert [(r.moe_tp, r.moe_ep, r.attention_dp) for r in read_rows(csv)] == [(1, 1, 1)] * 2


def test_an_attention_dp_row_is_refused_and_the_others_run(tmp_path, run_cli):
    csv = tmp_path / "runs.csv"
    df = pd.read_csv(default_csv(), dtype=str, keep_default_na=False).head(3)
    df.loc[1, "attention_dp_size"] = "2"
    df.to_csv(csv, index=False)
    code, out, err = run_cli(["validate", f"csv={csv}", "protocol.num_requests=12", f"report={tmp_path}/r.md",
                              f"table={tmp_path}/t.csv", "tiers.cross=null", "plots=false", "jobs=1"], cwd=tmp_path)
    assert code in (0, None), err
    assert "row 2: attention_dp_size=2: data-parallel attention needs a mixture-of-experts model" in err
    table = pd.read_csv(tmp_path / "t.csv")
    assert table["refused"].notna().sum() == 1 and len(table) == 3


def test_the_cross_tier_has_one_bundle_per_validated_gpu(tmp_path, monkeypatch):
    """A row's GPU is never in the cross tier's training data: H100 rows without any H100-class GPU, H200 rows
    without the H200; a GPU the mapping does not name is fitted without itself."""
    from kernelsight.validate.score import excluded, parse_tiers

    monkeypatch.setenv("KERNELSIGHT_CACHE", str(tmp_path))
    [(tier, exclude)] = parse_tiers({"cross": {"predictor_tier": "cross", "bundle": "no_{device}", "exclude_devices": {
        "h100_sxm": ["h100_sxm", "gh200"], "h200_sxm": ["h200_sxm"]}}})
    assert tier.on("h200_sxm").bundle == str(tmp_path / "bundles" / "no_h200_sxm")
    assert excluded(exclude, "h100_sxm") == ["h100_sxm", "gh200"] and excluded(exclude, "b200_sxm") == ["b200_sxm"]
    with pytest.raises(KernelsightError, match="needs one bundle per GPU"):
        parse_tiers({"cross": {"predictor_tier": "cross", "bundle": "no_h100", "exclude_devices": {"h100_sxm": []}}})
    [(single, ex)] = parse_tiers({"cross": {"predictor_tier": "cross", "bundle": str(tmp_path / "b"),
                                            "exclude_devices": ["h100_sxm"]}})
    assert single.on("h200_sxm") is single and excluded(ex, "h200_sxm") == ["h100_sxm"]


def test_block_fp8_experts_are_never_cut_below_their_scale_blocks():
    """vLLM refuses MiniMax-M2.5's block-FP8 experts (1536 wide) at moe_tp 8 (192 columns): the simulator
    refuses the layout, and a validation row stating it is read as what could have run, experts split whole."""
    from kernelsight.sim.parallel import ParallelConfig, shard

    minimax = load_model("minimax-m2.5")
    with pytest.raises(KernelsightError, match="192 columns, not whole 128-wide scale blocks: vLLM refuses"):
        shard(minimax, ParallelConfig(name="tp8", tp=8))
    assert shard(minimax, ParallelConfig(name="tp4", tp=4)).moe_intermediate == 384
    par = parallel_for(row(model_path="MiniMaxAI/MiniMax-M2.5", tp=8, moe_tp=8, moe_ep=1), minimax)
    assert (par.ep, par.moe_tp) == (8, 1)
    assert parallel_for(row(tp=4, moe_tp=4, moe_ep=1), minimax).ep == 1  # 384 columns: as stated
