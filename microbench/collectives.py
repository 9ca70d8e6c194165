"""Collectives: all_reduce, all_gather, reduce_scatter, all_to_all and send/recv, as nccl-tests measures them.

Sizes follow nccl-tests: msg_bytes is the per-rank buffer for all-reduce and
all-to-all, the full (gathered) buffer for all-gather and reduce-scatter, the
message for send/recv (each rank sends to rank+1 and receives from rank-1).
Each rank times every iteration (CUDA events with NCCL, wall clock with gloo
on a CPU); a row's latency statistics are over iterations of the mean across
ranks (nccl-tests' default averaging), and algbw/busbw come from
predictor.families.collectives (one definition). Rows are written by rank 0
through the sweep writer, so collectives resume like kernels do.

Two launchers, one worker: `kernelsight bench` spawns one process per GPU
(or `collectives.world_size` CPU processes) itself; on a multi-node or custom
setup run `torchrun --nproc-per-node N -m kernelsight.cli.bench [bench overrides]`,
which composes the same config and calls run_job on every rank.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from kernelsight.predictor.dtypes import dtype_bytes
from kernelsight.predictor.families import make_shape
from kernelsight.predictor.families.collectives import algbw, busbw

from .providers.base import TORCH_DTYPES, randn
from .timing import Clock, TimingConfig, stats


@dataclass(frozen=True)
class CollectiveJob:
    """What every rank runs: shapes as plain rows (picklable), the timing budget, where rank 0 writes."""

    rows: list                 # shape rows: family, msg_bytes, world_size, link, dtype
    backend: str               # 'nccl' or 'gloo'
    warmup: int
    min_reps: int
    max_reps: int
    budget_ms: float
    sweep_dir: str
    environment: dict
    base_row: dict
    shard_rows: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CHECK_MAX_BYTES = 16 << 20  # results are checked against a local recomputation up to this size
RTOL = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 2e-2}


def _seed(rank: int) -> int:
    return 1000 + rank


def _buffers(op: str, msg_bytes: int, world: int, dtype: str, device, gen):
    """(send, recv) tensors of nccl-tests' sizes for `op`; inputs random, never zero."""
    count = int(msg_bytes // dtype_bytes(dtype))
    if op in ("allreduce", "sendrecv"):
        send = randn((count,), dtype, device, gen)
        return send, (send if op == "allreduce" else torch.empty_like(send))
    if op == "allgather":
        return randn((count // world,), dtype, device, gen), torch.empty(count, dtype=TORCH_DTYPES[dtype], device=device)
    if op == "reducescatter":
        return randn((count,), dtype, device, gen), torch.empty(count // world, dtype=TORCH_DTYPES[dtype], device=device)
    if op == "alltoall":
        return randn((count,), dtype, device, gen), torch.empty(count, dtype=TORCH_DTYPES[dtype], device=device)
    raise ValueError(f"not a collective: {op!r}")


def _collective(op: str, send, recv, rank: int, world: int):
    """The call nccl-tests times for `op`."""
    if op == "allreduce":
        return lambda: dist.all_reduce(send)
    if op == "allgather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(recv, send)
    if op == "reducescatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(recv, send)
    if op == "alltoall":
        return lambda: dist.all_to_all_single(recv, send)

    def sendrecv():
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return sendrecv


def expected_output(op: str, msg_bytes: int, rank: int, world: int, dtype: str, device) -> torch.Tensor:
    """What `recv` (the reduced buffer for all-reduce) must hold on `rank`, from every rank's seeded input."""
    sends = [_buffers(op, msg_bytes, world, dtype, device, torch.Generator(device=device).manual_seed(_seed(r)))[0]
             .float() for r in range(world)]
    if op == "allreduce":
        return torch.stack(sends).sum(0)
    if op == "allgather":
        return torch.cat(sends)
    if op == "reducescatter":
        return torch.stack(sends).sum(0).chunk(world)[rank]
    if op == "alltoall":
        return torch.cat([s.chunk(world)[rank] for s in sends])
    return sends[(rank - 1) % world]  # sendrecv: from the previous rank


def legal_msg_bytes(op: str, msg_bytes: int, world: int, dtype: str) -> int:
    """Largest size <= msg_bytes whose element count splits evenly over the ranks (as nccl-tests aligns)."""
    per = int(dtype_bytes(dtype)) * (world if op in ("allgather", "reducescatter", "alltoall") else 1)
    return max(per, msg_bytes // per * per)


def measure_collective(row: dict, job: CollectiveJob, rank: int, world: int, device) -> dict:
    """Time one collective shape on every rank; rank 0 gets the row (others None)."""
    from .providers.base import relative_error

    op, dtype = row["family"], row["dtype"]
    gen = torch.Generator(device=device).manual_seed(_seed(rank))
    send, recv = _buffers(op, row["msg_bytes"], world, dtype, device, gen)
    fn = _collective(op, send, recv, rank, world)
    dist.barrier()
    if row["msg_bytes"] <= CHECK_MAX_BYTES:
        fn()
        err = relative_error(recv, expected_output(op, row["msg_bytes"], rank, world, dtype, device))
        worst = torch.tensor([err], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # every rank skips timing together
        if not worst.item() <= RTOL[dtype]:
            return {**row, **job.base_row, "status": "mismatch", "latency_ms": None,
                    "error": f"relative error {worst.item():.3g} > {dtype} bound {RTOL[dtype]:g}"} if rank == 0 else None
    clock = Clock(device, TimingConfig(l2="hot"))  # a collective's buffers are its own working set: no flush
    warm = clock.time_calls(fn, max(job.warmup, 1))
    # every rank must run the same number of iterations: agree on the slowest warm-up
    per_call = torch.tensor([min(warm)], dtype=torch.float64, device=device)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    reps = int(min(job.max_reps, max(job.min_reps, np.ceil(job.budget_ms / max(per_call.item(), 1e-4)))))
    times = torch.tensor(clock.time_calls(fn, reps), dtype=torch.float64, device=device)
    gathered = [torch.empty_like(times) for _ in range(world)]
    dist.all_gather(gathered, times)
    if rank != 0:
        return None
    s = stats(torch.stack(gathered).mean(0).cpu().numpy())
    return {**row, "latency_ms": s.median_ms, "latency_p10_ms": s.p10_ms, "latency_p90_ms": s.p90_ms,
            "samples": s.samples, "cuda_graph": False, "status": "ok", "flags": "", **job.base_row}


def worker(rank: int, world: int, port: int, job: CollectiveJob) -> None:
    """One spawned rank on this machine, joining a localhost group."""
    if job.backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(job.backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        run_job(job, rank, world)
    finally:
        dist.destroy_process_group()


def run_job(job: CollectiveJob, rank: int, world: int) -> None:
    """Measure every row of the job on this rank of an initialised process group; rank 0 writes the rows."""
    from .runner import ShardWriter

    device = torch.device("cuda", torch.cuda.current_device()) if job.backend == "nccl" else torch.device("cpu")
    writer = ShardWriter(job.sweep_dir, job.environment, job.shard_rows) if rank == 0 else None
    for row in job.rows:
        try:
            result = measure_collective(row, job, rank, world, device)
        except torch.cuda.OutOfMemoryError as e:
            result = {**row, **job.base_row, "status": "failed",
                      "error": f"out of memory: {str(e).splitlines()[0][:300]}"} if rank == 0 else None
            torch.cuda.empty_cache()
        if writer is not None:
            writer.add(result)
            print(format_result(result), flush=True)


HEADER = f"{'op':>13} {'size(B)':>12} {'count':>11} {'type':>5} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"


def format_result(row: dict) -> str:
    """One nccl-tests-style line: latency, algbw and busbw of a collective row."""
    count = int(row["msg_bytes"] // dtype_bytes(row["dtype"]))
    if row["status"] != "ok":
        return f"{row['family']:>13} {row['msg_bytes']:>12} {count:>11} {row['dtype']:>5}  {row['error']}"
    sec = row["latency_ms"] / 1e3
    return (f"{row['family']:>13} {row['msg_bytes']:>12} {count:>11} {row['dtype']:>5} {sec * 1e6:>10.1f} "
            f"{algbw(row['msg_bytes'], sec) / 1e9:>12.2f} "
            f"{float(busbw(row['family'], row['msg_bytes'], sec, row['world_size'])) / 1e9:>12.2f}")


def collective_rows(ops, sizes, world: int, link: str, dtype: str) -> list[dict]:
    """Shape rows (via make_shape, so the cost model validates them) for every op and size."""
    rows: dict = {}
    for op in ops:
        for size in sizes:
            shape = make_shape(op, msg_bytes=legal_msg_bytes(op, size, world, dtype), world_size=world,
                               link=link, dtype=dtype)
            rows[tuple(shape.row().items())] = shape.row()
    return list(rows.values())


def spawn(job: CollectiveJob, world: int) -> None:
    """Run the job on `world` local processes (one per GPU with NCCL; CUDA needs 'spawn', gloo can fork)."""
    import torch.multiprocessing as mp

    print(HEADER, flush=True)
    mp.start_processes(worker, args=(world, free_port(), job), nprocs=world,
                       start_method="spawn" if job.backend == "nccl" else "fork")
