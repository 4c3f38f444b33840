"""The Kaggle notebook, run whole in its offline smoke mode."""

from __future__ import annotations

import json

import nbformat
import psutil
import pytest

from contract import files
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
def test_the_notebook_runs_top_to_bottom_in_smoke_mode(smoke_dir, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    output_dir = tmp_path / "checkpoints"
    # BACKEND=torch: what BACKEND=auto serves on Kaggle's GPUs; on this CPU auto would first race the optimized
    # runtimes (tested in tests/inference/runtimes/test_runtimes.py), which only costs time here.
    env = cli_env(AGNEWS_NOTEBOOK_SMOKE="1", AGNEWS_NOTEBOOK_OUTPUT=str(output_dir), BACKEND="torch")
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the kernel, and every process it starts, inherits these
    nb = nbformat.read(NOTEBOOK, as_version=4)
    try:
        NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(tmp_path)}},
        ).execute(cwd=str(ROOT / "notebooks"))  # opened where it lives: it finds the project above (no clone)
    finally:
        leftover_services(str(output_dir))
    text = "\n".join(out.get("text", "") for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert "all-reduce OK: 2 process(es)" in text  # check_env
    assert json.loads((output_dir / files.METRICS).read_text())["world_size"] == 2  # accelerate launch
    assert (tmp_path / "checkpoints_notebook_launcher" / files.WEIGHTS).is_file()  # notebook_launcher
    assert json.loads((output_dir / files.EVAL_RESULTS).read_text())["world_size"] == 2
    assert "service ready on http://127.0.0.1:" in text
    answers = [line for line in text.splitlines() if line.startswith("/predict -> ")]
    assert len(answers) == 2, text[-3000:]
    assert all(line.split()[2] in {"World", "Sports", "Business", "Sci/Tech"} for line in answers)


def leftover_services(output_dir: str) -> None:
    """Kill a service the notebook started if a failing cell left it running."""
    for process in psutil.process_iter(["cmdline"]):
        if output_dir in " ".join(process.info["cmdline"] or []) and "inference" in process.info["cmdline"]:
            process.kill()
