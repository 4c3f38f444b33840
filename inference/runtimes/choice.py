"""Which runtime serves the model at which precision, converted once per weights hash. Called by the service at start
and reload; docs/serving.md tells users the rules.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from contract import precision
from contract.loading import LoadedModel, load_model
from contract.runtimes import RUNTIMES
from inference.runtimes import cache as runtime_cache
from inference.runtimes.cache import Cache
from inference.runtimes.conversion import AUTO, OPTIMIZED, TORCH, Candidate
from inference.runtimes.measuring import cache_key, measure, percent
from inference.runtimes.report import Measured, Report
from inference.runtimes.texts import calibration_texts
from inference.settings import SettingsError, from_env

logger = logging.getLogger(__name__)

INSTALL_HINT = f"pip install 'distilbert-agnews[{OPTIMIZED[0]}]'" + "".join(f" or '[{name}]'" for name in OPTIMIZED[1:])


@dataclass
class ServedModel(LoadedModel):
    """A loaded model ready in its runtime, with the choice's report."""

    report: dict = field(default_factory=dict)
    loaded_at: float = field(default_factory=time.time)


def served(loaded: LoadedModel, report: dict, **changes) -> ServedModel:
    kept = {f.name: getattr(loaded, f.name) for f in fields(LoadedModel)}
    return ServedModel(**{**kept, **changes}, report=report)


def installed(runtime: str) -> bool:
    return RUNTIMES[runtime].installed()


def candidates(backend: str, dtype: str, device_type: str) -> tuple[list[Candidate], str]:
    """Candidates in order of preference, and why."""
    if backend in OPTIMIZED:
        if not installed(backend):
            raise SettingsError(f"BACKEND: {backend} is not installed (pip install 'distilbert-agnews[{backend}]')")
        if device_type != "cpu":
            raise SettingsError(f"BACKEND: {backend} serves on the CPU; set DEVICE=cpu, or BACKEND=torch for the GPU")
        return _options(backend, dtype), f"BACKEND={backend}"
    present = [b for b in OPTIMIZED if installed(b)]
    if backend == AUTO and device_type == "cpu" and present:
        # explicit bf16 leaves out runtimes without it
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


def _options(runtime: str, dtype: str) -> list[Candidate]:
    """One runtime's candidates at DTYPE."""
    if dtype == precision.FP16:
        raise SettingsError(f"DTYPE: float16 is for GPUs; {runtime} on the CPU serves {_names(runtime)}")
    if dtype != precision.AUTO and dtype not in RUNTIMES[runtime].precisions:
        raise SettingsError(f"DTYPE: {runtime} on the CPU serves {_names(runtime)}")
    if dtype in (precision.FP32, precision.BF16):
        return [Candidate(runtime, dtype)]
    native = precision.native_bf16("cpu")
    return [Candidate(runtime, p) for p in RUNTIMES[runtime].precisions if p != precision.BF16 or native]


def _names(runtime: str) -> str:
    return ", ".join(precision.tei_name(p) for p in RUNTIMES[runtime].precisions)


def races(backend: str, dtype: str) -> bool:
    """Speed decides among agreeing candidates."""
    return dtype == precision.AUTO or (backend == AUTO and dtype != precision.INT8)


@dataclass
class Recorded:
    """What the caches hold for one model and its settings: the key, the places looked in, a verified report."""

    key: dict
    texts: list[str]
    source: str  # where the texts came from
    places: list[Cache]
    verified: tuple[Cache, Report] | None = None
    damaged: list[tuple[Cache, Report, str]] = field(default_factory=list)  # with why each is not served


def recorded(loaded: LoadedModel, settings, options: list[Candidate]) -> Recorded:
    """The one lookup of choose_runtime and needs_measuring: the first verified report for these options."""
    texts, source = calibration_texts(loaded.folder, settings.calibration_file)
    key = cache_key(loaded, texts, options, settings.measured_threads)
    places = runtime_cache.locations(loaded.folder, loaded.sha256, loaded.model_sha is not None, settings.runtime_cache)
    found = Recorded(key, texts, source, places)
    for cache in places:  # a verified conversion is read in place
        report = _report_for(cache, key, settings)
        if report is None:
            continue
        problem = _damage(cache, report, report.chosen)
        if problem is None:
            found.verified = (cache, report)
            return found
        found.damaged.append((cache, report, problem))
    return found


def _report_for(cache: Cache, key: dict, settings) -> Report | None:
    """The recorded report for `key`, its choice made by this start's rule (a race, or the first that agrees): the
    measurements hold for any rule, the recorded choice only for the rule that made it."""
    report = cache.report_for(key)
    if report is not None:
        report.chosen = chosen_by(report.candidates, races(settings.backend, settings.dtype)).name
    return report


def choose_runtime(loaded: LoadedModel, settings) -> ServedModel:
    """`loaded` in its chosen runtime and precision."""
    options, why = candidates(settings.backend, settings.dtype, loaded.device.type)
    if len(options) == 1 and options[0].runtime == TORCH:
        chosen = options[0].precision
        if loaded.problem.keeps_fp32 and settings.dtype == precision.AUTO and chosen != precision.FP32:
            chosen, why = precision.FP32, f"{why}; DTYPE=auto keeps a regression model's raw values in fp32"
        logger.info("Runtime: torch %s (%s)", chosen, why)
        return _as_torch(loaded, chosen, None)
    torch.set_num_threads(settings.threads)
    found = recorded(loaded, settings, options)
    if found.verified is not None:
        cache, report = found.verified
        _tidy(cache)
        return _build(loaded, report, report.chosen, cache, settings.threads)
    for _, _, problem in found.damaged:
        logger.warning("Runtime: %s; not served", problem)
    try:
        cache = runtime_cache.writable(found.places, why)
    except SettingsError:
        if not found.damaged:
            raise
        return _next_best(loaded, *found.damaged[0][:2], settings.threads)
    with cache.lock():  # --workers N: one converts, the others then read
        served = _measured_and_built(loaded, settings, options, why, found, cache)
    runtime_cache.prune_siblings(cache, loaded.folder)
    return served


def _measured_and_built(loaded, settings, options: list[Candidate], why: str, found: Recorded, cache: Cache):
    """Under the cache's lock: another process's report if it just wrote one, else measured here; then built."""
    cache.remove_leftovers()
    report = _report_for(cache, found.key, settings)  # another process may have measured meanwhile
    if report is not None and _damage(cache, report, report.chosen):
        cache.discard(report.candidate(report.chosen).ir)
        report = None  # named above; converted and measured again
    if report is None:
        logger.info("Runtime: measuring %s (%s; texts: %s)", ", ".join(c.name for c in options), why, found.source)
        report = measure(loaded, options, found.texts, cache, settings.threads)
        report.chosen = pick_candidate(report.candidates, races(settings.backend, settings.dtype))
        report.key, report.texts = found.key, found.source
        cache.save(report)
    return _build(loaded, report, report.chosen, cache, settings.threads)


def with_adapters(loaded: LoadedModel, adapters: dict[str, LoadedModel], settings) -> ServedModel:
    """Adapters of one base, beside `loaded` (an adapter of it too): torch, since they share the base's weights, which
    a converted model does not hold; all in the one precision chosen for `loaded` (the cast reaches the shared base)."""
    chosen = choose_runtime(loaded, settings.model_copy(update={"backend": TORCH}))
    served_adapters = {name: _as_torch(one, chosen.precision, chosen.report) for name, one in adapters.items()}
    return replace(chosen, adapters=served_adapters)


def needs_measuring(loaded: LoadedModel, settings) -> bool:
    """Whether choose_runtime would measure: a new checkpoint's first start."""
    options, _ = candidates(settings.backend, settings.dtype, loaded.device.type)
    if len(options) == 1 and options[0].runtime == TORCH:
        return False
    found = recorded(loaded, settings, options)
    if found.verified is not None:
        return False
    try:
        runtime_cache.writable(found.places, "")
    except SettingsError:
        return False  # choose_runtime says so at start
    return True


def provisional(loaded: LoadedModel) -> ServedModel:
    """PyTorch fp32, serving while candidates are measured in the background."""
    logger.info("Runtime: torch fp32 serves while the candidates are converted and measured in the background")
    summary = {"name": TORCH, "precision": precision.FP32, "agreement": None, "candidates": [], "provisional": True}
    return _as_torch(loaded, precision.FP32, summary)


def _damage(cache: Cache, report: Report, name: str) -> str | None:
    """Why a candidate's files fail their digests, or None."""
    measured = report.candidate(name)
    if measured is None:
        return f"{cache.report_file}: no candidate {name!r}"
    return cache.damage(measured.ir) if measured.ir else None


def _tidy(cache: Cache) -> None:
    """Dead processes' leftovers removed, when writable."""
    if os.access(cache.folder, os.W_OK):
        cache.remove_leftovers()


def _next_best(loaded: LoadedModel, cache: Cache, report: Report, threads: int) -> ServedModel:
    """Nothing writable: the fastest other verified candidate, else fp32."""
    others = [m for m in report.candidates if m.refused is None and m.name != report.chosen]
    for measured in sorted(others, key=lambda m: -m.texts_per_s):
        if _damage(cache, report, measured.name) is None:
            logger.warning("Runtime: nothing can be written to convert again; serving %s instead", measured.name)
            return _build(loaded, report, measured.name, cache, threads)
    logger.warning("Runtime: nothing can be written to convert again; serving torch fp32 instead")
    return _as_torch(loaded, precision.FP32, None)


def export(folder: Path, runtime: str) -> ServedModel:
    """Training's --export_runtime: convert and measure for the default settings now."""
    if runtime not in OPTIMIZED:
        raise ValueError(f"export_runtime: unknown runtime {runtime!r}")
    if not installed(runtime):
        raise SettingsError(f"export_runtime: {runtime} is not installed (pip install 'distilbert-agnews[{runtime}]')")
    settings = from_env(model_id=str(folder), backend=AUTO, dtype=precision.AUTO, device="cpu")
    return choose_runtime(load_model(str(folder), device="cpu", dtype=precision.FP32), settings)


def chosen_by(measured: list[Measured], race: bool) -> Measured:
    """The fastest agreeing candidate when racing, else the first."""
    agreeing = [m for m in measured if m.refused is None]
    if not agreeing:
        raise RuntimeError("no runtime candidate agrees with fp32")  # fp32 ones are never refused: a bug
    return max(agreeing, key=lambda m: m.texts_per_s) if race else agreeing[0]


def pick_candidate(measured: list[Measured], race: bool) -> str:
    """chosen_by, with the measurements logged."""
    chosen = chosen_by(measured, race)
    for m in measured:
        mark = "*" if m is chosen else " "
        ties = f" ({m.ties} ties left out)" if m.ties else ""
        detail = f"agreement {percent(m.agreement)}{ties}, {m.texts_per_s:.1f} texts/s"
        detail = f"{m.refused} ({m.texts_per_s:.1f} texts/s)" if m.refused else detail
        logger.info("Runtime %s %-14s %s", mark, m.name, detail)
    return chosen.name


def _build(loaded: LoadedModel, report: Report, name: str, cache: Cache, threads: int) -> ServedModel:
    """Candidate `name` ready to serve; its summary is what /info says of the runtime."""
    chosen = report.candidate(name)
    runtime, chosen_precision = chosen.runtime, chosen.precision
    summary = {
        "name": runtime,
        "precision": chosen_precision,
        "agreement": chosen.agreement,
        "held_out_texts": report.held_out_texts,
        "texts": report.texts,  # what the agreement was measured on
        "candidates": report.as_json()["candidates"],
    }
    if runtime == TORCH:
        return _as_torch(loaded, chosen_precision, summary)
    xml = cache.folder / chosen.ir / RUNTIMES[runtime].model_file
    runner = RUNTIMES[runtime].load().Runner(xml, chosen_precision, threads)
    logger.info(
        "Runtime: serving %s from %s (agreement with fp32 %s, %.1f texts/s when measured)",
        chosen.name,
        xml.parent,
        percent(chosen.agreement),
        chosen.texts_per_s,
    )
    return served(loaded, summary, model=None, runner=runner, runtime=runtime, precision=chosen_precision)


def _as_torch(loaded: LoadedModel, torch_precision: str, summary: dict | None) -> ServedModel:
    model = loaded.model.to(precision.torch_dtype(torch_precision))
    if summary is None:
        summary = {"name": TORCH, "precision": torch_precision, "agreement": None, "candidates": []}
    return served(loaded, summary, model=model, precision=torch_precision, runtime=TORCH)
