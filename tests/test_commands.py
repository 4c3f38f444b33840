"""`agnews COMMAND` (training/commands.py, the console script of pyproject.toml): the list of commands at once, an
unknown one refused in one line, and a command run through it as through its old invocation."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.processes import ROOT, cli_env, describe
from training.commands import COMMANDS


def agnews(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    script = shutil.which("agnews", path=Path(sys.executable).parent) or shutil.which("agnews")
    assert script, "the console script is installed by `pip install -e .`"
    return subprocess.run([script, *args], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=timeout)


def test_the_command_list_answers_at_once_and_an_unknown_command_is_one_line():
    started = time.perf_counter()
    listed = agnews("--help")
    assert time.perf_counter() - started < 1.0 and listed.returncode == 0, describe(listed)
    assert all(f"  {name} " in listed.stdout for name in COMMANDS)
    unknown = agnews("trian")
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        "agnews: no command 'trian'; one of " + ", ".join(COMMANDS)
    ]


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
