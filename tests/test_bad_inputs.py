"""A corpus of bad inputs, each run through the CLI: exit code 2, one line on stderr, no traceback, nothing written.

Every case runs `kernelsight <command> ...` in process (cli.main) in an empty working directory that holds only
the fixture files the case names ({name} in its arguments: a text file named .parquet, a truncated Parquet file,
a foreign CSV, a plain file where a directory is expected, ...) plus one unrelated file. The directory is
snapshotted (every path and its bytes) before the run and must be identical after it: a refused run writes
nothing and changes nothing. The one line must name what was wrong (the setting or the file: `expect`).

Cases are grouped by command; each group crosses the command's settings with bad values (negative, zero where
invalid, a bool, a float, a word, null where required), unknown config choices and keys, missing, empty and
corrupt input files and output paths that cannot be written. Settings are checked before any work, so every
case is quick; a case that is not refused runs its command on a tiny input (the `BASE` settings) and fails.
The corpus itself (CASES, BASE) is in tests/bad_input_cases.py.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelsight.predictor.paths import data_dir

from bad_input_cases import CASES, REPO, SHARED_DATA, SWEEP_DIR, VALIDATION_EDITS

VALIDATION_CSV = data_dir() / "validation" / "vllm_dev.csv"


# ---------------------------------------------------------------------------------------------------------------
# Fixture files: {name} in a case's arguments is the absolute path of tmp_path/name, built on first use.

FIXTURES = {}


def fixture(*names):
    def register(build):
        for name in names:
            FIXTURES[name] = build
        return build
    return register


def _shard():
    import pyarrow.parquet as pq

    return pq.read_table(sorted(SWEEP_DIR.glob("*.parquet"))[0])


def _write_sweep(path: Path, edit) -> None:
    """A copy of a committed shard (its schema metadata kept), edited as pandas rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _shard()
    df = edit(table.to_pandas())
    schema = table.schema
    if list(df.columns) != schema.names:
        schema = pa.schema([schema.field(c) for c in df.columns], metadata=schema.metadata)
    pq.write_table(pa.Table.from_pandas(df, schema=schema, preserve_index=False), path)


def _set(df, row, column, value):
    df = df.copy()
    df[column] = df[column].astype(object)
    df.loc[row, column] = value
    return df


@fixture("afile")
def _afile(path):
    path.write_text("a plain file, where a directory is expected\n")


@fixture("foreign.csv")
def _foreign(path):
    path.write_text("name,score\nalice,1\nbob,2\n")  # someone's own table: results_table= must not touch it


@fixture("text.parquet")
def _text_parquet(path):
    path.write_text("this is a text file, not Parquet\n")


@fixture("empty.parquet")
def _empty(path):
    path.write_bytes(b"")


@fixture("trunc.parquet")
def _trunc(path):
    data = sorted(SWEEP_DIR.glob("*.parquet"))[0].read_bytes()
    path.write_bytes(data[: len(data) // 2])


@fixture("good.parquet")
def _good(path):
    _write_sweep(path, lambda df: df.head(6))


@fixture("zero_rows.parquet")
def _zero_rows(path):
    _write_sweep(path, lambda df: df.head(0))


@fixture("nocol.parquet")
def _nocol(path):
    _write_sweep(path, lambda df: df.head(6).drop(columns=["family"]))


@fixture("baddevice.parquet")
def _bad_device(path):
    _write_sweep(path, lambda df: _set(df.head(6), 3, "device", "h100_sxmm"))


@fixture("badfamily.parquet")
def _bad_family(path):
    _write_sweep(path, lambda df: _set(df.head(6), 3, "family", "gemmm"))


@fixture("emptydir", "sweepsdir", "servedir")
def _dir(path):
    path.mkdir()


@fixture("prev_run")
def _prev_run(path):
    path.mkdir()
    (path / "summary.json").write_text('{"previous": "run"}\n')


# Traces (workload=trace workload.trace_file=...): CSV and JSONL.
TRACE_HEADER = "arrival_time,input_len,output_len\n"
TRACES = {
    "t_empty.csv": "",
    "t_header.csv": TRACE_HEADER,
    "t_nocol.csv": "arrival_time,input_len\n0.0,100\n0.5,200\n",
    "t_neg.csv": TRACE_HEADER + "0.0,100,10\n0.5,-5,10\n1.0,100,10\n",
    "t_text.csv": TRACE_HEADER + "0.0,100,10\n0.5,abc,10\n1.0,100,10\n",
    "t_blank.csv": TRACE_HEADER + "0.0,100,10\n0.5,,10\n1.0,100,10\n",
    "t_zero_out.csv": TRACE_HEADER + "0.0,100,10\n0.5,100,0\n",
    "t_decreasing.csv": TRACE_HEADER + "0.0,100,10\n2.0,100,10\n1.0,100,10\n",
    "t_bad.jsonl": '{"arrival_time": 0.0, "input_len": 100, "output_len": 10}\n{"arrival_time": 0.5, oops\n',
    "t_trace.txt": TRACE_HEADER + "0.0,100,10\n",
}


@fixture(*TRACES)
def _trace(path):
    path.write_text(TRACES[path.name])


# Validation CSVs (validate csv=...): the first rows of the shipped development set, one of them broken.
def _validation_rows(n: int) -> tuple[list[str], list[dict]]:
    with open(VALIDATION_CSV, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), [row for _, row in zip(range(n), reader)]


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    out = io.StringIO()
    writer = csv.DictWriter(out, fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue())


@fixture("v.csv")
def _validation_good(path):
    fields, rows = _validation_rows(2)
    _write_csv(path, fields, rows)


@fixture(*VALIDATION_EDITS)
def _validation_bad(path):
    fields, rows = _validation_rows(1)
    column, value = VALIDATION_EDITS[path.name]
    rows[0][column] = value
    _write_csv(path, fields, rows)


@fixture("v_empty.csv")
def _validation_empty(path):
    path.write_bytes(b"")


@fixture("v_header.csv")
def _validation_header(path):
    _write_csv(path, _validation_rows(0)[0], [])


@fixture("v_nocol.csv")
def _validation_nocol(path):
    fields, rows = _validation_rows(1)
    _write_csv(path, [f for f in fields if f != "tpot_ms"], rows)


# Hugging Face config.json files (bench serve model.hf_config=...).
HF_EDITS = {"neg_layers_config.json": ("num_hidden_layers", -4), "zero_hidden_config.json": ("hidden_size", 0),
            "str_layers_config.json": ("num_hidden_layers", "thirty-two")}


@fixture(*HF_EDITS)
def _hf_config(path):
    raw = json.loads((REPO / "conf" / "model" / "hf" / "meta-llama--Meta-Llama-3.1-8B_config.json").read_text())
    key, value = HF_EDITS[path.name]
    raw[key] = value
    path.write_text(json.dumps(raw, indent=1))


@fixture("bad_json_config.json")
def _hf_bad_json(path):
    path.write_text('{"model_type": "llama", "num_hidden_layers": 32,\n')


# η bundles (predict bundle=...): a copy of the shipped one (hard links where the file system allows), tampered.
SHIPPED_BUNDLE = data_dir() / "artifacts" / "default"


def _link_tree(src: Path, dest: Path, replace: dict | None = None) -> None:
    """dest as a copy of src: hard links (copies across file systems); replace: relative path -> new bytes."""
    replace = replace or {}
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        target = dest / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif rel in replace:
            target.write_bytes(replace[rel])
        else:
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)


def _bundle_copy(path: Path, edit=None, recompute_id=False, replace=None, manifest_text=None) -> None:
    path.mkdir()
    _link_tree(SHIPPED_BUNDLE / "models", path / "models", replace)
    if manifest_text is not None:
        (path / "manifest.json").write_text(manifest_text)
        return
    manifest = json.loads((SHIPPED_BUNDLE / "manifest.json").read_text())
    if edit:
        edit(manifest)
    if recompute_id:
        from kernelsight.predictor.bundle import content_id

        manifest["content_id"] = content_id(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _h100_gemm_is_a100(manifest):
    """The reported fault: target/h100_sxm/gemm points at the A100 model files."""
    entry = manifest["models"]["target/h100_sxm/gemm"]
    entry["model"] = entry["model"].replace("h100_sxm", "a100_sxm")
    entry["card"] = entry["card"].replace("h100_sxm", "a100_sxm")


@fixture("bundle_swapped")
def _bundle_swapped(path):
    _bundle_copy(path, _h100_gemm_is_a100)


@fixture("bundle_swapped_id")
def _bundle_swapped_id(path):
    """The same, with the manifest's content_id recomputed, as a re-publish with a bug would leave it."""
    _bundle_copy(path, _h100_gemm_is_a100, recompute_id=True)


@fixture("bundle_badjson")
def _bundle_badjson(path):
    _bundle_copy(path, manifest_text='{"format": "kernelsight.eta-bundle", ')


@fixture("bundle_hash")
def _bundle_hash(path):
    """The h100_sxm gemm model file edited after publishing: its bytes no longer match the manifest's sha256."""
    manifest = json.loads((SHIPPED_BUNDLE / "manifest.json").read_text())
    rel = manifest["models"]["target/h100_sxm/gemm"]["model"].removeprefix("models/")
    _bundle_copy(path, replace={rel: (SHIPPED_BUNDLE / "models" / rel).read_bytes() + b"\n"})


class Paths:
    """{name} in an argument -> the absolute path of tmp_path/name, built by its fixture on first use (braces
    that name no fixture, such as a Hydra dict, are left alone)."""

    def __init__(self, root: Path):
        self.root = root
        self.built: dict[str, str] = {}

    def path(self, name: str) -> str:
        if name not in self.built:
            FIXTURES[name](self.root / name)
            self.built[name] = str(self.root / name)
        return self.built[name]

    def __call__(self, text: str) -> str:
        return re.sub(r"\{([^{}]+)\}", lambda m: self.path(m[1]) if m[1] in FIXTURES else m[0], text)


# ---------------------------------------------------------------------------------------------------------------
# The checks.

def snapshot(root: Path) -> dict:
    """Every path under root (hidden ones too) -> its kind and content hash; links are not followed."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def changes(before: dict, after: dict) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return "; ".join(f"{what}: {', '.join(paths[:8])}" for what, paths in
                     (("written", added), ("removed", removed), ("changed", changed)) if paths)


def check_refused(code, err: str, expect) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit code {code!r}, not 2; stderr:\n{err[-3000:]}"
    assert "Traceback" not in err, f"a traceback:\n{err[-3000:]}"
    assert len(lines) == 1 and err.count("\n") <= 1, f"{len(lines)} lines on stderr, not one:\n{err[-3000:]}"
    for fragment in expect:
        if fragment.startswith("re:"):
            assert re.search(fragment[3:], lines[0]), f"{fragment[3:]!r} not matched by: {lines[0]}"
        else:
            assert fragment in lines[0], f"{fragment!r} not in: {lines[0]}"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory with one unrelated file, the cache inside it (so cache writes show)."""
    root = tmp_path / "work"
    root.mkdir()
    (root / "notes.txt").write_text("an unrelated file that must stay as it is\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("KERNELSIGHT_CACHE", str(root / ".cache" / "kernelsight"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))  # matplotlib's font cache stays outside
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return root


def test_the_corpus_is_large_and_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) >= 150
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})


@pytest.mark.parametrize("argv,expect", CASES)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(argv, expect, workdir, run_cli):
    if any(str(SHARED_DATA) in a for a in argv) and not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} (the public reference data) is not here")
    paths = Paths(workdir)
    argv = [paths(a) for a in argv]
    before = snapshot(workdir)
    code, _, err = run_cli(argv, crash_as_code=True)
    after = snapshot(workdir)
    check_refused(code, err, expect)
    assert before == after, f"a refused run changed the working directory: {changes(before, after)}"


# ---------------------------------------------------------------------------------------------------------------
# A full disk: writes fail with EFBIG under a file-size limit (Python ignores SIGXFSZ). One line, nothing
# half-written, the directory as it was.

FULL_DISK = textwrap.dedent("""
    import resource, sys
    from kernelsight import cli
    import pandas, pyarrow.parquet  # imported before the limit: nothing of theirs is written later
    import kernelsight.cli.{module}
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    cli.main(sys.argv[1:])
""")


@pytest.mark.parametrize("module,argv,limit", [
    ("simulate", ["simulate", "num_requests=200", "plots=false", "output_dir=run"], 16384),
    ("simulate", ["simulate", "num_requests=20", "results_table=runs.csv"], 200),
    ("predict", ["predict", "sweep_file={good.parquet}", "out=pred.parquet"], 4096),
    ("roofline", ["roofline", "sweep_file={good.parquet}", "out=eta.csv"], 512),
], ids=["simulate output_dir", "simulate results_table", "predict out parquet", "roofline out csv"])
def test_a_full_disk_is_one_line_and_nothing_half_written(module, argv, limit, workdir):
    paths = Paths(workdir)
    argv = [paths(a) for a in argv]
    before = snapshot(workdir)
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    done = subprocess.run([sys.executable, "-c", FULL_DISK.format(module=module, limit=limit), *argv],
                          capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    after = snapshot(workdir)
    check_refused(done.returncode, done.stderr, ["re:(?i)disk|size|space|EFBIG|too large|cannot write"])
    assert before == after, f"a failed write left files behind: {changes(before, after)}"
