"""The flag names of transformers' run_classification.py and the Trainer's TrainingArguments, read as ours (or refused
in one line naming ours). Called by config_parsing.py; docs/own-data.md has the table.
"""

from __future__ import annotations

from collections.abc import Callable

from training.config import ConfigError

TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _truth(flag: str, value: str) -> bool:
    said = str(value).lower()
    if said not in TRUE + FALSE:
        raise ConfigError(f"--{flag}: expected true or false (got {value!r})")
    return said in TRUE


def _as_is(_: str, value):
    return value


def _pad(flag: str, value) -> str:  # every batch max_length wide, or as wide as its longest text
    return "1" if _truth(flag, value) else "0"


def _precision(word: str) -> Callable:
    def convert(flag: str, value) -> str | None:
        return word if _truth(flag, value) else None

    return convert


def _strategy(flag: str, value) -> str:
    found = {"no": "none", "epoch": "epoch"}.get(str(value).lower())
    if found is None:
        raise ConfigError(
            f"--{flag} {value}: not ours; states are saved every --checkpointing_steps N, 'epoch' or 'none'"
        )
    return found


def _evaluations(flag: str, value):
    if str(value).lower() not in ("epoch", "steps"):
        raise ConfigError(f"--{flag} {value}: validation picks the best model, so it always runs (each epoch, and "
                          "every --eval_steps N)")  # fmt: skip
    return None  # each epoch, plus --eval_steps: what we do


def _always(what: str) -> Callable:
    def convert(flag: str, value):
        if not _truth(flag, value):
            raise ConfigError(f"--{flag} false: {what}")
        return None

    return convert


# flag: (our field, conversion; a conversion returning None sets nothing)
ALIASES: dict[str, tuple[str | None, Callable]] = {
    "max_seq_length": ("max_length", _as_is),
    "label_column_name": ("label_column", _as_is),
    "text_column_name": ("text_column_names", lambda flag, value: [value]),  # "a,b" split as ours is
    "metric_name": ("metric_for_best_model", _as_is),
    "pad_to_max_length": ("pad_buckets", _pad),
    "max_steps": ("max_train_steps", _as_is),
    "save_steps": ("checkpointing_steps", _as_is),
    "save_strategy": ("checkpointing_steps", _strategy),
    "fp16": ("mixed_precision", _precision("fp16")),
    "bf16": ("mixed_precision", _precision("bf16")),
    "eval_strategy": (None, _evaluations),
    "evaluation_strategy": (None, _evaluations),
    "do_train": (None, _always("this script trains; score a saved model with agnews evaluate")),
    "do_eval": (None, _always("validation picks the best model, so it always runs")),
    "do_predict": (None, lambda flag, value: _truth(flag, value) and None),  # the test split is scored when given
    "load_best_model_at_end": (None, _always("the best model is what is saved")),
    "use_fast_tokenizer": (None, _always("only fast (Rust) tokenizers are supported")),
    "overwrite_cache": (None, lambda flag, value: _truth(flag, value) and None),  # tokenized data is keyed by content
}
BOOLEAN = {"pad_to_max_length", "fp16", "bf16", "do_train", "do_eval", "do_predict", "load_best_model_at_end",
           "use_fast_tokenizer", "overwrite_cache"}  # fmt: skip
REFUSED = {  # flag: ours instead
    "shuffle_seed": "--seed (one seed shuffles, splits and initialises)",
    "max_train_samples": "--num_samples (for every split)",
    "max_eval_samples": "--num_samples (for every split)",
    "max_predict_samples": "--num_samples (for every split)",
    "remove_splits": "--train_split_name / --validation_split_name / --test_split_name",
    "cache_dir": "the HF_HOME environment variable",
    "token": "the HF_TOKEN environment variable (or `hf auth login`)",
    "config_name": "--model_name_or_path (its config.json)",
    "warmup_steps": "--warmup_ratio",
    "logging_dir": "--report_to tensorboard (logs under --output_dir)",
}


def normalised(argv: list[str]) -> list[str]:
    """HfArgumentParser's spellings: dashes for underscores, `--no_X` for `--X false` of a boolean alias."""
    out = []
    for token in argv:
        if not token.startswith("--") or token == "--":
            out.append(token)
            continue
        name, eq, value = token[2:].partition("=")
        name = name.replace("-", "_")
        if name.startswith("no_") and name[3:] in BOOLEAN and not eq:
            out += [f"--{name[3:]}", "false"]
        else:
            out.append(f"--{name}{eq}{value}")
    return out


def add_to(parser) -> None:
    """The borrowed flags, hidden from --help (docs/own-data.md lists them)."""
    import argparse

    for flag in [*ALIASES, *REFUSED]:
        boolean = flag in BOOLEAN or flag in REFUSED
        options = {"nargs": "?", "const": "true"} if boolean else {}
        parser.add_argument(f"--{flag}", dest=f"alias:{flag}", help=argparse.SUPPRESS, **options)


def resolve(cli: dict) -> dict:
    """The parsed flags with every borrowed name replaced by our field; a refused one is a ConfigError."""
    for flag in [key.removeprefix("alias:") for key in cli if key.startswith("alias:")]:
        value = cli.pop(f"alias:{flag}")
        if flag in REFUSED:
            raise ConfigError(f"--{flag}: run_classification.py's or the Trainer's flag; here: {REFUSED[flag]}")
        field, convert = ALIASES[flag]
        converted = convert(flag, value)
        if field is None or converted is None:
            continue
        if field in cli and cli[field] != converted:
            raise ConfigError(f"--{flag} and --{field} both given: they are the same setting here")
        cli[field] = converted
    return cli
