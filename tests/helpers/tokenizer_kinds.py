"""WordPiece, byte-level BPE and Unigram tokenizers, trained offline."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from training.smoke import train_tokenizer

CORPUS = [
    "Stocks rallied as oil prices fell on Monday, traders said.",
    "The striker scored twice as the league leaders won the cup final.",
    "Café owners in Zürich said the naïve plan was déjà vu.",
    "A new chip doubles battery life 🔋 and the company's shares 📈 rose 4%.",
    "Officials met in Beijing 北京 and Tokyo 東京 to discuss trade.",
] * 4
KINDS = ("wordpiece", "byte-level-bpe", "sentencepiece")


def tokenizer_of(kind: str) -> PreTrainedTokenizerFast:
    """A fast tokenizer of `kind` with its model's special tokens around one text."""
    if kind == "wordpiece":
        return train_tokenizer(CORPUS)
    if kind == "byte-level-bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()  # every byte: no text is ever unknown
        specials = ["<s>", "</s>", "<pad>"]
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet)
        tok.train_from_iterator(CORPUS, trainer)
        tok.post_processor = processors.RobertaProcessing(("</s>", 1), ("<s>", 0))
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if kind == "sentencepiece":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
        tok.train_from_iterator(CORPUS, trainer)
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    raise ValueError(f"unknown tokenizer kind {kind!r}; one of {KINDS}")


def hf_folder(kind: str, folder: Path) -> Path:
    """A servable Hugging Face folder: a tiny random DistilBERT classifier (AG News's labels) beside a `kind` tokenizer,
    as save_pretrained writes them (the service serves any such folder)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    tokenizer = tokenizer_of(kind)
    labels = ["World", "Sports", "Business", "Sci/Tech"]
    names = {"id2label": dict(enumerate(labels)), "label2id": {name: i for i, name in enumerate(labels)}}
    config = DistilBertConfig(
        vocab_size=len(tokenizer), dim=32, n_layers=1, n_heads=2, hidden_dim=64, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, **names,
    )  # fmt: skip
    torch.manual_seed(0)
    DistilBertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.model_max_length = 512
    tokenizer.save_pretrained(folder)
    return folder
