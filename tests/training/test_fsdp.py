"""FSDP2 on 2 CPU processes: every DDP feature holds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract import files
from contract.loading import load_model
from tests.helpers.processes import FSDP, ROOT, cli_env, describe, fsdp_env, run_train
from training.output.resume import ResumeError, pick_state
from training.weights import edit_weights  # noqa: F401 - the path under test, named for the reader

pytestmark = pytest.mark.slow
STEPS = ["--num_train_epochs", "1", "--max_train_steps", "60", "--eval_steps", "30", "--checkpointing_steps", "25"]
MULTI = ["--preset", "smoke-multi-label", *STEPS]


def fsdp_train(out: Path, *args: str) -> subprocess.CompletedProcess:
    result, _ = run_train([*args, "--output_dir", str(out)], processes=2, env=fsdp_env(), config=FSDP)
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """{"temperature": ..., "none": ...}: the multi-label run with and without its temperatures folded in."""
    found = {}
    for calibration in ("temperature", "none"):
        out = tmp_path_factory.mktemp("fsdp") / calibration
        result = fsdp_train(out, *MULTI, "--calibration", calibration)
        assert result.returncode == 0, describe(result)
        found[calibration] = out, result
    return found


def test_the_run_is_sharded_and_counts_every_text_once(runs):
    """Finding 1 of the FSDP issue: the log named DDP's settings under FSDP. Exact counts on 2 ranks."""
    out, result = runs["temperature"]
    assert "FSDP stand-in: FSDP2 on gloo" in result.stderr
    assert "FSDP2: parameters, gradients and optimizer state sharded over 2 processes" in result.stderr
    assert "DDP: gradients as views" not in result.stderr
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["world_size"] == 2 and metrics["validation"]["num_examples"] == 300
    assert metrics["test"]["num_examples"] == 600 and metrics["num_examples"]["test"] == 600
    states = sorted((out / files.STATE_DIR).iterdir())
    assert [s.name for s in states] == ["step_25", "step_50"]
    assert (states[0] / "pytorch_model_fsdp_0" / ".metadata").is_file()  # each rank's shard, not a full copy


def test_calibration_is_folded_into_the_files_that_are_served(runs):
    """Calibration folded under FSDP matches what config.json records."""
    calibrated, plain = runs["temperature"][0], runs["none"][0]
    config = json.loads((calibrated / files.CONFIG).read_text())
    temperatures = torch.tensor(config["calibration"]["temperatures"])
    a, b = (torch.load(folder / files.WEIGHTS, weights_only=True) for folder in (calibrated, plain))
    assert not torch.allclose(temperatures, torch.ones(4))
    assert torch.allclose(a["classifier.weight"], b["classifier.weight"] / temperatures[:, None], atol=1e-6)
    assert torch.allclose(a["classifier.bias"], b["classifier.bias"] / temperatures, atol=1e-6)
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith("classifier."))
    served = load_model(str(calibrated), device="cpu", dtype="fp32")
    assert torch.equal(served.model.classifier.weight, a["classifier.weight"])
    summary = json.loads((calibrated / files.METRICS).read_text())
    assert config["decision_thresholds"] == pytest.approx(summary["test"]["thresholds"])


def test_the_best_model_is_put_back_before_the_test_split(runs):
    """Finding 2: restoring the best model crashed (a plain load_state_dict into sharded parameters). The test split
    is scored by the restored best model: its figures are those of the saved weights scored again here."""
    out, result = runs["none"]
    summary = json.loads((out / files.METRICS).read_text())
    assert summary["best_step"] in (30, 60) and "Traceback" not in result.stderr
    rows = [json.loads(line) for line in (Path(summary["provenance"]["data"]["test"]["file"])).read_text().splitlines()]
    served = load_model(str(out), device="cpu", dtype="fp32")
    batch = served.tokenizer(
        [r["text"] for r in rows], padding=True, truncation=True, max_length=128, return_tensors="pt"
    )
    with torch.no_grad():
        scores = served.model(**batch).logits.sigmoid()
    decided = scores >= torch.tensor(summary["test"]["thresholds"])
    truth = torch.tensor([[name in r["labels"] for name in summary["label_names"]] for r in rows])
    tp, fp, fn = (decided & truth).sum(), (decided & ~truth).sum(), (~decided & truth).sum()
    assert (2 * tp / (2 * tp + fp + fn)).item() == pytest.approx(summary["test"]["micro_f1"], abs=1e-6)


def test_a_mid_epoch_resume_from_sharded_states_ends_bitwise(runs, tmp_path):
    """The state at step 25 (each rank's shard of the model and optimizer, saved by accelerate's FSDP path) copied
    alone into a new folder and resumed with `latest`: the same best model, bit for bit."""
    out = runs["none"][0]
    resumed = tmp_path / "resumed"
    shutil.copytree(out / files.STATE_DIR / "step_25", resumed / files.STATE_DIR / "step_25")
    result = fsdp_train(resumed, *MULTI, "--calibration", "none", "--resume_from_checkpoint", "latest")
    assert result.returncode == 0, describe(result)
    assert f"Resumed from {resumed / files.STATE_DIR / 'step_25'}" in result.stderr
    a, b = (torch.load(folder / files.WEIGHTS, weights_only=True) for folder in (out, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class RunsCommand:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def poison_shard(step: Path, variant: str, marker: Path) -> Path:
    """The attack's variants on a sharded state: the file or link a resume must refuse."""
    shard, evil = step / "optimizer_0", __import__("pickle").dumps(RunsCommand(f"touch {marker}"))
    if variant == "index":
        (shard / ".metadata").write_bytes(evil)
        return shard / ".metadata"
    if variant == "rank index":  # torch falls back to the rank-local index when `.metadata` is missing
        (shard / ".metadata").unlink()
        (shard / "__0.metadata").write_bytes(evil)
        return shard / "__0.metadata"
    elsewhere = Path(shutil.copytree(shard, step.parent.parent / "elsewhere"))
    (elsewhere / ".metadata").write_bytes(evil)
    shutil.rmtree(shard)
    shard.symlink_to(elsewhere if variant == "absolute link" else Path("..") / ".." / "elsewhere")
    return shard


@pytest.mark.parametrize("variant", ["index", "rank index", "relative link", "absolute link"])
def test_a_sharded_state_that_would_run_code_is_refused(runs, tmp_path, variant):
    """torch's checkpoint reader unpickles a shard's index unrestricted, `__0.metadata` when `.metadata` is missing,
    and follows links: each variant is refused naming the file, nothing runs, and the state beside it still resumes
    (training/output/state_files.py reads the same way while loading: tests/training/output/test_state_files.py)."""
    from accelerate import PartialState

    PartialState(cpu=True)  # the package logs through accelerate's logger
    out = Path(shutil.copytree(runs["none"][0], tmp_path / "copy"))
    marker = tmp_path / "ran"
    named = poison_shard(out / files.STATE_DIR / "step_50", variant, marker)
    says = "a symbolic link" if "link" in variant else "holds more than a checkpoint's layout .*posix.system"
    with pytest.raises(ResumeError, match=f"{named}: {says}"):
        pick_state(out, "latest", 2, False)
    assert not marker.exists()
    assert pick_state(out, str(out / files.STATE_DIR / "step_25"), 2, False).name == "step_25"


def test_resuming_a_sharded_state_with_a_poisoned_rank_index_stops_in_one_line_on_both_ranks(runs, tmp_path):
    """The attack as reported, through accelerate launch on 2 processes: `.metadata` deleted, `__0.metadata`
    poisoned, `--resume_from_checkpoint latest`."""
    out = Path(shutil.copytree(runs["none"][0], tmp_path / "copy"))
    marker = tmp_path / "ran"
    named = poison_shard(out / files.STATE_DIR / "step_50", "rank index", marker)
    result = fsdp_train(out, *MULTI, "--calibration", "none", "--resume_from_checkpoint", "latest")
    assert result.returncode == 1, describe(result)
    [line] = [line for line in result.stderr.splitlines() if " ERROR " in line]  # the main process's one line
    assert f"{named}: holds more than a checkpoint's layout (it would import posix.system)" in line
    assert "[rank0]: Traceback" not in result.stderr and "[rank1]: Traceback" not in result.stderr
    assert not marker.exists()


def test_chunked_long_text_trains_and_scores_every_window(tmp_path):
    """--long_text chunk (smoke-long: a story's windows may sit on both ranks): exact counts of texts and windows."""
    out = tmp_path / "long"
    result = fsdp_train(out, "--preset", "smoke-long", "--max_train_steps", "30", "--checkpointing_steps", "none")
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["test"]["num_examples"] == metrics["num_examples"]["test"]
    assert metrics["test"]["num_windows"] == metrics["num_windows"]["test"] > metrics["num_examples"]["test"]


@pytest.mark.parametrize(
    "env, args, says",
    [
        (fsdp_env, ["--lora_r", "4"], "lora_r: LoRA is not supported under FSDP"),
        (lambda: cli_env(ACCELERATE_USE_DEEPSPEED="true"), [], "DeepSpeed is not supported here"),
    ],
    ids=["lora-under-fsdp", "deepspeed"],
)
def test_what_does_not_shard_is_refused_at_start_in_one_line(tmp_path, env, args, says):
    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "training" / "train.py"), "--preset", "smoke", "--output_dir", str(out)]
    launched = {**env(), "ACCELERATE_USE_FSDP": "true"} if args else env()
    result = subprocess.run([*command, *args], cwd=ROOT, env=launched, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and says in result.stderr.strip().splitlines()[-1], describe(result)
    assert "Traceback" not in result.stderr and not out.exists()
