"""A corpus of bad inputs, each run through the CLI: exit code 2, one line on stderr, no traceback, nothing written.

Every case runs `kernelsight <command> ...` in process (cli.main) in an empty working directory that holds only
the fixture files the case names ({name} in its arguments: a text file named .parquet, a truncated Parquet file,
a foreign CSV, a plain file where a directory is expected, ...) plus one unrelated file. The directory is
snapshotted (every path and its bytes) before the run and must be identical after it: a refused run writes
nothing and changes nothing. The one line must name what was wrong (the setting or the file: `expect`).

Cases are grouped by command; each group crosses the command's settings with bad values (negative, zero where
invalid, a bool, a float, a word, null where required), unknown config choices and keys, missing, empty and
corrupt input files and output paths that cannot be written. Settings are checked before any work, so every
case is quick; a case that is not refused runs its command on a tiny input (the `BASE` settings) and fails.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelsight import cli
from kernelsight.predictor.paths import data_dir

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"  # conf/import.yaml's default src (../shared/data)
SWEEP_DIR = data_dir() / "sweeps" / "h100_sxm" / "quick-1"  # a small committed sweep (5 shards, gemm)
VALIDATION_CSV = data_dir() / "validation" / "vllm_dev.csv"


# ---------------------------------------------------------------------------------------------------------------
# Fixture files: {name} in a case's arguments is the absolute path of tmp_path/name, built on first use.

FIXTURES = {}


def fixture(*names):
    def register(build):
        for name in names:
            FIXTURES[name] = build
        return build
    return register


def _shard():
    import pyarrow.parquet as pq

    return pq.read_table(sorted(SWEEP_DIR.glob("*.parquet"))[0])


def _write_sweep(path: Path, edit) -> None:
    """A copy of a committed shard (its schema metadata kept), edited as pandas rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _shard()
    df = edit(table.to_pandas())
    schema = table.schema
    if list(df.columns) != schema.names:
        schema = pa.schema([schema.field(c) for c in df.columns], metadata=schema.metadata)
    pq.write_table(pa.Table.from_pandas(df, schema=schema, preserve_index=False), path)


def _set(df, row, column, value):
    df = df.copy()
    df[column] = df[column].astype(object)
    df.loc[row, column] = value
    return df


@fixture("afile")
def _afile(path):
    path.write_text("a plain file, where a directory is expected\n")


@fixture("foreign.csv")
def _foreign(path):
    path.write_text("name,score\nalice,1\nbob,2\n")  # someone's own table: results_table= must not touch it


@fixture("text.parquet")
def _text_parquet(path):
    path.write_text("this is a text file, not Parquet\n")


@fixture("empty.parquet")
def _empty(path):
    path.write_bytes(b"")


@fixture("trunc.parquet")
def _trunc(path):
    data = sorted(SWEEP_DIR.glob("*.parquet"))[0].read_bytes()
    path.write_bytes(data[: len(data) // 2])


@fixture("good.parquet")
def _good(path):
    _write_sweep(path, lambda df: df.head(6))


@fixture("zero_rows.parquet")
def _zero_rows(path):
    _write_sweep(path, lambda df: df.head(0))


@fixture("nocol.parquet")
def _nocol(path):
    _write_sweep(path, lambda df: df.head(6).drop(columns=["family"]))


@fixture("baddevice.parquet")
def _bad_device(path):
    _write_sweep(path, lambda df: _set(df.head(6), 3, "device", "h100_sxmm"))


@fixture("badfamily.parquet")
def _bad_family(path):
    _write_sweep(path, lambda df: _set(df.head(6), 3, "family", "gemmm"))


@fixture("emptydir", "sweepsdir", "servedir")
def _dir(path):
    path.mkdir()


@fixture("prev_run")
def _prev_run(path):
    path.mkdir()
    (path / "summary.json").write_text('{"previous": "run"}\n')


# Traces (workload=trace workload.trace_file=...): CSV and JSONL.
TRACE_HEADER = "arrival_time,input_len,output_len\n"
TRACES = {
    "t_empty.csv": "",
    "t_header.csv": TRACE_HEADER,
    "t_nocol.csv": "arrival_time,input_len\n0.0,100\n0.5,200\n",
    "t_neg.csv": TRACE_HEADER + "0.0,100,10\n0.5,-5,10\n1.0,100,10\n",
    "t_text.csv": TRACE_HEADER + "0.0,100,10\n0.5,abc,10\n1.0,100,10\n",
    "t_blank.csv": TRACE_HEADER + "0.0,100,10\n0.5,,10\n1.0,100,10\n",
    "t_zero_out.csv": TRACE_HEADER + "0.0,100,10\n0.5,100,0\n",
    "t_decreasing.csv": TRACE_HEADER + "0.0,100,10\n2.0,100,10\n1.0,100,10\n",
    "t_bad.jsonl": '{"arrival_time": 0.0, "input_len": 100, "output_len": 10}\n{"arrival_time": 0.5, oops\n',
    "t_trace.txt": TRACE_HEADER + "0.0,100,10\n",
}


@fixture(*TRACES)
def _trace(path):
    path.write_text(TRACES[path.name])


# Validation CSVs (validate csv=...): the first rows of the shipped development set, one of them broken.
def _validation_rows(n: int) -> tuple[list[str], list[dict]]:
    with open(VALIDATION_CSV, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), [row for _, row in zip(range(n), reader)]


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    out = io.StringIO()
    writer = csv.DictWriter(out, fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue())


VALIDATION_EDITS = {  # file -> (column, value) of its only row
    "v_isl.csv": ("isl", "-5"),
    "v_conc.csv": ("concurrency", "abc"),
    "v_system.csv": ("system", "h100_sxmm"),
    "v_model.csv": ("model_path", "Nobody/Nothing-7B"),
    "v_precision.csv": ("precision", "int3"),
}


@fixture("v.csv")
def _validation_good(path):
    fields, rows = _validation_rows(2)
    _write_csv(path, fields, rows)


@fixture(*VALIDATION_EDITS)
def _validation_bad(path):
    fields, rows = _validation_rows(1)
    column, value = VALIDATION_EDITS[path.name]
    rows[0][column] = value
    _write_csv(path, fields, rows)


@fixture("v_empty.csv")
def _validation_empty(path):
    path.write_bytes(b"")


@fixture("v_header.csv")
def _validation_header(path):
    _write_csv(path, _validation_rows(0)[0], [])


@fixture("v_nocol.csv")
def _validation_nocol(path):
    fields, rows = _validation_rows(1)
    _write_csv(path, [f for f in fields if f != "tpot_ms"], rows)


# Hugging Face config.json files (bench serve model.hf_config=...).
HF_EDITS = {"neg_layers_config.json": ("num_hidden_layers", -4), "zero_hidden_config.json": ("hidden_size", 0),
            "str_layers_config.json": ("num_hidden_layers", "thirty-two")}


@fixture(*HF_EDITS)
def _hf_config(path):
    raw = json.loads((REPO / "conf" / "model" / "hf" / "meta-llama--Meta-Llama-3.1-8B_config.json").read_text())
    key, value = HF_EDITS[path.name]
    raw[key] = value
    path.write_text(json.dumps(raw, indent=1))


@fixture("bad_json_config.json")
def _hf_bad_json(path):
    path.write_text('{"model_type": "llama", "num_hidden_layers": 32,\n')


# η bundles (predict bundle=...): a copy of the shipped one (hard links where the file system allows), tampered.
SHIPPED_BUNDLE = data_dir() / "artifacts" / "default"


def _link_tree(src: Path, dest: Path, replace: dict | None = None) -> None:
    """dest as a copy of src: hard links (copies across file systems); replace: relative path -> new bytes."""
    replace = replace or {}
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        target = dest / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif rel in replace:
            target.write_bytes(replace[rel])
        else:
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)


def _bundle_copy(path: Path, edit=None, recompute_id=False, replace=None, manifest_text=None) -> None:
    path.mkdir()
    _link_tree(SHIPPED_BUNDLE / "models", path / "models", replace)
    if manifest_text is not None:
        (path / "manifest.json").write_text(manifest_text)
        return
    manifest = json.loads((SHIPPED_BUNDLE / "manifest.json").read_text())
    if edit:
        edit(manifest)
    if recompute_id:
        from kernelsight.predictor.bundle import content_id

        manifest["content_id"] = content_id(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _h100_gemm_is_a100(manifest):
    """The reported fault: target/h100_sxm/gemm points at the A100 model files."""
    entry = manifest["models"]["target/h100_sxm/gemm"]
    entry["model"] = entry["model"].replace("h100_sxm", "a100_sxm")
    entry["card"] = entry["card"].replace("h100_sxm", "a100_sxm")


@fixture("bundle_swapped")
def _bundle_swapped(path):
    _bundle_copy(path, _h100_gemm_is_a100)


@fixture("bundle_swapped_id")
def _bundle_swapped_id(path):
    """The same, with the manifest's content_id recomputed, as a re-publish with a bug would leave it."""
    _bundle_copy(path, _h100_gemm_is_a100, recompute_id=True)


@fixture("bundle_badjson")
def _bundle_badjson(path):
    _bundle_copy(path, manifest_text='{"format": "kernelsight.eta-bundle", ')


@fixture("bundle_hash")
def _bundle_hash(path):
    """The h100_sxm gemm model file edited after publishing: its bytes no longer match the manifest's sha256."""
    manifest = json.loads((SHIPPED_BUNDLE / "manifest.json").read_text())
    rel = manifest["models"]["target/h100_sxm/gemm"]["model"].removeprefix("models/")
    _bundle_copy(path, replace={rel: (SHIPPED_BUNDLE / "models" / rel).read_bytes() + b"\n"})


class Paths:
    """{name} in an argument -> the absolute path of tmp_path/name, built by its fixture on first use (braces
    that name no fixture, such as a Hydra dict, are left alone)."""

    def __init__(self, root: Path):
        self.root = root
        self.built: dict[str, str] = {}

    def path(self, name: str) -> str:
        if name not in self.built:
            FIXTURES[name](self.root / name)
            self.built[name] = str(self.root / name)
        return self.built[name]

    def __call__(self, text: str) -> str:
        return re.sub(r"\{([^{}]+)\}", lambda m: self.path(m[1]) if m[1] in FIXTURES else m[0], text)


# ---------------------------------------------------------------------------------------------------------------
# The corpus.

# Settings added to every case of a command unless the case sets that key itself: a case that is wrongly
# accepted then runs on a tiny input (and fails on its own assertions) instead of for minutes.
SIM_BASE = "num_requests=20 plots=false"
VAL_BASE = ("csv={v.csv} rows=[1] tiers.cross=null protocol.num_requests=8 jobs=1 plots=false table=rows.csv "
            "report=report.md")
CAL_BASE = f"data.paths=[{SWEEP_DIR}] jobs=1 evaluation.plots=false out=cal"
PUB_BASE = f"data.paths=[{SWEEP_DIR}] jobs=1 publish.evaluate=false bundle=pub"
BENCH_BASE = "device=cpu sweep=cpu progress=false dry_run=true out={sweepsdir} sweep.collectives.ops=[]"
SERVE_BASE = ("device=cpu dtype=fp32 out={servedir} only=[closed_c8] warmup_requests=0 "
              "model_overrides.num_hidden_layers=2 model_overrides.hidden_size=64 "
              "model_overrides.intermediate_size=128 model_overrides.num_attention_heads=4 "
              "model_overrides.num_key_value_heads=2 model_overrides.head_dim=16 model_overrides.vocab_size=256 "
              "workloads.closed_c8.num_requests=4 workloads.closed_c8.isl=16 workloads.closed_c8.osl=4 "
              "engine.block_size=16 engine.num_blocks=64 engine.max_batch_tokens=64")
BASE = {"simulate": SIM_BASE, "validate": VAL_BASE, "calibrate": CAL_BASE, "calibrate publish": PUB_BASE,
        "bench": BENCH_BASE, "bench serve": SERVE_BASE, "bench report": "out=report"}
GEMM = "kernel.family=gemm kernel.m=64 kernel.n=4096 kernel.k=4096 kernel.dtype=bf16"
TRACE = "workload=trace workload.trace_file={trace}"

CASES: list = []
BAD_INTS = ("-1", "0", "true", "1.5", "abc", "null")  # bad values of a whole-number setting >= 1


def _key(arg: str) -> str:
    return arg.lstrip("+~").split("=", 1)[0]


def _merge(*parts: str) -> list[str]:
    """Overrides of all parts, a later part's key replacing an earlier one's."""
    merged: dict[str, str] = {}
    for part in parts:
        for arg in shlex.split(part):
            merged.pop(_key(arg), None)
            merged[_key(arg)] = arg
    return list(merged.values())


def case(command: str, args: str, *expect: str, base: str | None = None, slow: bool = False, name: str = ""):
    """One bad input: `kernelsight command args` (with the command's BASE underneath) must be refused in one
    line containing every `expect` fragment (a plain substring, or a regex after 're:')."""
    argv = [*command.split(), *_merge(BASE.get(command, "") if base is None else base, args)]
    marks = [pytest.mark.slow] if slow else []
    CASES.append(pytest.param(argv, expect, id=name or f"{command} {args}", marks=marks))


def ints(command: str, key: str, values=BAD_INTS, prefix: str = "", expect: str | None = None, **kw):
    for value in values:
        case(command, f"{prefix} {key}={value}".strip(), expect or key, **kw)


def sweep_inputs(command: str, key: str, extra: str = "", **kw):
    """A sweep-file setting given a missing, empty, corrupt or inconsistent file."""
    case(command, f"{key}=nothere.parquet {extra}", "nothere.parquet", **kw)
    case(command, f"{key}={{text.parquet}} {extra}", "text.parquet", **kw)
    case(command, f"{key}={{empty.parquet}} {extra}", "empty.parquet", **kw)
    case(command, f"{key}={{trunc.parquet}} {extra}", "trunc.parquet", **kw)
    case(command, f"{key}={{nocol.parquet}} {extra}", "nocol.parquet", "family", **kw)
    case(command, f"{key}={{zero_rows.parquet}} {extra}", "zero_rows.parquet", **kw)
    case(command, f"{key}={{baddevice.parquet}} {extra}", "baddevice.parquet", "h100_sxmm", "re:row|line", **kw)
    case(command, f"{key}={{badfamily.parquet}} {extra}", "badfamily.parquet", "gemmm", "re:row|line", **kw)
    case(command, f"{key}={{emptydir}} {extra}", "emptydir", **kw)


# --- the entry point ---
case("simulat", "", "did you mean", name="unknown command")
case("simulate", "output.parquet", "key=value", name="simulate positional")
case("roofline", "-m hardware=h100_sxm,h10O", "h10O", name="multirun typo")

# --- roofline ---
case("roofline", "hardware=h10O", "h10O", "did you mean")
ints("roofline", "decode.batch", ("-1", "true", "abc", "null"))
ints("roofline", "decode.kv_len", ("0",))
ints("roofline", "prefill.tokens", ("-1",))
ints("roofline", "prefill.cached", ("-1", "1.5"))
ints("roofline", "limit", ("-1",))
ints("roofline", "kernel.m", ("-1", "true"), prefix=GEMM, expect="re:(kernel|gemm)\\.m\\b")
case("roofline", f"{GEMM} kernel.family=gemmm", "gemmm", "did you mean")
case("roofline", f"{GEMM} kernel.dtype=bf17", "bf17")
case("roofline", "kernel.family=gemm kernel.dtype=bf16", "re:\\b[mnk]\\b")  # no shape
case("roofline", f"{GEMM} kernel.heads=32", "heads")  # not a gemm field
case("roofline", f"{GEMM} sweep_file={{good.parquet}}", "sweep_file")
case("roofline", "sweep_file={text.parquet}", "text.parquet")
case("roofline", "sweep_file={baddevice.parquet}", "baddevice.parquet", "h100_sxmm", "re:row|line")
case("roofline", f"{GEMM} out={{afile}}/table.csv", "afile")
case("roofline", f"{GEMM} out=table.txt", "table.txt")
case("roofline", "sweep_file={good.parquet} out={afile}/sub/eta.parquet", "afile")
case("roofline", "parallel.ep=3 parallel.tp=4", "ep")

# --- simulate ---
ints("simulate", "num_requests", ("-1", "0", "true", "1.5", "abc"))  # null: a whole trace
ints("simulate", "seed", ("-1", "true", "null"))
ints("simulate", "max_model_len", ("0",))
case("simulate", "max_model_len=300000 workload.input.value=200000 workload.output.value=4 num_requests=3",
     "max_model_len", name="simulate max_model_len above the model's 131072 positions")
ints("simulate", "trace_steps", ("-1",))
ints("simulate", "trace_kernel_steps", ("abc",))
case("simulate", "router=fastest", "router")
case("simulate", "predictor.tier=best", "tier")
case("simulate", "predictor.bundle=nothere", "nothere")
case("simulate", "slo.ttft_ms=-1", "ttft_ms")
case("simulate", "plots=maybe", "plots")
case("simulate", "workload.request_rate=0", "request_rate")
case("simulate", "workload.max_concurrency=1.5", "max_concurrency")
case("simulate", "workload.input.value=0", "input")
case("simulate", "workload.output.value=abc", "output")
case("simulate", "workload.arrival=posson", "arrival")
case("simulate", "workload.reqest_rate=1", "reqest_rate")
case("simulate", "workload=poison", "poison", "did you mean")
case("simulate", "hardware=h10O", "h10O", "did you mean", name="simulate hardware=h10O")
case("simulate", "engine.scheduler.max_num_seqs=0", "max_num_seqs")
case("simulate", "parallel.tp=0", "tp")
case("simulate", "parallel.tp=true", "tp")
case("simulate", "model.layers=-4", "layers")
case("simulate", "model.hidden=0", "hidden")
case("simulate", "model.layers=abc", "layers")
case("simulate", "model.kv_heads=3", "kv_heads")
case("simulate", "output_dir={afile}", "afile")
case("simulate", "output_dir={afile}/run", "afile")
case("simulate", "output_dir={prev_run}", "prev_run", "overwrite")
case("simulate", "results_table={foreign.csv}", "foreign.csv", name="simulate results_table=foreign csv")
case("simulate", "results_table={afile}/runs.csv", "afile")
case("simulate", "bogus=1", "bogus")
for _trace_file in ("t_empty.csv", "t_header.csv", "t_nocol.csv", "t_neg.csv", "t_text.csv", "t_blank.csv",
                    "t_zero_out.csv", "t_decreasing.csv", "t_bad.jsonl", "t_trace.txt"):
    case("simulate", TRACE.replace("{trace}", f"{{{_trace_file}}}"), _trace_file,
         name=f"simulate trace {_trace_file}")
case("simulate", TRACE.replace("{trace}", "nothere.csv"), "nothere.csv", name="simulate trace missing file")

# --- predict ---
case("predict", "kernel.m=true", "kernel.m", base="", name="predict kernel.m=true alone")
ints("predict", "kernel.m", ("-1", "abc"), prefix=GEMM, expect="re:(kernel|gemm)\\.m\\b")
case("predict", f"{GEMM} kernel.dtype=bf17", "bf17")
case("predict", f"{GEMM} kernel.family=gemmm", "gemmm", "did you mean")
case("predict", f"{GEMM} kernel.mm=1", "kernel.mm")
case("predict", f"{GEMM} tier=best", "tier")
ints("predict", "net_gbs_per_gpu", ("0",), prefix=GEMM)
case("predict", f"{GEMM} bundle=nothere", "nothere")
case("predict", f"{GEMM} bundle={{bundle_badjson}}", "bundle_badjson")
case("predict", f"{GEMM} bundle={{bundle_hash}}", "bundle_hash", "gemm")
case("predict", f"{GEMM} bundle={{bundle_swapped}}", "bundle_swapped",
     name="predict bundle: h100 gemm entry points at the a100 files")
case("predict", f"{GEMM} bundle={{bundle_swapped_id}}", "bundle_swapped_id", "h100_sxm",
     name="predict bundle: h100 gemm entry points at the a100 files, content_id recomputed")
case("predict", f"{GEMM} sweep_file={{good.parquet}}", "sweep_file")
sweep_inputs("predict", "sweep_file")
case("predict", "sweep_file={good.parquet} out={afile}/pred.parquet", "afile")
case("predict", "sweep_file={good.parquet} out=pred.txt", "pred.txt")
case("predict", "bogus=1", "bogus")

# --- validate ---
ints("validate", "jobs")
ints("validate", "seed", ("1.5",))
ints("validate", "rows", ("[0]", "abc", "[1.5]"))
ints("validate", "protocol.num_requests", ("0", "abc"))
case("validate", "protocol.rounds=0", "rounds")
case("validate", "protocol.start=soon", "start")
case("validate", "tiers.target.predictor_tier=best", "predictor_tier")
case("validate", "tiers.target.bundle=nothere", "nothere")
case("validate", "models=[{model_path:Qwen/Qwen3-32B,precision:bf16,model:nosuch}]", "nosuch")
case("validate", "csv=nothere.csv", "nothere.csv")
for _csv in ("v_empty.csv", "v_header.csv", "v_nocol.csv", *VALIDATION_EDITS):
    case("validate", f"csv={{{_csv}}} rows=null", _csv, name=f"validate csv {_csv}")
case("validate", "table={afile}/rows.csv", "afile")
case("validate", "table=rows.txt", "rows.txt")
case("validate", "report={afile}/report.md", "afile")
case("validate", "readme=nothere.md", "nothere.md")
case("validate", "serve.run=nothere engine=transformers_cb", "nothere")
case("validate", "bogus=1", "bogus")

# --- calibrate and calibrate publish ---
ints("calibrate", "learner.num_trees", ("-1", "true", "abc"))
case("calibrate", "learner.num_leaves=1", "num_leaves")
case("calibrate", "learner.learning_rate=0", "learning_rate")
case("calibrate", "learner.objective=l3", "objective")
case("calibrate", "learner.linear_tiers=[best]", "linear_tiers")
case("calibrate", "learner.num_treez=5", "num_treez")
case("calibrate", "jobs=0", "jobs")
case("calibrate", "seed=-1", "seed")
case("calibrate", "evaluation.folds=1", "folds")
case("calibrate", "evaluation.block_rows=0", "block_rows")
case("calibrate", "target=h100_smx", "h100_smx")
case("calibrate", "data.paths=[nothere.parquet]", "nothere.parquet")
case("calibrate", "data.paths=[{trunc.parquet}]", "trunc.parquet")
case("calibrate", "data.devices=[h100_smx]", "h100_smx")
case("calibrate", "data.families=[gemmm]", "gemmm")
case("calibrate", "out={afile}", "afile")
# The shipped configuration reads every committed sweep (~30 s) before it fits anything: settings are checked first.
case("calibrate", "target=h100_smx", "h100_smx", base="", name="calibrate target typo, all data")
case("calibrate", "learner.num_trees=-1", "num_trees", base="", name="calibrate num_trees=-1, all data")
case("calibrate publish", "bundle={afile}", "afile")
case("calibrate publish", "publish.created=yesterday", "created")
case("calibrate publish", "learner.num_trees=0", "num_trees")

# --- bench, bench serve, bench report: refused before torch is needed ---
case("bench", "seed=-1", "seed")
case("bench", "shard_rows=0", "shard_rows")
case("bench", "device=tpu", "tpu")
case("bench", "providers=[tritn]", "tritn")
case("bench", "sweep.timing.l2=warm", "l2")
case("bench", "sweep=quik", "quik", "did you mean")
case("bench", "estimate_on=h100_smx", "h100_smx")
case("bench", "resume=nothere", "nothere")
case("bench", "out={afile} dry_run=false", "afile")
case("bench serve", "dtype=bf17", "bf17")
case("bench serve", "device=tpu", "tpu")
case("bench serve", "timeout_s=-1", "timeout_s")
case("bench serve", "only=[bogus]", "bogus")
case("bench serve", "engine.block_size=0", "block_size")
case("bench serve", "workloads.closed_c8.num_requests=0", "num_requests")
case("bench serve", "out={afile}", "afile")
case("bench serve", "model.hf_config={neg_layers_config.json} model_overrides.num_hidden_layers=null",
     "neg_layers_config.json", "num_hidden_layers")
case("bench serve", "model.hf_config={zero_hidden_config.json} model_overrides.hidden_size=null",
     "zero_hidden_config.json", "hidden_size")
case("bench serve", "model.hf_config={str_layers_config.json} model_overrides.num_hidden_layers=null",
     "str_layers_config.json", "num_hidden_layers")
case("bench serve", "model.hf_config={bad_json_config.json}", "bad_json_config.json")
case("bench report", "", "sweep_file", name="bench report without a sweep")
case("bench report", "sweep_file={text.parquet}", "text.parquet")
case("bench report", "sweep_file={good.parquet} hardware=h10O", "h10O", "did you mean")
case("bench report", "sweep_file={good.parquet} out={afile}", "afile")

# --- import and data ---
case("import", "dataset=vidurr", "vidurr", "did you mean")
case("import", "dataset=vidur src=nothere", "nothere")
case("import", "dataset=vidur src={emptydir}", "emptydir")
case("import", f"dataset=neusight src={SHARED_DATA / 'neusight'} out={{afile}}/public", "afile",
     name="import out under a file")
for _file in ("nothere.parquet", "{trunc.parquet}", "{emptydir}"):
    case("data", f"path={_file}", _file.strip("{}"))


# ---------------------------------------------------------------------------------------------------------------
# The checks.

def snapshot(root: Path) -> dict:
    """Every path under root (hidden ones too) -> its kind and content hash; links are not followed."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def changes(before: dict, after: dict) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return "; ".join(f"{what}: {', '.join(paths[:8])}" for what, paths in
                     (("written", added), ("removed", removed), ("changed", changed)) if paths)


def check_refused(code, err: str, expect) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit code {code!r}, not 2; stderr:\n{err[-3000:]}"
    assert "Traceback" not in err, f"a traceback:\n{err[-3000:]}"
    assert len(lines) == 1 and err.count("\n") <= 1, f"{len(lines)} lines on stderr, not one:\n{err[-3000:]}"
    for fragment in expect:
        if fragment.startswith("re:"):
            assert re.search(fragment[3:], lines[0]), f"{fragment[3:]!r} not matched by: {lines[0]}"
        else:
            assert fragment in lines[0], f"{fragment!r} not in: {lines[0]}"


def run_cli(argv: list[str], capsys) -> tuple[object, str]:
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    capsys.readouterr()
    try:
        cli.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    except Exception as e:  # escaped the CLI: a crash, not a refusal
        code = f"{type(e).__name__} raised: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        GlobalHydra.instance().clear()
    return code, capsys.readouterr().err


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory with one unrelated file, the cache inside it (so cache writes show)."""
    root = tmp_path / "work"
    root.mkdir()
    (root / "notes.txt").write_text("an unrelated file that must stay as it is\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("KERNELSIGHT_CACHE", str(root / ".cache" / "kernelsight"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))  # matplotlib's font cache stays outside
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return root


def test_the_corpus_is_large_and_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) >= 150
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})


@pytest.mark.parametrize("argv,expect", CASES)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(argv, expect, workdir, capsys):
    if any(str(SHARED_DATA) in a for a in argv) and not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} (the public reference data) is not here")
    paths = Paths(workdir)
    argv = [paths(a) for a in argv]
    before = snapshot(workdir)
    code, err = run_cli(argv, capsys)
    after = snapshot(workdir)
    check_refused(code, err, expect)
    assert before == after, f"a refused run changed the working directory: {changes(before, after)}"


# ---------------------------------------------------------------------------------------------------------------
# A full disk: writes fail with EFBIG under a file-size limit (Python ignores SIGXFSZ). One line, nothing
# half-written, the directory as it was.

FULL_DISK = textwrap.dedent("""
    import resource, sys
    from kernelsight import cli
    import pandas, pyarrow.parquet  # imported before the limit: nothing of theirs is written later
    import kernelsight.cli.{module}
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    cli.main(sys.argv[1:])
""")


@pytest.mark.parametrize("module,argv,limit", [
    ("simulate", ["simulate", "num_requests=200", "plots=false", "output_dir=run"], 16384),
    ("simulate", ["simulate", "num_requests=20", "results_table=runs.csv"], 200),
    ("predict", ["predict", "sweep_file={good.parquet}", "out=pred.parquet"], 4096),
    ("roofline", ["roofline", "sweep_file={good.parquet}", "out=eta.csv"], 512),
], ids=["simulate output_dir", "simulate results_table", "predict out parquet", "roofline out csv"])
def test_a_full_disk_is_one_line_and_nothing_half_written(module, argv, limit, workdir):
    paths = Paths(workdir)
    argv = [paths(a) for a in argv]
    before = snapshot(workdir)
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    done = subprocess.run([sys.executable, "-c", FULL_DISK.format(module=module, limit=limit), *argv],
                          capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    after = snapshot(workdir)
    check_refused(done.returncode, done.stderr, ["re:(?i)disk|size|space|EFBIG|too large|cannot write"])
    assert before == after, f"a failed write left files behind: {changes(before, after)}"
