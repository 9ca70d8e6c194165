"""Batched η prediction throughput on ONE core: kernels per second through Predictor.predict; and how long
`kernelsight predict` of one kernel takes, start to exit.

Predict takes each family's columns (the path the simulator uses, no frame built).

The batch is what a serving simulation prices: projection GEMMs (m = tokens,
n/k from common model widths), decode attention, norms and all-reduces, each family as one batched call, as the simulator makes them.
The command is run --runs times as its own process (python calling kernelsight.cli.main, as the console
script does, without a launcher shim's start-up) and its median wall time printed (target <= 0.5 s).
Run: python benchmarks/bench_predict.py [--kernels 200000] [--gpu h100_sxm] [--tier auto] [--runs 5]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy/LightGBM load: one core, honestly
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

import argparse  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from kernelsight.predictor.predict import Predictor  # noqa: E402

WIDTHS = np.array([1024, 2048, 4096, 5120, 6144, 8192, 14336, 28672])


def batch(n: int, seed: int = 0) -> dict:
    """family -> columns of n/4 kernels each (gemm, attn_decode, norm, allreduce)."""
    rng = np.random.default_rng(seed)
    q = n // 4

    def pick(values, k=q):
        return rng.choice(values, k)

    tokens = rng.integers(1, 8192, q)
    return {
        "gemm": {"m": tokens, "n": pick(WIDTHS), "k": pick(WIDTHS),
                 "dtype": pick(np.array(["bf16", "fp8"], dtype=object))},
        "attn_decode": {"batch": rng.integers(1, 256, q), "seq_kv": rng.integers(16, 32768, q),
                        "heads": np.full(q, 32), "kv_heads": pick(np.array([8, 32])), "head_dim": np.full(q, 128),
                        "block_size": np.full(q, 16), "window": np.zeros(q, dtype=int),
                        "dtype": np.full(q, "bf16", dtype=object), "kv_dtype": np.full(q, "bf16", dtype=object)},
        "norm": {"tokens": tokens, "hidden": pick(WIDTHS[:6]), "op": np.full(q, "rms", dtype=object),
                 "fused_residual": rng.integers(0, 2, q).astype(bool), "dtype": np.full(q, "bf16", dtype=object)},
        "allreduce": {"msg_bytes": tokens * 8192, "world_size": pick(np.array([2, 4, 8])),
                      "link": np.full(q, "nvlink", dtype=object), "dtype": np.full(q, "bf16", dtype=object)},
    }


def command_seconds(gpu: str, tier: str, runs: int) -> tuple[float, float]:
    """Median wall and CPU time of `kernelsight predict` pricing one GEMM, each run its own process, start to
    exit (on a shared machine the wall time includes waiting for a core, the CPU time does not)."""
    cmd = [sys.executable, "-c", "import sys; from kernelsight import cli; cli.main(sys.argv[1:])", "predict",
           f"hardware={gpu}", f"tier={tier}", "kernel.family=gemm", "kernel.m=4096", "kernel.n=4096", "kernel.k=4096"]
    times, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(times), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=200_000)
    ap.add_argument("--gpu", default="h100_sxm")
    ap.add_argument("--tier", default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5, help="runs of the one-kernel command")
    args = ap.parse_args()
    predictor = Predictor(args.gpu, tier=args.tier)
    work = batch(args.kernels)
    for family, cols in work.items():  # warm-up: parse the models once
        predictor.predict({k: v[:10] for k, v in cols.items()}, family=family)
    best = {}
    for _ in range(args.repeat):
        for family, cols in work.items():
            t = time.perf_counter()
            predictor.predict(cols, family=family)
            best[family] = min(best.get(family, np.inf), time.perf_counter() - t)
    total = sum(len(next(iter(c.values()))) for c in work.values())
    for family, cols in work.items():
        n = len(next(iter(cols.values())))
        models = sorted(set(predictor.predict({k: v[:1] for k, v in cols.items()}, family=family)["model"]))
        print(f"{family:12s} {n:8d} kernels  {n / best[family]:12,.0f} kernels/s  ({', '.join(models)})")
    seconds = sum(best.values())
    print(f"{'all':12s} {total:8d} kernels  {total / seconds:12,.0f} kernels/s on one core "
          f"({args.gpu}, tier {args.tier})")
    wall, cpu = command_seconds(args.gpu, args.tier, args.runs)
    print(f"`kernelsight predict` of one GEMM: {wall:.2f} s start to exit, CPU {cpu:.2f} s "
          f"(median of {args.runs} processes; target <= 0.5 s)")


if __name__ == "__main__":
    main()
