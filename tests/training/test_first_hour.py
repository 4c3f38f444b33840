"""What a new user meets in the first hour: the example files the docs read, a finished run's folder and its size, and
messages that name the fix (a missing checkpoint folder, other column names, a flag by another tool's name)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contract import files
from tests.helpers.processes import ROOT, cli_env, describe, run_train
from training.config import ConfigError
from training.config_parsing import load_config


def agnews(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "training.commands", *args]
    return subprocess.run(command, cwd=cwd, env=cli_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--lr", "--learning_rate"),  # initials
        ("--epochs", "--num_train_epochs"),  # another tool's name
        ("--num_epochs", "--num_train_epochs"),  # close spelling
        ("--batch_size", "--per_device_train_batch_size"),
        ("--max_len", "--max_length"),
        ("--mdoel_name_or_path", "--model_name_or_path"),  # a typo
    ],
)
def test_a_flag_by_another_name_is_answered_with_ours(typed, meant):
    with pytest.raises(ConfigError, match=f"unrecognized argument {typed}; did you mean {meant}\\?$"):
        load_config([typed, "3"])


def test_a_flag_like_none_of_ours_points_at_the_list():
    with pytest.raises(ConfigError, match="unrecognized argument --frobnicate; every flag: --help"):
        load_config(["--frobnicate", "3"])


def test_the_example_files_are_written_once_and_kept(tmp_path):
    done = agnews("examples", cwd=tmp_path)
    assert done.returncode == 0, describe(done)
    with open(tmp_path / "mine.csv", newline="", encoding="utf-8") as fh:
        mine = list(csv.DictReader(fh))
    assert len(mine) == 500 and {row["label"] for row in mine} == {"sports", "business", "science"}
    assert len({row["text"] for row in mine}) > 250  # combinations, not a handful of repeats
    news = (tmp_path / "news.csv").read_text().splitlines()
    assert news[0] == "text,label" and len(news) == 61
    assert (tmp_path / "unlabelled.csv").read_text().splitlines()[0] == "text"
    (tmp_path / "mine.csv").write_text("text,label\nmine,a\n")
    again = agnews("examples", cwd=tmp_path)
    assert again.returncode == 0 and "mine.csv: kept as it is (--overwrite replaces it)" in again.stdout
    assert (tmp_path / "mine.csv").read_text() == "text,label\nmine,a\n"


def test_a_missing_folder_beside_its_parent_is_a_missing_folder_not_a_hub_id(tmp_path):
    """`--model_id runs/nope` while runs/ exists answered with the Hub's message."""
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    (tmp_path / "runs" / "mine" / files.CONFIG).write_text("{}")
    done = subprocess.run([sys.executable, "-m", "inference", "--model_id", "runs/nope"], cwd=tmp_path,
                          env=cli_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, describe(done)
    assert "runs/nope: checkpoint folder not found (runs holds mine;" in done.stderr, describe(done)


def test_a_file_with_other_column_names_is_told_the_flags_with_its_own_names(tmp_path, smoke_dir):
    data = tmp_path / "mine.csv"
    data.write_text("sentence,category\n" + "".join(f"text number {i},{i % 2}\n" for i in range(40)))
    args = ["--model_name_or_path", str(smoke_dir / "model"), "--train_file", str(data)]
    result, _ = run_train([*args, "--output_dir", str(tmp_path / "out")], keep_states=False)
    assert result.returncode == 1, describe(result)
    [line] = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert "missing column 'text' (found: sentence, category); name yours with --text_column_names and " in line
    assert line.endswith("(here perhaps --text_column_names sentence --label_column category)"), line


def test_a_finished_run_keeps_no_state_says_its_size_and_has_nothing_to_resume(tmp_path, smoke_dir):
    out = tmp_path / "run"
    args = ["--preset", "smoke", "--num_samples", "400", "--num_train_epochs", "2", "--output_dir", str(out)]
    result, _ = run_train(args, keep_states=False)
    assert result.returncode == 0, describe(result)
    assert not (out / files.STATE_DIR).exists()  # two epochs: a state was saved after the first
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    said = re.search(r"is in \S+ \((\d+\.\d) MB, its resumable states removed: --keep_states\)", result.stderr)
    assert said and abs(float(said.group(1)) - size / 1e6) < 0.11, result.stderr[-800:]

    weights = (out / files.WEIGHTS).read_bytes()
    again, _ = run_train([*args, "--resume_from_checkpoint", "latest"], keep_states=False)
    assert again.returncode == 0, describe(again)
    assert "Nothing to resume: " in again.stderr and "--model_name_or_path" in again.stderr, again.stderr[-800:]
    assert "Validation at step" not in again.stderr and (out / files.WEIGHTS).read_bytes() == weights

    kept, _ = run_train(args)  # --keep_states
    assert kept.returncode == 0, describe(kept)
    metrics = json.loads((out / files.METRICS).read_text())
    [state] = (out / files.STATE_DIR).iterdir()  # one: the first epoch's end (the last is not saved)
    assert state.name == f"step_{metrics['global_step'] // 2}" and metrics["config"]["keep_states"] is True
    assert re.search(r"\(\d+\.\d MB, with --keep_states\)", kept.stderr), kept.stderr[-800:]


def test_the_smoke_preset_on_an_empty_cache_does_not_ask_the_hub(tmp_path):
    """It is offline by design; the first run warned that the Hub did not answer while its files were being made."""
    env = cli_env(DISTILBERT_AGNEWS_SMOKE_DIR=str(tmp_path / "smoke"), HF_ENDPOINT="http://127.0.0.1:9")
    env.pop("HF_HUB_OFFLINE")  # as on a user's machine: nothing says offline
    args = ["--preset", "smoke", "--num_train_epochs", "1", "--output_dir", str(tmp_path / "o")]
    result, _ = run_train(args, env=env, keep_states=False)
    assert result.returncode == 0, describe(result)
    assert "did not answer" not in result.stderr and " WARNING " not in result.stderr, result.stderr[-2000:]
