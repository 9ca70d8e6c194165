"""Planner speed: `python benchmarks/bench_plan.py` prints the figures.

Runs the issue's two searches as whole processes, start to exit (python calling kernelsight.cli.main, as
the console script does), with the default search space of conf/plan.yaml (320 candidates for a dense
model, 560 for a mixture of experts; jobs=2) and prints per search: candidates, wall time, the process
tree's CPU time and the machine's load average (on a shared machine wall time includes waiting for a
core; target: <= 120 s on this 2-core machine).

    kernelsight plan model=llama3.1-70b workload.request_rate=20 slo.ttft_ms=500 slo.tpot_ms=50
    kernelsight plan model=qwen3-30b-a3b workload.request_rate=20 slo.ttft_ms=500 slo.tpot_ms=50
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

SEARCHES = {"dense": ["model=llama3.1-70b"], "moe": ["model=qwen3-30b-a3b"]}
COMMON = ["workload.request_rate=20", "slo.ttft_ms=500", "slo.tpot_ms=50", "quiet=true"]
TARGET_S = 120.0


def timed(args: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its children, stdout) of one `kernelsight plan` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "import sys; from kernelsight.cli import main; main(sys.argv[1:])",
                           "plan", *args], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"kernelsight plan {' '.join(args)} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SEARCHES), help="run one of the searches")
    opts = parser.parse_args()
    print(f"{'search':<8} {'candidates':>10} {'wall s':>8} {'CPU s':>8} {'load avg':>9}  target <= {TARGET_S:.0f} s")
    for name, args in SEARCHES.items():
        if opts.only and name != opts.only:
            continue
        with tempfile.TemporaryDirectory() as out:
            wall, cpu, stdout = timed([*args, *COMMON, f"output_dir={out}/plan"])
        found = re.search(r"; (\d+) candidates on", stdout)
        count = found.group(1) if found else "?"
        load = os.getloadavg()[0]
        verdict = "met" if wall <= TARGET_S else "not met"
        print(f"{name:<8} {count:>10} {wall:>8.1f} {cpu:>8.1f} {load:>9.2f}  {verdict}")


if __name__ == "__main__":
    main()
