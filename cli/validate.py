"""`kernelsight validate [CSV]`: the simulator against real serving runs, in both η tiers.

conf/validate.yaml (`kernelsight validate --help`). The scoring is validate/
(score.py: simulate every row per tier and fit the host terms; context.py: the
report's sections); this module builds (and caches) the cross-device bundle,
writes the Markdown report, parity plots and the per-row table, prints the
headline and optionally rewrites the README's accuracy block. With
serve.run=... it scores our own `bench serve` runs instead (validate/serve.py).

Nothing is lost: the output paths and every row are checked before the first
row runs (a row that cannot run is refused, the others run), each simulated
row is kept beside the table as it finishes (validate/store.py), and the same
command run again reuses the rows kept with the same settings, after Ctrl-C or
a failed report alike. The report and table are written atomically.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from kernelsight.predictor.errors import KernelsightError, check_seed, whole_number
from kernelsight.predictor.outputs import file_path, write_text
from kernelsight.validate import report as rep
from kernelsight.validate import serving_error
from kernelsight.validate.context import report_context
from kernelsight.validate.cross_bundle import cross_bundle_settings, stale_reason
from kernelsight.validate.rows import default_csvs
from kernelsight.validate.run import Tier
from kernelsight.validate.score import Validation, excluded, load_validation, parse_tiers, refused_frame, score
from kernelsight.validate.serve import run_dirs, serve_report, validate_serve
from kernelsight.validate.store import RowStore, parts_dir

from . import on_interrupt
from .calibrate import publish
from .config import container
from .progress import progress_bars


def validate(cfg) -> pd.DataFrame:
    """Entry point of `kernelsight validate` (returns the per-row table)."""
    if cfg.serve.run:  # our own bench serve runs instead of a validation CSV
        return validate_serve_runs(cfg)
    start = time.perf_counter()
    processes = whole_number(cfg.jobs, "jobs", hint="worker processes")
    report_path, table = file_path(cfg.report, "report"), rep.table_path(cfg.table)
    if cfg.readme:
        rep.readme_markers(cfg.readme)
    v = _validation(cfg)
    for _, why in v.refused:
        print(f"kernelsight validate: refused: {why}", file=sys.stderr)
    tiers = _tiers(cfg, v.devices)
    store = RowStore(parts_dir(table))
    # a row runs once per tier, and once per frontend candidate in the first tier (fit.frontend)
    with on_interrupt(lambda: f"{store.kept} simulated row{'s' * (store.kept != 1)} kept in {store.folder}/; run "
                              f"the same command again to continue"):
        df, scores = score(v, tiers, processes, progress_bars(cfg), store, bool(cfg.intervals))
        if store.reused:
            print(f"reused {store.reused} of {store.kept} rows simulated earlier with the same settings "
                  f"({store.folder}/)")
        rows = pd.concat([df.assign(refused=""), refused_frame(v)], ignore_index=True)  # refused rows last
        try:
            head = _write_report(cfg, v, df, rows, tiers, scores, report_path, table, start)
        except KernelsightError as e:
            raise KernelsightError(f"{e}; the {store.kept} simulated rows are kept in {store.folder}/ (the same "
                                   f"command reuses them)") from None
    if cfg.readme:
        changed = rep.rewrite_readme(cfg.readme, rep.readme_block(head))
        print(f"{cfg.readme}: accuracy block {'rewritten' if changed else 'unchanged'}")
    return rows


def _write_report(cfg, v: Validation, df: pd.DataFrame, rows: pd.DataFrame, tiers, scores, report_path: Path,
                  table: Path, start: float) -> pd.DataFrame:
    """Plots, the per-row table (`rows`: the scored rows and the refused ones with their reason) and the
    report; prints the headline and warnings; returns the headline."""
    head = rep.headline(df)
    plots = _parity_plots(df, tiers, report_path) if cfg.plots else {}
    rep.write_rows_table(rows, table)
    context = report_context(v, df, tiers, scores, table, time.perf_counter() - start)
    write_text(report_path, rep.markdown_report(df, head, context, plots), "report")
    print(rep._md(head.assign(kind=head["kind"].map(rep.KINDS)).rename(columns=rep.METRIC_NAMES)))
    covered = serving_error.coverage(df).set_index(["tier", "metric"]).drop(columns="rows")
    if not covered.empty:
        print("measured inside the simulated 80 % range, held out: " + "; ".join(
            f"{tier} {metric} " + ", ".join(f"{name.removesuffix(' %')} {x:.0f} %"
                                            for name, x in values.items() if x == x)
            for (tier, metric), values in covered.iterrows()))
    for (tier, _), s in zip(tiers, scores):
        for message in s.warnings:  # one line per family the bundle does not cover
            print(f"kernelsight validate: warning ({tier.name} tier): {message}", file=sys.stderr)
    refused = f", {len(v.refused)} rows refused" if v.refused else ""
    print(f"report: {report_path}  table: {table}  ({time.perf_counter() - start:.0f} s{refused})")
    return head


def _validation(cfg) -> Validation:
    """The CSV's rows, models, engine profile and protocol of the composed config."""
    raw = container(cfg.csv)
    csvs = default_csvs() if raw is None else [Path(c) for c in (raw if isinstance(raw, list) else [raw])]
    return load_validation(csvs, container(cfg.rows), container(cfg.models), container(cfg.engine),
                           container(cfg.protocol), cfg.seed, container(cfg.fit))


def _tiers(cfg, devices) -> list[tuple[Tier, dict]]:
    """The configured tiers; a tier fitted without some GPUs gets its bundle per validated GPU built (or reused
    from the cache)."""
    tiers = parse_tiers(container(cfg.tiers))
    for tier, exclude in tiers:
        if exclude:
            for device in devices:
                ensure_cross_bundle(tier.on(device).bundle, excluded(exclude, device), check_seed(cfg.seed),
                                    progress_bars(cfg))
    return tiers


def ensure_cross_bundle(path: str, exclude: list[str], seed: int, progress=None) -> str:
    """The cross-device bundle at `path`: `calibrate publish` on every calibration GPU except `exclude`, built
    once (minutes) and rebuilt when the cached one is stale (validate/cross_bundle.py). progress: bars over
    the fits, or None."""
    settings = cross_bundle_settings(path, exclude, seed)
    stale = stale_reason(settings)
    if stale == "":
        return path
    print(f"kernelsight validate: building the cross-device η bundle without {', '.join(exclude)} at {path} "
          f"({stale}; several minutes)", file=sys.stderr)
    publish(settings, progress)
    return path


def _parity_plots(df: pd.DataFrame, tiers, report_path: Path) -> dict:
    """One held-out parity plot per tier beside the report; tier -> file name."""
    plots = {}
    for tier, _ in tiers:
        path = report_path.with_name(f"{report_path.stem}_parity_{tier.name}.png")
        rep.parity_plot(df, tier.name, "heldout", path)
        plots[tier.name] = path.name
    return plots


def validate_serve_runs(cfg) -> pd.DataFrame:
    """`kernelsight validate serve.run=DIR|[DIR,...]|all engine=transformers_cb`: score, report, write the table."""
    start = time.perf_counter()
    engine_map, serve = container(cfg.engine), container(cfg.serve)
    rep.table_path(serve["table"], "serve.table")
    file_path(serve["report"], "serve.report")
    if engine_map.get("engine") != "transformers":
        raise KernelsightError(f"serve.run: bench serve runs are transformers' continuous batching; pass "
                               f"engine=transformers_cb (got engine profile {engine_map.get('name')!r})")
    target = container(cfg.tiers).get("target") or {}
    tier = {"tier": str(target.get("predictor_tier", "auto")), "bundle": target.get("bundle")}
    params, metrics = list(serve["fit"]["params"]), list(serve["fit"]["metrics"])
    runs = run_dirs(serve["run"])
    df, fits = validate_serve(runs, engine_map, tier, params, metrics, progress_bars(cfg))
    table = rep.write_rows_table(df, serve["table"], "serve.table")
    lines = serve_report(df, fits, runs, engine_map["name"], tier, params, metrics, table,
                         time.perf_counter() - start)
    report = write_text(serve["report"], "\n".join(lines) + "\n", "serve.report")
    print("\n".join(lines[6:]))
    print(f"report: {report}  table: {table}")
    return df
