"""The intra-op threads a CPU command runs with (cpu_speed.choose_threads)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from training.speed import cpu_speed


@pytest.fixture
def threads():
    """torch's thread count as the test found it, put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)  # the default the policy shares out, whatever this machine has
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "busy, processes, expected",
    [(0.0, 1, 4), (0.0, 2, 2), (0.25, 1, 3), (0.5, 1, 2), (0.5, 2, 2), (1.0, 1, 1), (0.9, 4, 1)],
)
def test_threads_are_the_default_shared_out_less_the_busy_cores(threads, monkeypatch, busy, processes, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_speed, "busy_share", lambda: busy)
    cpu_speed.choose_threads(processes)
    assert torch.get_num_threads() == expected


def test_omp_num_threads_is_the_users_choice(threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setattr(cpu_speed, "busy_share", lambda: 1.0)
    cpu_speed.choose_threads(1)
    assert torch.get_num_threads() == 4


def test_a_busy_core_is_seen_as_busy():
    """A child spinning on one core: at least that core's share of this process's cores is counted busy."""
    cores = len(cpu_speed.os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        assert cpu_speed.busy_share() >= 0.8 / cores
    finally:
        spinner.kill()
        spinner.wait()


def test_a_resume_keeps_the_threads_its_state_was_saved_with(threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    current = {"num_processes": 1, "cpu_threads": 4}
    cpu_speed.keep_saved_threads({"num_processes": 1, "cpu_threads": 1}, current)
    assert torch.get_num_threads() == 1 and current["cpu_threads"] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stays; the layout check then names the change
    current = {"cpu_threads": 3}
    cpu_speed.keep_saved_threads({"cpu_threads": 1}, current)
    assert current["cpu_threads"] == 3
