"""The loss per problem type: transformers' own losses without weights, weights that do not depend on how a batch is
split, scikit-learn's 'balanced' weights; and on a 1:20 set, balanced weights find the minority class."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from sklearn.utils.class_weight import compute_class_weight
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from contract import files, problem_types
from contract.problem_types import ProblemType
from tests.helpers.files import write_rows
from tests.helpers.processes import describe, run_train
from training.data.errors import DataError
from training.data.labels import LabelSpace
from training.objective import Objective, class_weights
from training.smoke import make_split


def tiny_model(num_labels: int, problem_type: str) -> DistilBertForSequenceClassification:
    config = DistilBertConfig(
        vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32, num_labels=num_labels, problem_type=problem_type
    )
    return DistilBertForSequenceClassification(config).eval()


@pytest.mark.parametrize(
    "problem_type,num_labels",
    [(problem_types.SINGLE, 4), (problem_types.MULTI, 3), (problem_types.REGRESSION, 1)],
)
def test_without_weights_the_loss_is_transformers_own(problem_type, num_labels):
    torch.manual_seed(0)
    model = tiny_model(num_labels, problem_type)
    ids = torch.randint(1, 50, (6, 9))
    labels = {
        problem_types.SINGLE: torch.randint(0, 4, (6,)),
        problem_types.MULTI: (torch.rand(6, 3) < 0.5).float(),
        problem_types.REGRESSION: torch.randn(6),
    }[problem_type]
    with torch.no_grad():
        output = model(input_ids=ids, labels=labels)
    assert Objective(ProblemType.named(problem_type))(output.logits, labels).item() == pytest.approx(
        output.loss.item(), abs=1e-6
    )


@pytest.mark.parametrize("problem_type", [problem_types.SINGLE, problem_types.MULTI])
def test_weighted_losses_do_not_depend_on_how_the_batch_is_split(problem_type):
    """2 x 8 (DDP averages the ranks' losses' gradients) must equal 1 x 16: a plain mean of weighted losses."""
    torch.manual_seed(0)
    logits = torch.randn(16, 3)
    labels = torch.randint(0, 3, (16,)) if problem_type == problem_types.SINGLE else (torch.rand(16, 3) < 0.3).float()
    objective = Objective(ProblemType.named(problem_type), torch.tensor([1.0, 20.0, 3.0]), label_smoothing=0.1)
    whole = objective(logits, labels)
    halves = (objective(logits[:8], labels[:8]) + objective(logits[8:], labels[8:])) / 2
    assert whole.item() == pytest.approx(halves.item(), abs=1e-6)
    assert whole.item() != pytest.approx(
        Objective(ProblemType.named(problem_type), label_smoothing=0.1)(logits, labels).item()
    )


def test_balanced_weights_are_scikit_learns_and_explicit_ones_are_checked():
    targets = [0] * 20 + [1] * 1 + [2] * 5
    space = LabelSpace(values=[0, 1, 2], names=["a", "b", "c"], source="t")
    balanced = class_weights("balanced", space, targets)
    assert balanced.tolist() == pytest.approx(
        compute_class_weight("balanced", classes=np.arange(3), y=np.array(targets)).tolist()
    )
    assert class_weights("1,20,4", space, targets).tolist() == [1.0, 20.0, 4.0]
    with pytest.raises(DataError, match=r"class_weights: 2 weights for 3 classes \(a, b, c\)"):
        class_weights("1,2", space, targets)
    multi = LabelSpace(values=[0, 1], names=["x", "y"], source="t", problem_type=problem_types.MULTI)
    assert class_weights("balanced", multi, [[1, 0], [1, 1], [1, 0], [0, 0]]).tolist() == pytest.approx(
        [1 / 3, 3.0]
    )  # neg / pos
    scores = LabelSpace(values=[], names=["s"], source="t", problem_type=problem_types.REGRESSION)
    with pytest.raises(DataError, match="class_weights: a regression model has no classes"):
        class_weights("balanced", scores, [0.5, 1.0])


@pytest.mark.slow
def test_balanced_weights_raise_minority_recall_on_a_1_to_20_set(smoke_dir, tmp_path):
    """Sports stories kept at 1 in 7 of their share (about 1:20 against everything else), a short run: the
    unweighted loss learns the majority first, the balanced one finds the minority."""
    rng = random.Random(0)

    def rows(n: int, seed: int) -> list[dict]:
        kept = [(text, y) for text, y in make_split(n, seed) if y != 1 or rng.random() < 0.15]
        return [{"text": text, "label": "sports" if y == 1 else "other"} for text, y in kept]

    train, test = write_rows(tmp_path / "train.csv", rows(9000, 11)), write_rows(tmp_path / "test.csv", rows(2000, 12))
    recall = {}
    for weights in ("none", "balanced"):
        out = tmp_path / weights
        args = ["--preset", "smoke", "--model_name_or_path", str(smoke_dir / "model"), "--label_names", "other,sports"]
        args += ["--train_file", str(train), "--test_file"]
        args += [str(test), "--class_weights", weights, "--max_train_steps", "80", "--checkpointing_steps", "none"]
        result, _ = run_train([*args, "--metric_for_best_model", "recall_sports", "--output_dir", str(out)])
        assert result.returncode == 0, describe(result)
        recall[weights] = json.loads((out / files.METRICS).read_text())["test"]["recall_sports"]
    print(f"minority recall after 80 steps: {recall}")
    assert recall["balanced"] >= recall["none"] + 0.3, recall


def test_the_problem_type_decides_what_is_left_to_it():
    """Each problem type's defaults, unless a flag is given."""
    from training.config import TrainConfig
    from training.objective import problem_type_defaults

    decided = {
        name: problem_type_defaults(TrainConfig(), ProblemType.named(name))
        for name in (problem_types.SINGLE, problem_types.MULTI)
    }
    decided[problem_types.REGRESSION] = problem_type_defaults(
        TrainConfig(), ProblemType.named(problem_types.REGRESSION)
    )
    assert [
        decided[n].group_by_length for n in (problem_types.SINGLE, problem_types.MULTI, problem_types.REGRESSION)
    ] == [True, True, False]
    assert [decided[n].calibration for n in (problem_types.SINGLE, problem_types.MULTI, problem_types.REGRESSION)] == [
        "auto",
        "auto",
        "none",
    ]
    assert (decided[problem_types.MULTI].class_weights, decided[problem_types.MULTI].threshold_strategy) == (
        "balanced",
        "per_label",
    )
    assert (decided[problem_types.SINGLE].class_weights, decided[problem_types.SINGLE].threshold_strategy) == (
        "none",
        "fixed",
    )
    given = TrainConfig(class_weights="none", threshold_strategy="fixed", group_by_length=True)
    assert problem_type_defaults(given, ProblemType.named(problem_types.MULTI)).class_weights == "none"
    assert problem_type_defaults(given, ProblemType.named(problem_types.REGRESSION)).group_by_length is True


@pytest.mark.parametrize("name", [problem_types.SINGLE, problem_types.MULTI, problem_types.REGRESSION, "reranking"])
def test_the_teacher_loss_is_least_where_the_student_answers_as_the_teacher(name):
    """Each problem type's distillation loss, at the student's logits that give back the teacher's served scores, is
    its minimum: the gradient vanishes there, and any step away costs more."""
    from contract.agreement import logits_from_scores

    torch.manual_seed(0)
    width = 1 if name in (problem_types.REGRESSION, "reranking") else 4
    problem = ProblemType.named(name, width)
    teacher = problem.scores(torch.randn(8, width))
    at = logits_from_scores(problem, teacher).requires_grad_()
    loss = problem.teacher_loss(at, teacher, 2.0).sum()
    (grad,) = torch.autograd.grad(loss, at)
    assert grad.abs().max().item() < 1e-4
    moved = at.detach() + 0.3 * torch.randn_like(at)
    assert problem.teacher_loss(moved, teacher, 2.0).sum() > loss


def test_distill_alpha_mixes_real_labels_only_where_a_row_has_one():
    objective = Objective(ProblemType.named(problem_types.SINGLE, 3), distillation=(0.25, 2.0))
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    teacher, hard = torch.softmax(torch.randn(4, 3), -1), torch.tensor([1.0, 0.0, 1.0, 0.0])
    taught = objective.problem.teacher_loss(logits, teacher, 2.0)
    label = objective.per_example(logits, labels)
    got = objective(logits, labels, {"teacher": teacher, "hard": hard})
    assert got.item() == pytest.approx((0.75 * taught + 0.25 * hard * label).mean().item(), rel=1e-6)
    assert objective(logits, labels).item() == pytest.approx(label.mean().item(), rel=1e-6)  # no teacher: plain
