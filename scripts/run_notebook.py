"""Run the Kaggle notebook off Kaggle, cell by cell, printing each cell's output as it ends: `python
scripts/run_notebook.py` (without a GPU the notebook runs its offline smoke mode). The executed copy is saved beside it
as notebooks/kaggle_agnews.out.ipynb; exit 1 at the first failing cell, with its error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "kaggle_agnews.ipynb"


def show(cell, cell_index: int, **_) -> None:
    """One executed cell's source head and outputs, as Jupyter would show them."""
    if cell.cell_type != "code":
        return
    sys.stdout.write(f"\n[{cell_index}] {cell.source.splitlines()[0] if cell.source else ''}\n")
    for output in cell.outputs:
        text = output.get("text") or output.get("data", {}).get("text/plain", "")
        if output.get("output_type") == "error":
            text = "\n".join(output.get("traceback", [])) or f"{output.get('ename')}: {output.get('evalue')}"
        sys.stdout.write(text if text.endswith("\n") else f"{text}\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a cell may run")
    parser.add_argument("--output", type=Path, help="where to save the executed copy (default: beside it, .out.ipynb)")
    args = parser.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3", on_cell_executed=show)
    saved = args.output or args.notebook.with_suffix(".out.ipynb")
    try:
        client.execute(cwd=str(args.notebook.parent))
    except CellExecutionError:
        return 1  # the cell's error is printed above
    finally:
        nbformat.write(nb, saved)
        sys.stdout.write(f"\nThe executed notebook: {saved}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
