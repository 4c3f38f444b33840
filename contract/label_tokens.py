"""A decoder classifier's head from its LM's own label tokens: each output's row is the `lm_head` row of its label's
token, so the classifier scores as the LM reads those tokens after the template; a yes/no pair makes one output,
logit_yes - logit_no (vLLM's from_2_way_softmax). Training starts a head so (--label_tokens, training/model.py); the
loader serves a downloaded causal LM so, from the label_tokens.json beside it (contract/loading.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from contract.errors import UserError
from contract.problem_types import GRADES, SINGLE
from contract.templates import CONFIG_FIELD as TEMPLATE_FIELD

CONFIG_FIELD = "label_tokens"  # config.json: {"method": TOKENS or TWO_WAY, "tokens": [one word per output or yes, no]}
TOKENS, TWO_WAY = "tokens", "from_2_way_softmax"
NO_POST_PROCESSING = "no_post_processing"  # vLLM's word for TOKENS
LM_HEAD = "lm_head.weight"
SPEC_FILE = "label_tokens.json"  # beside a downloaded causal LM: what makes it a classifier (docs/serving.md)
SPEC_LIMIT = 1 << 20  # bytes: a spec names a few tokens and a template


class LabelTokenError(UserError, ValueError):
    """Label tokens that cannot start a head."""


def parse(spec: str, labels: list[str]) -> tuple[str, list[str]]:
    """(method, words): `label=word,...` naming every label once, one word each; or `yes,no` for one output. Words
    are taken as written, a leading space included."""
    items = [item.rstrip() for item in spec.split(",")]  # a word's leading space is kept: BPE tells " no" from "no"
    if len(items) == 2 and not any("=" in item for item in items):
        if len(labels) != 1:
            raise LabelTokenError(
                f"--label_tokens {spec!r}: a yes,no pair makes one output (a reranker or a one-logit scorer); this "
                f"data has {len(labels)} labels: name a word for each, e.g. {labels[0]}=word,..."
            )
        return TWO_WAY, items
    pairs = [item.partition("=") for item in items]
    words = {label.strip(): word for label, sep, word in pairs if sep and label.strip() and word.strip()}
    if len(words) != len(items) or set(words) != set(labels):
        missing, unknown = sorted(set(labels) - set(words)), sorted(set(words) - set(labels))
        raise LabelTokenError(
            f"--label_tokens {spec!r:.120}: give label=word for each of the labels {labels}"
            + (f"; missing {missing}" if missing else "")
            + (f"; not a label: {unknown}" if unknown else "")
        )
    return TOKENS, [words[label] for label in labels]


def token_ids(tokenizer, words: list[str]) -> list[int]:
    """Each word's one token id; a word of several tokens is refused."""
    ids = []
    for word in words:
        found = tokenizer.encode(word, add_special_tokens=False)
        if found == [tokenizer.unk_token_id]:
            raise LabelTokenError(f"label token {word!r} is not in this tokenizer's vocabulary (it reads as unknown)")
        if len(found) != 1:
            pieces = tokenizer.convert_ids_to_tokens(found)
            raise LabelTokenError(
                f"label token {word!r} is {len(found)} tokens in this tokenizer ({pieces}): a label is read from one "
                "token; pick a word that is one (often the word with a leading space, or its lower case)"
            )
        ids += found
    return ids


def check_causal(config, name: str, from_scratch: bool) -> None:
    """Label tokens are read through a pretrained causal LM's next-token head; an encoder (or random weights) has
    none to start from."""
    if from_scratch:
        raise LabelTokenError("--label_tokens starts the head from a pretrained LM's rows; --from_scratch has none")
    architectures = getattr(config, "architectures", None) or []
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise LabelTokenError(
            f"--label_tokens: {name} is not a causal LM checkpoint (architectures {architectures}); label tokens "
            "start the head from a decoder's own next-token head (Qwen, Llama, ...)"
        )


def local_folder(name: str, revision: str) -> str:
    """The folder holding `name`'s files: itself, or the Hub cache's copy from_pretrained just made."""
    if Path(name).is_dir():
        return name
    from huggingface_hub import snapshot_download

    return snapshot_download(name, revision=revision, allow_patterns=["*.safetensors"], local_files_only=True)


def lm_rows(model: torch.nn.Module, folder: str, ids: list[int]) -> torch.Tensor:
    """The LM's output rows of `ids`: the input embeddings where they are tied, else lm_head.weight read from the
    checkpoint's safetensors (the classifier loaded without it)."""
    if getattr(model.config, "tie_word_embeddings", False):
        return model.get_input_embeddings().weight[ids].detach().float().clone()
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), "pt") as fh:
            if LM_HEAD in fh.keys():
                rows = fh.get_slice(LM_HEAD)
                return torch.stack([rows[i] for i in ids]).float()
    raise LabelTokenError(f"--label_tokens: {folder} holds no {LM_HEAD} in its safetensors to start the head from")


def head_layer(model: torch.nn.Module, outputs: int) -> str:
    """The classifier's output layer: its last linear layer of `outputs` outputs."""
    found = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features == outputs]
    if not found:
        raise LabelTokenError(f"no linear layer with {outputs} outputs to start from the label tokens")
    return found[-1]


def start_head(model: torch.nn.Module, layer: str, method: str, rows: torch.Tensor) -> None:
    """The head `layer` (its weight outputs x hidden) set to the label rows (two-way: their difference), no bias."""
    head = model.get_submodule(layer)
    weight = rows[:1] - rows[1:2] if method == TWO_WAY else rows
    with torch.no_grad():
        head.weight.copy_(weight.to(head.weight.dtype))
        if head.bias is not None:
            head.bias.zero_()


def record(method: str, words: list[str]) -> dict:
    return {"method": method, "tokens": words}


def read_spec(folder: Path) -> dict:
    """label_tokens.json, in vLLM's hf_overrides names (classifier_from_token, method, is_original_qwen3_reranker)
    and ours (template, labels), as {"method", "tokens" (TWO_WAY: [no, yes], vLLM's order), "labels", "template"}."""
    path = folder / SPEC_FILE
    if path.stat().st_size > SPEC_LIMIT:
        raise LabelTokenError(f"{path}: over {SPEC_LIMIT} bytes; it names label tokens and a template")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabelTokenError(f"{path}: not JSON ({exc})") from None
    qwen3 = isinstance(raw, dict) and raw.get("is_original_qwen3_reranker") is True
    tokens = raw.get("classifier_from_token", ["no", "yes"] if qwen3 else None) if isinstance(raw, dict) else None
    method = raw.get("method", TWO_WAY if qwen3 else NO_POST_PROCESSING) if isinstance(raw, dict) else None
    words = isinstance(tokens, list) and tokens and all(isinstance(t, str) and t for t in tokens)
    if not words or method not in (TWO_WAY, NO_POST_PROCESSING) or (method == TWO_WAY and len(tokens) != 2):
        raise LabelTokenError(
            f'{path}: expected {{"classifier_from_token": ["no", "yes"], "method": "{TWO_WAY}"}} (or one token per '
            f'label with "method": "{NO_POST_PROCESSING}"), optionally "template" and "labels" (got {raw!r:.120})'
        )
    labels = raw.get("labels", ["relevance"] if method == TWO_WAY else list(tokens))
    template = raw.get("template")
    if not isinstance(labels, list) or len(labels) != (1 if method == TWO_WAY else len(tokens)):
        raise LabelTokenError(f"{path}: labels must name each output ({labels!r:.80})")
    if template is not None and not isinstance(template, str):
        raise LabelTokenError(f"{path}: template must be a string ({template!r:.80})")
    return {"method": method, "tokens": tokens, "labels": [str(label) for label in labels], "template": template}


def classifier_config(config, spec: dict) -> None:
    """`config` (a causal LM's) made the classifier's: its outputs and labels, a reranker's grades or the label
    classes, the template and the label tokens recorded as training records them."""
    labels = spec["labels"]
    config.num_labels = len(labels)
    config.id2label, config.label2id = dict(enumerate(labels)), {label: i for i, label in enumerate(labels)}
    if spec["method"] == TWO_WAY:
        config.problem_type = None  # one relevance logit: served as a reranker
        setattr(config, GRADES, [0, 1])
    else:
        config.problem_type = SINGLE
    if spec["template"] is not None:
        setattr(config, TEMPLATE_FIELD, spec["template"])
    method = TWO_WAY if spec["method"] == TWO_WAY else TOKENS
    words = spec["tokens"][::-1] if method == TWO_WAY else spec["tokens"]  # ours: yes first
    setattr(config, CONFIG_FIELD, record(method, words))


def head_from_spec(model: torch.nn.Module, folder: Path, tokenizer, spec: dict) -> None:
    """The classifier's head set from the LM's rows of the spec's tokens (yes minus no for TWO_WAY)."""
    words = spec["tokens"][::-1] if spec["method"] == TWO_WAY else spec["tokens"]
    rows = lm_rows(model, str(folder), token_ids(tokenizer, words))
    method = TWO_WAY if spec["method"] == TWO_WAY else TOKENS
    start_head(model, head_layer(model, len(spec["labels"])), method, rows)
