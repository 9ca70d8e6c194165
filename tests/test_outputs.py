"""The atomic output writer: whole files or none, whole run directories or none, append-only tables."""
import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.outputs import (MARKER, RunDirectory, append_row, atomic_file, write_json, write_table,
                                           write_text)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_text(tmp_path / "a.txt", "old")
    with pytest.raises(RuntimeError):
        with atomic_file(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_path_under_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(KernelsightError, match=r"out=.*file/sub/t.csv: .*file is a file, not a directory"):
        write_table(pd.DataFrame({"a": [1]}), tmp_path / "file" / "sub" / "t.csv")
    with pytest.raises(KernelsightError, match="unknown format '.txt'"):
        write_table(pd.DataFrame({"a": [1]}), tmp_path / "t.txt")


def test_a_full_disk_is_one_line_and_keeps_the_old_file(tmp_path):
    """A file-size limit (ulimit -f) fails the write with EFBIG: the old JSON stays whole."""
    path = tmp_path / "big.json"
    write_json(path, {"old": True})
    code = textwrap.dedent(f"""
        import resource
        from kernelsight.predictor.errors import KernelsightError
        from kernelsight.predictor.outputs import write_json
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            write_json({str(path)!r}, {{"x": "y" * 100000}})
        except KernelsightError as e:
            print(e)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "cannot write" in done.stdout and "nothing was written" in done.stdout, done.stderr
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json"]


def test_run_directory_is_swapped_in_whole(tmp_path):
    out = tmp_path / "run"
    run = RunDirectory(out, "kernelsight simulate test")
    staging = run.open()
    assert (staging / MARKER).exists() and not out.exists()
    (staging / "summary.json").write_text("{}")
    run.commit()
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_non_empty_directory_needs_overwrite_and_is_kept_when_a_run_fails(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("previous")
    with pytest.raises(KernelsightError, match="not empty; pass overwrite=true"):
        RunDirectory(out, "x")
    run = RunDirectory(out, "x", overwrite=True)
    (run.open() / "requests.parquet").write_text("partial")
    run.discard()
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == "previous"
    run = RunDirectory(out, "x", overwrite=True)
    (run.open() / "summary.json").write_text("new")
    run.commit()
    assert (out / "summary.json").read_text() == "new"


def test_a_dead_runs_staging_folder_is_cleared(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".run.partial-{int(dead.stdout)}"
    stale.mkdir()
    (stale / MARKER).write_text("x")
    RunDirectory(tmp_path / "run", "x").open()
    assert not stale.exists()
    assert (tmp_path / f".run.partial-{os.getpid()}" / MARKER).exists()


def test_results_table_is_appended_to_and_a_foreign_csv_is_refused(tmp_path):
    table = tmp_path / "runs.csv"
    append_row(table, {"model": "m", "hardware": "h", "ttft": 1.0}, ("model", "hardware"))
    append_row(table, {"model": "m", "hardware": "h2", "tpot": 2.0}, ("model", "hardware"))
    df = pd.read_csv(table)
    assert list(df["hardware"]) == ["h", "h2"] and df["tpot"].isna().tolist() == [True, False]
    assert len(pd.read_parquet(table.with_suffix(".parquet"))) == 2

    mine = tmp_path / "mine.csv"
    mine.write_text("a,b\n1,2\n")
    with pytest.raises(KernelsightError, match="not a kernelsight results table .*refusing to replace it"):
        append_row(mine, {"model": "m", "hardware": "h"}, ("model", "hardware"))
    assert mine.read_text() == "a,b\n1,2\n"
    assert not mine.with_suffix(".parquet").exists()


def test_ctrl_c_between_the_twin_tables_writes_waits_for_both(tmp_path):
    """A results table's CSV and Parquet twin are written together: Ctrl-C arriving between them is delivered
    once both are there."""
    import os
    import signal

    import pytest

    from kernelsight.predictor import outputs

    import threading
    import time

    threading.Thread(target=time.sleep, args=(1.0,), daemon=True).start()  # the signal may reach another thread
    written = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the runner ignores SIGINT
    try:
        with pytest.raises(KeyboardInterrupt):
            with outputs._interrupts_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                written.append("csv")
                written.append("parquet")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert written == ["csv", "parquet"]


@pytest.mark.parametrize("kill_at", ["writing the twin", "before the renames", "between the renames"])
def test_a_kill_while_appending_never_leaves_the_twins_disagreeing(tmp_path, kill_at):
    """SIGKILL-like death (os._exit: no clean-up runs) at each point of an append: the CSV holds the old rows
    or the new ones, the Parquet twin is absent or agrees with it; the next append removes the dead process's
    temporary files and writes both again."""
    from kernelsight.predictor import outputs

    table, keys = tmp_path / "runs.csv", ("model", "hardware")
    append_row(table, {"model": "m", "hardware": "h0"}, keys)
    pid = os.fork()
    if pid == 0:  # the appender that dies
        calls = {"table": 0, "replace": 0}
        table_to, replace = outputs._table_to, outputs.os.replace

        def dying_table_to(frame, tmp, suffix, **kw):
            calls["table"] += 1
            table_to(frame, tmp, suffix, **kw)
            if kill_at == "writing the twin" and calls["table"] == 2:
                os._exit(9)

        def dying_replace(src, dst):
            if kill_at == "before the renames" or calls["replace"] == 1:
                os._exit(9)
            calls["replace"] += 1
            replace(src, dst)

        outputs._table_to, outputs.os.replace = dying_table_to, dying_replace
        try:
            append_row(table, {"model": "m", "hardware": "h1"}, keys)
        finally:
            os._exit(0)  # not reached by a death
    assert os.waitpid(pid, 0)[1] >> 8 == 9
    csv = pd.read_csv(table)
    assert len(csv) in (1, 2)
    twin = table.with_suffix(".parquet")
    if twin.exists():
        assert len(pd.read_parquet(twin)) == len(csv), "the CSV and its Parquet twin disagree"
    assert [p.name for p in tmp_path.glob(".runs.*.tmp")], "the dead process left no temporary file: not killed mid-append"
    append_row(table, {"model": "m", "hardware": "h2"}, keys)
    assert len(pd.read_parquet(twin)) == len(pd.read_csv(table)) == len(csv) + 1
    assert not list(tmp_path.glob(".runs.*.tmp")), "the dead process's temporary files stayed"
