"""The texts a runtime is checked and int8-calibrated on: CALIBRATION_FILE, else the checkpoint's recorded sample, else
the shipped English sample; every third held out.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from contract import files
from inference.settings import SettingsError

SAMPLE = Path(__file__).parents[1] / "texts" / "english.txt"  # sentences written for this project, many registers
SAMPLE_TEXTS = 600
HELD_OUT_EVERY = 3  # held out for the agreement check
MAX_CALIBRATION, MAX_HELD_OUT = 300, 200


def calibration_texts(folder: Path, calibration_file: str | None) -> tuple[list[str], str]:
    """Real texts and their source ([] when none)."""
    if calibration_file:
        texts = _read_texts(Path(calibration_file))
        return texts, f"CALIBRATION_FILE {calibration_file} ({len(texts)} texts)"
    recorded = folder / files.CALIBRATION
    if recorded.is_file():
        texts = _read_texts(recorded)
        return texts, f"{files.CALIBRATION} of the checkpoint ({len(texts)} texts)"
    texts = sample_texts()
    return texts, f"the English sample shipped with the service ({len(texts)} texts; set CALIBRATION_FILE for yours)"


def sample_texts(n: int = SAMPLE_TEXTS) -> list[str]:
    """`n` fixed texts of the shipped sample, using every sentence."""
    sentences = [line.strip() for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    count = len(sentences)
    return [" ".join(sentences[(i * 67 + j * 89) % count] for j in range(1 + i % 3)) for i in range(n)]


def _read_texts(path: Path) -> list[str]:
    """Texts of a .txt, .jsonl, .csv or .json file."""
    try:
        raw = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(raw)
            texts = data["texts"] if isinstance(data, dict) else data
        elif path.suffix == ".jsonl":
            texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
        elif path.suffix == ".csv":
            texts = [row["text"] for row in csv.DictReader(raw.splitlines())]
        else:
            texts = raw.splitlines()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SettingsError(f"CALIBRATION_FILE: {path}: cannot read texts ({type(exc).__name__}: {exc})") from None
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise SettingsError(f"CALIBRATION_FILE: {path}: holds no texts")
    return texts


def split(texts: list[str]) -> tuple[list[str], list[str]]:
    """(calibration, held out)."""
    held = texts[::HELD_OUT_EVERY][:MAX_HELD_OUT]
    calibration = [t for i, t in enumerate(texts) if i % HELD_OUT_EVERY][:MAX_CALIBRATION]
    return calibration, held
