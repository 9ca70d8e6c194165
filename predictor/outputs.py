"""Writing outputs so that nothing is half-written, mixed with another run or silently replaced.

Every file goes to a temporary name in its own directory and is renamed into
place (a rename within one file system is atomic), so a reader sees the old
file or the new one, never a truncated one. A run's directory is built under a
hidden sibling and swapped in whole when the run completes; a run that dies
leaves the previous directory untouched and its staging folder marked
INCOMPLETE. A results table shared by many runs is only ever appended to.
Write failures (a full disk, a path under a file, no permission) are one
KernelsightError naming the path.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from kernelsight.predictor.errors import KernelsightError

if TYPE_CHECKING:  # pandas is imported where a frame is read or built: a plain simulation needs none
    import pandas as pd

MARKER = "INCOMPLETE"
TABLE_FORMATS = (".csv", ".parquet")


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def ensure_dir(path: Path, setting: str = "out", shown=None, create: bool = True) -> Path:
    """Create `path` (and its parents) as a directory, or say in one line why it cannot be.

    `shown` is the path the user gave, when `path` is only its folder. create=False only checks (a
    command that must leave no folder behind when it fails later)."""
    path = Path(path)
    shown = path if shown is None else shown
    for parent in (path, *path.parents):
        if parent.exists() and not parent.is_dir():
            raise KernelsightError(f"{setting}={shown}: {parent} is a file, not a directory")
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KernelsightError(f"{setting}={shown}: cannot create the directory {path}: {_why(e)}") from None
    return path


def file_path(path, setting: str = "out", formats: tuple[str, ...] | None = None, create: bool = False) -> Path:
    """`path` as a file that can be written (one of `formats` when given), or one line saying why not. Cheap
    and without side effects (create: also make its folder), so commands check their output paths before any
    work and a refused run leaves nothing behind."""
    path = Path(path)
    if formats is not None and path.suffix not in formats:
        raise KernelsightError(f"{setting}={path}: unknown format {path.suffix!r}; use a "
                               f"{' or '.join(formats)} file name")
    ensure_dir(path.parent, setting, shown=path, create=create)
    if path.is_dir():
        raise KernelsightError(f"{setting}={path}: is a directory, not a file")
    return path


@contextmanager
def atomic_file(path, setting: str = "out") -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block completes."""
    path = file_path(path, setting, create=True)
    tmp = _temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        full = " (disk full or file size limit)" if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) else ""
        raise KernelsightError(f"{setting}={path}: cannot write: {_why(e)}{full}; nothing was written") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _temp_path(path: Path, pid: int | None = None) -> Path:
    """This process's (or `pid`'s) hidden temporary file beside `path`."""
    return path.with_name(f".{path.name}.{os.getpid() if pid is None else pid}.tmp")


def write_text(path, text: str, setting: str = "out") -> Path:
    with atomic_file(path, setting) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path, obj, setting: str = "out", **dump_kwargs) -> Path:
    dump_kwargs.setdefault("indent", 1)
    dump_kwargs.setdefault("default", str)
    return write_text(path, json.dumps(obj, **dump_kwargs) + "\n", setting)


def write_table(df: pd.DataFrame, path, setting: str = "out", **to_csv_kwargs) -> Path:
    """A .csv or .parquet table, chosen by the file name."""
    path = file_path(path, setting, TABLE_FORMATS)
    with atomic_file(path, setting) as tmp:
        _table_to(df, tmp, path.suffix, **to_csv_kwargs)
    return path


def _table_to(df: pd.DataFrame, tmp: Path, suffix: str, **to_csv_kwargs) -> None:
    if suffix == ".csv":
        df.to_csv(tmp, index=False, **to_csv_kwargs)
    else:
        df.to_parquet(tmp, index=False)


def save_figure(fig, path, setting: str = "out", **savefig_kwargs) -> Path:
    """A matplotlib figure (format from the file name)."""
    path = Path(path)
    with atomic_file(path, setting) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **savefig_kwargs)
    return path


class RunDirectory:
    """A run's output directory, complete or not there at all.

    The run writes into a hidden staging folder beside `path` that holds an
    INCOMPLETE marker saying what was started; `commit()` removes the marker
    and swaps the folder in place of `path`. An existing non-empty `path` is
    refused unless `overwrite`, so two runs are never mixed; staging folders
    of dead processes are removed on the next run.
    """

    def __init__(self, path, what: str, overwrite: bool = False, setting: str = "output_dir"):
        self.path = Path(path)
        self.what = what
        self.setting = setting
        if self.path.exists() and not self.path.is_dir():
            raise KernelsightError(f"{setting}={self.path}: is a file, not a directory")
        if self.path.is_dir() and any(self.path.iterdir()) and not overwrite:
            raise KernelsightError(f"{setting}={self.path}: not empty; pass overwrite=true to replace it, "
                                   f"or choose another directory")
        ensure_dir(self.path.parent, setting, shown=self.path, create=False)
        self.staging = self.path.with_name(f".{self.path.name}.partial-{os.getpid()}")

    def _remove_dead_staging(self) -> None:
        for old in self.path.parent.glob(f".{self.path.name}.partial-*"):
            if _dead(old.name.rsplit("-", 1)[-1]):
                shutil.rmtree(old, ignore_errors=True)

    def open(self) -> Path:
        """Create the staging folder with its INCOMPLETE marker; returns where the run writes."""
        self._remove_dead_staging()
        shutil.rmtree(self.staging, ignore_errors=True)
        ensure_dir(self.staging, self.setting)
        write_text(self.staging / MARKER, f"{self.what}\nstarted {time.strftime('%Y-%m-%d %H:%M:%S')} "
                   f"(pid {os.getpid()}); the run did not finish, so these files are partial\n", self.setting)
        return self.staging

    def commit(self) -> Path:
        """Swap the finished run in place of `path` (the previous content is removed only after)."""
        (self.staging / MARKER).unlink()
        old = self.path.with_name(f".{self.path.name}.old-{os.getpid()}")
        try:
            if self.path.exists():
                os.replace(self.path, old)
            os.replace(self.staging, self.path)
        except OSError as e:
            raise KernelsightError(f"{self.setting}={self.path}: cannot move the finished run into place: "
                                   f"{_why(e)}; it is in {self.staging}") from None
        shutil.rmtree(old, ignore_errors=True)
        return self.path

    def discard(self) -> None:
        """Drop the staging folder (the run failed or was interrupted); `path` is unchanged."""
        shutil.rmtree(self.staging, ignore_errors=True)


@contextmanager
def run_directory(path, what: str, overwrite: bool = False, setting: str = "output_dir") -> Iterator[Path]:
    """Yield a RunDirectory's staging folder: swapped in place of `path` when the block completes, dropped
    when it raises or is interrupted (`path` then stays as it was)."""
    run = RunDirectory(path, what, overwrite, setting)
    staging = run.open()
    try:
        yield staging
    except BaseException:
        run.discard()
        raise
    run.commit()


def _dead(pid: str) -> bool:
    """Whether `pid` (the digits of a file name) names a process that is gone."""
    return pid.isdigit() and not _alive(int(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _table_path(table, setting: str, create: bool = False) -> Path:
    """The .csv path of a results table (a name without suffix gets .csv); create: make its folder."""
    table = Path(table)
    if table.suffix not in ("", ".csv"):
        raise KernelsightError(f"{setting}={table}: a results table is a .csv file")
    table = table.with_suffix(".csv")
    ensure_dir(table.parent, setting, shown=table, create=create)
    return table


def results_table(table, key_columns: tuple[str, ...], setting: str = "results_table") -> tuple[Path, pd.DataFrame]:
    """The CSV path of a results table and the rows it holds (none yet: empty), or one line saying why
    it is not ours to append to. Cheap, so a command can check its table before any long work."""
    import pandas as pd

    table = _table_path(table, setting)
    twin = table.with_suffix(".parquet")
    if table.is_dir():
        raise KernelsightError(f"{setting}={table}: is a directory, not a file")
    if table.exists():
        try:
            old = pd.read_csv(table)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
            raise KernelsightError(f"{setting}={table}: exists and is not a readable results table "
                                   f"({type(e).__name__}); refusing to replace it") from None
        missing = [c for c in key_columns if c not in old.columns]
        if missing:
            raise KernelsightError(f"{setting}={table}: exists and is not a kernelsight results table "
                                   f"(no {', '.join(missing)} column); refusing to replace it")
        return table, old
    if twin.exists():
        raise KernelsightError(f"{setting}={twin}: exists without {table.name}; refusing to replace it")
    return table, pd.DataFrame()


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C back while the block runs: a SIGINT that came meanwhile gets the handler it would have had
    (KeyboardInterrupt) when the block ends. (A Python-level handler: it runs in the main thread whichever
    thread the signal reached; outside the main thread handlers cannot be set and the block runs as it is.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt


@contextmanager
def interrupts_latched() -> Iterator[Callable[[], None]]:
    """Yield a check that raises KeyboardInterrupt when Ctrl-C came since the block began, even where the
    KeyboardInterrupt raised for it was swallowed: torch.compile has bare `except:` clauses (Dynamo's guard
    building), so a Ctrl-C during a compile can vanish and a sweep would run on to the end. The handler
    raises as Python's own does; the check is for the caller's safe points. Outside the main thread, or where
    SIGINT is not Python's handler (ignored, default), the check never raises."""
    caught = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None

    def handler(signum, frame):
        caught.append(signum)
        previous(signum, frame)

    def check() -> None:
        if caught:
            raise KeyboardInterrupt

    if not callable(previous):
        yield lambda: None
        return
    signal.signal(signal.SIGINT, handler)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)


def _remove_dead_temps(path: Path) -> None:
    """Remove the temporary files of `path` (_temp_path's names) that a killed process left behind."""
    for old in path.parent.glob(_temp_path(path, "*").name):
        if _dead(old.name[len(path.name) + 2:-len(".tmp")]):
            old.unlink(missing_ok=True)


def _write_twins(table: Path, frame: pd.DataFrame, twin: Path, twin_frame: pd.DataFrame, setting: str) -> None:
    """Write a results table and its Parquet twin so that no interruption, not even SIGKILL, leaves the two
    disagreeing: both are written to temporary files, then the twin is removed and the two renamed into place,
    Ctrl-C held back meanwhile. A kill inside that leaves the table (old or new) without its twin, which the
    next append writes again; a kill while writing leaves a temporary file, which the next append removes."""
    staged, replacing = [], False
    try:
        for path, data in ((table, frame), (twin, twin_frame)):
            _remove_dead_temps(path)
            staged.append((_temp_path(path), path))
            _table_to(data, staged[-1][0], path.suffix)
        with _interrupts_deferred():
            replacing = True
            twin.unlink(missing_ok=True)
            for tmp, path in staged:
                os.replace(tmp, path)
    except OSError as e:
        full = " (disk full or file size limit)" if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) else ""
        kept = "its Parquet twin may be missing until the next append" if replacing else "nothing was written"
        raise KernelsightError(f"{setting}={table}: cannot write: {_why(e)}{full}; {kept}") from None
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def append_row(table, row: dict, key_columns: tuple[str, ...], setting: str = "results_table") -> Path:
    """Append one row to a CSV table shared by concurrent runs, and rewrite its Parquet twin.

    The table is ours when its header holds `key_columns`; any other existing
    file is refused, never replaced. Rows already there are kept (new columns
    are added, empty for old rows) under an exclusive lock, so concurrent jobs
    cannot lose each other's rows.
    """
    import pandas as pd

    table = _table_path(table, setting, create=True)
    twin = table.with_suffix(".parquet")
    lock_path = table.parent / f".{table.stem}.lock"
    first = not lock_path.exists()
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _, old = results_table(table, key_columns, setting)
            new = pd.DataFrame([row])
            frame = new if old.empty else pd.concat([old, new], ignore_index=True, sort=False)
            parquet = frame.astype({c: str for c in frame.columns if frame[c].dtype == object})
            _write_twins(table, frame, twin, parquet, setting)
        except BaseException:
            if first and not table.exists():  # the table's first row failed (a full disk): leave nothing behind
                lock_path.unlink(missing_ok=True)
            raise
    return table
