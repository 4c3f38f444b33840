"""What /tokenize costs per text size: a real `python -m inference` serving a byte-level BPE model (the kind whose
tokens share characters: the case that was quadratic), one request of one text at a time, 16k to 128k characters of
emoji and of ASCII; beside each, the same text through the tokenizer's own `encode` in this process (the peer: linear
by construction). Time per 1,000 characters stays flat when /tokenize is linear.

    python bench/tokenize_cost.py [--repeats 3]

Not a CI test: it prints a markdown block to record in docs/benchmarks-log.md (tests/inference/test_tokenize_bounds.py
checks the memory bound).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.service import Server  # noqa: E402
from tests.helpers.tokenizer_kinds import hf_folder, tokenizer_of  # noqa: E402

SIZES = (16_000, 32_000, 64_000, 128_000)
TEXTS = {"emoji": "🔋", "ASCII": "stocks fell "}


def timed(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (the median is reported)")
    args = parser.parse_args()
    encoder = tokenizer_of("byte-level-bpe").backend_tokenizer
    with tempfile.TemporaryDirectory() as work:
        server = Server(hf_folder("byte-level-bpe", Path(work) / "model"), "--backend", "torch").wait_ready()
        try:
            rows = [
                row(server.url, encoder, name, unit, size, args.repeats)
                for name, unit in TEXTS.items()
                for size in SIZES
            ]
        finally:
            server.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}; commit {commit.stdout.strip()}")
    print("| text | characters | tokens | /tokenize s | ms per 1k chars | encode alone s | /tokenize / encode |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def row(url: str, encoder, name: str, unit: str, size: int, repeats: int) -> str:
    text = (unit * size)[:size]
    data = json.dumps({"inputs": text}, ensure_ascii=False).encode()
    tokens = []

    def tokenize():
        response = httpx.post(
            f"{url}/tokenize", content=data, headers={"content-type": "application/json"}, timeout=600
        )
        response.raise_for_status()
        tokens[:] = [len(response.json()[0])]

    served = timed(tokenize, repeats)
    alone = timed(lambda: encoder.encode(text), repeats)
    per_k = 1000 * served / size * 1000
    return f"| {name} | {size:,} | {tokens[0]:,} | {served:.3f} | {per_k:.2f} | {alone:.3f} | {served / alone:.1f}x |"


if __name__ == "__main__":
    main()
