"""The evaluation report: evaluation.json (every number), REPORT.md (the tables), PNG plots.

Plots: per family a parity plot (predicted vs measured latency, target tier and
cross-device tier side by side, one colour per GPU) and η against the family's
dominant shape parameter per GPU (measured, target-tier and cross-tier
predictions from the held-out folds). Points are a seeded sample (at most
`plot_points` per GPU and panel) so plotting stays fast.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.outputs import ensure_dir, save_figure, write_json, write_text

from .evaluate import DECODE_SIZED, DIAGNOSTIC, DIAGNOSTICS, MODELS, NO_SIBLING, TOKEN_FIELDS, headline, metrics
from .intervals import coverage, residual_frame

PLOT_POINTS = 1500


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if np.isnan(v) else f"{v:.1f}"
    return str(v)


def markdown_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(none)\n"
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _mape_table(per: pd.DataFrame, tier: str, index=("family", "split", "device", "rows")) -> pd.DataFrame:
    part = per[per["tier"] == tier] if not per.empty else per
    if part.empty:
        return pd.DataFrame()
    wide = part.pivot_table(index=list(index), columns="model", values=["mape", "median_ape", "p90_ape"])
    out = pd.DataFrame(index=wide.index)
    out["MAPE"] = wide[("mape", "lightgbm")]
    out["median APE"] = wide[("median_ape", "lightgbm")]
    out["p90 APE"] = wide[("p90_ape", "lightgbm")]
    out["MAPE const"] = wide[("mape", "constant")]
    out["MAPE roofline"] = wide[("mape", "roofline")]
    out["MAPE no floor"] = wide[("mape", DIAGNOSTIC)]
    if tier == "cross":
        out["MAPE no sibling"] = wide[("mape", NO_SIBLING)]
        out["rows by die sibling %"] = part.groupby(list(index))["sibling_pct"].first()
    return out.reset_index()


def write_report(out, scored: pd.DataFrame, counts: pd.DataFrame, chosen: pd.DataFrame, eta_lt_1: pd.DataFrame,
                 settings: dict, timings: dict, plots: bool = True, seed: int = 0,
                 repeats: pd.DataFrame | None = None, others: pd.DataFrame | None = None) -> dict:
    """Write evaluation.json, REPORT.md and the PNGs under `out`; return the summary dict."""
    out = ensure_dir(Path(out), "out")
    per = metrics(scored)
    head = headline(scored)
    residuals = residual_frame(scored)
    covered = coverage(residuals)
    result = {"headline_mape": head.to_dict(orient="records"), "per_split": per.to_dict(orient="records"),
              "interval_coverage": covered.to_dict(orient="records"),
              "rows": counts.to_dict(orient="records"), "sweeps": chosen.to_dict(orient="records"),
              "eta_lt_1_kept": eta_lt_1.to_dict(orient="records"), "settings": settings, "timings_s": timings,
              "repeat_measurements": [] if repeats is None else repeats.to_dict(orient="records"),
              "other_sources": _other_metrics(others).to_dict(orient="records")}
    write_json(out / "evaluation.json", result, sort_keys=True)
    pngs = _plots(out, scored, seed) if plots and not scored.empty else []
    is_target = scored["tier"] == "target" if not scored.empty else []
    pooled_folds = metrics(scored[is_target].assign(split="K-fold")) if not scored.empty else per
    cross = _mape_table(per, "cross")
    gb200 = cross[cross["device"] == "gb200"] if not cross.empty else cross
    md = ["# η calibration report", "",
          "MAPE, median and p90 absolute percentage error of predicted kernel latency, in percent. "
          "Target tier: grouped K-fold within each GPU's sweep (shapes rounded to powers of two never "
          "straddle train and test). Cross-device tier: leave-one-device-out (the GPU's rows never seen). "
          "Baselines: constant η per (device, family) (training median; for a held-out GPU the median of the "
          "training GPUs) and the plain roofline (η = 1). 'no floor' is the same model without the "
          "η >= floor rule: the difference is what the rule costs. The cross tier is what the predictor does "
          "for a GPU it has no data of (predictor/transfer.py): a die sibling's target model (same "
          "architecture and SM count, e.g. H200 for H100) prices the kernels it covers, the LightGBM "
          "cross-device model the rest, and collectives over the scale-out network (link `net`, the "
          "cluster's, not the GPU's) stay at the roofline; 'no sibling' is the LightGBM model alone on every "
          "row, and 'rows by die sibling' the share of the held-out GPU's rows a sibling priced.", "",
          "## Headline (pooled over GPUs; cross tier over the leave-one-device-out folds)", "",
          markdown_table(_headline_table(head)), "",
          "## GB200 held out (the seed paper's protocol: trained on the other GPUs, B200 included; "
          "and without any Blackwell GPU)", "", markdown_table(gb200), "",
          "## Leave-one-generation-out (trained without any GPU of the test GPU's architecture)", "",
          markdown_table(cross[cross["split"].str.contains("_no_")] if not cross.empty else cross), "",
          "## Target tier per GPU (all K folds pooled; per fold in evaluation.json)", "",
          markdown_table(_mape_table(pooled_folds, "target")), "",
          "## Cross-device tier per held-out GPU", "", markdown_table(_mape_table(per, "cross")), "",
          "## 80 % prediction intervals: held-out coverage", "",
          "Every prediction carries [p10, p90] = predicted x exp(q10, q90), the quantiles of held-out "
          "log(measured / predicted) of the path that priced it, per family (calibrate/intervals.py): target, "
          "the target tier's K-fold rows; sibling, the leave-one-GPU-out rows a die sibling priced; cross, "
          "every leave-one-GPU-out row of the cross-device model alone. Cross and sibling quantiles treat "
          "the GPU as the unit (a bias per GPU plus the spread about it, each GPU counted by its rows, the "
          "biases' spread widened to the Student-t predictive for the few GPUs seen; sibling biases "
          "symmetric about zero); rows with features outside the model's training range have their own, "
          "wider group ('extrapolated %': their share). Coverage is measured on data the interval was not "
          "set on: each fold's (target) or held-out GPU's (cross, sibling) rows against the intervals fitted "
          "without them and without its die siblings' (whose residuals carry its data). Aim: 75-85 %. "
          "Width: median p90 / p10.", "",
          markdown_table(covered), "",
          "## Repeat measurements", "",
          "Kernels of the kept sweep that another sweep of the same source and GPU timed again (same harness, "
          "provider and shape; another campaign): the other campaign's latency scored as a prediction of the "
          "kept one. Two campaigns disagree this much on identical kernels, so a model of one campaign is not "
          "expected to beat it; beside it, the target tier's K-fold MAPE on the same (GPU, family).", "",
          markdown_table(_repeat_table(repeats, pooled_folds)), "",
          "## Other sources (shapes off the training grid)", "",
          "Each GPU's target model, fitted on its whole block as the bundle holds it, scored on the same GPU's "
          "rows of the same providers that another source timed: another harness and campaign, at that "
          "source's shapes (Vidur's model shapes, off aiconfigurator's grid). Decode-sized rows "
          f"({' or '.join(TOKEN_FIELDS)} <= {DECODE_SIZED}) are also shown apart. What two campaigns disagree on "
          "is in these errors too (see Repeat measurements): they bound the model's own error off its grid from "
          "above.", "",
          markdown_table(_other_table(others)), "",
          "## Data used", "", "Sweeps and providers per (device, family):", "", markdown_table(chosen), "",
          "Rows per rule (rules in calibrate/rows.py):", "", markdown_table(counts), "",
          "Rows measured faster than the roofline (η < 1), kept:", "", markdown_table(eta_lt_1), "",
          "## Settings and timings", "", "```", json.dumps(settings, indent=1, sort_keys=True, default=str), "```",
          "", markdown_table(pd.DataFrame(sorted(timings.items()), columns=["step", "seconds"])), ""]
    if pngs:
        md += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    write_text(out / "REPORT.md", "\n".join(md))
    return {"headline_mape": [{k: (round(v, 3) if isinstance(v, float) and np.isfinite(v) else
                                   (None if isinstance(v, float) else v)) for k, v in r.items()}
                              for r in result["headline_mape"]]}


def _repeat_table(repeats: pd.DataFrame | None, pooled_folds: pd.DataFrame) -> pd.DataFrame:
    if repeats is None or repeats.empty:
        return pd.DataFrame({"repeat measurements": ["none in the data"]})
    model = pooled_folds[pooled_folds["model"] == "lightgbm"] if not pooled_folds.empty else pooled_folds
    target = model.set_index(["device", "family"])["mape"] if not model.empty else pd.Series(dtype=float)
    keys = list(zip(repeats["device"], repeats["family"]))
    return repeats.rename(columns={"mape": "MAPE", "median_ape": "median APE", "p90_ape": "p90 APE"}).assign(
        **{"target tier MAPE": [target.get(k, np.nan) for k in keys]})


def _other_metrics(others: pd.DataFrame | None) -> pd.DataFrame:
    """metrics() of the other-source rows per band, with every row of a family once more as band 'all'."""
    if others is None or others.empty:
        return pd.DataFrame()
    banded = others[others["band"] != "all"]
    return metrics(pd.concat([others.assign(band="all"), banded]), by=("tier", "family", "device", "split", "band"))


def _other_table(others: pd.DataFrame | None) -> pd.DataFrame:
    table = _mape_table(_other_metrics(others), "target", ("family", "device", "split", "band", "rows"))
    return table if not table.empty else pd.DataFrame({"other sources": ["none in the data"]})


def _headline_table(head: pd.DataFrame) -> pd.DataFrame:
    if head.empty:
        return head
    cols = ["tier", "family", *[m for m in (*MODELS, *DIAGNOSTICS) if m in head.columns]]
    return head[cols].rename(columns={"lightgbm": "MAPE model", "constant": "MAPE const",
                                      "roofline": "MAPE roofline", DIAGNOSTIC: "MAPE no floor",
                                      NO_SIBLING: "MAPE no sibling"})


def _plots(out: Path, scored: pd.DataFrame, seed: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    pooled = scored[(scored["tier"] == "target") | scored["split"].str.startswith("lodo ")]
    shuffled = pooled.iloc[np.random.default_rng(seed).permutation(len(pooled))]
    sample = shuffled[shuffled.groupby(["tier", "family", "device"]).cumcount() < PLOT_POINTS]
    for family, fam in sample.groupby("family", sort=True):
        devices = sorted(fam["device"].unique())
        colours = {d: plt.cm.tab20(i % 20) for i, d in enumerate(devices)}
        fig, axes = plt.subplots(1, 2, figsize=(11, 5))
        for ax, tier in zip(axes, ("target", "cross")):
            part = fam[fam["tier"] == tier]
            for d, g in part.groupby("device", sort=True):
                ax.scatter(g["latency_ms"], g["pred_lightgbm"], s=3, alpha=0.5, color=colours[d], label=d)
            lo = max(min(fam["latency_ms"].min(), fam["pred_lightgbm"].min()), 1e-5)
            hi = max(fam["latency_ms"].max(), fam["pred_lightgbm"].max())
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            ax.set(xscale="log", yscale="log", xlabel="measured latency (ms)", ylabel="predicted latency (ms)",
                   title=f"{family}: {tier} tier (held-out rows)")
            if not part.empty:
                ax.legend(fontsize=6, markerscale=3)
        fig.tight_layout()
        name = f"parity_{family}.png"
        save_figure(fig, out / name, dpi=90)
        plt.close(fig)
        names.append(name)

        cols = min(4, len(devices))
        rows = int(np.ceil(len(devices) / cols))
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
        for ax, d in zip(axes.flat, devices):
            g = fam[fam["device"] == d]
            meas = g.drop_duplicates(subset=["dominant", "latency_ms"])
            ax.scatter(meas["dominant"], meas["eta"], s=3, alpha=0.4, color="k", label="measured")
            for tier, colour in (("target", "tab:blue"), ("cross", "tab:orange")):
                t = g[g["tier"] == tier]
                if not t.empty:
                    ax.scatter(t["dominant"], t["pred_lightgbm"] / t["t_roof_ms"], s=3, alpha=0.4, color=colour,
                               label=f"{tier} prediction")
            ax.set(xscale="log", yscale="log", title=d, xlabel="dominant shape parameter", ylabel="η")
            ax.legend(fontsize=6, markerscale=3)
        for ax in list(axes.flat)[len(devices):]:
            ax.axis("off")
        fig.suptitle(f"{family}: η vs its dominant shape parameter")
        fig.tight_layout()
        name = f"eta_{family}.png"
        save_figure(fig, out / name, dpi=80)
        plt.close(fig)
        names.append(name)
    return names
