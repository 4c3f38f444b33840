"""The Hugging Face Hub: is it reachable (one short probe, so an offline machine fails in seconds), switching to the
cache when not, and what would work when something cannot load. Training and serving ask this first: without a
network, `from_pretrained` and `load_dataset` retry for a minute.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import urllib.error
import urllib.request

import huggingface_hub.constants

from contract.errors import UserError

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # a Hub repository id: org/name


def hub_url() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def is_offline() -> bool:
    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def hub_reachable(timeout: float = 5.0) -> bool:
    """One HEAD request; any server answer counts as reachable."""
    try:
        urllib.request.urlopen(urllib.request.Request(hub_url(), method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


logger = logging.getLogger(__name__)

OFFLINE_HELP = {  # by command: what would work without the Hub
    "train": "To try the whole pipeline offline, run `python training/train.py --preset smoke` (synthetic data and a "
    "tiny model, no downloads). To train on your own data without the Hub, pass --train_file (csv, jsonl or parquet "
    "with text and label columns) and --model_name_or_path minilm (a pretrained MiniLM installed with the package) "
    "or a local folder written by save_pretrained.",
    "evaluate": "To evaluate without the Hub, pass --test_file (csv, jsonl or parquet with text and label columns) "
    "or --preset smoke.",
    "download": "Run `python -m training.download` where the Hub can be reached, then copy its folder here.",
}


def command() -> str:
    """The running command's name: train, evaluate, ..."""
    return os.path.basename(sys.argv[0]).removesuffix(".py").split()[-1] if sys.argv and sys.argv[0] else "train"


def looks_local(name: str) -> bool:
    """A folder-like name rather than a Hub id: runs/nope where runs/ is a folder here."""
    pathlike = name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep in name.replace("/", "")
    return pathlike or ("/" in name and os.path.isdir(name.split("/")[0]))


def go_offline() -> None:
    """Switch the Hugging Face libraries to cache-only loading: the variables for later imports, the flags for
    loaded ones."""
    os.environ.update(HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1")  # what an `evaluate` imported later reads
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    if "datasets.config" in sys.modules:  # the service's install has no datasets
        sys.modules["datasets.config"].HF_HUB_OFFLINE = True
    if "evaluate.config" in sys.modules:  # not imported here: prediction never needs `evaluate`
        sys.modules["evaluate.config"].HF_EVALUATE_OFFLINE = True


def ensure_hub_or_offline(needs_hub: bool) -> None:
    """Probe the Hub when needed; unanswered, use the cache."""
    if not needs_hub or is_offline():
        return
    if not hub_reachable():
        logger.warning("The Hugging Face Hub (%s) did not answer; loading from the local cache only.", hub_url())
        go_offline()


def explain_missing(what: str, exc: BaseException, name: str | None = None) -> UserError:
    """One paragraph: what could not load, and what would work."""
    if name is not None and looks_local(name) and not os.path.exists(os.path.expanduser(name)):
        return UserError(f"Cannot load {what}: there is no folder {name} (a Hub id reads org/name)")
    where = "the Hub is unreachable (offline mode)" if is_offline() else "it could not be loaded"
    reason = " ".join(str(exc).split())[:300]
    hint = OFFLINE_HELP.get(command(), "")
    return UserError(f"Cannot load {what}: {where} and it is not in the local cache ({reason}). {hint}")
