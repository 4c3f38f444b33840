"""Files the tests write or lock: data rows in any format, a model's weights re-saved, folders made read-only."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from training.output.resume import complete_states


@contextlib.contextmanager
def read_only(*folders: Path):
    """`folders` made immutable for the block (chattr +i, else chmod); skipped, saying why, where neither works."""
    if os.geteuid() != 0:
        for folder in folders:
            folder.chmod(0o555)
        restore = [["chmod", "755", str(f)] for f in folders]
    else:
        if not shutil.which("chattr"):
            pytest.skip("running as root without chattr: no way to make a folder read-only here")
        made = subprocess.run(["chattr", "+i", *map(str, folders)], capture_output=True, text=True)
        if made.returncode != 0:
            subprocess.run(["chattr", "-i", *map(str, folders)], capture_output=True)
            pytest.skip(f"running as root and chattr +i fails here ({made.stderr.strip()}): no read-only folder")
        restore = [["chattr", "-i", *map(str, folders)]]
    try:
        yield
    finally:
        for command in restore:
            subprocess.run(command, check=True)


def write_rows(path: Path, rows: list[dict]) -> Path:
    """Write rows as csv, jsonl or parquet depending on the suffix."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        frame.to_parquet(path)
    return path


def save_new_weights(folder: Path, state: dict) -> None:
    """New weights in a checkpoint folder as training publishes them: the state_dict by rename, then config.json
    recording their tensors' sha256 (contract/files.py: WEIGHTS_SHA256), so the pair is one consistent set."""
    import torch

    from contract import files

    weights = folder / files.WEIGHTS
    torch.save(state, weights.with_suffix(".tmp"))
    os.replace(weights.with_suffix(".tmp"), weights)
    config = json.loads((folder / files.CONFIG).read_text())
    config[files.WEIGHTS_SHA256] = {files.WEIGHTS: files.tensors_sha256(state)}
    (folder / files.CONFIG).with_suffix(".tmp").write_text(json.dumps(config))
    os.replace((folder / files.CONFIG).with_suffix(".tmp"), folder / files.CONFIG)


def find_latest_state(output_dir: str | Path) -> Path | None:
    """The complete state folder with the highest recorded optimizer step (not the newest mtime)."""
    states = complete_states(output_dir)
    return states[-1][1] if states else None
