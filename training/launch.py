"""`agnews launch ...` is `accelerate launch ...`: the same arguments, accelerate's own launcher, minus its noise.

Hidden unless the run is given --verbose: the block of launcher values accelerate filled in by default (printed on
every launch without an accelerate config) and the launcher's traceback after a run that failed, whose processes
have already said why in one line. The exit code is the run's.
"""

from __future__ import annotations

import logging
import subprocess
import sys

from accelerate.commands.launch import launch_command, launch_command_parser
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def verbose(script_args: list[str]) -> bool:
    """The run's own --verbose (train.py's flag takes an optional true/false)."""
    if "--verbose" not in script_args:
        return False
    following = script_args[script_args.index("--verbose") + 1 :][:1]
    return following != ["false"]


def main(argv: list[str] | None = None) -> int:
    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
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


if __name__ == "__main__":
    sys.exit(main())
