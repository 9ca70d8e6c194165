"""`kernelsight validate` with intervals: every row also simulated at both ends of its kernels' 80 % intervals,
and the report says how often the measured value fell inside the simulated range."""
from __future__ import annotations

import numpy as np
import pandas as pd

from kernelsight import cli
from kernelsight.validate import serving_error
from kernelsight.validate.rows import default_csv
from kernelsight.validate.run import Tier


def test_a_band_tier_keeps_its_rows_apart_and_its_band_per_gpu():
    tier = Tier("cross", "cross", "no_{device}").at_band("p90")
    assert (tier.name, tier.band) == ("cross-p90", "p90")
    assert Tier("target", "auto", None).at_band("p10").on("h100_sxm").band == "p10"


def test_interval_coverage_counts_rows_with_a_measured_value_and_a_range():
    df = pd.DataFrame({"tier": ["target"] * 3, "ttft": [1.0, 2.0, np.nan], "ttft_lo": [0.5, 2.5, 1.0],
                       "ttft_hi": [1.5, 3.0, 2.0]})
    covered = serving_error.coverage(df)
    assert covered[["tier", "metric", "rows", "kernels %"]].to_dict(orient="records") == [
        {"tier": "target", "metric": "TTFT", "rows": 2, "kernels %": 50.0}]


def test_validate_reports_how_often_the_measured_value_is_inside_the_simulated_range(capsys, tmp_path):
    table, report = tmp_path / "rows.json", tmp_path / "validation.md"
    cli.main(["validate", str(default_csv()), "rows=[1]", "tiers.cross=null", "protocol.num_requests=16", "jobs=1",
              "plots=false", "intervals=true", f"table={table}", f"report={report}"])
    df = pd.read_json(table)
    for metric in ("ttft", "tpot", "throughput"):
        lo, hi = df[f"{metric}_lo"].iloc[0], df[f"{metric}_hi"].iloc[0]
        assert lo < df[f"{metric}_simulated"].iloc[0] < hi
        assert df[f"{metric}_inside"].iloc[0] == (lo <= df[metric].iloc[0] <= hi)
    assert "## 80 % ranges: measured values inside the simulated range" in report.read_text()
    assert "measured inside the simulated 80 % range, held out: target TTFT kernels" in capsys.readouterr().out


def test_a_band_needs_a_bundle_that_holds_intervals(tmp_path):
    """validate reads the bundle's manifest (not its models) to decide whether a tier has kernel ranges."""
    from kernelsight.validate.store import bundle_manifest

    assert bundle_manifest(Tier("target", "auto", None))["intervals"]  # the shipped bundle
    assert bundle_manifest(Tier("roofline", "roofline", None)) == {}
    assert bundle_manifest(Tier("cross", "cross", str(tmp_path / "not_built"))) == {}
    (tmp_path / "manifest.json").write_text('{"content_id": "x", "intervals": {}}')
    assert not bundle_manifest(Tier("cross", "cross", str(tmp_path))).get("intervals")
