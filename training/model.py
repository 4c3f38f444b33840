"""Model and optimizer construction."""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import (AttentionInterface, AttentionMaskInterface, AutoConfig, AutoModelForSequenceClassification,
                          AutoTokenizer, PreTrainedModel)
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from training.config import TrainConfig
from training.hub import explain_missing


def load_tokenizer(cfg: TrainConfig):
    name = cfg.tokenizer_name or cfg.model_name_or_path
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as exc:
        raise explain_missing(f"tokenizer {name!r}", exc) from None


def attention_for(cfg: TrainConfig, device: torch.device) -> str:
    """--attn_implementation, else sdpa on GPU and eager on CPU (faster to train there, measured), with
    FastDropout on the attention probabilities unless --fast_dropout false."""
    if cfg.attn_implementation:
        return cfg.attn_implementation
    if device.type == "cuda":
        return "sdpa"
    return CPU_TRAINING_ATTENTION if cfg.fast_dropout else "eager"


def build_model(cfg: TrainConfig, label_names: Sequence[str], attn_implementation: str = "sdpa") -> PreTrainedModel:
    """A sequence classifier with one output per class; pretrained weights unless cfg.from_scratch."""
    labels = dict(
        num_labels=len(label_names),
        id2label={i: name for i, name in enumerate(label_names)},
        label2id={name: i for i, name in enumerate(label_names)},
    )
    try:
        config = AutoConfig.from_pretrained(cfg.model_name_or_path, **labels)
        if cfg.dropout is not None:  # e.g. DistilBERT: dropout, attention_dropout, seq_classif_dropout
            for name, value in config.to_dict().items():
                if "dropout" in name and isinstance(value, float):
                    setattr(config, name, cfg.dropout)
        if cfg.from_scratch:
            return AutoModelForSequenceClassification.from_config(config, attn_implementation=attn_implementation)
        return AutoModelForSequenceClassification.from_pretrained(cfg.model_name_or_path, config=config,
                                                                  attn_implementation=attn_implementation)
    except OSError as exc:
        raise explain_missing(f"model {cfg.model_name_or_path!r}", exc) from None


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout for CPU training: one 64-bit random draw gives the keep/drop decisions of four elements
    (16 bits each), where nn.Dropout draws per element. ~2.8x faster on CPU (docs/benchmarks.md); the keep
    probability equals 1 - p to within 2^-16 and outputs are scaled by its exact inverse, so the expected
    value is unchanged. Uses torch's default generator: seeded by set_seed, saved and restored with the
    resumable state like every other random number of the run."""
    threshold = int(round(p * 65536)) - 32768  # keep where the 16-bit draw >= threshold
    n = x.numel()
    words = torch.randint(-2**63, 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
    keep = words.view(torch.int16)[:n].view(x.shape) >= threshold
    return x * keep * (65536 / (32768 - threshold))  # 1 / exact keep probability


class FastDropout(torch.nn.Module):
    """nn.Dropout through fast_dropout, for CPU training (see use_fast_dropout)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        return fast_dropout(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def use_fast_dropout(model: torch.nn.Module) -> int:
    """Swap every nn.Dropout module for FastDropout (same p); returns how many. CPU only: CUDA's own is fused."""
    swapped = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Dropout:
                setattr(parent, name, FastDropout(child.p).train(child.training))
                swapped += 1
    return swapped


def eager_attention_with_fast_dropout(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """softmax(QK^T * scale + mask) V, the attention-probability dropout done by FastDropout: the eager
    computation (faster than SDPA to train on CPU) with its largest dropout tensor made cheap."""
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.size(-1) ** -0.5)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.nn.functional.softmax(scores, dim=-1)
    if module.training and dropout:
        probs = fast_dropout(probs, dropout)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


CPU_TRAINING_ATTENTION = "eager_fast_dropout"
AttentionInterface.register(CPU_TRAINING_ATTENTION, eager_attention_with_fast_dropout)
AttentionMaskInterface.register(CPU_TRAINING_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # same masks as eager


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, learning_rate: float) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only: biases and LayerNorm weights are not decayed."""
    no_decay = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if name == "bias" or isinstance(module, torch.nn.LayerNorm):
                no_decay.add(param)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p not in no_decay], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p in no_decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=learning_rate, fused=cfg.fused_optimizer or None)
