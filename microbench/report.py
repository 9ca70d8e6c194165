"""What a sweep says: a roofline plot, η per family against its dominant shape parameter, a summary table.

η = measured latency / roofline latency of the device's catalog entry
(predictor.roofline, one definition; collectives use their latency-bandwidth
bound). Only 'ok' rows count. The roofline plot shows achieved FLOP/s against
arithmetic intensity under the ceilings min(peak(dtype), AI x bandwidth);
rows with no FLOPs (copies such as a bf16 KV write) and collectives have no
point there but do have an η.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import REGISTRY
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.outputs import ensure_dir, save_figure, write_text
from kernelsight.predictor.roofline import roofline_frame
from kernelsight.predictor.sweep import read_sweep


def eta_frame(df: pd.DataFrame, hw) -> pd.DataFrame:
    """The ok rows with their roofline columns and eta = latency / t_roof."""
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        raise KernelsightError("the sweep has no 'ok' rows to report on")
    roof = roofline_frame(ok, hw)
    ok["t_roof_s"] = roof["t_roof"].astype(float)
    ok["eta"] = ok["latency_ms"].astype(float) / 1e3 / ok["t_roof_s"]
    ok["intensity"] = ok["flops"] / ok["bytes"]
    ok["achieved_flops"] = ok["flops"] / (ok["latency_ms"].astype(float) / 1e3)
    return ok


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Median, p10 and p90 of eta and the row count per family and provider."""
    g = frame.groupby(["family", "provider"], sort=True)["eta"]
    return pd.DataFrame({"rows": g.size(), "median_eta": g.median(), "p10_eta": g.quantile(0.1),
                         "p90_eta": g.quantile(0.9)}).reset_index()


def markdown(table: pd.DataFrame, title: str) -> str:
    lines = [f"# {title}", "", "| family | provider | rows | median η | p10 η | p90 η |", "|---|---|---:|---:|---:|---:|"]
    for r in table.itertuples(index=False):
        lines.append(f"| {r.family} | {r.provider} | {r.rows} | {r.median_eta:.3g} | {r.p10_eta:.3g} | {r.p90_eta:.3g} |")
    return "\n".join(lines) + "\n"


def plot_roofline(frame: pd.DataFrame, hw, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = frame[(frame["flops"] > 0) & (frame["bytes"] > 0) & frame["family"].map(lambda f: REGISTRY[f].unit != "link")]
    fig, ax = plt.subplots(figsize=(9, 6))
    ai = np.logspace(-2, 4, 200)
    dtypes = {"fp32"} | {d for d, fam in zip(pts["dtype"], pts["family"]) if REGISTRY[fam].unit == "tensor"}
    for dtype in sorted(dtypes):
        if hw.peak_tflops.get(dtype):
            peak = hw.peak_flops(dtype)
            label = "fp32 (vector)" if dtype == "fp32" else dtype
            ax.plot(ai, np.minimum(peak, ai * hw.mem_bw), lw=1.2, label=f"roofline {label}")
    for family, part in pts.groupby("family"):
        ax.scatter(part["intensity"], part["achieved_flops"], s=12, alpha=0.7, label=family)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="achieved FLOP/s",
           title=f"{hw.name}: measured kernels under the roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_eta(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted(frame["family"].unique())
    cols = min(3, len(families))
    rows = -(-len(families) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families):
        dominant = REGISTRY[family].dominant
        for provider, part in frame[frame["family"] == family].groupby("provider"):
            ax.scatter(part[dominant].astype(float), part["eta"], s=12, alpha=0.7, label=provider)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel=dominant, ylabel="η = measured / roofline", title=family)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(families):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def write_report(sweep, out, hardware: str | None = None) -> dict:
    """Read a sweep, write roofline.png, eta.png and summary.md into `out`; returns paths and the table."""
    out = ensure_dir(Path(out), "out", create=False)  # checked now, made by the first write
    df = read_sweep(sweep)
    devices = sorted(df["device"].unique())
    if len(devices) != 1:
        raise KernelsightError(f"{sweep}: rows of several devices ({', '.join(devices)}); report one device")
    if hardware is None and devices[0] == "cpu":
        raise KernelsightError(f"{sweep}: measured in CPU mode, which has no catalog roofline; pass "
                               f"hardware=<catalog key> to report against one")
    hw = load_hardware(hardware or devices[0])
    frame = eta_frame(df, hw)
    table = summary_table(frame)
    paths = {"roofline": out / "roofline.png", "eta": out / "eta.png", "summary": out / "summary.md"}
    plot_roofline(frame, hw, paths["roofline"])
    plot_eta(frame, paths["eta"])
    write_text(paths["summary"], markdown(table, f"η per family: {sweep} on {hw.key} ({len(frame)} ok rows)"))
    return {"paths": paths, "table": table, "hardware": hw.key}
