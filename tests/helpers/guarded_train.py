"""train.py with every training step watched for host-device syncs: `python guarded_train.py REPORT.json ARGS...`.

A step runs from `forward_loss` (then backward, clipping, the optimizer) through the schedule's step up to
`plan_step` (the window training/loop.py documents), where the loop decides whether this step logs, evaluates or
checks for a stop (those may read the device). Inside that window a TorchDispatchMode records every op that copies a
device value to the host (`aten._local_scalar_dense`: `.item()`, `float(t)`, `if t:`; `aten.is_nonzero`), with the
step and a short stack. On CPU nothing blocks, but the same call on a GPU would wait for every queued kernel: this
is the CPU proof that a step does not synchronise. The report also counts the ops seen, so an empty report cannot
come from a guard that never ran.
"""

import json
import sys
import traceback
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from training import loop, train  # noqa: E402

SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}


class SyncRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.syncs: list[dict] = []
        self.step = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if func in SYNCS:
            frames = [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()[-9:-1]]
            self.syncs.append({"op": str(func), "step": self.step, "stack": frames})
        return func(*args, **(kwargs or {}))


recorder = SyncRecorder()
watching = False


def watch(original):
    def step(run, *args):
        global watching
        if not watching:
            recorder.step = run.progress.global_step + 1
            recorder.__enter__()
            watching = True
        return original(run, *args)

    return step


def until_the_plan(original):
    def plan(*args, **kwargs):
        global watching
        if watching:
            recorder.__exit__(None, None, None)
            watching = False
        return original(*args, **kwargs)

    return plan


loop.forward_loss = watch(loop.forward_loss)
loop.plan_step = until_the_plan(loop.plan_step)
report = Path(sys.argv[1])
code = train.cli(sys.argv[2:])
report.write_text(json.dumps({"exit": code, "ops": recorder.ops, "syncs": recorder.syncs}))
sys.exit(code)
