"""One settings model: environment variables (TEI's names) and flags from the same fields, --help, bad values."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from pydantic_settings import CliApp

from inference.settings import Settings, SettingsError, from_env
from tests.helpers.processes import ROOT, cli_env, free_port
from tests.helpers.service import Server, run_cli

TEI_ENVIRONMENT = {
    "MODEL_ID": "/models/topics",
    "PORT": "3000",
    "HOSTNAME": "0.0.0.0",
    "API_KEY": "k",
    "PAYLOAD_LIMIT": "1000",
    "MAX_CONCURRENT_REQUESTS": "7",
    "MAX_BATCH_TOKENS": "4096",
    "MAX_BATCH_REQUESTS": "8",
    "MAX_CLIENT_BATCH_SIZE": "4",
    "AUTO_TRUNCATE": "false",
    "DTYPE": "bfloat16",
    "JSON_OUTPUT": "true",
    "CORS_ALLOW_ORIGIN": "https://a.example,https://b.example",
}


def test_tei_environment_variable_names_are_read(monkeypatch):
    for name, value in TEI_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    s = from_env()
    assert (s.model_id, s.port, s.hostname, s.api_key, s.payload_limit) == (
        "/models/topics",
        3000,
        "0.0.0.0",
        "k",
        1000,
    )
    assert (s.max_concurrent_requests, s.max_batch_tokens, s.max_batch_requests, s.max_client_batch_size) == (
        7,
        4096,
        8,
        4,
    )
    assert (s.auto_truncate, s.dtype, s.json_output) == (False, "bf16", True)
    assert s.cors_origins == ["https://a.example", "https://b.example"]


def test_flags_override_the_environment_and_checkpoint_dir_is_an_alias(monkeypatch):
    monkeypatch.setenv("PORT", "3000")
    monkeypatch.setenv("MODEL_ID", "from-env")
    assert CliApp.run(Settings, cli_args=["--port", "9000"]).port == 9000
    assert CliApp.run(Settings, cli_args=[]).model_id == "from-env"
    assert CliApp.run(Settings, cli_args=["--checkpoint_dir", "runs/a"]).model_id == "runs/a"
    assert CliApp.run(Settings, cli_args=["--no-auto_truncate"]).auto_truncate is False
    monkeypatch.delenv("MODEL_ID")
    monkeypatch.setenv("CHECKPOINT_DIR", "legacy")
    assert from_env().model_id == "legacy"


def test_help_lists_every_setting_with_its_environment_name_and_default():
    result = run_cli("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for name in Settings.model_fields:
        assert f"--{name}" in text, name
        assert f"[{name.upper()}" in text, f"{name}: environment variable not in --help"
    shown = [f for f in Settings.model_fields.values() if f.default is not None]  # "no default" is not said
    assert text.count("(default:") >= len(shown) and "(default: None)" not in text


@pytest.mark.parametrize(
    "args, env, line",
    [
        (
            (),
            {"PORT": "nine"},
            "inference: error: PORT: Input should be a valid integer, unable to parse string as an "
            "integer (got 'nine')",
        ),
        (
            ("--dtype", "float8"),
            {},
            "inference: error: DTYPE: unknown precision 'float8'; use one of auto, fp32, no, "
            "float32, fp16, float16, bf16, bfloat16, int8 (got 'float8')",
        ),
        (
            ("--max_batch_requests", "0"),
            {},
            "inference: error: MAX_BATCH_REQUESTS: Input should be greater than or equal to 1 (got '0')",
        ),
        (
            (),
            {"GRACEFUL_SHUTDOWN_S": "0"},
            "inference: error: GRACEFUL_SHUTDOWN_S: Input should be greater than 0 (got '0')",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_setting_and_exit_2(args, env, line, monkeypatch, capsys):
    """The command's own entry point in this process (what `python -m inference` runs; the real process is
    tested below): settings are checked before anything is loaded."""
    from inference.__main__ import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(list(args)) == 2
    assert capsys.readouterr().err.strip() == line


def test_a_bad_value_stops_the_real_command_with_one_line_and_exit_2():
    result = run_cli(env=cli_env(PORT="nine"))
    assert result.returncode == 2 and result.stderr.strip() == (
        "inference: error: PORT: Input should be a valid integer, unable to parse string as an integer (got 'nine')"
    ), result.stderr


def test_max_batch_tokens_below_the_models_maximum_is_refused(smoke_checkpoint):
    result = run_cli("--model_id", str(smoke_checkpoint), "--max_batch_tokens", "100")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "inference: error: MAX_BATCH_TOKENS: must be at least the model's maximum input length (512), got 100"
    )


def test_uvicorn_app_with_a_bad_setting_is_one_line_and_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "uvicorn", "inference.app:app", "--port", str(free_port())],
        cwd=ROOT,
        env=cli_env(MAX_BATCH_TOKENS="lots"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "inference: error: MAX_BATCH_TOKENS: Input should be a valid integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_linux_only_call_at_import():
    """macOS and Windows have no os.sched_getaffinity: the settings (and the app) import and resolve without it."""
    code = (
        "import os\nfor name in ('sched_getaffinity', 'process_cpu_count'):\n    os.__dict__.pop(name, None)\n"
        "from inference.settings import Settings\nassert Settings().threads == (os.cpu_count() or 1)\n"
        "import inference.app\nprint('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_settings_errors_are_settings_errors(monkeypatch):
    monkeypatch.setenv("DEVICE", "tpu")
    with pytest.raises(SettingsError, match="DEVICE: must be auto, cpu or cuda"):
        from_env()


@pytest.mark.slow
def test_a_real_process_configured_by_environment_only(smoke_checkpoint):
    """MODEL_ID, MAX_CLIENT_BATCH_SIZE, AUTO_TRUNCATE, JSON_OUTPUT, CORS_ALLOW_ORIGIN and PORT from the
    environment, no flags: each one visible over HTTP or in the log."""
    port = free_port()
    env = cli_env(
        MODEL_ID=str(smoke_checkpoint),
        MAX_CLIENT_BATCH_SIZE="2",
        AUTO_TRUNCATE="false",
        JSON_OUTPUT="1",
        CORS_ALLOW_ORIGIN="https://app.example",
        PORT=str(port),
        DTYPE="float32",
        RELOAD_INTERVAL_S="0",
    )
    server = Server(None, env=env, port=port)
    try:
        server.wait_ready()
        batch = httpx.post(f"{server.url}/predict", json={"inputs": [["a"], ["b"], ["c"]]})
        assert batch.status_code == 422 and "maximum allowed batch size 2" in batch.json()["error"]
        long = httpx.post(f"{server.url}/predict", json={"inputs": "word " * 600})
        assert long.status_code == 422 and "must have less than 512 tokens" in long.json()["error"]
        cors = httpx.post(
            f"{server.url}/predict",
            json={"inputs": "a"},
            headers={"Origin": "https://app.example", "X-Request-Id": "trace-42"},
        )
        assert cors.headers["access-control-allow-origin"] == "https://app.example"
        assert cors.headers["x-request-id"] == "trace-42"
        assert httpx.get(f"{server.url}/info").json()["auto_truncate"] is False
    finally:
        output = server.stop()
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert any(line["message"].startswith("Ready:") and line["level"] == "INFO" for line in lines), output
    assert any(line["request_id"] == "trace-42" and "POST /predict" in line["message"] for line in lines), output
