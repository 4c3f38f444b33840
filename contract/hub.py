"""Is the Hub reachable? One short probe, so an offline machine fails in seconds.

Without a network, `from_pretrained` and `load_dataset` retry for a minute. Training and serving ask this first.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request

import huggingface_hub.constants

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
