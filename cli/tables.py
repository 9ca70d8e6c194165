"""Terminal tables of the commands: aligned columns on screen (files go through predictor/outputs.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd


def format_table(df: pd.DataFrame) -> str:
    """Aligned columns: text left, numbers right with precision chosen per magnitude."""
    if df.empty:
        return "(no rows)"
    columns = list(df.columns)
    cells = [[str(c) for c in columns]]
    numeric = {c: pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in columns}
    for _, row in df.iterrows():
        cells.append([_cell(row[c], numeric[c]) for c in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for r in cells:
        parts = [r[i].rjust(widths[i]) if numeric[columns[i]] else r[i].ljust(widths[i]) for i in range(len(columns))]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value, numeric: bool) -> str:
    if not numeric:
        return "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)
    if value is None or pd.isna(value):
        return "-"
    x = float(value)
    if x.is_integer() and abs(x) < 1e9:
        return f"{int(x):,}"
    magnitude = abs(x)
    if magnitude >= 100:
        return f"{x:,.0f}"
    if magnitude >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"
