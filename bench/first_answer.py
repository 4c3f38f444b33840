"""Time to the first answer on a new checkpoint (issue 41, point 5): `python -m inference` on a freshly made MiniLM
classifier with the default BACKEND=auto, measured from the process's start to its first 200 on POST /predict.

    python bench/first_answer.py          # about 5 minutes on 2 CPU cores

Not a CI test: it prints figures to record in docs/benchmarks.md. Two starts on two copies of the same new folder
(nothing converted or measured yet), in one run: MEASURE_IN_BACKGROUND=false (the candidates converted and measured
before the first answer, as before) and the default (PyTorch fp32 answers at once; the same race runs on a thread and
its choice is swapped in). For the default, also the time until the chosen runtime serves, and that choice against
the other start's (the same choice is the point).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from train_bench import LABELS, prepare_model  # noqa: E402


def new_checkpoint(work: Path) -> Path:
    """The pretrained MiniLM with a fresh 4-way head, saved as a save_pretrained folder (as a training run leaves)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    minilm, _ = prepare_model("minilm", work)
    folder = work / "new"
    model = AutoModelForSequenceClassification.from_pretrained(
        minilm, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)}
    )
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)
    return folder


def post(port: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/predict",
        data=b'{"inputs": "Stocks rallied"}',
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except OSError:
        return 0


def info(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=5) as response:
        return json.loads(response.read())["distilbert_agnews"]["runtime"]


def start(folder: Path, port: int, background: bool) -> dict:
    """Seconds to the first 200, and (background) to the chosen runtime; the runtime finally served."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MEASURE_IN_BACKGROUND": str(background).lower()}
    command = [sys.executable, "-m", "inference", "--model_id", str(folder), "--port", str(port)]
    command += ["--reload_interval_s", "0"]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while post(port) != 200:
            if process.poll() is not None:
                sys.exit(f"the service exited with {process.returncode}")
            time.sleep(0.05)
        first = time.perf_counter() - started
        while info(port).get("provisional"):
            time.sleep(0.2)
        settled = time.perf_counter() - started
        runtime = info(port)
    finally:
        process.terminate()
        process.wait(60)
    return {"first_answer_s": first, "chosen_s": settled, "chosen": f"{runtime['name']} {runtime['precision']}"}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options; --help says what it does
    with tempfile.TemporaryDirectory(prefix="first_answer_") as tmp:
        work = Path(tmp)
        folder = new_checkpoint(work)
        before, after = work / "before", work / "after"
        shutil.copytree(folder, before)
        shutil.copytree(folder, after)
        old = start(before, 8711, background=False)
        new = start(after, 8712, background=True)
    print(
        f"measured before the first answer (MEASURE_IN_BACKGROUND=false): first answer {old['first_answer_s']:.1f} s, "
        f"serving {old['chosen']}"
    )
    print(
        f"measured in the background (default): first answer {new['first_answer_s']:.1f} s (torch fp32), chosen "
        f"runtime serving after {new['chosen_s']:.1f} s: {new['chosen']}; "
        f"{old['first_answer_s'] / new['first_answer_s']:.1f}x sooner; same choice: {new['chosen'] == old['chosen']}"
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")


if __name__ == "__main__":
    main()
