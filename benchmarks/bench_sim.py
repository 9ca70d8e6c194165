"""Simulator speed and memory: `python benchmarks/bench_sim.py` prints the figures.

1. Speed: 10,000 ShareGPT-like requests (conf/workload/sharegpt.yaml) on Llama-3.1-8B / H100 SXM
   (vllm_v1 engine, one GPU) at 90% of the engine's capacity, where batches are large and
   queues build up: simulated requests per wall-second and wall time (target <= 5 s on one
   core), from a fresh pricer (its memo tables are built during the run, as in a real run).
   Capacity is measured first: the request rate served when the same requests arrive at once.
   The process's CPU time and the machine's load average are printed too: on a shared
   machine wall time includes waiting for a core.
2. Memory: peak RSS of a 1,000,000-request run vs a 100,000-request run, each in a fresh
   process (short requests, 256 prompt / 16 output tokens, at 90% of capacity, so the long
   run stays minutes): the simulator streams requests and metrics, so the two must match.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings

from hydra import compose, initialize_config_dir

from kernelsight.predictor.paths import conf_dir
from kernelsight.cli.config import container, typed_configs
from kernelsight.sim.run import build_setup, run
from kernelsight.sim.workload import WorkloadConfig

SPEED_REQUESTS = 10_000
MEMORY_REQUESTS = (100_000, 1_000_000)
SHORT = ["workload=poisson", "workload.input.value=256", "workload.output.value=16"]


def setup_for(overrides: list[str]):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="simulate", overrides=overrides)
    model, hw, engine, parallel = typed_configs(cfg)
    predictor = container(cfg.predictor)
    return build_setup(model, hw, engine, parallel, WorkloadConfig.from_config(container(cfg.workload)),
                       tier=predictor["tier"], bundle=predictor["bundle"], max_model_len=cfg.max_model_len)


def capacity(overrides: list[str], n: int) -> float:
    """Requests/s the engine completes when n requests arrive at once (its saturation throughput)."""
    result = run(setup_for([*overrides, "workload.request_rate=inf"]), n, seed=1, breakdown=False)
    return result.summary["request_throughput"]


def timed_run(overrides: list[str], n: int) -> dict:
    setup = setup_for(overrides)
    cpu = time.process_time()
    summary = run(setup, n, seed=0).summary
    summary["cpu_s"] = time.process_time() - cpu
    return summary


def child(n: int, rate: float) -> None:
    """One memory run in this process; prints JSON with the peak RSS."""
    summary = timed_run([*SHORT, f"workload.request_rate={rate}"], n)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(json.dumps({"requests": n, "peak_rss_mib": rss_mib, "wall_s": summary["wall_s"],
                      "completed": summary["completed"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-memory", action="store_true", help="only the speed benchmark")
    parser.add_argument("--child", nargs=2, type=float, metavar=("N", "RATE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*are plain roofline")   # η = 1 where no model: irrelevant to speed
    if args.child:
        child(int(args.child[0]), args.child[1])
        return

    cap = capacity(["workload=sharegpt"], 2000)
    rate = round(0.9 * cap, 2)
    summary = timed_run(["workload=sharegpt", f"workload.request_rate={rate}"], SPEED_REQUESTS)
    wall = summary["wall_s"]
    print(f"speed: {SPEED_REQUESTS} ShareGPT-like requests, Llama-3.1-8B on H100 SXM, vllm_v1, "
          f"{rate} req/s (90% of the {cap:.1f} req/s capacity)")
    print(f"  wall time {wall:.2f} s = {SPEED_REQUESTS / wall:,.0f} simulated requests per wall-second "
          f"({summary['num_steps']:,} engine steps, {summary['num_steps'] / wall:,.0f} steps/s; target <= 5 s)")
    print(f"  CPU time {summary['cpu_s']:.2f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  simulated: {summary['duration_s']:.0f} s, {summary['output_throughput']:.0f} output tok/s, "
          f"median TTFT {summary['median_ttft_ms']:.1f} ms, median TPOT {summary['median_tpot_ms']:.2f} ms, "
          f"mean {summary['mean_requests_in_system']:.0f} requests in the system")
    if args.skip_memory:
        return

    short_rate = round(0.9 * capacity(SHORT, 5000), 1)
    rows = []
    for n in MEMORY_REQUESTS:
        out = subprocess.run([sys.executable, __file__, "--child", str(n), str(short_rate)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"memory: 256/16-token requests at {short_rate} req/s, each run in a fresh process")
    for r in rows:
        print(f"  {r['requests']:>9,} requests: peak RSS {r['peak_rss_mib']:.0f} MiB, wall {r['wall_s']:.1f} s "
              f"({r['requests'] / r['wall_s']:,.0f} requests/s)")
    print(f"  RSS ratio 1M / 100k: {rows[1]['peak_rss_mib'] / rows[0]['peak_rss_mib']:.2f}")


if __name__ == "__main__":
    main()
