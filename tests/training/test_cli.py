"""One runner and one error base: a mistake is one line, a bug a traceback."""

from __future__ import annotations

import logging

import pytest

from contract.errors import UsageError, UserError
from contract.loading import CheckpointError
from contract.long_text import LongTextError
from contract.problem_types import ProblemTypeError
from inference.settings import SettingsError
from training.cli import run_command
from training.config import ConfigError
from training.data.errors import DataError
from training.guards import LaunchError
from training.output.resume import ResumeError


def raising(exc: Exception):
    def work():
        raise exc

    return work


def test_a_user_error_is_one_logged_line_with_its_exit_code(caplog):
    with caplog.at_level(logging.ERROR):
        assert run_command(raising(DataError("train.csv: row 3: the label is empty"))) == 1
        assert run_command(raising(ConfigError("--learning_rate: must be positive, got -1"))) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "train.csv: row 3: the label is empty",
        "--learning_rate: must be positive, got -1",
    ]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback


def test_the_exit_code_is_what_the_work_returns_and_a_bug_propagates():
    assert run_command(lambda: 75) == 75
    assert run_command(lambda: {"accuracy": 0.9}) == 0  # evaluate returns its results
    with pytest.raises(KeyError):
        run_command(lambda: {}["missing"])


@pytest.mark.parametrize(
    "error, usage, builtin",
    [
        (CheckpointError, False, RuntimeError),
        (ConfigError, True, ValueError),
        (DataError, False, ValueError),
        (LaunchError, True, RuntimeError),
        (LongTextError, False, ValueError),
        (ResumeError, False, RuntimeError),
        (SettingsError, True, ValueError),
        (ProblemTypeError, False, ValueError),
    ],
)
def test_every_one_line_error_shares_the_base_and_keeps_its_builtin(error, usage, builtin):
    assert issubclass(error, UserError) and issubclass(error, builtin)
    assert issubclass(error, UsageError) == usage and error("x").exit_code == (2 if usage else 1)


def test_decided_on_main_hands_every_rank_the_result_or_the_same_error():
    """One process here. With two, test_predict.py's read-only output folder sees every rank stop with the main
    process's one line, and the 2-process resume tests resume every rank from the folder the main process picked."""
    from accelerate import Accelerator

    from training.collective import decided_on_main

    accelerator = Accelerator(cpu=True)
    assert decided_on_main(accelerator, lambda: {"run": 1}) == {"run": 1}
    with pytest.raises(DataError, match="row 3"):
        decided_on_main(accelerator, raising(DataError("train.csv: row 3: the label is empty")))


@pytest.mark.slow
def test_main_first_stops_every_rank_with_the_main_process_error(tmp_path):
    """main_first: every rank gets the main process's error, none hangs."""
    from tests.helpers.processes import ROOT, describe, launch

    script = tmp_path / "both.py"
    script.write_text(
        f"""import sys
sys.path.insert(0, {str(ROOT)!r})
from accelerate import Accelerator
from contract.errors import UserError
from training.collective import main_first

accelerator = Accelerator(cpu=True)

def work():
    if accelerator.is_main_process:
        raise UserError("the main process could not read the file")
    print("rank 1 ran work", flush=True)

try:
    main_first(accelerator, work)
except UserError as exc:
    print(f"rank {{accelerator.process_index}} stopped: {{exc}}", flush=True)
accelerator.end_training()
"""
    )
    result, seconds = launch([str(script)], processes=2, timeout=120)
    assert result.returncode == 0, describe(result)
    for rank in (0, 1):
        assert f"rank {rank} stopped: the main process could not read the file" in result.stdout, describe(result)
    assert "rank 1 ran work" not in result.stdout


def test_each_hint_names_what_works_for_the_command_that_failed(monkeypatch, tmp_path):
    """Offline evaluation was told to run training commands; a typo in a local folder read as a Hub cache miss."""
    from contract import hub

    missing = OSError("We couldn't connect to 'https://huggingface.co'")
    monkeypatch.setattr(hub, "is_offline", lambda: True)
    monkeypatch.setattr("sys.argv", ["/somewhere/training/evaluate.py"])
    evaluate = str(hub.explain_missing("dataset 'ag_news'", missing, "ag_news"))
    assert "To evaluate without the Hub, pass --test_file" in evaluate and "train.py" not in evaluate
    monkeypatch.setattr("sys.argv", ["agnews train"])
    train = str(hub.explain_missing("model 'distilbert-base-uncased'", missing, "distilbert-base-uncased"))
    assert "--preset smoke" in train and "--model_name_or_path minilm" in train
    typo = str(hub.explain_missing("model './my_modle'", missing, str(tmp_path / "my_modle")))
    assert (
        typo == f"Cannot load model './my_modle': there is no folder {tmp_path / 'my_modle'} (a Hub id reads org/name)"
    )
    assert hub.looks_local("./m") and hub.looks_local("/a/b") and not hub.looks_local("org/name")
