"""`agnews COMMAND [ARGS]`: one name for every command. Each runs its module as `python -m MODULE` would; `--help`
answers without importing torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import runpy
import sys

COMMANDS = {  # name: (module, what it does)
    "train": ("training.train", "fine-tune a classifier (accelerate launch -m training.train for several processes)"),
    "evaluate": ("training.evaluate", "score a checkpoint on a labelled split: per-class table, confusion matrix"),
    "tune": ("training.tune", "search learning rate, epochs, batch size, ... with optuna (pruned, resumable)"),
    "predict": ("training.predict", "label a csv / jsonl / parquet file with a checkpoint"),
    "distill": ("training.distill", "train a smaller student on a teacher's scores of unlabelled files"),
    "launch": ("training.launch", "accelerate launch, quieter: the same arguments (several processes, GPUs, nodes)"),
    "serve": ("inference", "the text-embeddings-inference compatible service (POST /predict)"),
    "export": ("inference.export", "convert a checkpoint for an optimized CPU runtime before serving it"),
    "push": ("training.push", "upload a checkpoint folder to the Hugging Face Hub"),
    "download": ("training.download", "fetch a model and dataset into the local cache for offline machines"),
    "check-env": ("training.check_env", "what this machine and its processes can do: devices, collectives, speed"),
    "examples": ("training.examples", "write the files the docs' commands read: mine.csv, news.csv, unlabelled.csv"),
}


PARSERS = {  # where each parser is built without torch
    "train": "training.config_parsing:build_parser",
    "tune": "training.tune:build_parser",
    "evaluate": "training.arguments:evaluate",
    "predict": "training.arguments:predict",
    "distill": "training.arguments:distill",
    "push": "training.arguments:push",
    "download": "training.arguments:download",
    "check-env": "training.arguments:check_env",
    "examples": "training.examples:build_parser",
}


TRAINING_ONLY = ("accelerate", "datasets")  # the train extra's: a serve-only install (`.[serve]`) has neither


def missing_extra(name: str) -> str | None:
    """The training package a command needs and this install lacks, or None."""
    if COMMANDS[name][0].startswith("inference"):
        return None
    return next((module for module in TRAINING_ONLY if importlib.util.find_spec(module) is None), None)


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return "usage: agnews COMMAND [ARGS]  (agnews COMMAND --help: its arguments)\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"agnews: no command {name!r}; one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if missing := missing_extra(name):
        print(f"agnews {name}: needs {missing}, which this install lacks: pip install 'distilbert-agnews[train]'",
              file=sys.stderr)  # fmt: skip
        return 2
    sys.argv = [f"agnews {name}", *rest]
    if name in PARSERS and any(arg in ("-h", "--help") for arg in rest):
        module, function = PARSERS[name].split(":")
        getattr(importlib.import_module(module), function)().print_help()
        return 0
    try:
        runpy.run_module(COMMANDS[name][0], run_name="__main__", alter_sys=True)
    except SystemExit as exit_:  # the command's own exit code
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
