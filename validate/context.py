"""The validation report's context sections: protocol, composition model and error structure, as lines.

Each function turns one part of a scored validation (score.py) into the
Markdown lines report.markdown_report places under its heading.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernelsight.predictor.bundle import shared_bundle
from kernelsight.predictor.paths import data_dir
from kernelsight.predictor.transfer import die_siblings
from kernelsight.sim.engine_profile import EngineProfile, delay_label
from kernelsight.sim.vllm_allreduce import measured_allreduce

from . import composition as comp
from . import report as rep
from . import serving_error
from .allreduce import custom_allreduce_rows, fit_custom_allreduce
from .rows import DEPLOYMENTS, fused_sizes
from .run import ASYNC_DEFAULT_SINCE, FUSED_NORM_DEFAULT_SINCE, FUSED_NORM_MAX_MIB, RunSettings, Tier
from .score import TierScore, Validation, excluded


def portable(path) -> str:
    """A path for reports: relative to the package's data/ when inside it (the same on every machine)."""
    try:
        return "data/" + Path(path).resolve().relative_to(data_dir().resolve()).as_posix()
    except ValueError:
        return str(path)



def _limit(value: int | None) -> str:
    return str(value) if value is not None else "auto (vLLM's default for the row's GPU)"


def protocol_lines(settings: RunSettings, engine: EngineProfile, tiers, mappings, num_requests,
                    devices) -> list[str]:
    rounds = (f"{num_requests} requests per row (override)" if num_requests else
              f"each client sends {settings.warmup_rounds} warmup rounds (excluded) + {settings.rounds} measured "
              f"rounds (the benchmarks' 10 x concurrency requests); TTFT and TPOT are means over the measured "
              f"requests")
    start = ("clients started evenly over one round (the time one request takes with clients out of phase)"
             if settings.start == "staggered" else
             "every client's first request at t = 0 (a measured phase starting from an idle engine)")
    out = [f"closed loop at the row's concurrency, unique prompts; {rounds}; {start}",
           f"engine profile {engine.name}: max_num_batched_tokens "
           f"{_limit(engine.scheduler.max_num_batched_tokens)}, max_num_seqs {_limit(engine.scheduler.max_num_seqs)}, "
           f"CUDA graphs {engine.cuda_graph.mode}, async scheduling {engine.host.async_scheduling}, frontend {delay_label(engine.frontend.delay_ms(False))} "
           f"(latency + mean exponential jitter, counted in TTFT; "
           f"{delay_label(engine.frontend.delay_ms(True))} with async scheduling)",
           f"rows of vLLM {'.'.join(map(str, ASYNC_DEFAULT_SINCE))} or later (backend_version) run with async "
           f"scheduling, vLLM's default from that release on (vllm-project/vllm#27614); rows that do not state a "
           f"release run as the profile and their deployment say",
           f"rows of vLLM {'.'.join(map(str, FUSED_NORM_DEFAULT_SINCE))} or later at TP > 1 without PP or data "
           f"parallelism on CUDA {' / '.join(f'{m}.x' for m in FUSED_NORM_MAX_MIB)} GPUs fuse each all-reduce with "
           f"the residual add and RMSNorm after it (vLLM's -O2 fuse_allreduce_rms) up to vLLM 0.16's sizes: "
           + "; ".join(f"CUDA {m}.x {fused_sizes(sizes)}" for m, sizes in FUSED_NORM_MAX_MIB.items()),
           "throughput (measured and predicted alike) = concurrency x osl / (TTFT + (osl - 1) x TPOT)"]
    for tier, exclude in tiers:
        for device in devices if "{device}" in str(tier.bundle) else devices[:1]:
            on = tier.on(device)
            src = portable(on.bundle) if on.bundle else "the shipped bundle (data/artifacts/default)"
            gpus = f" for {device} rows" if on is not tier else ""
            out.append(f"tier {tier.name}{gpus}: predictor tier '{tier.predictor_tier}', η bundle {src}"
                       + (f" (fitted without {', '.join(excluded(exclude, device))})" if exclude else "")
                       + (sibling_note(on, [device] if on is not tier else devices)
                          if tier.predictor_tier == "cross" else ""))
    for m in mappings:
        notes = [f"{k} {v}" for k, v in (("weight dtype", m.weight_dtype), ("KV cache", m.kv_dtype)) if v]
        if m.range_ratio < 1:
            notes.append(f"lengths uniform in [floor(r L), L], r = {m.range_ratio:g}")
        if m.deployment != "engine":
            notes.append(DEPLOYMENTS[m.deployment])
        extra = ", ".join(notes)
        out.append(f"model {m.model_path} at {m.precision} -> conf/model/{m.model}.yaml"
                   + (f" ({extra})" if extra else ""))
    return out


def sibling_note(tier: Tier, devices) -> str:
    """Which die siblings' target models the cross tier prices each validated GPU with (predictor/transfer.py)."""
    bundle = shared_bundle(tier.bundle)
    measured = sorted({m["device"] for m in bundle.manifest["models"].values() if m["tier"] == "target"})
    notes = [f"{d} from {', '.join(sib)}" for d in devices if (sib := die_siblings(d, measured))]
    if not notes:
        return "; no die sibling in the bundle: cross-device models only"
    return (f"; kernels a die sibling's target model covers are priced from it ({'; '.join(notes)}), "
            f"the rest by the cross-device models")


def frontend_lines(v: Validation, picks: dict | None, tier: str) -> list[str]:
    """How the frontend delay was chosen (fit.frontend), and the picks: every row and each held-out model."""
    if not picks:
        return []
    modes = " and ".join({"sync": "synchronous", "async": "asynchronous"}[m] for m in v.frontend_modes)
    out = [f"Frontend delay (latency + mean exponential jitter) of {modes} rows chosen among "
           f"{', '.join(delay_label(c) for c in v.frontends)} (fit.frontend): the lowest median absolute TTFT "
           f"error of the {tier} tier's rows of that scheduling mode, rows queueing for KV capacity left out, on "
           f"every row (as simulated: in-sample) and on every model but one (held out: that model's rows run at "
           f"it; the other tiers keep these picks). A mode not chosen runs at the profile's delay. Shipped profile "
           f"(conf/engine): synchronous {delay_label(v.engine.frontend.delay_ms(False))}, asynchronous "
           f"{delay_label(v.engine.frontend.delay_ms(True))}.", "",
           "| chosen on | synchronous | asynchronous |", "|---|---|---|"]
    out += [f"| {'all rows' if key == 'all rows' else f'all but {key}'} | {v.pick_label(p['sync'], False)} | "
            f"{v.pick_label(p['async'], True)} |" for key, p in picks.items()]
    return out + [""]


def composition_lines(fits: dict, params, metrics, engine: EngineProfile, ar) -> list[str]:
    host = engine.host
    out = [f"Host terms fitted: {', '.join(params)} (least squares on log(predicted / measured) of "
           f"{', '.join(metrics)}; composition.py). Shipped values (conf/engine): "
           + ", ".join(f"{p} = {getattr(host, p):g}" for p in comp.TERMS) + ".", "",
           "| tier | fitted on | " + " | ".join(params) + " |", "|---|---|" + "---|" * len(params)]
    for tier, thetas in fits.items():
        for label, theta in thetas.items():
            on = "all rows" if label == "all rows" else f"all but {label}"
            out.append(f"| {tier} | {on} | " + " | ".join(f"{theta[p]:.1f}" for p in params) + " |")
    out += ["", f"Custom all-reduce (engine allreduce section): fitted on CUDA-graph vllm.custom_ar rows of "
            f"{', '.join(ar.train_devices)}: alpha = {ar.alpha_us} us, bus efficiency = {ar.bus_efficiency}; "
            f"shipped alpha = {engine.allreduce.custom_alpha_us} us, efficiency = "
            f"{engine.allreduce.custom_bus_efficiency}. Error per GPU and world size (held_out: not in the fit):", "",
            rep._md(ar.errors)]
    return out


def measured_allreduce_lines(engine: EngineProfile, tiers, devices) -> list[str]:
    """Whose measured vLLM all-reduce rows price each tier's all-reduces (engine allreduce.measured)."""
    if not engine.allreduce.measured:
        return ["", "Measured vLLM all-reduce (engine allreduce.measured): off."]
    sources = []
    for tier, _ in tiers:
        for device in devices:
            table = measured_allreduce(device, tier.predictor_tier)
            source = f"rows of {table.device}" if table else "none (custom kernel model and NCCL)"
            sources.append(f"{tier.name} tier on {device}: {source}")
    return ["", "Measured vLLM all-reduce (engine allreduce.measured; sim/vllm_allreduce.py): aiconfigurator's "
            "vllm.custom_ar rows time vLLM's own all-reduce (its dispatch: custom kernel, symmetric memory, "
            "NCCL) in CUDA graphs and price the message sizes they cover; " + "; ".join(sources) + "."]


def structure_lines(df: pd.DataFrame, warned: dict) -> list[str]:
    first = df[df["tier"] == df["tier"].iloc[0]]
    by_isl = first.groupby(["model_label", "isl"], sort=True).agg(
        rows=("line", "size"), ttft_signed=("err_ttft_heldout", "median"),
        tpot_signed=("err_tpot_heldout", "median"), thr_signed=("err_throughput_heldout", "median"),
        first_token_group=("first_token_group", "median")).reset_index()
    below = first[first["tpot"] < first["tpot_floor"]]
    queued = first[rep.queueing(first["ttft"], first["model_label"])]
    out = ["Median signed held-out errors (%) per model and prompt length (first tier); first_token_group: "
           "how many requests the simulated closed loop prefills in the same step (median over rows; 1 = "
           "staggered arrivals). TTFT follows it: a group shares one prefill step.", "", rep._md(by_isl), ""]
    out.append("Rows whose measured TPOT is below tpot_floor, the η = 1 kernel time of the closed loop's "
               "average step (all clients decoding plus their share of prefill; such a measurement cannot come "
               "from the simulated setup): "
               + (", ".join(f"line {r.line} ({r.model_label} tp{r.tp} c{r.concurrency}: {r.tpot:.1f} < "
                            f"{r.tpot_floor:.1f} ms)" for r in below.itertuples()) or "none") + ".")
    out.append(f"Rows with KV-capacity queueing (measured TTFT > {rep.QUEUEING_FACTOR} x the model's median): "
               + (", ".join(f"line {r.line} (measured {r.ttft:.0f} ms, predicted {r.ttft_heldout:.0f} ms)"
                            for r in queued.itertuples()) or "none") + ".")
    for tier, messages in warned.items():
        out += [f"Predictor warnings ({tier} tier): {m.replace(str(data_dir()), 'data')}" for m in messages]
    return out


def interval_lines(engine: EngineProfile, df: pd.DataFrame) -> list[str]:
    """Held-out coverage of the simulated 80 % ranges, and the serving error fitted on the first tier's rows
    beside the one the engine profile ships."""
    tier = df["tier"].iloc[0]
    fitted = serving_error.fit(df[df["tier"] == tier])
    kernels = ("kernels: every row simulated twice more, each kernel at the low and at the high end of its 80 % "
               "interval (the bundle's held-out residuals, calibrate/intervals.py; host terms as simulated; every "
               "kernel at the same end at once); " if "ttft_lo" in df else "")
    return ["Share of rows whose measured value fell inside each simulated 80 % range: " + kernels
            + "serving error: the held-out prediction times exp(p10) to exp(p90) of the log errors of the other "
            "models' rows of the tier (validate/serving_error.py: random-effects quantiles, the model as the unit; "
            "rows queueing for KV capacity left out); both: the wider of the two, as `simulate` prints it.", "",
            rep._md(serving_error.coverage(df)), "", "Per validation set:", "",
            rep._md(serving_error.coverage(df, by=("tier", "set"))), "",
            f"Serving error (p10 / p90 of log(measured / simulated)) fitted on every row of the {tier} tier: "
            f"{serving_error.describe(fitted)}; shipped (conf/engine serving_error): "
            f"{serving_error.describe(engine.serving_error)}."]


def report_context(v: Validation, df: pd.DataFrame, tiers, scores: list[TierScore], table: Path,
                   seconds: float) -> dict:
    """report.markdown_report's context of a scored validation (the custom all-reduce model refitted without
    the GPUs any tier leaves out)."""
    warned = {tier.name: s.warnings for (tier, _), s in zip(tiers, scores)}
    fits = {tier.name: s.fits for (tier, _), s in zip(tiers, scores)}
    ar = fit_custom_allreduce(custom_allreduce_rows(), exclude=sorted(
        {d for _, ex in tiers for device in v.devices if ex for d in excluded(ex, device)}))
    return {
        "csv": ", ".join(portable(c) for c in v.csvs), "rows": len(v.rows),
        "protocol": protocol_lines(v.settings, v.engine, tiers, v.mappings, v.num_requests, v.devices),
        "composition": frontend_lines(v, scores[0].frontend, tiers[0][0].name)
        + composition_lines(fits, v.params, v.metrics, v.engine, ar)
        + measured_allreduce_lines(v.engine, tiers, v.devices),
        "structure": structure_lines(df, warned),
        "intervals": interval_lines(v.engine, df),
        "run": [s.timing for s in scores] + [f"total {seconds:.0f} s; per-row table: {table}"],
        "refused": [why for _, why in v.refused],
    }
