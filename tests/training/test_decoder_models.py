"""Decoder-LLM classifiers (Qwen2, Llama) end to end, offline."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerFast

from contract import files
from contract.padding import NoPadToken, ensure_pad_token
from inference.app import create_app
from inference.settings import Settings
from tests.helpers.processes import cli_env, describe, launch, run_train
from tests.helpers.tiny_models import tiny_config

EOS = "<|endoftext|>"
TEXTS = [
    "The striker scored twice as the league leaders won the cup final.",
    "Shares fell after the bank cut its forecast.",
    "A new chip doubles battery life, the company said on Tuesday in a long statement to investors.",
    "Talks",
]
ARCHITECTURES = {"qwen2": "right", "llama": "left"}  # model type: the side its tokenizer pads on


def decoder_tokenizer(vocab: dict[str, int], padding_side: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer shaped like a decoder's: no special tokens added around the text, an end-of-text
    token, no pad token."""
    vocab = {**vocab, EOS: len(vocab)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, unk_token="[UNK]", padding_side=padding_side, model_max_length=512
    )


def write_decoder(folder: Path, architecture: str, smoke_dir: Path) -> Path:
    vocab = AutoTokenizer.from_pretrained(smoke_dir / "model").get_vocab()
    tokenizer = decoder_tokenizer(vocab, ARCHITECTURES[architecture])
    assert tokenizer.pad_token is None
    config = tiny_config(
        architecture,
        len(tokenizer),
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def trained_decoder(request, smoke_dir, tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp(request.param)
    base = write_decoder(root / "base", request.param, smoke_dir)
    out = root / "out"
    args = ["--preset", "smoke", "--model_name_or_path", str(base), "--output_dir", str(out)]
    args += [
        "--max_train_steps",
        "40",
        "--eval_steps",
        "20",
        "--checkpointing_steps",
        "none",
        "--learning_rate",
        "3e-3",
    ]
    result, _ = run_train(args, env=cli_env())
    assert result.returncode == 0, describe(result)
    if AutoTokenizer.from_pretrained(base).pad_token is None:  # Llama's; transformers' Qwen2 class pads with EOS
        assert "no pad token; padding with the end-of-text token" in result.stderr, describe(result)
    return request.param, out


@pytest.mark.slow
def test_a_decoder_trains_with_its_end_of_text_token_as_padding(trained_decoder):
    architecture, out = trained_decoder
    config = json.loads((out / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR)
    assert config["model_type"] == architecture and config["pad_token_id"] == tokenizer.pad_token_id
    assert tokenizer.pad_token == EOS and tokenizer.padding_side == ARCHITECTURES[architecture]
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["test"]["accuracy"] > 0.25  # learnt something on the 4 smoke topics


@pytest.mark.slow
def test_the_service_answers_a_decoder_as_the_model_run_on_each_text_alone(trained_decoder):
    """One batch of texts of different lengths (padded on the tokenizer's side) equals each text run alone, with no
    padding at all (1e-4, fp32); evaluate and predict read the same folder the same way (contract/loading.py)."""
    _, out = trained_decoder
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR)
    alone = []
    with torch.no_grad():
        for text in TEXTS:
            logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
            alone.append(dict(zip(model.config.id2label.values(), logits.softmax(-1).tolist())))
    settings = Settings(model_id=str(out), dtype="fp32", reload_interval_s=0, backend="torch")
    with TestClient(create_app(settings)) as client, ThreadPoolExecutor(4) as pool:
        # whitespace and zero-width text: no tokens for a tokenizer that adds none (was 424 with a traceback, or a
        # score read from padding); now 400 for that request alone, whatever shares its micro-batch
        blank = [pool.submit(client.post, "/predict", json={"inputs": [["a"], [t]]}) for t in (" ", "\t\n", "\u200b")]
        answered = [pool.submit(client.post, "/predict", json={"inputs": [[t] for t in TEXTS]}) for _ in range(3)]
        for refused in blank:
            assert refused.result().status_code == 400, refused.result().text
            assert refused.result().json() == {
                "error": "`inputs` has no tokens once tokenized (inputs[1]): only characters this model's tokenizer "
                "drops; send some text",
                "error_type": "Empty",
            }
    for response in (future.result() for future in answered):
        assert response.status_code == 200, response.text
        for answer, expected in zip(response.json(), alone):
            assert {a["label"]: pytest.approx(expected[a["label"]], abs=1e-4) for a in answer} == {
                a["label"]: a["score"] for a in answer
            }


def test_a_tokenizer_with_neither_pad_nor_end_of_text_token_is_refused_in_one_line(smoke_dir):
    tokenizer = decoder_tokenizer(AutoTokenizer.from_pretrained(smoke_dir / "model").get_vocab(), "right")
    tokenizer.eos_token = None
    with pytest.raises(NoPadToken, match="neither a pad token nor an end-of-text token"):
        ensure_pad_token(tokenizer, "tokenizer 'x'")


@pytest.mark.slow
def test_batch_prediction_scores_a_decoder_as_each_text_alone(trained_decoder, tmp_path):
    """python -m training.predict over padded batches of 4 gives each row the model's scores on that text alone (cut
    at the training's max_length, 64, as prediction cuts it)."""
    import pandas as pd

    _, out = trained_decoder
    source, predicted = tmp_path / "in.csv", tmp_path / "out.csv"
    pd.DataFrame({"text": [*TEXTS * 3, "\u200b"]}).to_csv(source, index=False)  # and a zero-width space: no tokens
    args = ["--checkpoint_dir", str(out), "--input_file", str(source), "--output_file", str(predicted)]
    result, _ = launch(["-m", "training.predict", *args, "--per_device_batch_size", "4", "--mixed_precision", "fp32"])
    assert result.returncode == 0, describe(result)
    assert "1 rows have no tokens once tokenized" in result.stderr
    written = pd.read_csv(predicted)
    assert written.iloc[-1].drop("text").isna().all()  # empty cells, not a label decided from padding
    written.iloc[:-1].to_csv(predicted, index=False)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR)
    labels = list(model.config.id2label.values())
    with torch.no_grad():
        alone = [model(**tokenizer(t, truncation=True, max_length=64, return_tensors="pt")).logits[0] for t in TEXTS]
    alone = torch.stack(alone * 3).softmax(-1)
    got = torch.tensor(pd.read_csv(predicted)[[f"score_{label}" for label in labels]].to_numpy()).float()
    assert torch.allclose(got, alone, atol=1e-4), (got - alone).abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["eager", "sdpa"])  # the CPU default (eager with fast dropout), the GPU's
def test_a_decoder_trains_in_bf16_with_gradient_checkpointing(smoke_dir, tmp_path, attention):
    """The usual way to fit a decoder classifier: bf16 autocast and activations recomputed in the backward pass, with
    each attention implementation the project picks (sdpa: the sync-free registration of contract/attention.py)."""
    base = write_decoder(tmp_path / "base", "llama", smoke_dir)
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--model_name_or_path", str(base), "--output_dir", str(out), "--max_train_steps", "20"]
    args += ["--eval_steps", "10", "--checkpointing_steps", "none", "--mixed_precision", "bf16"]
    args += [] if attention == "eager" else ["--attn_implementation", attention]
    result, _ = run_train([*args, "--gradient_checkpointing"], env=cli_env())
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["mixed_precision"] == "bf16" and metrics["config"]["gradient_checkpointing"] is True
    assert metrics["test"]["accuracy"] > 0.25 and "FutureWarning" not in result.stderr


@pytest.mark.slow
def test_training_a_decoder_whose_tokenizer_cannot_pad_stops_in_one_line_writing_nothing(smoke_dir, tmp_path):
    base = write_decoder(tmp_path / "base", "llama", smoke_dir)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(base)
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--model_name_or_path", str(base), "--output_dir", str(out), "--max_train_steps", "5"]
    result, _ = run_train(args, env=cli_env())
    assert result.returncode == 1, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert "neither a pad token nor an end-of-text token" in result.stderr.strip().splitlines()[-1], describe(result)
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


def test_serving_a_decoder_whose_tokenizer_cannot_pad_is_refused_in_one_line(smoke_dir, tmp_path):
    """The service, training.evaluate and training.predict read folders through load_model: the same rule, the
    same one line (a CheckpointError: the service's start exits with it)."""
    from contract.loading import CheckpointError, load_model

    base = write_decoder(tmp_path / "base", "llama", smoke_dir)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(base)
    with pytest.raises(CheckpointError, match="neither a pad token nor an end-of-text token"):
        load_model(str(base), device="cpu", dtype="fp32")


@pytest.mark.slow
def test_a_decoder_trains_with_lora_in_bf16_with_gradient_checkpointing_and_serves_as_each_text_alone(
    smoke_dir, tmp_path
):
    """The usual LLM recipe (LoRA, bf16, checkpointing); adapter/ served alone."""
    pytest.importorskip("peft", reason="pip install 'distilbert-agnews[peft]' (dev extra)")
    base = write_decoder(tmp_path / "base", "llama", smoke_dir)
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--from_scratch", "false", "--model_name_or_path", str(base)]
    args += ["--output_dir", str(out), "--max_train_steps", "30", "--eval_steps", "15", "--checkpointing_steps", "none"]
    args += ["--mixed_precision", "bf16", "--gradient_checkpointing", "--lora_r", "4", "--learning_rate", "5e-3"]
    args += ["--ignore_mismatched_sizes"]  # the base's own 2-output head: LoRA trains a 4-output one
    result, _ = run_train(args, env=cli_env())
    assert result.returncode == 0, describe(result)
    assert "LoRA r=4 alpha=16 dropout=0.1 on q_proj, v_proj; head trained whole: score" in result.stderr
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR)
    with torch.no_grad():
        alone = [model(**tokenizer(text, return_tensors="pt")).logits[0].softmax(-1) for text in TEXTS]
    settings = Settings(model_id=str(out / files.ADAPTER_DIR), dtype="fp32", reload_interval_s=0, backend="torch")
    with TestClient(create_app(settings)) as client:
        response = client.post("/predict", json={"inputs": [[t] for t in TEXTS]})
    assert response.status_code == 200, response.text
    labels = list(model.config.id2label.values())
    for answer, expected in zip(response.json(), alone):
        assert {a["label"]: a["score"] for a in answer} == pytest.approx(dict(zip(labels, expected.tolist())), abs=1e-4)
