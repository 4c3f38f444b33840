"""One GPU lease, one command: the key GPU figures docs/benchmarks.md needs, printed as one markdown block.

    python bench/gpu_lease.py --pack            # here, before a lease: .lease/ (AG News rows, the BERT tokenizer) and
                                                # .whl/ (the wheels the GPU image lacks or has older, for its Python)
    python bench/gpu_lease.py                   # on the GPU machine: the key call (run tool, carry .lease and .whl)
    python bench/gpu_lease.py --call more       # the other stages (fsdp, smoke runs, sync debug, MiniLM; --minilm)
    python bench/gpu_lease.py --dry-run         # CPU, tiny shapes, the key stages: the script cannot rot

The key call, in order (each stage first checks the time left against what it needs and says in one line what it
skipped; the call's deadline, --deadline seconds from start, bounds every child, whose process group is killed on it):
  env     GEMM peak (bf16 8192^3); probes: varlen attention against padded SDPA, a whole training step (forward,
          backward, clipping, fused capturable AdamW) captured as one CUDA graph against the same steps eager
  train   bench/train_bench.py, DistilBERT-base at batch 32, 2 epochs: ours captured (its steady window timed with
          CUDA events, compilation and recording apart) and the Trainer
  scale   the same at batch 512, 2 epochs (equal epochs: accuracy comparable), learning rate x sqrt(512 / 32): MFU
  serve   bench/serve_bench.py at concurrency 32 and 128: ours (one engine, 1 and 8 front-ends) and the null model;
          the engine's busy share after each load, each server's GPU memory
The `more` call: fsdp (accelerate launch --config_file accelerate_configs/fsdp.yaml --num_processes 1: the smoke
preset's data with DistilBERT-base in bf16 for 30 steps, FSDP2 over NCCL at world size 1; the dry run: the preset's
tiny model through the CPU stand-in of tests/helpers/fsdp on gloo), the bf16/fp16 smoke runs, the sync-debug runs,
the MiniLM's accuracy.

The GPU machine has torch, transformers and accelerate but no package index, no Hub and not ../shared: the rest
travels with the checkout (64 MiB): `.lease/` (the AG News rows and the uncased BERT tokenizer, ~4 MB; the MiniLM
in bf16 too with --pack --minilm) and `.whl/` (~20 MB: transformers at the version this suite tests, datasets,
fastapi, uvicorn, ...). Each call installs the carried wheels whose distribution is missing or older there, then
checks every input its stages need and stops with one line naming what is missing (exit 2, nothing run). Work
files go to a temporary folder; <out> (default $OUT/gpu_lease) receives only <stage>.md, each written part by part
so a stage cut short keeps what it measured. Exit 1 when a stage failed or was stopped by the deadline.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

STARTED = time.monotonic()
ROOT = Path(__file__).resolve().parent.parent
LEASE = ROOT / ".lease"  # what --pack writes and a lease carries (git-ignored)
WHEELS_DIR = ROOT / ".whl"  # likewise
AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "train_subset.csv"
CALLS = {"key": ("env", "train", "scale", "serve"), "more": ("fsdp", "smoke", "minilm")}
STAGES = tuple(stage for stages in CALLS.values() for stage in stages)
# measured on the H200 (2026-11-27, two leases: env 21, train 197, scale 105 when it failed at step 10, serve 127 with
# one engine, fsdp 82); fsdp's figure stands since its first lease, so it runs in the `more` call
NEEDS_S = {"env": 25, "train": 205, "scale": 130, "serve": 135, "fsdp": 85, "smoke": 240, "minilm": 200}
DEADLINE_S = 540  # the key call's figures on an H100, wheels included, inside a 9-minute command
LEASE_PYTHON = "3.12"  # the GPU image's python3 (.library's device notes: Python 3.12.3)
# Distributions the GPU image lacks or has older, carried at the versions installed here (the suite's).
WHEELS = (
    "transformers", "regex",  # the image's transformers is older than the one the suite tests
    "datasets", "evaluate", "dill", "multiprocess", "xxhash",  # training's data and metrics
    "fastapi", "starlette", "uvicorn", "httptools", "h11", "click", "anyio", "annotated-doc",  # the service
    "pydantic", "pydantic-core", "pydantic-settings", "python-dotenv", "annotated-types", "typing-inspection",
    "typing-extensions", "opentelemetry-api", "prometheus-client", "filelock", "httpx", "httpcore",
    "pyzmq",  # the front-ends' link to the engine
    "psutil",  # serve_bench's memory of each server's process tree
)  # fmt: skip
COMMON_MODULES = ("accelerate", "transformers", "datasets", "evaluate", "yaml", "tqdm")
SERVE_MODULES = ("fastapi", "uvicorn", "httptools", "pydantic_settings", "prometheus_client", "httpx", "zmq", "psutil")
CARRIED = {  # name: (environment variable unpack() sets, what to say when it is missing)
    "ag_news": ("BENCH_AG_NEWS", "the AG News rows (.lease/, from --pack)"),
    "tokenizer": ("BENCH_TOKENIZER", "the BERT tokenizer (.lease/tokenizer, from --pack)"),
    "minilm": ("BENCH_MINILM", "the MiniLM (.lease/minilm_bf16, from --pack --minilm)"),
}
NEEDS = {  # beyond COMMON_MODULES: (modules, carried inputs) per stage; carried inputs only for a real (not dry) run
    "env": ((), ()),
    "train": ((), ("ag_news", "tokenizer")),
    "scale": ((), ("ag_news", "tokenizer")),
    "serve": (SERVE_MODULES, ("ag_news", "tokenizer")),
    "fsdp": ((), ("tokenizer",)),
    "smoke": ((), ()),
    "minilm": ((), ("ag_news", "minilm")),
}
BASE_LR, BASE_BATCH = 5e-5, 32
FULL = {"examples": 11000, "validation": 2000, "batches": (32, 512), "epochs": 2}  # the subset has 13,426 rows
DRY = {"examples": 64, "validation": 16, "batches": (8, 16), "epochs": 1}
EAGER, GRAPHED, PACKED = "ours", "ours+graph", "ours+graph+packed"


# ------------------------------------------------------------------------------------------------ packing


def pack(minilm: bool) -> None:
    """.lease/: the shared AG News rows and the uncased BERT tokenizer (and the MiniLM as bf16 safetensors)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from train_bench import minilm_package

    source = minilm_package()
    shutil.rmtree(LEASE, ignore_errors=True)
    (LEASE / "tokenizer").mkdir(parents=True)
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
    for name in tokenizer_files:
        if (source / name).exists():
            shutil.copy(source / name, LEASE / "tokenizer" / name)
    if minilm:
        import torch
        from safetensors.torch import load_file, save_file

        target = LEASE / "minilm_bf16"
        shutil.copytree(LEASE / "tokenizer", target)
        shutil.copy(source / "config.json", target / "config.json")
        weights = {k: v.to(torch.bfloat16) for k, v in load_file(source / "model.safetensors").items()}
        save_file(weights, target / "model.safetensors")
    if AG_NEWS.is_file():
        shutil.copy(AG_NEWS, LEASE / AG_NEWS.name)
    size = sum(f.stat().st_size for f in LEASE.rglob("*") if f.is_file())
    print(f"packed {LEASE} ({size / 2**20:.1f} MiB): carry it with the run tool (carry: ['.lease', '.whl'])")


def pack_wheels() -> None:
    """.whl/: a wheel of each of WHEELS at the version installed here, for the GPU image's Python (pip download
    --no-deps: the image has their other dependencies, torch and numpy among them)."""
    from importlib.metadata import version

    shutil.rmtree(WHEELS_DIR, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
    command += ["--only-binary=:all:", "--dest", str(WHEELS_DIR), "--python-version", LEASE_PYTHON]
    command += ["--implementation", "cp", "--abi", f"cp{LEASE_PYTHON.replace('.', '')}", "--abi", "abi3"]
    command += ["--abi", "none", "--platform", "any"]
    for platform_tag in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"):
        command += ["--platform", platform_tag]
    subprocess.run([*command, *(f"{name}=={version(name)}" for name in WHEELS)], check=True)
    size = sum(f.stat().st_size for f in WHEELS_DIR.iterdir()) / 2**20
    print(f"packed {WHEELS_DIR} ({len(list(WHEELS_DIR.iterdir()))} wheels, {size:.1f} MiB): carry it too")


def install_wheels() -> None:
    """Install each carried wheel whose distribution is missing here or older (no index, no dependencies)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    def needed(wheel: Path) -> bool:
        name, carried = wheel.name.split("-")[:2]
        try:
            return Version(version(name)) < Version(carried)
        except PackageNotFoundError:
            return True

    wheels = [str(w) for w in sorted(WHEELS_DIR.glob("*.whl")) if needed(w)] if WHEELS_DIR.is_dir() else []
    if wheels:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index"]
        subprocess.run([*command, "--no-deps", *wheels], check=True)
        print(f"installed {len(wheels)} carried wheels: {', '.join(Path(w).name.split('-')[0] for w in wheels)}")


def missing_inputs(stages: tuple[str, ...], env: dict, dry: bool) -> list[str]:
    """What the stages need and this machine lacks: modules, and (for a real run) the carried inputs."""
    import importlib.util

    modules = {m for stage in stages for m in (*COMMON_MODULES, *NEEDS[stage][0])}
    missing = [f"module {m} (carry .whl/ from --pack)" for m in sorted(modules) if not importlib.util.find_spec(m)]
    inputs = {name for stage in stages for name in NEEDS[stage][1]} if not dry else set()
    missing += [CARRIED[name][1] for name in sorted(inputs) if CARRIED[name][0] not in env]
    return missing


def unpack(work: Path) -> dict[str, str]:
    """Environment for the benches: the carried AG News rows, tokenizer and MiniLM (restored to fp32)."""
    env = {}
    if (LEASE / AG_NEWS.name).is_file():
        env["BENCH_AG_NEWS"] = str(LEASE / AG_NEWS.name)
    if (LEASE / "tokenizer").is_dir():
        env["BENCH_TOKENIZER"] = str(LEASE / "tokenizer")
    if (LEASE / "minilm_bf16").is_dir():
        import torch
        from safetensors.torch import load_file, save_file

        folder = work / "minilm"
        shutil.copytree(LEASE / "minilm_bf16", folder, dirs_exist_ok=True)
        weights = {k: v.to(torch.float32) for k, v in load_file(folder / "model.safetensors").items()}
        save_file(weights, folder / "model.safetensors")
        env["BENCH_MINILM"] = str(folder)
    return env


# ------------------------------------------------------------------------------------------------- the call


@dataclass
class Lease:
    """One call: its stages' shared environment, work folder and deadline, and what failed."""

    dry: bool
    env: dict
    work: Path
    deadline: float  # time.monotonic() at which every child is stopped
    failed: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, command: list[str], what: str, extra: dict | None = None) -> tuple[int, str, float]:
        """(exit code, stdout + stderr, seconds) of a command run from the project root, stopped (its whole
        process group: launchers, workers, compilers) at the deadline; a failure is recorded under `what`."""
        started, timeout = time.monotonic(), max(1.0, self.left())
        env = {**os.environ, **self.env, **(extra or {})}
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group: a time-out stops every process it started
        )  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output = process.communicate()[0] + f"\nstopped by the call's deadline after {timeout:.0f} s"
            self.failed.append(f"{what}: stopped by the deadline")
            return 124, output, time.monotonic() - started
        if process.returncode != 0:
            self.failed.append(f"{what}: exit {process.returncode}")
        return process.returncode, output, time.monotonic() - started


def tables(output: str) -> str:
    """The markdown tables and the summary lines a bench printed."""
    keep = ("|", "device:", "model:", "ours", "compilation", "texts:", "null")
    return "\n".join(line for line in output.splitlines() if line.lstrip().startswith(keep))


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return (lines[-1] if lines else "").replace("|", "/")[:160]


def test_accuracy(out: Path) -> str:
    metrics = out / "metrics.json"
    if not metrics.is_file():
        return "no metrics.json"
    test = json.loads(metrics.read_text()).get("test") or {}
    return f"accuracy {test.get('accuracy', float('nan')):.4f}"


# ------------------------------------------------------------------------------------------------- stages


def stage_env(lease: Lease) -> Iterator[str]:
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from lease_probes import gemm_tflops, step_graph_probe, varlen_probe

    cuda = torch.cuda.is_available() and not lease.dry
    n, dtype = (8192, torch.bfloat16) if cuda else (256, torch.float32)
    rows = [f"| GEMM {n}^3 {str(dtype).removeprefix('torch.')} | {gemm_tflops(n, dtype):.1f} TFLOP/s |"]
    rows.append(f"| varlen attention (packed) against padded SDPA | {varlen_probe()} |")
    rows.append(f"| whole training step as one CUDA graph against eager | {step_graph_probe()} |")
    yield "| check | result |\n|---|---|\n" + "\n".join(rows)


def bench(lease: Lease, model: str, rows: list[str], batch: int, repeats: int = 1, extra: tuple = ()) -> str:
    """train_bench's rows at this batch, `repeats` times (the median reported); `extra`: more train_bench flags."""
    sizes = DRY if lease.dry else FULL
    lr = BASE_LR * math.sqrt(batch / BASE_BATCH)  # square-root scaling from batch 32
    command = [sys.executable, "bench/train_bench.py", "--model", model, "--rows", *rows, "--repeats", str(repeats)]
    command += ["--batch_size", str(batch), "--learning_rate", f"{lr:.3g}", "--num_examples", str(sizes["examples"])]
    command += ["--num_train_epochs", str(sizes["epochs"]), "--num_validation", str(sizes["validation"])]
    command += ["--precision", lease.env.get("LEASE_PRECISION", "bf16"), *extra]
    code, output, seconds = lease.run(command, f"train_bench at batch {batch}")
    epochs = sizes["epochs"]
    head = f"**{model}, batch {batch}, {epochs} epoch(s), learning rate {lr:.3g}** ({seconds:.0f} s, exit {code})"
    return f"{head}\n\n{tables(output) if code == 0 else output[-2000:]}"


def stage_train(lease: Lease) -> Iterator[str]:
    model, batch = ("tiny" if lease.dry else "distilbert-base"), (DRY if lease.dry else FULL)["batches"][0]
    # the whole step captured against the Trainer (reduce-overhead's figure: the 2026-11-26 lease); the dry run: the
    # eager row (compiled and captured steps have their CPU tests)
    yield bench(lease, model, [EAGER if lease.dry else GRAPHED, "trainer"], batch)


def stage_scale(lease: Lease) -> Iterator[str]:
    model, batch = ("tiny" if lease.dry else "distilbert-base"), (DRY if lease.dry else FULL)["batches"][1]
    # MFU: packed rows, the whole step captured; 2 widths, so 4 row lengths to compile (a minute, not two)
    yield bench(
        lease, model, [EAGER if lease.dry else PACKED], batch, extra=() if lease.dry else ("--compile-buckets", "2")
    )


def stage_serve(lease: Lease) -> Iterator[str]:
    workers = ["1"] if lease.dry else ["1", "8"]
    command = [sys.executable, "bench/serve_bench.py", "--precision", lease.env.get("LEASE_PRECISION", "bf16")]
    command += ["--null", "--no-peers", "--no-agreement", "--workers", *workers]
    command += ["--smoke", "--duration", "1", "--concurrency", "4", "--load-processes", "1"] if lease.dry else []
    command += [] if lease.dry else ["--duration", "4", "--concurrency", "32", "128", "--load-processes", "4"]
    code, output, seconds = lease.run(command, "serve_bench")
    captured = [line for line in output.splitlines() if "CUDA graphs" in line]  # ours-wN: one line per worker
    yield (
        f"serve_bench ({seconds:.0f} s, exit {code}); ours and the null model (the HTTP ceiling) with "
        f"{' / '.join(workers)} worker(s)\n\n"
        + (tables(output) if code == 0 else output[-2000:])
        + "".join(f"\n- {line}" for line in captured)
    )


def stage_fsdp(lease: Lease) -> Iterator[str]:
    """The smoke preset's data with DistilBERT-base (random init) in bf16 through FSDP2 at world size 1; the dry run:
    the preset's own tiny model in fp32 through the CPU stand-in."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from load_generator import free_port
    from train_bench import prepare_model

    cuda = torch.cuda.is_available()
    out = lease.work / "fsdp"
    accelerate = shutil.which("accelerate", path=Path(sys.executable).parent) or "accelerate"
    command = [accelerate, "launch", "--config_file", "accelerate_configs/fsdp.yaml", "--num_processes", "1"]
    command += ["--main_process_port", str(free_port()), "training/train.py", "--preset", "smoke"]
    command += ["--output_dir", str(out), "--max_train_steps", "6" if lease.dry else "30"]
    command += ["--eval_steps", "3" if lease.dry else "15"]
    if lease.dry:  # the CPU stand-in: accelerate's FSDP2 path on gloo
        stand_in = [str(ROOT / "tests" / "helpers" / "fsdp"), os.environ.get("PYTHONPATH")]
        extra = {"PYTHONPATH": os.pathsep.join(filter(None, stand_in))}
    else:
        extra = None
        command += ["--model_name_or_path", str(prepare_model("distilbert-base", lease.work)[0])]
    command += ["--mixed_precision", "bf16" if cuda and not lease.dry else "fp32"]
    code, output, seconds = lease.run(command, "fsdp smoke", extra)
    said = [line.split("] ")[-1].replace("|", "/") for line in output.splitlines() if "FSDP" in line and "] " in line]
    model = "tiny (the preset's)" if lease.dry else "DistilBERT-base (random init)"
    yield (
        "| run | result |\n|---|---|\n"
        f"| smoke preset's data, {model}, FSDP2 world size 1 (accelerate_configs/fsdp.yaml) | exit {code}, "
        f"{seconds:.0f} s, test {test_accuracy(out)}; {' / '.join(said[:2]) or last_line(output)} |"
    )


def stage_smoke(lease: Lease) -> Iterator[str]:
    import torch

    cuda = torch.cuda.is_available()
    quick = ["--max_train_steps", "6", "--eval_steps", "3"] if lease.dry else []
    rows = []
    for name in ("bf16", "fp16") if cuda else ("bf16", "fp32"):
        out = lease.work / f"smoke-{name}"
        args = ["--preset", "smoke", "--mixed_precision", name, "--output_dir", str(out), *quick]
        code, _, seconds = lease.run([sys.executable, "training/train.py", *args], f"smoke {name}")
        rows.append(f"| smoke, {name} | exit {code}, {seconds:.0f} s, test {test_accuracy(out)} |")
    for name, extra in SYNC_RUNS.items():
        out = lease.work / f"sync-debug-{name}"
        args = ["--preset", "smoke", "--output_dir", str(out), "--max_train_steps", "20", *extra]
        code, output, _ = lease.run([sys.executable, __file__, "--sync-child", *args], f"sync debug {name}")
        rows.append(f"| 20 steps ({name}), steady steps under set_sync_debug_mode('error') | exit {code}: "
                    f"{last_line(output)} |")  # fmt: skip
    yield "| run | result |\n|---|---|\n" + "\n".join(rows)


SYNC_RUNS = {  # the eager step, and the captured one (one width: every step after its recording is checked)
    "eager": ("--attn_implementation", "sdpa"),
    "captured": ("--attn_implementation", "sdpa", "--torch_compile", "reduce-overhead", "--pad_buckets", "1"),
}


def stage_minilm(lease: Lease) -> Iterator[str]:
    minilm = "tiny" if lease.dry or "BENCH_MINILM" not in lease.env else "minilm"
    for batch in (DRY if lease.dry else FULL)["batches"]:  # accuracy: the eager step
        yield bench(lease, minilm, [EAGER], batch)


STAGE = {
    "env": stage_env,
    "train": stage_train,
    "scale": stage_scale,
    "serve": stage_serve,
    "fsdp": stage_fsdp,
    "smoke": stage_smoke,
    "minilm": stage_minilm,
}


# ------------------------------------------------------------------------------------------------- report


def header() -> str:
    import accelerate
    import torch
    import transformers

    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (CPU dry run)"
    return (  # a lease's copy of .git may be older than its working tree: then "-dirty"
        f"Machine: {gpu}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; python "
        f"{platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, accelerate "
        f"{accelerate.__version__}; commit {commit.stdout.strip() or 'unknown'}"
    )


def report(out: Path, stages: tuple[str, ...]) -> str:
    parts = [f"### GPU lease ({time.strftime('%Y-%m-%d')})", header()]
    for stage in stages:
        path = out / f"{stage}.md"
        parts.append(f"#### {stage}\n\n{path.read_text() if path.is_file() else 'not run'}")
    return "\n\n".join(parts)


def sync_child(argv: list[str]) -> int:
    """train.py with every steady step (forward_loss up to the loop's plan_step, the window training/loop.py
    documents; not the steps that compile or record CUDA graphs) under torch.cuda.set_sync_debug_mode('error')."""
    sys.path.insert(0, str(ROOT))
    import torch

    from training import loop, train

    step, plan = loop.forward_loss, loop.plan_step

    def strict_step(run, batch):
        if torch.cuda.is_available() and run.compiled.steady:  # not while compiling or recording CUDA graphs
            torch.cuda.set_sync_debug_mode("error")
        return step(run, batch)

    def relaxed_plan(*args, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
        return plan(*args, **kwargs)

    loop.forward_loss, loop.plan_step = strict_step, relaxed_plan
    code = train.cli(argv)
    checked = "no host sync inside any step" if torch.cuda.is_available() else "CPU: no CUDA sync to check"
    print(f"train.py exit {code}: {checked}" if code == 0 else f"train.py exit {code}", file=sys.stderr)
    return code


def run_stages(lease: Lease, stages: tuple[str, ...], out: Path) -> None:
    """Each stage in order, skipped (said in one line) when less time is left than it needs."""
    for stage in stages:
        need = 5 if lease.dry else NEEDS_S[stage]
        if lease.left() < need:
            line = f"skipped: needs ~{need} s, {max(0, lease.left()):.0f} s left before the call's deadline"
            (out / f"{stage}.md").write_text(line)
            print(f"stage {stage} {line}", file=sys.stderr, flush=True)
            continue
        started, parts = time.monotonic(), []
        for part in STAGE[stage](lease):  # written as it comes: a stage cut short keeps its parts
            parts.append(part)
            (out / f"{stage}.md").write_text("\n\n".join(parts))
        print(f"stage {stage}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--call", choices=CALLS, default="key", help="which stages (default: the key figures)")
    parser.add_argument("--stage", nargs="+", choices=STAGES, help="these stages instead of a call's")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds from start for the whole call")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: check that every stage still runs")
    parser.add_argument("--pack", action="store_true", help="write .lease/ and .whl/ here, before a lease")
    parser.add_argument("--minilm", action="store_true", help="with --pack: the MiniLM too (the minilm stage)")
    parser.add_argument("--report", action="store_true", help="print the block of the stages run so far")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "gpu_lease")
    parser.add_argument("--sync-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.sync_child is not None:
        return sync_child(args.sync_child)
    if args.pack:
        pack(args.minilm)
        pack_wheels()
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    stages = tuple(args.stage) if args.stage else CALLS[args.call]
    if args.report:
        print(report(args.out, stages))
        return 0
    install_wheels()
    work = Path(tempfile.mkdtemp(prefix="gpu_lease_"))  # outside <out>: only the figures come back
    env = {**unpack(work), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if args.dry_run:
        env.update(LEASE_PRECISION="fp32", BACKEND="torch")  # BACKEND: the service converts nothing on CPU
    os.environ.update(env)  # this process too: the benches it imports (train_bench) read the carried paths at import
    missing = missing_inputs(stages, env, args.dry_run)
    if missing:
        print(f"gpu_lease: stages {', '.join(stages)} need what is missing here: {'; '.join(missing)}", file=sys.stderr)
        return 2
    lease = Lease(args.dry_run, env, work, STARTED + args.deadline)
    run_stages(lease, stages, args.out)
    print(report(args.out, stages))
    for failure in lease.failed:
        print(f"gpu_lease: {failure}", file=sys.stderr)
    return 1 if lease.failed else 0


if __name__ == "__main__":
    sys.exit(main())
