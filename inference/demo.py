"""`python -m inference.demo`: serve the checkpoint, make one /predict call, print it, stop."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

logger = logging.getLogger("inference.demo")
EXAMPLES = [
    "Stocks rallied on Wall Street as oil prices fell after the earnings report.",
    "The Yankees beat the Red Sox in overtime.",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 10) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model_id",
        "--checkpoint_dir",
        default="checkpoints",
        help="checkpoint folder, save_pretrained folder or Hub id (default: checkpoints)",
    )
    parser.add_argument("--text", action="append", help="text to classify (repeatable); default: two examples")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(message)s", level=logging.INFO)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "inference", "--model_id", args.model_id, "--port", str(port)])
    try:
        deadline = time.time() + 120
        while True:
            if server.poll() is not None:
                return server.returncode or 1  # it already said why (e.g. no checkpoint)
            try:
                if _request(f"{url}/ready", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.time() > deadline:
                logger.error("the service did not become ready within 120 s")
                return 1
            time.sleep(0.3)
        texts = args.text or EXAMPLES
        body = {"inputs": [[text] for text in texts], "top_k": 2}  # TEI's batch form: one [text] per input
        status, answer = _request(f"{url}/predict", body)
        logger.info("POST %s/predict %s -> %s", url, json.dumps(body), status)
        for text, labels in zip(texts, answer if status == 200 else []):
            logger.info("  %-70.70s %s", text, ", ".join(f"{p['label']} {p['score']:.3f}" for p in labels))
        if status != 200:
            logger.error("  %s", answer)
            return 1
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(60)
    logger.info("service stopped (exit code %d)", code)
    return code


if __name__ == "__main__":
    sys.exit(main())
