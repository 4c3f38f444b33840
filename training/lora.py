"""LoRA fine-tuning through peft: adapters on the attention projections, the head trained whole, and what a run keeps
(the merged model, adapter/). Called by model.py and the best model's writer.
"""

from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path

import torch
from transformers import PreTrainedModel

from contract import files
from contract.adapters import base_sha256
from contract.errors import UsageError

logger = logging.getLogger(__name__)

# LoRA's targets without a peft default: each family's query and value, else a fused QKV
QUERY_VALUE = ("q_lin", "v_lin", "query", "value", "q_proj", "v_proj", "query_proj", "value_proj")
FUSED_QKV = ("Wqkv", "qkv_proj", "c_attn", "query_key_value")


def peft_installed() -> bool:
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` (unwrapped) carries peft adapters."""
    return peft_installed() and isinstance(model, _peft().PeftModel)


def _peft():
    import peft

    return peft


def head_modules(model: PreTrainedModel) -> list[str]:
    """The classifier's own weighted modules: trained whole and saved."""
    return [
        name
        for name, child in model.named_children()
        if name != model.base_model_prefix and any(True for _ in child.parameters())
    ]


def target_modules(model: PreTrainedModel, requested: list[str] | None) -> list[str]:
    """Target modules: the flag's, else peft's default, else the attention projections."""
    if requested:
        return requested
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

    if model.config.model_type in PEFT_DEFAULTS:
        return list(PEFT_DEFAULTS[model.config.model_type])
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for family in (QUERY_VALUE, FUSED_QKV):
        found = [name for name in family if name in linear]
        if found:
            return found
    raise UsageError(
        f"lora_target_modules: no attention projection found in {model.config.model_type!r} (linear layers: "
        f"{', '.join(sorted(linear)[:8])}); name the modules to adapt with --lora_target_modules"
    )


def apply_lora(
    model: PreTrainedModel, r: int, alpha: float, dropout: float, requested: list[str] | None, from_scratch: bool
):
    """The model wrapped by peft (frozen base, rank-`r` adapters, trained head), its base's identity in its config."""
    peft = _peft()
    targets = target_modules(model, requested)
    setattr(model.config, files.ADAPTER_BASE, base_identity(model, from_scratch))
    config = peft.LoraConfig(
        task_type=peft.TaskType.SEQ_CLS,
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        modules_to_save=head_modules(model),
    )
    try:
        with warnings.catch_warnings():  # peft reads transformers' old checkpointing attribute
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:  # peft's error for unmatched target modules
        nothing_matched = getattr(peft.utils.error, "NoMatchingPeftModuleError", ())
        if not isinstance(exc, nothing_matched) and "not found in the base model" not in str(exc):
            raise
        raise UsageError(
            f"lora_target_modules: {', '.join(targets)} match no module of {model.config.model_type!r}; name "
            "linear layers of the model (e.g. query,value or q_proj,v_proj)"
        ) from None
    counts = parameter_counts(wrapped)
    logger.info(
        "LoRA r=%d alpha=%g dropout=%g on %s; head trained whole: %s; trainable parameters %s of %s (%.2f%%)",
        r,
        alpha,
        dropout,
        ", ".join(targets),
        ", ".join(head_modules(model)),
        f"{counts['trainable']:,}",
        f"{counts['total']:,}",
        100 * counts["trainable"] / counts["total"],
    )
    return wrapped


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable and total parameters (peft's count)."""
    if is_lora(model):
        trainable, total = model.get_nb_trainable_parameters()
        return {"trainable": trainable, "total": total}
    params = list(model.parameters())
    return {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}


def base_identity(model: PreTrainedModel, from_scratch: bool) -> dict:
    """What adapter/config.json records of the base: where it came from and its weights' sha256."""
    return {
        "model": model.config._name_or_path,
        "revision": getattr(model.config, "_commit_hash", None),
        "sha256": base_sha256(model, head_modules(model)),
        "saved": files.ADAPTER_BASE_DIR if from_scratch else None,
    }


def merged_copy(model) -> PreTrainedModel:
    """A plain classifier with merged weights; the training model untouched (unmerging is not bitwise)."""
    return copy.deepcopy(model).merge_and_unload()


def save_adapter(model, folder: Path) -> None:
    """Adapters and head as peft writes them; a from-scratch base's weights in base/."""
    model.save_pretrained(folder)
    if (getattr(model.config, files.ADAPTER_BASE, None) or {}).get("saved"):
        with warnings.catch_warnings():  # peft reads transformers' old checkpointing attribute
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            copy.deepcopy(model).unload().save_pretrained(folder / files.ADAPTER_BASE_DIR)


def restore_adapter(model, folder: Path) -> None:
    """The saved adapters and head put back into `model`."""
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    set_peft_model_state_dict(model, load_peft_weights(str(folder), device="cpu"))
