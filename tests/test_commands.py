"""`agnews COMMAND`: the list, unknown commands, --help without torch."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inference.settings import Settings
from tests.helpers.processes import CPU_2PROC, ROOT, cli_env, describe
from training.commands import COMMANDS, PARSERS

HEAVY = ("torch", "transformers", "datasets", "accelerate")
SOURCE_FILE = re.compile(r"\b(contract|training|inference)/\w+\.py\b")


def console_script() -> str:
    script = shutil.which("agnews", path=Path(sys.executable).parent) or shutil.which("agnews")
    assert script, "the console script is installed by `pip install -e .`"
    return script


def agnews(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [console_script(), *args], cwd=ROOT, env=env or cli_env(), capture_output=True, text=True, timeout=timeout
    )


def imported(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The console script run with python -X importtime: its result and every top-level package it imported."""
    command = [sys.executable, "-X", "importtime", console_script(), *args]
    done = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True)
    rows = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    return done, {row.split(".")[0] for row in rows}


def test_the_command_list_answers_at_once_and_an_unknown_command_is_one_line():
    listed, packages = imported("--help")
    assert listed.returncode == 0 and not packages & set(HEAVY), describe(listed)
    assert all(f"  {name} " in listed.stdout for name in COMMANDS)
    unknown = agnews("trian")
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        "agnews: no command 'trian'; one of " + ", ".join(COMMANDS)
    ]


def test_the_readmes_help_command_answers_before_torch_loads():
    """`python training/train.py --help`, as the README shows it, took 5-12 s importing the training stack; now it
    prints the same help as `agnews train --help` without importing torch or any heavy package."""
    command = [sys.executable, "-X", "importtime", "training/train.py", "--help"]
    done = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True)
    rows = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert done.returncode == 0 and "--learning_rate" in done.stdout, describe(done)
    assert not {row.split(".")[0] for row in rows} & set(HEAVY)


def test_a_command_runs_as_its_module_does_with_its_exit_code(smoke_model, tmp_path):
    texts = tmp_path / "texts.csv"
    texts.write_text("text\nstocks rallied\nthe match ended\n")
    out = tmp_path / "labelled.csv"
    labelled = agnews(
        "predict", "--checkpoint_dir", str(smoke_model), "--input_file", str(texts), "--output_file", str(out)
    )
    assert labelled.returncode == 0 and len(out.read_text().splitlines()) == 3, describe(labelled)
    args = ["--checkpoint_dir", str(tmp_path / "missing"), "--input_file", str(texts)]
    refused = agnews("predict", *args)
    old = subprocess.run(
        [sys.executable, "-m", "training.predict", *args], cwd=ROOT, env=cli_env(), capture_output=True, text=True
    )
    assert refused.returncode == old.returncode != 0


def option_entries(text: str) -> list[str]:
    """Each option's block of a --help text: its flag line and the help lines under it."""
    entries: list[str] = []
    for line in text.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries and line.startswith("    "):
            entries[-1] += " " + line.strip()
        elif not line.strip():
            entries.append("")  # a blank line closes the entry above it
    return [" ".join(e.split()) for e in entries if e]


@pytest.mark.parametrize("name", [name for name in COMMANDS if name != "launch"])  # launch's help is accelerate's
def test_every_help_is_one_style_and_imports_nothing_heavy(name):
    shown, packages = imported(name, "--help")
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: agnews {name} "), describe(shown)
    assert not packages & set(HEAVY), f"agnews {name} --help imported {sorted(packages & set(HEAVY))}"
    assert not SOURCE_FILE.findall(shown.stdout.replace("training/train.py", "")), shown.stdout
    assert not re.search(r"--\w+ (str|int|float)\b", shown.stdout), "value names are capitals, as every command's"
    entries = option_entries(shown.stdout)
    assert entries, shown.stdout
    for entry in entries:  # a default appended after a text that already says it is said twice
        appended = re.search(r"\(default: [^()]*\)$", entry)
        assert not appended or "default" not in entry[: appended.start()].lower(), entry
        assert "(default: None)" not in entry, entry


@pytest.mark.parametrize("name", list(PARSERS))
def test_every_flag_is_explained(name):
    module, function = PARSERS[name].split(":")
    parser = getattr(importlib.import_module(module), function)()
    unexplained = [a.option_strings[0] for a in parser._actions if a.option_strings and not (a.help or "").strip()]
    assert not unexplained, f"agnews {name}: {unexplained} without help"


def test_every_service_setting_is_explained():
    assert not [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_launch_is_accelerate_launch_without_its_defaults_block_and_traceback(processes, tmp_path):
    """A refused start says the same through either launcher."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    launcher = [] if processes == 1 else ["--config_file", str(CPU_2PROC)]
    args = [*launcher, "training/train.py", "--preset", "smoke", "--output_dir", str(out)]
    env = cli_env(HF_HOME=str(tmp_path / "hf"))
    ours = agnews("launch", *args, env=env)
    theirs = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    said = "holds an unfinished run"
    assert ours.returncode == theirs.returncode == 1, describe(ours) + describe(theirs)
    assert said in ours.stderr and said in theirs.stderr
    assert "Traceback" in theirs.stderr and "Traceback" not in ours.stderr, describe(ours)
    if processes == 1:  # a config file sets every launcher value: the block appears only without one
        assert "were not passed" in theirs.stderr and "were not passed" not in ours.stderr, describe(ours)


@pytest.mark.parametrize("content", [None, "just words", "key: [unclosed"])
def test_launch_with_a_config_file_accelerate_cannot_read_is_one_line(tmp_path, content):
    """A missing, non-mapping or broken --config_file: accelerate's traceback before; now one line and exit 2."""
    config = tmp_path / "launch.yaml"
    if content is not None:
        config.write_text(content)
    result = agnews("launch", "--config_file", str(config), "training/train.py", "--preset", "smoke")
    assert result.returncode == 2 and "Traceback" not in result.stderr, describe(result)
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"agnews launch: error: --config_file {config}: ")
