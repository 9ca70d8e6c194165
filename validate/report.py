"""Validation report: per-row errors, summaries per model / TP / concurrency band, parity plots,
the Markdown report and the README accuracy block.

Errors are percentages of the measurement: signed = 100 (predicted / measured - 1),
absolute = |signed|. Every summary is given for the held-out predictions (host
terms fitted leave-one-model-out) and for the simulation with the shipped engine
profile (whose host terms were fitted on every row: in-sample).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.outputs import TABLE_FORMATS, file_path, save_figure, write_table, write_text

METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "throughput": "throughput"}
KINDS = {"heldout": "held-out (host terms fitted leave-one-model-out)",
         "simulated": "shipped profile (host terms fitted on all rows: in-sample)"}
# Per validation set and tier: the seed paper's median absolute errors (%), on the dense set only, and this
# project's targets (dense set: issue 6; MoE set: issue 27, target tier only).
SEED_PAPER = {"vllm_dev": {"target": {"tpot": 6.2, "ttft": 14.3, "throughput": 2.7},
                           "cross": {"tpot": 12.8, "ttft": 15.4, "throughput": 3.0}}}
TARGETS = {"vllm_dev": {"target": {"tpot": 6.0, "ttft": 12.0, "throughput": 3.0},
                        "cross": {"tpot": 12.0, "ttft": 15.0, "throughput": 5.0}},
           "vllm_moe_dev": {"target": {"tpot": 8.0, "ttft": 15.0, "throughput": 8.0}}}
TIER_TITLES = {"target": "target (η with the GPU's own kernel data)",
               "cross": "cross-device (η without any measurement of the row's GPU)",
               "cross_no_sibling": "cross-device, no die sibling (η without the row's GPU or any GPU of its die)"}
README_START, README_END = "<!-- accuracy:start -->", "<!-- accuracy:end -->"


# A row queues on KV capacity when its measured TTFT exceeds this many times its model's median.
QUEUEING_FACTOR = 10


def queueing(ttft, labels) -> np.ndarray:
    """Per row: measured TTFT (ms) above QUEUEING_FACTOR x the median of its model's rows (`labels`): the
    engine queued the request for KV capacity, and waiting, not the serving path, makes its TTFT."""
    ttft = pd.Series(np.asarray(ttft, dtype=float))
    return (ttft > QUEUEING_FACTOR * ttft.groupby(np.asarray(labels)).transform("median")).to_numpy()


def trio(d: dict) -> str:
    """'TPOT / TTFT / throughput' of a {metric: %} mapping."""
    return " / ".join(f"{d[m]:g}" for m in ("tpot", "ttft", "throughput")) if d else "n/a"


def add_errors(df: pd.DataFrame, metrics=METRIC_NAMES, kinds=KINDS) -> pd.DataFrame:
    """Signed and absolute % errors of every (metric, kind) prediction column present."""
    df = df.copy()
    for metric in metrics:
        for kind in kinds:
            col = f"{metric}_{kind}"
            if col in df:
                df[f"err_{metric}_{kind}"] = 100.0 * (df[col] / df[metric] - 1.0)
                df[f"abs_{metric}_{kind}"] = df[f"err_{metric}_{kind}"].abs()
    return df


def summary(df: pd.DataFrame, by: list[str], kind: str) -> pd.DataFrame:
    """Per group: rows, and per metric the median signed, median absolute and mean absolute % error."""
    rows = []
    for key, g in df.groupby(by, sort=True) if by else [((), df)]:
        out = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        out["rows"] = len(g)
        for metric, name in METRIC_NAMES.items():
            out[f"{name} median"] = g[f"err_{metric}_{kind}"].median()
            out[f"{name} median |e|"] = g[f"abs_{metric}_{kind}"].median()
            out[f"{name} MAPE"] = g[f"abs_{metric}_{kind}"].mean()
        rows.append(out)
    return pd.DataFrame(rows)


def headline(df: pd.DataFrame) -> pd.DataFrame:
    """Median absolute % error per validation set, tier and prediction kind (the README table)."""
    rows = []
    sets = df["set"].unique() if "set" in df else [""]
    for (s, tier, kind) in [(s, t, k) for s in sets for t in df["tier"].unique() for k in KINDS]:
        g = df[(df["tier"] == tier) & ((df["set"] == s) if "set" in df else True)]
        rows.append({"set": s, "tier": tier, "kind": kind, "rows": len(g),
                     **{m: g[f"abs_{m}_{kind}"].median() for m in METRIC_NAMES}})
    return pd.DataFrame(rows)


def _md(df: pd.DataFrame, digits: int = 1) -> str:
    """A pandas frame as a GitHub Markdown table (no tabulate dependency)."""
    def cell(x):
        if isinstance(x, (float, np.floating)):
            return "" if np.isnan(x) else f"{x:.{digits}f}"
        return str(x)

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(x) for x in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def readme_block(head: pd.DataFrame) -> str:
    """The accuracy section between the README markers: held-out medians next to the paper and targets."""
    lines = [README_START,
             "Median absolute error (%) per validation set: data/validation/vllm_dev.csv (dense models, real vLLM "
             "runs on H100 SXM) and vllm_moe_dev.csv (mixture-of-experts models on H100 and H200 SXM); host terms "
             "of the engine profile scored leave-one-model-out. Regenerate with "
             "`kernelsight validate readme=README.md`; details in reports/validation.md.", "",
             "| set | tier | rows | TPOT | TTFT | throughput | seed paper (TPOT / TTFT / thr.) | target "
             "(TPOT / TTFT / thr.) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in head[head["kind"] == "heldout"].itertuples(index=False):
        paper, target = SEED_PAPER.get(r.set, {}).get(r.tier, {}), TARGETS.get(r.set, {}).get(r.tier, {})
        lines.append(f"| {r.set} | {TIER_TITLES.get(r.tier, r.tier)} | {r.rows} | {r.tpot:.1f} | {r.ttft:.1f} | "
                     f"{r.throughput:.1f} | {trio(paper)} | {'<= ' + trio(target) if target else 'n/a'} |")
    lines.append(README_END)
    return "\n".join(lines)


def readme_markers(path: str | Path) -> tuple[str, int, int]:
    """(text, start, end) of a README with the accuracy markers, or one line saying why not (cheap: checked
    before any row is simulated)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KernelsightError(f"readme={path}: cannot read: {exc.strerror or exc}") from None
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise KernelsightError(f"readme={path}: no '{README_START}' ... '{README_END}' markers to rewrite")
    return text, start, end


def rewrite_readme(path: str | Path, block: str) -> bool:
    """Replace the text between the accuracy markers of `path` by `block`; True if the file changed."""
    text, start, end = readme_markers(path)
    new = text[:start] + block + text[end + len(README_END):]
    if new == text:
        return False
    write_text(path, new, "readme")
    return True


def parity_plot(df: pd.DataFrame, tier: str, kind: str, path: Path) -> Path:
    """Predicted vs measured TTFT, TPOT and throughput (log-log), one colour per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = df[df["tier"] == tier]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    units = {"ttft": "ms", "tpot": "ms", "throughput": "tokens/s"}
    for ax, (metric, name) in zip(axes, METRIC_NAMES.items()):
        for model, part in g.groupby("model_label", sort=True):
            ax.scatter(part[metric], part[f"{metric}_{kind}"], s=14, label=model, alpha=0.8)
        lo = float(np.nanmin([g[metric].min(), g[f"{metric}_{kind}"].min()])) * 0.8
        hi = float(np.nanmax([g[metric].max(), g[f"{metric}_{kind}"].max()])) * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.8, 1.25):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {name} ({units[metric]})")
        ax.set_ylabel(f"predicted {name} ({units[metric]})")
        ax.set_title(f"{name}: median |e| {g[f'abs_{metric}_{kind}'].median():.1f}%")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{TIER_TITLES.get(tier, tier)}: {KINDS[kind]} (dotted: ±25%)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, "report", dpi=110)
    plt.close(fig)
    return path


ROW_TABLE_FORMATS = (*TABLE_FORMATS, ".json")


def table_path(path: str | Path, setting: str = "table") -> Path:
    """The per-row table's path, checked before any row is simulated (.csv, .parquet or .json records)."""
    return file_path(path, setting, ROW_TABLE_FORMATS)


def write_rows_table(df: pd.DataFrame, path: str | Path, setting: str = "table") -> Path:
    """The per-row table as CSV, Parquet or JSON (records), by the file suffix, written atomically."""
    path = table_path(path, setting)
    if path.suffix == ".json":
        return write_text(path, df.to_json(orient="records", indent=1, double_precision=6) + "\n", setting)
    return write_table(df, path, setting, float_format="%.6g")  # (the float format applies to CSV)


def references(name: str) -> str:
    """The seed paper's figures and this project's targets for one validation set, as a report line."""
    paper = SEED_PAPER.get(name)
    seed = ", ".join(f"{tier} tier {trio(v)} %" for tier, v in paper.items()) if paper else "n/a (it has no such set)"
    targets = ", ".join(f"{tier} tier <= {trio(v)} %" for tier, v in TARGETS[name].items())
    return f"{name}: seed paper {seed}; targets {targets} (TPOT / TTFT / throughput)."


def markdown_report(df: pd.DataFrame, head: pd.DataFrame, context: dict, plots: dict) -> str:
    """The full Markdown report; context carries the run's settings, fits and timings (see context.py)."""
    out = [f"# End-to-end validation: {context['csv']}", "",
           f"{context['rows']} real vLLM serving runs simulated with kernelsight (`kernelsight validate`). "
           f"Errors are 100 x (predicted / measured - 1); medians are of absolute errors unless marked signed.", ""]
    out += ["## Headline: median absolute error (%)", "",
            _md(head.assign(kind=head["kind"].map(KINDS)).rename(columns=METRIC_NAMES)), "",
            *[references(name) for name in dict.fromkeys(head["set"]) if name in TARGETS], ""]
    out += ["## 80 % ranges: measured values inside the simulated range", ""] + context["intervals"] + [""]
    out += ["## Protocol", ""] + [f"- {line}" for line in context["protocol"]] + [""]
    for tier in df["tier"].unique():
        g = df[df["tier"] == tier]
        out += [f"## Tier: {TIER_TITLES.get(tier, tier)}", ""]
        for by, title in ((["model_label"], "per model"), (["model_label", "layout"], "per model and layout"),
                          (["device", "model_label", "layout"], "per GPU, model and layout"),
                          (["band"], "per concurrency band")):
            out += [f"### Held-out errors {title}", "", _md(summary(g, by, "heldout")), ""]
        if tier in plots:
            out += [f"![parity {tier}]({plots[tier]})", ""]
    if context.get("refused"):
        out += ["## Refused rows", "", "Rows that cannot be simulated (not scored; the `refused` column of the "
                "per-row table):", ""] + [f"- {line}" for line in context["refused"]] + [""]
    out += ["## Composition model", ""] + context["composition"] + [""]
    out += ["## Error structure", ""] + context["structure"] + [""]
    out += ["## Largest TTFT and TPOT errors (held-out, first tier)", ""]
    first = df[df["tier"] == df["tier"].iloc[0]]
    cols = ["set", "line", "model_label", "layout", "concurrency", "isl", "osl", "ttft", "ttft_heldout", "err_ttft_heldout",
            "tpot", "tpot_heldout", "err_tpot_heldout", "tpot_floor"]
    for metric in ("ttft", "tpot"):
        worst = first.reindex(first[f"abs_{metric}_heldout"].sort_values(ascending=False).index).head(8)
        out += [_md(worst[cols]), ""]
    out += ["## Run", ""] + [f"- {line}" for line in context["run"]] + [""]
    return "\n".join(out)
