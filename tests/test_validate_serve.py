"""`kernelsight validate serve.run=...`: the simulator against our own transformers runs (sim/validate/serve.py)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kernelsight.predictor import cli
from kernelsight.predictor.paths import data_dir

RUN = data_dir() / "validation" / "transformers" / "h100_sxm" / "llama8b-1"


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
