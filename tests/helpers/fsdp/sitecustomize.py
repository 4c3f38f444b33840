"""FSDP2 on the CPU for every process that has this folder on PYTHONPATH: accelerate 1.15 turns on FSDP only for
GPU-family distributed types (state.py), so a gloo group launched with accelerate_configs/fsdp.yaml trains as plain
DDP there. Once the Accelerator is built, this gives its shared state what the config asked for (the FSDP
distributed type and the plugin accelerate builds from the launcher's environment), so prepare, backward, clipping,
get_state_dict, save_state and load_state take accelerate's real FSDP2 path on gloo (torch 2.13's fully_shard runs
there)."""

import importlib.abc
import importlib.machinery
import os
import sys


def install() -> None:
    import accelerate
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    original = accelerate.Accelerator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        state = self.state
        if state.distributed_type == DistributedType.MULTI_CPU and os.environ.get("ACCELERATE_USE_FSDP") == "true":
            plugin = FullyShardedDataParallelPlugin()  # from the environment accelerate launch set
            if state.mixed_precision != "no":
                plugin.set_mixed_precision(state.mixed_precision)
            state.distributed_type, state.fsdp_plugin = DistributedType.FSDP, plugin
            # AcceleratorState() copies the process state again wherever accelerate calls it: both say FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            sys.stderr.write(f"FSDP stand-in: FSDP{plugin.fsdp_version} on gloo\n")

    accelerate.Accelerator.__init__ = init


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Install once `accelerate` itself is executed (a process that never imports it pays nothing). It stays on the
    meta path until then: libraries probe for accelerate with find_spec without importing it."""

    def find_spec(self, name, path=None, target=None):
        if name != "accelerate":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_and_install(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                install()

        spec.loader.exec_module = exec_and_install
        return spec


sys.meta_path.insert(0, _InstallOnImport())
