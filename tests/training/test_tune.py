"""`agnews tune` on the smoke preset, as users run it."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.docs import block
from tests.helpers.processes import ROOT, cli_env, describe, fault_env, launch

pytest.importorskip("optuna", reason="pip install 'distilbert-agnews[tune]' (dev extra)")
pytestmark = pytest.mark.slow


def tune(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "training.commands", "tune", "--preset", "smoke", *args]
    return subprocess.run(command, cwd=ROOT, env=env or cli_env(), capture_output=True, text=True, timeout=600)


def test_four_trials_find_at_least_the_given_settings_and_a_fifth_resumes_the_study(smoke_dir, tmp_path):
    """docs/launching.md's command, as written but for its output folder."""
    out = tmp_path / "search"
    words = shlex.split(block("docs/launching.md", "--output_dir tuned ").code, comments=True)
    assert words[:4] == ["agnews", "tune", "--preset", "smoke"] and words[-2] == "--output_dir", words
    result = tune(*words[4:-1], str(out))
    assert result.returncode == 0, describe(result)
    said = json.loads((out / "tune.json").read_text())
    trials, best = said["trials"], said["best"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    says_the_search_in_a_line_per_trial(result.stderr, trials, out / "trials" / f"trial_{best['number']}")
    assert trials[0]["params"]["learning_rate"] == 2e-3 and trials[0]["state"] == "complete"  # the preset's
    finished = [t["value"] for t in trials if t["state"] == "complete"]
    assert best["value"] == max(finished) >= trials[0]["value"] and best["metric"] == "accuracy"
    assert sorted(p.name for p in (out / "trials").iterdir()) == [f"trial_{best['number']}"]
    assert (out / "trials" / f"trial_{best['number']}" / "metrics.json").is_file()
    assert said["command"].startswith("agnews train --preset smoke --learning_rate=")
    assert said["command"].endswith(f"--output_dir {out / 'best'}") and "--n_trials" not in said["command"]

    again = tune("--n_trials", "5", "--output_dir", str(out))
    assert again.returncode == 0, describe(again)
    resumed = json.loads((out / "tune.json").read_text())["trials"]
    assert len(resumed) == 5 and resumed[:4] == trials  # the study went on; the first four untouched
    assert resumed[4]["params"] not in [t["params"] for t in trials]  # new settings, not the first draws again


def says_the_search_in_a_line_per_trial(log: str, trials: list[dict], kept: Path) -> None:
    """One line per trial (its counter, how it ended), no trial's own closing lines, and one closing line whose
    commands name the one folder kept."""
    lines = [line for line in log.splitlines() if " INFO " in line or " WARNING " in line]
    counted = [line.split("INFO ")[1].split(": ", 1)[1] for line in lines if ": Trial " in line]
    assert [line.split(":")[0] for line in counted] == [f"Trial {k}/4" for k in range(1, 5)], lines
    for line, trial in zip(counted, trials):
        assert ("pruned at step " in line) == (trial["state"] == "pruned"), (line, trial)
        assert "elapsed " in line and (" left" in line), line
        assert (trial["test"] is None) == (trial["state"] == "pruned"), trial  # a pruned trial is not tested
    assert any(t["state"] == "pruned" for t in trials), "the docs' search prunes no trial: pick another --tune_seed"
    assert "Done:" not in log and "Validation at step" not in log and "Calibration:" not in log, log
    closing = [line for line in lines if "Evaluate it:" in line]
    assert len(closing) == 1 and "Best trial" in closing[0], lines
    named = {Path(word.rstrip(".")) for word in closing[0].split() if "/trials/" in word}
    assert named and all(path == kept or path.parent == kept for path in named), closing
    assert kept.is_dir() and (kept / "model.safetensors").is_file()


def test_a_search_space_file_and_its_mistakes(smoke_dir, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}\n")
    result = tune("--n_trials", "2", "--max_train_steps", "20", "--search_space", str(space), "--output_dir",
                  str(tmp_path / "a"))  # fmt: skip
    assert result.returncode == 0, describe(result)
    trials = json.loads((tmp_path / "a" / "tune.json").read_text())["trials"]
    assert all(set(t["params"]) == {"learning_rate"} for t in trials)
    space.write_text("learning_rates: {type: float, low: 1.0e-4, high: 3.0e-3}\n")
    wrong = tune("--n_trials", "2", "--search_space", str(space), "--output_dir", str(tmp_path / "b"))
    assert wrong.returncode == 2 and "search_space" in wrong.stderr and "learning_rates" in wrong.stderr


def test_a_run_stops_at_the_evaluation_its_hook_says_to(smoke_dir, tmp_path):
    from accelerate.state import AcceleratorState

    from training import train
    from training.config_parsing import load_config
    from training.run import Outcome, Search

    cfg = load_config(["--preset", "smoke", "--eval_steps", "10", "--output_dir", str(tmp_path / "run")])
    seen = []
    try:
        search = Search("Trial 1/1", lambda step, _: seen.append(step) or True)
        ended = train.main(cfg, train.make_accelerator(cfg), search)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)  # the next test file's Accelerator starts afresh
    assert seen == [10] and ended.outcome is Outcome.PRUNED and ended.summary["global_step"] == 10
    assert ended.summary["test"] is None and "calibration" not in ended.summary  # a pruned run is not finished


def test_under_accelerate_launch_each_trial_runs_on_both_processes(smoke_dir, tmp_path):
    """`accelerate launch -m training.tune` with 2 processes (gloo): the main process holds the study and every trial
    trains with DDP on both, their settings and pruning decisions shared; one tune.json, written once."""
    out = tmp_path / "search"
    args = ["--preset", "smoke", "--n_trials", "2", "--num_samples", "400", "--num_train_epochs", "1"]
    result, _ = launch(["-m", "training.tune", *args, "--output_dir", str(out)], processes=2)
    assert result.returncode == 0, describe(result)
    said = json.loads((out / "tune.json").read_text())
    assert [(t["number"], t["state"]) for t in said["trials"]] == [(0, "complete"), (1, "complete")]
    assert said["trials"][0]["params"]["learning_rate"] == 2e-3  # the preset's settings first
    best = json.loads((out / "trials" / f"trial_{said['best']['number']}" / "metrics.json").read_text())
    assert best["world_size"] == 2 and best["validation"]["accuracy"] == said["best"]["value"]
    assert result.stdout.count("Best trial") + result.stderr.count("Best trial") == 1


def test_on_ray_trials_run_side_by_side_and_one_out_of_memory_fails_alone(smoke_dir, tmp_path):
    """docs/launching.md's --ray flags: two trials at a time overlap; a batch that does not fit (injected) fails
    that trial only. (The study and its resume are the local search's: tested above.)"""
    pytest.importorskip("ray", reason="pip install 'distilbert-agnews[ray]' (in the dev extra)")
    import optuna

    space, out = tmp_path / "space.yaml", tmp_path / "search"
    space.write_text(
        "learning_rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}\n"
        "per_device_train_batch_size: {type: categorical, choices: [16, 64]}\n"
    )
    words = shlex.split(block("docs/launching.md", "--ray").code)  # its flags, with this test's space and steps
    assert words[words.index("--ray") : words.index("--output_dir")] == ["--ray", "--max_concurrent_trials", "2"]
    flags = [*words[words.index("--ray") : words.index("--output_dir")], "--max_train_steps", "20"]
    flags += ["--search_space", str(space)]
    env = fault_env("oom_above_rows:32")  # a training batch of 64 is out of memory, 16 fits
    result = tune("--n_trials", "3", *flags, "--output_dir", str(out), env=env)
    assert result.returncode == 0, describe(result)
    said = json.loads((out / "tune.json").read_text())
    trials = said["trials"]
    states = {t["params"]["per_device_train_batch_size"]: t["state"] for t in trials}
    assert states == {16: "complete", 64: "fail"}, "both sizes drawn, 64 failed: else pick another --tune_seed"
    assert "failed (RuntimeError: " in result.stderr and "Trials: 2 at a time" in result.stderr, result.stderr
    first, second = optuna.load_study(study_name="agnews-tune", storage=f"sqlite:///{out / 'tune.db'}").trials[:2]
    assert first.datetime_start < second.datetime_complete and second.datetime_start < first.datetime_complete
    assert sorted(p.name for p in (out / "trials").iterdir()) == [f"trial_{said['best']['number']}"]
    assert "--ray" not in said["command"] and "--max_concurrent_trials" not in said["command"], said["command"]


@pytest.mark.parametrize(
    ("flags", "world_size", "said"),
    [
        (["--max_concurrent_trials", "2"], "1", "--max_concurrent_trials places trials on Ray: add --ray"),
        (["--ray", "--trial_gpus", "2"], "1", "--trial_gpus from 0 to 1"),
        (["--ray", "--max_concurrent_trials", "0"], "1", "--max_concurrent_trials at least 1"),
        (["--ray"], "2", "not under accelerate launch"),
    ],
)
def test_ray_flags_a_search_cannot_run_are_refused_in_one_line(smoke_dir, tmp_path, flags, world_size, said):
    pytest.importorskip("ray", reason="pip install 'distilbert-agnews[ray]' (in the dev extra)")
    result = tune(*flags, "--output_dir", str(tmp_path / "s"), env=cli_env(WORLD_SIZE=world_size))
    assert result.returncode == 2 and said in result.stderr, describe(result)
    assert "Traceback" not in result.stderr and not (tmp_path / "s" / "trials").exists()


def test_a_trial_the_ray_cluster_cannot_hold_is_refused_and_the_width_is_what_it_holds(monkeypatch):
    """Before any trial starts (Ray would leave it pending forever), from the cluster's resources."""
    pytest.importorskip("ray", reason="pip install 'distilbert-agnews[ray]' (in the dev extra)")
    from contract.errors import UsageError
    from training.search import ray_trials

    def asked(resources: dict, **flags) -> tuple[float, int]:
        monkeypatch.setattr(ray_trials.ray, "cluster_resources", lambda: resources)
        given = {"trial_cpus": 1.0, "trial_gpus": None, "max_concurrent_trials": None, "n_trials": 20, **flags}
        return ray_trials.placement(argparse.Namespace(**given))

    with pytest.raises(UsageError, match=r"a trial asks 1 CPU\(s\) and 1 GPU\(s\); the Ray cluster has 2 and 0"):
        asked({"CPU": 2.0}, trial_gpus=1.0)
    assert asked({"CPU": 2.0}) == (0.0, 2)  # CPU trials: one per CPU
    assert asked({"CPU": 16.0, "GPU": 2.0}) == (1.0, 2)  # a GPU each where there are GPUs: a Kaggle 2xT4
    assert asked({"CPU": 16.0, "GPU": 2.0}, trial_gpus=0.5, n_trials=3) == (0.5, 3)
    assert asked({"CPU": 16.0}, trial_cpus=4.0, max_concurrent_trials=3) == (0.0, 3)
