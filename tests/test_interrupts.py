"""Ctrl-C (SIGINT) and kill -9 (SIGKILL) at random points of simulate, validate and bench.

Each test runs the command as a subprocess, signals it after a seeded random delay and then checks what is on
disk: the output is complete, or exactly what it was before the run, or marked INCOMPLETE, or resumable; never
half-written, never a mix of two runs, and no finished work is lost. SIGINT must end the command with exit code
130 and one line on stderr; a re-run after either signal completes.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kernelsight import cli
from kernelsight.predictor.outputs import _alive
from kernelsight.predictor.paths import data_dir

pytestmark = pytest.mark.slow  # every test runs a command for seconds, some twice

RUNNER = [sys.executable, "-c", "import sys; from kernelsight import cli; cli.main(sys.argv[1:])"]
MARKER = "INCOMPLETE"
SIM_FILES = {"requests.parquet", "steps.parquet", "breakdown.csv", "trace.json", "summary.json"}


# ---------------------------------------------------------------------------------------------------------------
# Helpers

def snapshot(root: Path) -> dict:
    """Every path under root -> its kind and content hash."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = path.relative_to(root).as_posix()
            found[rel] = ("dir",) if path.is_dir() else ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return found


class Child:
    """`kernelsight <argv>` as a subprocess in `cwd`, its output in files beside (not inside) cwd."""

    def __init__(self, argv: list[str], cwd: Path, logs: Path):
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = logs / "stdout.txt", logs / "stderr.txt"
        env = {**os.environ, "HYDRA_FULL_ERROR": "0", "KERNELSIGHT_CACHE": str(logs / "cache"),
               "MPLCONFIGDIR": str(logs / "mpl")}
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            # a foreground command's Ctrl-C: SIGINT at its default even where the test runner was started in the
            # background of a shell without job control (which starts it, and so its children, ignoring SIGINT)
            self.proc = subprocess.Popen(RUNNER + argv, cwd=cwd, stdout=out, stderr=err, env=env,
                                         preexec_fn=default_sigint)
        self.started = time.monotonic()

    def wait_for(self, condition, timeout: float = 120.0) -> bool:
        """Poll until condition() or the process ends; True if the condition held while it ran."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if condition():
                return True
            time.sleep(0.02)
        return False

    def signal_after(self, sig: int, delay: float) -> bool:
        """Send sig `delay` seconds from now unless the process has ended; True if it was sent."""
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.02)
        if self.proc.poll() is not None:
            return False
        self.proc.send_signal(sig)
        return True

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the command did not end within {timeout} s of the signal")
        return rc, self.out_path.read_text(), self.err_path.read_text()


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def check_exit(sig: int, sent: bool, rc: int, err: str) -> bool:
    """SIGINT: exit 130 and one line (no traceback); SIGKILL: killed. True if the command completed anyway: it
    ended before the signal (exit 0), or the signal came while the interpreter was shutting down after the
    command had finished (Python then dies of SIGINT with nothing to say; the caller checks the output)."""
    if not sent:
        assert rc == 0, f"the command failed before the signal (exit {rc}):\n{err[-3000:]}"
        return True
    if rc == 0:  # finished while the signal was on its way
        return True
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL, f"exit {rc} after SIGKILL"
        return False
    assert "Traceback" not in err, f"a traceback after Ctrl-C:\n{err[-3000:]}"
    if rc == -signal.SIGINT and not err.strip():
        return True
    lines = [line for line in re.split(r"[\r\n]", err) if line.strip()]
    assert rc == 130, f"exit {rc} after Ctrl-C, not 130:\n{err[-3000:]}"
    assert len(lines) == 1 and "interrupt" in lines[0].lower(), f"not one line saying so:\n{err[-3000:]}"
    return False


def leftovers(root: Path, known: set[str]) -> list[str]:
    """Top-level entries of root beyond `known` that are neither a staging folder marked INCOMPLETE, a lock
    file nor a hidden temporary file of a dead process (a killed process may leave each; none is taken for
    output, and the next writer removes the temporary files)."""
    bad = []
    for path in root.iterdir():
        if path.name in known:
            continue
        if path.is_dir() and (path / MARKER).is_file():
            continue
        if path.name.startswith(".") and path.name.endswith(".lock"):
            continue
        temp = re.fullmatch(r"\..+\.(\d+)\.tmp", path.name)
        if temp and not _alive(int(temp.group(1))):
            continue
        bad.append(path.name)
    return bad


def delays(seed: int, n: int, low: float, high: float) -> list[float]:
    rng = random.Random(seed)
    return [round(rng.uniform(low, high), 2) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# simulate: output_dir (a RunDirectory) and results_table

SIM_LONG = ["simulate", "num_requests=3000", "plots=false", "output_dir=out", "overwrite=true",
            "results_table=runs.csv"]
SIM_SHORT = ["simulate", "num_requests=20", "plots=false", "output_dir=out", "overwrite=true",
             "results_table=runs.csv"]


def check_run_dir(out: Path, previous: dict, num_requests: int) -> str:
    """out is the previous complete run, byte for byte, or a complete new one; returns which."""
    assert out.is_dir(), "output_dir vanished: the previous run is lost"
    now = snapshot(out)
    if now == previous:
        return "previous"
    names = {p.name for p in out.iterdir()}
    assert MARKER not in names, f"output_dir holds a partial run: {sorted(names)}"
    assert SIM_FILES <= names, f"output_dir mixes runs or lacks files: {sorted(names)}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] + summary["failed"] == num_requests, "summary.json is not the new run's"
    assert len(pd.read_parquet(out / "requests.parquet")) == num_requests
    pd.read_parquet(out / "steps.parquet")
    json.loads((out / "trace.json").read_text())
    return "new"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
@pytest.mark.parametrize("seed", [0, 1])
def test_simulate_interrupted_keeps_the_previous_run_or_completes(sig, seed, tmp_path, run_cli):
    work = tmp_path / "work"
    work.mkdir()
    code, _, err = run_cli(SIM_SHORT, cwd=work)
    assert code == 0, err
    previous = snapshot(work / "out")
    table_before = pd.read_csv(work / "runs.csv")
    assert len(table_before) == 1

    (delay,) = delays(seed * 10 + sig, 1, 1.0, 7.0)  # from start-up to the last writes of a ~6 s run
    child = Child(SIM_LONG, work, tmp_path / "logs")
    sent = child.signal_after(sig, delay)
    rc, _, err = child.finish()
    completed = check_exit(sig, sent, rc, err)

    state = check_run_dir(work / "out", previous, 3000)
    assert state == "new" or not completed, "the command completed but output_dir holds the previous run"
    table = pd.read_csv(work / "runs.csv")
    assert len(table) in (1, 2), f"results_table has {len(table)} rows"
    pd.testing.assert_frame_equal(table.head(1)[table_before.columns], table_before, check_dtype=False)
    if completed:
        assert len(table) == 2, "a completed run did not add its row"
    if (work / "runs.parquet").exists():
        assert len(pd.read_parquet(work / "runs.parquet")) == len(table), "the CSV and Parquet tables differ"
    bad = leftovers(work, {"out", "runs.csv", "runs.parquet"})
    assert not bad, f"left behind (not marked INCOMPLETE): {bad}"

    code, _, err = run_cli(SIM_SHORT, cwd=work)  # the next run completes and cleans up
    assert code == 0, err
    assert check_run_dir(work / "out", {}, 20) == "new"
    assert len(pd.read_csv(work / "runs.csv")) == len(table) + 1
    assert not [p.name for p in work.iterdir() if p.name.startswith(".out.")], "a dead run's staging folder stayed"
    assert not list(work.glob(".runs.*.tmp")), "a dead run's temporary table files stayed"


# ---------------------------------------------------------------------------------------------------------------
# validate: every finished row is kept; a re-run reuses them and ends with the table a clean run writes

def _validation_csv(path: Path, rows: int) -> Path:
    lines = (data_dir() / "validation" / "vllm_dev.csv").read_text().splitlines()
    path.write_text("\n".join(lines[: rows + 1]) + "\n")
    return path


VALIDATE = ["validate", "csv=rows.csv", "tiers.cross=null", "protocol.num_requests=1500", "jobs=1", "plots=false",
            "table=table.csv", "report=report.md"]
TIMING = {"wall_s"}  # columns that differ between two runs of the same rows


def _table(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    return df.drop(columns=[c for c in df.columns if c in TIMING]).sort_values(["tier", "line"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def clean_validation(tmp_path_factory):
    """The table of an uninterrupted run."""
    work = tmp_path_factory.mktemp("clean")
    _validation_csv(work / "rows.csv", 4)
    mp = pytest.MonkeyPatch()
    try:
        from hydra.core.global_hydra import GlobalHydra

        mp.chdir(work)
        mp.setattr(sys, "argv", list(sys.argv))
        GlobalHydra.instance().clear()
        cli.main(VALIDATE)
    finally:
        mp.undo()
    return _table(work / "table.csv")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_validate_interrupted_keeps_rows_and_the_rerun_reuses_them(sig, clean_validation, tmp_path, run_cli):
    work = tmp_path / "work"
    work.mkdir()
    _validation_csv(work / "rows.csv", 4)
    parts = work / "table.parts"

    child = Child(VALIDATE, work, tmp_path / "logs")
    first_row = child.wait_for(lambda: parts.is_dir() and any(parts.glob("*.npz")))
    (delay,) = delays(sig, 1, 0.0, 1.5)
    sent = first_row and child.signal_after(sig, delay)
    rc, _, err = child.finish()
    assert first_row or rc == 0, f"no row was kept while the command ran (exit {rc}):\n{err[-3000:]}"
    completed = check_exit(sig, sent, rc, err)
    kept = sorted(p.name for p in parts.glob("*.npz")) if parts.is_dir() else []
    if completed:
        pd.testing.assert_frame_equal(_table(work / "table.csv"), clean_validation)
    else:
        assert kept, "a finished row was lost"
        assert not (work / "table.csv").exists() or _table(work / "table.csv").equals(clean_validation), \
            "the interrupted run left a partial table"
        if sig == signal.SIGINT:
            assert f"{len(kept)} simulated row" in err, \
                f"the interrupt line does not say how many rows were kept: {err}"

    code, out, err = run_cli(VALIDATE, cwd=work)
    assert code == 0, err
    if not completed:
        assert re.search(r"reused \d+ of \d+ rows", out + err), f"the re-run did not report reusing rows:\n{out}"
        assert f"reused {len(kept)} of" in out + err, f"{len(kept)} rows were kept: {out}"
    pd.testing.assert_frame_equal(_table(work / "table.csv"), clean_validation)


# ---------------------------------------------------------------------------------------------------------------
# bench: a sweep killed or interrupted mid-run resumes without losing or duplicating a measurement

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_bench_interrupted_resumes_without_duplicates(sig, tmp_path, monkeypatch, run_cli):
    torch = pytest.importorskip("torch", reason="bench needs torch (pip install -e '.[bench]')")
    from hydra import compose, initialize_config_dir

    from kernelsight.cli import bench as commands
    from kernelsight.microbench.runner import row_key
    from kernelsight.predictor.paths import conf_dir
    from kernelsight.predictor.sweep import read_sweep

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what bench device=cpu sets, undone after the test
    # The torch kernels of the cpu grid, each timed 100 times after flushing 32 MiB of cache: ~4 s of measuring.
    settings = ["sweep=cpu", "device=cpu", "progress=false", f"out={tmp_path / 'sweeps'}", "shard_rows=2",
                "sweep.collectives.ops=[]", "providers=[torch]", "sweep.timing.min_reps=100",
                "sweep.timing.max_reps=100", "sweep.timing.budget_ms=1e9", "sweep.timing.cpu_flush_mb=32"]
    sweep = tmp_path / "sweeps" / "cpu" / "r"
    child = Child(["bench", *settings, "sweep_id=r"], tmp_path, tmp_path / "logs")
    started = child.wait_for(lambda: len(list(sweep.glob("*.parquet"))) >= 1)
    (delay,) = delays(sig, 1, 0.2, 2.0)
    sent = started and child.signal_after(sig, delay)
    rc, _, err = child.finish()
    assert started and not check_exit(sig, sent, rc, err), "the sweep ended before it could be interrupted"
    before = {row_key(r) for r in read_sweep(sweep).to_dict("records")}  # every shard on disk is readable

    code, out, err = run_cli(["bench", *settings, "sweep_id=r", "resume=true"], cwd=tmp_path)
    assert code == 0, err
    assert f"resuming: {len(before)} measurements already in the sweep are skipped" in out
    keys = [row_key(r) for r in read_sweep(sweep).to_dict("records")]
    assert len(keys) == len(set(keys)), "a shape was measured twice"
    assert before <= set(keys), "a measurement was lost"
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        plan = commands.plan(compose(config_name="bench", overrides=settings), torch.device("cpu"))
    planned = {row_key({**i.shape.row(), "provider": i.provider.name, "timing": "cold"}) for i in plan.items}
    assert set(keys) == planned, "the resumed sweep does not hold the planned shapes"


# ---------------------------------------------------------------------------------------------------------------
# plan: an interrupted search keeps its finished candidates and the resumed run simulates only the rest

PLAN = ["plan", "model=llama3.1-8b", "model.layers=4", "gpus=[h100_sxm,h200_sxm]", "search.tp=[1,2,4]",
        "search.max_num_seqs=[256]", "search.max_num_batched_tokens=[2048]", "search.kv_cache_dtype=[auto]",
        "search.num_requests=100", "workload.request_rate=4", "slo.ttft_ms=200", "slo.tpot_ms=5", "intervals=0",
        "jobs=2", "output_dir=out"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_plan_interrupted_resumes_with_the_same_answer(sig, tmp_path, run_cli):
    """Each candidate here is alone on its GPU and layout, so a resumed search starts where the whole one
    would and the two tables must match."""
    whole = tmp_path / "whole"
    whole.mkdir()
    code, _, err = run_cli(PLAN, cwd=whole)
    assert code == 0, err
    expected = pd.read_parquet(whole / "out" / "candidates.parquet").drop(columns=["wall_s"])

    work = tmp_path / "work"
    work.mkdir()
    partial = work / "out" / "partial.jsonl"
    child = Child(PLAN, work, tmp_path / "logs")
    first = child.wait_for(lambda: partial.is_file() and len(partial.read_text().splitlines()) >= 2)
    sent = first and child.signal_after(sig, 0.0)
    rc, _, err = child.finish()
    completed = check_exit(sig, sent, rc, err)
    if not completed:
        if sig == signal.SIGINT:
            assert "resume=true" in err and " of 6 candidates kept" in err, err
        code, out, err = run_cli([*PLAN, "resume=true"], cwd=work)
        assert code == 0, err
        assert re.search(r"\d+ kept from", out), out
    got = pd.read_parquet(work / "out" / "candidates.parquet").drop(columns=["wall_s"])
    pd.testing.assert_frame_equal(got, expected)
    assert not partial.exists()
