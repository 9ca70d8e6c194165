"""End-to-end ground truth: reading a validation CSV and mapping each row to a simulator setup.

A validation CSV has one row per measured serving configuration (the columns of
data/validation/vllm_dev.csv, aiconfigurator's silicon_sample.csv):

  required  model_path, precision, system, isl, osl, concurrency, tp_size, ttft_ms, tpot_ms
  optional  id, pp_size (1), attention_dp_size (1), gemm_quant_mode, backend, backend_version, ...

`backend_version` (e.g. 0.18.0) decides the engine defaults a row ran with (vLLM scheduled
asynchronously by default from 0.14.0 on and fused the all-reduce with the RMSNorm from 0.16.0 on:
validate/run.py release_engine).

Every required value is checked; a bad row raises ONE KernelsightError line naming
the file, the row (1-based data row, as a spreadsheet shows it after the header)
and the column.

Model mapping (`model_for`): an explicit table from conf/validate.yaml
(`models:` entries of model_path, precision -> conf/model name plus optional
dtype overrides), then any shipped conf/model whose hf_repo is the model_path
and whose weight dtype is the precision. `precision` is the dtype the engine
ran the linear layers in; `kv_dtype` in a mapping entry states the KV-cache
dtype when it differs from the model file (online `--quantization fp8` of a
bf16 checkpoint keeps vLLM's default KV dtype, the model's bf16).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from kernelsight.predictor.dtypes import canonical_dtype
from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.hardware import resolve_device
from kernelsight.predictor.paths import data_dir
from kernelsight.sim.model import ModelConfig, list_models, load_model
from kernelsight.sim.parallel import FP8_BLOCK, ParallelConfig

REQUIRED = ("model_path", "precision", "system", "isl", "osl", "concurrency", "tp_size", "ttft_ms", "tpot_ms")
INTEGER_COLUMNS = ("isl", "osl", "concurrency", "tp_size")
# Concurrency bands of the report: [low, high) client counts.
BANDS = ((1, 16, "c<16"), (16, 64, "16<=c<64"), (64, 10**9, "c>=64"))


def default_csv() -> Path:
    return data_dir() / "validation" / "vllm_dev.csv"


def default_csvs() -> list[Path]:
    """The validation sets `kernelsight validate` scores by default: the dense and the mixture-of-experts runs."""
    return [default_csv(), data_dir() / "validation" / "vllm_moe_dev.csv"]


def throughput(concurrency, osl, ttft_ms, tpot_ms):
    """Output tokens/s of a closed loop at fixed lengths: concurrency * osl / (ttft + (osl - 1) * tpot).

    Each of `concurrency` clients completes a request of osl tokens every ttft + (osl - 1) * tpot;
    the same formula turns measured and predicted (ttft, tpot) into throughput.
    """
    return concurrency * osl / ((ttft_ms + (osl - 1) * tpot_ms) * 1e-3)


def concurrency_band(concurrency: int) -> str:
    return next(label for low, high, label in BANDS if low <= concurrency < high)


@dataclass(frozen=True)
class ValidationRow:
    """One measured configuration, checked; `line` is its 1-based data row in the file."""

    row_id: str
    line: int
    model_path: str
    precision: str
    device: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    pp: int
    ttft_ms: float
    tpot_ms: float
    range_ratio: float = 1.0  # the benchmark's lengths: uniform in [floor(r * L), L] for L = isl, osl (1: fixed)
    deployment: str = "engine"  # how the engine was configured (DEPLOYMENTS)
    attention_dp: int = 1  # attention data-parallel ranks (attention_dp_size)
    moe_tp: int = 1  # each expert's tensor-parallel width (moe_tp_size)
    moe_ep: int = 1  # expert-parallel ranks (moe_ep_size)
    set: str = ""  # the validation set (CSV file stem) the row comes from
    backend_version: tuple = ()  # the engine release measured, e.g. (0, 18, 0); () when the CSV does not say
    backend: str = ""  # the serving engine measured (lower case), e.g. vllm; '' when the CSV does not say

    @property
    def key(self) -> str:
        """Unique over the sets of one validation: set and line."""
        return f"{self.set}-row{self.line}" if self.set else f"row{self.line}"

    @property
    def where(self) -> str:
        return f"{self.set}.csv row {self.line}" if self.set else f"row {self.line}"

    @property
    def throughput(self) -> float:
        return throughput(self.concurrency, self.osl, self.ttft_ms, self.tpot_ms)

    @property
    def band(self) -> str:
        return concurrency_band(self.concurrency)


def read_rows(path: str | Path) -> list[ValidationRow]:
    """Checked rows of a validation CSV; any problem is one line with file, row and column."""
    path = Path(path)
    if not path.is_file():
        raise KernelsightError(f"{path}: no such validation CSV")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise KernelsightError(f"{path}: not a readable CSV: {str(exc).splitlines()[0]}") from None
    except pd.errors.EmptyDataError:
        raise KernelsightError(f"{path}: empty file (expected a header and rows)") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise KernelsightError(f"{path}: missing column {missing[0]!r}{did_you_mean(missing[0], df.columns)}; "
                               f"required: {', '.join(REQUIRED)}")
    if df.empty:
        raise KernelsightError(f"{path}: no data rows")
    return [replace(_row(path, i + 1, rec), set=path.stem) for i, rec in enumerate(df.to_dict("records"))]


def _row(path: Path, line: int, rec: dict) -> ValidationRow:
    where = f"{path}: row {line}"

    def text(col: str) -> str:
        value = str(rec.get(col, "")).strip()
        if not value:
            raise KernelsightError(f"{where}: column {col!r} is empty")
        return value

    def number(col: str, integer: bool, default=None, unused=None) -> float:
        """The column's value; empty (or `unused`, a source's way of writing 'not used') gives `default`."""
        raw = str(rec.get(col, "")).strip()
        if unused is not None and raw and _is_number(raw) and float(raw) == unused:
            raw = ""
        if not raw and default is not None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise KernelsightError(f"{where}: column {col!r} = {raw!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise KernelsightError(f"{where}: column {col!r} = {raw!r} must be a positive number")
        if integer and value != int(value):
            raise KernelsightError(f"{where}: column {col!r} = {raw!r} must be a whole number")
        return int(value) if integer else value

    try:
        precision = canonical_dtype(text("precision"))
    except (KernelsightError, ValueError, KeyError):
        raise KernelsightError(f"{where}: column 'precision' = {rec['precision']!r} is not a known dtype "
                               f"(bf16, fp16, fp8)") from None
    try:
        device = resolve_device(text("system"))
    except KernelsightError as exc:
        raise KernelsightError(f"{where}: column 'system': {exc}") from None
    values = {c: number(c, True) for c in INTEGER_COLUMNS}
    pp = number("pp_size", True, default=1)
    row_id = str(rec.get("id", "")).strip() or f"row{line}"
    version = str(rec.get("backend_version", "")).strip()
    release = re.fullmatch(r"(\d+(?:\.\d+)*)(?:[.+-]?[A-Za-z0-9.+-]*)?", version) if version else None
    if version and release is None:
        raise KernelsightError(f"{where}: column 'backend_version' = {version!r} is not a release like 0.18.0")
    return ValidationRow(backend=str(rec.get("backend", "")).strip().lower(),
                         backend_version=tuple(int(x) for x in release.group(1).split(".")) if release else (),
                         row_id=row_id, line=line, model_path=text("model_path"), precision=precision,
                         device=device, isl=values["isl"], osl=values["osl"], concurrency=values["concurrency"],
                         tp=values["tp_size"], pp=pp, ttft_ms=number("ttft_ms", False),
                         tpot_ms=number("tpot_ms", False), attention_dp=number("attention_dp_size", True, default=1),
                         moe_tp=number("moe_tp_size", True, default=1, unused=0),
                         moe_ep=number("moe_ep_size", True, default=1, unused=0))


# -- model and layout ----------------------------------------------------------------------

# aiconfigurator's generator rule for an aggregated vLLM benchmark (src/aiconfigurator/generator/rule_plugin/
# benchmark/vllm.rule): max_num_tokens = max_batch_size + isl + this margin as --max-num-batched-tokens,
# max_batch_size as --max-num-seqs and as the largest CUDA-graph size; the rows' batch size is their concurrency
# (the source's batch_size column).
AICONFIGURATOR_BUDGET_MARGIN = 1500
# InferenceMAX's vLLM recipes (benchmarks/70b_fp8_h100_docker.sh): --max-num-batched-tokens 8192.
INFERENCEMAX_BUDGET = 8192
# vLLM 0.10's _FI_MAX_SIZES (compilation/collective_fusion.py): largest fused all-reduce + RMSNorm, MiB.
INFERENCEMAX_FUSED_NORM_MIB = {"tp2": 1.0, "tp4": 1.0, "tp6": 0.5, "tp8": 0.5}


def fused_sizes(sizes: dict) -> str:
    """'1 MiB at TP 2, ...' of a fuse_rms_norm_max_mib mapping, for reports."""
    return ", ".join(f"{mib:g} MiB at TP {tp[2:]}" for tp, mib in sizes.items())

# How a row's engine was configured beyond the engine profile (run.deployment_engine applies it; the
# report prints the description).
DEPLOYMENTS = {
    "engine": "the engine profile as it is",
    "aiconfigurator": f"aiconfigurator's generated deployment: max_num_batched_tokens = concurrency + isl + "
                      f"{AICONFIGURATOR_BUDGET_MARGIN}, max_num_seqs = concurrency, CUDA graphs for batch sizes "
                      f"1..concurrency",
    "inferencemax": f"SemiAnalysis InferenceMAX's vLLM recipe: max_num_batched_tokens = {INFERENCEMAX_BUDGET}, "
                    f"max_num_seqs = concurrency, async scheduling, all-reduce fused with the residual add and "
                    f"RMSNorm (enable_fi_allreduce_fusion; messages up to vLLM 0.10's limits: "
                    f"{fused_sizes(INFERENCEMAX_FUSED_NORM_MIB)})",
}


@dataclass(frozen=True)
class ModelMapping:
    """One conf/validate.yaml `models:` entry: (model_path, precision) -> model config and dtype overrides."""

    model_path: str
    precision: str
    model: str
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    range_ratio: float = 1.0
    deployment: str = "engine"

    @classmethod
    def from_mapping(cls, raw: dict, where: str) -> "ModelMapping":
        known = {"model_path", "precision", "model", "weight_dtype", "kv_dtype", "range_ratio", "deployment"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise KernelsightError(f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], known)}; "
                                   f"known: {', '.join(sorted(known))}")
        for key in ("model_path", "precision", "model"):
            if not raw.get(key):
                raise KernelsightError(f"{where}: missing {key!r}")
        if raw["model"] not in list_models():
            raise KernelsightError(f"{where}: model {raw['model']!r} is not in conf/model"
                                   f"{did_you_mean(raw['model'], list_models())}")
        ratio = raw.get("range_ratio", 1.0)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise KernelsightError(f"{where}: range_ratio={ratio!r}: must be a number in (0, 1] (1: fixed lengths)")
        deployment = raw.get("deployment", "engine")
        if deployment not in DEPLOYMENTS:
            raise KernelsightError(f"{where}: deployment={deployment!r}: choose one of {', '.join(DEPLOYMENTS)}")
        dtypes = {k: canonical_dtype(raw[k]) for k in ("precision", "weight_dtype", "kv_dtype") if raw.get(k)}
        return cls(model_path=raw["model_path"], precision=dtypes["precision"], model=raw["model"],
                   weight_dtype=dtypes.get("weight_dtype"), kv_dtype=dtypes.get("kv_dtype"),
                   range_ratio=float(ratio), deployment=deployment)


def parse_mappings(entries) -> list[ModelMapping]:
    return [ModelMapping.from_mapping(dict(e), f"validate.models[{i}]") for i, e in enumerate(entries or ())]


def mapping_for(row: ValidationRow, mappings: list[ModelMapping]) -> ModelMapping | None:
    """The first `models:` entry of the row's (model_path, precision), if any."""
    return next((m for m in mappings if m.model_path == row.model_path and m.precision == row.precision), None)


def with_protocol(row: ValidationRow, mappings: list[ModelMapping]) -> ValidationRow:
    """The row with its benchmark's length range ratio and its deployment from its mapping entry (fixed
    lengths and the engine profile as it is without one)."""
    m = mapping_for(row, mappings)
    return replace(row, range_ratio=m.range_ratio, deployment=m.deployment) if m else row


def model_for(row: ValidationRow, mappings: list[ModelMapping], where: str = "") -> ModelConfig:
    """The ModelConfig a row runs: the first matching mapping entry, else a shipped model of that
    hf_repo whose weight dtype is the row's precision."""
    m = mapping_for(row, mappings)
    if m is not None:
        model = load_model(m.model)
        changes = {k: v for k, v in (("weight_dtype", m.weight_dtype), ("kv_dtype", m.kv_dtype)) if v}
        if changes:
            tag = "-".join(f"{'w' if k == 'weight_dtype' else 'kv'}{v}" for k, v in changes.items())
            model = ModelConfig(**{**model.as_dict(), **changes, "name": f"{model.name}[{tag}]",
                                   "moe": model.moe}, source=model.source)
        return model
    for name in list_models():
        model = load_model(name)
        if model.hf_repo == row.model_path and model.weight_dtype == row.precision:
            return model
    raise KernelsightError(f"{where or f'row {row.line}'}: no model config for model_path {row.model_path!r} at "
                           f"precision {row.precision}; add an entry to validate.models "
                           f"(model_path, precision, model = a conf/model name)")


def parallel_for(row: ValidationRow, model: ModelConfig) -> ParallelConfig:
    """vLLM's layout of the row (the CSV convention of data/validation/README.md): tp_size x attention_dp_size
    GPUs for attention, pp_size stages, one replica; a MoE model's experts over the same GPUs, moe_ep_size
    ranks of moe_tp_size each (a dense model's moe columns mean nothing). Experts that do not cover exactly
    the attention GPUs, or attention data parallelism on a dense model, are refused, never simulated as
    another layout."""
    ep = 1
    if model.moe is None:
        if row.attention_dp != 1:
            raise KernelsightError(f"attention_dp_size={row.attention_dp}: data-parallel attention needs a "
                                   f"mixture-of-experts model (a dense model's data parallelism is replicas)")
    else:
        group = row.tp * row.attention_dp
        if row.moe_tp * row.moe_ep not in (1, group):
            raise KernelsightError(f"moe_tp_size={row.moe_tp} x moe_ep_size={row.moe_ep}: the experts must span "
                                   f"the tp_size x attention_dp_size = {group} GPUs of the attention layers")
        ep = row.moe_ep
        width = model.moe.intermediate // (group // ep)
        if model.weight_format("experts") == "fp8_block" and width % FP8_BLOCK:
            # vLLM's Fp8MoEMethod refuses block-FP8 experts cut below their 128-wide blocks ("The output_size of
            # gate's and up's weight = 192 is not divisible by weight quantization block_n = 128"): a row of such
            # a layout can only have run with --enable-expert-parallel, whole experts over the group's GPUs.
            ep = group
    name = (f"tp{row.tp}" + (f"_adp{row.attention_dp}" if row.attention_dp > 1 else "")
            + (f"_ep{ep}" if ep > 1 else "") + (f"_pp{row.pp}" if row.pp > 1 else ""))
    return ParallelConfig(name=name, tp=row.tp, pp=row.pp, ep=ep, attention_dp=row.attention_dp)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
