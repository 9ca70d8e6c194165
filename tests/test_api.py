"""The Python API (`import kernelsight`): the README's example runs as written, kernelsight.simulate composes
what `kernelsight simulate` composes (same numbers), bad names are one line with a did-you-mean, the
package imports lazily, and progress reaches the caller's factory only."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import kernelsight
from kernelsight import cli
from kernelsight.predictor.paths import conf_dir, read_yaml
from kernelsight.sim.compose import compose
from kernelsight.sim.model import load_model
from kernelsight.sim.workload import WorkloadConfig

REPO = Path(__file__).resolve().parents[1]
SHAPES = pd.DataFrame({"family": ["gemm", "attn_decode"], "m": [128, None], "n": [4096, None], "k": [4096, None],
                       "dtype": ["bf16", "bf16"], "batch": [None, 32], "seq_kv": [None, 4096], "heads": [None, 32],
                       "kv_heads": [None, 8], "head_dim": [None, 128], "block_size": [None, 16],
                       "window": [None, 0], "kv_dtype": [None, "bf16"]})


def readme_example() -> str:
    """The ```python block of the README's "Python API" section."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written(capsys):
    code = readme_example()
    assert code.count("num_requests=200") == 1
    scope = {"shapes": SHAPES}
    exec(code.replace("num_requests=200", "num_requests=30"), scope)
    printed = capsys.readouterr().out.split()
    result, frame, pred = scope["result"], scope["frame"], scope["pred"]
    assert [float(x) for x in printed] == [result.metrics["ttft_ms"]["p50"], result.metrics["tpot_ms"]["mean"]]
    assert len(frame) == 30 and (frame["ttft_ms"] > 0).all()
    assert {"latency_us", "tier", "model", "extrapolated"} <= set(pred.columns)
    assert list(pred["tier"]) == ["target", "target"] and (pred["latency_us"] > 0).all()
    assert pred.index.equals(SHAPES.index)
    by_alias = kernelsight.Predictor("NVIDIA H100 80GB HBM3").predict(SHAPES)
    assert by_alias["latency_us"].tolist() == pred["latency_us"].tolist()
    with pytest.raises(kernelsight.KernelsightError, match="did you mean 'h100_sxm'"):
        kernelsight.Predictor("h100_sxmm")


def test_result_metrics_group_the_summary():
    result = kernelsight.simulate(num_requests=20)
    m, s = result.metrics, result.summary
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert m[f"{name}_ms"] == {"mean": s[f"mean_{name}_ms"], "std": s[f"std_{name}_ms"],
                                   "median": s[f"median_{name}_ms"], "p50": s[f"median_{name}_ms"],
                                   "p90": s[f"p90_{name}_ms"], "p99": s[f"p99_{name}_ms"]}
    assert m["request_throughput"] == s["request_throughput"] and m["completed"] == 20
    assert list(result.breakdown.columns) == ["prefill", "decode", "mixed", "total_s", "share"]
    assert result.breakdown["share"].sum() == pytest.approx(1.0)


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_simulate_matches_the_command_line(tmp_path):
    """Same settings -> the same summary, number for number, as `kernelsight simulate` run in-process."""
    out = tmp_path / "run"
    cli.main(["simulate", "num_requests=25", "seed=3", "workload=sharegpt", "workload.request_rate=12",
              "slo.ttft_ms=150", "predictor.tier=cross", f"output_dir={out}", "plots=false", "--quiet"])
    written = json.loads((out / "summary.json").read_text())
    result = kernelsight.simulate(workload="sharegpt", num_requests=25, seed=3, slo={"ttft_ms": 150},
                                  **{"workload.request_rate": 12, "predictor.tier": "cross"})
    different = {k: (v, written[k]) for k, v in result.summary.items() if k != "wall_s" and not _same(v, written[k])}
    assert different == {} and result.summary["completed"] == 25
    assert written["pricing_sources"] == json.loads(json.dumps(result.pricing_sources(), default=float))


def test_defaults_are_the_command_lines():
    settings = read_yaml(conf_dir() / "simulate.yaml", "simulate")
    defaults = {k: v for entry in settings["defaults"] if isinstance(entry, dict) for k, v in entry.items()}
    import inspect

    params = inspect.signature(kernelsight.simulate).parameters
    assert {g: params[g].default for g in defaults} == defaults
    assert params["num_requests"].default == settings["num_requests"] and params["seed"].default == settings["seed"]


def test_groups_take_names_aliases_mappings_and_typed_configs():
    cfg, sources = compose({"hardware": "NVIDIA H100 80GB HBM3"}, {"workload.input": {"value": 256}})
    assert sources["hardware"] == "conf/hardware/h100_sxm.yaml" and cfg["workload"]["input"]["value"] == 256
    workload = read_yaml(conf_dir() / "workload" / "poisson.yaml", "workload")
    by_mapping = kernelsight.simulate(num_requests=8, workload={**workload, "request_rate": 30.0}).summary
    typed = kernelsight.simulate(num_requests=8, model=load_model("llama3.1-8b"),
                                 workload=WorkloadConfig.from_config({**workload, "request_rate": 30.0})).summary
    dotted = kernelsight.simulate(num_requests=8, **{"workload.request_rate": 30.0}).summary
    for summary in (by_mapping, typed):
        assert all(_same(v, dotted[k]) for k, v in summary.items() if k != "wall_s")


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "llama3.1-8"}, r"model=llama3.1-8: no such config in conf/model \(did you mean 'llama3.1-8b'\?\)"),
    ({"hardware": "h100_sxmm"}, r"unknown GPU 'h100_sxmm': did you mean 'h100_sxm'\?"),
    ({"workload": "poison"}, r"workload=poison: no such config in conf/workload \(did you mean 'poisson'\?\)"),
    ({"engine": "vllm"}, r"did you mean 'vllm_v1'\?"),
    ({"rooter": "round_robin"}, r"rooter: unknown setting \(did you mean 'router'\?\)"),
    ({"slo.ttf_ms": 100}, r"slo.ttf_ms: unknown setting \(did you mean 'ttft_ms'\?\)"),
    ({"workload.request_rat": 3}, r"workload.request_rat: unknown field \(did you mean 'request_rate'\?\)"),
    ({"model": load_model("llama3.1-8b"), "model.layers": 2}, r"model is a ModelConfig object"),
    ({"plots": False}, r"plots: a setting of the `kernelsight simulate` command"),
    ({"num_requests": 0}, r"num_requests=0: must be an integer >= 1"),
    ({"parallel": {"tp": 2}}, r"parallel mapping: missing field 'name'; a mapping passed as parallel= is the whole "
                              r"group config: .* \*\*\{'parallel.tp': \.\.\.\}"),
])
def test_bad_names_and_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(kernelsight.KernelsightError, match=message) as e:
        kernelsight.simulate(**{"num_requests": 5, **kwargs})
    assert "\n" not in str(e.value)


def test_output_dir_holds_the_whole_run_or_is_left_as_it_was(tmp_path, monkeypatch):
    """The API writes a run directory as the command does: swapped in whole, summary.json last."""
    out = tmp_path / "run"
    kernelsight.simulate(num_requests=5, output_dir=str(out))
    assert sorted(p.name for p in out.iterdir()) == ["breakdown.csv", "requests.parquet", "steps.parquet",
                                                     "summary.json", "trace.json"]
    with pytest.raises(kernelsight.KernelsightError, match="not empty; pass overwrite=true"):
        kernelsight.simulate(num_requests=5, output_dir=str(out))
    from kernelsight.sim import report

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_run_outputs", crash)
    with pytest.raises(KeyboardInterrupt):  # interrupted inside the run: the previous run stays
        kernelsight.simulate(num_requests=5, output_dir=str(out), overwrite=True)
    monkeypatch.undo()
    assert (out / "summary.json").is_file() and [p.name for p in tmp_path.iterdir()] == ["run"]
    result = kernelsight.simulate(num_requests=5, output_dir=str(out), overwrite=True, seed=1, keep_requests=False)
    assert json.loads((out / "summary.json").read_text())["completed"] == 5
    assert result.out_dir == out and len(result.requests) == 5  # read back from the finished run's folder


class Bar:
    """A tqdm-like factory that records what the library asked for."""

    made: list = []

    def __init__(self, iterable=None, total=None, desc=None, unit=None):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        Bar.made.append(self)

    def update(self, n=1):
        self.n += n

    def close(self):
        self.closed = True


def test_progress_counts_every_finished_request():
    Bar.made = []
    result = kernelsight.simulate(num_requests=30, progress=Bar, max_model_len=1100,
                                  **{"workload.input": {"dist": "uniform", "low": 900, "high": 1200}})
    (bar,) = Bar.made
    assert 0 < result.summary["failed"] < 30  # prompts over max_model_len fail, and count
    assert (bar.total, bar.desc, bar.n, bar.closed) == (30, "simulate", 30, True)


def test_import_is_lazy():
    code = ("import sys, kernelsight, kernelsight.predictor; "
            "print(sorted(m for m in sys.modules if m.startswith(('kernelsight.sim', 'kernelsight.cli', 'hydra', "
            "'omegaconf', 'torch', 'matplotlib', 'kernelsight.calibrate')))); "
            "kernelsight.Predictor; print('kernelsight.predictor.predict' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]
    assert "simulate" in dir(kernelsight) and "Predictor" in kernelsight.__all__
    with pytest.raises(AttributeError, match="no attribute 'simulator'"):
        kernelsight.simulator  # noqa: B018
