"""bench/gpu_lease.py's --dry-run runs every key stage on CPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

from tests.helpers.processes import ROOT, cli_env


def lease_module():
    spec = importlib.util.spec_from_file_location("gpu_lease", ROOT / "bench" / "gpu_lease.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_dry_run_of_the_key_call_runs_every_stage_and_prints_one_block(tmp_path):
    out = tmp_path / "lease"
    command = [sys.executable, "bench/gpu_lease.py", "--dry-run", "--deadline", "900", "--out", str(out), "--stage"]
    command += ["env", "train", "scale", "serve", "fsdp"]  # the key call and the more call's FSDP stage
    result = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=960)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    block = result.stdout
    print(block)
    assert block.startswith("### GPU lease") and "torch 2." in block and "commit " in block
    assert "| GEMM 256^3 float32 |" in block and "TFLOP/s" in block
    assert "| varlen attention (packed) against padded SDPA | CUDA only: not run |" in block
    assert "**tiny, batch 8, 1 epoch(s)" in block and "| trainer |" in block and "**tiny, batch 16" in block
    assert "serve_bench (" in block and "exit 0); ours and the null model" in block
    assert "| ours req/s | null req/s |" in block  # no peer, nothing converted: ours and the HTTP ceiling
    assert (
        "| smoke preset's data, tiny (the preset's), FSDP2 world size 1 (accelerate_configs/fsdp.yaml) | exit 0"
        in block
    )
    assert "Distributed: DistributedType.FSDP, 1 process(es)" in block and "FSDP2: parameters, gradients" in block
    assert not list(out.glob("work*")) and sorted(p.name for p in out.iterdir()) == [
        "env.md",
        "fsdp.md",
        "scale.md",
        "serve.md",
        "train.md",
    ]  # fmt: skip  (work files stay out of what comes back)
    report = [sys.executable, "bench/gpu_lease.py", "--report", "--out", str(out), "--stage", *command[-5:]]
    assert subprocess.run(report, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout.count("####") == 5


def test_every_stage_belongs_to_one_call_and_the_key_call_holds_the_key_figures():
    lease = lease_module()
    stages = [stage for call in lease.CALLS.values() for stage in call]
    assert sorted(stages) == sorted(lease.STAGES) == sorted(set(stages))
    assert lease.CALLS["key"] == ("env", "train", "scale", "serve")
    assert sum(lease.NEEDS_S[stage] for stage in lease.CALLS["key"]) <= lease.DEADLINE_S <= 9 * 60


def test_the_deadline_stops_the_whole_process_group_and_fails_the_stage(tmp_path):
    lease = lease_module()
    call = lease.Lease(dry=True, env={}, work=tmp_path, deadline=time.monotonic() + 2)
    pid_file = tmp_path / "grandchild"
    child = (  # a launcher whose own child outlives it unless its group is stopped
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); open({str(pid_file)!r}, 'w')"
        ".write(str(p.pid)); time.sleep(60)"
    )
    started = time.monotonic()
    code, output, _ = call.run([sys.executable, "-c", child], "a stage")
    assert code == 124 and time.monotonic() - started < 10
    assert "stopped by the call's deadline" in output and call.failed == ["a stage: stopped by the deadline"]
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # the kill is asynchronous: reaped by init shortly after
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the launcher's child survived the deadline")


def test_a_stage_is_skipped_in_one_line_when_too_little_time_is_left(tmp_path, capsys):
    lease = lease_module()
    call = lease.Lease(dry=False, env={}, work=tmp_path, deadline=time.monotonic() + 3)
    lease.run_stages(call, ("train",), tmp_path)
    said = (tmp_path / "train.md").read_text()
    assert said.startswith(f"skipped: needs ~{lease.NEEDS_S['train']} s,") and said.endswith(
        "s left before the call's deadline"
    )
    assert f"stage train skipped: needs ~{lease.NEEDS_S['train']} s" in capsys.readouterr().err and call.failed == []


@pytest.mark.slow
def test_a_stage_stopped_by_the_deadline_fails_the_run(tmp_path):
    command = [sys.executable, "bench/gpu_lease.py", "--dry-run", "--stage", "train", "--deadline", "12"]
    result = subprocess.run(
        [*command, "--out", str(tmp_path)], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "gpu_lease: train_bench at batch 8: stopped by the deadline" in result.stderr
    assert "stopped by the call's deadline" in (tmp_path / "train.md").read_text()


def test_a_call_names_every_missing_input_before_running(monkeypatch):
    lease = lease_module()
    assert lease.missing_inputs(("env", "smoke"), {}, dry=False) == []  # this suite's environment has the modules
    missing = lease.missing_inputs(("minilm",), {}, dry=False)  # without .lease/
    assert missing == [
        "the AG News rows (.lease/, from --pack)",
        "the MiniLM (.lease/minilm_bf16, from --pack --minilm)",
    ]
    assert lease.missing_inputs(lease.CALLS["key"], {}, dry=True) == []  # a dry run makes its own data
    assert lease.missing_inputs(("train",), {"BENCH_AG_NEWS": "x"}, dry=False) == [
        "the BERT tokenizer (.lease/tokenizer, from --pack)"
    ]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "fastapi" else real_find_spec(name))
    assert lease.missing_inputs(("serve",), {"BENCH_AG_NEWS": "x", "BENCH_TOKENIZER": "y"}, dry=False) == [
        "module fastapi (carry .whl/ from --pack)"
    ]


def test_the_carried_wheels_install_only_what_is_missing_or_older(tmp_path, monkeypatch):
    lease = lease_module()
    wheels = tmp_path / ".whl"
    wheels.mkdir()
    from importlib.metadata import version

    fastapi = version("fastapi")
    for name in (f"fastapi-{fastapi}-py3-none-any.whl", "fastapi_twin_not_installed-1.0-py3-none-any.whl"):
        (wheels / name).write_bytes(b"")
    (wheels / "starlette-0.0.1-py3-none-any.whl").write_bytes(b"")  # older than the one installed here
    commands = []
    monkeypatch.setattr(lease, "WHEELS_DIR", wheels)
    monkeypatch.setattr(lease.subprocess, "run", lambda command, check: commands.append(command))
    lease.install_wheels()
    assert len(commands) == 1
    assert [c.rsplit("/", 1)[-1] for c in commands[0] if c.endswith(".whl")] == [
        "fastapi_twin_not_installed-1.0-py3-none-any.whl"
    ]
    assert "transformers" in lease.WHEELS  # the GPU image's transformers is older than the suite's
