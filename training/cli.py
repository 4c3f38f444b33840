"""The one runner of every command: logging, quiet ranks, a UserError as one line and its exit code, the trackers ended.
Called by each command's `cli()`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from accelerate import Accelerator
from tqdm.contrib.logging import logging_redirect_tqdm

from contract.errors import UserError

logger = logging.getLogger(__name__)


# their INFO lines repeat ours: shown with --verbose only
CHATTY = ("accelerate.accelerator", "accelerate.checkpointing")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S", level=logging.INFO
    )
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


def usage_error(prog: str, exc: UserError) -> int:
    """A command line that cannot start, argparse's way; its exit code."""
    sys.stderr.write(f"{prog}: error: {exc}\n")
    return exc.exit_code


def run_command(work: Callable[[], object], accelerator: Accelerator | None = None) -> int:
    """`work()` under the commands' rules; its int, else 0, or the UserError's code."""
    if accelerator is not None and not accelerator.is_local_main_process:
        import datasets  # push needs neither library
        import transformers

        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    if accelerator is not None and accelerator.device.type == "cpu":
        from training.speed.cpu_speed import choose_threads  # imported here: it imports transformers

        choose_threads(int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes)))  # torchrun sets it
    try:
        with logging_redirect_tqdm():
            result = work()
        return result if isinstance(result, int) else 0
    except UserError as exc:  # every rank raises the same error (training/guards.py); one says it
        if accelerator is None or accelerator.is_main_process:
            logger.error("%s", exc)
        return exc.exit_code
    finally:
        if accelerator is not None:
            accelerator.end_training()  # the group destroyed: gloo may abort at exit otherwise
