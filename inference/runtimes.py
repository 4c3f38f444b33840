"""Which runtime serves the model (PyTorch, OpenVINO in fp32, bf16 or int8, or ONNX Runtime in fp32 or int8) and the
converted model, produced once per weights hash.

    BACKEND=torch      the PyTorch model at DTYPE (auto: bf16 where native, fp16 on a GPU without bf16, else fp32)
    BACKEND=openvino   OpenVINO on the CPU at DTYPE: fp32, bf16, int8 (refused below the agreement bound: the next
                       precision serves), or auto: the fastest of them that agrees with fp32
    BACKEND=onnxruntime  the same with ONNX Runtime: fp32, int8 (dynamic quantization), or auto
    BACKEND=auto       on a GPU, torch; on a CPU, the fastest candidate of PyTorch and every installed optimized
                       runtime that agrees with fp32; PyTorch alone, said in one log line, when none is installed

Agreement: each candidate's argmax is compared with the PyTorch fp32 model's on held-out calibration texts (every
third text; the others calibrate int8) and must reach AGREEMENT_BOUND; candidates in fp32, the reference precision,
need no texts and are never refused. Speed:
texts/s over the first batches of those texts (synthetic ones when there are none), after every batch shape has run
once, best of two rounds with the candidates' order reversed between them. Calibration texts come from
CALIBRATION_FILE, else the checkpoint's calibration_texts.json (training records a sample of its training split).

    <checkpoint>/runtime/<sha256[:16]>/      or RUNTIME_CACHE/<sha256[:16]>/ when the folder cannot be written
        runtime.json                         per set of candidates (BACKEND, DTYPE): what was measured, the
                                             choice, and what they depend on
        openvino-fp32/model.xml (+ .bin)     the converted model
        openvino-int8-<texts digest>/...     quantized on those calibration texts
        onnxruntime-fp32/model.onnx          exported by torch.onnx.export
        onnxruntime-int8/model.onnx          quantized dynamically (no calibration texts)

A later start with the same weights, texts, CPU, thread count and library versions reads runtime.json and compiles
the chosen model without measuring again; folders of other weights beside the checkpoint are removed. Conversion
runs inside load_configured, so on hot reload it happens on the watcher's thread while the old model serves.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from filelock import FileLock

from inference import files, precision
from inference.engine import collate, encode
from inference.loading import LoadedModel, load_model
from inference.settings import BACKENDS, SettingsError, from_env

logger = logging.getLogger(__name__)

AUTO, TORCH, OPENVINO, ONNXRUNTIME = BACKENDS
OPTIMIZED = (OPENVINO, ONNXRUNTIME)  # in auto's order of preference among equals
_NEEDS = {OPENVINO: ("openvino", "nncf"), ONNXRUNTIME: ("onnxruntime", "onnx", "onnxscript")}
_MODEL_FILE = {OPENVINO: files.RUNTIME_MODEL, ONNXRUNTIME: files.RUNTIME_ONNX}
AGREEMENT_BOUND = 0.995
MIN_HELD_OUT = 50  # fewer held-out texts cannot show 99.5 %
MAX_CALIBRATION, MAX_HELD_OUT, BATCH = 300, 200, 32
TIMED_BATCHES = 4  # the speed race: 128 held-out texts per round
INSTALL_HINT = "pip install 'distilbert-agnews[openvino]' or '[onnxruntime]'"


@dataclass(frozen=True)
class Candidate:
    backend: str
    precision: str

    @property
    def name(self) -> str:
        return f"{self.backend} {self.precision}"


def installed(backend: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in _NEEDS[backend])


def candidates(backend: str, dtype: str, device_type: str) -> tuple[list[Candidate], str]:
    """The runtimes and precisions to consider, in order of preference, and why these."""
    if backend in OPTIMIZED:
        if not installed(backend):
            raise SettingsError(f"BACKEND: {backend} is not installed (pip install 'distilbert-agnews[{backend}]')")
        if device_type != "cpu":
            raise SettingsError(f"BACKEND: {backend} serves on the CPU; set DEVICE=cpu, or BACKEND=torch for the GPU")
        return _options(backend, dtype), f"BACKEND={backend}"
    present = [b for b in OPTIMIZED if installed(b)]
    if backend == AUTO and device_type == "cpu" and present:
        # an explicit bfloat16 leaves out a runtime that has no bf16 path; the others serve it
        usable = [b for b in present if dtype != precision.BF16 or precision.BF16 in _PRECISIONS[b]]
        options = [c for b in usable for c in _options(b, dtype)]
        if dtype == precision.INT8:
            options.sort(key=lambda c: c.precision != precision.INT8)  # every int8 first, then the fallbacks
        else:
            options.append(Candidate(TORCH, precision.resolve(dtype, device_type)))
        return options, f"BACKEND=auto on a CPU with {' and '.join(present)} installed"
    if dtype == precision.INT8 and (backend == TORCH or device_type != "cpu"):
        raise SettingsError(
            "DTYPE: int8 needs an optimized CPU runtime (BACKEND=openvino or onnxruntime, or auto on a CPU)"
        )
    why = "BACKEND=torch" if backend == TORCH else "BACKEND=auto on a GPU"
    if backend == AUTO and device_type == "cpu":
        why = f"BACKEND=auto: no optimized CPU runtime is installed ({INSTALL_HINT})"
        dtype = precision.AUTO if dtype == precision.INT8 else dtype
    return [Candidate(TORCH, precision.resolve(dtype, device_type))], why


_PRECISIONS = {
    OPENVINO: (precision.INT8, precision.BF16, precision.FP32),
    ONNXRUNTIME: (precision.INT8, precision.FP32),
}


def _options(backend: str, dtype: str) -> list[Candidate]:
    """One runtime's candidates at DTYPE: that precision alone, or (auto, int8) its precisions in preference order."""
    if dtype == precision.FP16:
        raise SettingsError(f"DTYPE: float16 is for GPUs; {backend} on the CPU serves {_names(backend)}")
    if dtype != precision.AUTO and dtype not in _PRECISIONS[backend]:
        raise SettingsError(f"DTYPE: {backend} on the CPU serves {_names(backend)}")
    if dtype in (precision.FP32, precision.BF16):
        return [Candidate(backend, dtype)]
    native = precision.native_bf16("cpu")
    return [Candidate(backend, p) for p in _PRECISIONS[backend] if p != precision.BF16 or native]


def _names(backend: str) -> str:
    return ", ".join(precision.tei_name(p) for p in _PRECISIONS[backend])


def races(backend: str, dtype: str) -> bool:
    """Speed decides among agreeing candidates (else the first agreeing one in order serves)."""
    return dtype == precision.AUTO or (backend == AUTO and dtype != precision.INT8)


def prepare(loaded: LoadedModel, settings) -> LoadedModel:
    """`loaded` (PyTorch fp32) made ready in the chosen runtime and precision, with what was measured."""
    options, why = candidates(settings.backend, settings.dtype, loaded.device.type)
    if len(options) == 1 and options[0].backend == TORCH:
        logger.info("Runtime: torch %s (%s)", options[0].precision, why)
        return _as_torch(loaded, options[0].precision, None)
    texts, source = calibration_texts(loaded.folder, settings.calibration_file)
    cache = cache_folder(loaded, settings.runtime_cache)
    torch.set_num_threads(settings.torch_threads)
    key = _cache_key(loaded, texts, options, settings.torch_threads)
    with FileLock(str(cache.parent / f"{cache.name}.lock")):  # --workers N: one converts, the others read
        report = _read_report(cache, key)
        if report is None:
            logger.info("Runtime: measuring %s (%s; texts: %s)", ", ".join(c.name for c in options), why, source)
            report = measure(loaded, options, texts, cache, settings.torch_threads)
            report["chosen"] = choose(report["candidates"], races(settings.backend, settings.dtype))
            report["key"] = key
            _write_report(cache, report)
        served = _build_chosen(loaded, report, cache, settings.torch_threads)
    _prune_siblings(loaded, cache)
    return served


def export(folder: Path, backend: str) -> LoadedModel:
    """Training's --export_runtime: convert and measure now, for the service's default settings (BACKEND=auto,
    DTYPE=auto on this CPU), so its first start only compiles."""
    if backend not in OPTIMIZED:
        raise ValueError(f"export_runtime: unknown runtime {backend!r}")
    if not installed(backend):
        raise SettingsError(f"export_runtime: {backend} is not installed (pip install 'distilbert-agnews[{backend}]')")
    settings = from_env(model_id=str(folder), backend=AUTO, dtype=precision.AUTO, device="cpu")
    return prepare(load_model(str(folder), device="cpu", dtype=precision.FP32), settings)


def choose(measured: list[dict], race: bool) -> str:
    """The candidate to serve: the fastest agreeing one when racing, else the first agreeing one."""
    agreeing = [m for m in measured if m["refused"] is None]
    if not agreeing:
        raise RuntimeError("no runtime candidate agrees with fp32")  # fp32 ones are never refused: a bug
    chosen = max(agreeing, key=lambda m: m["texts_per_s"]) if race else agreeing[0]
    for m in measured:
        mark = "*" if m is chosen else " "
        detail = f"agreement {_percent(m['agreement'])}, {m['texts_per_s']:.1f} texts/s"
        detail = f"{m['refused']} ({m['texts_per_s']:.1f} texts/s)" if m["refused"] else detail
        logger.info("Runtime %s %-14s %s", mark, m["name"], detail)
    return chosen["name"]


def _percent(value: float | None) -> str:
    return "not measured (fp32)" if value is None else f"{100 * value:.2f} %"


# ------------------------------------------------------------------------------------------- calibration texts


def calibration_texts(folder: Path, calibration_file: str | None) -> tuple[list[str], str]:
    """Real texts for int8 calibration and the agreement check, and where they came from ([] when none)."""
    if calibration_file:
        return _read_texts(Path(calibration_file)), f"CALIBRATION_FILE {calibration_file}"
    recorded = folder / files.CALIBRATION
    if recorded.is_file():
        return _read_texts(recorded), str(recorded)
    return [], f"none (set CALIBRATION_FILE, or train with this version: it records {files.CALIBRATION})"


def _read_texts(path: Path) -> list[str]:
    """Texts of a .txt (one per line), .jsonl or .csv (a `text` column) or .json (a list, or {"texts": [...]})."""
    try:
        raw = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(raw)
            texts = data["texts"] if isinstance(data, dict) else data
        elif path.suffix == ".jsonl":
            texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
        elif path.suffix == ".csv":
            texts = [row["text"] for row in csv.DictReader(raw.splitlines())]
        else:
            texts = raw.splitlines()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SettingsError(f"CALIBRATION_FILE: {path}: cannot read texts ({type(exc).__name__}: {exc})") from None
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise SettingsError(f"CALIBRATION_FILE: {path}: holds no texts")
    return texts


def split(texts: list[str]) -> tuple[list[str], list[str]]:
    """(calibration, held out): every third text is held out for the agreement check."""
    held = texts[::3][:MAX_HELD_OUT]
    calibration = [t for i, t in enumerate(texts) if i % 3][:MAX_CALIBRATION]
    return calibration, held


# ------------------------------------------------------------------------------------------------ the cache


def cache_folder(loaded: LoadedModel, cache_root: str) -> Path:
    """<checkpoint>/runtime/<sha16> for a local folder we can write, else <RUNTIME_CACHE>/<sha16>."""
    name = loaded.sha256[:16]
    if loaded.model_sha is None:
        beside = loaded.folder / files.RUNTIME_DIR / name
        try:
            beside.mkdir(parents=True, exist_ok=True)
            probe = beside / f".probe.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
            return beside
        except OSError:
            pass
    folder = Path(cache_root).expanduser() / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"RUNTIME_CACHE: cannot create {folder} ({exc.strerror})") from None
    return folder


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def _digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12] if texts else "none"


def _cache_key(loaded: LoadedModel, texts: list[str], options: list[Candidate], threads: int) -> dict:
    backends = sorted({c.backend for c in options} - {TORCH})
    return {
        "sha256": loaded.sha256,
        "texts": _digest(texts),
        "options": [c.name for c in options],
        "cpu": cpu_name(),
        "threads": threads,
        **{b: _module(b).version() for b in backends},
        "torch": torch.__version__,
    }


def _reports(cache: Path) -> list[dict]:
    """runtime.json: one report per set of settings measured (BACKEND and DTYPE decide the candidates)."""
    try:
        data = json.loads((cache / files.RUNTIME_CHOICE).read_text())
    except (OSError, ValueError):
        return []
    return [r for r in data.get("reports", []) if isinstance(r, dict)] if isinstance(data, dict) else []


def _read_report(cache: Path, key: dict) -> dict | None:
    found = next((r for r in _reports(cache) if r.get("key") == key), None)
    if found is None:
        logger.info("Runtime: no measurement in %s for these weights, texts, settings, CPU and versions", cache)
    return found


def _write_report(cache: Path, report: dict) -> None:
    """Replaces the report for the same candidates, keeps the others; atomic (written, then renamed)."""
    options = report["key"]["options"]
    reports = [r for r in _reports(cache) if r.get("key", {}).get("options") != options] + [report]
    staging = cache / f".{files.RUNTIME_CHOICE}.{os.getpid()}"
    staging.write_text(json.dumps({"reports": reports}, indent=2))
    os.replace(staging, cache / files.RUNTIME_CHOICE)


def _prune_siblings(loaded: LoadedModel, cache: Path) -> None:
    """Beside the checkpoint only its current weights matter: older conversions would fill the disk."""
    if cache.parent != loaded.folder / files.RUNTIME_DIR:
        return
    for other in cache.parent.iterdir():
        if other.is_dir() and other.name != cache.name:
            shutil.rmtree(other, ignore_errors=True)
            (cache.parent / f"{other.name}.lock").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ measuring, building


def measure(loaded: LoadedModel, options: list[Candidate], texts: list[str], cache: Path, threads: int) -> dict:
    """Agreement with PyTorch fp32 (on held-out texts) and texts/s of each candidate."""
    calibration, held = split(texts)
    real = len(held) >= MIN_HELD_OUT
    batches = _batches(loaded, held) if real else _synthetic_batches(loaded)
    fp32 = _torch_runner(loaded.model)
    reference = [fp32(b) for b in batches]
    results, runners = {}, {}
    for candidate in options:
        refused = _cannot_check(candidate, held, calibration)
        if refused:
            results[candidate] = {"name": candidate.name, "refused": refused, "agreement": None, "texts_per_s": 0.0}
            continue
        run = (
            fp32
            if candidate == Candidate(TORCH, precision.FP32)
            else _runner(loaded, candidate, cache, threads, calibration)
        )
        # every batch shape once (first-shape set-up is not speed), and the answers; torch fp32 gave them already
        outputs = reference if run is fp32 else [run(b) for b in batches]
        same = sum(int((o.argmax(-1) == r.argmax(-1)).sum()) for o, r in zip(outputs, reference))
        results[candidate] = _verdict(candidate, same / sum(len(r) for r in reference) if real else None, 0.0)
        if candidate.backend != TORCH:
            results[candidate]["ir"] = _ir_folder(cache, candidate, calibration).name
        runners[candidate] = run
    for candidate, speed in _speeds(runners, batches[:TIMED_BATCHES]).items():
        results[candidate]["texts_per_s"] = speed
    return {"candidates": list(results.values()), "held_out_texts": len(held), "calibration_texts": len(calibration)}


def _speeds(runners: dict, batches: list[dict], rounds: int = 2) -> dict:
    """texts/s of each runner, best of `rounds` passes over the same (warm) batches, the order reversed from one
    round to the next: a noisy neighbour or a slow start then favours no candidate."""
    texts = sum(len(b["input_ids"]) for b in batches)
    best = dict.fromkeys(runners, 0.0)
    order = list(runners)
    for _ in range(rounds):
        for candidate in order:
            started = time.perf_counter()
            for batch in batches:
                runners[candidate](batch)
            best[candidate] = max(best[candidate], texts / (time.perf_counter() - started))
        order.reverse()
    return best


def _cannot_check(candidate: Candidate, held: list[str], calibration: list[str]) -> str | None:
    if candidate.precision == precision.FP32 or len(held) >= MIN_HELD_OUT:
        return None
    return (
        f"refused: {len(held)} held-out texts, {MIN_HELD_OUT} needed to check agreement "
        "(give CALIBRATION_FILE with 150 or more texts)"
    )


def _verdict(candidate: Candidate, agreement: float | None, speed: float) -> dict:
    refused = None  # fp32 is the reference precision: its agreement is reported, never refused
    if agreement is not None and agreement < AGREEMENT_BOUND and candidate.precision != precision.FP32:
        refused = f"refused: agreement {_percent(agreement)} < {_percent(AGREEMENT_BOUND)} with fp32"
    return {"name": candidate.name, "refused": refused, "agreement": agreement, "texts_per_s": speed}


def _batches(loaded: LoadedModel, texts: list[str]) -> list[dict]:
    features = encode(loaded, [(t, None) for t in texts], truncate=True, left=False)
    pad = loaded.tokenizer.pad_token_id
    return [collate(features[i : i + BATCH], pad) for i in range(0, len(features), BATCH)]


def _synthetic_batches(loaded: LoadedModel) -> list[dict]:
    """For speed alone: random token ids at a typical news-text length."""
    generator = torch.Generator().manual_seed(0)
    vocab = loaded.tokenizer.vocab_size
    ids = torch.randint(1000 % vocab, vocab, (4, BATCH, 64), generator=generator)
    batches = [{"input_ids": i, "attention_mask": torch.ones_like(i)} for i in ids]
    if "token_type_ids" in loaded.tokenizer.model_input_names:
        for batch in batches:
            batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return batches


def _torch_runner(model: torch.nn.Module):
    def run(batch: dict) -> torch.Tensor:
        with torch.inference_mode():
            return model(**batch).logits.float()

    return run


def _runner(loaded: LoadedModel, candidate: Candidate, cache: Path, threads: int, calibration: list[str]):
    if candidate.backend == TORCH:
        return _torch_runner(copy.deepcopy(loaded.model).to(precision.torch_dtype(candidate.precision)))
    return _module(candidate.backend).Runner(_ir(loaded, candidate, cache, calibration), candidate.precision, threads)


def _module(backend: str):
    """The runtime's module (imported only when it serves or is measured): version(), Runner(path, precision,
    threads)."""
    if backend == OPENVINO:
        from inference import openvino_runtime

        return openvino_runtime
    from inference import onnx_runtime

    return onnx_runtime


def _ir_folder(cache: Path, candidate: Candidate, calibration: list[str]) -> Path:
    if candidate.backend == ONNXRUNTIME:
        return cache / f"onnxruntime-{candidate.precision}"  # dynamic int8: no calibration texts
    if candidate.precision == precision.INT8:
        return cache / f"openvino-int8-{_digest(calibration)}"
    return cache / "openvino-fp32"  # bf16 is a compile-time hint on the same IR


def _ir(loaded: LoadedModel, candidate: Candidate, cache: Path, calibration: list[str]) -> Path:
    """The candidate's converted model (quantized for int8) unless an earlier start left it."""
    folder = _ir_folder(cache, candidate, calibration)
    if (folder / _MODEL_FILE[candidate.backend]).is_file():
        return folder / _MODEL_FILE[candidate.backend]
    started = time.perf_counter()
    # traced on a text pair: every input the tokenizer gives (a BERT's token_type_ids too) becomes a model input
    example = collate(encode(loaded, [("an example text", "and its pair")], True, False), loaded.tokenizer.pad_token_id)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    if candidate.backend == OPENVINO:
        _convert_openvino(loaded, example, candidate.precision == precision.INT8, calibration, staging)
    else:
        _module(ONNXRUNTIME).build(loaded.model, example, candidate.precision == precision.INT8, staging)
    os.replace(staging, folder)
    logger.info("Runtime: converted %s in %.1f s into %s", candidate.name, time.perf_counter() - started, folder)
    return folder / _MODEL_FILE[candidate.backend]


def _convert_openvino(loaded: LoadedModel, example: dict, int8: bool, calibration: list[str], staging: Path) -> None:
    from inference import openvino_runtime

    model = openvino_runtime.convert(loaded.model, example)
    if int8:
        names = openvino_runtime.input_names(model)  # what the model takes (a BERT tokenizer's token_type_ids
        samples = [{k: b[k].numpy() for k in names} for b in _batches_of_one(loaded, calibration)]  # may not be)
        model = openvino_runtime.quantize(model, samples)
    openvino_runtime.save(model, staging)


def _batches_of_one(loaded: LoadedModel, texts: list[str]) -> list[dict]:
    features = encode(loaded, [(t, None) for t in texts], truncate=True, left=False)
    return [collate([f], loaded.tokenizer.pad_token_id) for f in features]


def _build_chosen(loaded: LoadedModel, report: dict, cache: Path, threads: int) -> LoadedModel:
    chosen = next(m for m in report["candidates"] if m["name"] == report["chosen"])
    backend, chosen_precision = chosen["name"].split()
    summary = {
        "backend": backend,
        "precision": chosen_precision,
        "agreement": chosen["agreement"],
        "held_out_texts": report["held_out_texts"],
        "candidates": report["candidates"],
    }
    if backend == TORCH:
        return _as_torch(loaded, chosen_precision, summary)
    xml = cache / chosen["ir"] / _MODEL_FILE[backend]
    runner = _module(backend).Runner(xml, chosen_precision, threads)
    logger.info(
        "Runtime: serving %s from %s (agreement with fp32 %s, %.1f texts/s when measured)",
        chosen["name"],
        xml.parent,
        _percent(chosen["agreement"]),
        chosen["texts_per_s"],
    )
    return replace(loaded, model=None, runner=runner, backend=backend, precision=chosen_precision, runtime=summary)


def _as_torch(loaded: LoadedModel, torch_precision: str, summary: dict | None) -> LoadedModel:
    model = loaded.model.to(precision.torch_dtype(torch_precision))
    if summary is None:
        summary = {"backend": TORCH, "precision": torch_precision, "agreement": None, "candidates": []}
    return replace(loaded, model=model, precision=torch_precision, backend=TORCH, runtime=summary)
