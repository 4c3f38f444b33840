"""The output folder under faults: one line, or a recovery."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from accelerate.utils import load as accelerate_load
from safetensors.torch import load_file

from contract import files
from tests.conftest import SMOKE_TRAINING
from tests.helpers.files import read_only
from tests.helpers.processes import ROOT, cli_env, describe, fault_env, launch_command, run_train
from training.config import TrainConfig
from training.output import provenance
from training.output.resume import ResumeError, complete_states, damaged_file, pick_state

pytestmark = pytest.mark.slow
SMOKE = SMOKE_TRAINING  # 1 process: 168 steps, states at 84 and 168; no runtime export


def errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if " ERROR " in line]


@pytest.fixture(scope="module")
def finished(smoke_model) -> Path:
    """One uninterrupted 1-process run (SMOKE) with states at steps 84 (mid-epoch) and 168 (its end)."""
    assert [step for step, _ in complete_states(smoke_model)] == [84, 168]
    return smoke_model


@pytest.fixture
def copy_of(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    (out / files.LOCK).unlink()
    return out


@pytest.fixture
def accelerate_state():
    """The package logs through accelerate's logger, which needs an initialised state."""
    from accelerate import PartialState

    yield PartialState(cpu=True)


def test_an_unwritable_output_dir_is_one_line_before_any_data_or_model_is_loaded(smoke_dir, tmp_path):
    folder = tmp_path / "read_only"
    folder.mkdir()
    with read_only(folder):
        result, seconds = run_train([*SMOKE, "--output_dir", str(folder / "run")])
    assert result.returncode == 1, describe(result)
    assert len(errors(result)) == 1 and f"--output_dir {folder / 'run'} is not writable" in errors(result)[0]
    assert "Examples:" not in result.stderr and "Traceback" not in result.stderr, describe(result)
    assert seconds < 30


def test_a_second_run_on_the_same_folder_is_refused_naming_the_first(smoke_dir, tmp_path):
    """The first run is held at step 5 (an injected hang): it is certainly still running when the second starts."""
    from training.output.claim import lock

    out, log = tmp_path / "out", tmp_path / "first.log"
    cmd = launch_command([str(ROOT / "training" / "train.py"), *SMOKE, "--output_dir", str(out)], processes=1)
    env = fault_env("hang_on_rank:0:5")
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not (out / files.LOCK).is_file() or "PID" not in (out / files.LOCK).read_text():
            assert first.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.1)
        second, seconds = run_train([*SMOKE, "--output_dir", str(out)])
    finally:
        first.kill()
        first.wait(30)
    assert second.returncode == 1, describe(second)
    assert len(errors(second)) == 1, describe(second)
    assert f"is in use by another training run (PID {first.pid} on" in errors(second)[0]
    assert seconds < 30 and "Examples:" not in second.stderr
    assert not (out / files.STATE_DIR).exists() and not (out / files.WEIGHTS).exists()
    handle, problem = lock(out)  # the holder is dead: the kernel has dropped its lock
    assert problem is None
    handle.close()


SHORT = ["--max_train_steps", "6", "--checkpointing_steps", "3", "--eval_steps", "3"]


def test_an_unfinished_run_is_refused_or_replaced_as_the_new_run_saves_and_latest_is_its_own(copy_of):
    """A stopped run's folder: refused, or overwritten only once the new run saves."""
    (copy_of / files.METRICS).unlink()  # as a preempted run leaves it before its first best model
    (copy_of / files.STATE_DIR / "important_notes.txt").write_text("mine")
    (copy_of / files.STATE_DIR / "step_photos").mkdir()
    weights = (copy_of / files.WEIGHTS).read_bytes()
    refused, seconds = run_train([*SMOKE, "--output_dir", str(copy_of)])
    assert refused.returncode == 1 and "Examples:" not in refused.stderr and seconds < 30, describe(refused)
    [line] = errors(refused)
    assert f"--output_dir {copy_of} holds an unfinished run (2 states in state/, {files.WEIGHTS}" in line
    assert "--resume_from_checkpoint latest" in line and "--overwrite_output_dir" in line
    assert (copy_of / files.WEIGHTS).read_bytes() == weights

    again = [*SMOKE, "--output_dir", str(copy_of), *SHORT]
    started_over, _ = run_train([*again, "--overwrite_output_dir"])
    assert started_over.returncode == 0, describe(started_over)
    assert "this run replaces them as it saves" in started_over.stderr
    assert f"Removed what the run before left in {copy_of}: 2 resumable states" in started_over.stderr
    assert sorted(p.name for p in (copy_of / files.STATE_DIR).iterdir()) == [
        "important_notes.txt", "step_3", "step_6", "step_photos"
    ]  # fmt: skip
    shutil.rmtree(copy_of / files.STATE_DIR / "step_6")  # as if preempted between step 3 and 6
    resumed, _ = run_train([*again, "--resume_from_checkpoint", "latest"])
    assert resumed.returncode == 0, describe(resumed)
    assert f"Resumed from {copy_of / files.STATE_DIR / 'step_3'}" in resumed.stderr, describe(resumed)


def test_a_finished_run_is_replaced_with_one_line_and_kept_until_the_new_run_saves(copy_of):
    """Re-running a command into the folder of a finished run (README's commands all write checkpoints/): replaced
    with one line saying so; a run that fails before saving anything leaves the finished one whole."""
    weights = (copy_of / files.WEIGHTS).read_bytes()
    missing = str(copy_of / "no_such_model")  # fails after the claim, before anything is saved
    failed, _ = run_train([*SMOKE, "--output_dir", str(copy_of), "--model_name_or_path", missing])
    assert failed.returncode != 0 and "this run replaces them as it saves" in failed.stderr, describe(failed)
    assert (copy_of / files.WEIGHTS).read_bytes() == weights and len(complete_states(copy_of)) == 2
    again, _ = run_train([*SMOKE, "--output_dir", str(copy_of), *SHORT])
    assert again.returncode == 0, describe(again)
    assert f"{copy_of} holds a finished run (2 states in state/" in again.stderr
    assert [step for step, _ in complete_states(copy_of)] == [3, 6]
    assert json.loads((copy_of / files.METRICS).read_text())["global_step"] == 6


def test_a_state_folder_that_is_a_link_is_refused_and_nothing_is_removed_or_said_removed(copy_of, tmp_path):
    """Before, --overwrite_output_dir with state/ a link logged "removed the 2 resumable states", removed nothing, and
    `latest` then picked the previous run's state; at 53a86bc the refusal came after the folders behind the link
    named like staging (.tmp_*) were deleted."""
    elsewhere = Path(shutil.move(copy_of / files.STATE_DIR, tmp_path / "elsewhere"))
    (elsewhere / ".tmp_thesis").mkdir()
    (elsewhere / ".tmp_thesis" / "chapter1.txt").write_text("a user's own")
    (copy_of / files.STATE_DIR).symlink_to(elsewhere)
    for extra in (["--overwrite_output_dir"], []):
        result, _ = run_train([*SMOKE, "--output_dir", str(copy_of), *SHORT, *extra])
        assert result.returncode == 1, describe(result)
        [line] = errors(result)
        assert f"{copy_of / files.STATE_DIR} is a symbolic link" in line and "removed" not in result.stderr.lower()
        assert sorted(p.name for p in elsewhere.iterdir()) == [".tmp_thesis", "step_168", "step_84"]
        assert (elsewhere / ".tmp_thesis" / "chapter1.txt").read_text() == "a user's own"


def test_a_staging_entry_that_is_a_link_is_removed_itself_never_what_it_points_to(copy_of, tmp_path):
    """A dead run's staging names are cleaned up at the next claim: a link among them goes, its target stays."""
    target = tmp_path / "thesis"
    target.mkdir()
    (target / "chapter1.txt").write_text("a user's own")
    (copy_of / files.STATE_DIR / f"{files.STAGING_PREFIX}step_9.dead").symlink_to(target)
    result, _ = run_train([*SMOKE, "--output_dir", str(copy_of), *SHORT])
    assert result.returncode == 0, describe(result)
    assert (target / "chapter1.txt").read_text() == "a user's own"
    assert not list((copy_of / files.STATE_DIR).glob(f"{files.STAGING_PREFIX}*"))


def test_another_models_folder_is_refused_and_replaced_only_when_asked(smoke_dir, tmp_path):
    """Someone else's model folder is refused, then replaced."""
    theirs = Path(shutil.copytree(smoke_dir / "model", tmp_path / "theirs"))
    (theirs / files.MODEL_CARD).write_text("# my model\n")
    (theirs / "notes.txt").write_text("mine")
    (theirs / "vocab.txt").write_text("[PAD]\n")  # a tokenizer file this run's tokenizer does not write
    before = {p.name: p.read_bytes() for p in theirs.iterdir() if p.is_file()}
    before[files.LOCK] = b""  # what the refused run's claim leaves: its lock, released
    refused, _ = run_train([*SMOKE, "--output_dir", str(theirs), *SHORT])
    assert refused.returncode == 1, describe(refused)
    [line] = errors(refused)
    assert f"--output_dir {theirs} holds files this run would replace (config.json, README.md" in line
    assert "--overwrite_output_dir" in line
    assert {p.name: p.read_bytes() if p.name != files.LOCK else b"" for p in theirs.iterdir() if p.is_file()} == before

    same, _ = run_train([*SMOKE, "--model_name_or_path", str(theirs), "--output_dir", str(theirs), *SHORT])
    assert same.returncode == 1 and f"--output_dir {theirs} is the model this run fine-tunes" in same.stderr

    replaced, _ = run_train([*SMOKE, "--output_dir", str(theirs), *SHORT, "--overwrite_output_dir"])
    assert replaced.returncode == 0, describe(replaced)
    assert (theirs / "notes.txt").read_text() == "mine" and not (theirs / "vocab.txt").exists()
    assert (theirs / files.MODEL_CARD).read_text() != "# my model\n" and (theirs / files.WEIGHTS).is_file()


def test_a_run_replacing_a_lora_run_leaves_no_adapter_of_the_old_one(copy_of):
    """A LoRA run's adapter/ goes once a full run saves."""
    (copy_of / files.ADAPTER_DIR).mkdir()
    (copy_of / files.ADAPTER_DIR / files.ADAPTER_CONFIG).write_text("{}")
    run, _ = run_train([*SMOKE, "--output_dir", str(copy_of), *SHORT])
    assert run.returncode == 0, describe(run)
    assert not (copy_of / files.ADAPTER_DIR).exists()
    assert "Removed what the run before left in" in run.stderr and "adapter" in run.stderr


def test_a_full_disk_while_saving_a_state_stops_both_ranks_with_one_line(smoke_dir, tmp_path):
    """2 ranks: the main process's write of state/step_84 fails with ENOSPC after a partial file."""
    out = tmp_path / "out"
    env = fault_env("enospc_in_save_state:84")
    result, _ = run_train([*SMOKE, "--output_dir", str(out), "--checkpointing_steps", "42"], processes=2, env=env)
    assert result.returncode != 0, describe(result)
    [line] = errors(result)
    assert f"could not save {out / files.STATE_DIR}/.tmp_step_84." in line and "no space left on device" in line
    assert "[rank0]: Traceback" not in result.stderr and "[rank1]: Traceback" not in result.stderr
    assert [p.name for p in (out / files.STATE_DIR).iterdir()] == ["step_42"], "the partial state must be removed"
    assert damaged_file(out / files.STATE_DIR / "step_42") is None


def test_a_full_disk_while_saving_the_best_model_keeps_the_previous_one(smoke_dir, tmp_path):
    out = tmp_path / "out"
    args = [*SMOKE, "--output_dir", str(out), "--eval_steps", "84"]  # best models at steps 84 and 168
    result, _ = run_train(args, env=fault_env("enospc_in_save_model:2"))
    assert result.returncode == 1, describe(result)
    [line] = errors(result)
    assert f"could not save {out}: no space left on device" in line
    assert "Traceback" not in result.stderr
    assert not list(out.glob(f".{files.WEIGHTS}.*")), "the partial weights file must be removed"
    weights = torch.load(out / files.WEIGHTS, weights_only=True)  # the first save, whole
    assert weights.keys() == load_file(out / files.HF_WEIGHTS).keys()


def test_a_damaged_latest_state_falls_back_to_the_previous_one_and_the_run_ends_exact(finished, copy_of):
    out = copy_of
    optimizer = out / files.STATE_DIR / "step_168" / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    result, _ = run_train([*SMOKE, "--output_dir", str(out), "--resume_from_checkpoint", "latest"])
    assert result.returncode == 0, describe(result)
    assert f"Not resuming from step_168: {optimizer}" in result.stderr, describe(result)
    assert f"Resumed from {out / files.STATE_DIR / 'step_84'}" in result.stderr
    a = load_file(finished / files.STATE_DIR / "step_168" / "model.safetensors")
    b = load_file(out / files.STATE_DIR / "step_168" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), "resuming from step 84 must end where the run ended"


def test_damaged_states_are_named_and_latest_picks_the_newest_usable_one(copy_of, accelerate_state, caplog):
    states = copy_of / files.STATE_DIR
    (states / "step_168" / files.PROGRESS).write_text("{not json")
    weights = states / "step_84" / "model.safetensors"
    assert damaged_file(states / "step_84") is None
    with caplog.at_level("WARNING"):
        assert pick_state(copy_of, "latest", 1, False) == states / "step_84"
    assert f"{states / 'step_168' / files.PROGRESS} is unreadable" in caplog.text
    weights.write_bytes(weights.read_bytes()[:5000])
    assert damaged_file(states / "step_84")[0] == weights
    with pytest.raises(ResumeError, match="no usable state"):
        pick_state(copy_of, "latest", 1, False)
    with pytest.raises(ResumeError, match=f"cannot resume from {states / 'step_84'}: {weights}"):
        pick_state(copy_of, str(states / "step_84"), 1, False)


class RunsCommand:
    """Unpickling this runs a shell command: what a hostile state folder would carry."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def poison(path: Path, marker: Path) -> None:
    """`path` re-saved (or made) with one extra object that would touch `marker` when unpickled."""
    state = accelerate_load(path) if path.exists() else {}  # weights_only, with numpy's RNG arrays allowed
    state["extra"] = RunsCommand(f"touch {marker}")
    torch.save(state, path)


@pytest.mark.parametrize("name", ["custom_checkpoint_0.pkl", "lr_scheduler.pt", "optimizer.bin", "random_states_0.pkl"])
def test_a_state_file_that_would_run_code_is_refused_naming_it_and_nothing_runs(
    copy_of, accelerate_state, tmp_path, name
):
    states, marker = copy_of / files.STATE_DIR, tmp_path / "ran"
    poison(states / "step_168" / name, marker)
    for spec in ("latest", str(states / "step_168")):  # latest does not fall back to step_84 of a tampered folder
        with pytest.raises(
            ResumeError, match=f"cannot resume from {states / 'step_168'}: {states / 'step_168' / name}"
        ):
            pick_state(copy_of, spec, 1, False)
    assert not marker.exists()


def test_resuming_a_poisoned_state_stops_in_one_line_and_never_runs_its_command(copy_of, tmp_path):
    """The attack as reported: a finished run's state whose schedule was re-saved with an object whose __reduce__
    calls os.system, resumed with `latest`."""
    marker = tmp_path / "ran"
    poison(copy_of / files.STATE_DIR / "step_168" / "lr_scheduler.pt", marker)
    result, _ = run_train([*SMOKE, "--output_dir", str(copy_of), "--resume_from_checkpoint", "latest"])
    assert result.returncode == 1, describe(result)
    [line] = errors(result)
    assert "lr_scheduler.pt: holds more than tensors and numbers (it would import posix.system)" in line
    assert "Traceback" not in result.stderr and not marker.exists()


def test_missing_or_damaged_rng_state_needs_allow_inexact_resume(copy_of, accelerate_state, caplog):
    states = copy_of / files.STATE_DIR
    (states / "step_168" / "random_states_0.pkl").unlink()
    rng_84 = states / "step_84" / "random_states_0.pkl"
    with pytest.raises(ResumeError, match="has no random_states_0.pkl.*pass --allow_inexact_resume"):
        pick_state(copy_of, str(states / "step_168"), 1, False)
    assert pick_state(copy_of, "latest", 1, False) == states / "step_84"  # the newest exact one
    with pytest.raises(ResumeError, match="no usable state"):
        pick_state(copy_of, "latest", 2, False)  # a world of 2 needs random_states_1.pkl as well
    rng_84.write_bytes(rng_84.read_bytes()[:100])
    with pytest.raises(ResumeError, match="no usable state"):
        pick_state(copy_of, "latest", 1, False)
    with caplog.at_level("WARNING"):
        assert pick_state(copy_of, "latest", 1, True) == states / "step_168"
    assert "resuming anyway (--allow_inexact_resume)" in caplog.text


def test_a_resume_without_omp_num_threads_keeps_the_states_threads_and_ends_bitwise(finished, copy_of):
    """A resume keeps the state's thread count."""
    shutil.rmtree(copy_of / files.STATE_DIR / "step_168")
    args = [*SMOKE, "--output_dir", str(copy_of), "--resume_from_checkpoint", "latest"]
    refused, _ = run_train(args, env=cli_env(OMP_NUM_THREADS="2"))
    assert refused.returncode == 1 and "different layout (cpu_threads 1 -> 2)" in errors(refused)[0], describe(refused)
    env = cli_env()
    env.pop("OMP_NUM_THREADS")
    result, _ = run_train(args, env=env)
    assert result.returncode == 0, describe(result)
    a = load_file(finished / files.STATE_DIR / "step_168" / "model.safetensors")
    b = load_file(copy_of / files.STATE_DIR / "step_168" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_different_layout_on_resume_is_refused_with_one_line(copy_of):
    args = [*SMOKE, "--output_dir", str(copy_of), "--resume_from_checkpoint", "latest"]
    result, _ = run_train([*args, "--per_device_train_batch_size", "8"])
    assert result.returncode == 1, describe(result)
    [line] = errors(result)
    assert "was saved with a different layout (per_device_train_batch_size 16 -> 8)" in line
    assert f"--model_name_or_path {copy_of}" in line and "Traceback" not in result.stderr


def replaced_training_file(smoke_dir: Path, folder: Path) -> Path:
    """The smoke training data at another path with twice the rows and every label shifted by one class."""
    lines = (smoke_dir / "train.csv").read_text().splitlines()
    shifted = [f"{line.rpartition(',')[0]},{(int(line.rpartition(',')[2]) + 1) % 4}" for line in lines[1:]]
    path = folder / "train.csv"
    path.write_text("\n".join([lines[0], *shifted, *shifted]) + "\n")
    return path


@pytest.mark.parametrize(
    ("change", "named"),
    [  # each of these changed the weights silently before; one resume names every change it carries
        ("data and settings", ["data.train.bytes", "data.train.sha256", "settings.learning_rate 0.002 -> 0.001"]),
        (  # own data needs a model with weights (the preset's); the model elsewhere is its folder without them
            "model, dropout, evaluation and attention",
            ["settings.model_name_or_path", "settings.fast_dropout true -> false", "settings.eval_steps"]
            + ["settings.attn_implementation", "settings.max_length 64 -> 32"],
        ),
    ],
)
def test_a_resume_with_other_data_model_or_settings_is_refused_naming_each_change(
    copy_of, smoke_dir, tmp_path, change, named
):
    """Before, it continued silently from the state's weights and metrics.json described the run as if it had used
    the last invocation's values throughout."""
    extra = {
        "data and settings": ["--model_name_or_path", str(smoke_dir / "model")]  # the preset's own
        + ["--train_file", str(replaced_training_file(smoke_dir, tmp_path)), "--learning_rate", "1e-3"],
        "model, dropout, evaluation and attention": ["--model_name_or_path"]
        + [str(shutil.copytree(smoke_dir / "model", tmp_path / "same_model_elsewhere")), "--max_length", "32"]
        + ["--fast_dropout", "false", "--eval_steps", "7", "--attn_implementation", "eager"],
    }[change]
    before = (copy_of / files.WEIGHTS).read_bytes()
    result, _ = run_train([*SMOKE, "--output_dir", str(copy_of), "--resume_from_checkpoint", "latest", *extra])
    assert result.returncode == 1, describe(result)
    [line] = errors(result)
    assert f"{copy_of / files.STATE_DIR / 'step_168'} was saved by a run with other data or settings" in line
    assert [name for name in named if name not in line] == [] and "--allow_inexact_resume" in line, line
    assert "Traceback" not in result.stderr and (copy_of / files.WEIGHTS).read_bytes() == before


def test_a_flag_added_to_the_configuration_is_compared_at_resume_unless_declared_free_to_change():
    class WithANewFlag(TrainConfig):
        a_new_flag: int = 0

    assert "a_new_flag" in provenance.result_settings(WithANewFlag)
    assert set(provenance.result_settings(WithANewFlag)) - set(provenance.RESULT_SETTINGS) == {"a_new_flag"}
    assert not set(provenance.RESULT_SETTINGS) & set(provenance.MAY_CHANGE)
    assert {"fast_dropout", "eval_steps", "attn_implementation", "torch_compile", "seed"} <= set(
        provenance.RESULT_SETTINGS
    )


def test_an_inexact_resume_goes_on_with_a_warning_and_metrics_json_records_both_values(copy_of):
    state = copy_of / files.STATE_DIR / "step_84"
    args = [*SMOKE, "--output_dir", str(copy_of), "--resume_from_checkpoint", str(state), "--max_length", "32"]
    result, _ = run_train([*args, "--allow_inexact_resume"])
    assert result.returncode == 0, describe(result)
    warning = [line for line in result.stderr.splitlines() if "WARNING" in line and "allow_inexact_resume" in line]
    assert len(warning) == 1 and f"Resuming from {state} although settings.max_length 64 -> 32" in warning[0]
    metrics = json.loads((copy_of / files.METRICS).read_text())
    assert metrics["inexact_resumes"] == [{"step": 84, "changed": {"settings.max_length": {"saved": 64, "now": 32}}}]
    assert metrics["provenance"]["settings"]["max_length"] == 32 == metrics["config"]["max_length"]
    progress = json.loads((copy_of / files.STATE_DIR / "step_168" / files.PROGRESS).read_text())
    assert progress["inexact_resumes"] == metrics["inexact_resumes"]  # a later resume keeps the record


def test_on_two_ranks_the_main_process_picks_the_state_and_every_rank_stops_on_its_refusal(copy_of):
    """The main process alone reads the candidate states whole and broadcasts its choice: here 1-process states
    have no random_states_1.pkl, so it refuses, and rank 1 stops on the same line instead of waiting for it."""
    args = [*SMOKE, "--output_dir", str(copy_of), "--resume_from_checkpoint", "latest"]
    result, _ = run_train(args, processes=2, timeout=180)
    assert result.returncode == 1, describe(result)
    [line] = errors(result)
    assert "no usable state under" in line, describe(result)
    assert result.stderr.count("has no random_states_1.pkl") == 2, describe(result)  # step_168, then step_84
    assert "[rank0]: Traceback" not in result.stderr and "[rank1]: Traceback" not in result.stderr


def test_what_training_writes_is_readable_by_another_user(smoke_model):
    """Every checkpoint file is readable by the service's other user."""
    from training.output.atomic import UMASK

    assert UMASK & 0o044 == 0, "this check needs a umask that lets others read (e.g. 022)"

    def others_may_read(path: Path) -> bool:
        wanted = 0o055 if path.is_dir() else 0o044  # folders: read and enter; files: read
        return path.stat().st_mode & wanted == wanted

    served = [p for p in smoke_model.rglob("*") if files.STATE_DIR not in p.relative_to(smoke_model).parts]
    private = [str(p.relative_to(smoke_model)) for p in [smoke_model, *served] if not others_may_read(p)]
    assert private == []  # resume states (state/) are the run's own: only what is served must be readable


def test_a_checkpoint_this_user_cannot_read_is_one_line(checkpoint_copy, monkeypatch):
    from contract.errors import CheckpointError
    from contract.loading import load_model

    real = Path.read_bytes

    def read_bytes(path):  # what a file of another user's, mode 0600, does to a non-root reader
        if path.name == files.WEIGHTS:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(CheckpointError) as refused:
        load_model(str(checkpoint_copy))
    assert str(refused.value) == (
        f"{checkpoint_copy / files.WEIGHTS}: cannot be read by this user (uid {os.getuid()}): Permission denied"
    )
