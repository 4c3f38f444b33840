"""Rerankers: one logit, ranked metrics per query, served at once."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import datasets
import httpx
import pandas as pd
import pytest
import torch
from sklearn.metrics import average_precision_score, ndcg_score

from contract import files, problem_types
from contract.problem_types import ProblemType
from tests.helpers.docs import block
from tests.helpers.processes import describe, launch, run_train
from tests.helpers.service import Server
from training.config import ConfigError, TrainConfig, check
from training.data.errors import DataError
from training.data.labels import LabelSpace
from training.scoring.builtin import ranking


@pytest.fixture(scope="module")
def reranker(smoke_dir, tmp_path_factory) -> Path:
    """docs/own-data.md's reranker block, into a temporary folder."""
    words = shlex.split(block("docs/own-data.md", "smoke-reranking").code, comments=True)
    assert words[:4] == ["agnews", "train", "--preset", "smoke-reranking"] and words[-2] == "--output_dir", words
    out = tmp_path_factory.mktemp("reranker") / "out"
    result, _ = run_train([*words[2:-1], str(out)])
    assert result.returncode == 0, describe(result)
    return out


def test_ranking_metrics_agree_with_scikit_learn_per_query():
    """NDCG@10 and average precision per query, meaned over queries with a relevant passage (the third has none)."""
    gen = torch.Generator().manual_seed(0)
    groups = torch.tensor([0] * 12 + [1] * 5 + [2] * 4)
    grades = torch.tensor([0, 2, 0, 1, 0, 0, 0, 0, 1, 0, 0, 3, 1, 0, 0, 1, 0, 0, 0, 0, 0]).double()
    scores = torch.rand(len(grades), generator=gen, dtype=torch.float64)
    got = ranking(scores, grades, ["relevance"], groups)
    queries = [groups == q for q in (0, 1)]
    ndcg = [ndcg_score([grades[q].numpy()], [scores[q].numpy()], k=10) for q in queries]
    ap = [average_precision_score((grades[q] > 0).numpy(), scores[q].numpy()) for q in queries]
    assert got["ndcg_at_10"] == pytest.approx(sum(ndcg) / 2) and got["map"] == pytest.approx(sum(ap) / 2)
    assert got["queries"] == 2
    first_relevant = [(grades[q][scores[q].argsort(descending=True)] > 0).nonzero()[0, 0].item() for q in queries]
    assert got["mrr_at_10"] == pytest.approx(sum(1 / (r + 1) if r < 10 else 0 for r in first_relevant) / 2)


def test_graded_labels_are_soft_targets_scaled_by_the_largest_grade():
    space = LabelSpace(values=[0.0, 1.0, 3.0], names=["relevance"], source="train.csv", problem_type="reranking")
    assert [space.relevance(v, 1, "x") for v in (0, 1, 3, True)] == pytest.approx([0, 1 / 3, 1, 1 / 3])  # true is 1
    with pytest.raises(DataError, match="row 4: relevance 4 is above the training data's largest, 3"):
        space.relevance(4, 4, "valid.csv")
    with pytest.raises(DataError, match="row 2: relevance -1 is not a number >= 0"):
        space.relevance(-1, 2, "valid.csv")
    loss = space.problem.loss(torch.zeros(2, 1), torch.tensor([0.5, 1.0]), None, 0.0)
    assert loss.tolist() == pytest.approx([torch.log(torch.tensor(2.0)).item()] * 2)  # BCE at p=0.5, soft or not


def test_a_config_with_bad_grades_is_one_line_not_a_trace():
    from transformers import DistilBertConfig

    from contract.problem_types import ProblemTypeError

    good = ProblemType.of(DistilBertConfig(num_labels=1, relevance_grades=[0.0, 1.0]))
    assert good.name == problem_types.RERANKING
    assert ProblemType.of(DistilBertConfig(num_labels=1)).name == problem_types.MULTI  # a cross-encoder from elsewhere
    for bad in (["0", "1"], [1.0], [0, float("nan")], {"a": 1}):
        with pytest.raises(ProblemTypeError, match="relevance_grades must list two or more numbers >= 0"):
            ProblemType.of(DistilBertConfig(num_labels=1, relevance_grades=bad))


def test_reranking_needs_pairs_and_a_zero_grade():
    with pytest.raises(ConfigError, match="name the passage column with --text_pair_column"):
        check(TrainConfig(problem_type="reranking"))
    rows = pd.DataFrame({"q": ["a", "a", "b"], "p": ["x", "y", "z"], "rel": [1, 2, 2]})
    cfg = TrainConfig(problem_type="reranking", text_column_names=["q"], text_pair_column="p", label_column="rel")
    ds = datasets.Dataset.from_pandas(rows)
    with pytest.raises(DataError, match="holds relevance 1, 2: reranking needs 0"):
        LabelSpace.of_training_data(ds, "t.csv", "rel", cfg)


def test_a_reranker_is_saved_as_a_one_output_cross_encoder_and_picked_by_ndcg(reranker):
    """config.json as cross-encoders on the Hub have it (one output, no problem_type) plus the grades; metrics.json
    reports the ranking metrics per split, and the best model is the one with the best validation NDCG@10."""
    config = json.loads((reranker / files.CONFIG).read_text())
    assert len(config["id2label"]) == 1
    assert "problem_type" not in config and config[problem_types.GRADES] == [0.0, 1.0]
    summary = json.loads((reranker / files.METRICS).read_text())
    assert summary["problem_type"] == problem_types.RERANKING
    assert summary["metric_for_best_model"] == "ndcg_at_10" and summary["config"]["greater_is_better"] is True
    assert {"ndcg_at_10", "mrr_at_10", "map"} <= summary["test"].keys()
    history = [row for row in summary["history"] if "ndcg_at_10" in row]
    assert summary["validation"]["ndcg_at_10"] == max(row["ndcg_at_10"] for row in history)
    assert summary["test"]["ndcg_at_10"] > 0.9, summary["test"]
    assert "text-ranking" in (reranker / files.MODEL_CARD).read_text()


def test_rerank_over_http_ranks_each_test_query_as_training_scored_it(reranker, smoke_dir):
    """Each test query's passages through TEI's /rerank over real HTTP: the NDCG@10 of the service's order is the test
    NDCG@10 metrics.json records, relevant passages come first for most queries, and Cohere's /v2/rerank agrees."""
    test = pd.read_csv(smoke_dir / "reranking_test.csv")
    groups = list(test.groupby("query", sort=False))
    args = ["--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0", "--max_client_batch_size", "64"]
    server = Server(reranker, *args).wait_ready()
    try:
        answers = [
            httpx.post(f"{server.url}/rerank", json={"query": q, "texts": list(rows["passage"])}).json()
            for q, rows in groups
        ]
        q, rows = groups[0]
        cohere = httpx.post(f"{server.url}/v2/rerank", json={"query": q, "documents": list(rows["passage"])}).json()
    finally:
        server.stop()
    scores, grades, query_ids = [], [], []
    for number, ((_, rows), answer) in enumerate(zip(groups, answers)):
        by_index = {rank["index"]: rank["score"] for rank in answer}
        scores += [by_index[i] for i in range(len(rows))]
        grades += list(rows["relevance"])
        query_ids += [number] * len(rows)
    served = ranking(scores, grades, ["relevance"], query_ids)
    recorded = json.loads((reranker / files.METRICS).read_text())["test"]
    assert served["ndcg_at_10"] == pytest.approx(recorded["ndcg_at_10"], abs=1e-4)
    assert served["mrr_at_10"] == pytest.approx(recorded["mrr_at_10"], abs=1e-4)
    top_relevant = [rows["relevance"].iloc[answer[0]["index"]] == 1 for (_, rows), answer in zip(groups, answers)]
    assert sum(top_relevant) / len(top_relevant) > 0.9, top_relevant
    assert [r["index"] for r in cohere["results"]] == [rank["index"] for rank in answers[0]]


def test_evaluate_and_predict_score_a_reranker_by_query(reranker, smoke_dir, tmp_path):
    """`agnews evaluate` on 2 processes (gloo) reports the test metrics training recorded on one: each query's passages
    gathered whole; `agnews predict` writes each pair's relevance score."""
    test_file = str(smoke_dir / "reranking_test.csv")
    args = ["-m", "training.evaluate", "--checkpoint_dir", str(reranker), "--test_file", test_file]
    result, _ = launch([*args, "--per_device_eval_batch_size", "7"], processes=2)  # queries split across ranks
    assert result.returncode == 0, describe(result)
    evaluated = json.loads((reranker / files.EVAL_RESULTS).read_text())["metrics"]
    recorded = json.loads((reranker / files.METRICS).read_text())["test"]
    assert evaluated["ndcg_at_10"] == pytest.approx(recorded["ndcg_at_10"], abs=1e-6)
    output = tmp_path / "scored.csv"
    args = ["--checkpoint_dir", str(reranker), "--input_file", test_file, "--output_file", str(output)]
    result, _ = launch(["-m", "training.predict", *args])
    assert result.returncode == 0, describe(result)
    scored = pd.read_csv(output)
    assert ((scored["predicted_score"] > 0) & (scored["predicted_score"] < 1)).all()
    relevant, other = scored[scored["relevance"] == 1], scored[scored["relevance"] == 0]
    assert relevant["predicted_score"].mean() > other["predicted_score"].mean() + 0.5
