"""Progress bars of the long commands (simulate, validate, calibrate, import): decided here, never in the library.

Library functions take `progress`, a tqdm-like factory: progress(iterable, total=, desc=, unit=) wraps what
they loop over, progress(total=, ...) gives a bar they update(n) and close(). This module hands them tqdm
writing to stderr, or nothing with quiet=true (`--quiet`). tqdm's disable=None turns a bar off when stderr
is not a terminal, so logs, pipes and test output stay clean; `delay` hides the bar of work that ends sooner.
"""
from __future__ import annotations

import sys
from functools import partial


def progress_bars(cfg, delay: float = 1.0):
    """A tqdm factory for the command's bars, or None when cfg.quiet is true."""
    if cfg.get("quiet", False):
        return None
    from tqdm import tqdm

    return partial(tqdm, file=sys.stderr, disable=None, delay=delay, leave=False, dynamic_ncols=True)
