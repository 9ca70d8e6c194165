"""A run says when a family's price is out of proportion to its roofline: the sign of an η model pricing
kernels unlike those it was fitted on (MoE from a per-expert loop)."""
import warnings

import pytest

import kernelsight
from kernelsight.sim.pricing import IMPLAUSIBLE_ETA_RATIO, implausible_families


def source(family, kernel_s, roofline_s):
    return {"family": family, "tier": "target", "model": f"target/x/{family}", "kernel_s": kernel_s,
            "roofline_s": roofline_s, "time_share": 1.0, "outside_training_range": 0.0}


def test_a_family_with_most_of_the_time_at_a_far_higher_eta_is_flagged():
    rest = [source("gemm", 1.0, 0.5), source("attn_decode", 0.5, 0.25)]  # the rest of the step: η 2
    odd = implausible_families([source("moe", 30.0, 3.0), *rest])  # η 10 = 5x the rest's, 95 % of the time
    assert [o["family"] for o in odd] == ["moe"]
    assert odd[0]["eta"] == pytest.approx(10.0) and odd[0]["rest_eta"] == pytest.approx(2.0)
    assert odd[0]["share"] == pytest.approx(30 / 31.5) and odd[0]["roofline_share"] == pytest.approx(3 / 3.75)
    # just under the ratio, or most of the time at the rest's η, or a small share: nothing to say
    at = 2.0 * IMPLAUSIBLE_ETA_RATIO * 0.99
    assert implausible_families([source("moe", 3.0 * at, 3.0), *rest]) == []
    assert implausible_families([source("moe", 6.0, 3.0), *rest]) == []
    assert implausible_families([source("norm", 1.0, 0.01), *rest]) == []
    assert implausible_families([source("moe", 30.0, 3.0)]) == []  # nothing else to compare with
    assert implausible_families([]) == []


@pytest.mark.parametrize("model, hardware, moe_slowdown, flagged", [
    ("qwen3-30b-a3b", "h200_sxm", 1.0, []),        # MoE priced from vLLM's fused kernels: in proportion
    ("qwen3-30b-a3b", "h200_sxm", 20.0, ["moe"]),  # as a per-expert loop's η model priced it: flagged
    ("llama3.1-8b", "h100_sxm", 1.0, [])])
def test_runs_report_implausible_families(model, hardware, moe_slowdown, flagged, monkeypatch):
    from kernelsight.predictor.predict import Predictor

    predict = Predictor.predict

    def slowed(self, shapes, family=None):
        out = predict(self, shapes, family=family)
        if family == "moe":
            out = {**out, "seconds": out["seconds"] * moe_slowdown, "eta": out["eta"] * moe_slowdown}
        return out

    monkeypatch.setattr(Predictor, "predict", slowed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = kernelsight.simulate(model=model, hardware=hardware, num_requests=20)
    assert [o["family"] for o in result.implausible_families()] == flagged
