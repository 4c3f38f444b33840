"""The fields of config.json that contract/ reads: each malformed value is refused in one line naming the field
(issue 38's minor findings), never served with a meaning nobody gave it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from contract.long_text import LongText, LongTextError
from contract.problem_types import MULTI, REGRESSION, ProblemType, ProblemTypeError
from training.loop import format_metrics


def config(**fields) -> SimpleNamespace:
    return SimpleNamespace(**{"num_labels": 3, **fields})


@pytest.mark.parametrize("thresholds", [[True, False, True], [0.5, 0.5], [0.5, 1.5, 0.5], ["0.5", 0.5, 0.5]])
def test_decision_thresholds_must_be_one_number_in_0_1_per_label(thresholds):
    with pytest.raises(ProblemTypeError, match="decision_thresholds must hold 3 numbers in \\[0, 1\\]"):
        ProblemType.of(config(problem_type=MULTI, decision_thresholds=thresholds))
    assert ProblemType.of(config(problem_type=MULTI, decision_thresholds=[0, 1, 0.25])).thresholds == (0.0, 1.0, 0.25)


def test_a_regression_model_has_one_output():
    with pytest.raises(ProblemTypeError, match="a regression model has one output here \\(has 4 in id2label\\)"):
        ProblemType.of(config(problem_type=REGRESSION, num_labels=4))
    assert ProblemType.of(config(problem_type=REGRESSION, num_labels=1)).function == "none"


@pytest.mark.parametrize("window", [-5, 0, True, 64.0])
def test_chunk_max_length_must_be_a_positive_whole_number(window):
    with pytest.raises(LongTextError, match="chunk_max_length: must be a whole number >= 1"):
        LongText.of(config(long_text="chunk", chunk_max_length=window))


def test_the_log_line_shows_a_long_list_of_thresholds_by_its_length():
    line = format_metrics({"accuracy": 0.5, "thresholds": [0.5] * 10_000, "short": [0.1, 0.2]})
    assert line == "accuracy 0.5000  thresholds [10000 values: metrics.json]  short [0.1, 0.2]"
