"""Service settings: one pydantic-settings model read from the environment and, for `python -m inference`, from flags of
the same names. TEI's names are accepted as they are.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from contract import precision
from contract.cpu import available_cores
from contract.errors import UsageError
from contract.runtimes import AGREEMENT_BOUND, RUNTIMES

BACKENDS = (
    "auto",
    "torch",
    *RUNTIMES,
)  # what serves the model: inference/runtimes/choice.py chooses, contract/runtimes.py declares


def _names(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class SettingsError(UsageError, ValueError):
    """A bad setting; names its variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=False,
        extra="ignore",
        env_ignore_empty=True,
        populate_by_name=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        cli_hide_none_type=True,
        use_attribute_docstrings=True,  # each setting's documentation is its docstring (--help, docs)
    )

    model_id: str = Field("checkpoints", validation_alias=_names("model_id", "checkpoint_dir"))
    """What to serve: this project's checkpoint folder (distilbert_agnews.pt + config.json + tokenizer/), any
    save_pretrained folder (model.safetensors + config.json + tokenizer files), or a Hub model id [MODEL_ID,
    CHECKPOINT_DIR]
    """
    served_model_name: str | None = None
    """The model's name for clients that name one (`model` in vLLM's classify and Cohere's rerank, the KServe v2
    model name) and in /info and /v1/models; default: MODEL_ID (TEI's --served-model-name) [SERVED_MODEL_NAME]
    """
    lora_adapters: Annotated[list[str], NoDecode] = []
    """More LoRA adapters of MODEL_ID's base, served beside it on one copy of that base: name=folder, comma-separated
    or the flag repeated (vLLM's --lora-modules). A request picks one by its `model` (vLLM's classify, Cohere's
    rerank, the KServe v2 model name); TEI's routes answer MODEL_ID. MODEL_ID must then be an adapter too (a LoRA
    run's checkpoint or a peft folder) [LORA_ADAPTERS]
    """
    flag_labels: Annotated[list[str], NoDecode] = []
    """Labels whose decision flags an input on OpenAI's moderation route (/v1/moderations), comma-separated; default:
    every label of a multi-label model, every label but NEGATIVE_LABEL of a single-label one [FLAG_LABELS]
    """
    negative_label: str | None = None
    """A single-label model's label that flags nothing on /v1/moderations (`safe`, `none`, `ok`) [NEGATIVE_LABEL]"""
    revision: str | None = None
    """Hub revision (branch, tag or commit) of a Hub model id [REVISION]"""
    hostname: str = Field("127.0.0.1", validation_alias=_names("hostname", "host"))
    """Address to listen on; 0.0.0.0 for every interface [HOSTNAME]"""
    port: int = Field(8000, ge=0, le=65535)
    """Port to listen on [PORT]"""
    workers: int = Field(1, ge=1)
    """Front-end processes (uvicorn's workers: HTTP, JSON, checks), all linked to one engine process that holds the
    model and batches for every one of them; 1: the engine and the routes in one process [WORKERS]
    """
    api_key: str | None = None
    """When set, every route needs `Authorization: Bearer <key>` but these, open as in TEI: GET /health, /ping,
    GET /, /ready, /metrics, KServe's /v2/health/live and /v2/health/ready, and the API's description /docs,
    /docs/oauth2-redirect, /redoc and /openapi.json.
    Printable ASCII without spaces (HTTP headers carry ASCII) [API_KEY]
    """
    payload_limit: int = Field(2_000_000, ge=1)
    """Largest request body in bytes; larger ones get 413 [PAYLOAD_LIMIT]"""
    max_concurrent_requests: int = Field(512, ge=1)
    """Inputs (texts or pairs) in flight at once; beyond it requests get 429 [MAX_CONCURRENT_REQUESTS]"""
    max_batch_tokens: int = Field(16384, ge=1)
    """Most tokens in one micro-batch and in one forward pass (padding included); at least the model's maximum input
    length [MAX_BATCH_TOKENS]
    """
    max_batch_requests: int = Field(32, ge=1)
    """Most inputs in one micro-batch [MAX_BATCH_REQUESTS]"""
    max_client_batch_size: int = Field(32, ge=1)
    """Most inputs in one request [MAX_CLIENT_BATCH_SIZE]"""
    auto_truncate: bool = True
    """Truncate inputs longer than the model's maximum when a request does not say (`truncate` absent or null)
    [AUTO_TRUNCATE]
    """
    long_text: Literal["truncate", "chunk"] | None = None
    """Inputs longer than the model's window: truncate (TEI's behaviour: `truncate` and AUTO_TRUNCATE decide between
    cutting and refusing) or chunk: overlapping windows, each scored, their logits pooled as config.json's
    chunk_pooling says; a request's `truncate: true` still truncates. Default: the model's config.json long_text,
    else truncate [LONG_TEXT]
    """
    max_chunks: int = Field(16, ge=1)
    """With chunking, the most windows one input may need; beyond it 413 [MAX_CHUNKS]"""
    dtype: str = Field(
        "auto",
        validation_alias=_names("dtype", "precision"),
        description=(
            "float32, float16, bfloat16 (or fp32, fp16, bf16), int8 (OpenVINO on the CPU, kept only if it agrees "
            f"with fp32 on {100 * AGREEMENT_BOUND:g} percent or more of held-out texts), or auto: with BACKEND torch, "
            "bfloat16 where native (bf16 GPUs, CPUs with AMX or AVX512-BF16), float16 on GPUs without bf16 (T4), else "
            "float32; with "
            "OpenVINO, the fastest precision that agrees [DTYPE]"
        ),
    )
    backend: str = "auto"
    """torch, openvino or onnxruntime (pip install 'distilbert-agnews[openvino]' or '[onnxruntime]'), or auto: on a
    CPU the fastest installed runtime whose answers agree with fp32, measured once per weights hash; torch on a
    GPU [BACKEND]
    """
    measure_in_background: bool = True
    """With BACKEND=auto (or a runtime at DTYPE=auto) and no choice recorded yet for these weights: start serving
    PyTorch fp32 at once and convert and measure the candidates on a background thread, the chosen runtime swapped in
    when ready (/info's runtime says `provisional` until then); false: measure before the first answer
    [MEASURE_IN_BACKGROUND]
    """
    calibration_file: str | None = None
    """Texts for int8 calibration and the agreement check (.txt one per line, .jsonl/.csv with a `text` field, .json
    list); default: the checkpoint's calibration_texts.json [CALIBRATION_FILE]
    """
    agreement_with: str | None = None
    """The model this one replaces (a distilled student's teacher): at start and every reload both score the
    student's held-out texts (its distillation.json, else the calibration texts) and a model keeping under
    MIN_AGREEMENT of its decisions is refused, the current one serving on [AGREEMENT_WITH]
    """
    min_agreement: float = Field(0.98, gt=0, le=1)
    """With AGREEMENT_WITH: the share of the teacher's clear decisions the served model must keep [MIN_AGREEMENT]"""
    runtime_cache: str = "~/.cache/distilbert-agnews/runtime"
    """Where converted models go when the checkpoint folder cannot be written (a Hub model, a read-only folder);
    otherwise they go beside the checkpoint in runtime/ [RUNTIME_CACHE]
    """
    device: str = "auto"
    """cpu, cuda, or auto: cuda when available [DEVICE]"""
    json_output: bool = False
    """Log one JSON object per line instead of text [JSON_OUTPUT]"""
    prometheus_port: int | None = Field(None, ge=0, le=65535)
    """Also serve GET /metrics on this port, every worker's metrics, for a scraper inside the cluster (TEI's
    --prometheus-port; unset: no second port) [PROMETHEUS_PORT]
    """
    api_metrics: bool = True
    """Serve GET /metrics on the API port too; false keeps the metrics off the public port (with PROMETHEUS_PORT)
    [API_METRICS]
    """
    otlp_endpoint: str | None = None
    """OpenTelemetry collector to export one span per request to, over OTLP/HTTP (e.g. http://collector:4318;
    TEI's setting, which speaks gRPC to 4317); needs `pip install 'distilbert-agnews[telemetry]'`; unset: no tracing
    and no cost [OTLP_ENDPOINT]
    """
    otlp_service_name: str = "distilbert-agnews.server"
    """The service.name of the exported spans [OTLP_SERVICE_NAME]"""
    cors_allow_origin: str | None = None
    """Comma-separated origins allowed by CORS (browser clients), or * for any; unset: no CORS headers
    [CORS_ALLOW_ORIGIN]
    """
    max_wait_ms: float = Field(5.0, ge=0)
    """How long a micro-batch waits for company, only while requests arrive together [MAX_WAIT_MS]"""
    static_shapes: bool | None = None
    """Pad each forward pass to one of a few fixed (batch, width) shapes and, on CUDA with the torch runtime, capture
    each shape's forward pass as a CUDA graph at start-up (and on reload). Default: on with CUDA, off on the CPU,
    where padding costs compute [STATIC_SHAPES]
    """
    tokenizer_thread: bool | None = None
    """Gather the engine's micro-batches on a thread of their own, ahead of the model, instead of on the model's
    thread between forward passes (the front-ends tokenize). Default: on with CUDA, where it overlaps the GPU's
    work; off on the CPU, where it would compete with the forward pass for the cores [TOKENIZER_THREAD]
    """
    torch_threads: int | None = Field(None, ge=1)
    """Torch intra-op threads (default: `python -m inference` takes the cores other programs leave free at start-up,
    else every core available) [TORCH_THREADS]
    """
    _free_cores: int | None = PrivateAttr(None)  # what `python -m inference` found free at start-up
    reload_interval_s: float = Field(2.0, ge=0)
    """How often to look for a new checkpoint in a local MODEL_ID folder; 0 never [RELOAD_INTERVAL_S]"""
    max_connections: int = Field(2048, ge=1)
    """Open connections and tasks uvicorn allows at once (its limit_concurrency); beyond it new requests get 503 at
    once, so idle or slow connections cannot pile up without bound [MAX_CONNECTIONS]
    """
    read_timeout_s: float = Field(30.0, gt=0)
    """Seconds a client has to send a whole request, head and body, from its connection (or, kept alive, from its
    next request's first byte); past it the connection is closed, so slow clients cannot hold connections
    [READ_TIMEOUT_S]
    """
    write_timeout_s: float = Field(30.0, gt=0)
    """Seconds an answer may wait for a client that does not read it (the connection's send buffer full); past it
    the connection is closed and what the request held (its inputs in flight) is given back [WRITE_TIMEOUT_S]
    """
    keep_alive_timeout_s: float = Field(5.0, gt=0)
    """Seconds an idle keep-alive connection stays open [KEEP_ALIVE_TIMEOUT_S]"""
    graceful_shutdown_s: float = Field(30.0, gt=0)
    """After SIGTERM, how long in-flight requests may run before they are cancelled; keep it below the orchestrator's
    kill timeout (Kubernetes terminationGracePeriodSeconds) [GRACEFUL_SHUTDOWN_S]
    """

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return precision.canonical(value, serving=True)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value.strip().lower() not in BACKENDS:
            raise ValueError(f"must be {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}")
        return value.strip().lower()

    @field_validator("api_key")
    @classmethod
    def _ascii_key(cls, value: str | None) -> str | None:
        if value is not None and not (value.isascii() and value.isprintable() and " " not in value):
            raise ValueError(
                "must be printable ASCII without spaces: an HTTP header carries ASCII, so any other key could never "
                "be matched"
            )
        return value

    @field_validator("lora_adapters", "flag_labels", mode="before")
    @classmethod
    def _split(cls, value) -> list[str]:
        """Comma-separated, or the flag repeated."""
        items = [value] if isinstance(value, str) else value or []
        return [part.strip() for item in items for part in str(item).split(",") if part.strip()]

    @field_validator("lora_adapters")
    @classmethod
    def _named_adapters(cls, value: list[str]) -> list[str]:
        names = []
        for item in value:
            name, _, folder = item.partition("=")
            if not name.strip() or not folder.strip():
                raise ValueError(f"each adapter is name=folder, got {item!r}")
            names.append(name.strip())
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"the name {twice[0]!r} is given twice; each adapter needs its own")
        return value

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if value not in ("auto", "cpu", "cuda"):
            raise ValueError("must be auto, cpu or cuda")
        return value

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        if self.max_client_batch_size > self.max_concurrent_requests:
            raise ValueError(
                f"MAX_CLIENT_BATCH_SIZE: {self.max_client_batch_size} is above MAX_CONCURRENT_REQUESTS "
                f"({self.max_concurrent_requests}): a batch that large would always be answered 429; lower it or "
                "raise MAX_CONCURRENT_REQUESTS"
            )
        if not self.api_metrics and self.prometheus_port is None:
            raise ValueError("API_METRICS: false needs PROMETHEUS_PORT, or the metrics would be served nowhere")
        if self.prometheus_port is not None and self.prometheus_port == self.port != 0:
            raise ValueError(f"PROMETHEUS_PORT: {self.prometheus_port} is the API's PORT; pick another")
        if self.model_name in self.adapters():
            raise ValueError(
                f"LORA_ADAPTERS: {self.model_name!r} is MODEL_ID's name (SERVED_MODEL_NAME, else MODEL_ID); give the "
                "adapter another"
            )
        if self.adapters() and self.backend not in ("auto", "torch"):
            raise ValueError(
                f"BACKEND: {self.backend} cannot serve LORA_ADAPTERS: adapters share the base's torch weights, which a "
                "converted model does not hold; use BACKEND=torch (or auto)"
            )
        return self

    @property
    def threads(self) -> int:
        """The intra-op threads to serve with: TORCH_THREADS, else the cores found free, else every core."""
        return self.torch_threads or self._free_cores or available_cores()

    @property
    def measured_threads(self) -> int:
        """The threads a runtime's recorded speed is keyed by: TORCH_THREADS, else the machine's cores (how busy the
        cores were at a start does not make a conversion another)."""
        return self.torch_threads or available_cores()

    def use_free_cores(self, cores: int) -> None:
        self._free_cores = cores

    def adapters(self) -> dict[str, str]:
        """LORA_ADAPTERS as {name: folder}."""
        return dict((part.strip() for part in item.partition("=")[::2]) for item in self.lora_adapters)

    @property
    def model_name(self) -> str:
        """What clients name the served model (SERVED_MODEL_NAME, else MODEL_ID)."""
        return self.served_model_name or self.model_id

    @property
    def cors_origins(self) -> list[str]:
        return [o.strip() for o in (self.cors_allow_origin or "").split(",") if o.strip()]

    def environment(self) -> dict[str, str]:
        """The settings as environment variables, for workers."""
        said = {
            name: ",".join(value) if isinstance(value, list) else value for name, value in self.model_dump().items()
        }
        return {name.upper(): str(value) for name, value in said.items() if value is not None and value != ""}


def describe_error(exc: ValidationError) -> str:
    """One line naming the setting."""
    first = exc.errors()[0]
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    name = ".".join(str(p) for p in first.get("loc", ())).upper()
    if not name:  # a check across settings: its message names them
        return message
    shown = "input" in first and not isinstance(first["input"], dict) and name != "API_KEY"  # a secret stays out
    got = f" (got {first['input']!r})" if shown else ""
    return f"{name}: {message}{got}"


def from_env(**overrides) -> Settings:
    """Settings from the environment."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(describe_error(exc)) from None
