"""`kernelsight validate [CSV]`: the simulator against real serving runs, in both η tiers.

conf/validate.yaml (`kernelsight validate --help`). The run:

1. reads and checks the CSV (rows.py), maps each row to a model config and a
   TP layout;
2. per tier (target: the shipped η bundle, with H100 kernel data; cross-device:
   a bundle fitted through `calibrate publish` with every H100 row removed,
   built once and cached under data/artifacts/), simulates every row as a
   closed loop (run.py; rows in parallel processes) and keeps its step log;
3. scores the host terms of the engine profile (composition.py): the shipped
   values as simulated (fitted on every row: in-sample) and refitted
   leave-one-model-out (held-out), exactly, from the step logs;
4. writes the Markdown report, parity plots and the per-row table, and
   optionally rewrites the README's accuracy block.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from kernelsight.predictor.errors import KernelsightError, whole_number
from kernelsight.predictor.paths import conf_dir, data_dir
from kernelsight.sim.engine_profile import EngineProfile
from kernelsight.sim.schema import plain
from kernelsight.sim.vllm_allreduce import measured_allreduce

from . import composition as comp
from . import report as rep
from .allreduce import custom_allreduce_rows, fit_custom_allreduce
from .rows import DEPLOYMENTS, default_csv, model_for, parse_mappings, read_rows, throughput, with_protocol
from .run import START_MODES, RunSettings, Tier, first_token_group, simulate_rows


def portable(path) -> str:
    """A path for reports: relative to the package's data/ when inside it (the same on every machine)."""
    try:
        return "data/" + Path(path).resolve().relative_to(data_dir().resolve()).as_posix()
    except ValueError:
        return str(path)


def resolve_bundle(value) -> str | None:
    """None (the shipped default), a bundle directory, or a name under data/artifacts/."""
    if value is None:
        return None
    path = Path(str(value)).expanduser()
    if path.exists() or "/" in str(value):
        return str(path)
    return str(data_dir() / "artifacts" / str(value))


def ensure_cross_bundle(path: str, exclude: list[str], seed: int) -> str:
    """The cross-device bundle: `calibrate publish` on every calibration GPU except `exclude`, built
    once (minutes) and cached at `path`; rebuilt when the cached one is stale (other data, calibration
    settings, features or code version than it was fitted with)."""
    import pyarrow.parquet as pq

    from kernelsight.calibrate import rows as calibration_rows
    from kernelsight.calibrate.bundle import data_label, package_version
    from kernelsight.calibrate.commands import build_settings, calibrate_publish
    from kernelsight.predictor.bundle import sha256_file

    files = calibration_rows.input_files(None)
    devices = sorted({d for f in files for d in pq.read_table(f, columns=["device"]).column(0).to_pylist()}
                     - set(exclude))
    if not devices:
        raise KernelsightError(f"no calibration GPUs left after excluding {', '.join(exclude)}")
    cfg = OmegaConf.merge(*(OmegaConf.load(conf_dir() / name) for name in ("calibrate.yaml", "calibrate_publish.yaml")))
    for key in ("defaults", "hydra"):
        cfg.pop(key, None)
    cfg.bundle, cfg.seed = path, seed
    cfg.data.devices = devices
    cfg.publish.evaluate = False
    cfg.publish.created = "2000-01-01T00:00:00Z"  # pinned: the bundle depends on its inputs only
    expected = {**build_settings(cfg), "code_version": package_version(),
                "training_data": {data_label(f): sha256_file(f) for f in files}}
    stale = _stale(Path(path) / "manifest.json", expected)
    if stale == "":
        return path
    print(f"kernelsight validate: building the cross-device η bundle without {', '.join(exclude)} at {path} "
          f"({stale}; several minutes)", file=sys.stderr)
    calibrate_publish(cfg)
    return path


def _stale(manifest_path: Path, expected: dict) -> str:
    """Why a cached bundle must be (re)built ('' when it is current)."""
    if not manifest_path.is_file():
        return "not built yet"
    from kernelsight.predictor.features import feature_names

    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        found = {**{k: manifest.get(k) for k in ("rules", "learner", "code_version")},
                 "training_data": {d["file"]: d["sha256"] for d in manifest.get("training_data", ())}}
        fitted = {(tier, family): names for tier, families in (manifest.get("features") or {}).items()
                  for family, names in families.items()}
        features_changed = any(names != feature_names(family, tier) for (tier, family), names in fitted.items())
    except (ValueError, TypeError, KeyError, AttributeError):
        return "its manifest is unreadable: rebuilding"
    changed = [k for k in expected if found.get(k) != expected[k]] + (["features"] if features_changed else [])
    return f"{' and '.join(changed)} changed since it was built: rebuilding" if changed else ""


def _tiers(cfg) -> list[tuple[Tier, list]]:
    out = []
    for name, spec in plain(cfg.tiers).items():
        if spec is None:
            continue
        unknown = set(spec) - {"predictor_tier", "bundle", "exclude_devices"}
        if unknown:
            raise KernelsightError(f"tiers.{name}: unknown key {sorted(unknown)[0]!r}; known: predictor_tier, "
                                   f"bundle, exclude_devices")
        bundle = resolve_bundle(spec.get("bundle"))
        exclude = list(spec.get("exclude_devices") or ())
        if exclude:
            if bundle is None:
                raise KernelsightError(f"tiers.{name}: exclude_devices needs a bundle path to build and cache")
            bundle = ensure_cross_bundle(bundle, exclude, int(cfg.seed))
        out.append((Tier(name, str(spec.get("predictor_tier", "auto")), bundle), exclude))
    if not out:
        raise KernelsightError("tiers: nothing to validate (every tier is null)")
    return out


def _settings(cfg, engine: dict) -> RunSettings:
    p = plain(cfg.protocol)
    for key, low in (("warmup_rounds", 0), ("rounds", 1)):
        whole_number(p.get(key), f"protocol.{key}", low)
    if p.get("start") not in START_MODES:
        raise KernelsightError(f"protocol.start={p.get('start')!r}: choose one of {', '.join(START_MODES)}")
    return RunSettings(p["warmup_rounds"], p["rounds"], int(cfg.seed), engine, p["start"])


def _tpot_floor(rows, models, engine: EngineProfile) -> list[float]:
    """η = 1 kernel time (ms) of the closed loop's average step: n clients decoding at the mean KV length
    isl + osl / 2 (n = concurrency, or as many as the KV cache holds at that length) plus the
    n x isl / osl prompt tokens prefilled per output token. No overhead, perfect kernels: a measured
    TPOT below it cannot come from the simulated setup."""
    import warnings

    from kernelsight.predictor.hardware import load_hardware
    from kernelsight.predictor.predict import Predictor
    from kernelsight.sim.batch import StepBatch
    from kernelsight.sim.memory import memory_plan
    from kernelsight.sim.pricing import StepPricer

    from .rows import parallel_for

    pricers, out = {}, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row, model in zip(rows, models):
            key = (row.device, row.tp, row.pp, model)
            if key not in pricers:
                hw, par = load_hardware(row.device), parallel_for(row)
                pricers[key] = (StepPricer(model, hw, engine, par, Predictor(hw, tier="roofline")),
                                memory_plan(model, hw, engine, par).kv_tokens)
            pricer, kv_tokens = pricers[key]
            context = row.isl + row.osl // 2
            n = max(1, min(row.concurrency, kv_tokens // context))
            batch = StepBatch(prefill_new=(-(-n * row.isl // row.osl),), prefill_ctx=(0,), decode_ctx=(context,) * n)
            out.append(sum(k.total_s for k in pricer.kernels(batch)) * 1e3)
    return out


def validate(cfg) -> pd.DataFrame:
    """Entry point of `kernelsight validate` (returns the per-row table)."""
    if cfg.serve.run:  # our own bench serve runs instead of a validation CSV
        from .serve import validate_serve_command

        return validate_serve_command(cfg)
    start = time.perf_counter()
    processes = whole_number(cfg.jobs, "jobs", hint="worker processes")
    csv = Path(cfg.csv) if cfg.csv else default_csv()
    rows = read_rows(csv)
    if cfg.rows:
        wanted = {int(x) for x in cfg.rows}
        missing = sorted(wanted - {r.line for r in rows})
        if missing:
            raise KernelsightError(f"rows: {csv} has no data row {missing[0]} (it has {len(rows)})")
        rows = [r for r in rows if r.line in wanted]
    mappings = parse_mappings(plain(cfg.models))
    models = [model_for(r, mappings, f"{csv}: row {r.line}") for r in rows]
    rows = [with_protocol(r, mappings) for r in rows]
    engine_map = plain(cfg.engine)
    engine = EngineProfile.from_mapping(engine_map, "engine config")
    settings = _settings(cfg, engine_map)
    fit_cfg = plain(cfg.fit)
    params, metrics = list(fit_cfg["params"]), list(fit_cfg["metrics"])
    groups = [r.model_path for r in rows]
    num_requests = cfg.protocol.get("num_requests")
    measured = np.asarray([[r.ttft_ms, r.tpot_ms] for r in rows])

    tiers = _tiers(cfg)
    frames, timing, warned, fits = [], [], {}, {}
    for tier, _ in tiers:
        t0 = time.perf_counter()
        jobs = [(r, m, tier, settings, num_requests) for r, m in zip(rows, models)]
        logs = simulate_rows(jobs, processes)
        wall = time.perf_counter() - t0
        steps = sum(len(log.gpu_s) for log in logs)
        loop_s = sum(log.wall_s for log in logs)
        timing.append(f"tier {tier.name}: {len(rows)} rows, {steps:,} engine steps simulated in {wall:.0f} s wall "
                      f"({loop_s:.0f} s in the event loops, {steps / max(loop_s, 1e-9):,.0f} steps/s per process, "
                      f"{processes} processes)")
        warned[tier.name] = sorted({w for log in logs for w in log.warnings})
        masks = [comp.measured_requests(log, r.concurrency, settings.warmup_rounds) for r, log in zip(rows, logs)]
        lins = [comp.linearize(log, engine.host, mask) for log, mask in zip(logs, masks)]
        simulated = comp.predict(lins, {})
        heldout, thetas = (comp.leave_one_group_out(lins, measured, groups, params, metrics)
                           if len(set(groups)) > 1 else (np.full_like(simulated, np.nan), {}))
        fits[tier.name] = {"all rows": comp.fit(lins, measured, params, metrics), **thetas}
        exposed = [r.line for r, lin in zip(rows, lins)
                   if not all(lin.hidden(theta) for theta in ({}, *fits[tier.name].values()))]
        if exposed:  # an asynchronous row scored as it ran although a fitted host term outlasts a GPU step
            warned[tier.name].append(f"rows {', '.join(map(str, exposed))}: async scheduling, but the fitted host "
                                     f"terms outlast some steps' GPU time; scored as if hidden")
        frame = pd.DataFrame({
            "tier": tier.name, "line": [r.line for r in rows], "row_id": [r.row_id for r in rows],
            "model_path": [r.model_path for r in rows], "precision": [r.precision for r in rows],
            "model": [m.name for m in models], "model_label": [f"{r.model_path.split('/')[-1]} {r.precision}"
                                                             for r in rows],
            "tp": [r.tp for r in rows], "concurrency": [r.concurrency for r in rows],
            "band": [r.band for r in rows], "isl": [r.isl for r in rows], "osl": [r.osl for r in rows],
            "ttft": measured[:, 0], "tpot": measured[:, 1],
            "throughput": [r.throughput for r in rows],
            "ttft_simulated": simulated[:, 0], "tpot_simulated": simulated[:, 1],
            "ttft_heldout": heldout[:, 0], "tpot_heldout": heldout[:, 1],
            "requests": [len(log.request_id) for log in logs],
            "measured_requests": [int(mask.sum()) for mask in masks],
            "first_token_group": [first_token_group(log, mask) for log, mask in zip(logs, masks)],
            "steps": [len(log.gpu_s) for log in logs], "kv_blocks": [log.kv_blocks for log in logs],
            "preemptions": [log.summary.get("preemptions", 0) for log in logs],
            "wall_s": [log.wall_s for log in logs]})
        for kind in rep.KINDS:
            frame[f"throughput_{kind}"] = throughput(frame["concurrency"], frame["osl"], frame[f"ttft_{kind}"],
                                                     frame[f"tpot_{kind}"])
        frames.append(frame)
    df = rep.add_errors(pd.concat(frames, ignore_index=True))
    df["tpot_floor"] = np.tile(_tpot_floor(rows, models, engine), len(tiers))
    head = rep.headline(df)

    report_path = Path(cfg.report)
    plots = {}
    if cfg.plots:
        for tier, _ in tiers:
            path = report_path.with_name(f"{report_path.stem}_parity_{tier.name}.png")
            rep.parity_plot(df, tier.name, "heldout", path)
            plots[tier.name] = path.name
    table = rep.write_table(df, cfg.table)
    ar = fit_custom_allreduce(custom_allreduce_rows(), exclude=sorted({d for _, ex in tiers for d in ex}))
    context = {
        "csv": portable(csv), "rows": len(rows),
        "protocol": _protocol_lines(settings, engine, tiers, mappings, num_requests, sorted({r.device for r in rows})),
        "composition": _composition_lines(fits, params, metrics, engine, ar)
        + _measured_allreduce_lines(engine, tiers, sorted({r.device for r in rows})),
        "structure": _structure_lines(df, warned),
        "run": timing + [f"total {time.perf_counter() - start:.0f} s; per-row table: {table}"],
    }
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(rep.markdown_report(df, head, context, plots), encoding="utf-8")
    print(rep._md(head.assign(kind=head["kind"].map(rep.KINDS)).rename(columns=rep.METRIC_NAMES)))
    for tier_name, messages in warned.items():
        for message in messages:  # one line per family the bundle does not cover
            print(f"kernelsight validate: warning ({tier_name} tier): {message}", file=sys.stderr)
    print(f"report: {report_path}  table: {table}  ({time.perf_counter() - start:.0f} s)")
    if cfg.readme:
        changed = rep.rewrite_readme(cfg.readme, rep.readme_block(head))
        print(f"{cfg.readme}: accuracy block {'rewritten' if changed else 'unchanged'}")
    return df


def _protocol_lines(settings: RunSettings, engine: EngineProfile, tiers, mappings, num_requests,
                    devices) -> list[str]:
    rounds = (f"{num_requests} requests per row (override)" if num_requests else
              f"each client sends {settings.warmup_rounds} warmup rounds (excluded) + {settings.rounds} measured "
              f"rounds (the benchmarks' 10 x concurrency requests); TTFT and TPOT are means over the measured "
              f"requests")
    start = ("clients started evenly over one round (the time one request takes with clients out of phase)"
             if settings.start == "staggered" else
             "every client's first request at t = 0 (a measured phase starting from an idle engine)")
    out = [f"closed loop at the row's concurrency, unique prompts; {rounds}; {start}",
           f"engine profile {engine.name}: max_num_batched_tokens {engine.scheduler.max_num_batched_tokens}, "
           f"max_num_seqs {engine.scheduler.max_num_seqs}, CUDA graphs {engine.cuda_graph.mode}, async scheduling "
           f"{engine.host.async_scheduling}, frontend {engine.frontend.latency_ms:g} ms + exponential jitter of mean "
           f"{engine.frontend.jitter_ms:g} ms (counted in TTFT)",
           "throughput (measured and predicted alike) = concurrency x osl / (TTFT + (osl - 1) x TPOT)"]
    for tier, exclude in tiers:
        src = portable(tier.bundle) if tier.bundle else "the shipped bundle (data/artifacts/default)"
        out.append(f"tier {tier.name}: predictor tier '{tier.predictor_tier}', η bundle {src}"
                   + (f" (fitted without {', '.join(exclude)})" if exclude else "")
                   + (_sibling_note(tier, devices) if tier.predictor_tier == "cross" else ""))
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


def _sibling_note(tier: Tier, devices) -> str:
    """Which die siblings' target models the cross tier prices each validated GPU with (predictor/transfer.py)."""
    from kernelsight.predictor.bundle import shared_bundle
    from kernelsight.predictor.transfer import die_siblings

    bundle = shared_bundle(tier.bundle)
    measured = sorted({m["device"] for m in bundle.manifest["models"].values() if m["tier"] == "target"})
    notes = [f"{d} from {', '.join(sib)}" for d in devices if (sib := die_siblings(d, measured))]
    if not notes:
        return "; no die sibling in the bundle: cross-device models only"
    return (f"; kernels a die sibling's target model covers are priced from it ({'; '.join(notes)}), "
            f"the rest by the cross-device models")


def _composition_lines(fits: dict, params, metrics, engine: EngineProfile, ar) -> list[str]:
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


def _measured_allreduce_lines(engine: EngineProfile, tiers, devices) -> list[str]:
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


def _structure_lines(df: pd.DataFrame, warned: dict) -> list[str]:
    first = df[df["tier"] == df["tier"].iloc[0]]
    by_isl = first.groupby(["model_label", "isl"], sort=True).agg(
        rows=("line", "size"), ttft_signed=("err_ttft_heldout", "median"),
        tpot_signed=("err_tpot_heldout", "median"), thr_signed=("err_throughput_heldout", "median"),
        first_token_group=("first_token_group", "median")).reset_index()
    below = first[first["tpot"] < first["tpot_floor"]]
    queued = first[first["ttft"] > 10 * first.groupby("model_label")["ttft"].transform("median")]
    out = ["Median signed held-out errors (%) per model and prompt length (first tier); first_token_group: "
           "how many requests the simulated closed loop prefills in the same step (median over rows; 1 = "
           "staggered arrivals). TTFT follows it: a group shares one prefill step.", "", rep._md(by_isl), ""]
    out.append(f"Rows whose measured TPOT is below tpot_floor, the η = 1 kernel time of the closed loop's "
               f"average step (all clients decoding plus their share of prefill; such a measurement cannot come "
               f"from the simulated setup): "
               + (", ".join(f"line {r.line} ({r.model_label} tp{r.tp} c{r.concurrency}: {r.tpot:.1f} < "
                            f"{r.tpot_floor:.1f} ms)" for r in below.itertuples()) or "none") + ".")
    out.append("Rows with KV-capacity queueing (measured TTFT > 10 x the model's median): "
               + (", ".join(f"line {r.line} (measured {r.ttft:.0f} ms, predicted {r.ttft_heldout:.0f} ms)"
                            for r in queued.itertuples()) or "none") + ".")
    for tier, messages in warned.items():
        out += [f"Predictor warnings ({tier} tier): {m.replace(str(data_dir()), 'data')}" for m in messages]
    return out
