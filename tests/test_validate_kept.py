"""`kernelsight validate` loses nothing: rows kept as they finish and reused by the same command, bad rows
refused up front with their reason while the others run, output paths checked before any row runs."""
from __future__ import annotations

import pandas as pd
import pytest

from kernelsight import cli
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir
from kernelsight.validate.rows import default_csv
from kernelsight.validate.score import load_validation

QUICK = ["tiers.cross=null", "tiers.target.predictor_tier=roofline", "protocol.num_requests=16", "jobs=1",
         "plots=false"]
HEADER = "id,model_path,precision,system,isl,osl,concurrency,tp_size,ttft_ms,tpot_ms"
GOOD = "a,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,8,2,154.2,18.0"
TP3 = "b,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,8,3,154.2,18.0"
UNKNOWN = "c,acme/unknown-7b,bf16,h100_sxm,1024,128,8,1,154.2,18.0"
FP4 = "d,Qwen/Qwen3-32B,fp4,h100_sxm,1024,128,8,2,154.2,18.0"


def validate(tmp_path, *args):
    cli.main(["validate", *QUICK, f"table={tmp_path / 'rows.csv'}", f"report={tmp_path / 'v.md'}", *args])


def test_a_second_run_reuses_the_kept_rows_and_another_setting_does_not(tmp_path, capsys):
    validate(tmp_path, str(default_csv()), "rows=[1,2]")
    first = pd.read_csv(tmp_path / "rows.csv")
    assert sorted(p.name for p in (tmp_path / "rows.parts").iterdir()) == ["target-vllm_dev-row1.npz", "target-vllm_dev-row2.npz"]
    assert "reused" not in capsys.readouterr().out
    validate(tmp_path, str(default_csv()), "rows=[1,2]")
    assert f"reused 2 of 2 rows simulated earlier with the same settings ({tmp_path / 'rows.parts'}/)" in \
        capsys.readouterr().out
    again = pd.read_csv(tmp_path / "rows.csv")
    pd.testing.assert_frame_equal(first, again)  # the kept step logs score exactly as the simulation did
    validate(tmp_path, str(default_csv()), "rows=[1,2]", "engine.serving_error.ttft.p90=0.5")
    assert "reused 2 of 2 rows" in capsys.readouterr().out  # the serving error changes no simulation
    validate(tmp_path, str(default_csv()), "rows=[1,2]", "protocol.num_requests=20")
    assert "reused" not in capsys.readouterr().out  # another request count: simulated again


def test_a_bad_row_is_refused_with_its_reason_and_the_others_are_scored(tmp_path, capsys):
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([HEADER, GOOD, TP3, UNKNOWN]) + "\n")
    validate(tmp_path, str(csv))
    err = capsys.readouterr().err
    assert f"kernelsight validate: refused: {csv}: row 2: model qwen3-32b with tp=3: tp=3 does not divide the 64 " \
           f"attention heads" in err
    assert f"refused: {csv}: row 3: no model config for model_path 'acme/unknown-7b'" in err
    table = pd.read_csv(tmp_path / "rows.csv")
    assert list(table["line"]) == [1, 2, 3] and table["ttft_simulated"].notna().tolist() == [True, False, False]
    assert table["refused"].isna()[0] and "does not divide" in table["refused"][1]
    report = (tmp_path / "v.md").read_text()
    assert "## Refused rows" in report and "acme/unknown-7b" in report


def test_every_row_is_checked_before_any_is_simulated(tmp_path):
    """The fp4 row is last in the file and fails in its setup (no fp4 peak on H100): found while loading."""
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([HEADER, GOOD, GOOD.replace("a,", "e,"), FP4]) + "\n")
    from omegaconf import OmegaConf

    engine = OmegaConf.to_container(OmegaConf.load(conf_dir() / "engine" / "vllm_v1.yaml"))
    mappings = [{"model_path": "Qwen/Qwen3-32B", "precision": "fp4", "model": "qwen3-32b", "weight_dtype": "fp4"}]
    protocol = {"warmup_rounds": 0, "rounds": 1, "start": "burst", "num_requests": 4}
    fit = {"params": ["per_request_us"], "metrics": ["tpot"]}
    v = load_validation(csv, None, mappings, engine, protocol, 0, fit)
    assert [r.line for r in v.rows] == [1, 2]
    [(row, why)] = v.refused
    assert row.line == 3 and why.startswith(f"{csv}: row 3: ") and "has no fp4 peak" in why
    with pytest.raises(KernelsightError, match=r"every row refused; .*row 3: no model config") as e:
        load_validation(csv, [3], [], engine, protocol, 0, fit)  # no mapping: no fp4 model config
    assert "\n" not in str(e.value)
    with pytest.raises(KernelsightError, match="seed=-1: must be an integer >= 0"):
        load_validation(csv, None, mappings, engine, protocol, -1, fit)


def test_bad_output_paths_fail_before_any_row_runs(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    report, table = f"report={tmp_path / 'v.md'}", f"table={tmp_path / 'rows.csv'}"
    for args, message in (([f"report={tmp_path / 'file' / 'v.md'}", table], "file is a file, not a directory"),
                          ([report, f"table={tmp_path / 'rows.txt'}"], "unknown format '.txt'"),
                          ([report, table, f"readme={tmp_path / 'file'}"], "no '<!-- accuracy:start -->'")):
        with pytest.raises(SystemExit) as e:
            cli.main(["validate", "rows=[vllm_dev:1]", *QUICK, *args])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_ctrl_c_keeps_the_finished_rows_and_says_how_to_continue(tmp_path, capsys, monkeypatch):
    from kernelsight.validate import run

    simulate_row, calls = run.simulate_row, []

    def interrupted_on_the_second_row(*job):
        calls.append(job[0].line)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return simulate_row(*job)

    monkeypatch.setattr(run, "simulate_row", interrupted_on_the_second_row)
    with pytest.raises(SystemExit) as e:
        validate(tmp_path, str(default_csv()), "rows=[1,2]")
    assert e.value.code == 130
    assert capsys.readouterr().err == (f"kernelsight validate: interrupted: 1 simulated row kept in "
                                       f"{tmp_path / 'rows.parts'}/; run the same command again to continue\n")
    monkeypatch.setattr(run, "simulate_row", simulate_row)
    validate(tmp_path, str(default_csv()), "rows=[1,2]")
    assert "reused 1 of 2 rows" in capsys.readouterr().out
