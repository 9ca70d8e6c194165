"""The `kernelsight` entry point: command lookup, friendly arguments to Hydra overrides, one-line errors."""
import shutil
import subprocess

import pytest

from kernelsight import cli
from kernelsight.cli import COMMANDS, Command, check_group_overrides, split_command, to_overrides
from kernelsight.predictor.errors import KernelsightError

PREDICT = Command("x:y", "predict", positional="sweep")


def test_every_command_has_a_primary_config_and_an_importable_target():
    import importlib

    from kernelsight.predictor.paths import conf_dir
    for name, command in COMMANDS.items():
        assert (conf_dir() / f"{command.config_name(name)}.yaml").is_file(), name
        module, func = command.target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_positional_and_flags_become_overrides():
    assert to_overrides(PREDICT, ["run.parquet", "--tier", "cross", "--out=x.csv"]) == [
        "sweep=run.parquet", "tier=cross", "out=x.csv"]
    assert to_overrides(PREDICT, ["--quiet"]) == ["quiet=true"]
    assert to_overrides(PREDICT, ["-m", "hardware=a,b", "--cfg", "job", "~x.y", "+z=1"]) == [
        "-m", "hardware=a,b", "--cfg", "job", "~x.y", "+z=1"]
    with pytest.raises(KernelsightError, match="settings are key=value"):
        to_overrides(Command("x:y", "no positional"), ["file.parquet"])


def test_two_word_commands_and_did_you_mean():
    commands = dict(COMMANDS, **{"bench report": Command("x:y", "report", positional="sweep")})
    old = dict(COMMANDS)
    COMMANDS.clear()
    COMMANDS.update(commands)
    try:
        assert split_command(["bench", "report", "s.parquet"]) == ("bench report", ["s.parquet"])
        assert split_command(["roofline", "model=x"]) == ("roofline", ["model=x"])
    finally:
        COMMANDS.clear()
        COMMANDS.update(old)
    with pytest.raises(KernelsightError, match="did you mean 'roofline'"):
        split_command(["roofine"])


def test_group_override_typo_is_caught_before_hydra():
    with pytest.raises(KernelsightError) as e:
        check_group_overrides(["hardware=h100_smx"])
    assert "did you mean 'h100_sxm'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(KernelsightError, match=r"did you mean 'h100_nvl', 'h100_pcie' or 'h100_sxm'\?"):
        check_group_overrides(["hardware=h10"])  # the start of three configs' names: all, not 'mi100'
    with pytest.raises(KernelsightError, match=r"^hardware=h10O: no such config"):
        check_group_overrides(["-m", "hardware=h100_sxm,h10O"])  # every name of a sweep
    fine = ["hardware=h100_sxm", "hardware=h100_sxm,a100_sxm", "seed=3", "hardware=glob(h1*)"]
    assert check_group_overrides(fine) == fine


def test_gpu_aliases_and_device_names_become_their_config():
    """h100 is an alias in conf/hardware/h100_sxm.yaml: Hydra gets the file's name, not an error."""
    assert check_group_overrides(["hardware=h100", "seed=3"]) == ["hardware=h100_sxm", "seed=3"]
    assert check_group_overrides(["+hardware=NVIDIA H100 80GB HBM3"]) == ["+hardware=h100_sxm"]
    assert check_group_overrides(["-m", "hardware=h100,a100_sxm"]) == ["-m", "hardware=h100_sxm,a100_sxm"]


def test_ctrl_c_is_exit_130_and_one_line_on_what_was_kept(monkeypatch, capsys):
    from kernelsight.cli import roofline as command

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "roofline", interrupted)
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline"])
    assert e.value.code == 130
    assert capsys.readouterr().err == "kernelsight roofline: interrupted: nothing written\n"

    def interrupted_with_a_hint(cfg):
        with cli.on_interrupt(lambda: "3 of 8 rows kept in x.parts/; run the same command again to continue"):
            with cli.on_interrupt("inner hint wins"):
                raise KeyboardInterrupt

    monkeypatch.setattr(command, "roofline", interrupted_with_a_hint)
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline"])
    assert e.value.code == 130 and capsys.readouterr().err == "kernelsight roofline: interrupted: inner hint wins\n"


def test_bench_resume_hint_repeats_every_override_given(monkeypatch):
    from pathlib import Path

    from kernelsight.cli import bench

    given = ["sweep=cpu", "device=cpu", "resume=true", "sweep_id=x", "providers=[torch,triton]"]
    monkeypatch.setattr(bench, "task_overrides", lambda: given)
    assert bench.resume_command(Path("out/cpu/x")) == \
        "kernelsight bench sweep=cpu device=cpu 'providers=[torch,triton]' resume=out/cpu/x"


def test_an_os_error_is_one_line_exit_2(monkeypatch, capsys):
    import errno

    from kernelsight.cli import roofline as command

    def full_disk(cfg):
        raise OSError(errno.ENOSPC, "No space left on device", "out/steps.csv")

    monkeypatch.setattr(command, "roofline", full_disk)
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "kernelsight roofline: error: out/steps.csv: No space left on device\n"


def test_main_prints_usage_and_exits_2_on_bad_command(capsys):
    cli.main([])
    assert "Commands:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["nonsense"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernelsight: error: unknown command") and "\n" not in err


def test_installed_entry_point_runs():
    exe = shutil.which("kernelsight")
    assert exe, "the kernelsight console script is not installed"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert name in out.stdout
    bad = subprocess.run([exe, "roofline", "hardware=h10O"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "did you mean" in bad.stderr


def test_unknown_setting_is_one_line_not_hydras_page(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline", "decode.nonsense=1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "decode.nonsense" in err and "\n" not in err


def test_a_group_choice_given_as_a_file(run_cli, tmp_path, monkeypatch):
    """model= takes a HF config.json (or its folder) and any group a .yaml file: the command composes them like
    shipped choices; a path that is not there is one line."""
    from kernelsight.predictor.paths import conf_dir

    monkeypatch.setenv("KERNELSIGHT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "gpt-oss-20b"
    folder.mkdir()
    (folder / "config.json").write_text((conf_dir() / "model" / "hf" / "openai--gpt-oss-20b_config.json").read_text())
    code, out, err = run_cli(["roofline", f"model={folder}"], cwd=tmp_path)
    assert code == 0, err
    assert out.startswith("gpt-oss-20b on NVIDIA H100") and "weights mxfp4" in out
    # a problem found after composing names the user's file, not the copy Hydra composed it from
    code, out, err = run_cli(["simulate", f"model={folder}", "max_model_len=10000000"], cwd=tmp_path)
    assert code == 2 and f"(max_position=131072 in {folder / 'config.json'})" in err, err
    yaml_copy = tmp_path / "mine.yaml"
    yaml_copy.write_text((conf_dir() / "model" / "qwen3-8b.yaml").read_text())
    code, out, err = run_cli(["roofline", f"model={yaml_copy}"], cwd=tmp_path)
    assert code == 0 and out.startswith("qwen3-8b on"), err
    code, out, err = run_cli(["roofline", f"model={tmp_path}/missing.json"], cwd=tmp_path)
    assert code == 2 and err.strip() == f"kernelsight: error: model={tmp_path}/missing.json: no such file (nor a folder " \
                                        f"with a config.json)"


def test_every_example_of_the_readmes_config_groups_composes():
    """Each `e.g.` of the README's config-group table is a setting a user will paste: it must compose."""
    import re
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from kernelsight.predictor.paths import conf_dir

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = text[text.index("## Config groups"):]
    table = table[:table.index("\n## ", 3)]
    examples = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        group = re.fullmatch(r"`(\w+)=`", cells[0]) if cells else None
        if group and len(cells) >= 3:
            for example in re.findall(r"`([^`]+)`", cells[2]):
                overrides = example.split() if "=" in example else [f"{group[1]}={example}"]
                examples.append(("bench" if group[1] == "sweep" else "simulate", overrides))
    assert len(examples) >= 12
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for config, overrides in examples:
            compose(config_name=config, overrides=overrides)   # a bad example raises here, naming itself
