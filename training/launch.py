"""`agnews launch ...`: `accelerate launch ...` without its noise; and the precision a launcher asked for (read by
train.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import torch
import yaml
from accelerate.commands.launch import launch_command, launch_command_parser
from accelerate.logging import get_logger
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from contract import precision

logger = get_logger(__name__)  # the main process says it (as train.py did)


def verbose(script_args: list[str]) -> bool:
    """The run's own --verbose (train.py's flag takes an optional true/false)."""
    if "--verbose" not in script_args:
        return False
    following = script_args[script_args.index("--verbose") + 1 :][:1]
    return following != ["false"]


def config_problem(path: str | None) -> str | None:
    """Why accelerate could not read --config_file (it would answer with a traceback), or None."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            found = yaml.safe_load(fh)
    except OSError as exc:
        return f"--config_file {path}: {exc.strerror} (accelerate_configs/ holds ready ones, e.g. cpu_2proc.yaml)"
    except yaml.YAMLError as exc:
        return f"--config_file {path}: not YAML ({str(exc).splitlines()[0]})"
    if not isinstance(found, dict):
        return f"--config_file {path}: not an accelerate config (a YAML mapping of launch settings)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if problem := config_problem(args.config_file):
        sys.stderr.write(f"agnews launch: error: {problem}\n")
        return 2
    if verbose(args.training_script_args):
        launch_command(args)
        return 0
    logging.getLogger("accelerate.commands.launch").setLevel(logging.ERROR)  # the defaults block is a warning
    try:
        launch_command(args)
    except subprocess.CalledProcessError as exc:  # one process (accelerate's simple launcher)
        return exc.returncode
    except ChildFailedError as exc:  # several processes (torch's elastic launcher, used by accelerate)
        return exc.get_first_failure()[1].exitcode
    return 0


def launcher_precision() -> str:
    """The launcher's precision, or "no"."""
    return os.environ.get("ACCELERATE_MIXED_PRECISION", "no")


def mixed_precision(asked: str) -> str:
    """accelerate's precision for a run: the flag, else the launcher's, else auto's choice."""
    launcher = launcher_precision()
    if asked == precision.AUTO and launcher != "no":
        return launcher
    return precision.accelerate_name(precision.resolve(asked, "cuda" if torch.cuda.is_available() else "cpu"))


def say_overridden_precision(asked: str, used: str) -> None:
    """Say once that --mixed_precision overrode the launcher."""
    launcher = launcher_precision()
    if launcher not in ("no", used):
        logger.warning(
            "accelerate launch asked for %s, but --mixed_precision %s (flag, YAML or preset) decides: training in %s. "
            "Pass --mixed_precision %s to train in %s.",
            *(launcher, asked, precision.canonical(used), launcher, launcher),
        )


if __name__ == "__main__":
    sys.exit(main())
