"""Energy of a simulated run: kernel joules from the pricer's breakdown, idle power for the rest of the time.

Per engine step the pricer gives joules per kernel family on one GPU (each kernel: the power model's
watts at its roofline shares and predicted time, times that time; sim/pricing.py) and the launch
waiting at idle power. An engine replica (one attention group) runs its step's kernels on tp GPUs per
pipeline stage, pp stages (the pricer's step sums the stages), so the step's energy on the replica's GPUs
is tp x those joules. Every GPU draws the idle power whenever it runs no kernel: host gaps, waits for
requests, pipeline bubbles. Over the benchmark (first arrival to last finish):

    energy = tp x sum over steps (kernel joules + idle W x launch waiting)
             + idle W x (GPUs x duration - tp x sum over steps of the step's GPU time)

Mean power per GPU is energy / (GPUs x duration); peak power per GPU is the highest mean power over one
step's GPU time (kernels and launch waiting).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from kernelsight.predictor.energy import KernelPower, load_energy_model, shared_energy_model

ENERGY_KEYS = ("energy_j", "energy_per_output_token_j", "energy_per_request_j", "mean_power_w_per_gpu",
               "peak_power_w_per_gpu", "energy_gpus")
FAMILY_PREFIX = "energy_j_"   # + family: joules of that family's kernels on every GPU; + "idle": the rest


def kernel_power(hw, energy=None) -> KernelPower | None:
    """The power model on this GPU: energy None is the shipped model, a path another one, False none.
    A GPU without a TDP in the catalog gets none, with a warning (its energy is not priced)."""
    if energy is False:
        return None
    model = shared_energy_model() if energy is None else load_energy_model(energy)
    if not hw.tdp_w:
        warnings.warn(f"{hw.key} has no TDP in the hardware catalog: energy is not priced", stacklevel=3)
        return None
    return model.bind(hw)


class EnergyAccumulator:
    """Joules per family on one GPU summed over steps ('launch': launch waiting at idle power), the steps'
    GPU seconds, and the highest power of one step."""

    def __init__(self):
        self.family: dict[str, float] = {}
        self.gpu_s = 0.0
        self.peak_w = 0.0

    def add(self, parts: dict) -> None:
        """One step's breakdown (pricer.breakdown with a power model)."""
        acc, total = self.family, 0.0
        for name, joules in parts["energy"].items():
            acc[name] = acc.get(name, 0.0) + joules
            total += joules
        gpu = parts["gpu_s"]
        self.gpu_s += gpu
        if gpu > 0 and total / gpu > self.peak_w:
            self.peak_w = total / gpu

    def add_runs(self, runs: list) -> None:
        """The first `steps` steps of each decode run of `runs` [(pricing.DecodeRun with its energy parts,
        steps)], as add() adds each step."""
        add_run_parts(self.family, runs, "energy_families", (("attention_j", runs[0][0].attention_family),
                                                             ("launch_j", "launch")))
        gpu = run_steps(runs, "gpu_s")
        self.gpu_s += float(gpu.sum())
        busy = gpu > 0
        count = np.count_nonzero(busy)
        if count:
            fixed = np.repeat([sum(j for _, j in prices.energy_families) for prices, _ in runs],
                              [steps for _, steps in runs])
            joules = fixed + run_steps(runs, "attention_j") + run_steps(runs, "launch_j")
            if count < len(gpu):   # only steps that take GPU time have a power
                joules, gpu = joules[busy], gpu[busy]
            self.peak_w = max(self.peak_w, float((joules / gpu).max()))


def run_steps(runs: list, field: str) -> np.ndarray:
    """The per-step values `field` of pricing.DecodeRun prices, each run's first `steps`, end to end."""
    return np.concatenate([getattr(prices, field)[:steps] for prices, steps in runs])


def add_run_parts(acc: dict, runs: list, fixed: str, varying) -> None:
    """Add decode runs [(prices, steps)] to the per-family sums `acc`: the (family, value) rows of `fixed` (one
    tuple per batch size, shared by its runs) times their runs' steps; each (field, family) of `varying` as one
    sum of its per-step values, the family listed only where it took any (as a step's breakdown lists it)."""
    steps_of: dict = {}
    for prices, steps in runs:
        rows = getattr(prices, fixed)
        steps_of[rows] = steps_of.get(rows, 0) + steps
    for rows, steps in steps_of.items():
        for name, value in rows:
            acc[name] = acc.get(name, 0.0) + value * steps
    for field, name in varying:
        values = run_steps(runs, field)
        if np.count_nonzero(values):
            acc[name] = acc.get(name, 0.0) + float(values.sum())


def energy_summary(acc: EnergyAccumulator | None, power: KernelPower | None, summary: dict, parallel,
                   replicas: int) -> dict:
    """The summary's energy fields (module docstring); NaN when the run priced no energy (no power model or
    no breakdown) or lasted no time."""
    nan = float("nan")
    duration = summary.get("duration_s", 0.0)
    gpus = replicas * parallel.tp * parallel.pp
    if acc is None or power is None or not duration > 0:
        return {**{k: nan for k in ENERGY_KEYS}, "energy_gpus": gpus}
    tp = parallel.tp
    kernels = {f: tp * j for f, j in sorted(acc.family.items(), key=lambda kv: -kv[1]) if f != "launch"}
    idle = tp * acc.family.get("launch", 0.0) + power.idle_w * max(gpus * duration - tp * acc.gpu_s, 0.0)
    total = sum(kernels.values()) + idle
    out = {"energy_j": total,
           "energy_per_output_token_j": total / summary["total_output_tokens"] if summary.get("total_output_tokens")
           else nan,
           "energy_per_request_j": total / summary["completed"] if summary.get("completed") else nan,
           "mean_power_w_per_gpu": total / (gpus * duration),
           "peak_power_w_per_gpu": max(acc.peak_w, power.idle_w),
           "energy_gpus": gpus}
    out.update({f"{FAMILY_PREFIX}{f}": j for f, j in kernels.items()})
    out[f"{FAMILY_PREFIX}idle"] = idle
    return out


def energy_families(summary: dict) -> list[tuple[str, float]]:
    """(family or 'idle', joules) from a summary's energy fields, largest first."""
    rows = [(k[len(FAMILY_PREFIX):], v) for k, v in summary.items()
            if k.startswith(FAMILY_PREFIX) and isinstance(v, float) and not math.isnan(v)]
    return sorted(rows, key=lambda kv: -kv[1])

