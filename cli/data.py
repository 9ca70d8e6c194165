"""`kernelsight import` (convert public reference data into the sweep contract) and `kernelsight data`
(rows of committed data per device and family). Configs: conf/import.yaml and conf/data.yaml."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from kernelsight.calibrate.importers.common import format_report, write_public
from kernelsight.calibrate.importers.datasets import IMPORTERS, convert_datasets, count_rows, data_roots
from kernelsight.predictor.outputs import ensure_dir

from .progress import progress_bars


def import_dataset(cfg) -> pd.DataFrame:
    """Convert one dataset (or all) into <out>/<dataset>/; print and return the kept/flagged/rejected report.

    Every requested dataset is converted before anything is written, so a bad
    input leaves the output folder as it was.
    """
    out = ensure_dir(Path(str(cfg.out)), "out", create=False)  # a bad out= is refused before the conversion
    converted = convert_datasets(str(cfg.dataset), Path(str(cfg.src)), progress_bars(cfg))
    reports = []
    for name, result, seconds in converted:
        start = time.perf_counter()
        files = write_public(result, out, IMPORTERS[name].CONVERSION)
        size = sum(f.stat().st_size for f in files) / 2**20
        print(format_report(result))
        print(f"wrote {len(files)} files ({size:.1f} MiB) to {out / name} "
              f"[convert {seconds:.1f} s, write {time.perf_counter() - start:.1f} s]\n")
        reports.append(result.report())
    return pd.concat(reports, ignore_index=True)


def data_summary(cfg) -> pd.DataFrame:
    """Rows per device and family (ok / flagged / total) in the committed data or in `path`."""
    roots = data_roots(cfg.get("path"))
    summary = count_rows(roots)
    print(f"rows in {', '.join(map(str, roots))}")
    print(summary.to_string(index=False))
    return summary
