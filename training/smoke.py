"""Offline smoke preset: synthetic 4-class news, a WordPiece tokenizer trained on it, a tiny DistilBERT; plus
multi-label, regression, pair, reranking and long-document sets. Built once into a cache folder.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the preset's paths load without them (--help)
    from tokenizers import normalizers, pre_tokenizers
    from transformers import DistilBertConfig, PreTrainedTokenizerFast

from training.output.atomic import staging_dir

SMOKE_VERSION = 11
LABELS = ("World", "Sports", "Business", "Sci/Tech")
NUM_TRAIN, NUM_TEST = 3000, 600
NUM_LONG_TRAIN, NUM_LONG_TEST = 1200, 200
QUERIES = {"train": (150, 7), "validation": (30, 8), "test": (40, 9)}  # (queries, seed) per reranking split
PASSAGES_PER_QUERY = 8
LABEL_NOISE = 0.02  # keeps the task from being trivially perfect

_WORDS = {
    "World": {
        "subject": [
            "the president",
            "the prime minister",
            "rebels",
            "the un security council",
            "protesters",
            "the foreign minister",
            "peacekeepers",
            "the parliament",
            "opposition leaders",
            "diplomats",
        ],
        "verb": ["condemned", "signed", "rejected", "called for", "negotiated", "debated", "approved", "protested"],
        "object": [
            "a ceasefire",
            "the peace treaty",
            "new sanctions",
            "the election results",
            "a border deal",
            "the nuclear talks",
            "humanitarian aid",
            "the refugee plan",
            "troop withdrawals",
        ],
        "place": [
            "in baghdad",
            "in gaza",
            "near the border",
            "in kabul",
            "at the summit",
            "in darfur",
            "in the capital",
            "in brussels",
            "in tehran",
            "in moscow",
        ],
    },
    "Sports": {
        "subject": [
            "the yankees",
            "the red sox",
            "manchester united",
            "the patriots",
            "the lakers",
            "federer",
            "the olympic team",
            "the coach",
            "the striker",
            "the quarterback",
        ],
        "verb": ["beat", "defeated", "edged", "routed", "tied", "lost to", "rallied past", "shut out"],
        "object": [
            "their rivals",
            "the champions",
            "the visitors",
            "the home side",
            "the defending champion",
            "the league leaders",
            "the underdogs",
            "the wildcard team",
        ],
        "place": [
            "in the playoffs",
            "in overtime",
            "at the stadium",
            "in the final",
            "in the world cup",
            "at wimbledon",
            "in the series opener",
            "on the road",
            "in the semifinal",
        ],
    },
    "Business": {
        "subject": [
            "shares of oracle",
            "the central bank",
            "wall street",
            "oil prices",
            "the retailer",
            "investors",
            "the airline",
            "the automaker",
            "the insurer",
            "the dollar",
        ],
        "verb": ["rose", "fell", "jumped", "slumped", "reported", "forecast", "cut", "raised"],
        "object": [
            "quarterly profit",
            "interest rates",
            "its earnings outlook",
            "the merger bid",
            "record sales",
            "job cuts",
            "the stock price",
            "dividend payments",
            "revenue estimates",
        ],
        "place": [
            "on the nasdaq",
            "in early trading",
            "after the earnings report",
            "on wall street",
            "in the third quarter",
            "amid inflation fears",
            "at the annual meeting",
            "in tokyo trading",
        ],
    },
    "Sci/Tech": {
        "subject": [
            "microsoft",
            "google",
            "nasa",
            "researchers",
            "the software maker",
            "apple",
            "scientists",
            "the chipmaker",
            "linux developers",
            "astronomers",
        ],
        "verb": ["released", "unveiled", "patched", "discovered", "launched", "tested", "announced", "upgraded"],
        "object": [
            "a new browser",
            "the spacecraft",
            "a security flaw",
            "a faster processor",
            "the search engine",
            "an open source database",
            "a wireless standard",
            "a distant planet",
            "the operating system",
        ],
        "place": [
            "for windows users",
            "in orbit",
            "on the internet",
            "in the lab",
            "at the developer conference",
            "for mobile phones",
            "on mars",
            "in silicon valley",
            "for broadband networks",
        ],
    },
}
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_FILLER = [
    "officials said on monday",
    "according to a report",
    "sources said",
    "the statement said",
    "reuters reported",
    "analysts said",
    "the ap reported",
    "it was announced on friday",
    "witnesses said",
    "in a surprise move",
]


def smoke_dir() -> Path:
    """$DISTILBERT_AGNEWS_SMOKE_DIR, else the user cache."""
    if os.environ.get("DISTILBERT_AGNEWS_SMOKE_DIR"):
        return Path(os.environ["DISTILBERT_AGNEWS_SMOKE_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "distilbert-agnews" / f"smoke-v{SMOKE_VERSION}"


def presets() -> dict[str, dict[str, Any]]:
    """Named bundles of defaults; explicit values win."""
    root = smoke_dir()
    bundles = {
        "smoke": {
            "model_name_or_path": str(root / "model"),
            "from_scratch": True,
            "train_file": str(root / "train.csv"),
            "test_file": str(root / "test.csv"),
            "validation_split": 0.1,
            "max_length": 64,
            "num_train_epochs": 3,
            "per_device_train_batch_size": 16,
            "per_device_eval_batch_size": 64,
            "learning_rate": 2e-3,
            "warmup_ratio": 0.1,
            "logging_steps": 50,
            "label_names": list(LABELS),  # AG News' names for ids 0..3
            "mixed_precision": "fp32",  # the same numbers on every CPU, AMX or not
        }
    }
    for name, files_of in {"multi-label": ("multi_label", "jsonl"), "regression": ("regression", "csv")}.items():
        stem, suffix = files_of
        bundle = {k: v for k, v in bundles["smoke"].items() if k != "label_names"}
        bundle.update(train_file=str(root / f"{stem}_train.{suffix}"), test_file=str(root / f"{stem}_test.{suffix}"))
        bundle["label_column"] = "labels" if name == "multi-label" else "score"
        bundle["output_dir"] = f"runs/smoke-{name}"  # beside checkpoints/ (the smoke model the README serves)
        bundles[f"smoke-{name}"] = bundle
    bundles["smoke-reranking"] = {  # the pretrained MiniLM: a tiny random model learns the pairs too slowly
        **{k: v for k, v in bundles["smoke"].items() if k not in ("label_names", "from_scratch")},
        **{f"{split}_file": str(root / f"reranking_{split}.csv") for split in ("train", "validation", "test")},
        "model_name_or_path": "minilm",
        "text_column_names": ["query"],
        "text_pair_column": "passage",
        "label_column": "relevance",
        "problem_type": "reranking",
        "num_train_epochs": 1,
        "learning_rate": 1e-4,
        "output_dir": "runs/smoke-reranking",
    }
    bundles["smoke-long"] = {
        **bundles["smoke"],
        "train_file": str(root / "long_train.csv"),
        "test_file": str(root / "long_test.csv"),
        "max_length": 48,  # the label's sentence starts past the first window
        "long_text": "chunk",
        "chunk_stride": 8,
        "output_dir": "runs/smoke-long",
    }
    return bundles


def make_example(rng: random.Random, label: str) -> str:
    """One AG-News-shaped headline and description."""
    sentences = []
    for _ in range(rng.choice([1, 1, 2, 2, 3])):  # vary the length like real news snippets
        sentence = _words(rng, label)
        if rng.random() < 0.5:
            sentence += ", " + rng.choice(_FILLER)
        sentences.append(_capitalized(sentence))
    return " ".join(sentences)


def _words(rng: random.Random, label: str) -> str:
    """subject verb object place, drawn from the label's word lists."""
    return " ".join(rng.choice(_WORDS[label][slot]) for slot in ("subject", "verb", "object", "place"))


def _capitalized(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:] + "."


def make_split(num: int, seed: int) -> list[tuple[str, int]]:
    """(text, class id) rows, ids as in ag_news."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        label = rng.choice(LABELS)
        text = make_example(rng, label)
        if rng.random() < LABEL_NOISE:
            label = rng.choice([other for other in LABELS if other != label])
        rows.append((text, LABELS.index(label)))
    return rows


def make_multi_label(num: int, seed: int) -> list[dict]:
    """Stories of 1 to 3 topics, with their topics."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        topics = rng.sample(LABELS, rng.choice([1, 1, 2, 2, 3]))
        sentences = [_sentence(rng, topic) for topic in topics]
        rng.shuffle(sentences)
        rows.append({"text": " ".join(sentences), "labels": sorted(topics)})
    return rows


def make_regression(num: int, seed: int) -> list[dict]:
    """Scored stories and scored pairs, with noise."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        topics = [rng.choice(LABELS) for _ in range(rng.choice([1, 2, 3, 4]))]
        score = topics.count("Sports") - 0.5 * topics.count("World") + rng.gauss(0, 0.1)
        first, second = rng.choice(LABELS), rng.choice(LABELS)
        rows.append(
            {
                "text": " ".join(_sentence(rng, topic) for topic in topics),
                "score": round(score, 3),
                "sentence1": _sentence(rng, first),
                "sentence2": _sentence(rng, second),
                "pair_score": round((first == "Sports") + 0.5 * (second == "World") + rng.gauss(0, 0.05), 3),
            }
        )
    return rows


def make_reranking(num: int, seed: int) -> list[dict]:
    """(query, passage, relevance) rows: a query names a subject of one topic; that topic's stories are relevant (1 to
    3 of each query's 8), the others not."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        topic = rng.choice(LABELS)
        query = rng.choice(_WORDS[topic]["subject"])
        relevant = rng.randint(1, 3)
        for i in range(PASSAGES_PER_QUERY):
            other = topic if i < relevant else rng.choice([t for t in LABELS if t != topic])
            rows.append({"query": query, "passage": _sentence(rng, other), "relevance": int(i < relevant)})
    return rows


LONG_SENTENCES, LONG_EVIDENCE_AFTER = 11, 7  # filler sentences per long story; the label's sentence never before


def make_long_documents(num: int, seed: int) -> list[tuple[str, int]]:
    """Long filler documents, the label's sentence placed late."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        label = rng.choice(LABELS)
        sentences = [_capitalized(", ".join(rng.sample(_FILLER, 2))) for _ in range(LONG_SENTENCES)]
        sentences.insert(rng.randint(LONG_EVIDENCE_AFTER, LONG_SENTENCES), _sentence(rng, label))
        rows.append((" ".join(sentences), LABELS.index(label)))
    return rows


def _sentence(rng: random.Random, label: str) -> str:
    return _capitalized(_words(rng, label))


def build_vocab(
    texts: list[str], normalizer: normalizers.Normalizer, pre_tokenizer: pre_tokenizers.PreTokenizer
) -> dict[str, int]:
    """Specials, printable ASCII, then the corpus's words."""
    split = pre_tokenizer.pre_tokenize_str
    words = {word for text in texts for word, _ in split(normalizer.normalize_str(text))}
    chars = [chr(code) for code in range(33, 127) if not chr(code).isupper()]
    pieces = [*_SPECIALS, *chars, *(f"##{char}" for char in chars), *sorted(words - set(chars))]
    return {piece: index for index, piece in enumerate(pieces)}


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """An uncased WordPiece tokenizer like DistilBERT's."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    tok = Tokenizer(models.WordPiece(build_vocab(texts, normalizer, pre_tokenizer), unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.BertProcessing(
        ("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]"))
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=512,
    )


def tiny_distilbert_config(vocab_size: int, pad_token_id: int) -> DistilBertConfig:
    from transformers import DistilBertConfig

    return DistilBertConfig(
        vocab_size=vocab_size,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=128,
        max_position_embeddings=512,
        pad_token_id=pad_token_id,
    )


def _write_csv(path: Path, rows: list[tuple[str, int]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


def _write_other_tasks(folder: Path) -> None:
    """The other sets, each with its own seed."""
    for split, (num, seed) in {"train": (NUM_LONG_TRAIN, 5), "test": (NUM_LONG_TEST, 6)}.items():
        _write_csv(folder / f"long_{split}.csv", make_long_documents(num, seed))
    for split, (num, seed) in QUERIES.items():
        _write_rows(folder / f"reranking_{split}.csv", make_reranking(num, seed))
    for split, (num, seed) in {"train": (NUM_TRAIN, 3), "test": (NUM_TEST, 4)}.items():
        with open(folder / f"multi_label_{split}.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in make_multi_label(num, seed))
        _write_rows(folder / f"regression_{split}.csv", make_regression(num, seed + 10))


def _write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def ensure_smoke_assets(root: Path | None = None) -> Path:
    """Build the assets once; their folder. Safe to race."""
    root = Path(root or smoke_dir())
    if (root / "READY").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(f".{root.name}-", root.parent)
    train = make_split(NUM_TRAIN, seed=1)
    _write_csv(staging / "train.csv", train)
    _write_csv(staging / "test.csv", make_split(NUM_TEST, seed=2))
    _write_other_tasks(staging)
    tokenizer = train_tokenizer([text for text, _ in train])
    tokenizer.save_pretrained(staging / "model")
    tiny_distilbert_config(len(tokenizer), tokenizer.pad_token_id).save_pretrained(staging / "model")
    (staging / "READY").write_text(f"smoke assets v{SMOKE_VERSION}\n")
    try:
        staging.rename(root)
    except OSError:  # another process finished first; its identical copy wins
        shutil.rmtree(staging, ignore_errors=True)
        if not (root / "READY").is_file():
            raise RuntimeError(f"{root} exists but holds no complete smoke assets; delete it and run again") from None
    return root
