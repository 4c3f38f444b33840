"""The one typed training configuration: defaults < ``--preset`` < ``--config file.yaml`` < CLI flags.

Every field carries its documentation as an attribute docstring (the string right below it); ``--help``
prints those. Parsing never touches torch, a process group or a model, so a bad value is reported in one
line with exit code 2 before anything expensive starts.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import accelerate.utils
import yaml

from training.smoke import LABELS as SMOKE_LABELS
from training.smoke import smoke_dir

SUPPORTED_DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet")
METRICS = ("accuracy", "macro_f1")
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
RENAMED = {"text_column": "text_column_names"}  # older field names, still accepted
TRACKERS = ("none", "all", "tensorboard", "wandb", "trackio", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "swanlab")


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or impossible; the message names the field."""


@dataclass
class TrainConfig:
    # ----------------------------------------------------------------------------------------- model
    model_name_or_path: str = "distilbert-base-uncased"
    """Hub model id or local folder with a config, tokenizer and weights."""
    tokenizer_name: Optional[str] = None
    """Tokenizer id or folder, when it differs from model_name_or_path."""
    from_scratch: bool = False
    """Build the model from model_name_or_path's config with random weights (smoke preset, speed benchmarks)."""
    dropout: Optional[float] = None
    """Override every dropout probability of the model config (0 for exactly reproducible comparisons)."""
    attn_implementation: Optional[str] = None
    """'sdpa' or 'eager' attention. Default: sdpa on GPU; on CPU eager, where training steps are ~1.3x faster (PyTorch's CPU flash-attention backward is slow; docs/benchmarks.md), with FastDropout on the attention probabilities when --fast_dropout is on."""
    fast_dropout: bool = True
    """On CPU, replace the model's nn.Dropout modules, and the attention-probability dropout, with FastDropout (training/model.py: four 16-bit draws per 64-bit random number, ~2.8x faster dropout, same keep probability to 2^-16). No effect on GPU."""
    fused_optimizer: bool = True
    """Fused AdamW kernel (CPU and CUDA): one kernel for all parameters, ~4x faster optimizer steps on CPU than the multi-tensor one."""
    # ------------------------------------------------------------------------------------------ data
    dataset_name: str = "ag_news"
    """Hub dataset with train/test splits; ignored when --train_file is given."""
    train_file: Optional[str] = None
    """Local training data (.csv, .jsonl/.json or .parquet) with a text and a label column."""
    validation_file: Optional[str] = None
    """Local validation data; default: a seeded slice of the training data (see validation_split)."""
    test_file: Optional[str] = None
    """Local test data, scored once at the end with the best model; default: the Hub dataset's test split."""
    text_column_names: list[str] = dataclasses.field(default_factory=lambda: ["text"])
    """Text column(s), comma-separated; several are joined with text_column_delimiter (e.g. Title,Description)."""
    text_column_delimiter: str = " "
    """What joins several text columns into one text."""
    text_pair_column: Optional[str] = None
    """A second text column for sentence-pair tasks: each example is tokenized as (text, text_pair)."""
    label_column: str = "label"
    """Name of the label column (any name, e.g. "Class Index")."""
    label_names: Optional[list[str]] = None
    """Class names, one per distinct training label value in sorted order (integers numerically, strings as
    strings), comma-separated. Default: a Hub dataset's ClassLabel names, else the values themselves."""
    validation_split: float = 0.05
    """Fraction of the training data held out (seeded, deterministic) when no validation file is given."""
    num_samples: Optional[int] = None
    """Use only N examples of each split (seeded shuffle), for quick runs."""
    max_length: int = 128
    """Truncate texts to this many tokens."""
    pad_to_multiple_of: Optional[int] = None
    """Pad each batch to a multiple of this many tokens. Default: 8 on GPU (tensor-core shapes), 1 on CPU (no rounding: ~8% faster training there)."""
    group_by_length: bool = True
    """Batch texts of similar length together (less padding); every rank still gets an equal, disjoint shard."""
    dataloader_num_workers: int = 0
    """DataLoader worker processes per rank (0 = load in the training process)."""
    # ------------------------------------------------------------------------------------ optimization
    num_train_epochs: int = 2
    """Passes over the training data."""
    max_train_steps: Optional[int] = None
    """Stop after this many optimizer steps (overrides num_train_epochs)."""
    per_device_train_batch_size: int = 32
    """Training examples per process per forward pass."""
    per_device_eval_batch_size: int = 64
    """Evaluation examples per process per forward pass."""
    gradient_accumulation_steps: int = 1
    """Forward/backward passes per optimizer step."""
    learning_rate: float = 5e-5
    """Peak learning rate of AdamW (before --scale_lr)."""
    scale_lr: str = "none"
    """'linear' multiplies the learning rate by the number of processes (linear scaling rule); 'none' keeps it."""
    weight_decay: float = 0.01
    """AdamW weight decay; never applied to biases and LayerNorm weights."""
    warmup_ratio: float = 0.1
    """Fraction of optimizer steps with linear warmup, then the --lr_scheduler_type schedule."""
    lr_scheduler_type: str = "linear"
    """Learning-rate schedule after warmup (transformers.get_scheduler): linear, cosine, cosine_with_restarts, polynomial, constant or constant_with_warmup."""
    max_grad_norm: float = 1.0
    """Clip the gradient norm to this value (0 disables clipping)."""
    mixed_precision: Optional[str] = None
    """'no', 'fp16' or 'bf16'. Default: the accelerate config's fp16/bf16 if it sets one, else bf16 where the hardware has native bf16 (bf16 GPUs; CPUs with AMX or AVX512-BF16), else no (fp32)."""
    seed: int = 42
    """Seed for model init, data order, dropout and the validation split."""
    # ------------------------------------------------------------------------ evaluation and stopping
    eval_steps: Optional[int] = None
    """Also evaluate every N optimizer steps (always at the end of each epoch)."""
    metric_for_best_model: str = "accuracy"
    """Validation metric that picks the best model: 'accuracy' or 'macro_f1'."""
    early_stopping_patience: Optional[int] = None
    """Stop after N evaluations without improvement of metric_for_best_model."""
    extra_metrics: Optional[list[str]] = None
    """More `evaluate` metrics to report, by Hub name or local path (comma-separated), e.g. matthews_correlation; loaded and checked at start."""
    # ---------------------------------------------------------------------- checkpoints and logging
    output_dir: str = "checkpoints"
    """Folder for the best model, tokenizer, config, metrics and resumable state."""
    export_hf_format: bool = True
    """Also write the best model in Hugging Face format (model.safetensors and tokenizer files beside config.json), so `transformers.pipeline("text-classification", model=output_dir)` loads it. Doubles the weights on disk."""
    checkpointing_steps: str = "epoch"
    """Save resumable state every N optimizer steps, at each 'epoch' end, or 'none'."""
    save_total_limit: Optional[int] = None
    """Keep only the newest N resumable states (by step); the best model's files are never deleted."""
    resume_from_checkpoint: Optional[str] = None
    """'latest' (newest state under output_dir/state, by recorded step) or a path to a state/step_N folder."""
    logging_steps: int = 50
    """Log the loss (mean over all ranks) every N optimizer steps."""
    push_to_hub: bool = False
    """Upload the best model (Hugging Face format, state_dict, tokenizer, card, reports) to --hub_model_id at the end, from the main process."""
    hub_model_id: Optional[str] = None
    """Hub repository (user/name or org/name) for --push_to_hub; the token comes from HF_TOKEN or `hf auth login`."""
    hub_private_repo: bool = False
    """Create the Hub repository as private."""
    report_to: str = "none"
    """Experiment tracker(s) for accelerate: 'none', 'all', or comma-separated names such as 'tensorboard,wandb'."""
    stop_check_steps: int = 10
    """Every N optimizer steps the ranks agree (one tiny all-reduce) on stopping for SIGTERM or a diverged loss."""
    max_nonfinite_steps: int = 5
    """Stop with an error after this many consecutive batches with a NaN/inf loss."""
    ddp_timeout: int = 1800
    """Seconds a collective may wait for the other ranks before the job fails."""
    find_unused_parameters: bool = False
    """DDP option for models with parameters that get no gradient; slower, off by default."""
    preset: Optional[str] = None
    """'smoke': offline synthetic news data, a tokenizer trained on it and a tiny DistilBERT (CPU, < 1 min)."""

    def effective_batch_size(self, num_processes: int) -> int:
        """Examples per optimizer step across all ranks."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * num_processes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def presets() -> dict[str, dict[str, Any]]:
    """Named bundles of defaults; explicit YAML and CLI values still win."""
    root = smoke_dir()
    return {
        "smoke": {
            "model_name_or_path": str(root / "model"),
            "from_scratch": True,
            "train_file": str(root / "train.csv"),
            "test_file": str(root / "test.csv"),
            "validation_split": 0.1,
            "max_length": 64,
            "num_train_epochs": 3,
            "per_device_train_batch_size": 16,
            "per_device_eval_batch_size": 64,
            "learning_rate": 1e-3,
            "warmup_ratio": 0.1,
            "logging_steps": 50,
            "label_names": list(SMOKE_LABELS),  # the data's class ids 0..3, named as AG News names them
            "mixed_precision": "no",  # fp32: the same numbers on every CPU, AMX or not
        }
    }


# --------------------------------------------------------------------------------------------- parsing


def field_docs(cls: type = TrainConfig) -> dict[str, str]:
    """Attribute docstrings of a dataclass, read from its source (Python keeps no runtime record of them)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(int | str | float | bool | list, optional?) for a field annotation such as Optional[int]."""
    hint = annotation
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0]
    origin = typing.get_origin(hint)
    return (origin or hint), optional


def _coerce(name: str, value: Any) -> Any:
    """Convert a YAML or CLI value to the field's type, or raise ConfigError naming the field."""
    hints = typing.get_type_hints(TrainConfig)
    kind, optional = _base_type(hints[name])
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{name}: a value is required")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if kind is list:  # a list, or comma-separated strings (--label_names World,Sports or World Sports)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise ConfigError(f"{name}: expected a list of strings, got {value!r}")
        return [part.strip() for item in items for part in item.split(",") if part.strip()]
    if kind is int:
        if isinstance(value, bool) or isinstance(value, float):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if kind is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return str(value)


def validate(cfg: TrainConfig) -> None:
    """Reject impossible combinations with one message naming the field."""

    def need(ok: bool, name: str, message: str) -> None:
        if not ok:
            raise ConfigError(f"{name}: {message} (got {getattr(cfg, name)!r})")

    for name in ("num_train_epochs", "per_device_train_batch_size", "per_device_eval_batch_size",
                 "gradient_accumulation_steps", "max_length", "logging_steps", "ddp_timeout", "stop_check_steps",
                 "max_nonfinite_steps"):
        need(getattr(cfg, name) >= 1, name, "must be >= 1")
    for name in ("max_train_steps", "num_samples", "eval_steps", "early_stopping_patience", "save_total_limit"):
        need(getattr(cfg, name) is None or getattr(cfg, name) >= 1, name, "must be >= 1 or none")
    need(cfg.max_length >= 8, "max_length", "must be >= 8")
    need(cfg.learning_rate > 0, "learning_rate", "must be > 0")
    need(cfg.weight_decay >= 0, "weight_decay", "must be >= 0")
    need(0 <= cfg.warmup_ratio < 1, "warmup_ratio", "must be in [0, 1)")
    need(cfg.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
    need(cfg.dropout is None or 0 <= cfg.dropout < 1, "dropout", "must be in [0, 1) or none")
    need(0 < cfg.validation_split < 1, "validation_split", "must be in (0, 1)")
    need(cfg.dataloader_num_workers >= 0, "dataloader_num_workers", "must be >= 0")
    need(cfg.scale_lr in ("none", "linear"), "scale_lr", "must be 'none' or 'linear'")
    need(cfg.mixed_precision in (None, "no", "fp16", "bf16"), "mixed_precision", "must be no, fp16 or bf16")
    need(cfg.pad_to_multiple_of is None or cfg.pad_to_multiple_of >= 1, "pad_to_multiple_of", "must be >= 1")
    need(cfg.attn_implementation in (None, "sdpa", "eager"), "attn_implementation", "must be sdpa or eager")
    need(cfg.metric_for_best_model in METRICS, "metric_for_best_model", f"must be one of {', '.join(METRICS)}")
    need(cfg.lr_scheduler_type in SCHEDULERS, "lr_scheduler_type", f"must be one of {', '.join(SCHEDULERS)}")
    need(bool(cfg.text_column_names), "text_column_names", "needs at least one column")
    need(not cfg.push_to_hub or bool(cfg.hub_model_id), "hub_model_id", "is needed with --push_to_hub")
    need(cfg.preset in (None, *presets()), "preset", f"must be one of {', '.join(presets())}")
    need(cfg.checkpointing_steps in ("epoch", "none") or (cfg.checkpointing_steps.isdigit()
         and int(cfg.checkpointing_steps) >= 1), "checkpointing_steps", "must be 'epoch', 'none' or a positive integer")
    trackers = [t.strip() for t in cfg.report_to.split(",")]
    unknown = [t for t in trackers if t not in TRACKERS]
    need(not unknown, "report_to", f"unknown tracker {unknown[0] if unknown else ''!r}; use {', '.join(TRACKERS)}")
    # accelerate only warns and logs nowhere when a named tracker is missing; a requested one must exist
    missing = [t for t in trackers if t not in ("none", "all") and not getattr(accelerate.utils, f"is_{t}_available")()]
    need(not missing, "report_to", f"tracker {missing[0] if missing else ''!r} is not installed (pip install it)")
    need(not cfg.label_names or len(set(cfg.label_names)) == len(cfg.label_names) >= 2,
         "label_names", "needs two or more distinct names")
    for name in ("train_file", "validation_file", "test_file"):
        path = getattr(cfg, name)
        need(path is None or Path(path).suffix.lower() in SUPPORTED_DATA_SUFFIXES, name,
             f"must end in one of {', '.join(SUPPORTED_DATA_SUFFIXES)}")
    need(cfg.train_file is not None or cfg.dataset_name.strip() != "", "dataset_name",
         "give a Hub dataset name or --train_file")
    resume = cfg.resume_from_checkpoint
    need(resume in (None, "latest") or Path(resume).is_dir(), "resume_from_checkpoint",
         "must be 'latest' or an existing state folder")


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose errors become ConfigError (one line, no usage dump); the caller exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def build_parser(prog: str = "train.py") -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=prog,
        description="Fine-tune a text classifier (DistilBERT on AG News by default). "
        "Precedence: defaults < --preset < --config YAML < flags.",
        argument_default=argparse.SUPPRESS,  # only flags given on the command line reach the namespace
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML file with TrainConfig fields")
    for old, new in RENAMED.items():
        parser.add_argument(f"--{old}", dest=new, nargs="+", metavar="NAME", help=f"old name of --{new}")
    docs = field_docs()
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        kind, _ = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        doc = docs.get(f.name, "").replace("%", "%%")  # argparse formats help strings with %
        kwargs: dict[str, Any] = {"help": f"{doc} (default: {default})"}
        if kind is bool:
            kwargs.update(nargs="?", const="true", metavar="{true,false}")
        elif kind is list:
            kwargs.update(nargs="+", metavar="NAME")
        else:
            kwargs["metavar"] = kind.__name__.upper()
        parser.add_argument(f"--{f.name}", **kwargs)
    return parser


def _read_yaml(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(f"config: file not found: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {path} is not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of field: value")
    return data


def load_config(argv: Optional[list[str]] = None) -> TrainConfig:
    """Parse CLI flags (and the YAML they point to) into a validated TrainConfig. Raises ConfigError."""
    cli = vars(build_parser().parse_args(argv))
    from_yaml = _read_yaml(cli.pop("config")) if "config" in cli else {}
    from_yaml = {RENAMED.get(key, key): value for key, value in from_yaml.items()}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for key in from_yaml:
        if key not in known:
            raise ConfigError(f"{key}: unknown field in the YAML config")
    preset = cli.get("preset", from_yaml.get("preset"))
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in presets():
            raise ConfigError(f"preset: must be one of {', '.join(presets())} (got {preset!r})")
        values.update(presets()[preset])
    values.update(from_yaml)
    values.update(cli)
    cfg = TrainConfig(**{name: _coerce(name, value) for name, value in values.items()})
    validate(cfg)
    return cfg
