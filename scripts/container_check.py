"""Build the service's image (Containerfile) from a clean checkout and run it as a cluster would, with podman.

    python scripts/container_check.py          # .ci/run calls it after the suite; exit 0 with a reason when podman
                                               # cannot run here, 1 when a check fails
    python scripts/container_check.py --build-only   # the image alone, where no registry answers (docs/deploying.md;
                                                     # the check's first step runs that documented line as written)

What it checks: the image builds from `git archive HEAD`; the container serves the smoke checkpoint mounted read-only,
with a read-only root file system, as a non-root user; /ready turns 200; /predict answers equal the host service's
(torch fp32, 1e-5) and huggingface_hub's InferenceClient works against it; /metrics is served on the private port;
`podman stop` drains and the process exits 0; bad configuration (no model mounted, a cache volume it cannot write, a
port taken) stops with one line and a non-zero exit. The image's size is printed.

No registry is reachable on these machines, so the base comes from Debian packages (debootstrap, then podman
import), built once per machine and reused (BASE_IMAGE). podman runs with cgroupfs, runc and lowered ulimits: the
machines lack CAP_SYS_RESOURCE and run hybrid cgroups (docs/deploying.md).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BASE_IMAGE = "localhost/distilbert-agnews-base:bookworm"
IMAGE = "localhost/distilbert-agnews-serve:latest"  # what `--build-only` tags
PYPI = "https://pypi.org/simple"
EXTRAS = "serve,telemetry,onnxruntime"  # the default's and a CPU runtime, whose conversion needs a writable cache
PODMAN = ["podman", "--cgroup-manager=cgroupfs"]
RUN = [*PODMAN, "run", "--runtime", "runc", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # this machine's, which its network may need
TEXTS = ["stocks fell as oil prices rose", "the team won the final in overtime", "a new chip speeds up phones"]


def sh(*command: str, check: bool = True, timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        said = result.stderr[-3000:]
        raise SystemExit(f"container check: {' '.join(command[:4])}... exit {result.returncode}\n{said}")
    return result


def why_not() -> str | None:
    """Why podman cannot run containers here, or None."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return "podman or runc not installed (Debian: apt-get install podman runc debootstrap)"
    probe = sh(*PODMAN, "info", check=False, timeout=120)
    return None if probe.returncode == 0 else f"podman info failed: {probe.stderr.strip()[-300:]}"


def base_image() -> str | None:
    """A Debian bookworm base with python3 and venv, from Debian's packages (once per machine); or why there is
    none (no debootstrap, or no way to Debian's archive: the machine, not the image, then stops the check)."""
    if sh(*PODMAN, "image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return None
    if shutil.which("debootstrap") is None:
        return "debootstrap is missing (apt-get install debootstrap)"
    with tempfile.TemporaryDirectory(prefix="base-", dir="/var/tmp") as folder:
        packages = "--include=python3,python3-venv,ca-certificates"
        made = sh("debootstrap", "--variant=minbase", packages, "bookworm", folder, "http://deb.debian.org/debian",
                  check=False)  # fmt: skip
        if made.returncode != 0:
            return f"debootstrap could not make the base: {(made.stderr or made.stdout).strip()[-300:]}"
        tar = subprocess.Popen(["tar", "-C", folder, "-c", "."], stdout=subprocess.PIPE)
        sh(*PODMAN, "import", "-", BASE_IMAGE, stdin=tar.stdout)
        tar.wait()
    return None


def build(work: Path, torch_source: list[str]) -> None:
    """The image from a clean checkout of HEAD (what is committed, nothing else)."""
    source = work / "source"
    source.mkdir()
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "HEAD"], stdout=subprocess.PIPE)
    sh("tar", "-x", "-C", str(source), stdin=archive.stdout)
    archive.wait()
    started = time.time()
    sh(*PODMAN, "build", "--isolation", "chroot", "--network", "host", *ca_arguments(), *torch_source, "--build-arg",
       f"BASE={BASE_IMAGE}", "--build-arg", f"EXTRAS={EXTRAS}", "--tag", IMAGE, "--file",
       str(source / "Containerfile"), str(source))  # fmt: skip
    size = int(sh(*PODMAN, "image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    print(f"image {IMAGE}: built in {time.time() - started:.0f} s, {size / 2**20:.0f} MiB")


def ca_arguments() -> list[str]:
    """This machine's CA bundle for pip inside the build (a proxy's CA may be in it)."""
    if not CA_BUNDLE.is_file():
        return []
    return ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", "--build-arg", f"PIP_CERT={CA_BUNDLE}"]


def torch_arguments() -> list[str] | str:
    """Where the build takes torch's CPU wheel from: its index when reachable, else the CPU wheel in pip's find-links
    folder here (these machines reach PyPI through a proxy but not download.pytorch.org); else why neither."""
    if reachable("download.pytorch.org"):
        return []
    import torch

    links = os.environ.get("PIP_FIND_LINKS", "")
    wheels = sorted(Path(links).glob(f"torch-{torch.__version__}-*.whl")) if links and Path(links).is_dir() else []
    if not wheels:
        return f"torch's CPU index is out of reach and no torch {torch.__version__} wheel is in PIP_FIND_LINKS"
    arguments = ["--volume", f"{links}:{links}:ro", "--build-arg", f"PIP_FIND_LINKS={links}"]
    return arguments + ["--build-arg", f"TORCH_VERSION={torch.__version__}", "--build-arg", f"TORCH_INDEX={PYPI}"]


def reachable(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_container(name: str, checkpoint: Path | None, cache: Path, port: int, metrics: int, *extra: str) -> None:
    model = ["--volume", f"{checkpoint}:/model:ro"] if checkpoint else []
    sh(*PODMAN, "rm", "--force", name, check=False)  # left over from a check that stopped half-way
    sh(*RUN, "--detach", "--name", name, "--read-only", "--network", "host", *model,
       "--volume", f"{cache}:/cache", "--env", f"PORT={port}", "--env", f"PROMETHEUS_PORT={metrics}",
       "--env", "DTYPE=float32", "--env", "BACKEND=torch", "--env", "API_METRICS=false", *extra, IMAGE)  # fmt: skip


def wait_ready(url: str, ended: Callable[[], str | None], timeout: float = 180) -> None:
    """Until GET /ready answers 200; `ended()` says how the server stopped, if it did (then the check fails)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if said := ended():
            raise SystemExit(f"container check: {said}")
        time.sleep(0.5)
    raise SystemExit(f"container check: {url} not ready in {timeout:.0f} s")


def container_ended(name: str) -> Callable[[], str | None]:
    def ended() -> str | None:
        state = json.loads(sh(*PODMAN, "inspect", name).stdout)[0]["State"]
        return None if state["Running"] else f"{name} exited {state['ExitCode']}: {logs(name)}"

    return ended


def logs(name: str) -> str:
    result = sh(*PODMAN, "logs", name, check=False)
    return (result.stdout + result.stderr)[-3000:]


def host_scores(checkpoint: Path) -> list:
    """The same texts through the host's own service process (torch fp32)."""
    port = free_port()
    command = [sys.executable, "-m", "inference", "--model_id", str(checkpoint), "--port", str(port)]
    env = {**os.environ, "DTYPE": "float32", "BACKEND": "torch", "RELOAD_INTERVAL_S": "0", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ended() -> str | None:
        return None if process.poll() is None else f"the host service exited {process.returncode}"

    try:
        wait_ready(f"http://127.0.0.1:{port}", ended)
        return [httpx.post(f"http://127.0.0.1:{port}/predict", json={"inputs": t}).json() for t in TEXTS]
    finally:
        process.terminate()
        process.wait(60)


def check_serving(checkpoint: Path, cache: Path) -> None:
    """The container against the host service, a real client, the private metrics port, the user, the stop."""
    from huggingface_hub import InferenceClient

    name, port, metrics = "agnews-check", free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    run_container(name, checkpoint, cache, port, metrics)
    try:
        wait_ready(url, container_ended(name))
        served = [httpx.post(f"{url}/predict", json={"inputs": t}).json() for t in TEXTS]
        for ours, host in zip(served, host_scores(checkpoint), strict=True):
            scores = {row["label"]: row["score"] for row in host}
            assert all(abs(row["score"] - scores[row["label"]]) <= 1e-5 for row in ours), (ours, host)
        best = InferenceClient(base_url=url).text_classification(TEXTS[1])  # the client returns the best label
        top = max(served[1], key=lambda row: row["score"])
        assert best.label == top["label"] and abs(best.score - top["score"]) <= 1e-6, (best, top)
        assert httpx.get(f"{url}/metrics").status_code == 404  # API_METRICS=false: off the public port
        assert "te_request_success" in httpx.get(f"http://127.0.0.1:{metrics}/metrics").text
        uid = sh(*PODMAN, "exec", name, "python", "-c", "import os; print(os.getuid())").stdout.strip()
        assert uid == "10001", f"runs as uid {uid}"
        write = sh(*PODMAN, "exec", name, "touch", "/opt/venv/x", check=False)
        assert write.returncode != 0, "the root file system must be read-only"
        print(f"serving: answers equal the host's (1e-5), InferenceClient says {best.label}, uid {uid}, "
              "root file system read-only, metrics on the private port only")  # fmt: skip
        sh(*PODMAN, "stop", "--time", "30", name)
        code = json.loads(sh(*PODMAN, "inspect", name).stdout)[0]["State"]["ExitCode"]
        assert code == 0, f"podman stop: exit {code}\n{logs(name)}"
    finally:
        sh(*PODMAN, "rm", "--force", name, check=False)
    print("podman stop: drained, exit 0")


def check_refusal(what: str, checkpoint: Path | None, cache: Path, port: int, expected: str, *extra: str) -> None:
    name = f"agnews-refusal-{what.replace(' ', '-')}"
    run_container(name, checkpoint, cache, port, free_port(), *extra)
    code = sh(*PODMAN, "wait", name, timeout=180).stdout.strip()
    said = [line for line in logs(name).splitlines() if line.startswith("inference: error:")]
    sh(*PODMAN, "rm", "--force", name, check=False)
    assert code not in ("0", "") and len(said) == 1 and expected in said[0], (what, code, said)
    print(f"{what}: exit {code}, {said[0]}")


def cannot_build() -> str | None:
    """Why the image cannot be built here, or None (and the Debian base made, once per machine)."""
    torch_source = torch_arguments()
    return why_not() or (torch_source if isinstance(torch_source, str) else None) or base_image()


def build_only() -> int:
    """`--build-only`: the Debian-package base and the image from HEAD, tagged IMAGE."""
    if reason := cannot_build():
        print(f"cannot build the image here: {reason}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="image-", dir="/var/tmp") as folder:
        build(Path(folder), torch_arguments())
    run = f'{" ".join(RUN)} -p 8080:8080 -v "$PWD/checkpoints:/model:ro" {IMAGE}'
    print(f"built {IMAGE}; run it (docs/deploying.md): {run}")
    return 0


def main() -> int:
    if "--build-only" in sys.argv[1:]:
        return build_only()
    if reason := cannot_build():
        print(f"container check skipped: {reason}")
        return 0
    from tests.helpers.docs import block  # the documented build line, run as a user runs it

    sh("bash", "-euo", "pipefail", "-c", block("docs/deploying.md", "--build-only").code, cwd=ROOT)
    with tempfile.TemporaryDirectory(prefix="container-check-", dir="/var/tmp") as folder:
        work = Path(folder)
        checkpoint, cache, locked = work / "checkpoint", work / "cache", work / "locked"
        sh(sys.executable, "training/train.py", "--preset", "smoke", "--output_dir", str(checkpoint), cwd=ROOT)
        cache.mkdir()
        locked.mkdir(mode=0o700)  # root's: the container's user cannot write it
        shutil.chown(cache, 10001, 10001)
        checkpoint.chmod(0o755)
        check_serving(checkpoint, cache)
        check_refusal("no model mounted", None, cache, free_port(), "/model")
        check_refusal(
            "cache not writable", checkpoint, locked, free_port(), "RUNTIME_CACHE: cannot write",
            "--env", "BACKEND=onnxruntime",  # a conversion is needed, the model folder is read-only: only /cache
        )  # fmt: skip
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            check_refusal("port taken", checkpoint, cache, port, f"PORT: cannot listen on 0.0.0.0:{port}")
    print("container check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
