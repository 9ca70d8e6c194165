"""The sweep contract: schema, atomic writes, and refusal of bad files with one clear line."""
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernelsight.predictor import sweep
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import make_shape
from kernelsight.predictor.sweep import (COLUMNS, SCHEMA_VERSION, read_environment, read_sweep, with_cost,
                                         write_sweep)


def _frame():
    rows = [make_shape("gemm", m=128, n=4096, k=4096).row(),
            make_shape("attn_decode", batch=8, seq_kv=1024, heads=32, kv_heads=8, head_dim=128,
                       kv_dtype="fp8").row(),
            make_shape("allreduce", msg_bytes=1 << 20, world_size=4).row()]
    df = pd.DataFrame(rows)
    df["provider"] = ["torch.F.linear", "triton.paged_decode", "nccl"]
    df["latency_ms"] = [0.05, 0.02, 0.03]
    df["latency_p10_ms"] = [0.049, 0.019, 0.029]
    df["latency_p90_ms"] = [0.051, 0.021, 0.031]
    df["samples"] = [100, 100, 50]
    df["timing"] = "cold"
    df["device"] = "h100_sxm"
    df["device_name"] = "NVIDIA H100 80GB HBM3"
    df["source"] = "measured"
    df["sweep_id"] = "test"
    return with_cost(df)


def test_round_trip_keeps_values_and_environment(tmp_path):
    path = write_sweep(_frame(), tmp_path / "s.parquet", {"gpu": "H100", "torch": "2.11"})
    df = read_sweep(path)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 3
    assert df.loc[0, "flops"] == 2 * 128 * 4096 * 4096
    assert df.loc[1, "kv_dtype"] == "fp8"
    assert df.loc[2, "msg_bytes"] == 1 << 20
    assert (df["status"] == "ok").all()  # defaults filled
    assert df.attrs["environment"] == {"gpu": "H100", "torch": "2.11"}
    assert read_environment(path)["torch"] == "2.11"
    meta = pq.read_schema(path).metadata
    assert int(meta[b"kernelsight.schema_version"]) == SCHEMA_VERSION


def test_directory_of_shards_reads_as_one_sweep(tmp_path):
    df = _frame()
    write_sweep(df.iloc[:2], tmp_path / "shard-0000.parquet")
    write_sweep(df.iloc[2:], tmp_path / "shard-0001.parquet")
    assert len(read_sweep(tmp_path)) == 3


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    target = tmp_path / "s.parquet"

    def crash(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep.pq, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        write_sweep(_frame(), target)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_overwrite_is_atomic_old_file_survives_a_crash(tmp_path, monkeypatch):
    target = write_sweep(_frame(), tmp_path / "s.parquet")
    monkeypatch.setattr(sweep.pq, "write_table", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "disk full")))
    with pytest.raises(KernelsightError, match="cannot write: disk full .*nothing was written"):
        write_sweep(_frame().iloc[:1], target)
    assert len(read_sweep(target)) == 3


def _one_line(excinfo, *needles):
    msg = str(excinfo.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg


def test_truncated_file_is_refused(tmp_path):
    path = write_sweep(_frame(), tmp_path / "s.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(KernelsightError) as e:
        read_sweep(path)
    _one_line(e, str(path), "truncated or corrupt")


def test_not_parquet_and_missing_file(tmp_path):
    bad = tmp_path / "notes.parquet"
    bad.write_text("hello")
    with pytest.raises(KernelsightError) as e:
        read_sweep(bad)
    _one_line(e, "not a readable Parquet file")
    with pytest.raises(KernelsightError) as e:
        read_sweep(tmp_path / "nope.parquet")
    _one_line(e, "no such file")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KernelsightError) as e:
        read_sweep(empty)
    _one_line(e, "no .parquet")


def test_foreign_parquet_and_newer_schema_are_refused(tmp_path):
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), foreign)
    with pytest.raises(KernelsightError) as e:
        read_sweep(foreign)
    _one_line(e, "not a kernelsight sweep")

    path = write_sweep(_frame(), tmp_path / "s.parquet")
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    meta[b"kernelsight.schema_version"] = str(SCHEMA_VERSION + 1).encode()
    newer = tmp_path / "newer.parquet"
    pq.write_table(table.replace_schema_metadata(meta), newer)
    with pytest.raises(KernelsightError) as e:
        read_sweep(newer)
    _one_line(e, "newer", "upgrade")

    dropped = tmp_path / "dropped.parquet"
    pq.write_table(table.drop(["latency_ms"]), dropped)
    with pytest.raises(KernelsightError) as e:
        read_sweep(dropped)
    _one_line(e, "missing column", "latency_ms")


def test_bad_rows_are_refused_naming_row_and_field(tmp_path):
    df = _frame()
    df.loc[1, "latency_ms"] = -1.0
    with pytest.raises(KernelsightError) as e:
        write_sweep(df, tmp_path / "s.parquet")
    _one_line(e, "row 1", "latency_ms")
    assert not (tmp_path / "s.parquet").exists()

    df = _frame()
    df.loc[0, "family"] = "gemn"
    with pytest.raises(KernelsightError) as e:
        write_sweep(df, tmp_path / "s.parquet")
    _one_line(e, "did you mean 'gemm'")

    df = _frame()
    df.loc[1, "heads"] = 30
    with pytest.raises(KernelsightError) as e:
        write_sweep(df, tmp_path / "s.parquet")
    _one_line(e, "row 1", "kv_heads")

    df = _frame()
    df["colour"] = "blue"
    with pytest.raises(KernelsightError) as e:
        write_sweep(df, tmp_path / "s.parquet")
    _one_line(e, "colour")

    df = _frame()
    df.loc[2, "status"] = "maybe"
    with pytest.raises(KernelsightError) as e:
        write_sweep(df, tmp_path / "s.parquet")
    _one_line(e, "row 2", "status")


def test_failed_rows_need_no_latency(tmp_path):
    df = _frame()
    df.loc[0, "latency_ms"] = None
    df.loc[0, "status"] = "failed"
    df.loc[0, "error"] = "CUDA out of memory"
    out = read_sweep(write_sweep(df, tmp_path / "s.parquet"))
    assert out.loc[0, "status"] == "failed" and out.loc[0, "error"] == "CUDA out of memory"


def test_environment_must_be_json_serialisable_and_is_sorted(tmp_path):
    path = write_sweep(_frame(), tmp_path / "s.parquet", {"b": 1, "a": [1, 2]})
    raw = pq.read_schema(path).metadata[b"kernelsight.environment"]
    assert json.loads(raw) == {"a": [1, 2], "b": 1}
    assert raw.index(b'"a"') < raw.index(b'"b"')


def test_a_sweep_file_without_rows_is_refused_naming_it(tmp_path):
    path = write_sweep(_frame(), tmp_path / "s.parquet")
    table = pq.read_table(path)
    empty = tmp_path / "empty.parquet"
    pq.write_table(table.slice(0, 0), empty)
    with pytest.raises(KernelsightError) as e:
        read_sweep(empty)
    _one_line(e, str(empty), "no rows")
    with pytest.raises(KernelsightError) as e:  # also when filters would have kept none anyway
        read_sweep(empty, columns=["family"], filters=[("family", "=", "gemm")])
    _one_line(e, str(empty), "no rows")
    with pytest.raises(KernelsightError) as e:
        write_sweep(_frame().iloc[:0], tmp_path / "none.parquet")
    _one_line(e, "none.parquet", "no rows")
    # a filter that matches nothing in a file with rows is not an error
    assert read_sweep(path, filters=[("family", "=", "moe")]).empty


def _write_raw(path, df):
    """A sweep file holding rows write_sweep would refuse (as an old or foreign writer might leave)."""
    table = sweep._to_table(df.reindex(columns=list(COLUMNS)), {})
    pq.write_table(table, path)
    return path


def test_bad_rows_of_a_sweep_file_name_the_file_row_and_value(tmp_path):
    df = sweep.conform(_frame())
    df.loc[2, "device"] = "h100"
    bad = _write_raw(tmp_path / "shard-1.parquet", df)
    write_sweep(_frame(), tmp_path / "shard-0.parquet")
    with pytest.raises(KernelsightError) as e:
        read_sweep(tmp_path)  # a directory: the shard at fault is named, rows counted within it
    _one_line(e, str(bad), "row 2", "device = 'h100'", "did you mean 'h100_sxm'?")
    df.loc[2, "device"] = "z900"
    _write_raw(bad, df)
    with pytest.raises(KernelsightError) as e:
        read_sweep(bad)
    _one_line(e, str(bad), "row 2", "device = 'z900': not a hardware catalog key")
    df.loc[2, "device"] = "cpu"  # CPU-mode sweeps of the harness are not catalog devices
    assert len(read_sweep(_write_raw(bad, df))) == 3
    df.loc[1, "family"] = "attn_decod"
    _write_raw(bad, df)
    with pytest.raises(KernelsightError) as e:
        read_sweep(bad)
    _one_line(e, str(bad), "row 1", "family = 'attn_decod'", "did you mean 'attn_decode'")
    df = sweep.conform(_frame())
    df.loc[0, "m"] = 0
    _write_raw(bad, df)
    with pytest.raises(KernelsightError) as e:
        read_sweep(bad)
    _one_line(e, str(bad), "row 0", "gemm.m = 0")
    with pytest.raises(KernelsightError) as e:
        read_sweep(bad, columns=["family", "colour"])
    _one_line(e, str(bad), "colour")
