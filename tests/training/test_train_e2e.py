"""The real entry point end to end, with real processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from contract import files
from tests.conftest import SMOKE_2PROC_ARGS
from tests.helpers.files import find_latest_state
from tests.helpers.processes import ROOT, cli_env, describe, free_port, run_train
from tests.helpers.service import wait_for
from training import calibration
from training.output.resume import read_progress

pytestmark = pytest.mark.slow
SMOKE_2PROC = SMOKE_2PROC_ARGS  # 84 steps per epoch on 2 ranks; --scale_lr linear: learning rate 2e-3 x 2 processes


def load_saved_model(out: Path):
    """What the serving side does: config.json + state_dict (weights_only) + tokenizer/."""
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(out))
    state_dict = torch.load(out / files.WEIGHTS, map_location="cpu", weights_only=True)
    model.load_state_dict(state_dict)
    return model.eval(), AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR), state_dict


def test_two_process_run_writes_every_checkpoint_file(smoke_2proc_run, smoke_dir):
    out, result = smoke_2proc_run
    assert "MULTI_CPU, 2 process(es)" in result.stderr
    assert "FutureWarning" not in result.stderr  # torch's broadcast_buffers notice, once per rank, is not ours to show
    assert (
        "Effective batch size 32 (16 per device x 1 accumulation x 2 processes); learning rate 0.004" in result.stderr
    )
    assert files.WEIGHTS == "distilbert_agnews.pt"  # the mission's contract, pinned once
    for name in (
        files.WEIGHTS,
        files.CONFIG,
        files.METRICS,
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ):
        assert (out / name).is_file(), name
    config = json.loads((out / files.CONFIG).read_text())
    assert config["id2label"] == {"0": "World", "1": "Sports", "2": "Business", "3": "Sci/Tech"}
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["world_size"] == 2 and metrics["effective_batch_size"] == 32
    assert metrics["validation"]["accuracy"] >= 0.90
    assert metrics["label_names"] == ["World", "Sports", "Business", "Sci/Tech"]
    assert metrics["config"]["preset"] == "smoke" and metrics["versions"]["torch"] == torch.__version__
    assert metrics["global_step"] == 252 and metrics["epochs_completed"] == 3
    steps = sorted(read_progress(p).global_step for p in (out / files.STATE_DIR).iterdir())
    assert steps == list(range(21, 253, 21))
    assert not list((out / files.STATE_DIR).glob(".tmp*")) and find_latest_state(str(out)).name == "step_252"


def test_distributed_evaluation_counts_every_example_exactly_once(smoke_2proc_run):
    out, _ = smoke_2proc_run
    metrics = json.loads((out / files.METRICS).read_text())
    # 300 validation and 600 test examples do not split evenly into 2 ranks x 64-example batches:
    # accelerate pads the last batch, gather_for_metrics must drop the duplicates.
    assert metrics["num_examples"] == {"train": 2700, "validation": 300, "test": 600}
    assert metrics["validation"]["num_examples"] == 300 and metrics["test"]["num_examples"] == 600
    assert all(entry["num_examples"] == 300 for entry in metrics["history"])


def test_saved_state_dict_reproduces_the_trained_model(smoke_2proc_run, smoke_dir):
    out, _ = smoke_2proc_run
    model, tokenizer, state_dict = load_saved_model(out)
    assert not [k for k in state_dict if k.startswith(("module.", "_orig_mod."))]
    assert all(isinstance(v, torch.Tensor) for v in state_dict.values())
    metrics = json.loads((out / files.METRICS).read_text())
    best = metrics["best_step"]
    # The training process's own weights at the best step, as accelerate saved them in the resumable state.
    trained = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(out))
    trained.load_state_dict(load_file(out / files.STATE_DIR / f"step_{best}" / "model.safetensors"))
    # ... with the temperature the end of the run folded into the output layer, where it did (training/calibration.py)
    if metrics["calibration"]["method"] == "temperature":
        calibration.fold_temperature(trained.state_dict(), "classifier", metrics["calibration"]["temperature"])
    trained.eval()
    texts = [line.rsplit(",", 1)[0].strip('"') for line in (smoke_dir / "test.csv").read_text().splitlines()[1:65]]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, trained(**batch).logits)
    # ... and the same test accuracy the training run reported for its best model
    import csv

    with open(smoke_dir / "test.csv") as fh:
        rows = list(csv.DictReader(fh))
    correct = 0
    for start in range(0, len(rows), 100):
        chunk = rows[start : start + 100]
        enc = tokenizer([r["text"] for r in chunk], padding=True, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            predicted = model(**enc).logits.argmax(-1).tolist()
        correct += sum(p == int(r["label"]) for p, r in zip(predicted, chunk))  # the smoke data holds class ids
    assert correct / len(rows) == pytest.approx(metrics["test"]["accuracy"], abs=1e-9)


def test_resume_from_a_mid_epoch_state_finishes_identically(smoke_2proc_run, tmp_path):
    """Copy the state saved 42 batches into epoch 1 to a fresh folder, resume with `latest`, finish the run."""
    out, _ = smoke_2proc_run
    resumed = tmp_path / "resumed"
    shutil.copytree(out / files.STATE_DIR / "step_42", resumed / files.STATE_DIR / "step_42")
    result, _ = run_train(
        [*SMOKE_2PROC, "--output_dir", str(resumed), "--resume_from_checkpoint", "latest"], processes=2
    )
    assert result.returncode == 0, describe(result)
    assert "Resumed from" in result.stderr and "epoch 0, 42 batches into it, optimizer step 42" in result.stderr
    final_a = load_file(out / files.STATE_DIR / "step_252" / "model.safetensors")
    final_b = load_file(resumed / files.STATE_DIR / "step_252" / "model.safetensors")
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)  # bitwise: no batch repeated or skipped
    a, b = (json.loads((d / files.METRICS).read_text()) for d in (out, resumed))
    assert a["history"] == b["history"] and a["test"] == b["test"] and a["best_step"] == b["best_step"]


def test_early_stopping_with_accumulation_stops_all_ranks(smoke_dir, tmp_path):
    out = tmp_path / "early"
    result, _ = run_train(
        [
            "--preset",
            "smoke",
            "--output_dir",
            str(out),
            "--gradient_accumulation_steps",
            "2",
            "--eval_steps",
            "10",
            "--early_stopping_patience",
            "2",
            "--checkpointing_steps",
            "none",
            "--learning_rate",
            "3e-3",
        ],
        processes=2,
    )
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["effective_batch_size"] == 64
    total = 3 * 42  # 84 batches per rank per epoch / accumulation 2
    assert metrics["global_step"] < total and "Early stopping" in result.stderr
    history = metrics["history"]
    stop = metrics["global_step"]  # evaluations every 10 steps and at each epoch end (42 steps)
    assert [h["step"] for h in history] == sorted(set(range(10, stop + 1, 10)) | set(range(42, stop + 1, 42)))
    best = max(h["accuracy"] for h in history)
    reached = next(i for i, h in enumerate(history) if h["accuracy"] == best)  # first reached: later ones only tie
    assert reached < len(history) - 2 and history[reached]["step"] <= metrics["best_step"]  # a tie keeps the later
    assert not (out / files.STATE_DIR).exists()


def test_single_process_plain_python(smoke_model):
    """The session's smoke model is a plain `python training/train.py` run: 1 epoch of the preset's 3."""
    metrics = json.loads((smoke_model / files.METRICS).read_text())
    assert metrics["world_size"] == 1 and metrics["validation"]["accuracy"] >= 0.90
    assert metrics["epochs_completed"] == 1 and metrics["train_runtime_s"] * 3 < 60  # the preset: under a minute
    assert (smoke_model / files.WEIGHTS).is_file()


def test_bf16_autocast_and_tensorboard_tracker(smoke_dir, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed: the tracker half of this test needs it")
    out = tmp_path / "bf16"
    result, _ = run_train(
        [
            "--preset",
            "smoke",
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "1",
            "--mixed_precision",
            "bf16",
            "--report_to",
            "tensorboard",
            "--checkpointing_steps",
            "20",
            "--save_total_limit",
            "2",
        ]
    )
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["mixed_precision"] == "bf16" and metrics["validation"]["num_examples"] == 300
    assert list(out.rglob("events.out.tfevents.*")), "no TensorBoard event file written"
    _, _, state_dict = load_saved_model(out)
    assert all(v.dtype == torch.float32 for v in state_dict.values() if v.is_floating_point())  # autocast, fp32 master
    # --save_total_limit 2: of the states at steps 20, 40, ..., 160 only the newest two remain; the model stays
    assert sorted(p.name for p in (out / files.STATE_DIR).iterdir()) == ["step_140", "step_160"]
    assert (out / files.WEIGHTS).is_file() and metrics["best_step"] == 168


def test_offline_default_run_stops_fast_with_a_useful_message(tmp_path):
    env = cli_env(HF_HOME=str(tmp_path / "empty_hf_home"), HF_ENDPOINT="http://127.0.0.1:9")
    env.pop("HF_HUB_OFFLINE")
    result, seconds = run_train(["--output_dir", str(tmp_path / "out")], env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, describe(result)
    assert seconds < 30
    assert "--preset smoke" in output and "--train_file" in output and "Traceback" not in output


def test_processes_that_each_see_a_world_of_one_are_refused():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(ROOT / "tests" / "helpers" / "plain_accelerator.py"),
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "refused: The launcher started 2 processes" in result.stderr, describe(result)


def test_reports_curves_model_card_and_the_hugging_face_export(smoke_2proc_run, smoke_dir):
    out, _ = smoke_2proc_run
    metrics = json.loads((out / files.METRICS).read_text())
    curves = json.loads((out / files.CURVES_JSON).read_text())
    assert curves == {"train": metrics["train_loss"], "validation": metrics["history"]}
    assert [row["step"] for row in curves["train"]] == list(range(21, 253, 21))  # --logging_steps 21
    assert [row["step"] for row in curves["validation"]] == [84, 168, 252]
    from PIL import Image

    with Image.open(out / files.CURVES_PNG) as image:
        assert image.format == "PNG" and image.width > 800

    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card
    for expected in (
        "| 0 | World |",
        "| 3 | Sci/Tech |",
        "| world size | 2 |",
        "| effective batch | 32 |",
        f"| test | {metrics['test']['accuracy']:.4f} |",
        f"python -m inference --model_id {out}",
    ):
        assert expected in card, expected

    from transformers import pipeline

    classify = pipeline("text-classification", model=str(out), top_k=None)
    model, tokenizer, _ = load_saved_model(out)
    texts = ["The yankees beat the red sox in overtime.", "Shares of oracle rose in early trading."]
    with torch.no_grad():
        expected = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.softmax(-1)
    for row, answer in zip(expected, classify(texts)):
        got = {item["label"]: item["score"] for item in answer}
        assert got.keys() == set(model.config.id2label.values())
        for i, score in enumerate(row.tolist()):
            assert got[model.config.id2label[i]] == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("data", ["preset", "own file"])
def test_a_finished_run_ends_with_one_line_whose_commands_run_as_printed(smoke_dir, tmp_path, data):
    """The last line's commands, each run as printed."""
    import shlex

    out = tmp_path / "run"
    args = ["--preset", "smoke", "--output_dir", str(out), "--max_train_steps", "10", "--checkpointing_steps", "5"]
    if data == "own file":
        own = tmp_path / "mine.csv"
        own.write_text((smoke_dir / "train.csv").read_text()[:20000].rsplit("\n", 1)[0] + "\n")
        args += ["--train_file", str(own), "--test_file", "none", "--model_name_or_path", str(smoke_dir / "model")]
        args += ["--review_precision", "0.9"]  # on a few dozen validation texts: not fitted, said
    result, _ = run_train(args)
    assert result.returncode == 0 and (out / files.STATE_DIR / "step_5").is_dir(), describe(result)
    # the states were saved without accelerate's line per file (--verbose shows them)
    assert "accelerate.checkpointing" not in result.stderr and "accelerate.accelerator" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    sized = re.search(rf"is in {re.escape(str(out))} \(\d+\.\d MB, ", last)  # the folder's size
    assert "Done: the best model (step " in last and sized, last
    evaluate, predict, serve = (part.split(": ", 1)[1] for part in last.split(". ", 1)[1].split("  |  "))
    assert serve == f"agnews serve --model_id {out}"
    evaluate = evaluate.split("  (")[0]  # a note on the data it scores may follow
    for command in (evaluate, predict):
        ran = subprocess.run(shlex.split(command), cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, describe(ran)
    scored = json.loads((out / files.EVAL_RESULTS).read_text())
    if data == "own file":  # the validation rows training held out, scored again: the same accuracy
        summary = json.loads((out / files.METRICS).read_text())
        assert scored["metrics"]["accuracy"] == pytest.approx(summary["validation"]["accuracy"], abs=1e-6)
        # a few dozen validation texts: auto calibration folds nothing in (a temperature fitted on halves of them
        # was folded into the weights before, at its bound)
        held = summary["num_examples"]["validation"]
        assert f"Calibration: not applied (auto): {held} validation texts, under 100" in result.stderr
        assert json.loads((out / files.CONFIG).read_text())["calibration"] == {"method": "none"}
        assert f"Review band: not fitted: {held} validation texts, under 100" in result.stderr
        assert "review_band" not in json.loads((out / files.CONFIG).read_text())
        assert summary["review_band"] == {"precision": 0.9, "too_few": held}
    assert (out / "labelled.csv").is_file()
    port = free_port()
    served = subprocess.Popen(shlex.split(serve), cwd=ROOT, env=cli_env(PORT=str(port)), stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _ready(port), lambda ok: ok, timeout=120)
    finally:
        served.terminate()
        served.wait(30)


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
