"""Memory soak: the service's resident memory over tens of thousands of varied requests, over real HTTP.

    python bench/memory_soak.py --dtype fp32 --backend torch          # ~8 minutes on 2 cores (AVX2)
    python bench/memory_soak.py --dtype bf16 --requests 40000         # on a CPU with native bf16 (AMX, AVX512-BF16)
    python bench/memory_soak.py --dtype bf16 --layers 6               # the whole DistilBERT-base

Not a test: it prints figures to record in docs/benchmarks.md. It writes a checkpoint of DistilBERT-base width
(random weights, `--layers` layers: the allocations per layer are those of the full model) with the uncased BERT
vocabulary, starts `python -m inference` on it, and sends `--requests` requests from `--concurrency` keep-alive
clients, each request 1-4 texts of 3 to `--max_words` random words (so batch shapes keep changing, as in real
traffic). It prints the service process's RSS after each `--every` requests, and its growth from the first
sample to the last, which issue 14 bounds at 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load_generator  # noqa: E402  (bench/ is not a package)
import serve_bench  # noqa: E402


def texts_for(rng: random.Random, words: list[str], max_words: int) -> list[str]:
    return [" ".join(rng.choices(words, k=rng.randint(3, max_words))) for _ in range(rng.randint(1, 4))]


async def soak(url: str, pid: int, words: list[str], args) -> list[tuple[int, float]]:
    """(requests answered, RSS in MB) after every `args.every` requests."""
    import psutil

    host, port = url.removeprefix("http://").split(":")
    service, samples, sent, answered, failures = psutil.Process(pid), [], 0, 0, 0

    async def client(worker: int) -> None:
        nonlocal sent, answered, failures
        rng = random.Random(worker)
        async with load_generator.Connection(host, int(port)) as http:
            while sent < args.requests:
                sent += 1
                texts = texts_for(rng, words, args.max_words)
                status, _ = await http.post_json("/predict", {"inputs": [[text] for text in texts]})
                answered, failures = answered + 1, failures + (status != 200)
                if answered % args.every == 0:
                    samples.append((answered, service.memory_info().rss / 2**20))
                    print(f"{answered:>7} requests: RSS {samples[-1][1]:.0f} MB", flush=True)

    await asyncio.gather(*(client(w) for w in range(args.concurrency)))
    if failures:
        sys.exit(f"{failures} requests failed")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="torch", help="the service's BACKEND")
    parser.add_argument("--dtype", default="fp32", help="the service's DTYPE")
    parser.add_argument("--requests", type=int, default=40000)
    parser.add_argument("--every", type=int, default=10000, help="sample RSS after every N requests")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max_words", type=int, default=30, help="each text has 3 to this many random words")
    parser.add_argument("--layers", type=int, default=1, help="transformer layers of the DistilBERT-base-wide model")
    args = parser.parse_args()

    print(serve_bench.machine())
    work = Path(tempfile.mkdtemp(prefix="memory_soak-"))
    checkpoint = work / "checkpoint"
    config = serve_bench.write_checkpoint(checkpoint, layers=args.layers)
    words = [w for w in _vocabulary(checkpoint) if w.isalpha()]
    port = load_generator.free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "inference", "--model_id", str(checkpoint), "--port", str(port)]
    command += ["--backend", args.backend, "--dtype", args.dtype, "--reload_interval_s", "0"]
    server = load_generator.start(command, url, work / "service.log")
    try:
        print(f"BACKEND={args.backend} DTYPE={args.dtype}, {config.n_layers} layer(s) of width {config.dim}")
        samples = asyncio.run(soak(url, server.pid, words, args))
    finally:
        server.terminate()
        server.wait(60)
    first, last = samples[0], samples[-1]
    print(f"RSS {first[1]:.0f} MB after {first[0]} requests -> {last[1]:.0f} MB after {last[0]}: ", end="")
    print(f"{100 * (last[1] / first[1] - 1):+.1f} %")


def _vocabulary(checkpoint: Path) -> list[str]:
    from transformers import AutoTokenizer

    from contract import files

    return list(AutoTokenizer.from_pretrained(checkpoint / files.TOKENIZER_DIR).get_vocab())


if __name__ == "__main__":
    main()
