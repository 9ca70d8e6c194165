"""`kernelsight roofline` in its three modes, its output file, and one-line errors with exit code 2."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from kernelsight import cli
from kernelsight.predictor.families import SHAPE_COLUMNS, make_shape
from kernelsight.predictor.families.collectives import ALPHA_HOP_S, ALPHA_LAUNCH_S
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.paths import conf_dir
from kernelsight.predictor.roofline import roofline_shape
from kernelsight.predictor.sweep import with_cost, write_sweep


def run(capsys, *args) -> str:
    cli.main(["roofline", *args])
    return capsys.readouterr().out


def fails(capsys, *args) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("kernelsight")
    return err


def table_rows(text: str, header: str) -> dict[str, list[str]]:
    """Rows of the printed table that starts with `header`, keyed by their first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


def test_default_mode_prints_decode_and_prefill_step_tables(capsys, tmp_path):
    out = run(capsys, f"out={tmp_path / 'steps.csv'}")
    assert "llama3.1-8b on NVIDIA H100 SXM5 80GB (h100_sxm), tp=1" in out
    assert "decode step: 64 sequences at KV length 1024" in out and "prefill step: 2048 prompt tokens" in out
    assert out.count("kernel ") == 2 and "us/step" in out and "share %" in out
    decode = table_rows(out, "kernel ")
    assert decode["qkv_proj"][2] == "64x6144x4096" and decode["qkv_proj"][4] == "32"
    assert decode["attn_decode"][-4] == "memory"
    table = pd.read_csv(tmp_path / "steps.csv")
    assert set(table["step"]) == {"decode step", "prefill step"}
    for _, step in table.groupby("step"):
        assert step["share %"].sum() == pytest.approx(100)
    prefill = table[table.step == "prefill step"].set_index("kernel")
    assert prefill.loc["gate_up_proj", "bound"] == "compute"
    assert prefill.loc["gate_up_proj", "GFLOP/call"] == pytest.approx(2 * 2048 * 28672 * 4096 / 1e9)


def test_default_mode_follows_model_parallel_and_step_overrides(capsys):
    out = run(capsys, "model=qwen3-32b", "parallel=tp4", "hardware=h200_sxm", "decode.batch=8", "decode.kv_len=4096")
    assert "qwen3-32b on NVIDIA H200" in out and "tp=4" in out and "8 sequences at KV length 4096" in out
    rows = table_rows(out, "kernel ")
    assert rows["qkv_proj"][2] == f"8x{(64 + 2 * 8) * 128 // 4}x5120"
    assert "attn_allreduce" in rows and "qk_norm" in rows


def test_local_attention_groups_are_named_beside_the_kv_blocks(capsys):
    out = run(capsys, "model=gpt-oss-120b")
    assert "in the full-attention layers, shared with 1 local-attention group(s) that keep the last 128 tokens" in out
    plain = run(capsys, "model=llama3.1-8b")
    assert "KV blocks" in plain and "local-attention" not in plain


def test_kernel_mode_matches_the_cost_model(capsys, tmp_path):
    out = run(capsys, "kernel.family=gemm", "kernel.m=8192", "kernel.n=8192", "kernel.k=8192", "kernel.dtype=bf16",
              f"out={tmp_path / 'k.parquet'}")
    assert "roofline of one gemm kernel on NVIDIA H100" in out and "8192x8192x8192 bf16" in out
    row = pd.read_parquet(tmp_path / "k.parquet").iloc[0]
    expected = roofline_shape(make_shape("gemm", m=8192, n=8192, k=8192, dtype="bf16"), load_hardware("h100_sxm"))
    assert row["GFLOP/call"] == pytest.approx(1099.5, rel=1e-3)
    assert row["us/call"] == pytest.approx(expected["t_roof"] * 1e6) and row["bound"] == "compute"
    out = run(capsys, "kernel.family=attn_decode", "kernel.batch=64", "kernel.seq_kv=4096", "kernel.heads=32",
              "kernel.kv_heads=8", "kernel.head_dim=128", "kernel.block_size=16", "kernel.window=0",
              "kernel.dtype=bf16", "kernel.kv_dtype=fp8", "hardware=a100_sxm")
    assert "b=64 kv=4096 h=32/8 d=128 fp8" in out and "memory" in out and "A100" in out


def test_network_hops_follow_the_layouts_stated_scale_out_bandwidth(capsys, tmp_path):
    """The network is the cluster's: parallel.net_gbs_per_gpu prices `net` hops, NVLink stays the GPU's."""
    def us(*args):
        run(capsys, "kernel.family=sendrecv", "kernel.msg_bytes=16777216", "kernel.world_size=2",
            f"out={tmp_path / 'k.csv'}", *args)
        return pd.read_csv(tmp_path / "k.csv")["us/call"].iloc[0]

    default, slow = us("kernel.link=net"), us("kernel.link=net", "parallel.net_gbs_per_gpu=25")
    alpha = (ALPHA_LAUNCH_S["net"] + ALPHA_HOP_S["net"]) * 1e6  # one hop
    assert default == pytest.approx(alpha + 16777216 / 50e3) and slow == pytest.approx(alpha + 16777216 / 25e3)
    assert us("kernel.link=nvlink", "parallel.net_gbs_per_gpu=25") == us("kernel.link=nvlink")
    out = run(capsys, "model=llama3.1-70b", "parallel=tp8_pp2", "parallel.net_gbs_per_gpu=12.5")
    hop = table_rows(out, "kernel ")["pp_sendrecv"]  # decode step: 64 tokens x (hidden + residual) of 8192 bf16
    assert float(hop[hop.index("link") + 1]) == pytest.approx(alpha + 64 * 2 * 8192 * 2 / 12.5e3, abs=0.5)
    assert "'net_gbs_per_gpu' = 0: must be > 0" in fails(capsys, "parallel.net_gbs_per_gpu=0")


def test_sweep_mode_prints_eta_per_row_and_writes_every_row(capsys, tmp_path):
    rows = [dict(family="gemm", provider="torch.F.linear", m=m, n=4096, k=4096, dtype="bf16", latency_ms=lat,
                 device="h100_sxm", source="measured", sweep_id="t", status="ok")
            for m, lat in ((1, 0.0125), (4096, 0.300))]
    rows.append(dict(family="attn_decode", provider="triton.paged_decode", batch=8, seq_kv=4096, heads=32,
                     kv_heads=8, head_dim=128, block_size=16, window=0, dtype="bf16", kv_dtype="bf16",
                     latency_ms=0.09, device="a100_sxm", source="measured", sweep_id="t", status="ok"))
    rows.append(dict(family="allreduce", provider="nccl", msg_bytes=1 << 20, world_size=8, link="nvlink",
                     dtype="bf16", latency_ms=None, device="h100_sxm", source="measured", sweep_id="t",
                     status="failed", error="timeout"))
    path = write_sweep(with_cost(pd.DataFrame(rows)), tmp_path / "s.parquet", {})
    out = run(capsys, f"sweep_file={path}", "limit=3", f"out={tmp_path / 'eta.csv'}")
    assert "roofline of 4 sweep rows" in out and "... 1 more rows" in out
    table = pd.read_csv(tmp_path / "eta.csv")
    assert len(table) == 4 and list(table["device"]) == ["h100_sxm", "h100_sxm", "a100_sxm", "h100_sxm"]
    h100, a100 = load_hardware("h100_sxm"), load_hardware("a100_sxm")
    small = roofline_shape(make_shape("gemm", m=1, n=4096, k=4096), h100)["t_roof"]
    decode = roofline_shape(make_shape("attn_decode", batch=8, seq_kv=4096, heads=32, kv_heads=8, head_dim=128),
                            a100)["t_roof"]  # priced on the row's own device, not hardware=
    assert table["eta"].iloc[0] == pytest.approx(0.0125e-3 / small)
    assert table["eta"].iloc[2] == pytest.approx(0.09e-3 / decode)
    assert pd.isna(table["eta"].iloc[3]) and table["bound"].iloc[3] == "link"  # failed row: no η
    summary = table_rows(out, "device ")
    assert "a100_sxm" in summary


def test_bad_input_is_one_line_with_exit_code_2(capsys, tmp_path):
    assert "did you mean 'llama3.1-8b'" in fails(capsys, "model=llama3.1-8")
    assert "gemm.m = 0: must be an integer >= 1" in fails(capsys, "kernel.family=gemm", "kernel.m=0", "kernel.n=8",
                                                           "kernel.k=8", "kernel.dtype=bf16")
    assert "unknown shape field 'seq_q'" in fails(capsys, "kernel.family=gemm", "kernel.seq_q=8")
    assert "unknown kernel family 'gem'" in fails(capsys, "kernel.family=gem", "kernel.m=8")
    assert "kernel.family is required" in fails(capsys, "kernel.m=8")
    assert "tp=4 does not divide the 10 KV heads" in fails(capsys, "model=phi-4", "parallel=tp4")
    assert "tp=3 does not divide the 32 attention heads" in fails(capsys, "parallel.tp=3")
    assert "does not fit on h100_sxm" in fails(capsys, "model=llama3.1-70b")
    assert "no such file or directory" in fails(capsys, f"sweep_file={tmp_path / 'none.parquet'}")
    assert "use a .csv or .parquet" in fails(capsys, "kernel.family=gemm", "kernel.m=1", "kernel.n=1", "kernel.k=1",
                                             "kernel.dtype=bf16", f"out={tmp_path / 't.xlsx'}")
    assert not (tmp_path / "t.xlsx").exists()
    (tmp_path / "file").write_text("x")
    assert f"out={tmp_path / 'file' / 'steps.csv'}: {tmp_path / 'file'} is a file, not a directory" in \
        fails(capsys, f"out={tmp_path / 'file' / 'steps.csv'}")
    (tmp_path / "d.csv").mkdir()
    assert "d.csv: is a directory, not a file" in fails(capsys, f"out={tmp_path / 'd.csv'}")


def test_out_is_written_whole_or_not_at_all(capsys, tmp_path, monkeypatch):
    """A failed write (here: a full disk) keeps the previous table and leaves no temporary file."""
    import errno

    out = tmp_path / "steps.csv"
    run(capsys, f"out={out}")
    before = out.read_text()

    def full_disk(self, path, **kwargs):
        Path(path).write_text("half a tab")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full_disk)
    err = fails(capsys, f"out={out}", "decode.batch=8")
    assert "cannot write: No space left on device (disk full or file size limit); nothing was written" in err
    assert out.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["steps.csv"]


def test_help_and_kernel_keys_cover_every_shape_column(capsys):
    config = yaml.safe_load((conf_dir() / "roofline.yaml").read_text())
    assert set(config["kernel"]) == {"family", *SHAPE_COLUMNS}
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "kernelsight roofline kernel.family=gemm" in text and "sweep_file=" in text and "model:" in text
