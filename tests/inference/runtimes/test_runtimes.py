"""OpenVINO and ONNX Runtime answer as PyTorch fp32 does."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from contract import files, precision
from contract.model_call import forward
from contract.problem_types import MULTI, REGRESSION, SINGLE, TIE_MARGIN, ProblemType
from inference.encoding import encode
from inference.engine.service import load_configured
from inference.runtimes import choice as runtimes
from inference.runtimes import measuring
from inference.runtimes import texts as runtime_texts
from inference.settings import SettingsError, from_env
from tests.helpers.files import save_new_weights
from tests.helpers.processes import ROOT, describe
from tests.helpers.service import Reference, ag_news_texts
from tests.inference.test_app import TEXTS, make_client
from training.smoke import make_split

pytestmark = pytest.mark.skipif(
    not runtimes.installed("openvino"), reason="OpenVINO is not installed here (pip install '.[openvino]')"
)


def smoke_texts() -> list[str]:
    """Texts of the smoke model's own distribution, none of them among its recorded calibration texts."""
    return [t for t, _ in make_split(600, seed=11)]


@contextlib.contextmanager
def runtime_log():
    """The log lines of the runtimes and their cache (the service's logging set-up may stop propagation to pytest's)."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logs = [logging.getLogger(name) for name in ("inference.runtimes.choice", "inference.runtimes.cache")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.INFO)
        log.addHandler(handler)
    try:
        yield lines
    finally:
        for log, level in zip(logs, levels):
            log.removeHandler(handler)
            log.setLevel(level)


def serve(folder: Path, **settings):
    return load_configured(from_env(model_id=str(folder), device="cpu", reload_interval_s=0, **settings))


def served_logits(loaded, texts: list[str]) -> torch.Tensor:
    chunks = [texts[i : i + 32] for i in range(0, len(texts), 32)]
    return torch.cat([forward(loaded, encode(loaded, [(t, None) for t in chunk], True, False)) for chunk in chunks])


@torch.no_grad()
def torch_fp32_logits(reference: Reference, texts: list[str]) -> torch.Tensor:
    chunks = [texts[i : i + 32] for i in range(0, len(texts), 32)]
    tokenize = reference.tokenizer
    return torch.cat(
        [reference.model(**tokenize(c, padding=True, truncation=True, return_tensors="pt")).logits for c in chunks]
    )


def fresh(checkpoint_copy: Path) -> Path:
    shutil.rmtree(checkpoint_copy / files.RUNTIME_DIR, ignore_errors=True)
    return checkpoint_copy


ONNXRUNTIME = pytest.mark.skipif(
    not runtimes.installed("onnxruntime"), reason="ONNX Runtime is not installed here (pip install '.[onnxruntime]')"
)


@pytest.mark.parametrize(
    ("backend", "dtype"),
    [
        ("openvino", "int8"),
        ("openvino", "fp32"),
        pytest.param("onnxruntime", "int8", marks=ONNXRUNTIME),
        pytest.param("onnxruntime", "fp32", marks=ONNXRUNTIME),
    ],
)
def test_optimized_runtimes_give_torch_fp32_labels(checkpoint_copy, backend, dtype):
    """Fresh texts may sit just below the guard's 99.5 %: bound 99 %."""
    loaded = serve(checkpoint_copy, backend=backend, dtype=dtype)  # what training exported
    assert (loaded.runtime, loaded.precision, loaded.model) == (backend, dtype, None)
    assert loaded.report["agreement"] >= measuring.AGREEMENT_BOUND
    texts = smoke_texts()
    expected = torch_fp32_logits(Reference(checkpoint_copy), texts)
    got = served_logits(loaded, texts)
    agreement = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
    print(f"{backend} {dtype}: argmax agreement with torch fp32 {agreement:.4f} on {len(texts)} texts")
    assert agreement >= 0.99
    if dtype == "fp32":
        assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()


@pytest.mark.slow  # converts a model
def test_conversion_happens_once_per_weights_hash(checkpoint_copy):
    folder = fresh(checkpoint_copy)
    with runtime_log() as first:
        loaded = serve(folder, backend="openvino", dtype="int8")
    cache = folder / files.RUNTIME_DIR / loaded.sha256[:16]
    report = cache / files.RUNTIME_CHOICE
    assert any(line.startswith("Runtime: converted openvino int8") for line in first), first
    measured_at = report.stat().st_mtime_ns
    with runtime_log() as second:
        again = serve(folder, backend="openvino", dtype="int8")
    assert not any("converted" in line or "measuring" in line for line in second), second
    assert report.stat().st_mtime_ns == measured_at
    assert (again.precision, again.report["agreement"]) == ("int8", loaded.report["agreement"])

    weights = folder / files.WEIGHTS  # new weights: converted again, the old conversion removed
    state = torch.load(weights, weights_only=True)
    state["classifier.bias"] = state["classifier.bias"] + 0.01
    save_new_weights(folder, state)
    with runtime_log() as third:
        changed = serve(folder, backend="openvino", dtype="int8")
    assert changed.sha256 != loaded.sha256
    assert any(line.startswith("Runtime: converted openvino int8") for line in third), third
    assert sorted(p.name for p in (folder / files.RUNTIME_DIR).iterdir() if p.is_dir()) == [changed.sha256[:16]]


def test_int8_below_the_agreement_bound_is_refused_and_fp32_serves(checkpoint_copy, monkeypatch):
    monkeypatch.setattr(measuring, "AGREEMENT_BOUND", 1.001)  # no int8 model can reach it: the guard must refuse
    with runtime_log() as lines:
        loaded = serve(checkpoint_copy, backend="openvino", dtype="int8")
    assert (loaded.runtime, loaded.precision) == ("openvino", "fp32")
    int8 = next(c for c in loaded.report["candidates"] if c["name"] == "openvino int8")
    assert int8["refused"].startswith("refused: agreement")
    assert any("openvino int8" in line and "refused: agreement" in line for line in lines), lines


@pytest.mark.slow  # converts a model
def test_int8_on_real_news_serves_only_if_it_keeps_the_fp32_labels(checkpoint_copy, tmp_path):
    """int8 serves or is refused as the guard measured, on this CPU's kernels."""
    texts = ag_news_texts(600)
    (tmp_path / "ag_news.txt").write_text("\n".join(texts))
    loaded = serve(checkpoint_copy, backend="openvino", dtype="int8", calibration_file=str(tmp_path / "ag_news.txt"))
    int8 = loaded.report["candidates"][0]
    print(f"openvino int8 on real AG News texts: {int8}")
    assert int8["name"] == "openvino int8" and loaded.report["held_out_texts"] == 200
    if int8["agreement"] is None or int8["agreement"] < measuring.AGREEMENT_BOUND:
        assert int8["refused"].startswith("refused: ") and loaded.precision != "int8"
        return
    assert int8["refused"] is None and loaded.precision == "int8"
    _, held = runtime_texts.split(texts)  # the texts the guard held out
    reference = torch_fp32_logits(Reference(checkpoint_copy), held)
    share, ties = measuring.agreement([served_logits(loaded, held)], [reference], loaded.problem)
    assert share >= measuring.AGREEMENT_BOUND and share == pytest.approx(int8["agreement"], abs=0.01)
    assert ties == pytest.approx(int8["ties"], abs=2)


@pytest.mark.slow  # converts a model
def test_a_save_pretrained_folder_without_recorded_texts_gets_int8_measured_on_the_shipped_sample(checkpoint_copy):
    """A bare export gets int8 calibrated on the shipped sample."""
    folder = checkpoint_copy
    for name in (files.WEIGHTS, files.CALIBRATION, files.TOKENIZER_DIR, files.RUNTIME_DIR, files.METRICS):
        shutil.rmtree(folder / name) if (folder / name).is_dir() else (folder / name).unlink()
    with make_client(folder, backend="openvino", dtype="int8") as c:
        runtime = c.get("/info").json()["distilbert_agnews"]["runtime"]
    assert runtime["texts"] == "the English sample shipped with the service (600 texts; set CALIBRATION_FILE for yours)"
    assert runtime["held_out_texts"] == 200
    int8 = runtime["candidates"][0]
    assert int8["name"] == "openvino int8" and int8["agreement"] is not None
    print(f"openvino int8 on the shipped sample: {int8}")
    if int8["refused"]:
        assert runtime["precision"] == "fp32" and int8["agreement"] < measuring.AGREEMENT_BOUND
        return
    loaded = serve(folder, backend="openvino", dtype="int8")
    _, held = runtime_texts.split(runtime_texts.sample_texts())
    reference = torch_fp32_logits(Reference.from_pretrained(folder), held)  # transformers' own reading of the folder
    share, _ = measuring.agreement([served_logits(loaded, held)], [reference], loaded.problem)
    assert int8["agreement"] >= measuring.AGREEMENT_BOUND and runtime["precision"] == "int8"
    assert share == pytest.approx(int8["agreement"], abs=0.01)


THREE = ProblemType.named(SINGLE, 3)


def test_the_guard_leaves_out_fp32_ties_and_counts_every_decided_flip():
    """A text whose fp32 top two probabilities are within TIE_MARGIN is a coin flip for fp32 itself: a candidate that
    turns it is not blamed; any flip of a text fp32 decides is counted; too few decided texts check nothing."""
    decided = torch.tensor([[2.0, 0.0, 0.0]] * 99)
    tie = torch.tensor([[1.0, 1.0 - 0.01, 0.0]])  # probabilities 0.42 / 0.42: within 0.02
    reference = torch.cat([decided, tie])
    turned_tie = torch.cat([decided, tie[:, [1, 0, 2]]])
    assert measuring.agreement([turned_tie], [reference], THREE) == (1.0, 1)
    turned_decided = torch.cat([decided[:98], decided[:1, [1, 0, 2]], tie])
    assert measuring.agreement([turned_decided], [reference], THREE) == (pytest.approx(98 / 99), 1)
    ties_only = torch.cat([tie] * 60 + [decided[:49]])
    assert measuring.agreement([ties_only], [ties_only], THREE) == (None, 60)


def test_a_one_output_model_is_guarded_by_its_decisions_not_by_an_argmax_that_is_always_0():
    """The argmax of one output is always 0, so it never showed a difference: a one-logit classifier is checked on
    its thresholded sigmoid (near-threshold ties left out), a regression model on its values."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 1, generator=gen) * 3
    one_logit = ProblemType.named(MULTI, 1, (0.5,))
    share, ties = measuring.agreement([-logits], [logits], one_logit)  # every decision flips
    assert share == 0.0 and ties == int(((logits.sigmoid() - 0.5).abs() < TIE_MARGIN).sum())
    assert measuring.agreement([logits], [logits], one_logit)[0] == 1.0
    values = torch.randn(200, 1, generator=gen) * 4 + 10
    regression = ProblemType.named(REGRESSION, 1)
    close = values + 0.05 * values.std() * torch.randn(200, 1, generator=gen).clamp(-1, 1)
    assert measuring.agreement([close], [values], regression) == (1.0, 0)
    off = values.clone()
    off[:3] += values.std()  # three texts off by one standard deviation
    assert measuring.agreement([off], [values], regression) == (pytest.approx(197 / 200), 0)


def test_the_shipped_sample_is_varied_english_and_every_sentence_is_used():
    texts = runtime_texts.sample_texts()
    sentences = [line for line in runtime_texts.SAMPLE.read_text().splitlines() if line.strip()]
    assert len(texts) == runtime_texts.SAMPLE_TEXTS == len(set(texts))
    assert {s for t in texts for s in sentences if s in t} == set(sentences)
    bounds = [runtime_texts.MAX_CALIBRATION, runtime_texts.MAX_HELD_OUT]
    assert [len(runtime_texts.split(texts)[i]) for i in (0, 1)] == bounds
    assert runtime_texts.sample_texts() == texts  # the same every start: part of the cache key


@pytest.mark.slow  # converts a model
def test_calibration_file_is_used_and_a_bad_one_is_one_line(checkpoint_copy, tmp_path):
    folder = checkpoint_copy
    (folder / files.CALIBRATION).unlink()
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(smoke_texts()))
    loaded = serve(folder, backend="openvino", dtype="int8", calibration_file=str(texts))
    assert loaded.precision == "int8" and loaded.report["held_out_texts"] >= measuring.MIN_HELD_OUT
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SettingsError, match="CALIBRATION_FILE: .*empty.jsonl: holds no texts"):
        serve(folder, backend="openvino", dtype="int8", calibration_file=str(empty))


def test_auto_without_an_optimized_runtime_serves_torch_and_says_why(smoke_checkpoint, monkeypatch):
    monkeypatch.setattr(runtimes, "installed", lambda backend: False)
    with runtime_log() as lines:
        loaded = serve(smoke_checkpoint)
    auto = precision.resolve(precision.AUTO, "cpu")  # bf16 on a CPU with AVX512-BF16 or AMX, else fp32
    assert (loaded.runtime, loaded.precision) == ("torch", auto)
    assert lines == [
        f"Runtime: torch {auto} (BACKEND=auto: no optimized CPU runtime is installed (pip install "
        "'distilbert-agnews[openvino]' or '[onnxruntime]'))"
    ]
    for backend in ("openvino", "onnxruntime"):
        with pytest.raises(SettingsError, match=rf"BACKEND: {backend} is not installed \(pip install"):
            serve(smoke_checkpoint, backend=backend)


@pytest.mark.slow  # converts a model
@ONNXRUNTIME
def test_auto_races_every_installed_runtime_and_onnxruntime_alone_is_cached(checkpoint_copy):
    """BACKEND=auto on a CPU measures OpenVINO, ONNX Runtime and PyTorch; BACKEND=onnxruntime converts once."""
    options, why = runtimes.candidates("auto", "auto", "cpu")
    assert {c.runtime for c in options} == {"openvino", "onnxruntime", "torch"}, why
    folder = fresh(checkpoint_copy)
    with runtime_log() as first:
        loaded = serve(folder, backend="onnxruntime")
    assert any(line.startswith("Runtime: converted onnxruntime fp32") for line in first), first
    assert (folder / files.RUNTIME_DIR / loaded.sha256[:16] / "onnxruntime-fp32" / files.RUNTIME_ONNX).is_file()
    assert [c["name"] for c in loaded.report["candidates"]] == ["onnxruntime int8", "onnxruntime fp32"]
    with runtime_log() as second:
        again = serve(folder, backend="onnxruntime")
    assert not any("converted" in line or "measuring" in line for line in second), second
    assert (again.runtime, again.precision) == (loaded.runtime, loaded.precision)
    # the same measurements under DTYPE=int8, whose rule is the first that agrees, not the race: int8, not the race's
    # winner (recorded here as fp32, which the race may well pick: int8 is often the slower on a CPU)
    record = folder / files.RUNTIME_DIR / loaded.sha256[:16] / files.RUNTIME_CHOICE
    recorded = json.loads(record.read_text())
    for report in recorded["reports"]:
        report["chosen"] = "onnxruntime fp32"
        for measured in report["candidates"]:
            measured["texts_per_s"] = 2.0 if measured["name"] == "onnxruntime fp32" else 1.0
    record.write_text(json.dumps(recorded))
    int8 = next(m for m in loaded.report["candidates"] if m["name"] == "onnxruntime int8")
    with runtime_log() as third:
        strict = serve(folder, backend="onnxruntime", dtype="int8")
    assert not any("measuring" in line for line in third), third
    assert strict.precision == ("int8" if int8["refused"] is None else "fp32"), int8


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"backend": "torch", "dtype": "int8"}, "DTYPE: int8 needs an optimized CPU runtime"),
        ({"backend": "openvino", "dtype": "fp16"}, "DTYPE: float16 is for GPUs"),
        ({"backend": "tensorrt"}, "BACKEND: must be auto, torch, openvino or onnxruntime"),
        pytest.param(
            {"backend": "onnxruntime", "dtype": "bf16"}, "DTYPE: onnxruntime on the CPU serves", marks=ONNXRUNTIME
        ),
    ],
)
def test_impossible_runtime_settings_are_one_line(smoke_checkpoint, settings, message):
    with pytest.raises(SettingsError, match=message):
        serve(smoke_checkpoint, **settings)


def test_training_exported_the_runtime_and_the_service_starts_without_converting(smoke_checkpoint):
    """SMOKE_MODEL_ARGS has --export_runtime openvino: the default service start reads what training measured."""
    found = list((smoke_checkpoint / files.RUNTIME_DIR).glob(f"*/{files.RUNTIME_CHOICE}"))
    assert len(found) == 1, found  # one weights hash
    reports = json.loads(found[0].read_text())["reports"]  # other tests may have measured other settings since
    options = [c.name for c in runtimes.candidates("auto", "auto", "cpu")[0]]
    report = next(r for r in reports if r["key"]["options"] == options)
    with runtime_log() as lines:
        loaded = serve(smoke_checkpoint)
    assert not any("converted" in line or "measuring" in line for line in lines), lines
    assert f"{loaded.runtime} {loaded.precision}" == report["chosen"]


@pytest.mark.slow  # converts a model
def test_info_reports_the_runtime_and_an_openvino_model_is_hot_reloaded(checkpoint_copy):
    with make_client(checkpoint_copy, backend="openvino", dtype="int8", reload_interval_s=0.1) as c:
        info = c.get("/info").json()
        runtime = info["distilbert_agnews"]["runtime"]
        assert (info["model_dtype"], runtime["name"], runtime["precision"]) == ("int8", "openvino", "int8")
        assert runtime["agreement"] >= measuring.AGREEMENT_BOUND
        weights = checkpoint_copy / files.WEIGHTS
        state = torch.load(weights, weights_only=True)
        state["classifier.bias"] = torch.tensor([0.0, 0.0, 0.0, 50.0])  # now everything is Sci/Tech
        save_new_weights(checkpoint_copy, state)  # converted again on the watcher's thread meanwhile
        before, deadline = info["distilbert_agnews"]["checkpoint"]["sha256"], time.time() + 60
        while (after := c.get("/info").json())["distilbert_agnews"]["checkpoint"]["sha256"] == before:
            assert time.time() < deadline, "the new checkpoint was not served within 60 s"
            assert c.post("/predict", json={"inputs": TEXTS[0]}).status_code == 200  # the old model serves
        assert (after["model_dtype"], after["distilbert_agnews"]["runtime"]["name"]) == ("int8", "openvino")
        assert c.post("/predict", json={"inputs": TEXTS[1]}).json()[0]["label"] == "Sci/Tech"


# OpenVINO left a bad signal stack: the process died of SIGSEGV on a signal.
SIGNAL_AFTER_TWO_RUNTIMES = """
import gc, os, signal, sys
from pathlib import Path
from inference.runtimes import signal_stack
from inference.runtimes import openvino as openvino_runtime
before = signal_stack.current()
first = openvino_runtime.Runner(Path(sys.argv[1]), "fp32", 1)
second = openvino_runtime.Runner(Path(sys.argv[1]), "fp32", 1)
del first, second
gc.collect()
assert signal_stack.current() == before, (before, signal_stack.current())
signal.signal(signal.SIGUSR1, lambda *_: print("handled"))
os.kill(os.getpid(), signal.SIGUSR1)
"""


@pytest.mark.slow  # compiles a model twice in a process of its own
def test_openvino_leaves_the_thread_its_signal_stack_and_a_signal_is_handled(smoke_checkpoint):
    xml = next(smoke_checkpoint.glob(f"{files.RUNTIME_DIR}/*/openvino-*/{files.RUNTIME_MODEL}"))
    result = subprocess.run(
        [sys.executable, "-c", SIGNAL_AFTER_TWO_RUNTIMES, str(xml)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "handled", describe(result)
