"""Started by torchrun with 2 processes on a CPU machine: a plain Accelerator() sees a world of 1 there.

Exits 3 when train.py's guard refuses that setup (what the test expects), 0 if it wrongly lets it pass.
"""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

from accelerate import Accelerator  # noqa: E402

from training.guards import LaunchError, check_world_size  # noqa: E402

try:
    check_world_size(Accelerator())
except LaunchError as exc:
    sys.stderr.write(f"refused: {exc}\n")
    sys.exit(3)
sys.exit(0)
