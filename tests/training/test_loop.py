"""The loop's decisions as plain functions: no process group, no model, milliseconds each."""

from __future__ import annotations

import pytest

from training.config_parsing import load_config
from training.loop import (
    evaluated_now,
    every,
    finish_epoch,
    improved,
    patience_spent,
    plan_step,
    record_evaluation,
    save_interval,
)
from training.output.progress import Progress


def test_every_fires_on_multiples_and_never_without_an_interval():
    assert [s for s in range(1, 13) if every(s, 4)] == [4, 8, 12]
    assert not any(every(s, None) for s in range(1, 10))
    assert not any(every(s, 0) for s in range(1, 10))


@pytest.mark.parametrize("value, interval", [("epoch", None), ("none", None), ("25", 25)])
def test_save_interval_reads_checkpointing_steps(value, interval):
    assert save_interval(value) == interval


def test_plan_logs_evaluates_saves_and_checks_for_a_stop_on_their_own_schedules():
    cfg = load_config(
        ["--logging_steps", "5", "--eval_steps", "10", "--checkpointing_steps", "15", "--stop_check_steps", "7"]
    )
    plans = {
        step: plan_step(cfg, step, batches_done=step, batches_per_epoch=100, total_steps=200) for step in range(1, 31)
    }
    assert [s for s, p in plans.items() if p.log] == [5, 10, 15, 20, 25, 30]
    last = plan_step(cfg, 33, batches_done=33, batches_per_epoch=100, total_steps=33)
    assert last.log  # off the logging schedule, the run's last step is logged: its curves reach the end
    assert [s for s, p in plans.items() if p.evaluate] == [10, 20, 30]
    assert [s for s, p in plans.items() if p.save] == [15, 30]
    # the ranks agree on a stop before every evaluation or save, and every stop_check_steps steps
    assert [s for s, p in plans.items() if p.check_stop] == [7, 10, 14, 15, 20, 21, 28, 30]


def test_the_ranks_check_for_a_stop_at_the_end_of_an_epoch_and_at_the_last_step():
    cfg = load_config(["--stop_check_steps", "1000"])
    assert plan_step(cfg, 3, batches_done=84, batches_per_epoch=84, total_steps=500).check_stop
    assert plan_step(cfg, 500, batches_done=10, batches_per_epoch=84, total_steps=500).check_stop
    assert not plan_step(cfg, 3, batches_done=83, batches_per_epoch=84, total_steps=500).check_stop


def test_with_checkpointing_per_epoch_no_step_plans_a_save():
    cfg = load_config(["--checkpointing_steps", "epoch"])
    assert not any(plan_step(cfg, s, s, 100, 100).save for s in range(1, 101))


def test_at_an_epoch_end_the_plan_evaluates_unless_just_done_and_saves_a_completed_epoch():
    per_epoch = load_config(["--checkpointing_steps", "epoch"])
    end = plan_step(per_epoch, 84, 84, 84, 500, epoch_end=True)
    assert (end.log, end.evaluate, end.save, end.check_stop) == (False, True, True, False)
    assert not plan_step(per_epoch, 84, 84, 84, 500, epoch_end=True, evaluated=True).evaluate
    assert not plan_step(per_epoch, 50, 50, 84, 50, epoch_end=True).save  # stopped mid-epoch: nothing to resume
    assert not plan_step(load_config(["--checkpointing_steps", "10"]), 84, 84, 84, 500, epoch_end=True).save


def test_improved_is_strictly_better_and_anything_beats_no_best():
    assert improved(0.5, None) and improved(0.51, 0.5)
    assert not improved(0.5, 0.5) and not improved(0.4, 0.5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_evaluation_is_never_an_improvement(bad):
    assert not improved(bad, None) and not improved(bad, None, greater_is_better=False)
    assert not improved(bad, 0.5) and not improved(bad, 0.5, greater_is_better=False)
    progress = Progress(global_step=22, epoch=0)
    assert not record_evaluation(progress, {"mse": bad}, "mse", greater_is_better=False)
    assert (progress.best_step, progress.best_metric, progress.evals_since_best) == (None, None, 1)


def test_record_evaluation_keeps_the_best_and_counts_evaluations_since():
    progress = Progress(global_step=10, epoch=0)
    assert record_evaluation(progress, {"accuracy": 0.6, "loss": 1.0}, "accuracy")
    progress.global_step = 20
    # a tie keeps the later model (the README's smoke run: 0.98 at steps 168, 336 and 504 keeps 504), but counts
    # towards the patience like any evaluation that did not improve
    assert record_evaluation(progress, {"accuracy": 0.6, "loss": 0.9}, "accuracy")
    progress.global_step, progress.epoch = 30, 1
    assert not record_evaluation(progress, {"accuracy": 0.5, "loss": 0.8}, "accuracy")
    assert (progress.best_metric, progress.best_step, progress.evals_since_best) == (0.6, 20, 2)
    assert progress.best_validation == {"accuracy": 0.6, "loss": 0.9}
    assert [(h["step"], h["epoch"]) for h in progress.history] == [(10, 0), (20, 0), (30, 1)]
    progress.global_step = 40
    assert record_evaluation(progress, {"accuracy": 0.7, "loss": 0.7}, "accuracy")
    assert (progress.best_step, progress.evals_since_best) == (40, 0)


def test_patience_is_spent_after_that_many_evaluations_without_improvement():
    assert not patience_spent(5, None) and not patience_spent(1, 2)
    assert patience_spent(2, 2) and patience_spent(3, 2)


def test_evaluated_now_looks_at_the_last_evaluation():
    progress = Progress(global_step=84)
    assert not evaluated_now(progress)
    progress.history.append({"step": 80})
    assert not evaluated_now(progress)
    progress.history.append({"step": 84})
    assert evaluated_now(progress)


def test_finish_epoch_advances_only_a_finished_epoch():
    progress = Progress(epoch=1, batches_done=84)
    assert finish_epoch(progress, 1, batches_per_epoch=84)
    assert (progress.epoch, progress.batches_done) == (2, 0)
    stopped = Progress(epoch=1, batches_done=40)
    assert not finish_epoch(stopped, 1, batches_per_epoch=84)
    assert (stopped.epoch, stopped.batches_done) == (1, 40)


def test_a_short_run_logs_often_enough_for_its_curves_to_be_lines():
    """A 20-step run logged only its last step with the default --logging_steps 50: one dot per curve."""
    cfg = load_config([])
    logged = [s for s in range(1, 21) if plan_step(cfg, s, s, 100, total_steps=20).log]
    assert logged == [4, 8, 12, 16, 20]
    long_run = [s for s in range(1, 1001) if plan_step(cfg, s, s, 2000, total_steps=1000).log]
    assert long_run == list(range(50, 1001, 50))  # the default interval where it gives enough points
