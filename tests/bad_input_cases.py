"""The bad-input corpus that tests/test_bad_inputs.py runs through the CLI.

Each case is `kernelsight <command> <args>` (the command's BASE settings underneath) and the fragments its
one-line refusal must name. {name} in an argument is a fixture file the test builds in the run's working
directory (FIXTURES in tests/test_bad_inputs.py). Cases are grouped by command; each group crosses the command's
settings with bad values, unknown config choices and keys, missing, empty and corrupt input files and output
paths that cannot be written.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from kernelsight.predictor.paths import data_dir

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"  # conf/import.yaml's default src (../shared/data)
SWEEP_DIR = data_dir() / "sweeps" / "h100_sxm" / "quick-1"  # a small committed sweep (5 shards, gemm)

# Validation CSVs (validate csv=...) with one broken row, built by the test's fixtures.
VALIDATION_EDITS = {  # file -> (column, value) of its only row
    "v_isl.csv": ("isl", "-5"),
    "v_conc.csv": ("concurrency", "abc"),
    "v_system.csv": ("system", "h100_sxmm"),
    "v_model.csv": ("model_path", "Nobody/Nothing-7B"),
    "v_precision.csv": ("precision", "int3"),
}


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
# architectures, MLA dims and weight formats (conf/model files; HF config.json problems: tests/test_model.py)
case("simulate", "model=deepseek-v3 model.head_dim=192", "conf/model/deepseek-v3.yaml", "head_dim", "576")
case("simulate", "model=deepseek-v3 model.mla.qk_rope_head_dim=63", "conf/model/deepseek-v3.yaml", "qk_rope_head_dim")
case("simulate", "model=deepseek-v3 model.kv_heads=128", "conf/model/deepseek-v3.yaml", "kv_heads")
case("simulate", "model=deepseek-v3 model.mla=null", "conf/model/deepseek-v3.yaml", "'mla'")
case("simulate", "model=gpt-oss-120b model.weight_formats.attention=int3", "weight_formats.attention", "int3")
case("simulate", "model=gpt-oss-120b +model.weight_formats.mlp=bf16", "weight_formats.mlp")
case("simulate", "model=gpt-oss-120b model.weight_formats=mxfp4", "conf/model/gpt-oss-120b.yaml", "weight_formats")
case("simulate", "model=gpt-oss-120b model.sliding_layers=odd", "sliding_layers")
case("simulate", "model=llama3.1-8b model.weight_dtype=int3", "weight_dtype", "did you mean")
case("simulate", "model=llama3.1-8b model.qk_norm=true", "qk_norm")
case("simulate", "model=llama4-maverick model.moe.every=0", "moe.every")
case("simulate", "model=llama4-maverick model.intermediate=0", "conf/model/llama4-maverick.yaml", "intermediate")
case("simulate", "model=llama4-scout model.attention_chunk=-1", "attention_chunk")
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
