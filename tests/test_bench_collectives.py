"""Collectives through the torchrun launcher (gloo, 2 processes), as on a multi-GPU node with NCCL."""
import subprocess
import sys

import pytest

from kernelsight.predictor.families.collectives import busbw_factor
from kernelsight.predictor.sweep import read_sweep


def test_torchrun_collectives_on_gloo(tmp_path):
    pytest.importorskip("torch", reason="torchrun needs torch (pip install -e '.[bench]')")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
           "kernelsight.cli.bench", "device=cpu", "sweep=cpu", f"out={tmp_path}", "sweep_id=t",
           "sweep.collectives.ops=[allreduce,allgather]", "sweep.collectives.sizes.end=8192"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "busbw(GB/s)" in done.stdout  # the nccl-tests style table
    df = read_sweep(tmp_path / "cpu" / "t")
    assert sorted(df["family"]) == ["allgather", "allgather", "allreduce", "allreduce"]
    assert (df["status"] == "ok").all() and (df["world_size"] == 2).all() and (df["provider"] == "gloo").all()
    for r in df.itertuples():  # cost-model bytes = nccl-tests bus traffic = size x busbw factor
        assert r.bytes == pytest.approx(r.msg_bytes * float(busbw_factor(r.family, 2)))
