"""Multi-label and regression end to end, one run each."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from huggingface_hub import InferenceClient
from safetensors.torch import load_file

from contract import files, problem_types
from contract.loading import load_model
from inference.encoding import KEPT_CHARS_PER_TOKEN
from tests.helpers.processes import cli_env, describe, launch, run_train
from tests.helpers.service import Server
from training import calibration
from training.output.best_model import load_weights
from training.scoring.metrics import THRESHOLD_GRID

pytestmark = pytest.mark.slow
EPOCHS = ["--num_train_epochs", "2"]  # 336 optimizer steps, 168 per epoch
RESUME_FROM = 200  # a state in the middle of the second epoch
LAST_STATE = 300
PAIR_ARGS = ["--text_column_names", "sentence1", "--text_pair_column", "sentence2", "--label_column", "pair_score"]
FP32 = ["--mixed_precision", "fp32"]  # answers comparable to 1e-5 on any CPU
TASKS = {
    # the multi-label defaults (balanced weights, per-label thresholds); temperatures always folded in: the tests
    # below check what folding does (auto's choice is tests/training/test_calibration.py's)
    # and a review band, fitted at 0.95
    "multi-label": ["--preset", "smoke-multi-label", "--calibration", "temperature", "--review_precision", "0.95"],
    "regression": ["--preset", "smoke-regression", *PAIR_ARGS],  # sentence-pair scoring
}


def train(out: Path, args: list[str]) -> None:
    result, _ = run_train([*args, *EPOCHS, "--output_dir", str(out), "--checkpointing_steps", "100"])
    assert result.returncode == 0, describe(result)


RESUMED = {**TASKS, "single-label": ["--preset", "smoke"]}  # one process: resumed across an epoch's end


@pytest.fixture(scope="module")
def runs(smoke_dir, tmp_path_factory) -> dict[str, Path]:
    folders = {}
    for name, args in RESUMED.items():
        folders[name] = tmp_path_factory.mktemp(name) / "out"
        train(folders[name], args)
    return folders


def test_files_carry_the_problem_type_and_the_card_names_it(runs):
    multi = json.loads((runs["multi-label"] / files.CONFIG).read_text())
    assert multi["problem_type"] == problem_types.MULTI
    assert list(multi["id2label"].values()) == ["Business", "Sci/Tech", "Sports", "World"]  # the sorted union
    fitted = multi[problem_types.THRESHOLDS]
    summary = json.loads((runs["multi-label"] / files.METRICS).read_text())
    assert summary["metric_for_best_model"] == "micro_f1" and summary["config"]["greater_is_better"] is True
    # fitted on the grid on validation, then moved with each label's temperature (training/calibration.py)
    on_grid, temperatures = summary["validation"]["thresholds"], multi["calibration"]["temperatures"]
    assert len(on_grid) == 4 and set(on_grid) <= set(THRESHOLD_GRID) and len(temperatures) == 4
    assert fitted == pytest.approx(calibration.moved_thresholds(on_grid, temperatures)) == summary["test"]["thresholds"]
    assert summary["test"]["micro_f1"] > 0.75, summary["test"]
    assert "multi-label-classification" in (runs["multi-label"] / files.MODEL_CARD).read_text()

    scored = json.loads((runs["regression"] / files.CONFIG).read_text())
    assert scored["problem_type"] == problem_types.REGRESSION and scored["id2label"] == {"0": "pair_score"}
    summary = json.loads((runs["regression"] / files.METRICS).read_text())
    assert summary["metric_for_best_model"] == "mse" and summary["config"]["greater_is_better"] is False
    assert summary["config"]["group_by_length"] is False  # regression's default (training/objective.py)
    assert json.loads((runs["single-label"] / files.METRICS).read_text())["config"]["group_by_length"] is True
    assert summary["test"]["pearson"] > 0.8 and summary["test"]["mse"] < 0.1, summary["test"]
    card = (runs["regression"] / files.MODEL_CARD).read_text()
    assert "tags:\n- text-classification\n- regression" in card and "| pearson |" in card


def examples(name: str, smoke_dir: Path, n: int = 12) -> list[tuple[str, str | None]]:
    if name == "multi-label":
        rows = [json.loads(line) for line in (smoke_dir / "multi_label_test.jsonl").read_text().splitlines()[:n]]
        return [(row["text"], None) for row in rows]
    rows = pd.read_csv(smoke_dir / "regression_test.csv").head(n)
    return list(zip(rows["sentence1"], rows["sentence2"]))


@torch.no_grad()
def our_scores(out: Path, pairs: list[tuple[str, str | None]]) -> torch.Tensor:
    """The state_dict contract read by the service's loader, scored by the problem type (sigmoid / raw value)."""
    loaded = load_model(str(out), device="cpu", dtype="fp32")
    logits = torch.cat([loaded.model(**loaded.tokenizer(a, b, return_tensors="pt")).logits for a, b in pairs])
    return loaded.problem.scores(logits.float())


@pytest.mark.parametrize("name", TASKS)
def test_the_pipeline_scores_the_export_as_we_score_the_state_dict(runs, smoke_dir, name):
    pairs = examples(name, smoke_dir)
    classify = transformers.pipeline("text-classification", model=str(runs[name]), device="cpu", top_k=None)
    expected = our_scores(runs[name], pairs)
    labels = classify.model.config.id2label
    for (text, pair), row in zip(pairs, expected):
        got = classify({"text": text, "text_pair": pair} if pair else [text])
        got = got[0] if isinstance(got[0], list) else got  # a list of inputs: one list of scores each
        assert {p["label"]: p["score"] for p in got} == pytest.approx(
            {labels[i]: v for i, v in enumerate(row.tolist())}, abs=1e-5
        )


@torch.no_grad()
def test_multi_label_scores_are_calibrated_per_label_and_decide_as_before(runs, smoke_dir):
    """Per-label temperatures move their thresholds; decisions stay the same."""
    summary = json.loads((runs["multi-label"] / files.METRICS).read_text())
    recorded = summary["calibration"]
    assert recorded["method"] == "temperature" and len(recorded["temperatures"]) == 4
    for split in ("validation", "test"):
        assert recorded["ece_after"][split] <= recorded["ece_before"][split], recorded
    loaded = load_model(str(runs["multi-label"]), device="cpu", dtype="fp32")
    texts = [json.loads(line)["text"] for line in (smoke_dir / "multi_label_test.jsonl").read_text().splitlines()]
    batch = loaded.tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    logits = loaded.model(**batch).logits.float()
    calibrated = loaded.problem.decisions(loaded.problem.scores(logits))
    uncalibrated = (logits * torch.tensor(recorded["temperatures"])).sigmoid()
    assert torch.equal(calibrated, uncalibrated >= torch.tensor(summary["validation"]["thresholds"]))
    assert 0 < calibrated.float().mean() < 1


def evaluate_copy(out: Path, tmp_path: Path, preset: str, processes: int = 1) -> tuple[Path, dict]:
    copy = tmp_path / f"model{processes}"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(files.STATE_DIR))
    args = ["-m", "training.evaluate", "--checkpoint_dir", str(copy), "--preset", preset]
    result, _ = launch(args, processes=processes)
    assert result.returncode == 0, describe(result)
    return copy, json.loads((copy / files.EVAL_RESULTS).read_text())


def test_evaluate_reports_per_label_for_multi_label(runs, tmp_path):
    copy, results = evaluate_copy(runs["multi-label"], tmp_path, "smoke-multi-label")
    trained = json.loads((copy / files.METRICS).read_text())["test"]
    assert results["problem_type"] == problem_types.MULTI and "confusion_matrix" not in results
    assert set(results["per_class"]) == {"Business", "Sci/Tech", "Sports", "World"}
    for key in ("micro_f1", "macro_f1", "subset_accuracy", "loss"):  # the same model on the same test file
        assert results["metrics"][key] == pytest.approx(trained[key], abs=1e-5)
    assert results["files"] == [files.EVAL_RESULTS, files.RELIABILITY_PNG, files.MISCLASSIFIED_CSV, files.REVIEW_PNG]
    band = json.loads((copy / files.METRICS).read_text())["review_band"]
    measured = results["review_band"]
    assert measured.pop("target_precision") == 0.95 and measured.pop("without_band") == band["test"].pop("without_band")
    assert measured == pytest.approx(band["test"], abs=1e-6)
    assert (copy / files.REVIEW_PNG).read_bytes().startswith(b"\x89PNG")
    assert results["calibration"]["ece"] == pytest.approx(
        json.loads((copy / files.METRICS).read_text())["calibration"]["ece_after"]["test"], abs=1e-5
    )
    wrong = pd.read_csv(copy / files.MISCLASSIFIED_CSV)
    assert len(wrong) == round((1 - results["metrics"]["subset_accuracy"]) * results["metrics"]["num_examples"])
    assert not (copy / files.CONFUSION_PNG).exists()
    two, on_two = evaluate_copy(runs["multi-label"], tmp_path, "smoke-multi-label", processes=2)
    assert on_two["metrics"] == results["metrics"] and on_two["per_class"] == results["per_class"]
    assert (two / files.MISCLASSIFIED_CSV).read_text() == (copy / files.MISCLASSIFIED_CSV).read_text()


def test_evaluate_reports_residuals_for_regression(runs, tmp_path):
    copy, results = evaluate_copy(runs["regression"], tmp_path, "smoke-regression")
    trained = json.loads((copy / files.METRICS).read_text())["test"]
    assert results["problem_type"] == problem_types.REGRESSION and "per_class" not in results
    assert {k: results["metrics"][k] for k in ("mse", "pearson")} == pytest.approx(
        {k: trained[k] for k in ("mse", "pearson")}, abs=1e-5
    )
    assert (copy / files.RESIDUALS_PNG).read_bytes()[:4] == b"\x89PNG"
    errors = pd.read_csv(copy / files.LARGEST_ERRORS_CSV)
    assert len(errors) == results["metrics"]["num_examples"] and errors["absolute_error"].is_monotonic_decreasing


@pytest.mark.parametrize("name", TASKS)
def test_predict_writes_the_problem_types_columns_identically_on_one_and_two_processes(runs, smoke_dir, tmp_path, name):
    source = smoke_dir / ("multi_label_test.jsonl" if name == "multi-label" else "regression_test.csv")
    frames = []
    for processes in (1, 2):
        output = tmp_path / f"out{processes}.parquet"
        args = ["--checkpoint_dir", str(runs[name]), "--input_file", str(source), "--output_file", str(output)]
        result, _ = launch(["-m", "training.predict", *args, *FP32, "--chunk_size", "150"], processes=processes)
        assert result.returncode == 0, describe(result)
        frames.append(pd.read_parquet(output))
    pd.testing.assert_frame_equal(frames[0], frames[1])
    frame = frames[0]
    pairs = examples(name, smoke_dir, n=len(frame))
    expected = our_scores(runs[name], pairs[:20])
    if name == "multi-label":
        names = ["Business", "Sci/Tech", "Sports", "World"]
        scores = torch.tensor(frame[[f"score_{n}" for n in names]].to_numpy())
        thresholds = json.loads((runs[name] / files.CONFIG).read_text())[problem_types.THRESHOLDS]
        chosen = [[n for n, s, t in zip(names, row, thresholds) if s >= t] for row in scores.tolist()]
        assert [list(labels) for labels in frame["predicted_labels"]] == chosen
    else:
        assert "predicted_label" not in frame and "score_pair_score" not in frame
        scores = torch.tensor(frame["predicted_value"].to_numpy())[:, None]
    assert torch.allclose(scores[:20].float(), expected, atol=1e-5)


@pytest.mark.parametrize("name", TASKS)
def test_the_service_scores_by_the_problem_type_for_the_real_client(runs, smoke_dir, name):
    pairs = examples(name, smoke_dir, n=4)
    expected = our_scores(runs[name], pairs)
    server = Server(runs[name], "--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0").wait_ready()
    try:
        client = InferenceClient(base_url=server.url)
        text, pair = pairs[0]
        best = client.text_classification(text)  # one text: the client returns the best label
        if pair is None:  # multi-label: with its sigmoid score
            assert best.score == pytest.approx(expected[0].max().item(), abs=1e-5)
        else:  # the pair model asked about its first text alone: the raw value of its one output
            assert best.label == "pair_score"
            assert best.score == pytest.approx(our_scores(runs[name], [(text, None)])[0, 0].item(), abs=1e-5)
        batch = httpx.post(f"{server.url}/predict", json={"inputs": [[a, b] if b else [a] for a, b in pairs]}).json()
        labels = json.loads((runs[name] / files.CONFIG).read_text())["id2label"]
        for answer, row in zip(batch, expected):
            assert {p["label"]: p["score"] for p in answer} == pytest.approx(
                {labels[str(i)]: v for i, v in enumerate(row.tolist())}, abs=1e-5
            )
        raw = httpx.post(
            f"{server.url}/predict", json={"inputs": [[text, pair] if pair else [text]], "raw_scores": True}
        )
        info = httpx.get(f"{server.url}/info").json()
        kind = "reranker" if len(labels) == 1 else "classifier"  # TEI's rule (router/src/lib.rs): one label re-ranks
        assert list(info["model_type"][kind]["id2label"].values()) == list(labels.values())
        served_type = info["distilbert_agnews"]["problem_type"]
        assert served_type["name"] == (problem_types.MULTI if pair is None else problem_types.REGRESSION)
    finally:
        server.stop()
    assert raw.status_code == 200 and len(raw.json()[0]) == len(labels)


@pytest.mark.parametrize("name", RESUMED)
def test_a_mid_epoch_resume_continues_bitwise(runs, tmp_path, name):
    """A mid-epoch resume ends with the uninterrupted run's weights."""
    original = runs[name]
    resumed = tmp_path / "out"
    later = [f"step_{step}" for step in range(RESUME_FROM + 100, LAST_STATE + 1, 100)]
    shutil.copytree(original, resumed, ignore=lambda folder, names: [n for n in names if n in later])
    train(resumed, [*RESUMED[name], "--resume_from_checkpoint", "latest"])
    last = f"{files.STATE_DIR}/step_{LAST_STATE}/model.safetensors"
    a, b = load_file(original / last), load_file(resumed / last)
    assert all(torch.equal(a[k], b[k]) for k in a)
    best, again = load_weights(original / files.WEIGHTS), load_weights(resumed / files.WEIGHTS)
    assert all(torch.equal(best[k], again[k]) for k in best)


def one_output_folder(runs: dict, tmp_path: Path, variant: str) -> Path:
    """The regression model as served (no states, no conversions); 'one-logit': as a model from elsewhere would come,
    one output and no problem_type, which transformers' pipeline and the service read as a one-logit classifier."""
    folder = tmp_path / variant
    shutil.copytree(runs["regression"], folder, ignore=shutil.ignore_patterns(files.STATE_DIR, files.RUNTIME_DIR))
    if variant == "one-logit":
        config = json.loads((folder / files.CONFIG).read_text())
        del config["problem_type"]
        (folder / files.CONFIG).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("variant", ["regression", "one-logit"])
def test_an_int8_runtime_is_guarded_by_what_a_one_output_model_decides(runs, tmp_path, variant):
    """The argmax of one output is always 0; the guard compares the value (regression) or the thresholded sigmoid
    (one-logit pair model) with PyTorch fp32, and its figure is what those rules give on the held-out texts."""
    from contract.model_call import forward
    from inference.encoding import encode
    from inference.engine.service import load_configured
    from inference.runtimes import measuring
    from inference.runtimes import texts as runtime_texts
    from inference.settings import from_env

    folder = one_output_folder(runs, tmp_path, variant)
    settings = from_env(model_id=str(folder), device="cpu", reload_interval_s=0, backend="onnxruntime", dtype="int8")
    loaded = load_configured(settings)
    expected_type = problem_types.REGRESSION if variant == "regression" else problem_types.MULTI
    assert loaded.problem.name == expected_type
    int8 = loaded.report["candidates"][0]
    print(f"{variant}: {int8}")
    assert int8["name"] == "onnxruntime int8" and int8["agreement"] is not None
    # a pair task records no calibration texts: the shipped sample
    _, held = runtime_texts.split(runtime_texts.sample_texts())
    fp32 = load_model(str(folder), device="cpu", dtype="fp32")

    def logits(model) -> torch.Tensor:
        chunks = [held[i : i + 32] for i in range(0, len(held), 32)]
        return torch.cat([forward(model, encode(model, [(t, None) for t in chunk], True, False)) for chunk in chunks])

    quantized = (
        loaded
        if loaded.precision == "int8"
        else load_configured(from_env(**{**settings.model_dump(), "dtype": "int8"}))
    )
    share, _ = measuring.agreement([logits(quantized)], [logits(fp32)], fp32.problem)
    if loaded.precision == "int8":
        assert share == pytest.approx(int8["agreement"], abs=0.01) and share >= measuring.AGREEMENT_BOUND
    else:
        assert int8["refused"].startswith("refused: agreement") and int8["agreement"] < measuring.AGREEMENT_BOUND


def test_predict_scores_a_one_logit_model_as_the_service_does(runs, smoke_dir, tmp_path):
    """A one-output model without problem_type: a sigmoid score per row and the label when it reaches 0.5, not the
    1.0 a softmax over one logit gives."""
    folder = one_output_folder(runs, tmp_path, "one-logit")
    output = tmp_path / "out.csv"
    args = ["--checkpoint_dir", str(folder), "--input_file", str(smoke_dir / "regression_test.csv")]
    result, _ = launch(["-m", "training.predict", *args, "--output_file", str(output), *FP32])
    assert result.returncode == 0, describe(result)
    frame = pd.read_csv(output).head(20)
    expected = our_scores(folder, examples("regression", smoke_dir, n=20))[:, 0]
    assert torch.allclose(torch.tensor(frame["score_pair_score"].to_numpy()).float(), expected, atol=1e-5)
    assert ((0 < expected) & (expected < 0.99)).all() and expected.std() > 0  # a sigmoid, not a softmax of one
    assert [text == "pair_score" for text in frame["predicted_labels"]] == (expected >= 0.5).tolist()  # "a|b" in csv


def test_bad_multi_label_data_stops_at_start_with_one_line_and_writes_nothing(smoke_dir, tmp_path):
    rows = [json.loads(line) for line in (smoke_dir / "multi_label_train.jsonl").read_text().splitlines()[:200]]
    rows[57]["labels"] = []
    train = tmp_path / "tags.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    args = [
        "--preset",
        "smoke-multi-label",
        "--model_name_or_path",
        str(smoke_dir / "model"),
        "--train_file",
        str(train),
    ]
    result, _ = run_train([*args, "--output_dir", str(out)])
    assert result.returncode == 1, describe(result)
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "tags.jsonl: row 58: no labels" in errors[0] and "Traceback" not in result.stderr
    assert not out.exists()


def test_a_regression_model_is_served_in_fp32_when_dtype_is_auto(runs, monkeypatch):
    """On a CPU with native bf16 (stood in for here), DTYPE=auto serves bf16; for a regression model that would move
    its raw values by ~1e-2 with no agreement guard to catch it (BACKEND=torch has none)."""
    from contract import precision
    from tests.inference.test_app import make_client

    monkeypatch.setattr(precision, "native_bf16", lambda device_type: True)
    with make_client(runs["multi-label"], backend="torch", dtype="auto") as client:
        assert client.get("/info").json()["model_dtype"] == "bfloat16"  # the stand-in takes effect
    with make_client(runs["regression"], backend="torch", dtype="auto") as client:
        assert client.get("/info").json()["model_dtype"] == "float32"


def news_words(n: int, seed: int) -> str:
    words = "officials said on monday that the markets rallied after reuters reported unbelievable earnings".split()
    return " ".join(words[(i * 7 + seed) % len(words)] for i in range(n))


def cut_strings(body, chars: int):
    """`body` with every string in it cut to its first `chars` characters."""
    if isinstance(body, str):
        return body[:chars]
    if isinstance(body, list):
        return [cut_strings(item, chars) for item in body]
    return {key: cut_strings(value, chars) for key, value in body.items()} if isinstance(body, dict) else body


def test_a_megabyte_rerank_batch_or_pair_batch_costs_the_model_thread_what_is_kept(runs):
    """Huge rerank requests tokenize only what is kept; others are not held up."""
    from tests.inference.test_app import make_client

    query, texts = news_words(160_000, 0), [news_words(8, k) for k in range(32)]
    documents = [news_words(8_500, k) for k in range(32)]
    halves = [news_words(4_000, k) for k in range(16)]  # both sides cut, one clearly the longer (docs/serving.md)
    bodies = {
        "/rerank": {"query": query, "texts": texts, "raw_scores": True},
        "/predict": {"inputs": [[d] for d in documents], "raw_scores": True},
        "/predict pairs": {"inputs": [[documents[k], halves[k]] for k in range(16)], "raw_scores": True},
    }
    short = {"inputs": ["a short story", "about the election"]}
    loaded = load_model(str(runs["regression"]), device="cpu", dtype="fp32")
    kept_chars = loaded.max_length * KEPT_CHARS_PER_TOKEN

    def spent_ms(answer) -> int:
        assert answer.status_code == 200, answer.text[:300]
        return int(answer.headers["x-tokenization-time"]) + int(answer.headers["x-inference-time"])

    with make_client(runs["regression"], dtype="float32", backend="torch") as client:
        client.post("/predict", json=short)  # warm
        for name, body in bodies.items():
            # The peer: the same request already cut to what the service keeps, timed by the same service now.
            kept = spent_ms(client.post(name.split()[0], json=cut_strings(body, kept_chars)))
            with ThreadPoolExecutor(2) as pool:
                started = time.perf_counter()
                big = pool.submit(client.post, name.split()[0], json=body)
                time.sleep(0.05)  # the big request is being worked on
                small = pool.submit(lambda: (client.post("/predict", json=short), time.perf_counter()))
                answer, (quick, answered_at) = big.result(), small.result()
            assert answer.status_code == 200 and quick.status_code == 200, answer.text[:300]
            assert answered_at - started < 1.0, f"{name}: a short request waited {answered_at - started:.2f} s"
            spent = spent_ms(answer)
            assert spent < 2 * kept + 50, f"{name}: {spent} ms of tokenizing and inference, {kept} ms for what is kept"
            got = (
                [rank["score"] for rank in sorted(answer.json(), key=lambda r: r["index"])]
                if name == "/rerank"
                else [row[0]["score"] for row in answer.json()]
            )
            sequences = (
                [(query, t) for t in texts]
                if name == "/rerank"
                else [(d, None) for d in documents]
                if name == "/predict"
                else [(documents[k], halves[k]) for k in range(16)]
            )
            assert got[:4] == pytest.approx(truncated_logits(loaded, sequences[:4]), abs=1e-4), name


@torch.no_grad()
def truncated_logits(loaded, pairs: list[tuple[str, str | None]]) -> list[float]:
    """The one output of each whole input, truncated by transformers itself (right, longest first)."""
    loaded.tokenizer.truncation_side = "right"
    encoded = [
        loaded.tokenizer(a, b, truncation=True, max_length=loaded.max_length, return_tensors="pt") for a, b in pairs
    ]
    return [loaded.model(**e).logits[0, 0].item() for e in encoded]


def test_rerank_ranks_texts_against_a_query_with_the_pair_regression_model(runs, smoke_dir):
    """POST /rerank as TEI answers it (router/src/http/server.rs `rerank`)."""
    query, _ = examples("regression", smoke_dir, n=1)[0]
    texts = [pair for _, pair in examples("regression", smoke_dir, n=6)]
    raw = our_scores(runs["regression"], [(query, text) for text in texts])[:, 0]
    args = ["--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0", "--max_client_batch_size", "6"]
    server = Server(runs["regression"], *args).wait_ready()
    try:
        ranked = httpx.post(f"{server.url}/rerank", json={"query": query, "texts": texts, "return_text": True}).json()
        scores = httpx.post(f"{server.url}/rerank", json={"query": query, "texts": texts, "raw_scores": True}).json()
        root = httpx.post(f"{server.url}/", json={"query": query, "texts": texts, "return_text": True}).json()
        predicted = httpx.post(f"{server.url}/predict", json={"inputs": [query, texts[0]]})
        too_many = httpx.post(f"{server.url}/rerank", json={"query": query, "texts": texts * 2})
        info = httpx.get(f"{server.url}/info").json()
        # routed by the parsed body, not by its bytes: the word "query" in a text or a nested field is a /predict
        # body, and an escaped key is still `query`
        predict_bodies = [{"inputs": "query"}, {"inputs": ["query", "a query"]}, {"inputs": "q", "x": {"query": 1}}]
        routed = [
            httpx.post(f"{server.url}{path}", json=body) for body in predict_bodies for path in ("/", "/invocations")
        ]
        escaped = httpx.post(
            f"{server.url}/invocations",
            content=json.dumps({"query": query, "texts": texts}).replace('"query"', '"\\u0071uery"'),
            headers={"content-type": "application/json"},
        )
    finally:
        server.stop()
    order = sorted(range(len(texts)), key=lambda i: -raw[i].item())
    assert [rank["index"] for rank in ranked] == order and root == ranked
    assert [rank["text"] for rank in ranked] == [texts[i] for i in order]
    assert [rank["score"] for rank in ranked] == pytest.approx(raw[order].sigmoid().tolist(), abs=1e-5)
    assert all("text" not in rank for rank in scores)
    assert [rank["score"] for rank in scores] == pytest.approx(raw[order].tolist(), abs=1e-5)
    assert predicted.status_code == 200 and predicted.json()[0]["score"] == pytest.approx(raw[0].item(), abs=1e-5)
    assert too_many.status_code == 422 and too_many.json()["error_type"] == "Validation", too_many.text
    assert "batch size 12 > maximum allowed batch size 6" in too_many.json()["error"]
    assert set(info["model_type"]) == {"reranker"}
    assert [r.status_code for r in routed] == [200] * 6, [r.text for r in routed]
    assert all(isinstance(r.json()[0]["score"], float) and "label" in r.json()[0] for r in routed)
    assert escaped.status_code == 200 and [rank["index"] for rank in escaped.json()] == order


def test_a_deeply_nested_body_to_a_rerankers_root_is_answered_in_teis_order(runs):
    """Deeply nested JSON: 401, 415 or 400, never a 500."""
    server = Server(
        runs["regression"], "--backend", "torch", "--reload_interval_s", "0", env=cli_env(API_KEY="k")
    ).wait_ready()
    nested, key = b"[" * 3000, {"authorization": "Bearer k"}
    try:
        for path in ("/", "/invocations"):

            def post(headers: dict, url: str = f"{server.url}{path}") -> httpx.Response:
                return httpx.post(url, content=nested, headers=headers)

            assert post({"content-type": "application/json"}).status_code == 401
            assert post({**key, "content-type": "text/plain"}).status_code == 415
            refused = post({**key, "content-type": "application/json"})
            assert refused.status_code == 400 and refused.json()["error_type"] == "Validation", refused.text
            assert "not valid JSON" in refused.json()["error"]
        assert "Traceback" not in server.output() and "RecursionError" not in server.output()
    finally:
        server.stop()


def test_a_non_finite_output_is_refused_alike_by_predict_and_rerank(runs, tmp_path):
    """Finite weights whose output overflows: /predict answered 200 with a null score (and a sigmoid ranked the null
    label first) while /rerank refused with 424. Now every route refuses it alike: 424 Backend, one message."""
    from fastapi.testclient import TestClient

    from inference.app import create_app
    from inference.settings import Settings
    from tests.helpers.files import save_new_weights

    folder = Path(shutil.copytree(runs["regression"], tmp_path / "overflowing"))
    state = torch.load(folder / files.WEIGHTS, weights_only=True)
    state["classifier.weight"] = torch.full_like(state["classifier.weight"], 3e38)  # finite, but no sum of them is
    save_new_weights(folder, state)
    settings = Settings(model_id=str(folder), backend="torch", dtype="fp32", reload_interval_s=0)
    with TestClient(create_app(settings)) as client:
        answers = [
            client.post("/predict", json={"inputs": "stocks fell"}),
            client.post("/predict", json={"inputs": [["a"], ["b"]], "raw_scores": True}),
            client.post("/rerank", json={"query": "q", "texts": ["a", "b"]}),
            client.post("/", json={"query": "q", "texts": ["a"]}),
        ]
    expected = {"error": "the model's output is not finite (NaN or infinity) for this input", "error_type": "Backend"}
    assert [(a.status_code, a.json()) for a in answers] == [(424, expected)] * 4


def test_a_review_band_fitted_at_095_holds_its_precision_on_test(runs):
    """The band fitted on validation (--review_precision 0.95): on the test split the decided share's yes and no
    decisions are right 95 % of the time or more, with its coverage reported; without it they are not."""
    band = json.loads((runs["multi-label"] / files.METRICS).read_text())["review_band"]
    config = json.loads((runs["multi-label"] / files.CONFIG).read_text())[problem_types.REVIEW_BAND]
    assert config == {"precision": 0.95, "ranges": band["ranges"]} and len(band["ranges"]) == 4
    test = band["test"]
    assert test["precision"] >= 0.95 and test["negative_precision"] >= 0.95, test
    assert 0 < test["coverage"] < 1 and test["texts_decided"] < 1, test  # a weak label may be withheld whole
    assert test["without_band"]["precision"] < 0.95  # the band is what holds it


def test_a_multi_label_decision_is_the_same_in_every_shape_and_by_hand(runs, smoke_dir, tmp_path):
    """200 test texts: each label's yes, no or review is the same in moderation (openai SDK), KServe (tritonclient),
    predict's columns, evaluate's table, and the thresholds and band applied to /predict's scores."""
    openai = pytest.importorskip("openai", reason="the openai SDK is a dev dependency")
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a dev dependency")
    folder, source = runs["multi-label"], tmp_path / "texts.jsonl"
    texts = [text for text, _ in examples("multi-label", smoke_dir, n=200)]
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    output = tmp_path / "labelled.jsonl"
    args = ["--checkpoint_dir", str(folder), "--input_file", str(source), "--output_file", str(output), *FP32]
    result, _ = launch(["-m", "training.predict", *args])
    assert result.returncode == 0, describe(result)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    predicted = [(set(row["decision"]), set(row["review"])) for row in rows]
    config = json.loads((folder / files.CONFIG).read_text())
    thresholds, ranges = config[problem_types.THRESHOLDS], config[problem_types.REVIEW_BAND]["ranges"]
    server = Server(folder, "--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0",
                    "--served_model_name", "tagger").wait_ready()  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        moderated = [r for start in range(0, 200, 32) for r in
                     client.moderations.create(input=texts[start : start + 32]).results]  # fmt: skip
        scored = [answer for start in range(0, 200, 32) for answer in httpx.post(
            f"{server.url}/predict", json={"inputs": [[t] for t in texts[start : start + 32]]}).json()]  # fmt: skip
        info = httpx.get(f"{server.url}/info").json()
        labels = list(info["model_type"]["classifier"]["id2label"].values())
        tri_state = kserve_decisions(http, server, texts)
        overridden = kserve_override(server, texts[:32])
    finally:
        server.stop()
    assert info["distilbert_agnews"]["problem_type"]["review_band"] == config[problem_types.REVIEW_BAND]
    by_hand = []
    for answer in scored:
        score = {p["label"]: np.float32(p["score"]) for p in answer}
        inside = {label for label, (low, high) in zip(labels, ranges) if np.float32(low) <= score[label] < high}
        yes = {label for label, t in zip(labels, thresholds) if score[label] >= np.float32(t)}
        by_hand.append((yes - inside, inside))
    moderation = [({k for k, on in r.categories.model_extra.items() if on}, set(r.model_extra["review"]))
                  for r in moderated]  # fmt: skip
    kserve = [({labels[j] for j in np.flatnonzero(row == 1)}, {labels[j] for j in np.flatnonzero(row == -1)})
              for row in tri_state]  # fmt: skip
    assert moderation == predicted == kserve == by_hand
    assert [r.flagged for r in moderated] == [bool(yes) for yes, _ in moderation]  # every label flags by default
    assert 0 < sum(len(yes) for yes, _ in by_hand) and 0 < sum(len(out) for _, out in by_hand) < 200 * len(labels)
    at_half = [[int(p >= np.float32(0.5)) for p in row] for row in overridden["scores"]]
    assert overridden["decision"] == at_half and overridden["parameters"] == {"thresholds": [0.5] * len(labels)}
    copy, _ = evaluate_copy(folder, tmp_path, "smoke-multi-label")  # its test file's first 200 rows are these texts
    table = pd.read_csv(copy / files.MISCLASSIFIED_CSV, keep_default_na=False)
    listed = table[table["row"] < 200]
    assert len(listed) > 0
    for row in listed.itertuples():
        assert (set(filter(None, row.decision.split("|"))), set(filter(None, row.review.split("|")))) == by_hand[
            row.row
        ]


def kserve_decisions(http, server: Server, texts: list[str]) -> np.ndarray:
    """KServe v2's `decision` tensor for the texts (tritonclient, binary), 32 a request."""
    client = http.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        rows = []
        for start in range(0, len(texts), 32):
            text = http.InferInput("text", [len(texts[start : start + 32])], "BYTES")
            text.set_data_from_numpy(np.array(texts[start : start + 32], dtype=object))
            answer = client.infer("tagger", [text], outputs=[http.InferRequestedOutput("decision")])
            rows += list(answer.as_numpy("decision"))
        return np.asarray(rows)
    finally:
        client.close()


def kserve_override(server: Server, texts: list[str]) -> dict:
    """KServe v2 with `parameters: {"threshold": 0.5}`: the scores, the decisions and the echoed parameters."""
    tensor = {"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}
    answer = httpx.post(
        f"{server.url}/v2/models/tagger/infer", json={"inputs": [tensor], "parameters": {"threshold": 0.5}}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    outputs = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]).tolist() for o in body["outputs"]}
    return {**outputs, "parameters": body["parameters"]}
