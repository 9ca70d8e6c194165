"""The committed public data (data/public, one folder per imported dataset) and reference copies (validation set,
traces, Hugging Face configs): the files, their licences and provenance notes, and rows that read back valid."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from kernelsight.calibrate.importers import aiconfigurator
from kernelsight.calibrate.importers.common import ETA_LT_1, write_public
from kernelsight.predictor.paths import conf_dir, data_dir
from kernelsight.predictor.sweep import read_environment, read_sweep

VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"  # the Vidur commit the traces were copied from
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"  # conf/import.yaml's default src


COMMITTED = {
    "aiconfigurator": {"a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s"},
    "vidur": {"a100_sxm", "h100_sxm"},
    "neusight": {"p4", "p100_pcie", "t4", "v100_pcie", "a100_pcie_40g", "a100_pcie", "h100_sxm", "l4"},
}


@pytest.mark.parametrize("dataset", sorted(COMMITTED))
def test_committed_public_data(dataset):
    folder = data_dir() / "public" / dataset
    files = sorted(folder.glob("*.parquet"))
    assert {p.stem for p in files} == COMMITTED[dataset]
    assert all(p.stat().st_size < 20 * 2**20 for p in files)
    assert (folder / "LICENSE").is_file() and "## Conversion by kernelsight" in (folder / "SOURCE.md").read_text()
    df = read_sweep(folder)  # validates the schema and every row's shape
    assert set(df.device) == COMMITTED[dataset]
    assert df.source.str.fullmatch(rf"import:{dataset}@[0-9a-f]{{8}}").all()
    assert (df.bytes > 0).all() and (df.latency_ms > 0).all() and set(df["flags"]) <= {"", ETA_LT_1}
    for f in files:
        assert read_environment(f)["device"] == f.stem


def test_committed_reference_copies():
    validation = data_dir() / "validation"
    assert {"vllm_dev.csv", "README.md", "LICENSE"} <= {p.name for p in validation.iterdir()}
    e2e = pd.read_csv(validation / "vllm_dev.csv")
    assert {"ttft_ms", "tpot_ms", "isl", "osl", "concurrency", "tp_size"} <= set(e2e.columns) and len(e2e) > 0
    traces = data_dir() / "traces"
    for name in ("splitwise_code.csv", "splitwise_conv.csv", "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"):
        df = pd.read_csv(traces / name)
        assert (df.num_prefill_tokens > 0).all() and (df.num_decode_tokens > 0).all()
    assert "MIT" in (traces / "SOURCE.md").read_text() and VIDUR_COMMIT in (traces / "SOURCE.md").read_text()
    hf = conf_dir() / "model" / "hf"
    assert (hf / "SOURCE.md").is_file() and (hf / "meta-llama--Meta-Llama-3.1-8B_config.json").is_file()
    assert json.loads((hf / "meta-llama--Meta-Llama-3.1-8B_config.json").read_text())["hidden_size"] == 4096


@pytest.mark.slow
def test_committed_aiconfigurator_equals_a_reimport(tmp_path):
    """data/public/aiconfigurator is exactly what the importer makes of the reference data today (schema, rows,
    metadata, SOURCE.md): a change to a cost model, a family or the importer must come with re-imported data."""
    src = SHARED_DATA / "aiconfigurator"
    if not src.is_dir():
        pytest.skip(f"{src} (the public reference data) is not here")
    write_public(aiconfigurator.convert(src), tmp_path, aiconfigurator.CONVERSION)
    fresh, committed = tmp_path / "aiconfigurator", data_dir() / "public" / "aiconfigurator"
    assert sorted(p.name for p in fresh.iterdir()) == sorted(p.name for p in committed.iterdir())
    assert (fresh / "SOURCE.md").read_text() == (committed / "SOURCE.md").read_text()
    for new in sorted(fresh.glob("*.parquet")):
        old = committed / new.name
        assert pq.read_schema(new).equals(pq.read_schema(old), check_metadata=True), new.name
        assert pq.read_table(new).equals(pq.read_table(old)), new.name
