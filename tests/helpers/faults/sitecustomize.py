"""Fault injection for the crash tests, loaded by every Python process that has this folder on PYTHONPATH
(tests/conftest.py: `fault_env`). The package knows nothing of it: once a module named in PATCHES is imported, the
named function (or method) of that module is wrapped: the seams that training/loop.py and training/output/ document.

    DISTILBERT_AGNEWS_FAULT=nan_loss_from_step:N     the loss is NaN from optimizer step N on, on every rank
    DISTILBERT_AGNEWS_FAULT=raise_on_rank:R:N        rank R raises RuntimeError right after optimizer step N
    DISTILBERT_AGNEWS_FAULT=hang_on_rank:R:N         rank R stops responding right after optimizer step N
    DISTILBERT_AGNEWS_FAULT=kill_in_save_state:N     the main process SIGKILLs itself when state/step_N is fully
                                                     written under its staging name, before the rename
    DISTILBERT_AGNEWS_FAULT=kill_in_save_model:K     the main process SIGKILLs itself after writing the
                                                     temporary weights file of its K-th best-model save
    DISTILBERT_AGNEWS_FAULT=enospc_in_save_state:N   writing state/step_N fails with ENOSPC on the main process
                                                     after a partial file, as a full disk does; the other
                                                     ranks write their part of it 3 s late (the unlucky order)
    DISTILBERT_AGNEWS_FAULT=enospc_in_save_model:K   the K-th best-model save fails with ENOSPC halfway
                                                     through the weights file
    DISTILBERT_AGNEWS_FAULT=enospc_in_predict:K      agnews predict's K-th part file fails with pyarrow's
                                                     ENOSPC after a partial file
    DISTILBERT_AGNEWS_FAULT=oom_above_rows:N         an embedding lookup of more than N rows with gradients on
                                                     raises the CPU allocator's out-of-memory error: a training
                                                     batch that does not fit (evaluation's, without gradients,
                                                     does)
    DISTILBERT_AGNEWS_FAULT=kill_after_shard:K       agnews predict --output_dir SIGKILLs itself once the K-th
                                                     shard's output and record are written
"""

import errno
import functools
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time
from pathlib import Path

FAULT_ENV = "DISTILBERT_AGNEWS_FAULT"
KIND, _, _ARGS = os.environ.get(FAULT_ENV, "").partition(":")
ARGS = [int(a) for a in _ARGS.split(":") if a]
_model_saves = 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _forward_loss(original, run, batch):
    loss = original(run, batch)
    return loss * float("nan") if run.progress.global_step >= ARGS[0] else loss


def _after_optimizer_step(original, run, *args, **kwargs):
    result = original(run, *args, **kwargs)
    rank, step = run.accelerator.process_index, run.progress.global_step
    if [rank, step] == ARGS and KIND == "raise_on_rank":
        raise RuntimeError(f"injected fault ({FAULT_ENV}): rank {rank} failed after optimizer step {step}")
    if [rank, step] == ARGS and KIND == "hang_on_rank":
        while True:  # what a deadlocked rank looks like to its peers: it never reaches the next collective
            time.sleep(3600)
    return result


def _replace_dir(original, staging, target):
    if target.parent.name == "state" and target.name.rsplit("_", 1)[-1] == str(ARGS[0]):
        _die()
    return original(staging, target)


def _write_weights(original, fh, weights):
    global _model_saves
    original(fh, weights)
    _model_saves += 1
    if _model_saves == ARGS[0]:
        _die()


def _no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _save_state(original, accelerator, folder, *args, **kwargs):
    folder = Path(folder)
    this_step = folder.name.split(".")[1] == f"tmp_step_{ARGS[0]}"
    if this_step and not accelerator.is_main_process:
        time.sleep(3)  # the main process has failed and cleaned up before this rank creates the folder again
    original(accelerator, str(folder), *args, **kwargs)
    if this_step and accelerator.is_main_process:
        (folder / "optimizer.bin.partial").write_bytes(b"\0" * 4096)
        raise _no_space()


def _write_weights_no_space(original, fh, weights):
    global _model_saves
    _model_saves += 1
    if _model_saves == ARGS[0]:
        fh.write(b"\0" * 4096)
        raise _no_space()
    original(fh, weights)


def _write_part_no_space(original, table, path):
    global _model_saves
    _model_saves += 1
    if _model_saves == ARGS[0]:
        Path(path).write_bytes(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
    original(table, path)


def _allocate(original, module, ids):
    if torch_grad_enabled() and ids.shape[0] > ARGS[0]:  # torch's own words (c10/core/impl/alloc_cpu.cpp)
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)"
        )
    return original(module, ids)


def _mark_done(original, shard):
    global _model_saves
    original(shard)
    _model_saves += 1
    if _model_saves == ARGS[0]:
        _die()


def torch_grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()


PATCHES = {  # fault kind: (module, function or Class.method, wrapper)
    "nan_loss_from_step": ("training.loop", "forward_loss", _forward_loss),
    "raise_on_rank": ("training.loop", "after_optimizer_step", _after_optimizer_step),
    "hang_on_rank": ("training.loop", "after_optimizer_step", _after_optimizer_step),
    "kill_in_save_state": ("training.output.folder", "replace_dir", _replace_dir),
    "kill_in_save_model": ("training.output.best_model", "write_weights", _write_weights),
    "enospc_in_save_state": ("accelerate.accelerator", "Accelerator.save_state", _save_state),
    "enospc_in_save_model": ("training.output.best_model", "write_weights", _write_weights_no_space),
    "enospc_in_predict": ("pyarrow.parquet", "write_table", _write_part_no_space),
    "oom_above_rows": ("torch.nn.modules.sparse", "Embedding.forward", _allocate),
    "kill_after_shard": ("training.batch.shards", "mark_done", _mark_done),
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the target module as usual, then wraps one of its functions right after it has run."""

    def __init__(self, module: str, function: str, wrapper):
        self.module, self.function, self.wrapper = module, function, wrapper

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            owner_name, _, name = self.function.rpartition(".")
            owner = getattr(module, owner_name) if owner_name else module
            original = getattr(owner, name)

            @functools.wraps(original)
            def wrapped(*args, **kwargs):  # a plain function: as a class attribute, a method (self comes first)
                return self.wrapper(original, *args, **kwargs)

            setattr(owner, name, wrapped)

        spec.loader.exec_module = exec_and_patch
        return spec


if KIND:
    if KIND not in PATCHES:
        raise SystemExit(f"{FAULT_ENV}: unknown fault {KIND!r}; use one of {', '.join(PATCHES)}")
    sys.meta_path.insert(0, _PatchOnImport(*PATCHES[KIND]))
