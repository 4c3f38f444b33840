"""What each rank holds under DDP and under FSDP2, at 2 processes: the bytes of its parameters, gradients and AdamW
state after one optimizer step (a DTensor counts its local shard), and the time of a training step, for
DistilBERT-base (random weights) and a small Qwen2 decoder widened until the shard matters.

    python bench/fsdp_memory.py                 # both strategies, both models, on CPU over gloo (~3 minutes)

On CPU, FSDP2 runs through the stand-in of tests/helpers/fsdp (accelerate keeps its FSDP state for GPUs); on a GPU
machine the same command measures NCCL. Not a CI test: it prints figures to record in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "distilbert-base": ("distilbert", {}),
    "qwen2 (hidden 1024, 8 layers)": (
        "qwen2",
        {
            "hidden_size": 1024,
            "intermediate_size": 2816,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "pad_token_id": 0,
        },
    ),
}


def worker(model_type: str, overrides: dict, out: str) -> None:
    """One rank: build the model, prepare it with AdamW, run warm-up and timed steps, write what it holds."""
    import torch
    from accelerate import Accelerator
    from torch.distributed.tensor import DTensor
    from transformers import AutoConfig, AutoModelForSequenceClassification

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, num_labels=4, **overrides)
    model = AutoModelForSequenceClassification.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    batch = {"input_ids": torch.randint(1, 1000, (8, 128)), "labels": torch.randint(0, 4, (8,))}
    batch = {k: v.to(accelerator.device) for k, v in batch.items()}
    seconds = []
    for step in range(4):
        started = time.perf_counter()
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        if step < 3:
            optimizer.zero_grad(set_to_none=False)
        seconds.append(time.perf_counter() - started)

    def local(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    held = {
        "parameters": sum(local(p) for p in params),
        "gradients": sum(local(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(
            local(v) for state in optimizer.optimizer.state.values() for v in state.values() if torch.is_tensor(v)
        ),
        "step_s": sorted(seconds[1:])[1],
        "strategy": str(accelerator.distributed_type),
    }
    if accelerator.is_main_process:
        Path(out).write_text(json.dumps(held))
    accelerator.end_training()


def measure(name: str, strategy: str, tmp: Path) -> dict:
    model_type, overrides = MODELS[name]
    out = tmp / f"{strategy}-{model_type}.json"
    config = ROOT / "accelerate_configs" / ("fsdp.yaml" if strategy == "fsdp" else "cpu_2proc.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if strategy == "fsdp":
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "tests" / "helpers" / "fsdp"), env.get("PYTHONPATH")])
        )
    command = ["accelerate", "launch", "--config_file", str(config), "--num_processes", "2", "--mixed_precision", "no"]
    command += [__file__, "--worker", model_type, json.dumps(overrides), str(out)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"{os.cpu_count()} CPUs; commit {commit.strip()}; 2 processes; AdamW, fp32; MB held by rank 0 after a step")
    print("| model | strategy | parameters | gradients | optimizer | in all | step (s) | FSDP / DDP memory, time |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            rows = {strategy: measure(name, strategy, Path(tmp)) for strategy in ("ddp", "fsdp")}
            total = {s: sum(r[k] for k in ("parameters", "gradients", "optimizer")) for s, r in rows.items()}
            for strategy, row in rows.items():
                mb = [row[k] / 2**20 for k in ("parameters", "gradients", "optimizer")] + [total[strategy] / 2**20]
                ratio = (
                    f"{total['fsdp'] / total['ddp']:.2f}x, {row['step_s'] / rows['ddp']['step_s']:.2f}x"
                    if strategy == "fsdp"
                    else ""
                )
                cells = " | ".join(f"{v:.1f}" for v in mb)
                print(f"| {name} | {row['strategy']} | {cells} | {row['step_s']:.3f} | {ratio} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4])
    else:
        main()
