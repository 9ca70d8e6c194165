"""`kernelsight validate serve.run=...`: the simulator against our own transformers runs (validate/serve.py)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kernelsight import cli
from kernelsight.predictor.paths import data_dir

RUN = data_dir() / "validation" / "transformers" / "h100_sxm" / "llama8b-1"


@pytest.mark.slow
def test_every_workload_is_scored_and_poisson_is_never_fitted(tmp_path, capsys):
    report, table = tmp_path / "serve.md", tmp_path / "rows.csv"
    cli.main(["validate", "engine=transformers_cb", f"serve.run={RUN}", f"serve.report={report}",
              f"serve.table={table}"])
    df = pd.read_csv(table)
    measured = json.loads((RUN / "workloads.json").read_text())
    assert sorted(df["workload"]) == sorted(measured) and len(df) == 6
    for r in df.itertuples():  # measured means are the requests' means
        rows = pd.read_parquet(RUN / f"{r.workload}.parquet")
        assert r.requests == len(rows) and np.isclose(r.ttft, rows["ttft_ms"].mean())
    errors = [c for c in df if c.startswith("err_")]
    assert len(errors) == 6 and np.isfinite(df[errors].to_numpy()).all()  # 3 metrics, simulated and held-out
    prefix = df.set_index("workload")["prefix_hit_rate"]
    assert prefix["closed_c32_prefix"] > 0.5 and prefix["closed_c32"] == 0  # 768 of 1024 tokens shared
    text = report.read_text()
    assert "without closed_c8" in text and "without poisson" not in text  # open-loop traffic is never fitted on
    assert "Median absolute held-out error" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["serve.run=RUN"], "pass engine=transformers_cb"),
    (["engine=transformers_cb", "serve.run=/no/such/run"], "no such run directory"),
    (["engine=transformers_cb", "serve.run=BROKEN"], "not a readable bench serve record"),
])
def test_bad_serve_input_is_one_line(tmp_path, capsys, args, message):
    broken = tmp_path / "broken"
    shutil.copytree(RUN, broken)
    (broken / "workloads.json").write_text("{not json", encoding="utf-8")
    args = [a.replace("=RUN", f"={RUN}").replace("=BROKEN", f"={broken}") for a in args]
    with pytest.raises(SystemExit):
        cli.main(["validate", *args, f"serve.report={tmp_path}/r.md", f"serve.table={tmp_path}/t.csv"])
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_several_runs_are_scored_leave_one_run_out(tmp_path):
    """Two runs (Llama on an H100, Qwen on an H200): every workload of one run is scored with the host terms
    fitted on the other run's closed loops alone, which are the terms a validation of that run fits."""
    qwen = data_dir() / "validation" / "transformers" / "h200_sxm" / "qwen8b-1"
    both, alone = tmp_path / "both.md", tmp_path / "alone.md"
    cli.main(["validate", "engine=transformers_cb", f"serve.run=[{RUN},{qwen}]", f"serve.report={both}",
              f"serve.table={tmp_path}/both.csv"])
    df = pd.read_csv(tmp_path / "both.csv")
    assert df.groupby("run").size().to_dict() == {"h100_sxm/llama8b-1": 6, "h200_sxm/qwen8b-1": 3}
    assert np.isfinite(df[[c for c in df if c.endswith("_heldout")]].to_numpy()).all()
    cli.main(["validate", "engine=transformers_cb", f"serve.run={RUN}", f"serve.report={alone}",
              f"serve.table={tmp_path}/alone.csv"])
    terms = lambda text, name: next(line for line in text.splitlines() if line.startswith(f"- {name}:"))  # noqa: E731
    assert (terms(both.read_text(), "without h200_sxm/qwen8b-1").split(":")[1]
            == terms(alone.read_text(), "all closed-loop workloads").split(":")[1])
    assert "| h200_sxm/qwen8b-1 | 3 |" in both.read_text()  # per-run medians


def test_serve_run_all_is_every_committed_run(tmp_path, capsys):
    from kernelsight.validate.serve import run_dirs

    runs = run_dirs("all")
    assert RUN in runs and len(runs) >= 3 and all((r / "workloads.json").is_file() for r in runs)
    with pytest.raises(SystemExit):
        cli.main(["validate", "engine=transformers_cb", f"serve.run=[{RUN},{RUN}]", f"serve.report={tmp_path}/r.md",
                  f"serve.table={tmp_path}/t.csv"])
    err = capsys.readouterr().err
    assert "a run is given twice" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_measured_energy_is_scored_against_the_simulated_and_the_tdp_baseline(tmp_path):
    """A run whose workloads carry NVML readings gets energy columns; the values here are planted: 400 W mean
    over a window of the measured requests' span, so the checks follow from them alone."""
    run = tmp_path / "h100_sxm" / "energy"
    shutil.copytree(RUN, run)
    measured = json.loads((run / "workloads.json").read_text())
    for name in ("closed_c8", "poisson_r2"):
        rows = pd.read_parquet(run / f"{name}.parquet")
        span = float(rows["finish_s"].max() - rows["send_s"].min())
        measured[name]["energy"] = {"energy_j": 400.0 * span, "duration_s": span, "mean_power_w": 400.0,
                                    "peak_power_w": 600.0, "power_samples": 10, "idle_power_w": 90.0}
    (run / "workloads.json").write_text(json.dumps(measured))
    report, table = tmp_path / "serve.md", tmp_path / "rows.csv"
    cli.main(["validate", "engine=transformers_cb", f"serve.run={run}", f"serve.report={report}",
              f"serve.table={table}"])
    df = pd.read_csv(table).set_index("workload")
    scored = df.dropna(subset=["energy_per_token"])
    assert sorted(scored.index) == ["closed_c8", "poisson_r2"]
    tokens = {w: pd.read_parquet(run / f"{w}.parquet")["output_len"].sum() for w in scored.index}
    for w, r in scored.iterrows():
        assert np.isclose(r["energy_per_token"] * tokens[w], 400.0 * r["energy_per_token_tdp"] * tokens[w] / 700.0)
        assert np.isclose(r["err_power_tdp"], 75.0)  # 700 W TDP against 400 W measured
        assert 100 < r["power_heldout"] < 700 and 0 < r["energy_per_token_heldout"]
        assert 50 < r["idle_power_model"] < 200
    assert df.loc["closed_c32", ["energy_per_token_heldout"]].isna().all()  # not measured: not scored
    text = report.read_text()
    assert "J/token measured" in text and "| 90 |" in text and "Median absolute error over 2 workloads" in text


@pytest.mark.parametrize("energy, message", [
    ({"energy_j": "lots", "mean_power_w": 300.0}, "energy is not an NVML reading"),
    ({"mean_power_w": 300.0}, "energy is not an NVML reading"),
    ({"energy_j": -5.0, "mean_power_w": 300.0}, "must be positive"),
])
def test_a_bad_energy_reading_is_one_line(tmp_path, capsys, energy, message):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    measured = json.loads((run / "workloads.json").read_text())
    measured["closed_c8"]["energy"] = energy
    (run / "workloads.json").write_text(json.dumps(measured))
    with pytest.raises(SystemExit):
        cli.main(["validate", "engine=transformers_cb", f"serve.run={run}", f"serve.report={tmp_path}/r.md",
                  f"serve.table={tmp_path}/t.csv"])
    err = capsys.readouterr().err
    assert message in err and "closed_c8" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
