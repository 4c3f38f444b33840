"""AGREEMENT_WITH: a model is served only where it agrees with the one it replaces (a distilled student and its
teacher): at start and at every reload, both score the student's recorded held-out texts (distillation.json), else the
service's calibration texts, and a student under MIN_AGREEMENT is refused, the current model serving on. Called by the
service's loads (engine/service.py).
"""

from __future__ import annotations

import json
import logging
import threading

from contract import agreement, precision
from contract.loading import CheckpointError, LoadedModel, load_model
from inference.runtimes.texts import calibration_texts
from inference.settings import Settings

logger = logging.getLogger(__name__)
MAX_TEXTS = 1000  # scored twice per load; a recorded file may hold more
MAX_RECORD_BYTES = 64 << 20  # a record beyond this is not read (the texts used are capped anyway)
_teachers: dict[str, LoadedModel] = {}  # loaded once per service
_measured: dict[tuple, dict] = {}  # the last (teacher, weights, texts) measured: the background runtime reloads them
_lock = threading.Lock()


def teacher_of(settings: Settings) -> LoadedModel:
    with _lock:
        if settings.agreement_with not in _teachers:
            _teachers[settings.agreement_with] = load_model(
                settings.agreement_with, device=settings.device, dtype=precision.FP32
            )
        return _teachers[settings.agreement_with]


def held_out(student: LoadedModel, settings: Settings) -> tuple[list[str], list[str] | None, str]:
    """The texts (and pairs) the student never trained on, as its run recorded them; else the calibration texts."""
    record = student.folder / agreement.RECORD
    if record.is_file() and record.stat().st_size <= MAX_RECORD_BYTES:
        try:
            kept = json.loads(record.read_text(encoding="utf-8"))["held_out"]
            texts, pairs = list(kept["texts"][:MAX_TEXTS]), kept.get("text_pairs")
            pairs = None if pairs is None else list(pairs[: len(texts)])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{record}: cannot read its held-out texts ({type(exc).__name__}: {exc})") from None
        if texts and all(isinstance(t, str) for t in texts + (pairs or [])) and len(pairs or texts) == len(texts):
            return texts, pairs, f"{len(texts)} held-out texts of {agreement.RECORD}"
        raise CheckpointError(f"{record}: its held-out texts must be strings (and as many pairs)")
    texts, source = calibration_texts(student.folder, settings.calibration_file)
    return texts[:MAX_TEXTS], None, source


def check(settings: Settings, student: LoadedModel) -> None:
    """CheckpointError (the reload keeps the current model) unless `student` agrees with AGREEMENT_WITH."""
    if not settings.agreement_with:
        return
    teacher = teacher_of(settings)
    if why := agreement.other_task(teacher, student):
        raise CheckpointError(f"AGREEMENT_WITH: {why}")
    texts, pairs, source = held_out(student, settings)
    key = (settings.agreement_with, student.sha256, hash((tuple(texts), tuple(pairs or ()))))
    if key not in _measured:
        _measured.clear()
        ours, theirs = agreement.logits_of(student, texts, pairs), agreement.logits_of(teacher, texts, pairs)
        _measured[key] = agreement.measure(teacher.problem, ours, theirs)
    measured = _measured[key]
    share = measured["agreement"]
    if share is None or share < settings.min_agreement:
        raise CheckpointError(
            f"AGREEMENT_WITH: {student.folder} keeps {'no' if share is None else f'{100 * share:.2f} %'} of "
            f"{teacher.folder}'s decisions on {source}, under MIN_AGREEMENT {100 * settings.min_agreement:g} %"
        )
    logger.info("AGREEMENT_WITH %s: %s (%s): served", teacher.folder, agreement.said(measured), source)
    student.agreement = {"teacher": str(teacher.folder), "min_agreement": settings.min_agreement, "texts": source,
                         **measured}  # fmt: skip
