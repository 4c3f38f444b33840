"""A stand-in Hub at the HfApi boundary: create_repo and upload_folder log to FAKE_HUB_LOG."""

import json
import os
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.utils import filter_repo_objects

import contract.hub


def _record(entry: dict) -> None:
    with open(os.environ["FAKE_HUB_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({**entry, "rank": os.environ.get("RANK", "0"), "pid": os.getpid()}) + "\n")


def create_repo(self, repo_id, **options):
    _record({"call": "create_repo", "repo_id": repo_id, "private": options.get("private")})


def upload_folder(self, *, repo_id, folder_path, allow_patterns=None, ignore_patterns=None, **options):
    root = Path(folder_path)
    paths = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    sent = list(filter_repo_objects(paths, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
    _record({"call": "upload_folder", "repo_id": repo_id, "files": sent})


contract.hub.hub_reachable = lambda timeout=5.0: True
HfApi.create_repo, HfApi.upload_folder = create_repo, upload_folder
