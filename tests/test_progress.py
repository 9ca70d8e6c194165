"""Progress bars: the library only calls the tqdm-like factory it is given (fits, validation rows, imported
files, simulated requests); the CLI decides (tqdm on stderr, off with quiet=true or off a terminal)."""
import sys
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from kernelsight.calibrate.importers import aiconfigurator, neusight, vidur
from kernelsight.calibrate.models import run_fits
from kernelsight.cli.progress import progress_bars
from kernelsight.predictor.paths import conf_dir
from kernelsight.validate import run as validate_run

from test_importers import aic_tree, neusight_tree, vidur_tree


class Bar:
    """tqdm's calling conventions, recorded: Bar(iterable, total=, desc=, unit=) or Bar(total=...).update(n)."""

    made: list = []

    def __init__(self, iterable=None, total=None, desc=None, unit=None):
        self.iterable, self.total, self.desc, self.unit, self.n = iterable, total, desc, unit, 0
        Bar.made.append(self)

    def __iter__(self):
        for item in self.iterable:
            self.n += 1
            yield item


@pytest.fixture(autouse=True)
def fresh():
    Bar.made = []


@pytest.mark.parametrize("command", ["simulate", "calibrate", "calibrate_publish", "validate", "import"])
def test_quiet_is_a_setting_of_every_command_with_bars(command):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        assert compose(command).quiet is False
        cfg = compose(command, overrides=["quiet=true"])
    assert progress_bars(cfg) is None


def test_bars_go_to_stderr_and_switch_off_without_a_terminal():
    factory = progress_bars({"quiet": False}, delay=2.0)
    assert factory.keywords["file"] is sys.stderr and factory.keywords["disable"] is None
    assert factory.keywords["delay"] == 2.0
    bar = factory(total=3)  # pytest captures stderr: not a terminal, so tqdm stays silent
    assert bar.disable
    bar.close()


@pytest.mark.parametrize("jobs", [1, 2])
def test_fits_report_each_fit_in_order(jobs):
    tasks = [lambda i=i: i * i for i in range(5)]
    assert run_fits(tasks, jobs, Bar, "target models") == [0, 1, 4, 9, 16]
    (bar,) = Bar.made
    assert (bar.total, bar.desc, bar.unit, bar.n) == (5, "target models", "fit", 5)
    assert run_fits([], jobs, Bar) == [] and len(Bar.made) == 1  # nothing to fit: no bar


@pytest.mark.parametrize("processes", [1, 2])
def test_validation_rows_are_counted_as_they_finish(monkeypatch, processes):
    monkeypatch.setattr(validate_run, "simulate_row", lambda row, *rest: row.osl)
    rows = [SimpleNamespace(model_path="m", precision="bf16", tp=1, osl=osl, concurrency=4) for osl in (3, 1, 2)]
    jobs = [(row, None, SimpleNamespace(name="target"), None, None) for row in rows]
    assert validate_run.simulate_rows(jobs, processes, Bar, "validate (target tier)") == [3, 1, 2]
    (bar,) = Bar.made
    assert (bar.total, bar.desc, bar.unit, bar.n) == (3, "validate (target tier)", "row", 3)


@pytest.mark.parametrize("importer, tree", [(aiconfigurator, aic_tree), (vidur, vidur_tree),
                                            (neusight, neusight_tree)])
def test_importers_count_files(tmp_path, importer, tree):
    src = tree(tmp_path)
    assert importer.convert(src, progress=Bar).report().equals(importer.convert(src).report())
    bar = Bar.made[0]
    assert bar.desc == importer.DATASET and bar.unit == "file" and bar.n == len(bar.iterable) > 0
