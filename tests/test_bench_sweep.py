"""The benchmark harness end to end on a CPU: sweep, resume after a kill, checks, failures, bad input, report."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the GPU harness needs torch (pip install -e '.[bench]')")

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from hydra import compose, initialize_config_dir  # noqa: E402

from kernelsight.cli import bench as commands  # noqa: E402
from kernelsight.microbench.providers import BENCHES, Provider  # noqa: E402
from kernelsight.microbench.providers.base import PlannedDevice  # noqa: E402
from kernelsight.microbench.runner import row_key  # noqa: E402
from kernelsight.microbench.timing import Clock, TimingConfig  # noqa: E402
from kernelsight import cli  # noqa: E402
from kernelsight.predictor.families import COLLECTIVES, get_family  # noqa: E402
from kernelsight.predictor.hardware import load_hardware  # noqa: E402
from kernelsight.predictor.paths import conf_dir  # noqa: E402
from kernelsight.predictor.sweep import read_environment, read_sweep, sweep_files  # noqa: E402

CPU = ["sweep=cpu", "device=cpu", "progress=false"]


@pytest.fixture
def kernelsight(monkeypatch):
    """Run `kernelsight bench ...` in process."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return cli.main


def compose_bench(overrides):
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        return compose(config_name="bench", overrides=overrides)


@pytest.fixture(scope="module")
def cpu_sweep(tmp_path_factory):
    """The whole cpu grid, kernels and gloo collectives, once for the module."""
    out = tmp_path_factory.mktemp("sweeps")
    mp = pytest.MonkeyPatch()
    mp.setattr(sys, "argv", list(sys.argv))
    try:
        cli.main(["bench", *CPU, f"out={out}", "sweep_id=s1"])
    finally:
        mp.undo()
    return out / "cpu" / "s1"


def test_cpu_sweep_rows_follow_the_contract(cpu_sweep):
    df = read_sweep(cpu_sweep)  # validates every row
    assert len(sweep_files(cpu_sweep)) >= 1
    assert (df["status"] == "ok").all(), df[df["status"] != "ok"][["provider", "error"]]
    kernel_families = set(BENCHES)
    assert set(df["family"]) == kernel_families | set(COLLECTIVES)
    assert {"torch.F.linear", "torch._scaled_mm", "triton.paged_decode", "triton.prefill_attention",
            "triton.reshape_and_cache", "triton.rope_neox", "triton.rope_gptj", "triton.rms_norm",
            "triton.act_and_mul", "gloo"} <= set(df["provider"])
    inductor = [p for b in BENCHES.values() for p in b.providers if p.library == "inductor"]
    if inductor[0].unavailable(torch.device("cpu")) is None:  # a C++ compiler for Inductor's CPU kernels
        assert {p.name for p in inductor} <= set(df["provider"])
    assert (df["device"] == "cpu").all() and (df["source"] == "measured").all() and (df["sweep_id"] == "s1").all()
    assert (df["latency_p10_ms"] <= df["latency_ms"]).all() and (df["latency_ms"] <= df["latency_p90_ms"]).all()
    assert (df["samples"] >= 2).all()
    triton_rows = df["provider"].str.startswith("triton.")
    assert df.loc[triton_rows, "flags"].str.contains("triton_interpret").all()
    for family, part in df.groupby("family"):  # flops/bytes are the cost model's, not re-derived
        fam = get_family(family)
        cost = fam.cost({c: part[c].to_numpy() for c in fam.columns})
        np.testing.assert_allclose(part["flops"], cost.flops)
        np.testing.assert_allclose(part["bytes"], cost.bytes)
    keys = [row_key(r) for r in df.to_dict("records")]
    assert len(keys) == len(set(keys))


def test_cpu_sweep_environment(cpu_sweep):
    env = read_environment(sweep_files(cpu_sweep)[0])
    assert env["device"] == "cpu" and env["cpu_count"] >= 1 and env["host_cpu"]
    assert env["torch"] == torch.__version__ and "triton" in env and "git_commit" in env
    assert env["config"]["sweep"]["name"] == "cpu"
    assert env["config"]["sweep"]["families"]["gemm"]["grid"][0]["m"] == [1, 16]  # the exact grid


def test_gloo_collectives_follow_nccl_tests(cpu_sweep):
    from kernelsight.predictor.families.collectives import algbw, busbw

    df = read_sweep(cpu_sweep)
    coll = df[df["family"].isin(COLLECTIVES)]
    assert set(coll["family"]) == set(COLLECTIVES) and (coll["provider"] == "gloo").all()
    assert (coll["world_size"] == 2).all() and (coll["timing"] == "hot").all()
    assert sorted(coll[coll["family"] == "allreduce"]["msg_bytes"]) == [1024, 8192, 65536]
    factor = {"allreduce": 1.0, "allgather": 0.5, "reducescatter": 0.5, "alltoall": 0.5, "sendrecv": 1.0}  # n=2
    for r in coll.itertuples():
        sec = r.latency_ms / 1e3
        assert busbw(r.family, r.msg_bytes, sec, r.world_size) == pytest.approx(
            algbw(r.msg_bytes, sec) * factor[r.family])
        assert r.bytes == pytest.approx(r.msg_bytes * factor[r.family])  # cost model bytes = bus traffic


def test_bench_report_on_cpu_sweep(cpu_sweep, kernelsight, tmp_path, capsys):
    kernelsight(["bench", "report", str(cpu_sweep), f"out={tmp_path}", "hardware=h100_sxm"])
    printed = capsys.readouterr().out
    for name in ("roofline.png", "eta.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "summary.md").read_text()
    for family in ("gemm", "attn_decode", "allreduce"):
        assert f"| {family} |" in summary and family in printed
    with pytest.raises(SystemExit) as e:  # a CPU sweep has no catalog roofline of its own
        kernelsight(["bench", "report", str(cpu_sweep), f"out={tmp_path}"])
    assert e.value.code == 2
    assert "hardware=" in capsys.readouterr().err


NO_COLLECTIVES = "sweep.collectives.ops=[]"  # a test provider selects its own family's shapes only


def test_mismatch_is_recorded_and_not_timed(kernelsight, monkeypatch, tmp_path):
    calls = []

    def wrong(shape, inputs):
        x, inter = inputs["x"], shape.intermediate

        def run():
            calls.append(1)
            return x[:, :inter] * 2.0  # not silu(a) * b
        return run

    bench = BENCHES["act"]
    monkeypatch.setitem(BENCHES, "act", bench.__class__(
        **{**bench.__dict__, "providers": (*bench.providers, Provider("torch.wrong_act", wrong))}))
    kernelsight(["bench", *CPU, f"out={tmp_path}", "sweep_id=m", "providers=[torch.wrong_act]",
                 NO_COLLECTIVES])
    df = read_sweep(tmp_path / "cpu" / "m")
    assert len(df) == 2 and (df["status"] == "mismatch").all() and (df["provider"] == "torch.wrong_act").all()
    assert df["latency_ms"].isna().all() and df["samples"].isna().all()
    assert df["error"].str.contains("relative error").all()
    assert len(calls) == 2  # one correctness call per shape, no timing


def test_errors_become_failed_rows_and_the_sweep_goes_on(kernelsight, monkeypatch, tmp_path):
    torch_ew = BENCHES["elementwise"].providers[0]

    def flaky(shape, inputs):
        if shape.op == "silu":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if shape.op == "softmax":
            raise RuntimeError("kernel launch failed: too many resources requested")
        return torch_ew.build(shape, inputs)

    bench = BENCHES["elementwise"]
    monkeypatch.setitem(BENCHES, "elementwise", bench.__class__(
        **{**bench.__dict__, "providers": (*bench.providers, Provider("torch.flaky", flaky))}))
    kernelsight(["bench", *CPU, f"out={tmp_path}", "sweep_id=f", "providers=[torch.flaky]",
                 NO_COLLECTIVES])
    df = read_sweep(tmp_path / "cpu" / "f").set_index("op")
    assert df.loc["silu", "status"] == "failed" and "out of memory" in df.loc["silu", "error"]
    assert df.loc["softmax", "status"] == "failed" and "too many resources" in df.loc["softmax", "error"]
    assert (df.loc[["add", "embedding"], "status"] == "ok").all()


RUNNER = textwrap.dedent("""
    import sys
    from kernelsight import cli
    if __name__ == "__main__":
        cli.main(sys.argv[1:])
""")


def test_resume_after_kill_loses_and_duplicates_nothing(kernelsight, tmp_path, capsys):
    script = tmp_path / "run_bench.py"
    script.write_text(RUNNER)
    args = [*CPU, f"out={tmp_path}", "sweep_id=r", "shard_rows=2", NO_COLLECTIVES]
    sweep_dir = tmp_path / "cpu" / "r"
    proc = subprocess.Popen([sys.executable, str(script), "bench", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not list(sweep_dir.glob("*-0001.parquet")):
            time.sleep(0.05)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        proc.send_signal(signal.SIGKILL)  # a crash: no chance to clean up
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = read_sweep(sweep_dir)
    first_keys = {row_key(r) for r in before.to_dict("records")}
    assert len(first_keys) >= 2

    plan = commands.plan(compose_bench(args), torch.device("cpu"))
    kernelsight(["bench", *CPU, f"out={tmp_path}", f"resume={sweep_dir}", "shard_rows=2", NO_COLLECTIVES])
    assert f"resuming: {len(first_keys)} measurements already in the sweep are skipped" in capsys.readouterr().out
    after = read_sweep(sweep_dir)
    keys = [row_key(r) for r in after.to_dict("records")]
    assert len(keys) == len(set(keys)), "a shape was measured twice"
    planned = {row_key({**i.shape.row(), "provider": i.provider.name, "timing": "cold"}) for i in plan.items}
    assert set(keys) == planned, "a shape was lost"
    assert first_keys <= set(keys)


def test_the_torch_free_library_list_names_every_providers_library():
    """bench checks provider selectors against planning.LIBRARIES before torch loads: it must stay current."""
    from kernelsight.microbench.planning import LIBRARIES

    assert {p.library for b in BENCHES.values() for p in b.providers} == set(LIBRARIES)


def test_ctrl_c_says_in_one_line_how_to_continue_with_every_override(kernelsight, tmp_path, capsys):
    """SIGINT mid-sweep: exit 130 and one line whose command (device=cpu included) resumes the sweep."""
    import shlex

    script = tmp_path / "run_bench.py"
    script.write_text(RUNNER)
    args = [*CPU, f"out={tmp_path}", "sweep_id=i", "shard_rows=2", NO_COLLECTIVES]
    sweep_dir = tmp_path / "cpu" / "i"
    proc = subprocess.Popen([sys.executable, str(script), "bench", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,  # SIGINT at its default, as a foreground command's
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not list(sweep_dir.glob("*-0001.parquet")):
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130
    [line] = err.strip().splitlines()
    assert line.startswith(f"kernelsight bench: interrupted: every finished measurement is saved in {sweep_dir}")
    command = shlex.split(line.split("continue with `", 1)[1].rstrip("`"))
    assert command[:2] == ["kernelsight", "bench"] and "device=cpu" in command and f"resume={sweep_dir}" in command
    assert not any(a.startswith("sweep_id=") for a in command)
    kernelsight(command[1:])
    assert "already in the sweep are skipped" in capsys.readouterr().out


def test_a_ctrl_c_that_a_library_swallows_still_stops_the_sweep(kernelsight, monkeypatch, tmp_path, capsys):
    """torch.compile has bare `except:` clauses: a Ctrl-C landing there raises a KeyboardInterrupt nobody sees.
    The sweep still stops after that item, without writing its row, and exits 130; a resume measures it."""
    from kernelsight.microbench import runner

    real, calls = runner.measure, []

    def swallowing(item, ctx):
        calls.append(item)
        if len(calls) == 3:
            try:  # as a bare except: inside a library would
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)
            except:  # noqa: E722
                pass
        return real(item, ctx)

    monkeypatch.setattr(runner, "measure", swallowing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the test runner ignores it
    try:
        with pytest.raises(SystemExit) as e:
            kernelsight(["bench", *CPU, f"out={tmp_path}", "sweep_id=c", NO_COLLECTIVES, "providers=[torch]"])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert e.value.code == 130 and "interrupted: every finished measurement is saved" in capsys.readouterr().err
    sweep = tmp_path / "cpu" / "c"
    assert len(read_sweep(sweep)) == 2, "the item the interrupt came in was written"
    monkeypatch.setattr(runner, "measure", real)
    kernelsight(["bench", *CPU, f"out={tmp_path}", f"resume={sweep}", NO_COLLECTIVES, "providers=[torch]"])
    assert len(read_sweep(sweep)) > 3


@pytest.mark.parametrize("override,message", [
    (["+sweep.families.gemmm.grid.m=1"], "unknown kernel family 'gemmm' (did you mean 'gemm'?)"),
    (["providers=[torch,tritn]"], "unknown provider 'tritn' for any family (did you mean 'triton'?)"),
    (["sweep.families.rope.grid.tokens=[0,4]"], "sweep.families.rope.grid: rope.tokens = 0: must be an integer >= 1"),
    (["+sweep.families.gemm.providers=[triton]"], "sweep.families.gemm.providers: unknown provider 'triton'"),
    (["+sweep.families.act.grid.heads=4"], "sweep.families.act.grid: 'heads' is not a act shape field"),
    (["sweep.timing.l2=warm"], "timing.l2 = 'warm': must be 'cold' or 'hot'"),
    (["sweep.energy.enabled=true"], "needs NVML on a CUDA GPU"),
])
def test_bad_input_is_one_clear_line(kernelsight, tmp_path, capsys, override, message):
    with pytest.raises(SystemExit) as e:
        kernelsight(["bench", *CPU, f"out={tmp_path}", *override])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_cuda_without_gpu_is_one_clear_line(kernelsight, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit):
        kernelsight(["bench", "sweep=cpu", f"out={tmp_path}"])
    assert "sees no CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("grid,budget_s", [("quick", 180), ("full", 1260)])
def test_grid_budgets_on_h100_from_the_roofline(grid, budget_s):
    """The budget claims hold on the roofline estimate, with every optional provider installed (full: ~20 min,
    164 Inductor compiles of ~1.5 s among them)."""
    cfg = compose_bench([f"sweep={grid}"])
    plan = commands.plan(cfg, PlannedDevice(capability=(9, 0)))
    est = commands.estimate(cfg, plan.items, plan.collectives, load_hardware("h100_sxm"))
    assert 0.2 * budget_s < est["total"] <= budget_s, est
    families = {i.family for i in plan.items}
    assert families == set(BENCHES)  # every family the harness has providers for (MLA comes from imports only)
    shapes = [i.shape for i in plan.items]
    if grid == "full":  # the coverage the issue asks for
        assert {s.head_dim for s in shapes if s.family.name == "attn_decode"} == {64, 128, 256}
        assert max(s.seq_kv for s in shapes if s.family.name == "attn_decode") == 131072
        assert {s.batch for s in shapes if s.family.name == "attn_decode"} >= {1, 512}
        assert max(s.tokens for s in shapes if s.family.name == "rope") == 32768
        assert {s.heads // s.kv_heads for s in shapes if s.family.name == "attn_prefill"} >= {1, 2, 4, 8, 16}
        assert max(r["msg_bytes"] for r in plan.collectives) >= 1 << 30


def test_timing_statistics_on_cpu():
    clock = Clock(torch.device("cpu"), TimingConfig(warmup=1, min_reps=5, max_reps=8, budget_ms=10, cpu_flush_mb=1))

    def sleep_2ms():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
    stats, runner = clock.measure(sleep_2ms)
    assert 5 <= stats.samples <= 8 and runner is sleep_2ms and not stats.cuda_graph
    assert 2.0 <= stats.p10_ms <= stats.median_ms <= stats.p90_ms < 20


def test_cold_cache_flush_reads_and_never_writes():
    """A written flush buffer leaves dirty cache lines whose write-back the timed call would pay."""
    clock = Clock(torch.device("cpu"), TimingConfig(cpu_flush_mb=1))
    buf = clock._flush_buf
    buf[::3] = 7  # any write by the flush (fill, zero, copy) changes this pattern
    before = buf.clone()
    clock.flush()
    assert torch.equal(buf, before) and buf.numel() == 1 << 20
    assert Clock(torch.device("cpu"), TimingConfig(l2="hot"))._flush_buf is None


def test_cuda_only_providers_are_unavailable_on_the_cpu_and_planned_for_a_gpu():
    """CUDA-only libraries say so once per provider (not per shape); a planned GPU keeps them."""
    cpu = torch.device("cpu")
    cuda_only = [p for bench in BENCHES.values() for p in bench.providers if p.cuda_only]
    assert {p.library for p in cuda_only} >= {"vllm", "flashinfer", "flash_attn"}
    for p in cuda_only:
        why = p.unavailable(cpu)
        assert why in (f"{p.requires} is not installed", f"{p.library} runs on CUDA only"), (p.name, why)
    probe = Provider("vllm.probe", lambda shape, inputs: None, requires="torch", cuda_only=True)
    assert probe.unavailable(cpu) == "vllm runs on CUDA only"
    assert probe.unavailable(PlannedDevice((9, 0))) is None


def test_sdpa_backend_probe_uses_equal_heads(monkeypatch):
    """A backend without GQA must not be dropped whole: the probe asks for MHA, GQA shapes fail per row."""
    from kernelsight.microbench.providers import attn_prefill

    seen = []

    def fake_call(q4, k4, v4, causal, backend):
        seen.append((q4.shape[1], k4.shape[1], v4.shape[1]))
        return lambda: None
    monkeypatch.setattr(attn_prefill, "_sdpa_call", fake_call)
    assert attn_prefill._sdpa_available("efficient")(torch.device("cpu")) is None
    assert seen == [(2, 2, 2)]


def test_estimate_counts_the_compiling_of_inductor_shapes():
    """Same shapes, same roofline: the Inductor plan is longer by its compile time per shape, no more."""
    est = {}
    for provider in ("triton.rms_norm", "inductor.rms_norm"):
        cfg = compose_bench(["sweep=quick", f"providers=[{provider}]"])
        plan = commands.plan(cfg, PlannedDevice(capability=(9, 0)))
        items = [i for i in plan.items if i.family == "norm"]
        est[provider] = (len(items), commands.estimate(cfg, items, [], load_hardware("h100_sxm"))["total"])
    (n, triton_s), (m, inductor_s) = est["triton.rms_norm"], est["inductor.rms_norm"]
    assert n == m > 0 and inductor_s - triton_s == pytest.approx(1.5 * n)
