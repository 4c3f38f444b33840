"""A teacher that is a running service of this project (`agnews distill --teacher http://...`): its contract read from
/info, the files' texts posted to its /predict for raw scores, each shard's scores written once (a rerun skips it).
Called by training/distill/teacher.py.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

import torch
from tqdm.auto import tqdm

from contract.errors import UserError
from contract.problem_types import ProblemType
from training.batch.service_scorer import raw_logits
from training.batch.shards import expand
from training.data.reading import load_file

logger = logging.getLogger(__name__)
BATCH = 32  # texts per request: within every service's MAX_CLIENT_BATCH_SIZE


def _call(url: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise UserError(f"teacher: {url} answered {exc.code}: {exc.read().decode()[:200]}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise UserError(f"teacher: {url} cannot be reached ({exc}); is the service running?") from None


def teacher_at(url: str, teacher_class):
    """The Teacher a service's /info describes: its labels in output order and how it decides."""
    info = _call(f"{url}/info")
    try:
        id2label = next(iter(info["model_type"].values()))["id2label"]
        names = [id2label[str(i)] for i in range(len(id2label))]
        card = info["distilbert_agnews"]["problem_type"]
        problem = ProblemType.named(card["name"], len(names), tuple(card.get("decision_thresholds") or ()))
    except (KeyError, TypeError, StopIteration) as exc:
        raise UserError(f"teacher: {url}/info is not this project's service ({type(exc).__name__}: {exc})") from None
    return teacher_class(url, problem, names)


def logits(teacher, inputs: list[list[str]]) -> torch.Tensor:
    """The service's raw scores (logits) of `inputs` (each [text] or [text, pair]), in its output order."""
    # no `truncate`: the service windows long texts where it chunks (LONG_TEXT), else AUTO_TRUNCATE decides
    batches = (inputs[start : start + BATCH] for start in range(0, len(inputs), BATCH))
    return torch.cat([raw_logits(teacher.where, batch, teacher.names, "teacher") for batch in batches])


def label_files(teacher, inputs: str, out: Path, columns) -> None:
    """Each shard's rows with the service's scores as `agnews predict` writes them, into `out`/<stem>.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    _, paths = expand(inputs)
    for path in tqdm(paths, desc="Teacher", unit="shard"):
        target = out / f"{Path(path).stem}.jsonl"
        if target.is_file():
            continue
        read = load_file(path)
        texts = {name: [str(t) for t in read[name]] for name in columns.texts()}
        scores = teacher.problem.scores(logits(teacher, [list(each) for each in zip(*texts.values())]))
        found = {**texts, **teacher.problem.prediction_values(scores, teacher.names)}
        rows = [{k: _plain(v[i]) for k, v in found.items()} for i in range(len(scores))]
        staged = target.with_name(f".{target.name}.tmp")
        staged.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        os.replace(staged, target)  # whole or absent: a rerun scores it again
    logger.info("Teacher: %d shards scored by %s", len(paths), teacher.where)


def _plain(value):
    return value.item() if hasattr(value, "item") else value
