"""Service settings, read from environment variables (and overridden by `python -m inference` flags)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields


def _env(name: str, default, cast):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid {cast.__name__}") from None


@dataclass
class Settings:
    checkpoint_dir: str = "checkpoints"
    """Folder written by training: distilbert_agnews.pt (or .safetensors), config.json, tokenizer/ (CHECKPOINT_DIR)."""
    api_key: str = ""
    """When set, /predict and /info need `Authorization: Bearer <key>` (API_KEY)."""
    max_client_batch_size: int = 32
    """Most texts one request may send (MAX_CLIENT_BATCH_SIZE)."""
    max_batch_size: int = 32
    """Most texts merged into one forward pass (MAX_BATCH_SIZE)."""
    max_wait_ms: float = 5.0
    """How long the first request of a micro-batch waits for company (MAX_WAIT_MS)."""
    max_queue_size: int = 512
    """Texts waiting for the model before new requests get 429 (MAX_QUEUE_SIZE)."""
    max_body_bytes: int = 2 * 1024 * 1024
    """Largest request body accepted; larger ones get 413 (MAX_BODY_BYTES)."""
    torch_threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    """Torch intra-op threads for the model (TORCH_THREADS; default: the cores available)."""
    precision: str = "auto"
    """fp32, bf16, or auto = bf16 where it is native (CPU AMX / AVX512-BF16, or a bf16 GPU), else fp32 (PRECISION)."""
    device: str = "auto"
    """cpu, cuda, or auto (DEVICE)."""
    reload_interval_s: float = 2.0
    """How often to look for a new checkpoint on disk; 0 disables reloading (RELOAD_INTERVAL_S)."""

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        defaults = cls()
        values = {}
        for f in fields(cls):
            default = getattr(defaults, f.name)
            values[f.name] = _env(f.name.upper(), default, type(default))
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        for name in ("max_client_batch_size", "max_batch_size", "max_queue_size", "max_body_bytes", "torch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_wait_ms < 0 or self.reload_interval_s < 0:
            raise ValueError("max_wait_ms and reload_interval_s must be >= 0")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16 (got {self.precision!r})")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda (got {self.device!r})")
