"""Measuring runtime candidates against PyTorch fp32: agreement on held-out texts and texts/s; and the key a measurement
is valid for. Called by the runtime choice.
"""

from __future__ import annotations

import logging
import platform
import time
from pathlib import Path

import torch

from contract import precision
from contract.loading import LoadedModel
from contract.model_call import collate
from contract.problem_types import ProblemType
from contract.runtimes import AGREEMENT_BOUND, RUNTIMES
from inference.encoding import encode
from inference.runtimes.cache import Cache
from inference.runtimes.conversion import TORCH, Candidate, conversion_name, digest, runner_for, torch_runner
from inference.runtimes.report import ConversionFailed, Measured, Report
from inference.runtimes.texts import HELD_OUT_EVERY, split

logger = logging.getLogger("inference.runtimes.choice")  # one channel for the runtime choice, whichever part logs

MIN_HELD_OUT = 50  # fewer held-out texts cannot show AGREEMENT_BOUND
BATCH = 32
TIMED_BATCHES = 4  # the speed race: TIMED_BATCHES x BATCH held-out texts per round


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def cache_key(loaded: LoadedModel, texts: list[str], options: list[Candidate], threads: int) -> dict:
    runtimes = sorted({c.runtime for c in options} - {TORCH})
    return {
        "sha256": loaded.sha256,
        "texts": digest(texts),
        "options": [c.name for c in options],
        "cpu": cpu_name(),
        "threads": threads,
        "guard": guard_description(loaded.problem),  # how agreement is measured
        **{name: RUNTIMES[name].load().version() for name in runtimes},
        "torch": torch.__version__,
    }


def measure(loaded: LoadedModel, options: list[Candidate], texts: list[str], cache: Cache, threads: int) -> Report:
    """Each candidate's agreement with fp32 and texts/s; nothing chosen yet."""
    calibration, held = split(texts)
    real = len(held) >= MIN_HELD_OUT
    batches = _batches(loaded, held) if real else _synthetic_batches(loaded)
    fp32 = torch_runner(loaded.model)
    reference = [fp32(b) for b in batches]
    results, runners = {}, {}
    for candidate in options:
        refused = _cannot_check(candidate, held, calibration)
        if refused:
            results[candidate] = Measured(candidate.name, refused)
            continue
        try:
            is_fp32 = candidate == Candidate(TORCH, precision.FP32)
            runner = fp32 if is_fp32 else runner_for(loaded, candidate, cache, threads, calibration)
        except ConversionFailed as exc:  # this candidate refused; the others are still measured
            results[candidate] = Measured(candidate.name, str(exc))
            continue
        # every shape once, untimed; fp32 answered already
        outputs = reference if runner is fp32 else [runner(b) for b in batches]
        results[candidate] = _verdict(
            candidate, *(agreement(outputs, reference, loaded.problem) if real else (None, 0))
        )
        if candidate.runtime != TORCH:
            results[candidate].ir = conversion_name(candidate, calibration)
        runners[candidate] = runner
    for candidate, speed in _speeds(runners, batches[:TIMED_BATCHES]).items():
        results[candidate].texts_per_s = speed
    return Report(list(results.values()), held_out_texts=len(held), calibration_texts=len(calibration))


def _speeds(runners: dict, batches: list[dict], rounds: int = 2) -> dict:
    """texts/s per runner, best of `rounds`, the order reversed each round."""
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


def agreement(
    outputs: list[torch.Tensor], reference: list[torch.Tensor], problem: ProblemType
) -> tuple[float | None, int]:
    """(share of fp32's decisions kept, ties left out), by the problem type's rule; None under MIN_HELD_OUT."""
    out, ref = torch.cat(outputs).float(), torch.cat(reference).float()
    same, ties = problem.agreement(out, ref)
    return (same.float().mean().item() if len(same) >= MIN_HELD_OUT else None), ties


def guard_description(problem: ProblemType) -> str:
    """The agreement rule, part of the cache key."""
    return problem.agreement_rule()


def _verdict(candidate: Candidate, share: float | None, ties: int) -> Measured:
    refused = None  # the reference: reported, never refused
    if candidate.precision != precision.FP32:
        if share is None:
            refused = f"refused: only {MIN_HELD_OUT - 1} or fewer held-out texts decided by fp32 ({ties} ties)"
        elif share < AGREEMENT_BOUND:
            refused = f"refused: agreement {percent(share)} < {percent(AGREEMENT_BOUND)} with fp32"
    return Measured(candidate.name, refused, share, ties)


def _batches(loaded: LoadedModel, texts: list[str]) -> list[dict]:
    features = encode(loaded, [(t, None) for t in texts], truncate=True, left=False)
    pad = loaded.tokenizer.pad_token_id
    return [collate(features[i : i + BATCH], pad) for i in range(0, len(features), BATCH)]


def _synthetic_batches(loaded: LoadedModel) -> list[dict]:
    """Random ids at a news-text length, for speed."""
    generator = torch.Generator().manual_seed(0)
    vocab = loaded.tokenizer.vocab_size
    ids = torch.randint(1000 % vocab, vocab, (4, BATCH, 64), generator=generator)
    batches = [{"input_ids": i, "attention_mask": torch.ones_like(i)} for i in ids]
    if "token_type_ids" in loaded.tokenizer.model_input_names:
        for batch in batches:
            batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return batches


def percent(value: float | None) -> str:
    return "not measured (fp32)" if value is None else f"{100 * value:.2f} %"
