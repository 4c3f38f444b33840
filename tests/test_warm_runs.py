"""A run forked from the warm interpreter (tests/helpers/warm.py) behaves as `python SCRIPT` started cold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import warm
from tests.helpers.processes import ROOT, cli_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the warm start forks: Linux only")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("MARK"),
                      "main": __name__, "torch": "torch" in sys.modules, "stdin": sys.stdin.read()}))
    print("on stderr", file=sys.stderr)
    code = sys.argv[1]
    if code == "raise":
        raise ValueError("uncaught")
    if code == "kill":
        os.kill(os.getpid(), 9)
    sys.exit(code if not code.isdigit() else int(code))
    """
)


def run(tmp_path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**cli_env(), "MARK": "this run's"}
    return warm.run([sys.executable, str(script), *args], [str(script), *args], env, ROOT, timeout)


def test_a_run_has_its_own_process_environment_folder_and_output(tmp_path):
    result = run(tmp_path, "0", "more")
    said = json.loads(result.stdout)
    assert result.returncode == 0 and result.stderr == "on stderr\n"
    assert said["pid"] != os.getpid() and said["argv"] == ["0", "more"] and said["cwd"] == str(ROOT)
    assert said["env"] == "this run's" and said["main"] == "__main__" and said["stdin"] == ""
    assert said["torch"]  # imported before the fork: what the warm start saves
    again = json.loads(run(tmp_path, "0").stdout)
    assert again["pid"] != said["pid"]


@pytest.mark.parametrize(
    ("arg", "code", "said"),
    [("3", 3, ""), ("a message", 1, "a message"), ("raise", 1, "ValueError: uncaught"), ("kill", -9, "")],
)
def test_the_exit_status_is_the_interpreters(tmp_path, arg, code, said):
    result = run(tmp_path, arg)
    assert result.returncode == code and said in result.stderr, result


def test_a_run_past_its_timeout_is_killed_and_the_next_one_runs(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, str(script)], [str(script)], cli_env(), ROOT, 1)
    assert run(tmp_path, "0").returncode == 0
