"""NeuSight FP32 PyTorch operator measurements -> sweep rows.

Layout: train/<op>/<torch version>/<device>.csv (one op and GPU per file) and
test/*.csv (held-out shapes, all GPUs mixed). test/vec.csv repeats every row of
test/ln.csv, test/softmax.csv and test/elem.csv, so test rows are deduplicated
(identical measurement and shape); the repeats are counted as rejected
duplicates. Latency is the `Latency` column (ms); all tensors are float32.

  linear    gemm, dtype fp32: m = B * M, n = N, k = K. torch's fp32 matmul with
            TF32 disabled (the default): every `Kernel Name` is an FP32 SIMT
            kernel (*sgemm*, or cuBLAS xmma '...ffma...' on H100); a row whose
            kernel is not is rejected, so no tensor-core (TF32) time is priced
            at the FP32 peak. Split-K reduction kernels count in the latency.
  ln        norm: op layer, tokens = B, hidden = H, no fused residual.
  softmax   elementwise softmax, numel = B * H.
  others    elementwise <op>, numel = B * H: add, gelu and the test ops ('addu'
            = tensor + scalar, ...), named as in predictor/families/elementwise.py;
            an op missing from that table is rejected with the reason.

provider: 'torch.F.linear', 'torch.layer_norm', 'torch.softmax', 'torch.<op>'.
Devices: the `Device` column through the hardware catalog (for train files it
must match the file name). sweep_id 'neusight/train' or 'neusight/test'; the
torch, CUDA and cuDNN versions go into the file metadata.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families.elementwise import OPS as ELEMENTWISE_OPS

from .common import (ImportResult, candidates, finish, first_reason, read_source_info, read_table,
                     assign_devices, row_locations)

DATASET = "neusight"
DTYPE = "fp32"
BASE_COLUMNS = ["OPName", "Latency", "Device", "Torch Version", "CUDA Version", "CUDNN Version", "Kernel Name"]
FP32_GEMM_KERNEL = r"sgemm|ffma"
# Columns that identify one measurement; a test row equal on all of them is a repeat.
IDENTITY = ["OPName", "Device", "Latency", "Kernel Name", "B", "H", "M", "N", "K"]

CONVERSION = """\
Converted with `kernelsight import dataset=neusight` (calibrate/importers/neusight.py). One file per GPU
(catalog key), rows in the kernelsight sweep contract, dtype fp32: linear -> gemm (m = B x M, n = N, k = K;
FP32 SIMT sgemm/ffma kernels, no TF32), ln -> norm (layer, tokens = B, hidden = H), softmax -> elementwise
softmax, add/gelu and the other element-wise ops -> elementwise (numel = B x H). sweep_id neusight/train for
train/<op>/<torch>/<device>.csv and neusight/test for test/*.csv, whose duplicates (vec.csv repeats ln,
softmax and elem rows) are dropped and counted. flops/bytes/blocks come from kernelsight's cost model; rows
measured faster than their roofline are kept with flag eta_lt_1.
"""


def convert(src, progress=None) -> ImportResult:
    """Every train/<op>/<torch>/<device>.csv and test/*.csv under src. progress: a tqdm-like factory for a
    bar over the train files, or None."""
    info = read_source_info(Path(src), DATASET)
    train = sorted((info.folder / "train").glob("*/*/*.csv"))
    test = sorted((info.folder / "test").glob("*.csv"))
    if not train and not test:
        raise KernelsightError(f"{info.folder}: no train/<op>/<torch>/<device>.csv or test/*.csv files")
    frames = [_rows(read_table(p, BASE_COLUMNS), p, "train")
              for p in (progress(train, desc=DATASET, unit="file") if progress else train)]
    for path, frame in zip(train, frames):
        wrong = frame["device_name"] != path.stem
        frame.loc[wrong & frame["reject"].isna(), "reject"] = f"Device column differs from the file name {path.stem!r}"
    if test:
        frames.append(_test(test))
    cands = pd.concat(frames, ignore_index=True)
    cands["device"], unknown = assign_devices(cands["device_name"])
    cands["reject"] = cands["reject"].where(cands["reject"].notna(), unknown)
    versions = {s: {"dtype": DTYPE, **v} for s, v in _versions(cands).items()}
    return finish(info, cands.drop(columns=["versions"]), sweeps=versions)


def _test(paths) -> pd.DataFrame:
    """All test files, each repeated measurement once (the first file that holds it keeps it)."""
    tables = []
    for path in paths:
        table = read_table(path, BASE_COLUMNS)
        table["_where"] = row_locations(path, len(table))
        tables.append(table)
    df = pd.concat(tables, ignore_index=True)
    key = [c for c in IDENTITY if c in df.columns]
    repeat = np.where(df.duplicated(key, keep="first"),
                      "duplicate of an earlier test row (test/vec.csv repeats ln, softmax and elem rows)", None)
    return _rows(df, None, "test", repeat)


def _rows(df: pd.DataFrame, path: Path | None, split: str, reject=None) -> pd.DataFrame:
    """Candidate rows of one table, whatever mix of ops it holds; `reject`: reasons known beforehand."""
    where = row_locations(path, len(df)) if path is not None else df["_where"].to_numpy()
    reject = np.full(len(df), None, dtype=object) if reject is None else np.asarray(reject, dtype=object)
    op = df["OPName"].astype(str).to_numpy()
    frames = []
    for name in sorted(set(op)):
        sel = op == name
        part = df[sel]
        common = dict(latency_ms=part["Latency"].to_numpy(), device_name=part["Device"].to_numpy(), dtype=DTYPE,
                      sweep_id=f"{DATASET}/{split}", where=where[sel], versions=_version_strings(part))
        if name == "linear":
            _require(part, ["B", "M", "N", "K"], path)
            fp32 = part["Kernel Name"].astype(str).str.contains(FP32_GEMM_KERNEL, regex=True).to_numpy()
            cols = dict(family="gemm", provider="torch.F.linear", m=part["B"] * part["M"], n=part["N"],
                        k=part["K"], reject=np.where(fp32, None, "kernel is not an FP32 SIMT GEMM (TF32?)"))
        else:
            _require(part, ["B", "H"], path)
            b, h = part["B"].to_numpy(), part["H"].to_numpy()
            if name == "ln":
                cols = dict(family="norm", provider="torch.layer_norm", tokens=b, hidden=h, op="layer",
                            fused_residual=False)
            elif name in ELEMENTWISE_OPS:
                cols = dict(family="elementwise", provider=f"torch.{name}", numel=b * h, op=name)
            else:
                cols = dict(family="elementwise", provider=f"torch.{name}", op=name,
                            reject=f"op {name!r} is not in the elementwise op table")
        cols["reject"] = first_reason(reject[sel], np.broadcast_to(np.asarray(cols.get("reject"), dtype=object),
                                                                   (int(sel.sum()),)))
        frames.append(candidates(int(sel.sum()), **{k: (v.to_numpy() if isinstance(v, pd.Series) else v)
                                                    for k, v in {**cols, **common}.items()}))
    return pd.concat(frames, ignore_index=True)


def _require(part: pd.DataFrame, columns, path) -> None:
    missing = [c for c in columns if c not in part.columns or part[c].isna().all()]
    if missing:
        where = path if path is not None else f"test rows of op {part['OPName'].iloc[0]!r}"
        raise KernelsightError(f"{where}: missing column(s) {', '.join(missing)}")


def _version_strings(part: pd.DataFrame) -> np.ndarray:
    torch = part["Torch Version"].astype(str).str.lstrip("p")
    return ("torch " + torch + ", CUDA " + part["CUDA Version"].astype(str)
            + ", cuDNN " + part["CUDNN Version"].astype(str)).to_numpy()


def _versions(cands: pd.DataFrame) -> dict:
    return {s: {"software": sorted(g["versions"].unique())} for s, g in cands.groupby("sweep_id", sort=True)}
