"""The engine's host work: no torch op outside the forward passes (each forks the intra-op pool on a CPU), one link
message per loop turn each way, its busy share and host time in /metrics, and threads chosen by the cores free."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest
import zmq
import zmq.asyncio
from pydantic_core import from_json, to_json
from torch.utils._python_dispatch import TorchDispatchMode

import inference.__main__ as service_main
from contract.loading import load_model
from inference.answers import Encoded
from inference.encoding import encode_request
from inference.engine import scheduler
from inference.engine.scheduler import Engine, Limits
from inference.front_end.link import RemoteLink
from inference.prometheus import Metrics
from inference.settings import Settings
from tests.helpers.processes import ROOT, cli_env
from tests.inference.test_app import make_client
from tests.inference.test_workers import samples

# what a batch's logits becoming one NumPy array dispatches: no kernel, no intra-op pool
HOST_COPY = {"aten.detach.default", "aten.to.dtype_layout", "aten.resolve_conj.default", "aten.resolve_neg.default"}


class TorchOps(TorchDispatchMode):
    """Every torch op dispatched on this thread outside the model call."""

    def __init__(self):
        super().__init__()
        self.outside: list[str] = []
        self.forwarding = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.forwarding:
            self.outside.append(str(func))
        return func(*args, **(kwargs or {}))


def test_after_the_forward_passes_no_torch_op_runs(smoke_checkpoint, monkeypatch):
    loaded = load_model(str(smoke_checkpoint), device="cpu", dtype="fp32")
    engine = Engine(loaded, Limits(), Metrics())
    ops = TorchOps()
    forward = scheduler.forward

    def recorded_forward(*args, **kwargs):
        ops.forwarding = True
        try:
            return forward(*args, **kwargs)
        finally:
            ops.forwarding = False

    monkeypatch.setattr(scheduler, "forward", recorded_forward)

    def serve() -> None:
        with ops:
            engine.serve_forever()

    thread = threading.Thread(target=serve)
    thread.start()

    def encoded(sequences: list, chunk: bool) -> Encoded:
        features, owner = encode_request(loaded, sequences, True, False, chunk, 16)
        return Encoded([f["input_ids"] for f in features], None, owner, len(sequences), engine.version)

    async def ask():
        single = engine.submit(encoded([("Stocks fell sharply.", None), ("The Yankees won.", None)], False))
        chunked = engine.submit(encoded([("Oil prices rose again " * 30, None)], True))
        return await single, await chunked

    try:
        single, chunked = asyncio.run(ask())
    finally:
        engine.stop()
        thread.join(30)
    assert len(single.scores) == 2 and len(chunked.scores) == 1 and single.labels == list(loaded.labels)
    assert set(ops.outside) <= HOST_COPY, ops.outside


def test_what_a_loop_turn_has_ready_travels_as_one_message_each_way(tmp_path):
    """Five jobs submitted in one turn: one frame to the engine, and their five answers in one frame back."""
    address = f"ipc://{tmp_path}/engine"

    async def scenario():
        router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        router.bind(address)
        link = RemoteLink(address)
        started = asyncio.create_task(link.start())
        sender, raw = await router.recv_multipart()
        [view] = from_json(raw)
        assert view["op"] == "view"
        await router.send_multipart([sender, to_json([{"id": view["id"], "view": None, "why": "loading"}])])
        await started
        futures = [link.submit(Encoded([[101, i, 102]], None, [0], 1, 1), None) for i in range(5)]
        sender, raw = await router.recv_multipart()
        submitted = from_json(raw)
        assert [m["op"] for m in submitted] == ["submit"] * 5
        errors = [{"id": m["id"], "error": ["overloaded", "busy"]} for m in submitted]
        await router.send_multipart([sender, to_json(errors)])
        answered = await asyncio.gather(*futures, return_exceptions=True)
        assert [type(a).__name__ for a in answered] == ["Refused"] * 5
        await link.stop()
        router.close()

    asyncio.run(scenario())


def test_metrics_show_the_engines_busy_share_and_host_time(smoke_checkpoint):
    with make_client(smoke_checkpoint) as client:
        for _ in range(5):
            assert client.post("/predict", json={"inputs": [["Stocks fell."], ["Rain is due."]]}).status_code == 200
        scraped = samples(client.get("/metrics").text)
    assert scraped[("te_engine_host_duration_count", ())] >= 5
    assert scraped[("te_engine_busy_seconds_total", ())] > 0
    assert 0 <= scraped[("te_engine_busy_ratio", ())] <= 1


@pytest.mark.parametrize("busy, threads", [(0.0, 2), (0.5, 1), (1.0, 1)])
def test_the_service_takes_the_cores_others_leave_free(monkeypatch, busy, threads):
    monkeypatch.setattr(service_main, "available_cores", lambda: 2)
    monkeypatch.setattr(service_main, "busy_share", lambda sample_s: busy)
    settings = Settings(model_id="x")
    said = service_main.choose_threads(settings)
    assert settings.threads == threads
    assert said.startswith(f"CPU threads: {threads} of 2 ({100 * busy:.0f} % of the cores busy")
    given = Settings(model_id="x", torch_threads=2)
    assert service_main.choose_threads(given) is None and given.threads == 2
    shared = Settings(model_id="x", workers=4)  # two front-ends a core: the engine keeps what is left, at least one
    assert "left to 4 front-ends" in service_main.choose_threads(shared) and shared.threads == 1


def test_the_services_openmp_threads_sleep_instead_of_spinning(smoke_checkpoint):
    """python -m inference sets OMP_WAIT_POLICY=PASSIVE before torch loads, unless the environment says otherwise."""
    code = (
        "import os, sys, inference.__main__ as m\n"
        "sys.argv = ['inference', '--help']\n"
        "try:\n    m.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    )
    for given, expected in ((None, "PASSIVE False"), ("ACTIVE", "ACTIVE False")):
        env = {k: v for k, v in cli_env().items() if k != "OMP_WAIT_POLICY"} | (
            {"OMP_WAIT_POLICY": given} if given else {}
        )
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.stdout.strip().splitlines()[-1] == expected, done.stderr
