"""The engine's CPU per answer, this checkout against another in one run: the service on a checkpoint, with its own
forward pass and with one that costs nothing (bench/null_forward), driven through HTTP (wrk) and directly on the
engine's socket (the checkout's own link client), idle and beside two busy processes.

    python training/train.py --preset smoke --output_dir /tmp/smoke
    python bench/engine_cost.py /tmp/smoke --before 53a86bc c6a3699   # the engine before; a model per worker

CPU per answer (user + system time over answers) is the figure that holds still on two shared cores; req/s follows
it. Not a CI test: it prints a markdown block for docs/benchmarks-log.md. Needs wrk (Debian's package).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve_bench import checkout, machine  # noqa: E402
from tests.helpers.service import Server  # noqa: E402

NULL_FORWARD = ROOT / "bench" / "null_forward"
EXTRA_ENV = dict(item.split("=", 1) for item in os.environ.get("ENGINE_COST_ENV", "").split() if "=" in item)
SECONDS = 6.0  # per row
TEXT = "Stocks fell sharply after the report on Monday."
POST = f"""wrk.method = "POST"
wrk.body = '{{"inputs": "{TEXT}"}}'
wrk.headers["Content-Type"] = "application/json"
"""
# the checkout's own link client: `depth` jobs in flight for `seconds`, then the number answered; where front-ends
# tokenize, the text is encoded once as a front-end does and its ids sent again and again: the engine's work alone
SOCKET_CLIENT = """
import asyncio, sys, time
from inference.front_end.link import RemoteLink
try:
    from inference.front_end.encoder import Encoders
except ImportError:
    Encoders = None
async def main(address, seconds, depth, text):
    link = RemoteLink(address)
    await link.start()
    if Encoders is None:
        submit = lambda: link.submit([[text, None]], True, False, False, None)
    else:
        encoded = await Encoders(link.encoding).encode(link.view, None, [(text, None)], (True, False, False, 16))
        submit = lambda: link.submit(encoded, None)
    done, deadline = 0, time.monotonic() + seconds
    async def one():
        nonlocal done
        while time.monotonic() < deadline:
            await submit()
            done += 1
    await asyncio.gather(*(one() for _ in range(depth)))
    print(done)
asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """`pid` and its children (the front-ends)."""
    found = [pid]
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(Path(stat).read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.split("/")[2]))
    return found


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


@contextlib.contextmanager
def busy_processes(count: int):
    """`count` processes spinning on the CPU, as other programs on a shared machine."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def by_wrk(url: str, clients: int, script: Path) -> int:
    """Answers wrk got in SECONDS at `clients` connections (non-2xx refused as a failure of the row)."""
    out = subprocess.run(
        ["wrk", "-t", "1", "-c", str(clients), "-d", f"{SECONDS:g}s", "-s", str(script), f"{url}/predict"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw failed requests:\n{out}")
    return int(re.search(r"(\d+) requests in", out).group(1))


def by_socket(project: Path, address: str, depth: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SOCKET_CLIENT, address, str(SECONDS), str(depth), TEXT],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[-1])


def engine_address(since: float) -> str | None:
    """The engine socket a service started after `since` made (python -m inference's temporary folder); None for a
    service without one (a model per worker)."""
    folders = [f for f in glob.glob(f"{tempfile.gettempdir()}/inference-engine-*") if os.path.getmtime(f) >= since]
    return f"ipc://{max(folders, key=os.path.getmtime)}/engine" if folders else None


def measure(label: str, project: Path, checkpoint: str, null: bool, workers: int, script: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", MEASURE_IN_BACKGROUND="false")
    env.update(EXTRA_ENV)
    if null:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NULL_FORWARD), env.get("PYTHONPATH")]))
    started = time.time() - 1
    args = ("--backend", "torch", "--reload_interval_s", "0", "--workers", str(workers))
    server = Server(checkpoint, *args, env=env, cwd=project).wait_ready(timeout=180)
    forward = "null" if null else "smoke model"
    try:
        time.sleep(2.0 * workers)  # every front-end up
        by_wrk(server.url, 8, script)  # warm
        pids = tree(server.process.pid)
        drivers = [("HTTP (wrk)", c, lambda c=c: by_wrk(server.url, c, script)) for c in (32, 128)]
        address = engine_address(started) if workers > 1 else None
        if address is not None:
            drivers.append(("engine socket", 32, lambda: by_socket(project, address, 32)))
        for busy in (0, 2):
            for driver, clients, run in drivers:
                with busy_processes(busy):
                    engine, whole = cpu_seconds(server.process.pid), tree_cpu(pids)
                    answers = run()
                    engine, whole = cpu_seconds(server.process.pid) - engine, tree_cpu(pids) - whole
                cells = [label, forward, workers, driver, clients, busy, f"{answers / SECONDS:,.0f}"]
                cells += [f"{engine / answers * 1e6:,.0f}", f"{whole / answers * 1e6:,.0f}"]
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint folder, e.g. the smoke run's")
    parser.add_argument(
        "--before", nargs="*", default=[], help="commits (or folders holding the project) measured the same way"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("engine_cost: needs wrk (apt-get install wrk)")
    checkpoint = str(Path(args.checkpoint).resolve())
    print(f"machine: {machine()}; {SECONDS:g} s a row")
    print("| service | forward | workers | driver | clients | busy processes | answers/s | engine CPU per answer (us) "
          "| process tree CPU per answer (us) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "post.lua"
        script.write_text(POST)
        projects = [(ref, checkout(ref, Path(scratch) / ref)) for ref in args.before] + [("this commit", ROOT)]
        for null in (True, False):
            for workers in args.workers:
                for label, project in projects:
                    measure(label, project, checkpoint, null, workers, script)


if __name__ == "__main__":
    main()
