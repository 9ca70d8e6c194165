"""The inductor.* providers (vLLM's native layer code compiled by torch.compile) through the harness on a CPU.

On a CPU Inductor compiles C++ kernels (a GPU gets Triton ones): the compile path, the per-shape compile, the
check against the float32 reference and the failure reporting are what is tested here. Every inductor
provider also runs in the cpu grid (tests/test_bench_sweep.py).
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="the GPU harness needs torch (pip install -e '.[bench]')")

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from kernelsight import cli  # noqa: E402
from kernelsight.microbench.providers import BENCHES  # noqa: E402
from kernelsight.microbench.providers.base import PlannedDevice, inductor_provider  # noqa: E402
from kernelsight.predictor.families import make_shape  # noqa: E402
from kernelsight.predictor.sweep import read_sweep  # noqa: E402

CPU = ["sweep=cpu", "device=cpu", "progress=false", "sweep.collectives.ops=[]"]
# Why Inductor cannot compile here (no C++ compiler, say), or None.
NO_INDUCTOR = inductor_provider("inductor.probe", lambda shape, inputs: None).unavailable(torch.device("cpu"))
needs_inductor = pytest.mark.skipif(NO_INDUCTOR is not None, reason=str(NO_INDUCTOR))


@pytest.fixture
def kernelsight(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return cli.main


def test_every_pointwise_family_has_its_inductor_provider():
    names = {f: {p.name for p in b.providers if p.library == "inductor"} for f, b in BENCHES.items()}
    assert names["norm"] == {"inductor.rms_norm"} and names["act"] == {"inductor.act_and_mul"}
    assert names["rope"] == {"inductor.rope_neox", "inductor.rope_gptj"}
    assert names["elementwise"] == {"inductor.elementwise"}
    assert not any(names[f] for f in set(BENCHES) - {"norm", "act", "rope", "elementwise"})
    # a compiled call's host work (guards, Inductor's wrapper) outlasts small kernels: timed from a CUDA graph
    assert all(p.always_graph for b in BENCHES.values() for p in b.providers if p.library == "inductor")


@needs_inductor
def test_rms_norm_with_and_without_the_residual(kernelsight, tmp_path):
    """Compiled, checked against the float32 reference and timed per shape; the cpu grid's LayerNorm is skipped."""
    kernelsight(["bench", *CPU, f"out={tmp_path}", "sweep_id=n", "providers=[inductor.rms_norm]"])
    df = read_sweep(tmp_path / "cpu" / "n")
    assert len(df) == 2 and (df["provider"] == "inductor.rms_norm").all() and (df["op"] == "rms").all()
    assert (df["status"] == "ok").all(), df[["fused_residual", "error"]]
    assert sorted(df["fused_residual"]) == [False, True] and (df["latency_ms"] > 0).all()


@needs_inductor
def test_each_shape_is_compiled_not_run_eagerly():
    """One code object compiled for shape after shape: past Dynamo's recompile limit it would fail or run eagerly."""
    def native(shape, inputs):  # traced by Dynamo: +1; run eagerly: +2
        return inputs["a"] + (1 if torch.compiler.is_compiling() else 2)

    provider = inductor_provider("inductor.probe", native)
    with torch._dynamo.config.patch(recompile_limit=1):  # Dynamo's own patch: monkeypatch's undo breaks the alias
        for n in (64, 128, 256):
            a = torch.arange(n, dtype=torch.float32)
            shape = make_shape("elementwise", numel=n, op="copy", dtype="fp32")
            assert torch.equal(provider.build(shape, {"a": a})(), a + 1), n


@needs_inductor
def test_a_compile_error_is_a_failed_row_with_the_reason(kernelsight, monkeypatch, tmp_path):
    def native(shape, inputs):
        torch._dynamo.graph_break()  # fullgraph=True refuses it
        return inputs["x"]

    bench = BENCHES["act"]
    monkeypatch.setitem(BENCHES, "act", bench.__class__(
        **{**bench.__dict__, "providers": (*bench.providers, inductor_provider("inductor.broken", native))}))
    kernelsight(["bench", *CPU, f"out={tmp_path}", "sweep_id=f", "providers=[inductor.broken]"])
    df = read_sweep(tmp_path / "cpu" / "f")
    assert len(df) == 2 and (df["status"] == "failed").all()
    assert df["error"].str.startswith("RuntimeError: torch.compile (Inductor) failed: ").all(), df["error"]
    assert df["error"].str.contains("graph_break|graph break", case=False).all(), df["error"].tolist()


def test_without_a_cpp_compiler_the_providers_are_unavailable(monkeypatch):
    """Checked once per provider (a reason, not a failed row per shape); a planned GPU keeps them."""
    from torch._inductor import config

    monkeypatch.setattr(config.cpp, "cxx", ("kernelsight-no-such-cxx",))
    p = next(p for p in BENCHES["norm"].providers if p.name == "inductor.rms_norm")
    why = p.unavailable(torch.device("cpu"))
    assert why.startswith("torch.compile (Inductor) cannot run on cpu: InvalidCxxCompiler"), why
    assert p.unavailable(PlannedDevice((9, 0))) is None
