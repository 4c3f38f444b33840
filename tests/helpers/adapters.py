"""peft LoRA adapters on one tiny base, each answering differently."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from contract.quiet import quiet_transformers


def write_body(folder: Path, smoke_dir: Path) -> Path:
    """A pretrained encoder body without a classification head (random weights, saved), with its tokenizer."""
    config = AutoConfig.from_pretrained(smoke_dir / "model")
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(smoke_dir / "model").save_pretrained(folder)
    return folder


def write_adapter(folder: Path, body: Path, labels: list[str], seed: int, **config_fields) -> Path:
    """A LoRA adapter of `body` (q_lin and v_lin, the head saved whole) for these labels, as peft saves one, with a
    config.json naming the labels; `config_fields` (problem_type, ...) go into that config."""
    from peft import LoraConfig, get_peft_model

    config = AutoConfig.from_pretrained(body, num_labels=len(labels), **config_fields)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: i for i, label in enumerate(labels)}
    torch.manual_seed(seed)
    with quiet_transformers():  # its load report names the head it starts fresh, as intended here
        model = AutoModelForSequenceClassification.from_pretrained(body, config=config)
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_lin", "v_lin"],
        modules_to_save=["pre_classifier", "classifier"],
        init_lora_weights=False,  # random B: the adapter changes the base's answers
    )
    get_peft_model(model, lora).save_pretrained(folder)
    config.save_pretrained(folder)
    return folder
