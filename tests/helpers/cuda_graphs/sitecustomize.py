"""CUDA graphs on the CPU for every Python process that has this folder on PYTHONPATH (tests/helpers/processes.py:
`graphs_env`): see stand_in.py. Installed when the package's modules that use them are first imported, so a
process that never imports torch pays nothing."""

import atexit
import importlib.abc
import importlib.machinery
import sys


class _InstallOnImport(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.done: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if (
            name not in ("inference.engine.captured", "training.speed.capture", "training.speed.step_graph")
            or name in self.done
        ):
            return None
        self.done.add(name)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_and_install(module):
            import stand_in  # here, not at start-up: it imports torch, which a front-end process never loads

            if name == "training.speed.capture":
                pool = stand_in.install_training()
                atexit.register(
                    lambda: sys.stderr.write(f"{stand_in.REPORT}: {pool.held} ({pool.overwritten} overwritten)\n")
                )
            exec_module(module)
            if name == "inference.engine.captured":
                stand_in.install_serving()
            if name == "training.speed.step_graph":
                stand_in.install_step_graphs()
                captures = stand_in.CpuStepGraphs
                atexit.register(lambda: sys.stderr.write(f"{stand_in.STEP_REPORT}: {captures.captures}\n"))

        spec.loader.exec_module = exec_and_install
        return spec


sys.meta_path.insert(0, _InstallOnImport())
