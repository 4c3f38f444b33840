"""The Kaggle notebook, run whole in its offline smoke mode."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import psutil
import pytest

from contract import files
from tests.helpers.docs import block
from tests.helpers.processes import ROOT, cli_env

NOTEBOOK = ROOT / "notebooks" / "kaggle_agnews.ipynb"


# nbformat's warnings about the file (a cell without an id: a hard error in future versions) fail the test; not the
# garbage collection of another test's leftovers that may happen to run meanwhile on this worker
@pytest.mark.filterwarnings("error::nbformat.warnings.MissingIDFieldWarning", "error::DeprecationWarning")
def test_the_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom_off_kaggle_as_documented(smoke_dir, tmp_path):
    """`python scripts/run_notebook.py`, as the notebook's first cell says, on this machine without a GPU: the smoke
    mode chosen for it, each cell's output printed as it ends, the executed copy saved; no warning in any output."""
    output_dir = tmp_path / "checkpoints"
    # BACKEND=torch: what BACKEND=auto serves on Kaggle's GPUs; on this CPU auto would first race the optimized
    # runtimes (tested in tests/inference/runtimes/test_runtimes.py), which only costs time here.
    env = cli_env(AGNEWS_NOTEBOOK_OUTPUT=str(output_dir), BACKEND="torch")
    env.pop("AGNEWS_NOTEBOOK_SMOKE", None)
    executed = tmp_path / "executed.ipynb"
    documented = block("docs/launching.md", "run_notebook.py").code.split()
    assert documented == ["python", "scripts/run_notebook.py"], documented
    command = [sys.executable, str(ROOT / documented[1]), "--output", str(executed)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    finally:
        leftover_services(str(output_dir))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    text = done.stdout
    assert "No GPU here: the offline smoke preset" in text and "smoke=True" in text
    assert "all-reduce OK: 2 process(es)" in text  # check_env
    metrics = json.loads((output_dir / files.METRICS).read_text())
    assert metrics["world_size"] == 2 and metrics["test"]["accuracy"] >= 0.95  # accelerate launch, as README's run
    assert (tmp_path / "checkpoints_notebook_launcher" / files.WEIGHTS).is_file()  # notebook_launcher
    assert json.loads((output_dir / files.EVAL_RESULTS).read_text())["world_size"] == 2
    assert "service ready on http://127.0.0.1:" in text
    answers = [line for line in text.splitlines() if line.startswith("/predict -> ")]
    assert len(answers) == 2, text[-3000:]
    assert all(line.split()[2] in {"World", "Sports", "Business", "Sci/Tech"} for line in answers)
    assert "Warning" not in text and "never:" not in text, [line for line in text.splitlines() if "arning" in line]
    saved = nbformat.read(executed, as_version=4)
    assert all(c.execution_count for c in saved.cells if c.cell_type == "code")


def leftover_services(output_dir: str) -> None:
    """Kill a service the notebook started if a failing cell left it running."""
    for process in psutil.process_iter(["cmdline"]):
        if output_dir in " ".join(process.info["cmdline"] or []) and "inference" in process.info["cmdline"]:
            process.kill()
