"""Model and optimizer construction (the CPU speed-ups live in training/speed/cpu_speed.py)."""

from __future__ import annotations

import contextlib
import logging
import math

import torch
import transformers
from accelerate import Accelerator
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from contract import files, label_tokens, templates
from contract.errors import UserError
from contract.hub import explain_missing
from contract.padding import ensure_pad_token, match_pad_token
from contract.problem_types import GRADES, REVIEW_BAND
from contract.quiet import quiet_transformers
from contract.templates import Template
from training import calibration, lora
from training.config import ConfigError, TrainConfig
from training.data.batching import steps_in_epoch
from training.data.labels import LabelSpace
from training.speed import capture, cpu_speed, packing

logger = logging.getLogger(__name__)


def hub_options(cfg: TrainConfig) -> dict:
    """What every from_pretrained gets: revision and trust_remote_code."""
    return {"revision": cfg.model_revision, "trust_remote_code": cfg.trust_remote_code}


def load_tokenizer(cfg: TrainConfig):
    """The tokenizer, given a pad token where it has none."""
    name = cfg.tokenizer_name or cfg.model_name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **hub_options(cfg))
    except OSError as exc:
        raise explain_missing(f"tokenizer {name!r}", exc, name) from None
    if said := ensure_pad_token(tokenizer, f"tokenizer {name!r}"):
        logger.info("%s", said)
    if cfg.template is not None:  # every split tokenized through it; saved with the tokenizer
        template = Template.parse(cfg.template)
        template.check(tokenizer, cfg.max_length)
        template.apply(tokenizer)
    return tokenizer


def build_model(
    cfg: TrainConfig, labels: LabelSpace, attn_implementation: str = "sdpa", pad_token_id: int | None = None
) -> PreTrainedModel:
    """A sequence classifier with its problem type, long-text settings and pad token in its config."""
    model = _pretrained_or_new(cfg, labels, attn_implementation)
    if pad_token_id is not None:
        match_pad_token(model.config, pad_token_id)
    if cfg.gradient_checkpointing:
        # non-reentrant: DDP-safe; the RNG replays the same dropout masks
        if hasattr(model, "activation_checkpointing_enable"):  # transformers' name since 5.2x; the old one warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _pretrained_or_new(cfg: TrainConfig, labels: LabelSpace, attn_implementation: str) -> PreTrainedModel:
    names = labels.names
    fields = dict(
        num_labels=len(names),
        id2label={i: name for i, name in enumerate(names)},
        label2id={name: i for i, name in enumerate(names)},
        **labels.problem.config_fields(),
    )
    try:
        config = AutoConfig.from_pretrained(cfg.model_name_or_path, **fields, **hub_options(cfg))
        for name, value in cfg.long_text_rule().config_fields().items():  # fields of ours: from_pretrained drops them
            setattr(config, name, value)
        fitted_for_another = (files.WEIGHTS_SHA256, files.ADAPTER_BASE, GRADES, REVIEW_BAND)
        for field in fitted_for_another:  # fine-tuning one of our checkpoints: not ours
            if hasattr(config, field):
                delattr(config, field)
        if labels.problem.graded:
            setattr(config, GRADES, labels.values)
        if cfg.template is not None:
            setattr(config, templates.CONFIG_FIELD, cfg.template)
        if cfg.label_tokens is not None:
            label_tokens.check_causal(config, repr(cfg.model_name_or_path), cfg.from_scratch)
        # the run's end records what it calibrates
        setattr(config, calibration.CONFIG_FIELD, {"method": calibration.NONE})
        if cfg.dropout is not None:  # e.g. DistilBERT: dropout, attention_dropout, seq_classif_dropout
            for name, value in config.to_dict().items():
                if "dropout" in name and isinstance(value, float):
                    setattr(config, name, cfg.dropout)
        if cfg.from_scratch:
            return AutoModelForSequenceClassification.from_config(config, attn_implementation=attn_implementation)
        # transformers' load report: --verbose
        with contextlib.nullcontext() if cfg.verbose else quiet_transformers():
            model, loading = AutoModelForSequenceClassification.from_pretrained(
                cfg.model_name_or_path,
                config=config,
                attn_implementation=attn_implementation,
                ignore_mismatched_sizes=cfg.ignore_mismatched_sizes,
                output_loading_info=True,
                **hub_options(cfg),
            )
        if cfg.label_tokens is not None:
            start_from_label_tokens(cfg, model, names)
        elif loading["missing_keys"]:  # what fine-tuning starts fresh, in one line of ours
            fresh = sorted(loading["missing_keys"])
            logger.info("Pretrained weights loaded; newly initialized (not in the checkpoint): %s", ", ".join(fresh))
        return model
    except OSError as exc:
        raise explain_missing(f"model {cfg.model_name_or_path!r}", exc, cfg.model_name_or_path) from None
    except RuntimeError as exc:
        if "ignore_mismatched_sizes" not in str(exc):  # transformers' words for a head of another size
            raise
        raise UserError(
            f"model {cfg.model_name_or_path!r}: its classification head has another number of outputs than the "
            f"{len(names)} of this data; pass --ignore_mismatched_sizes to start that head fresh"
        ) from None


def start_from_label_tokens(cfg: TrainConfig, model: PreTrainedModel, names: list[str]) -> None:
    """--label_tokens: the head's rows from the LM's own rows of those tokens, recorded in config.json."""
    method, words = label_tokens.parse(cfg.label_tokens, names)
    ids = label_tokens.token_ids(load_tokenizer(cfg), words)
    folder = label_tokens.local_folder(cfg.model_name_or_path, cfg.model_revision)
    rows = label_tokens.lm_rows(model, folder, ids)
    label_tokens.start_head(model, calibration.output_layer(model, len(names)), method, rows)
    setattr(model.config, label_tokens.CONFIG_FIELD, label_tokens.record(method, words))
    logger.info("Head started from the LM's label tokens (%s): %s", method, ", ".join(words))


OPTIMIZERS = {"adamw": "AdamW", "adafactor": "Adafactor", "adamw_8bit": "8-bit AdamW (bitsandbytes)", "sgd": "SGD"}


def build_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, learning_rate: float, capturable: bool = False, fused: bool = False
) -> torch.optim.Optimizer:
    """--optim over two groups (no decay on biases and norms); AdamW `capturable` for a compiled or captured step,
    `fused` otherwise on GPU."""
    groups = decay_groups(model, cfg.weight_decay)
    if cfg.optim == "adafactor":  # at the given rate: Adafactor's own relative step would ignore the schedule
        return transformers.Adafactor(
            groups, lr=learning_rate, scale_parameter=False, relative_step=False, warmup_init=False
        )
    if cfg.optim == "sgd":
        return torch.optim.SGD(groups, lr=learning_rate, momentum=0.9)
    if cfg.optim == "adamw_8bit":
        import bitsandbytes  # config.py checked it is installed

        return bitsandbytes.optim.AdamW8bit(groups, lr=learning_rate)
    if capturable:
        kernel = {"fused": True} if fused else {"foreach": True}
        return torch.optim.AdamW(groups, lr=learning_rate, capturable=True, **kernel)
    return torch.optim.AdamW(groups, lr=learning_rate, fused=cfg.fused_optimizer or None)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The trainable parameters in two groups: decayed, and biases and normalisation weights (LayerNorm, RMSNorm, any
    *Norm layer: the Trainer's rule) at no decay."""
    no_decay = set()
    for module in model.modules():
        norm = isinstance(module, torch.nn.LayerNorm | torch.nn.RMSNorm) or type(module).__name__.endswith("Norm")
        for name, param in module.named_parameters(recurse=False):
            if name == "bias" or norm:
                no_decay.add(param)
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p not in no_decay], "weight_decay": weight_decay},
        {"params": [p for p in params if p in no_decay], "weight_decay": 0.0},
    ]


def keep_optimizer_kind(optimizer: torch.optim.Optimizer) -> None:
    """After a resume, the optimizer options this run chose (load_state_dict would take the saved ones)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    capturable = bool(inner.defaults.get("capturable"))
    for group in inner.param_groups:
        device = group["params"][0].device
        group.update({key: inner.defaults[key] for key in ("capturable", "fused", "foreach") if key in inner.defaults})
        lr = float(group["lr"])
        group["lr"] = torch.tensor(lr, dtype=torch.float32, device=device) if capturable else lr
        for param in group["params"]:
            state = inner.state.get(param, {})
            if capturable and isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].to(device)


def schedule_plan(cfg: TrainConfig, world: int, train_examples: int) -> tuple[float, int, int, int]:
    """(rate, steps per epoch, steps, epochs), with --scale_lr and --max_train_steps."""
    learning_rate = cfg.learning_rate * (world if cfg.scale_lr == "linear" else 1)
    batch, accumulation = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    epoch_steps = steps_in_epoch(train_examples, batch, world, accumulation)
    total_steps = cfg.max_train_steps or epoch_steps * cfg.num_train_epochs
    return learning_rate, epoch_steps, total_steps, math.ceil(total_steps / epoch_steps)


def optimization(
    cfg: TrainConfig,
    accelerator: Accelerator,
    model: torch.nn.Module,
    learning_rate: float,
    total_steps: int,
    compiled: str,
):
    """(optimizer, schedule): AdamW capturable with a tensor rate when compiled, except under fp16."""
    step_compiled = capture.steps_compiled(compiled, accelerator.mixed_precision)
    captured = compiled == capture.WHOLE_STEP  # the fused AdamW, replayed uncompiled (training/speed/step_graph.py)
    optimizer = build_optimizer(model, cfg, learning_rate, capturable=step_compiled or captured, fused=captured)
    scheduler = transformers.get_scheduler(
        cfg.lr_scheduler_type,
        optimizer,
        num_training_steps=total_steps,
        num_warmup_steps=round(cfg.warmup_ratio * total_steps),
    )
    if step_compiled:
        capture.compile_optimizer_step(optimizer, compiled, accelerator.device, cfg.max_grad_norm)
    elif captured:
        capture.tensor_learning_rate(optimizer, accelerator.device)
    if compiled == capture.REDUCE_OVERHEAD and cfg.gradient_accumulation_steps > 1:
        capture.grads_outside_graphs(model)
    return optimizer, scheduler


def make_model(cfg: TrainConfig, accelerator: Accelerator, labels: LabelSpace, pad_token_id: int) -> torch.nn.Module:
    """The classifier, with CPU speed-ups on CPU."""
    device = accelerator.device
    attention = cpu_speed.attention_for(cfg.attn_implementation, cfg.fast_dropout, device)
    model = build_model(cfg, labels, packing.register() if cfg.packing else attention, pad_token_id)
    if cfg.packing and not packing.supported(model):
        raise ConfigError(
            f"packing: {model.config.model_type} is not supported (its head would read packed rows; packing knows "
            f"{', '.join(packing.MODEL_TYPES)}): leave --packing off"
        )
    if cfg.packing:
        packing.hand_first_tokens(model)
    if cfg.lora_r:
        model = lora.apply_lora(
            model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, cfg.from_scratch
        )
    swapped = cpu_speed.enable(model, cfg.fast_dropout, device)
    if accelerator.is_main_process:  # once, not per rank
        logger.info(
            "Model %s: %.1f M parameters, %s attention, %s%s",
            cfg.model_name_or_path,
            sum(p.numel() for p in model.parameters()) / 1e6,
            attention,
            OPTIMIZERS[cfg.optim]
            if cfg.optim != "adamw"
            else f"{'fused' if cfg.fused_optimizer else 'multi-tensor'} AdamW",
            f", {swapped} dropout modules swapped for FastDropout" if swapped else "",
        )
    return model
