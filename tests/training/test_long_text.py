"""Long documents end to end: windows beat truncation."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from contract import files
from contract.loading import load_model
from tests.helpers.processes import ROOT, describe, launch, run_train
from training.output.best_model import load_weights
from training.train import cli

pytestmark = pytest.mark.slow
AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "train_subset.csv"
FP32 = ["--mixed_precision", "fp32"]


@pytest.fixture(scope="module")
def truncated_run(smoke_dir, tmp_path_factory) -> Path:
    """The same preset with --long_text truncate: trained on each story's first window only."""
    out = tmp_path_factory.mktemp("truncate") / "out"
    result, _ = run_train(["--preset", "smoke-long", "--long_text", "truncate", "--output_dir", str(out)])
    assert result.returncode == 0, describe(result)
    return out


def test_chunk_beats_truncate_when_the_evidence_is_past_the_first_window(smoke_long_model, truncated_run):
    config = json.loads((smoke_long_model / files.CONFIG).read_text())
    assert {k: config[k] for k in ("long_text", "chunk_stride", "chunk_pooling", "chunk_max_length")} == {
        "long_text": "chunk",
        "chunk_stride": 8,
        "chunk_pooling": "mean",
        "chunk_max_length": 48,
    }
    chunked = json.loads((smoke_long_model / files.METRICS).read_text())
    truncated = json.loads((truncated_run / files.METRICS).read_text())
    print(f"test accuracy: chunk {chunked['test']['accuracy']:.4f}, truncate {truncated['test']['accuracy']:.4f}")
    assert chunked["test"]["accuracy"] >= 0.9 and truncated["test"]["accuracy"] <= 0.4
    assert chunked["num_examples"]["test"] == chunked["test"]["num_examples"] == 200
    assert chunked["num_windows"]["test"] == chunked["test"]["num_windows"] > 2 * 200  # every story: several windows
    assert "num_windows" not in truncated and "num_windows" not in truncated["test"]


def evaluate(model: Path, tmp_path: Path, processes: int, *extra: str) -> tuple[Path, dict]:
    copy = tmp_path / f"model{processes}{''.join(extra)}"
    shutil.copytree(model, copy, ignore=shutil.ignore_patterns(files.STATE_DIR))
    args = ["-m", "training.evaluate", "--checkpoint_dir", str(copy), "--preset", "smoke-long"]
    # batches of 7 windows: a story's windows land in different batches, and so on different ranks
    result, _ = launch([*args, "--per_device_eval_batch_size", "7", *extra], processes=processes)
    assert result.returncode == 0, describe(result)
    return copy, json.loads((copy / files.EVAL_RESULTS).read_text())


def test_evaluation_pools_per_text_identically_on_one_and_two_processes(smoke_long_model, tmp_path):
    one, results = evaluate(smoke_long_model, tmp_path, 1)
    trained = json.loads((smoke_long_model / files.METRICS).read_text())["test"]
    assert results["metrics"]["num_examples"] == 200 and results["metrics"]["num_windows"] == trained["num_windows"]
    assert results["metrics"]["accuracy"] == pytest.approx(trained["accuracy"], abs=1e-6)
    assert results["long_text"]["long_text"] == "chunk"
    two, on_two = evaluate(smoke_long_model, tmp_path, 2)
    assert on_two["metrics"] == results["metrics"] and on_two["confusion_matrix"] == results["confusion_matrix"]
    assert (two / files.MISCLASSIFIED_CSV).read_text() == (one / files.MISCLASSIFIED_CSV).read_text()
    _, first_window = evaluate(smoke_long_model, tmp_path, 1, "--long_text", "truncate")
    assert first_window["metrics"]["accuracy"] < results["metrics"]["accuracy"] - 0.4
    assert "num_windows" not in first_window["metrics"]


def predict(model: Path, source: Path, output: Path, processes: int = 1, *extra: str) -> pd.DataFrame:
    args = ["--checkpoint_dir", str(model), "--input_file", str(source), "--output_file", str(output)]
    result, _ = launch(["-m", "training.predict", *args, *FP32, "--chunk_size", "37", *extra], processes=processes)
    assert result.returncode == 0, describe(result)
    return pd.read_parquet(output) if output.suffix == ".parquet" else pd.read_csv(output)


@torch.no_grad()
def pooled_scores(model: Path, texts: list[str]) -> torch.Tensor:
    """Each text on its own: its windows through the plain model, their logits averaged, softmaxed."""
    loaded = load_model(str(model), device="cpu", dtype="fp32")
    long_text = loaded.long_text
    rows = []
    for text in texts:
        windows = long_text.encode(loaded.tokenizer, [text], None, long_text.window)
        logits = torch.cat([loaded.model(input_ids=torch.tensor([f["input_ids"]])).logits for f in windows.features])
        rows.append(logits.mean(0).softmax(-1))
    return torch.stack(rows)


def test_prediction_is_one_pooled_row_per_input_identically_on_one_and_two_processes(
    smoke_long_model, smoke_dir, tmp_path
):
    source = smoke_dir / "long_test.csv"
    frames = [predict(smoke_long_model, source, tmp_path / f"out{n}.parquet", n) for n in (1, 2)]
    pd.testing.assert_frame_equal(frames[0], frames[1])
    frame, given = frames[0], pd.read_csv(source)
    assert list(frame["text"]) == list(given["text"])  # one row per input, in input order
    loaded = load_model(str(smoke_long_model), device="cpu", dtype="fp32")
    expected_windows = loaded.long_text.encode(loaded.tokenizer, list(given["text"]), None, 48).counts(len(given))
    assert list(frame["num_windows"]) == expected_windows and min(expected_windows) >= 3
    labels = ["World", "Sports", "Business", "Sci/Tech"]
    scores = torch.tensor(frame[[f"score_{name}" for name in labels]].to_numpy()).float()
    assert torch.allclose(scores[:10], pooled_scores(smoke_long_model, list(given["text"][:10])), atol=1e-5)
    accuracy = (frame["predicted_label"] == [labels[i] for i in given["label"]]).mean()
    assert accuracy >= 0.9


def test_texts_that_fit_the_window_get_the_same_answers_chunked_or_truncated(smoke_model, smoke_dir, tmp_path):
    """Texts within the window: chunking changes nothing, bit for bit."""
    sources = [smoke_dir / "test.csv"]
    if AG_NEWS.is_file():
        rows = list(csv.DictReader(open(AG_NEWS, encoding="utf-8")))[:300]
        sources.append(tmp_path / "ag_news.csv")
        pd.DataFrame(rows).to_csv(sources[-1], index=False)
    else:
        print(f"the shared AG News data is not here ({AG_NEWS}): checked on the smoke test texts only")
    for source, length in zip(sources, ("64", "512")):
        kept = predict(smoke_model, source, tmp_path / "kept.csv", 1, "--max_length", length)
        chunked = predict(
            smoke_model, source, tmp_path / "chunked.csv", 1, "--max_length", length, "--long_text", "chunk"
        )
        fits = chunked.pop("num_windows") == 1
        print(f"{source.name}: {fits.sum()} of {len(fits)} texts fit one {length}-token window")
        assert fits.all() if source.name == "test.csv" else fits.mean() >= 0.9
        pd.testing.assert_frame_equal(kept[fits], chunked[fits])  # the others are read whole when chunked


def test_a_mid_epoch_resume_with_chunking_continues_bitwise(smoke_long_model, tmp_path):
    resumed = tmp_path / "out"
    later = ["step_400", "step_500", "step_600"]  # resume from step 300, in the middle of the second epoch
    shutil.copytree(smoke_long_model, resumed, ignore=lambda folder, names: [n for n in names if n in later])
    args = ["--preset", "smoke-long", "--checkpointing_steps", "100", "--output_dir", str(resumed)]
    result, _ = run_train([*args, "--resume_from_checkpoint", "latest"])
    assert result.returncode == 0, describe(result)
    last = f"{files.STATE_DIR}/step_600/model.safetensors"
    a, b = load_file(smoke_long_model / last), load_file(resumed / last)
    assert all(torch.equal(a[k], b[k]) for k in a)
    best, again = load_weights(smoke_long_model / files.WEIGHTS), load_weights(resumed / files.WEIGHTS)
    assert all(torch.equal(best[k], again[k]) for k in best)


def test_gradient_checkpointing_trains_the_same_weights(smoke_dir, tmp_path):
    """Activations recomputed in the backward pass, dropout replayed from the saved RNG state: the same weights."""
    states = []
    for flag in ("false", "true"):
        out = tmp_path / flag
        args = ["--preset", "smoke", "--max_train_steps", "20", "--checkpointing_steps", "20", "--output_dir", str(out)]
        result, _ = run_train([*args, "--gradient_checkpointing", flag])
        assert result.returncode == 0, describe(result)
        states.append(load_file(out / files.STATE_DIR / "step_20" / "model.safetensors"))
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--chunk_stride", "48"], "chunk_stride: must be smaller than max_length (48) (got 48)"),
        (["--chunk_pooling", "median"], "chunk_pooling: must be one of 'mean' or 'max' (got 'median')"),
        (["--long_text", "split"], "long_text: must be one of 'truncate' or 'chunk' (got 'split')"),
    ],
)
def test_bad_chunk_settings_are_one_line(tmp_path, args, message, capsys):
    """Checked with the flags, in train.py's entry point (the real script's exit 2: tests/training/test_config.py)."""
    assert cli(["--preset", "smoke-long", "--output_dir", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_stride_past_the_window_stops_in_one_line_once_the_tokenizer_is_read(smoke_dir, tmp_path):
    result, _ = run_train(["--preset", "smoke-long", "--output_dir", str(tmp_path / "out"), "--chunk_stride", "46"])
    assert result.returncode == 1, describe(result)
    lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    message = "chunk_stride: must be smaller than a window's 46 text tokens"
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr[-2000:]
