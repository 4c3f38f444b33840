"""TrainConfig: defaults, precedence (preset < YAML < CLI), type coercion, and one-line errors (exit 2)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers.processes import ROOT
from training.config import GROUPS, ConfigError, TrainConfig
from training.config_parsing import build_parser, load_config
from training.launch import mixed_precision
from training.smoke import presets
from training.train import cli


def test_defaults_are_the_documented_real_run():
    cfg = load_config([])
    assert (cfg.model_name_or_path, cfg.dataset_name, cfg.output_dir) == (
        "distilbert-base-uncased",
        "ag_news",
        "checkpoints",
    )
    assert (cfg.num_train_epochs, cfg.learning_rate, cfg.per_device_train_batch_size, cfg.max_length) == (
        2,
        5e-5,
        32,
        128,
    )
    assert cfg.group_by_length is None and cfg.validation_split is None and cfg.preset is None  # None: by problem type


def test_every_field_has_a_docstring_and_a_flag():
    names = list(TrainConfig.model_fields)
    assert all(len(TrainConfig.model_fields[name].description or "") > 10 for name in names)
    help_text = build_parser().format_help()
    for name in names:
        assert f"--{name}" in help_text
    assert "Batch texts of similar length together" in help_text


def test_hugging_face_example_flag_names_exist():
    flags = build_parser().format_help()
    for flag in (
        "--model_name_or_path",
        "--dataset_name",
        "--train_file",
        "--validation_file",
        "--test_file",
        "--output_dir",
        "--num_train_epochs",
        "--per_device_train_batch_size",
        "--per_device_eval_batch_size",
        "--gradient_accumulation_steps",
        "--learning_rate",
        "--weight_decay",
        "--warmup_ratio",
        "--max_length",
        "--seed",
        "--resume_from_checkpoint",
        "--checkpointing_steps",
        "--report_to",
        "--num_samples",
        "--preset",
        "--scale_lr",
        "--eval_steps",
        "--early_stopping_patience",
    ):
        assert flag in flags


def test_precedence_preset_then_yaml_then_cli(tmp_path):
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text("preset: smoke\nlearning_rate: 5e-4\nnum_train_epochs: 4\nlabel_names: [a, b, c, d]\n")
    cfg = load_config(["--config", str(yaml_file), "--num_train_epochs", "1"])
    assert cfg.learning_rate == 5e-4  # YAML "5e-4" is a string to PyYAML; coerced to float
    assert cfg.num_train_epochs == 1  # CLI beats YAML
    assert cfg.max_length == presets()["smoke"]["max_length"]  # preset beats the dataclass default
    assert cfg.from_scratch is True and cfg.label_names == ["a", "b", "c", "d"]


def test_a_list_from_yaml_is_cleared_by_none_on_the_command_line(tmp_path):
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text("remove_columns: [source, url]\nextra_metrics: [mcc]\nlabel_names: [a, b]\n")
    cfg = load_config(["--config", str(yaml_file), "--remove_columns", "none", "--extra_metrics", "null"])
    assert (cfg.remove_columns, cfg.extra_metrics, cfg.label_names) == (None, None, ["a", "b"])


def test_cli_types_bools_and_lists():
    cfg = load_config(
        [
            "--group_by_length",
            "false",
            "--from_scratch",
            "--label_names",
            "x",
            "y",
            "--max_train_steps",
            "none",
            "--checkpointing_steps",
            "25",
        ]
    )
    assert cfg.group_by_length is False and cfg.from_scratch is True
    assert cfg.label_names == ["x", "y"] and cfg.max_train_steps is None and cfg.checkpointing_steps == "25"


def test_comma_separated_lists_and_the_old_text_column_name(tmp_path):
    cfg = load_config(["--label_names", "World,Sports,Business,Sci/Tech", "--text_column_names", "Title,Description"])
    assert cfg.label_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert cfg.text_column_names == ["Title", "Description"]
    assert load_config(["--text_column", "body"]).text_column_names == ["body"]
    old = tmp_path / "old.yaml"
    old.write_text("text_column: body\n")
    assert load_config(["--config", str(old)]).text_column_names == ["body"]
    assert load_config(["--lr_scheduler_type", "cosine_with_restarts"]).lr_scheduler_type == "cosine_with_restarts"


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--lr_scheduler_type", "exponential"], "lr_scheduler_type"),
        (["--push_to_hub"], "hub_model_id"),
        (["--bogus", "1"], "--bogus"),
        (["--learning_rate", "abc"], "learning_rate"),
        (["--num_train_epochs", "0"], "num_train_epochs"),
        (["--per_device_train_batch_size", "2.5"], "per_device_train_batch_size"),
        (["--warmup_ratio", "1.5"], "warmup_ratio"),
        (["--checkpointing_steps", "often"], "checkpointing_steps"),
        (["--report_to", "myspace"], "report_to"),
        (["--train_file", "data.txt"], "train_file"),
        (["--resume_from_checkpoint", "/nonexistent/state"], "resume_from_checkpoint"),
        (["--preset", "huge"], "preset"),
        (["--group_by_length", "maybe"], "group_by_length"),
        (["--mixed_precision", "fp8"], "mixed_precision"),
        (["--label_names", "a", "a"], "label_names"),
        (["--report_to", "clearml"], "report_to"),  # a known tracker that is not installed here
    ],
)
def test_bad_values_give_one_line_naming_the_field_and_exit_2(argv, field, capsys):
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert field in err and "error" in err


def test_yaml_errors_name_the_key(tmp_path, capsys):
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("learning_rate: 1e-4\nlearnin_rate: 3\n")
    with pytest.raises(ConfigError, match="learnin_rate"):
        load_config(["--config", str(unknown)])
    wrong_type = tmp_path / "wrong.yaml"
    wrong_type.write_text("num_train_epochs: [1, 2]\n")
    assert cli(["--config", str(wrong_type)]) == 2
    assert "num_train_epochs" in capsys.readouterr().err
    assert cli(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_real_script_rejects_config_before_any_process_group():
    """Through the real entry point: exit 2, one line on stderr, and nothing of the training run started."""
    started = time.time()
    result = subprocess.run(
        [sys.executable, str(ROOT / "training" / "train.py"), "--learning_rate", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["train.py: error: learning_rate: must be > 0 (got -1.0)"]
    assert "Distributed" not in result.stdout + result.stderr
    assert time.time() - started < 60


def test_fields_are_grouped_by_concern_in_help_and_every_field_is_in_exactly_one_group():
    grouped = [name for cls in GROUPS.values() for name in cls.model_fields]
    assert sorted(grouped) == sorted(TrainConfig.model_fields) and len(grouped) == len(set(grouped))
    help_text = build_parser().format_help()
    positions = [
        help_text.index(f"\n{title}:")
        for title in ("model", "data", "optimization", "evaluation and checkpoints", "run")
    ]
    assert positions == sorted(positions)
    assert help_text.index("\n  --learning_rate") > help_text.index("\noptimization:")
    assert help_text.index("\n  --output_dir") > help_text.index("\nevaluation and checkpoints:")


def test_yaml_may_group_fields_and_groups_mix_with_flat_keys(tmp_path):
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(
        "optimization:\n  learning_rate: 3e-4\n  num_train_epochs: 5\ndata:\n  max_length: 64\nseed: 7\n"
    )
    cfg = load_config(["--config", str(grouped), "--num_train_epochs", "1"])
    assert (cfg.learning_rate, cfg.num_train_epochs, cfg.max_length, cfg.seed) == (3e-4, 1, 64, 7)
    assert cfg.grouped()["optimization"]["learning_rate"] == 3e-4
    wrong_group = tmp_path / "wrong.yaml"
    wrong_group.write_text("data:\n  learning_rate: 3e-4\n")
    with pytest.raises(ConfigError, match=r"^data.learning_rate: unknown field of group 'data'"):
        load_config(["--config", str(wrong_group)])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--learning_rate", "-1"], "learning_rate: must be > 0 (got -1.0)"),
        (["--num_train_epochs", "0"], "num_train_epochs: must be >= 1 (got 0)"),
        (["--warmup_ratio", "1.5"], "warmup_ratio: must be < 1 (got 1.5)"),
        (["--per_device_train_batch_size", "2.5"], "per_device_train_batch_size: expected an integer (got '2.5')"),
        (["--group_by_length", "maybe"], "group_by_length: expected true or false (got 'maybe')"),
        (
            ["--lr_scheduler_type", "exponential"],
            "lr_scheduler_type: must be one of 'linear', 'cosine', "
            "'cosine_with_restarts', 'polynomial', 'constant' or "
            "'constant_with_warmup' (got 'exponential')",
        ),
    ],
)
def test_error_messages_are_one_exact_line(argv, message):
    with pytest.raises(ConfigError) as info:
        load_config(argv)
    assert str(info.value) == message


def test_one_precision_vocabulary_with_auto_meaning_what_it_means_for_serving(monkeypatch):
    """The same names as evaluate, predict and serve (contract/precision.py); a launcher config's precision
    is used when the flag is left at auto."""
    from contract import precision

    assert load_config(["--mixed_precision", "no"]).mixed_precision == "fp32"
    assert load_config(["--mixed_precision", "bfloat16"]).mixed_precision == "bf16"
    assert load_config([]).mixed_precision == "auto"
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    expected = precision.accelerate_name(precision.resolve("auto", "cuda" if torch.cuda.is_available() else "cpu"))
    assert mixed_precision(load_config([]).mixed_precision) == expected
    assert mixed_precision("fp32") == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # what `accelerate launch` sets from its config
    assert mixed_precision(load_config([]).mixed_precision) == "fp16"
    assert mixed_precision("bf16") == "bf16"


def test_a_launcher_precision_the_config_overrides_is_a_warning(monkeypatch, caplog, tmp_path):
    """`accelerate launch --mixed_precision bf16 train.py --preset smoke`: the preset's fp32 wins, and says so."""
    from accelerate.state import AcceleratorState

    from training.train import make_accelerator

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    try:
        with caplog.at_level("WARNING"):
            accelerator = make_accelerator(load_config(["--preset", "smoke", "--output_dir", str(tmp_path)]))
        assert accelerator.mixed_precision == "no"
        assert "accelerate launch asked for bf16, but --mixed_precision fp32" in caplog.text
        assert "training in fp32. Pass --mixed_precision bf16 to train in bf16." in caplog.text
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_a_named_model_turns_a_smoke_presets_tiny_model_settings_off(smoke_dir, tmp_path, caplog):
    """A named model drops the smoke preset's tiny-model settings."""
    model = str(shutil.copytree(smoke_dir / "model", tmp_path / "another"))  # not the preset's own model folder
    with caplog.at_level("INFO"):
        cfg = load_config(
            ["--preset", "smoke", "--train_file", str(tmp_path / "own.csv"), "--model_name_or_path", model]
        )
    defaults = TrainConfig()
    assert not cfg.from_scratch and cfg.learning_rate == defaults.learning_rate
    assert (cfg.max_length, cfg.mixed_precision) == (defaults.max_length, defaults.mixed_precision)
    assert (
        "the tiny model's from_scratch, learning_rate, max_length, mixed_precision left at their defaults"
        in caplog.text
    )
    own = ["--train_file", str(tmp_path / "own.csv")]
    given = load_config(["--preset", "smoke", *own, "--model_name_or_path", model, "--learning_rate", "1e-3"])
    assert given.learning_rate == 1e-3 and not given.from_scratch
    scratch = load_config(["--preset", "smoke", *own, "--model_name_or_path", model, "--from_scratch"])
    assert scratch.from_scratch and scratch.max_length == 64  # a config-only base, as asked: the preset's regime
    assert load_config(["--preset", "smoke"]).from_scratch  # the preset's own model: as before
    for named in (smoke_dir / "model", model):  # the preset's own data: its regime, whichever model
        assert load_config(["--preset", "smoke", "--model_name_or_path", str(named)]).from_scratch
