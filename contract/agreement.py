"""A student against its teacher on the same texts: each model's logits (its own tokenizer and windows), and how far
the student keeps the teacher's decisions (the optimized runtimes' agreement rule, the teacher standing where fp32
stands), its scores and its ranking. Called by `agnews distill`, `agnews evaluate --teacher` and the service's
AGREEMENT_WITH guard.
"""

from __future__ import annotations

import torch

from contract import files, model_call
from contract.loading import LoadedModel
from contract.problem_types import ProblemType

BATCH = 32
RECORD = files.DISTILLATION
FIELD = "distilled_from"  # config.json: {"teacher": ..., "layers": [...]} of a student made from a teacher's layers


@torch.inference_mode()
def logits_of(loaded: LoadedModel, texts: list[str], pairs: list[str] | None = None) -> torch.Tensor:
    """fp32 logits of each text (or pair) as the model serves it (windows pooled), on the CPU."""
    rows, window = [], loaded.long_text.window or loaded.max_length
    for start in range(0, len(texts), BATCH):
        chunk, paired = texts[start : start + BATCH], None if pairs is None else pairs[start : start + BATCH]
        windows = loaded.long_text.encode(loaded.tokenizer, chunk, paired, window)
        logits = model_call.forward(loaded, windows.features).cpu()
        rows.append(loaded.long_text.pool(logits, windows.owner, len(chunk)))
    return torch.cat(rows)


def other_task(teacher: LoadedModel, student: LoadedModel) -> str | None:
    """Why `teacher` cannot be the model `student` replaces (other outputs or problem type), or None."""
    if teacher.labels == student.labels and teacher.problem.name == student.problem.name:
        return None
    return (
        f"{student.folder} answers {student.problem.name} {student.labels}, {teacher.folder} "
        f"{teacher.problem.name} {teacher.labels}: not its teacher"
    )


def logits_from_scores(problem: ProblemType, scores: torch.Tensor) -> torch.Tensor:
    """Logits that give back served scores (probabilities, or the value): a recorded teacher read as its logits."""
    scores = scores.double()
    if problem.function == "softmax":
        return scores.clamp(min=1e-12).log().float()  # softmax forgets the shift
    if problem.function == "sigmoid":
        return torch.logit(scores.clamp(1e-7, 1 - 1e-7)).float()
    return scores.float()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two score vectors (ties ranked by order)."""
    ranks = [x.double().argsort().argsort().double() for x in (a, b)]
    centred = [r - r.mean() for r in ranks]
    denominator = (centred[0].norm() * centred[1].norm()).item()
    return float((centred[0] @ centred[1]).item() / denominator) if denominator else 1.0


def measure(teacher: ProblemType, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> dict:
    """Agreement (the share of the teacher's clear decisions the student keeps, or of values within the runtimes'
    tolerance), the mean absolute difference of served scores, and for one output Spearman's rank correlation."""
    student_logits, teacher_logits = student_logits.float(), teacher_logits.float()
    same, ties = teacher.agreement(student_logits, teacher_logits)
    ours, theirs = teacher.scores(student_logits), teacher.scores(teacher_logits)
    record = {
        "texts": len(teacher_logits),
        "agreement": same.float().mean().item() if len(same) else None,
        "ties": ties,
        "rule": teacher.agreement_rule(),
        "mean_abs_difference": (ours - theirs).abs().mean().item(),
    }
    if teacher_logits.shape[-1] == 1:
        record["spearman"] = spearman(ours[:, 0], theirs[:, 0])
    return record


def said(record: dict) -> str:
    """One line of a measured record."""
    agreement = "n/a" if record["agreement"] is None else f"{100 * record['agreement']:.2f} %"
    extra = f", Spearman {record['spearman']:.4f}" if "spearman" in record else ""
    return (
        f"agreement {agreement} on {record['texts']} texts ({record['ties']} ties left out), mean absolute "
        f"score difference {record['mean_abs_difference']:.4f}{extra}"
    )
