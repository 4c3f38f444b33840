"""One-process runs forked from an interpreter that has already imported torch, transformers and training/.

Every run is still its own process (its own pid, environment, working folder, output and exit status), started as
Python's forkserver starts its children: only the interpreter's start-up and the library imports (seconds a run) are
shared. processes.launch uses it for runs in the plain test environment (cli_env()); anything else starts cold.
The warm interpreter is started with that same environment, so what libraries read at import matches a cold start.

    python -m tests.helpers.warm    # the warm interpreter: one JSON request a line on stdin, answers on stdout
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

IGNORED = ("PYTEST_CURRENT_TEST",)  # changes with every test; set in each run's environment all the same
# Never a module a run executes as main. The last two every training run imports lazily: transformers.get_scheduler's
# module (it imports peft through trainer_utils) and the curves' figure.
PRELOADED = (
    "training.train",
    "training.scoring.split",
    "contract.loading",
    "transformers.optimization",
    "matplotlib.figure",
)


def _same(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in IGNORED))


class Warm:
    """The warm interpreter for one environment; `run` one request at a time."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self.key = _same(env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.warm"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,  # unbuffered: a read takes one answer, never the next one select() would then wait for
        )
        self.lock = threading.Lock()

    def _answer(self, timeout: float | None) -> dict | None:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else b""
        if ready and not line:
            raise RuntimeError(f"the warm interpreter ended (exit {self.process.wait()})")
        return json.loads(line) if line else None

    def run(self, command: list[str], target: list[str], env: dict, cwd: Path, timeout: float):
        with self.lock, tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = {"target": target, "env": env, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            pid = self._answer(30)["pid"]
            done = self._answer(timeout)
            if done is None:
                with contextlib.suppress(ProcessLookupError):  # it may have ended since
                    os.kill(pid, signal.SIGKILL)
                self._answer(30)
                raise subprocess.TimeoutExpired(command, timeout, out.read_text(), err.read_text())
            return subprocess.CompletedProcess(command, done["code"], out.read_text(), err.read_text())

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(30)


_current: Warm | None = None


@atexit.register
def _stop() -> None:
    if _current is not None:
        _current.stop()


def run(command: list[str], target: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """`command` (python and `target`) run in a process forked from the warm interpreter of `env`."""
    global _current
    if _current is None or _current.key != _same(env):
        _stop()
        _current = Warm(env, cwd)
    return _current.run(command, target, env, cwd, timeout)


# ------------------------------------------------------------------------------------------- the warm side


def _child(request: dict) -> None:
    """In the forked process: become `python TARGET...` with the request's environment, folder and output."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's own stdin until it exits
        target = request["target"]
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(target)
            sys.path[0] = str(Path(target[0]).resolve().parent)  # as `python SCRIPT` puts it
            runpy.run_path(target[0], run_name="__main__")
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    answers = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        answers.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve()
