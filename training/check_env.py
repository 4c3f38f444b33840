"""`agnews check-env`: check the machine and the launch before a long run; exit 1 with one hint per problem.

Every process prints versions, devices and launch variables; the group all-reduces and times a larger all-reduce.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, gather_object, is_port_in_use

from contract.errors import UserError
from training import arguments
from training.cli import run_command
from training.guards import LaunchError, check_world_size

logger = logging.getLogger("check_env")

LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)
CPU_CONFIG = Path(__file__).resolve().parent.parent / "accelerate_configs" / "cpu_2proc.yaml"


def versions() -> dict[str, str]:
    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none (CPU build)",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "not available",
        "gloo": "available" if dist.is_gloo_available() else "not available",
    }
    for package in ("accelerate", "transformers", "datasets", "tokenizers"):
        found[package] = metadata.version(package)
    return found


def gpus() -> list[str]:
    """One line per GPU: name, memory, compute, bf16."""
    lines = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        bf16 = "bf16" if (props.major, props.minor) >= (8, 0) else "no bf16 (use fp16)"
        lines.append(
            f"cuda:{index} {props.name}, {props.total_memory / 2**30:.1f} GiB, "
            f"compute {props.major}.{props.minor}, {bf16}"
        )
    return lines


def describe_process() -> list[str]:
    lines = [" ".join(f"{name} {value}" for name, value in versions().items())]
    lines += gpus() or ["no GPU visible: CPU processes over gloo"]
    lines.append(" ".join(f"{name}={os.environ.get(name, '-')}" for name in LAUNCH_VARIABLES))
    return lines


def node_problems(processes_on_node: int, gpu_count: int, cuda: bool, nccl: bool) -> list[str]:
    """What stops this node's processes from starting, from facts passed in; warns of idle GPUs."""
    problems = []
    if cuda and processes_on_node > gpu_count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        problems.append(
            f"{processes_on_node} processes on this node but only {gpu_count} GPU(s) visible"
            + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")
            + ": lower --num_processes to the GPUs per node (times num_machines for the total), or unset/fix "
            "CUDA_VISIBLE_DEVICES."
        )
    if cuda and processes_on_node > 1 and not nccl:
        problems.append(
            "CUDA is available but this torch build has no NCCL: install a CUDA build of torch from "
            "pytorch.org (pip's CPU or ROCm wheels lack it); gloo would work but is far slower on GPUs."
        )
    if cuda and processes_on_node == 1 and gpu_count > 1:
        logger.warning(
            "One process but %d GPUs visible: only cuda:0 will train. Use `accelerate launch "
            "--multi_gpu --num_processes %d` or accelerate_configs/multi_gpu.yaml.",
            gpu_count,
            gpu_count,
        )
    return problems


def port_problem(port: int) -> str | None:
    if port and is_port_in_use(port):
        return (
            f"Port {port} is already in use on this machine (another run or check still alive? "
            f"`ss -ltnp | grep :{port}`): pass --main_process_port with a free port (0 picks one, single machine only)."
        )
    return None


def check_group(accelerator: Accelerator, buffer_mb: float) -> str:
    """All-reduce check and bandwidth probe; the summary line."""
    n = accelerator.num_processes
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0], device=accelerator.device), "sum")
    expected = n * (n + 1) / 2
    if total.item() != expected:
        raise UserError(
            f"all-reduce returned {total.item()} instead of {expected}: the processes do not form one "
            "group; rerun with NCCL_DEBUG=INFO (GPU) or TORCH_DISTRIBUTED_DEBUG=DETAIL."
        )
    buffer = torch.ones(int(buffer_mb * 2**20) // 4, device=accelerator.device)
    seconds = all_reduce_seconds(buffer, accelerator) if dist.is_initialized() else 0.0
    hosts = sorted(set(gather_object([socket.gethostname()])))
    summary = f"all-reduce OK: {n} process(es) on {len(hosts)} machine(s), sum {total.item():g} == {expected:g}"
    if seconds:
        size = buffer.numel() * 4
        bus = 2 * (n - 1) / n * size / seconds  # the ring algorithm's bytes per link, as nccl-tests reports it
        summary += f"; {buffer_mb:g} MB all-reduce {seconds * 1e3:.1f} ms, bus bandwidth {bus / 1e9:.2f} GB/s"
    return summary


def all_reduce_seconds(buffer: torch.Tensor, accelerator: Accelerator, repeats: int = 5) -> float:
    """Median time of one all-reduce of `buffer` (after a warm-up)."""
    dist.all_reduce(buffer)
    times = []
    for _ in range(repeats):
        accelerator.wait_for_everyone()
        if buffer.is_cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        dist.all_reduce(buffer)
        if buffer.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def run_in_group(args: argparse.Namespace) -> None:
    """Under a launcher: node checks, rendezvous, all-reduce, bandwidth."""
    cuda = torch.cuda.is_available()
    on_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    problems = node_problems(on_node, torch.cuda.device_count(), cuda, dist.is_nccl_available())
    if problems:
        raise UserError(" ".join(problems))
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        accelerator = Accelerator(
            cpu=not cuda, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=args.timeout))]
        )
    except dist.DistNetworkError as exc:
        raise UserError(
            f"Cannot open or reach the rendezvous {os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')} ({first_line(exc)}): the port is in use, or the address "
            "is not this machine's / not reachable from it; change --main_process_port or "
            "--main_process_ip."
        ) from None
    except dist.DistStoreError as exc:
        raise UserError(
            f"The group of WORLD_SIZE={launched} processes did not assemble within {args.timeout:g} s "
            f"({first_line(exc)}): the machines disagree on num_processes/num_machines, a machine was not "
            "started, or a firewall blocks MASTER_PORT. Start the same launch on every machine, changing "
            "only --machine_rank."
        ) from None
    for line in describe_process():
        logger.info(
            "[rank %d/%d on %s] %s", accelerator.process_index, accelerator.num_processes, socket.gethostname(), line
        )
    try:
        check_world_size(accelerator)  # N processes that each see a world of 1
    except LaunchError as exc:
        raise UserError(str(exc)) from None
    logger.info(
        "[rank %d] process group %s over %s, device %s",
        accelerator.process_index,
        accelerator.distributed_type.value,
        dist.get_backend() if dist.is_initialized() else "no backend (one process)",
        accelerator.device,
    )
    summary = check_group(accelerator, args.buffer_mb)
    if accelerator.is_main_process:
        logger.info("%s", summary)
    accelerator.end_training()


def run_alone(args: argparse.Namespace) -> None:
    """No launcher: this process, and a one-process group."""
    for line in describe_process():
        logger.info("%s", line)
    cuda = torch.cuda.is_available()
    problems = node_problems(1, torch.cuda.device_count(), cuda, dist.is_nccl_available())
    if problems:
        raise UserError(" ".join(problems))
    backend = "nccl" if cuda and dist.is_nccl_available() else "gloo"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=args.timeout),
        device_id=device if cuda else None,
    )
    value = torch.tensor([1.0], device=device)
    dist.all_reduce(value)
    dist.destroy_process_group()
    if value.item() != 1.0:
        raise UserError(f"a one-process {backend} all-reduce returned {value.item()}: the {backend} install is broken.")
    if cuda:
        x = torch.randn(256, 256, device=device, dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.half)
        (x @ x).sum().item()
    logger.info(
        "One-process %s group on %s: init and all-reduce OK. Next: `python -m training.check_env "
        "--num_processes N` (or `accelerate launch ... -m training.check_env`) for the real group.",
        backend,
        device,
    )


def launch_self(args: argparse.Namespace) -> int:
    """Check what `--num_processes N` needs here, then run under it."""
    cuda = torch.cuda.is_available()
    problems = node_problems(args.num_processes, torch.cuda.device_count(), cuda, dist.is_nccl_available())
    problems += [p for p in [port_problem(args.main_process_port), config_problem(args.config_file, cuda)] if p]
    if problems:
        raise UserError(" ".join(problems))
    config = args.config_file or (None if cuda else str(CPU_CONFIG))
    command = [  # this interpreter, activated or not
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(args.num_processes),
        "--main_process_port",
        str(args.main_process_port),
    ]
    command += ["--config_file", config] if config else ["--multi_gpu"]
    command += ["-m", "training.check_env", "--timeout", str(args.timeout), "--buffer_mb", str(args.buffer_mb)]
    logger.info("Launching: %s", " ".join(command))
    return subprocess.run(command, check=False).returncode


def config_problem(config_file: str | None, cuda: bool) -> str | None:
    """A launch config that asks for GPUs on a machine without any (its launch would fail in a child's traceback)."""
    if config_file is None or cuda:
        return None
    try:
        config = yaml.safe_load(Path(config_file).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        return f"--config_file {config_file} cannot be read ({first_line(exc)})."
    # cpu_2proc.yaml says MULTI_GPU too (torchrun's path; train.py makes it gloo): GPUs are named, or fp16, which they
    # alone train in
    wants = [f"gpu_ids {config['gpu_ids']}"] if config.get("gpu_ids") is not None else []
    wants += ["fp16"] if str(config.get("mixed_precision")) == "fp16" else []
    if not wants or config.get("use_cpu"):
        return None
    return (
        f"--config_file {config_file} asks for GPUs ({', '.join(wants)}) and this machine has none: on a CPU use "
        f"{CPU_CONFIG.relative_to(CPU_CONFIG.parents[1])} (the Kaggle notebook: AGNEWS_NOTEBOOK_SMOKE=1)."
    )


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arguments.check_env()
    args = parser.parse_args(argv)
    if args.buffer_mb is None:
        args.buffer_mb = 256.0 if torch.cuda.is_available() else 16.0
    if args.num_processes is not None and args.num_processes < 1:
        parser.error("--num_processes must be at least 1")
    return args


def cli(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stdout)  # a report for the terminal
    args = parse_args(argv)

    def check() -> int:
        if "WORLD_SIZE" in os.environ:
            run_in_group(args)
        elif args.num_processes and args.num_processes > 1:
            return launch_self(args)
        else:
            run_alone(args)
        return 0

    return run_command(check)


if __name__ == "__main__":
    sys.exit(cli())
