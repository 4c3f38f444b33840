"""Is the Hugging Face Hub reachable? One short probe, so an offline machine fails in seconds, not minutes.

Without a network, `from_pretrained`, `snapshot_download` and `load_dataset` retry for about a minute before
giving up. Serving and training both ask this once before touching the Hub.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request

import huggingface_hub.constants

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # org/name: a Hub repository id, as the service and the model card read it


def hub_url() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def is_offline() -> bool:
    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def hub_reachable(timeout: float = 5.0) -> bool:
    """One HEAD request to the Hub; any answer from the server (even an error status) counts as reachable."""
    try:
        urllib.request.urlopen(urllib.request.Request(hub_url(), method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True
