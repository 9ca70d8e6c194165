"""kernelsight: how fast is an LLM served on a GPU you may not own? The Python API.

    import kernelsight
    result = kernelsight.simulate(model="llama3.1-8b", hardware="h100_sxm", num_requests=200)
    result.metrics["ttft_ms"]["p50"], result.requests, result.breakdown
    kernelsight.Predictor("h100_sxm").predict(shapes)      # kernel shapes -> latency_us, tier, model, flags

The `kernelsight` command runs the same functions. This package's attributes load on first use (module
__getattr__), so `import kernelsight` and `import kernelsight.predictor` import neither the simulator nor
Hydra, plotting or torch. (The source folder is api/, installed as the package `kernelsight`, so that
nothing named kernelsight/ in a checkout shadows the installed package.)
"""
from __future__ import annotations

# name -> "module:attribute", imported when first asked for
_LAZY = {
    "Predictor": "kernelsight.predictor.predict:Predictor",
    "KernelsightError": "kernelsight.predictor.errors:KernelsightError",
    "SimulationResult": "kernelsight.sim.run:SimulationResult",
}

__all__ = ["simulate", *_LAZY]


def __getattr__(name: str):
    if name == "__version__":
        from importlib.metadata import version

        return version("kernelsight")
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'kernelsight' has no attribute {name!r}")
    from importlib import import_module

    module, attr = target.split(":")
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def simulate(model="llama3.1-8b", hardware="h100_sxm", workload="poisson", engine="vllm_v1", parallel="default",
             *, num_requests: int | None = 1000, seed: int = 0, keep_requests: bool = True, progress=None,
             **overrides):
    """Simulate a serving workload, composed as `kernelsight simulate` composes it, without Hydra.

    model, hardware, workload, engine, parallel: each a name of a file in conf/<group>/ (as on the command
    line; hardware also takes a GPU alias such as "H100 SXM5 80GB"), a path to a .yaml file (model also a
    Hugging Face config.json), a mapping holding the whole group config as such a file would, or an
    already-typed config (ModelConfig, Hardware, WorkloadConfig, EngineProfile, ParallelConfig).
    num_requests: requests to simulate (None: a whole trace); seed: seeds every random stream.

    overrides: every other setting, under its command-line key. Dotted keys reach inside a group or section:
        kernelsight.simulate(num_requests=500, router="round_robin",
                             **{"workload.request_rate": 20, "slo.ttft_ms": 200, "predictor.tier": "cross"})
    is `kernelsight simulate num_requests=500 router=round_robin workload.request_rate=20 slo.ttft_ms=200
    predictor.tier=cross`. A mapping value merges into a section key by key (slo={"ttft_ms": 200}).
    output_dir="DIR" also writes the run's files there as the command does (requests.parquet, steps.parquet,
    trace.json, breakdown.csv, summary.json last), filled only if the run completes; a non-empty one is
    replaced only with overwrite=True.

    keep_requests: keep the per-request table for result.requests (memory grows with num_requests).
    progress: None (no bar), or a tqdm-like factory such as tqdm.auto.tqdm for a bar over finished requests.

    Returns a SimulationResult: .metrics (metrics["ttft_ms"]["p50"], metrics["tpot_ms"]["mean"], throughputs),
    .requests (one row per request), .breakdown (GPU time per kernel family), .summary (the dict the command
    prints and writes to summary.json). Bad names and settings raise KernelsightError, one line with a
    did-you-mean where a name is close.
    """
    from pathlib import Path

    from kernelsight.predictor.errors import KernelsightError
    from kernelsight.predictor.outputs import run_directory
    from kernelsight.sim.compose import COMMAND_ONLY, compose, run_config
    from kernelsight.sim.report import write_run_outputs

    for key in overrides:
        if key in COMMAND_ONLY:
            raise KernelsightError(f"{key}: a setting of the `kernelsight simulate` command (printing, plots, "
                                   f"result tables); not used by kernelsight.simulate")
    groups = {"model": model, "hardware": hardware, "workload": workload, "engine": engine, "parallel": parallel}
    cfg, sources = compose(groups, {"num_requests": num_requests, "seed": seed, **overrides})
    if not cfg.get("output_dir"):
        return run_config(cfg, sources, keep_requests=keep_requests, progress=progress)
    overwrite = cfg.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise KernelsightError(f"overwrite={overwrite!r}: must be True or False")
    with run_directory(Path(cfg["output_dir"]), "kernelsight.simulate", overwrite) as staging:
        result = run_config(cfg, sources, out_dir=staging, keep_requests=keep_requests, progress=progress)
        write_run_outputs(result, staging)
    result.out_dir = Path(cfg["output_dir"])  # where the finished run now lies (requests read back from it)
    return result
