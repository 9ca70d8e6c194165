"""Workloads: arrival processes, length distributions, shared prefixes, trace replay and its errors."""
import json
import math

import numpy as np
import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.sim.request import OUTPUT, SHARED_PREFIX, TRACE_HASH, UNIQUE
from kernelsight.sim.workload import Workload, WorkloadConfig, load_trace, resolve_trace, traces_dir


def workload(**kw):
    raw = {"arrival": "poisson", "request_rate": 10.0, "input": {"dist": "fixed", "value": 100},
           "output": {"dist": "fixed", "value": 10}}
    raw.update(kw)
    return Workload(WorkloadConfig.from_config(raw))


def arrivals(w, n, seed=0):
    return np.array([r.arrival_time for r in w.requests(n, seed)])


@pytest.mark.parametrize("arrival, burstiness, cv", [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5)])
def test_arrival_processes_have_the_rate_and_burstiness(arrival, burstiness, cv):
    gaps = np.diff(arrivals(workload(arrival=arrival, request_rate=20.0, burstiness=burstiness), 20_000))
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)       # gamma: CV = 1 / sqrt(shape)
    assert (gaps >= 0).all()


def test_infinite_rate_sends_everything_at_once():
    assert (arrivals(workload(request_rate=math.inf), 50) == 0).all()


def test_ramp_up_starts_closed_loop_clients_evenly_then_sends_on_completion():
    times = arrivals(workload(request_rate=math.inf, max_concurrency=4, ramp_up_s=2.0), 10)
    np.testing.assert_allclose(times[:4], [0.0, 0.5, 1.0, 1.5])
    assert (times[4:] == 0).all()      # later requests go out as soon as a client is free


def test_length_distributions():
    w = workload(input={"dist": "lognormal", "mean": 300.0, "sigma": 0.7},
                 output={"dist": "uniform", "low": 5, "high": 9})
    reqs = list(w.requests(20_000, 1))
    inputs = np.array([r.prompt_len for r in reqs])
    outputs = np.array([r.output_len for r in reqs])
    assert inputs.mean() == pytest.approx(300, rel=0.03)
    assert np.median(inputs) == pytest.approx(300 * math.exp(-0.7 ** 2 / 2), rel=0.03)
    assert outputs.min() == 5 and outputs.max() == 9 and set(outputs) == set(range(5, 10))
    clipped = [r.prompt_len for r in workload(input={"dist": "lognormal", "mean": 300.0, "sigma": 2.0,
                                                       "min": 50, "max": 400}).requests(2000, 0)]
    assert min(clipped) == 50 and max(clipped) == 400


def test_empirical_lengths_come_jointly_from_rows_of_a_shipped_trace():
    trace = load_trace(resolve_trace("splitwise_code"))
    assert resolve_trace("splitwise_code").parent == traces_dir()
    pairs = set(zip(trace["input_len"], trace["output_len"]))
    w = workload(input={"dist": "empirical", "trace": "splitwise_code"},
                 output={"dist": "empirical", "trace": "splitwise_code"})
    drawn = [(r.prompt_len, r.output_len) for r in w.requests(3000, 2)]
    assert set(drawn) <= pairs and len(set(drawn)) > 1000
    # arxiv_summarization resolves by prefix to the Vidur file name
    assert resolve_trace("arxiv_summarization").name.startswith("arxiv_summarization")


def test_rate_sweeps_keep_the_same_requests():
    base = dict(input={"dist": "lognormal", "mean": 200.0, "sigma": 1.0},
                output={"dist": "lognormal", "mean": 100.0, "sigma": 1.0})
    slow = [(r.prompt_len, r.output_len) for r in workload(request_rate=1.0, **base).requests(500, 7)]
    fast = [(r.prompt_len, r.output_len) for r in workload(request_rate=50.0, **base).requests(500, 7)]
    other = [(r.prompt_len, r.output_len) for r in workload(request_rate=1.0, **base).requests(500, 8)]
    assert slow == fast and slow != other


def test_system_prompts_prefix_every_request():
    w = workload(system_prompts=3, system_prompt_len=64)
    reqs = list(w.requests(300, 0))
    assert all(r.prompt_len == 164 for r in reqs)
    groups = {r.segments[0] for r in reqs}
    assert groups == {((SHARED_PREFIX, g), 64) for g in range(3)}
    assert all(r.segments[1] == ((UNIQUE, r.request_id), 100) for r in reqs)


def test_multi_turn_prompts_extend_the_conversation():
    w = workload(turns=3, think_time_s=2.0, system_prompts=1, system_prompt_len=16,
                 input={"dist": "uniform", "low": 5, "high": 20}, output={"dist": "uniform", "low": 3, "high": 9})
    firsts = list(w.requests(7, 0))                 # 7 turns: conversations of 3, 3 and 1
    chains = []
    for r in firsts:
        chain = [r]
        while chain[-1].followup is not None:
            think, nxt = chain[-1].followup
            assert think >= 0
            chain.append(nxt)
        chains.append(chain)
    assert [len(c) for c in chains] == [3, 3, 1]
    for chain in chains:
        for prev, nxt in zip(chain, chain[1:]):
            # the next prompt is the previous prompt, its answer, and a new message
            assert nxt.segments[:len(prev.segments)] == prev.segments
            assert nxt.segments[len(prev.segments)] == ((OUTPUT, prev.request_id), prev.output_len)
            assert nxt.prompt_len > prev.prompt_len + prev.output_len


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_trace_replay_csv_and_jsonl(tmp_path):
    csv = write(tmp_path, "t.csv", "arrival_time,input_len,output_len,prefix_group,prefix_len\n"
                                   "1.0,100,10,a,64\n1.5,80,5,a,64\n2.0,30,7,,\n")
    reqs = list(workload(arrival="trace", trace_file=str(csv), time_scale=2.0).requests(None, 0))
    assert [r.arrival_time for r in reqs] == [0.0, 1.0, 2.0]     # from the first row, scaled
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(100, 10), (80, 5), (30, 7)]
    assert reqs[0].segments[0] == reqs[1].segments[0] == ((SHARED_PREFIX, 0), 64)
    assert len(reqs[2].segments) == 1
    jsonl = write(tmp_path, "t.jsonl", "\n".join(json.dumps(r) for r in [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 0.5, "input_length": 600, "output_length": 3, "hash_ids": [1, 9]}]))
    a, b = workload(arrival="trace", trace_file=str(jsonl)).requests(None, 0)
    assert a.segments == (((TRACE_HASH, 1), 512), ((TRACE_HASH, 2), 512), ((TRACE_HASH, 3), 76))
    assert b.segments == (((TRACE_HASH, 1), 512), ((TRACE_HASH, 9), 88))
    assert a.block_hashes(32, 16) == b.block_hashes(32, 16)          # 512 shared tokens = 32 blocks
    assert a.block_hash(32, 16) != b.block_hash(32, 16)
    assert len(list(workload(arrival="trace", trace_file="splitwise_conv").requests(100, 0))) == 100


@pytest.mark.parametrize("text, message", [
    ("arrival_time,input_len,output_len\n0,10,5\n1,-3,5\n", r"t.csv: row 3: input_len = -3 is negative"),
    ("arrival_time,input_len,output_len\n0,10,5\n2,10,5\n1,10,5\n",
     r"t.csv: row 4: arrival_time = 1 is earlier than the previous row's 2"),
    ("arrival_time,input_len\n0,10\n", r"t.csv: missing column 'output_len'"),
    ("arrival_time,input_len,output_len\n0,ten,5\n", r"t.csv: row 2: input_len = 'ten' is not a number"),
    ("arrival_time,input_len,output_len\n0,10,0\n", r"row 2: output_len = 0: a request needs at least 1 token"),
    ("arrival_time,input_len,output_len\n0,10.5,2\n", r"row 2: input_len = 10.5 is not a whole number"),
    ("arrival_time,input_len,output_len,prefix_group\n0,10,2,a\n", r"prefix_group needs a prefix_len column"),
    ("arrival_time,input_len,output_len,prefix_group,prefix_len\n0,10,2,a,20\n",
     r"row 2: prefix_len = 20 must be a whole number between 0 and input_len = 10"),
])
def test_bad_trace_rows_are_one_line_errors(tmp_path, text, message):
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(KernelsightError, match=message) as e:
        workload(arrival="trace", trace_file=str(path))
    assert "\n" not in str(e.value)


def test_bad_jsonl_line_names_its_row(tmp_path):
    path = write(tmp_path, "t.jsonl", '{"arrival_time": 0, "input_len": 3, "output_len": 2}\n{oops}\n')
    with pytest.raises(KernelsightError, match=r"t.jsonl: row 2: not valid JSON"):
        workload(arrival="trace", trace_file=str(path))


@pytest.mark.parametrize("raw, message", [
    ({"request_rte": 3.0}, r"workload.request_rte: unknown field \(did you mean 'request_rate'\?\)"),
    ({"input": {"dist": "lognorm", "mean": 3.0, "sigma": 1.0}}, r"workload.input.dist='lognorm'.*'lognormal'"),
    ({"input": {"dist": "lognormal", "mean": 3.0}}, r"workload.input: dist lognormal needs sigma"),
    ({"request_rate": "fast"}, r"workload.request_rate='fast': must be a number"),
    ({"turns": 0}, r"workload.turns=0: must be >= 1"),
    ({"ramp_up_s": 1.0}, r"workload.ramp_up_s=1.0: .*only for a closed loop"),
    ({"ramp_up_s": -1.0, "max_concurrency": 4, "request_rate": math.inf}, r"workload.ramp_up_s=-1.0: must be >= 0"),
    ({"arrival": "trace"}, r"needs workload.trace_file"),
    ({"system_prompts": 4}, r"system_prompts and system_prompt_len must both be > 0"),
    ({"input": {"dist": "empirical", "trace": "splitwise_cnv"}}, r"did you mean 'splitwise_conv'"),
])
def test_bad_workload_configs_are_one_line_errors(raw, message):
    with pytest.raises(KernelsightError, match=message):
        workload(**raw)


def test_streams_lazily_in_constant_memory():
    stream = workload(request_rate=100.0).requests(10_000_000, 0)
    first = [next(stream) for _ in range(5)]      # a generator: nothing is built ahead of use
    assert [r.request_id for r in first] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed, message", [(-1, "seed=-1: must be an integer >= 0"), (True, "seed=True"),
                                           (1.5, "seed=1.5"), ("7", "seed='7'")])
def test_a_seed_is_an_integer_from_zero_for_every_workload(tmp_path, seed, message):
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_time,input_len,output_len\n0.0,10,5\n")
    for w in (workload(), workload(arrival="trace", trace_file=str(csv), input=None, output=None)):
        with pytest.raises(KernelsightError, match=message):
            w.requests(10, seed)  # refused at the call, before the lazy stream starts
    with pytest.raises(KernelsightError, match="num_requests=None: must be an integer >= 1"):
        workload().requests(None, 0)
    with pytest.raises(KernelsightError, match="num_requests=True"):
        workload().requests(True, 0)
