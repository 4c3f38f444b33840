"""`python -m inference.export`: each refusal is one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.processes import ROOT, cli_env, describe


def export(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "inference.export", *args]
    return subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)


def test_a_folder_that_cannot_be_served_is_one_line_and_exit_1(tmp_path):
    result = export(str(tmp_path / "missing"), "--runtime", "openvino")
    assert result.returncode == 1, describe(result)
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "missing" in errors[0] and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("runtime", ["tensorrt", ""])
def test_an_unknown_runtime_is_a_usage_error(tmp_path, runtime):
    result = export(str(tmp_path), "--runtime", runtime)
    assert result.returncode == 2 and "invalid choice" in result.stderr, describe(result)
