"""The shape the code keeps: short functions, few positional parameters, no test hooks in the package, training/
in rooms, short module docstrings, and docs that are generated from the code still match it."""

from __future__ import annotations

import ast
import importlib.util

import pytest

from tests.helpers.processes import ROOT

PACKAGES = ("training", "inference")
SHAPED = ("contract", *PACKAGES, "bench")  # every folder of code whose functions keep the shape below
MAX_LINES, MAX_POSITIONAL = 60, 8
THE_LOOP, MAX_LOOP_LINES = "training/loop.py fit", 85  # the one function a newcomer reads the whole loop in


def functions():
    for package in SHAPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node


def test_no_function_is_longer_than_60_lines():
    def limit(name: str) -> int:
        return MAX_LOOP_LINES if f"{name.split(':')[0]} {name.split()[-1]}" == THE_LOOP else MAX_LINES

    long = [name for name, node in functions() if node.end_lineno - node.lineno + 1 > limit(name)]
    assert not long, long


def test_the_loop_reads_in_one_function():
    """Forward, backward, the optimizer step, log, stop check, evaluate and save are all called from `fit` itself."""
    fit = next(node for name, node in functions() if f"{name.split(':')[0]} {name.split()[-1]}" == THE_LOOP)
    called = {n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id for n in ast.walk(fit)
              if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))}  # fmt: skip
    steps = {"forward_loss", "backward", "step", "plan_step", "log_loss", "preempted_or_diverged"}
    assert steps | {"validate_and_save", "save_state"} <= called, sorted(called)


def test_no_function_takes_more_than_8_positional_parameters():
    wide = [name for name, node in functions() if len(node.args.posonlyargs) + len(node.args.args) > MAX_POSITIONAL]
    assert not wide, wide


def test_the_package_has_no_fault_injection_hooks():
    assert not (ROOT / "training" / "faults.py").exists()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert "DISTILBERT_AGNEWS_FAULT" not in text and "import faults" not in text, path
            assert "def inject" not in text, path


def test_importing_the_training_modules_registers_nothing_with_transformers():
    """The CPU attention is registered by the run's set-up (speed/cpu_speed.py), not as an import side effect."""
    import subprocess
    import sys

    code = (
        "import training.train, training.model, training.speed.cpu_speed, training.loop\n"
        "from transformers import AttentionInterface\n"
        "print('eager_fast_dropout' in AttentionInterface._global_mapping)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


@pytest.mark.parametrize("doc", ["docs/configuration.md"])
def test_generated_configuration_reference_matches_the_code(doc):
    from training.config_docs import markdown

    assert (ROOT / doc).read_text(encoding="utf-8") == markdown(), (
        "regenerate it: python -m training.config_docs > docs/configuration.md"
    )


def module_imports() -> dict[str, set[str]]:
    """Each module of contract/, training/ and inference/ and the modules of those packages it imports, anywhere in
    the file (inside functions and under TYPE_CHECKING too)."""
    paths = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for package in ("contract", *PACKAGES)
        for path in (ROOT / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    found = next((m for m in (f"{node.module}.{alias.name}", node.module) if m in paths), None)
                    graph[name] |= {found} - {name, None}
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in paths} - {name}
    return graph


def loops(graph: dict[str, set[str]]) -> list[str]:
    """Every import loop (a -> b -> ... -> a) a depth-first walk of `graph` meets."""
    done, path, found = set(), [], []

    def visit(name: str) -> None:
        path.append(name)
        for other in sorted(graph[name]):
            if other in path:
                found.append(" -> ".join([*path[path.index(other) :], other]))
            elif other not in done:
                visit(other)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name)
    return found


def test_no_two_modules_import_each_other_even_through_others():
    """An import loop makes the order of loading matter and the rooms hard to tell apart; lazy and type-only imports
    counted."""
    assert not loops(module_imports())


def test_no_two_rooms_of_training_import_each_other_even_through_others():
    """The same with each folder of training/ as one room and each top-level module its own: output/ must not reach
    a command that imports output/ again."""

    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    rooms: dict[str, set[str]] = {}
    for module, imported in module_imports().items():
        if module.startswith("training."):
            inside = {room(i) for i in imported if i.startswith("training.")}
            rooms.setdefault(room(module), set()).update(inside - {room(module)})
    for imported in rooms.values():
        imported &= rooms.keys()
    assert not loops(rooms)


def test_train_py_reads_as_the_assembly_of_the_rooms():
    """train.py builds (set_up), trains (loop), finishes (finish): the parts live in their modules, not in it."""
    imported = module_imports()["training.train"]
    assert len(imported) <= 24, sorted(imported)


ROOMS = ("training", "inference")  # side by side on contract/, which imports neither


def test_training_and_serving_stand_side_by_side_on_the_contract():
    """Issue 42, point 1: inference/ imports nothing of training/, training/ nothing of inference/ (the conversion
    for --export_runtime is the service's command, run as a process), contract/ nothing of either; lazy and
    type-only imports counted."""
    graph = module_imports()
    crossing = {
        module: sorted(i for i in imported if i.split(".")[0] in ROOMS and i.split(".")[0] != module.split(".")[0])
        for module, imported in graph.items()
        if module.split(".")[0] in (*ROOMS, "contract")
    }
    assert not {module: imported for module, imported in crossing.items() if imported}
    readers = {m for m in graph if "contract.model_call" in graph[m]}
    assert {"training.batch.rows", "inference.engine.scheduler"} <= readers
    assert {"training.evaluate", "inference.engine.service"} <= {m for m in graph if "contract.loading" in graph[m]}


TYPE_NAMES = {"problem_type", "SINGLE", "MULTI", "REGRESSION", "RERANKING"}


def _names_a_problem_type(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in TYPE_NAMES) or (
        isinstance(node, ast.Name) and node.id in TYPE_NAMES
    )


def test_only_the_problem_type_objects_branch_on_the_problem_type():
    """Issue 42, point 2: what differs by problem type lives in its class (contract/problem_types.py); nowhere else
    compares a problem type or keys a table by one (choosing the type from the data, training/data/labels.py, returns
    names and compares none)."""
    found = []
    for package in ("contract", *PACKAGES):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "contract" / "problem_types.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                compared = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
                keyed = [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else []
                if any(_names_a_problem_type(n) for n in (*compared, *keyed)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_every_install_line_takes_torch_from_a_named_pytorch_index():
    """A bare `pip install torch` on Linux pulls the CUDA build and several GB of nvidia-* wheels from PyPI; the
    CPU lines name PyTorch's CPU index (the GPU lines a CUDA one), in the README, docs and CI alike."""
    import re

    sources = [ROOT / "README.md", ROOT / ".ci" / "run", *sorted((ROOT / "docs").glob("*.md"))]
    lines = [(p.name, line) for p in sources for line in p.read_text(encoding="utf-8").splitlines()]
    flag = r"-\S+(\s+(?!torch\b)[^-\s]\S*)?"  # a flag, and its value when it takes one
    pattern = re.compile(rf"pip[_ ]install\s+(({flag}|\"\S+\"|python)\s+)*torch(==\S+)?(\s|$|`)")  # flags, then torch
    installs = [(name, line) for name, line in lines if pattern.search(line)]
    assert len(installs) >= 5, installs  # README's two commands, the service's, CI's two, docs
    bare = [(n, line) for n, line in installs if "download.pytorch.org/whl/" not in line]
    assert not bare, bare


# training/'s top: what a user runs and the loop's spine; everything else lives in a room named for its job
TRAINING_TOP = {
    *(
        "train",
        "set_up",
        "run",
        "finish",
        "tune",
        "loop",
        "evaluate",
        "predict",
        "push",
        "download",
        "check_env",
        "commands",
        "arguments",
    ),
    "launch",
    *(
        "cli",
        "config",
        "config_parsing",
        "borrowed_flags",
        "config_docs",
        "smoke",
        "examples",
        "model",
        "fit_batch",
        "lora",
        "weights",
        "objective",
    ),
    *("calibration", "guards", "collective", "__init__"),
}
TRAINING_ROOMS = {"distill", "data", "output", "speed", "scoring", "batch", "search"}


def test_training_keeps_the_spine_at_its_top_and_the_rest_in_rooms():
    top = {p.stem for p in (ROOT / "training").glob("*.py")}
    rooms = {p.name for p in (ROOT / "training").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert top == TRAINING_TOP, f"new at the top: {sorted(top - TRAINING_TOP)}; gone: {sorted(TRAINING_TOP - top)}"
    assert rooms == TRAINING_ROOMS
    for room in ("training/output", "training/speed", "training/scoring", "inference/runtimes"):  # tests mirror them
        assert (ROOT / "tests" / room).is_dir(), room


MAX_MODULE_DOC_LINES = 8  # what a module holds and who calls it; the stories live in docs/


def test_module_docstrings_say_what_the_module_holds_in_a_few_lines():
    long = []
    for package in ("contract", *PACKAGES):
        for path in sorted((ROOT / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
            if len(doc.strip().splitlines()) > MAX_MODULE_DOC_LINES:
                long.append(f"{path.relative_to(ROOT)} ({len(doc.strip().splitlines())} lines)")
    assert not long, f"module docstrings over {MAX_MODULE_DOC_LINES} lines: {long}"


@pytest.mark.parametrize("folders", ["packages", "tests and bench"])
def test_comments_and_docstrings_stay_short(folders):
    """The anchors' density (nanoGPT's median comment is 7 words): measured by scripts/prose.py."""
    spec = importlib.util.spec_from_file_location("prose", ROOT / "scripts" / "prose.py")
    prose = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prose)
    median, over_40, counted = prose.measure(prose.PACKAGES if folders == "packages" else prose.OUTSIDE)
    longest = ", ".join(f"{where} ({n})" for n, where in counted[:5])
    assert median <= 10 and over_40 <= 0.03, f"median {median} words, {over_40:.1%} over 40; longest: {longest}"
