"""The clients' environment, made from docs/serving.md's install line alone: `python -m tests.helpers.clients_env DIR`
(.ci/run) makes a virtual environment in DIR and runs that line's pip install in it; tests/test_docs.py runs the
page's client blocks with DIR/bin/python (CLIENTS_ONLY_PYTHON)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers.docs import block


def install_line() -> list[str]:
    """What the documented line installs: pip install's arguments."""
    words = shlex.split(block("docs/serving.md", "tritonclient[http]").code, comments=True)
    assert words[:2] == ["pip", "install"] and len(words) > 2, words
    return words[2:]


def build(folder: Path) -> Path:
    """The environment in `folder`; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, stdout=sys.stderr)  # stdout: the path
    python = folder / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--retries", "1"]
    subprocess.run([*pip, *install_line()], check=True, stdout=sys.stderr)
    return python


if __name__ == "__main__":
    sys.stdout.write(f"{build(Path(sys.argv[1]))}\n")
