"""The model card (the output folder's README.md), built with huggingface_hub's ModelCard. Called after training and by
push.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from contract import files
from contract.hub import HUB_ID
from contract.problem_types import SINGLE, ProblemType
from training.output.atomic import write_bytes


def hub_id_or_none(name: str | None) -> str | None:
    """`name` if it names a Hub repository, else None."""
    if not name or Path(name).expanduser().exists():
        return None
    return name if HUB_ID.match(name) or "/" not in name else None


def eval_results(summary: dict[str, Any], dataset: str) -> list[EvalResult]:
    results = []
    for split, name in (("validation", "validation (best model)"), ("test", "test")):
        for metric in summary_kind(summary).headline:
            value = (summary.get(split) or {}).get(metric)
            if value is not None:
                results.append(
                    EvalResult(
                        task_type="text-classification",
                        dataset_type=dataset,
                        dataset_name=dataset,
                        dataset_split=split,
                        metric_type=metric,
                        metric_value=value,
                        metric_name=f"{metric} ({name})",
                    )
                )
    return results


def summary_kind(summary: dict[str, Any]) -> ProblemType:
    """The summary's problem type; single-label by default."""
    return ProblemType.named(summary.get("problem_type", SINGLE))


def card_data(summary: dict[str, Any], repo_id: str | None = None) -> ModelCardData:
    cfg = summary["config"]
    hub_dataset = None if cfg.get("train_file") else hub_id_or_none(cfg.get("dataset_name"))
    tag = summary_kind(summary).card_tag
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="text-classification",
        base_model=None if cfg.get("from_scratch") else hub_id_or_none(cfg["model_name_or_path"]),
        datasets=[hub_dataset] if hub_dataset else None,
        tags=["text-classification", *([tag] if tag else []), "distilbert-agnews"],
        model_name=repo_id or Path(cfg["output_dir"]).name,
        eval_results=eval_results(summary, hub_dataset or "local") or None,
    )


def _data_line(cfg: dict, counts: dict) -> str:
    if cfg.get("train_file"):
        data = ", ".join(
            [f"`{cfg['train_file']}`"]
            + [f"{split} `{cfg[f'{split}_file']}`" for split in ("validation", "test") if cfg.get(f"{split}_file")]
        )
    else:
        data = f"Hub dataset `{cfg['dataset_name']}`"
    if not counts:
        return f"Trained with distilbert-agnews (`training/train.py`) on {data}."
    return (
        f"Trained with distilbert-agnews (`training/train.py`) on {data}: {counts.get('train', '?')} training, "
        f"{counts.get('validation', '?')} validation and {counts.get('test', 0)} test examples."
    )


def _results_section(summary: dict) -> list[str]:
    shown = summary_kind(summary).headline
    rows = [
        f"| {name} | " + " | ".join(f"{m[k]:.4f}" for k in (*shown, "loss")) + f" | {m['num_examples']} |"
        for name, m in (("validation (best)", summary.get("validation")), ("test", summary.get("test")))
        if m
    ]
    return [
        "## Results",
        "",
        f"Problem type: `{summary.get('problem_type', SINGLE)}`.",
        "",
        "| split | " + " | ".join(shown) + " | loss | examples |",
        "|---|" + "---|" * (len(shown) + 2),
        *rows,
        "",
        f"Curves: `{files.CURVES_PNG}` (raw series in `{files.CURVES_JSON}`); every number in `{files.METRICS}`.",
        "",
    ]


def _training_section(summary: dict) -> list[str]:
    cfg = summary["config"]
    settings = [
        ("learning rate", cfg["learning_rate"]),
        ("schedule", f"{cfg.get('lr_scheduler_type', 'linear')}, warmup ratio {cfg['warmup_ratio']}"),
        ("epochs", cfg["num_train_epochs"]),
        ("optimizer steps", summary["global_step"]),
        ("per-device batch", cfg["per_device_train_batch_size"]),
        ("gradient accumulation", cfg["gradient_accumulation_steps"]),
        ("world size", summary["world_size"]),
        ("effective batch", summary["effective_batch_size"]),
        ("max_length", cfg["max_length"]),
        ("long texts", _long_text(cfg)),
        ("weight decay", cfg["weight_decay"]),
        ("mixed precision", summary["mixed_precision"]),
        ("seed", cfg["seed"]),
        ("best model", f"step {summary['best_step']} by validation {summary['metric_for_best_model']}"),
    ]
    return ["## Training", "", "| setting | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in settings], ""]


def _long_text(cfg: dict) -> str:
    if cfg.get("long_text") != "chunk":
        return "truncated to max_length"
    return f"windows of max_length tokens, stride {cfg['chunk_stride']}, logits pooled by {cfg['chunk_pooling']}"


def _use_section(cfg: dict, where: str) -> list[str]:
    lines = [
        "## Use it",
        "",
        "Serve it (`POST /predict`, the text-embeddings-inference API):",
        "",
        "```bash",
        f"python -m inference --model_id {where} --port 8000",
        "curl -s localhost:8000/predict -H 'content-type: application/json' -d '{\"inputs\": \"Stocks rallied\"}'",
        "```",
        "",
    ]
    listed = f"`{files.WEIGHTS}` (state_dict, what the service loads), `{files.CONFIG}`, `{files.TOKENIZER_DIR}/`"
    if cfg.get("export_hf_format", True):
        lines += [
            "or load it with transformers (the folder is also in Hugging Face format: "
            f"`{files.HF_WEIGHTS}`, `{files.CONFIG}`, tokenizer files):",
            "",
            "```python",
            "from transformers import pipeline",
            "",
            f'classify = pipeline("text-classification", model="{where}")',
            'classify("Stocks rallied as oil prices fell")',
            "```",
            "",
        ]
        listed += f", `{files.HF_WEIGHTS}` and the tokenizer files (Hugging Face format)"
    return lines + [f"Files: {listed}, `{files.METRICS}`.", ""]


def model_card(summary: dict[str, Any], repo_id: str | None = None) -> ModelCard:
    """A run's card from its summary."""
    cfg = summary["config"]
    start = "trained from scratch on the architecture of" if cfg.get("from_scratch") else "fine-tuned from"
    body = [
        f"# Text classifier {start} `{cfg['model_name_or_path']}`",
        "",
        _data_line(cfg, summary.get("num_examples", {})),
        "",
        "## Labels",
        "",
        "| id | label |",
        "|---|---|",
        *[f"| {i} | {name} |" for i, name in enumerate(summary.get("label_names") or [])],
        "",
        *_results_section(summary),
        *_training_section(summary),
        *_use_section(cfg, repo_id or cfg["output_dir"]),
    ]
    return ModelCard(f"---\n{card_data(summary, repo_id).to_yaml()}\n---\n\n" + "\n".join(body))


def write_model_card(output_dir: Path, summary: dict[str, Any], repo_id: str | None = None) -> None:
    write_bytes(output_dir / files.MODEL_CARD, str(model_card(summary, repo_id)).encode("utf-8"))
