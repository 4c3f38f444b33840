"""Which runtime serves the model (PyTorch, OpenVINO in fp32, bf16 or int8, or ONNX Runtime in fp32 or int8) and the
converted model, produced once per weights hash.

    BACKEND=torch      the PyTorch model at DTYPE (auto: bf16 where native, fp16 on a GPU without bf16, else fp32)
    BACKEND=openvino   OpenVINO on the CPU at DTYPE: fp32, bf16, int8 (refused below the agreement bound: the next
                       precision serves), or auto: the fastest of them that agrees with fp32
    BACKEND=onnxruntime  the same with ONNX Runtime: fp32, int8 (dynamic quantization), or auto
    BACKEND=auto       on a GPU, torch; on a CPU, the fastest candidate of PyTorch and every installed optimized
                       runtime that agrees with fp32; PyTorch alone, said in one log line, when none is installed

Agreement: each candidate's decisions are compared with the PyTorch fp32 model's on held-out calibration texts
(every third text; the others calibrate int8) and must reach AGREEMENT_BOUND: by the model's problem type
(`agreement`), the argmax (single-label), each label's thresholded decision (multi-label and one-logit models), or
the value within a bound relative to the outputs' spread (regression); fp32's near-ties are left out (any rounding
may turn them), and at least MIN_HELD_OUT decisions are needed. Candidates in fp32, the reference precision, need no
texts and are never refused. Speed: texts/s over the first batches of those texts, after every batch shape has run
once, best of two rounds with the candidates' order reversed between them. Calibration texts come from
CALIBRATION_FILE, else the checkpoint's calibration_texts.json (training records a sample of its training split),
else the English sample shipped in inference/texts/ (any save_pretrained folder or Hub model); /info names them.

Each optimized runtime is declared once in contract/backends.py (what it needs, its precisions, its build and runner,
in its own module); this dispatcher holds no runtime's own code. The converted models and runtime.json live beside
the checkpoint or in RUNTIME_CACHE (inference/runtime_cache.py):

    <checkpoint>/runtime/<sha256[:16]>/      or RUNTIME_CACHE/<sha256[:16]>/
        runtime.json                         per set of candidates (BACKEND, DTYPE): what was measured, the
                                             choice, what they depend on; the digest of every converted file
        openvino-fp32/model.xml (+ .bin)     the converted model
        openvino-int8-<texts digest>/...     quantized on those calibration texts
        onnxruntime-fp32/model.onnx          exported by torch.onnx.export
        onnxruntime-int8/model.onnx          quantized dynamically (no calibration texts)

A later start with the same weights, texts, CPU, thread count and library versions reads runtime.json and compiles
the chosen model without measuring again, once its files match their recorded digests; it writes nothing, so a
read-only deployment starts. A missing or altered file is named in a warning and never served: it is converted and
measured again, or, where nothing can be written, the fastest other agreeing candidate whose files verify serves.
Conversion runs inside load_configured, so on hot reload it happens on the watcher's thread while the old model serves.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from contract import files, precision
from contract.backends import AGREEMENT_BOUND, RUNTIMES, Runtime
from contract.loading import LoadedModel, load_model
from contract.model_call import collate
from contract.task import Task
from inference import runtime_cache
from inference.engine import encode
from inference.runtime_cache import Cache
from inference.settings import BACKENDS, SettingsError, from_env

logger = logging.getLogger(__name__)

AUTO, TORCH, *OPTIMIZED = BACKENDS  # the optimized runtimes in auto's order among equals (contract/backends.py)
MIN_HELD_OUT = 50  # fewer held-out texts cannot show AGREEMENT_BOUND
HELD_OUT_EVERY = 3  # every third calibration text is held out for the agreement check
MAX_CALIBRATION, MAX_HELD_OUT, BATCH = 300, 200, 32
TIMED_BATCHES = 4  # the speed race: TIMED_BATCHES x BATCH held-out texts per round
INSTALL_HINT = f"pip install 'distilbert-agnews[{OPTIMIZED[0]}]'" + "".join(f" or '[{name}]'" for name in OPTIMIZED[1:])
SAMPLE = Path(__file__).parent / "texts" / "english.txt"  # sentences written for this project, many registers
SAMPLE_TEXTS = 600


@dataclass(frozen=True)
class Candidate:
    backend: str
    precision: str

    @property
    def name(self) -> str:
        return f"{self.backend} {self.precision}"


def installed(backend: str) -> bool:
    return RUNTIMES[backend].installed()


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
        usable = [b for b in present if dtype != precision.BF16 or precision.BF16 in RUNTIMES[b].precisions]
        options = [c for b in usable for c in _options(b, dtype)]
        if dtype == precision.INT8:
            options.sort(key=lambda c: c.precision != precision.INT8)  # every int8 first, then the fallbacks
        else:
            options.append(Candidate(TORCH, precision.resolve(dtype, device_type)))
        return options, f"BACKEND=auto on a CPU with {' and '.join(present)} installed"
    if dtype == precision.INT8 and (backend == TORCH or device_type != "cpu"):
        raise SettingsError(
            f"DTYPE: int8 needs an optimized CPU runtime (BACKEND={' or '.join(OPTIMIZED)}, or auto on a CPU)"
        )
    why = "BACKEND=torch" if backend == TORCH else "BACKEND=auto on a GPU"
    if backend == AUTO and device_type == "cpu":
        why = f"BACKEND=auto: no optimized CPU runtime is installed ({INSTALL_HINT})"
        dtype = precision.AUTO if dtype == precision.INT8 else dtype
    return [Candidate(TORCH, precision.resolve(dtype, device_type))], why


def _options(backend: str, dtype: str) -> list[Candidate]:
    """One runtime's candidates at DTYPE: that precision alone, or (auto, int8) its precisions in preference order."""
    if dtype == precision.FP16:
        raise SettingsError(f"DTYPE: float16 is for GPUs; {backend} on the CPU serves {_names(backend)}")
    if dtype != precision.AUTO and dtype not in RUNTIMES[backend].precisions:
        raise SettingsError(f"DTYPE: {backend} on the CPU serves {_names(backend)}")
    if dtype in (precision.FP32, precision.BF16):
        return [Candidate(backend, dtype)]
    native = precision.native_bf16("cpu")
    return [Candidate(backend, p) for p in RUNTIMES[backend].precisions if p != precision.BF16 or native]


def _names(backend: str) -> str:
    return ", ".join(precision.tei_name(p) for p in RUNTIMES[backend].precisions)


def races(backend: str, dtype: str) -> bool:
    """Speed decides among agreeing candidates (else the first agreeing one in order serves)."""
    return dtype == precision.AUTO or (backend == AUTO and dtype != precision.INT8)


def choose_runtime(loaded: LoadedModel, settings) -> LoadedModel:
    """`loaded` (PyTorch fp32) made ready in the chosen runtime and precision, with what was measured."""
    options, why = candidates(settings.backend, settings.dtype, loaded.device.type)
    if len(options) == 1 and options[0].backend == TORCH:
        chosen = options[0].precision
        if loaded.task.kind.keeps_fp32 and settings.dtype == precision.AUTO and chosen != precision.FP32:
            chosen, why = precision.FP32, f"{why}; DTYPE=auto keeps a regression model's raw values in fp32"
        logger.info("Runtime: torch %s (%s)", chosen, why)
        return _as_torch(loaded, chosen, None)
    texts, source = calibration_texts(loaded.folder, settings.calibration_file)
    torch.set_num_threads(settings.torch_threads)
    key = _cache_key(loaded, texts, options, settings.torch_threads)
    places = runtime_cache.locations(loaded.folder, loaded.sha256, loaded.model_sha is not None, settings.runtime_cache)
    damaged = []
    for cache in places:  # a finished, verified conversion is read where it lies: no lock, no write
        report = cache.report_for(key)
        if report is None:
            continue
        problem = _damage(cache, report, report["chosen"])
        if problem is None:
            _tidy(cache)
            return _build(loaded, report, report["chosen"], cache, settings.torch_threads)
        logger.warning("Runtime: %s; not served", problem)
        damaged.append((cache, report))
    try:
        cache = runtime_cache.writable(places, why)
    except SettingsError:
        if not damaged:
            raise
        return _next_best(loaded, *damaged[0], settings.torch_threads)
    with cache.lock():  # --workers N: one converts, the others then read
        cache.remove_leftovers()
        report = cache.report_for(key)
        if report is not None and _damage(cache, report, report["chosen"]):
            cache.discard(next(m.get("ir") for m in report["candidates"] if m["name"] == report["chosen"]))
            report = None  # named above; converted and measured again
        if report is None:
            logger.info("Runtime: measuring %s (%s; texts: %s)", ", ".join(c.name for c in options), why, source)
            report = measure(loaded, options, texts, cache, settings.torch_threads)
            report.update(chosen=pick_candidate(report["candidates"], races(settings.backend, settings.dtype)), key=key)
            report["texts"] = source
            cache.save(report, sorted({c["ir"] for c in report["candidates"] if c.get("ir")}))
        served = _build(loaded, report, report["chosen"], cache, settings.torch_threads)
    runtime_cache.prune_siblings(cache, loaded.folder)
    return served


def needs_measuring(loaded: LoadedModel, settings) -> bool:
    """Whether choose_runtime would convert and measure candidates: more than PyTorch is considered and no verified
    choice is recorded for these weights, texts and settings (a new checkpoint's first start)."""
    options, _ = candidates(settings.backend, settings.dtype, loaded.device.type)
    if len(options) == 1 and options[0].backend == TORCH:
        return False
    texts, _ = calibration_texts(loaded.folder, settings.calibration_file)
    key = _cache_key(loaded, texts, options, settings.torch_threads)
    places = runtime_cache.locations(loaded.folder, loaded.sha256, loaded.model_sha is not None, settings.runtime_cache)
    for cache in places:
        report = cache.report_for(key)
        if report is not None and _damage(cache, report, report["chosen"]) is None:
            return False
    try:
        runtime_cache.writable(places, "")
    except SettingsError:
        return False  # nothing can be written: choose_runtime says so at start, in one line
    return True


def provisional(loaded: LoadedModel) -> LoadedModel:
    """PyTorch fp32 (the reference every candidate is checked against: never refused), serving while the candidates
    are measured in the background (settings.measure_in_background)."""
    logger.info("Runtime: torch fp32 serves while the candidates are converted and measured in the background")
    summary = {"backend": TORCH, "precision": precision.FP32, "agreement": None, "candidates": [], "provisional": True}
    return _as_torch(loaded, precision.FP32, summary)


def _damage(cache: Cache, report: dict, name: str) -> str | None:
    """Why candidate `name` of `report` cannot be served from `cache` (its files fail their digests), or None."""
    measured = next((m for m in report.get("candidates", []) if m.get("name") == name), None)
    if measured is None:
        return f"{cache.report_file}: no candidate {name!r}"
    return cache.damage(measured["ir"]) if measured.get("ir") else None


def _tidy(cache: Cache) -> None:
    """Leftovers of a process that died mid-conversion, removed when the folder can be written (no lock needed:
    only dead processes' files are touched)."""
    if os.access(cache.folder, os.W_OK):
        cache.remove_leftovers()


def _next_best(loaded: LoadedModel, cache: Cache, report: dict, threads: int) -> LoadedModel:
    """Nothing can be written: the fastest other agreeing candidate whose files verify, else PyTorch fp32."""
    others = [m for m in report["candidates"] if m["refused"] is None and m["name"] != report["chosen"]]
    for measured in sorted(others, key=lambda m: -m["texts_per_s"]):
        if _damage(cache, report, measured["name"]) is None:
            logger.warning("Runtime: nothing can be written to convert again; serving %s instead", measured["name"])
            return _build(loaded, report, measured["name"], cache, threads)
    logger.warning("Runtime: nothing can be written to convert again; serving torch fp32 instead")
    return _as_torch(loaded, precision.FP32, None)


def export(folder: Path, backend: str) -> LoadedModel:
    """Training's --export_runtime: convert and measure now, for the service's default settings (BACKEND=auto,
    DTYPE=auto on this CPU), so its first start only compiles."""
    if backend not in OPTIMIZED:
        raise ValueError(f"export_runtime: unknown runtime {backend!r}")
    if not installed(backend):
        raise SettingsError(f"export_runtime: {backend} is not installed (pip install 'distilbert-agnews[{backend}]')")
    settings = from_env(model_id=str(folder), backend=AUTO, dtype=precision.AUTO, device="cpu")
    return choose_runtime(load_model(str(folder), device="cpu", dtype=precision.FP32), settings)


def pick_candidate(measured: list[dict], race: bool) -> str:
    """The candidate to serve: the fastest agreeing one when racing, else the first agreeing one."""
    agreeing = [m for m in measured if m["refused"] is None]
    if not agreeing:
        raise RuntimeError("no runtime candidate agrees with fp32")  # fp32 ones are never refused: a bug
    chosen = max(agreeing, key=lambda m: m["texts_per_s"]) if race else agreeing[0]
    for m in measured:
        mark = "*" if m is chosen else " "
        ties = f" ({m['ties']} ties left out)" if m.get("ties") else ""
        detail = f"agreement {_percent(m['agreement'])}{ties}, {m['texts_per_s']:.1f} texts/s"
        detail = f"{m['refused']} ({m['texts_per_s']:.1f} texts/s)" if m["refused"] else detail
        logger.info("Runtime %s %-14s %s", mark, m["name"], detail)
    return chosen["name"]


def _percent(value: float | None) -> str:
    return "not measured (fp32)" if value is None else f"{100 * value:.2f} %"


# ------------------------------------------------------------------------------------------- calibration texts


def calibration_texts(folder: Path, calibration_file: str | None) -> tuple[list[str], str]:
    """Real texts for int8 calibration and the agreement check, and where they came from ([] when none)."""
    if calibration_file:
        texts = _read_texts(Path(calibration_file))
        return texts, f"CALIBRATION_FILE {calibration_file} ({len(texts)} texts)"
    recorded = folder / files.CALIBRATION
    if recorded.is_file():
        texts = _read_texts(recorded)
        return texts, f"{files.CALIBRATION} of the checkpoint ({len(texts)} texts)"
    texts = sample_texts()
    return texts, f"the English sample shipped with the service ({len(texts)} texts; set CALIBRATION_FILE for yours)"


def sample_texts(n: int = SAMPLE_TEXTS) -> list[str]:
    """`n` texts of one to three sentences of the shipped sample, the same every time; every sentence is used."""
    sentences = [line.strip() for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    count = len(sentences)
    return [" ".join(sentences[(i * 67 + j * 89) % count] for j in range(1 + i % 3)) for i in range(n)]


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
    """(calibration, held out): every HELD_OUT_EVERY-th text is held out for the agreement check."""
    held = texts[::HELD_OUT_EVERY][:MAX_HELD_OUT]
    calibration = [t for i, t in enumerate(texts) if i % HELD_OUT_EVERY][:MAX_CALIBRATION]
    return calibration, held


# -------------------------------------------------------------------------------------------- the cache key


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
        "guard": guard_description(loaded.task),  # how agreement is measured
        **{b: RUNTIMES[b].load().version() for b in backends},
        "torch": torch.__version__,
    }


# ------------------------------------------------------------------------------------------ measuring, building


def measure(loaded: LoadedModel, options: list[Candidate], texts: list[str], cache: Cache, threads: int) -> dict:
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
        is_fp32 = candidate == Candidate(TORCH, precision.FP32)
        runner = fp32 if is_fp32 else _runner(loaded, candidate, cache, threads, calibration)
        if isinstance(runner, str):  # the conversion failed: the other candidates are still measured
            results[candidate] = {"name": candidate.name, "refused": runner, "agreement": None, "texts_per_s": 0.0}
            continue
        # every batch shape once (first-shape set-up is not speed), and the answers; torch fp32 gave them already
        outputs = reference if runner is fp32 else [runner(b) for b in batches]
        results[candidate] = _verdict(candidate, *(agreement(outputs, reference, loaded.task) if real else (None, 0)))
        if candidate.backend != TORCH:
            results[candidate]["ir"] = _conversion(candidate, calibration)
        runners[candidate] = runner
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
        f"(give CALIBRATION_FILE with {HELD_OUT_EVERY * MIN_HELD_OUT} or more texts)"
    )


def agreement(outputs: list[torch.Tensor], reference: list[torch.Tensor], model_task: Task) -> tuple[float | None, int]:
    """(share of fp32's decisions the candidate keeps, number of ties left out), by the problem type's agreement rule
    (contract/problem_types.py `agreement`: the argmax, each label's thresholded decision, or a value within a
    tolerance; decisions fp32 itself makes by a hair are ties, neither blamed nor credited). None when fewer than
    MIN_HELD_OUT decisions are left."""
    out, ref = torch.cat(outputs).float(), torch.cat(reference).float()
    same, ties = model_task.kind.agreement(out, ref, model_task.thresholds)
    return (same.float().mean().item() if len(same) >= MIN_HELD_OUT else None), ties


def guard_description(model_task: Task) -> str:
    """How agreement is measured for this task: part of the cache key, so a changed rule measures again."""
    return model_task.kind.agreement_rule(model_task.thresholds)


def _verdict(candidate: Candidate, share: float | None, ties: int) -> dict:
    refused = None  # fp32 is the reference precision: its agreement is reported, never refused
    if candidate.precision != precision.FP32:
        if share is None:
            refused = f"refused: only {MIN_HELD_OUT - 1} or fewer held-out texts decided by fp32 ({ties} ties)"
        elif share < AGREEMENT_BOUND:
            refused = f"refused: agreement {_percent(share)} < {_percent(AGREEMENT_BOUND)} with fp32"
    return {"name": candidate.name, "refused": refused, "agreement": share, "ties": ties, "texts_per_s": 0.0}


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
    def forward(batch: dict) -> torch.Tensor:
        with torch.inference_mode():
            return model(**batch).logits.float()

    return forward


def _runner(loaded: LoadedModel, candidate: Candidate, cache: Cache, threads: int, calibration: list[str]):
    """The candidate's runner, or why it could not be built (a converter or runtime that fails on this model)."""
    if candidate.backend == TORCH:
        return _torch_runner(copy.deepcopy(loaded.model).to(precision.torch_dtype(candidate.precision)))
    try:
        path = _converted(loaded, candidate, cache, calibration)
        return RUNTIMES[candidate.backend].load().Runner(path, candidate.precision, threads)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party converter refuses this candidate alone
        cache.discard(_conversion(candidate, calibration))
        logger.warning("Runtime: %s cannot be built: %s: %s", candidate.name, type(exc).__name__, _short(exc))
        return f"refused: conversion failed ({type(exc).__name__}: {_short(exc)})"


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _conversion(candidate: Candidate, calibration: list[str]) -> str:
    """The name of the candidate's converted model's folder in the cache."""
    return RUNTIMES[candidate.backend].folder(candidate.precision, _digest(calibration))


def _converted(loaded: LoadedModel, candidate: Candidate, cache: Cache, calibration: list[str]) -> Path:
    """The candidate's converted model (quantized for int8): an earlier conversion whose files match runtime.json's
    digests, else a new one (what was there is named and removed)."""
    runtime: Runtime = RUNTIMES[candidate.backend]
    name = _conversion(candidate, calibration)
    folder = cache.folder / name
    if name in cache.converted:  # by this measurement, for another precision (a hinted one shares the fp32 model)
        return folder / runtime.model_file
    if folder.exists():
        problem = cache.damage(name)
        if problem is None:
            return folder / runtime.model_file
        logger.warning("Runtime: %s; converting again", problem)
        cache.discard(name)
    started = time.perf_counter()
    # traced on a text pair: every input the tokenizer gives (a BERT's token_type_ids too) becomes a model input
    example = collate(encode(loaded, [("an example text", "and its pair")], True, False), loaded.tokenizer.pad_token_id)
    calibrating = runtime.calibrated and candidate.precision == precision.INT8
    staging = cache.folder / runtime_cache.staging_name(name)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    samples = _batches_of_one(loaded, calibration) if calibrating else []
    runtime.load().build(loaded.model, example, candidate.precision, samples, staging)
    os.replace(staging, folder)
    cache.converted.add(name)
    logger.info("Runtime: converted %s in %.1f s into %s", candidate.name, time.perf_counter() - started, folder)
    return folder / runtime.model_file


def _batches_of_one(loaded: LoadedModel, texts: list[str]) -> list[dict]:
    features = encode(loaded, [(t, None) for t in texts], truncate=True, left=False)
    return [collate([f], loaded.tokenizer.pad_token_id) for f in features]


def _build(loaded: LoadedModel, report: dict, name: str, cache: Cache, threads: int) -> LoadedModel:
    """Candidate `name` of `report` ready to serve (its files verified by the caller)."""
    chosen = next(m for m in report["candidates"] if m["name"] == name)
    backend, chosen_precision = chosen["name"].split()
    summary = {
        "backend": backend,
        "precision": chosen_precision,
        "agreement": chosen["agreement"],
        "held_out_texts": report["held_out_texts"],
        "texts": report.get("texts"),  # what the agreement was measured on
        "candidates": report["candidates"],
    }
    if backend == TORCH:
        return _as_torch(loaded, chosen_precision, summary)
    xml = cache.folder / chosen["ir"] / RUNTIMES[backend].model_file
    runner = RUNTIMES[backend].load().Runner(xml, chosen_precision, threads)
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
