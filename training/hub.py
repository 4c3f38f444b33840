"""Fail fast when the Hugging Face Hub is out of reach.

Without a network, `from_pretrained` and `load_dataset` retry for about a minute before giving up. We probe
the Hub once with a short timeout; if it does not answer, we switch the libraries to offline mode, so what
is already in the local cache still loads and anything else fails at once with a message that says what to
do instead.
"""

from __future__ import annotations

import logging
import os
import sys

import datasets.config
import huggingface_hub.constants

from contract.errors import UserError
from contract.hub import hub_reachable, hub_url, is_offline

logger = logging.getLogger(__name__)

OFFLINE_HELP = (
    "To try the whole pipeline offline, run `python training/train.py --preset smoke` (synthetic data and a tiny "
    "model, no downloads). To train on your own data without the Hub, pass --train_file (and optionally "
    "--validation_file / --test_file: csv, jsonl or parquet with text and label columns) and "
    "--model_name_or_path pointing to a local model folder (one written by save_pretrained)."
)


class HubUnavailableError(UserError, RuntimeError):
    """The Hub cannot be reached and what the run needs is not in the local cache."""


def go_offline() -> None:
    """Switch huggingface_hub, transformers, datasets and evaluate to cache-only loading for this process.

    The libraries read HF_HUB_OFFLINE when they are imported, so setting the variable now is not enough:
    we also flip the flags they consult at call time.
    """
    os.environ.update(HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1")  # what an `evaluate` imported later reads
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    if "evaluate.config" in sys.modules:  # not imported here: prediction never needs `evaluate`
        sys.modules["evaluate.config"].HF_EVALUATE_OFFLINE = True


def ensure_hub_or_offline(needs_hub: bool) -> None:
    """Probe the Hub when the run needs it; without an answer, continue from the cache only."""
    if not needs_hub or is_offline():
        return
    if not hub_reachable():
        logger.warning("The Hugging Face Hub (%s) did not answer; loading from the local cache only.", hub_url())
        go_offline()


def explain_missing(what: str, exc: BaseException) -> HubUnavailableError:
    """A one-paragraph error for a Hub resource that could not be loaded from the network or the cache."""
    where = "the Hub is unreachable (offline mode)" if is_offline() else "it could not be loaded"
    reason = " ".join(str(exc).split())[:300]
    return HubUnavailableError(
        f"Cannot load {what}: {where} and it is not in the local cache ({reason}). {OFFLINE_HELP}"
    )
