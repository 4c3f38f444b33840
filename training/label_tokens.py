"""A decoder classifier's head from its LM's own label tokens (--label_tokens): each output's row starts as the
`lm_head` row of its label's token, so at step 0 the classifier scores as the LM reads those tokens after the
template, zero-shot; `yes,no` makes one output, logit_yes - logit_no (vLLM's from_2_way_softmax). Called by
training/model.py.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from contract.errors import UserError

CONFIG_FIELD = "label_tokens"  # config.json: {"method": TOKENS or TWO_WAY, "tokens": [one word per output or yes, no]}
TOKENS, TWO_WAY = "tokens", "from_2_way_softmax"
LM_HEAD = "lm_head.weight"


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
