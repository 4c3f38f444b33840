"""A decoder classifier started from its LM's own label tokens, read after a prompt template kept with the tokenizer:
tiny Qwen2 and Qwen3 causal LMs made here (no Hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract import files, templates
from contract.label_tokens import LabelTokenError
from contract.problem_types import REGRESSION
from contract.templates import Template, TemplateError
from inference.app import create_app
from inference.settings import Settings
from tests.helpers.processes import describe, launch, run_train
from tests.helpers.tiny_models import tiny_config
from tests.training.test_decoder_models import decoder_tokenizer
from training.config_parsing import load_config
from training.data.labels import LabelSpace
from training.model import build_model, load_tokenizer

WORDS = ["world", "sports", "business", "science", "topic", "story", "answer", "yes", "no", "relevant"]
TOPICS = "World=world,Sports=sports,Business=business,Sci/Tech=science"
TEMPLATE = "topic of the story : {text} . answer :"
LABELS = ["World", "Sports", "Business", "Sci/Tech"]


def write_causal_lm(folder: Path, architecture: str, smoke_dir: Path) -> Path:
    """A tiny causal LM (untied head, so the head is read from its safetensors) and a word-level tokenizer."""
    vocab = AutoTokenizer.from_pretrained(smoke_dir / "model").get_vocab()
    vocab = {**vocab, **{word: len(vocab) + i for i, word in enumerate(w for w in WORDS if w not in vocab)}}
    tokenizer = decoder_tokenizer(vocab, "right")
    config = tiny_config(architecture, len(tokenizer), max_position_embeddings=512, tie_word_embeddings=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # apart too: beside a qwen2 config.json, transformers 5 rebuilds Qwen2's own byte-level tokenizer from the vocab
    tokenizer.save_pretrained(folder / "tokenizer")
    return folder


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def causal_lm(request, smoke_dir, tmp_path_factory) -> Path:
    return write_causal_lm(tmp_path_factory.mktemp(request.param) / "lm", request.param, smoke_dir)


def config(folder: Path, *more: str):
    args = ["--preset", "smoke", "--model_name_or_path", str(folder), "--from_scratch", "false", "--template", TEMPLATE]
    args += ["--tokenizer_name", str(folder / "tokenizer")] if (folder / "tokenizer").is_dir() else []
    return load_config([*args, *more])


@torch.no_grad()
def lm_logits(folder: Path, tokenizer, texts: list[str], ids: list[int]) -> torch.Tensor:
    """The causal LM's own logits of `ids` at each text's last token, each text alone (no padding)."""
    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    rows = [lm(**tokenizer(text, return_tensors="pt")).logits[0, -1, ids] for text in texts]
    return torch.stack(rows)


@torch.no_grad()
def classifier_logits(model, tokenizer, texts: list[str]) -> torch.Tensor:
    return model.eval()(**tokenizer(texts, padding=True, return_tensors="pt")).logits


def test_at_step_0_the_head_reads_the_lms_label_tokens_after_the_template(causal_lm, smoke_dir):
    cfg = config(causal_lm, "--label_tokens", TOPICS)
    texts = pd.read_csv(smoke_dir / "test.csv")["text"].head(8).tolist()
    tokenizer = load_tokenizer(cfg)
    model = build_model(cfg, LabelSpace(values=[], names=LABELS, source="t"), "eager", tokenizer.pad_token_id)
    ids = [tokenizer.convert_tokens_to_ids(word) for word in ("world", "sports", "business", "science")]
    expected = lm_logits(causal_lm, tokenizer, texts, ids)
    assert torch.allclose(classifier_logits(model, tokenizer, texts), expected, atol=1e-5)
    assert tokenizer(texts[0])["input_ids"][-3:] == tokenizer.encode(". answer :", add_special_tokens=False)
    assert model.config.label_tokens == {"method": "tokens", "tokens": ["world", "sports", "business", "science"]}
    assert getattr(model.config, templates.CONFIG_FIELD) == TEMPLATE


def test_a_yes_no_pair_makes_one_logit_as_vllms_two_way_softmax(causal_lm, smoke_dir):
    cfg = config(causal_lm, "--label_tokens", "yes,no")
    texts = pd.read_csv(smoke_dir / "test.csv")["text"].head(6).tolist()
    tokenizer = load_tokenizer(cfg)
    relevance = LabelSpace(values=[], names=["relevant"], source="t", problem_type=REGRESSION)
    model = build_model(cfg, relevance, "eager", tokenizer.pad_token_id)
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    both = lm_logits(causal_lm, tokenizer, texts, [yes, no])
    got = classifier_logits(model, tokenizer, texts)[:, 0]
    assert torch.allclose(got, both[:, 0] - both[:, 1], atol=1e-5)
    assert torch.allclose(got.sigmoid(), both.softmax(-1)[:, 0], atol=1e-5)  # P(yes) of the two tokens


@pytest.mark.parametrize("kind", ["byte-level-bpe", "sentencepiece", "wordpiece"])
def test_truncation_and_windows_cut_the_text_never_the_template(kind):
    """Far past the window, truncated or windowed, single or paired: the suffix (where the label is read) is every
    sequence's last tokens and the prefix its first; without the template as post-processor this fails."""
    from tests.helpers.tokenizer_kinds import tokenizer_of

    tokenizer = tokenizer_of(kind)
    template = Template.parse("Topic of the story: {query}\nDocument: {document}\nAnswer:")
    template.apply(tokenizer)
    parts = template.token_ids(tokenizer)

    def wrapped(ids: list[int]) -> bool:
        return ids[: len(parts["prefix"])] == parts["prefix"] and ids[-len(parts["suffix"]) :] == parts["suffix"]

    long = "the market fell sharply " * 400
    assert wrapped(tokenizer(long, truncation=True, max_length=64)["input_ids"])
    assert wrapped(tokenizer("a query", long, truncation=True, max_length=64)["input_ids"])
    windows = tokenizer(long, truncation=True, max_length=64, stride=8, return_overflowing_tokens=True)["input_ids"]
    assert len(windows) > 10 and all(map(wrapped, windows)) and all(len(w) <= 64 for w in windows)


def test_refusals_are_one_line(causal_lm, smoke_dir):
    labels = LabelSpace(values=[], names=LABELS, source="t")
    with pytest.raises(LabelTokenError, match="'sci/tech' is 3 tokens"):
        build_model(
            config(causal_lm, "--label_tokens", "World=world,Sports=sports,Business=business,Sci/Tech=sci/tech"), labels
        )
    with pytest.raises(LabelTokenError, match="missing \\['Sci/Tech'\\]"):
        build_model(config(causal_lm, "--label_tokens", "World=world,Sports=sports,Business=business"), labels)
    with pytest.raises(LabelTokenError, match="not a causal LM"):
        build_model(config(smoke_dir / "model", "--label_tokens", TOPICS), labels)
    with pytest.raises(TemplateError, match="needs \\{text\\}"):
        Template.parse("no place for the text")
    with pytest.raises(TemplateError, match="leave no room for the text"):
        load_tokenizer(config(causal_lm, "--template", "the " * 70 + "{text}", "--max_length", "64"))


@pytest.mark.slow
def test_a_short_run_learns_past_zero_shot_and_the_service_reads_the_template(causal_lm, smoke_dir, tmp_path):
    """Trained from its label tokens: test accuracy above the same model's at step 0; served, a text far past the
    window is answered as the checkpoint scores the truncated text with its suffix (the template kept)."""
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--model_name_or_path", str(causal_lm), "--from_scratch", "false",
            "--tokenizer_name", str(causal_lm / "tokenizer"), "--label_tokens", TOPICS, "--template",
            TEMPLATE, "--output_dir", str(out), "--max_train_steps", "40", "--eval_steps", "20",
            "--checkpointing_steps", "none", "--learning_rate", "3e-3", "--calibration", "none"]  # fmt: skip
    result, _ = run_train(args)
    assert result.returncode == 0, describe(result)
    cfg = config(causal_lm, "--label_tokens", TOPICS)
    tokenizer = load_tokenizer(cfg)
    test = pd.read_csv(smoke_dir / "test.csv")
    zero_shot = build_model(cfg, LabelSpace(values=[], names=LABELS, source="t"), "eager", tokenizer.pad_token_id)
    step_0 = (classifier_logits(zero_shot, tokenizer, test["text"].tolist()).argmax(-1).numpy() == test["label"]).mean()
    trained = json.loads((out / files.METRICS).read_text())["test"]["accuracy"]
    assert trained > step_0 + 0.1, (trained, step_0)
    saved = json.loads((out / files.CONFIG).read_text())
    assert saved[templates.CONFIG_FIELD] == TEMPLATE and saved["label_tokens"]["method"] == "tokens"
    long = " ".join(test["text"].head(60))  # hundreds of tokens past the 64 the preset trains at
    served = AutoTokenizer.from_pretrained(out / files.TOKENIZER_DIR)
    Template.parse(TEMPLATE).apply(served)
    texts = test["text"].head(8).tolist()
    with TestClient(
        create_app(Settings(model_id=str(out), dtype="fp32", reload_interval_s=0, backend="torch"))
    ) as client:
        answer = client.post("/predict", json={"inputs": long, "truncate": True, "raw_scores": True}).json()
        tokens = client.post("/tokenize", json={"inputs": long}).json()[0]
        served_scores = client.post("/predict", json={"inputs": [[t] for t in texts]}).json()
    source, labelled = tmp_path / "texts.csv", tmp_path / "labelled.csv"
    pd.DataFrame({"text": texts}).to_csv(source, index=False)
    args = ["--checkpoint_dir", str(out), "--input_file", str(source), "--output_file", str(labelled)]
    result, _ = launch(["-m", "training.predict", *args, "--mixed_precision", "fp32"])
    assert result.returncode == 0, describe(result)
    evaluated = ["-m", "training.evaluate", "--checkpoint_dir", str(out), "--test_file", str(smoke_dir / "test.csv")]
    result, _ = launch([*evaluated, "--mixed_precision", "fp32"])
    assert result.returncode == 0, describe(result)
    again = json.loads((out / files.EVAL_RESULTS).read_text())["metrics"]["accuracy"]
    assert again == pytest.approx(trained, abs=1e-6)  # evaluate reads the template as training did
    predicted = pd.read_csv(labelled)
    for i, ranked in enumerate(served_scores):  # predict reads the template as the service does
        scores = {a["label"]: a["score"] for a in ranked}
        written = [predicted.iloc[i][f"score_{label}"] for label in LABELS]
        assert written == pytest.approx([scores[label] for label in LABELS], abs=1e-5)
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    kept = served(long, truncation=True, max_length=model.config.max_position_embeddings, return_tensors="pt")
    suffix = served.encode(". answer :", add_special_tokens=False)
    assert kept["input_ids"][0, -len(suffix) :].tolist() == suffix
    assert [t["id"] for t in tokens[-len(suffix) :]] == suffix  # /tokenize shows the template too
    with torch.no_grad():
        expected = model(**kept).logits[0]
    got = {a["label"]: a["score"] for a in answer}
    assert [got[label] for label in LABELS] == pytest.approx(expected.tolist(), abs=1e-4)


RERANKER_TEMPLATE = "query : {query} document : {document} . relevant :"


def downloaded(causal_lm: Path, folder: Path, spec: dict) -> Path:
    """The causal LM as users download it, plus the label_tokens.json that makes it a classifier."""
    import shutil

    folder = Path(shutil.copytree(causal_lm, folder))
    (folder / "label_tokens.json").write_text(json.dumps(spec))
    return folder


@torch.no_grad()
def by_transformers(folder: Path, parts: list[str], ids: list[int]) -> torch.Tensor:
    """The causal LM run directly on the template's parts and the texts, each tokenized alone and joined (as
    Qwen3-Reranker's own usage does): its logits of `ids` at the last token."""
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    joined = [i for part in parts for i in tokenizer.encode(part, add_special_tokens=False)]
    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    return lm(input_ids=torch.tensor([joined])).logits[0, -1, ids]


@pytest.mark.slow
def test_a_downloaded_llm_reranker_is_served_from_its_label_tokens_in_every_shape(causal_lm, tmp_path):
    """vLLM's hf_overrides names in label_tokens.json ({"classifier_from_token": ["no", "yes"], "method":
    "from_2_way_softmax"}) and the template: /rerank, vLLM's score, Cohere's rerank, /predict on a pair and KServe v2
    answer sigmoid(logit_yes - logit_no) as transformers computes it on the causal LM, to 1e-4."""
    spec = {"classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax", "template": RERANKER_TEMPLATE}
    folder = downloaded(causal_lm, tmp_path / "reranker", spec)
    query, documents = "who won the cup final", ["the striker scored twice in the final", "shares fell sharply"]
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    expected = []
    for document in documents:
        both = by_transformers(folder, ["query : ", query, " document : ", document, " . relevant :"], [yes, no])
        expected.append(torch.sigmoid(both[0] - both[1]).item())
    settings = Settings(model_id=str(folder), dtype="fp32", reload_interval_s=0, backend="torch", served_model_name="r")
    with TestClient(create_app(settings)) as client:
        reranked = client.post("/rerank", json={"query": query, "texts": documents}).json()
        scored = client.post("/v1/score", json={"text_1": query, "text_2": documents}).json()["data"]
        cohere = client.post("/v2/rerank", json={"model": "r", "query": query, "documents": documents}).json()
        paired = client.post("/predict", json={"inputs": [[query, d] for d in documents]}).json()
        tensors = [{"name": "text", "shape": [2], "datatype": "BYTES", "data": [query, query]},
                   {"name": "text_pair", "shape": [2], "datatype": "BYTES", "data": documents}]  # fmt: skip
        kserve = client.post("/v2/models/r/infer", json={"inputs": tensors}).json()["outputs"][0]["data"]
        info = client.get("/info").json()
    assert "reranker" in info["model_type"]
    assert sorted((r["index"], r["score"]) for r in reranked) == [
        (i, pytest.approx(e, abs=1e-4)) for i, e in enumerate(expected)
    ]
    assert [d["score"] for d in scored] == pytest.approx(expected, abs=1e-4)
    assert sorted((r["index"], r["relevance_score"]) for r in cohere["results"]) == [
        (i, pytest.approx(e, abs=1e-4)) for i, e in enumerate(expected)
    ]
    assert [a[0]["score"] for a in paired] == pytest.approx(expected, abs=1e-4)
    assert kserve == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_a_downloaded_llm_classifier_reads_one_token_per_label(causal_lm, tmp_path):
    """One token per label (vLLM's no_post_processing): /predict and vLLM's classify give the softmax of the LM's own
    label-token logits after the template, to 1e-4; a label token of several tokens is refused at start, in one line."""
    words = ["world", "sports", "business", "science"]
    spec = {"classifier_from_token": words, "method": "no_post_processing", "labels": LABELS, "template": TEMPLATE}
    folder = downloaded(causal_lm, tmp_path / "topics", spec)
    text = "the striker scored twice as the league leaders won the cup final"
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    logits = by_transformers(
        folder, ["topic of the story : ", text, " . answer :"], tokenizer.convert_tokens_to_ids(words)
    )
    expected = dict(zip(LABELS, logits.softmax(-1).tolist()))
    settings = Settings(model_id=str(folder), dtype="fp32", reload_interval_s=0, backend="torch", served_model_name="t")
    with TestClient(create_app(settings)) as client:
        predicted = {a["label"]: a["score"] for a in client.post("/predict", json={"inputs": text}).json()}
        classified = client.post("/v1/classify", json={"model": "t", "input": [text]}).json()["data"][0]
    assert predicted == pytest.approx(expected, abs=1e-4)
    assert dict(zip(LABELS, classified["probs"])) == pytest.approx(expected, abs=1e-4)
    bad = downloaded(
        causal_lm, tmp_path / "bad", {**spec, "classifier_from_token": ["world", "sports", "business", "sci/tech"]}
    )
    from contract.loading import CheckpointError, load_model

    with pytest.raises(CheckpointError, match="'sci/tech' is 3 tokens"):
        load_model(str(bad), device="cpu", dtype="fp32")


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} . {% endfor %}"
    "{% if add_generation_prompt %}answer :{% endif %}"
)


@pytest.mark.slow
def test_chat_messages_on_classify_render_through_the_models_chat_template(causal_lm, tmp_path):
    """vLLM's chat form of /v1/classify: `messages` rendered by the model's own chat template and tokenized as
    rendered (no prompt template added), equal to transformers on the rendered text to 1e-4; refusals in vLLM's
    error body."""
    words = ["world", "sports", "business", "science"]
    spec = {"classifier_from_token": words, "method": "no_post_processing", "labels": LABELS, "template": TEMPLATE}
    folder = downloaded(causal_lm, tmp_path / "chat", spec)
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder / "tokenizer")
    messages = [{"role": "user", "content": [{"type": "text", "text": "the striker scored twice in the final"}]}]
    rendered = "user : the striker scored twice in the final . answer :"
    ids = tokenizer.convert_tokens_to_ids(words)
    expected = by_transformers(folder, [rendered], ids).softmax(-1).tolist()
    wrapped = by_transformers(folder, ["topic of the story : ", rendered, " . answer :"], ids).softmax(-1).tolist()
    settings = Settings(model_id=str(folder), dtype="fp32", reload_interval_s=0, backend="torch", served_model_name="t")
    asked = {"model": "t", "messages": messages, "add_generation_prompt": True}
    with TestClient(create_app(settings)) as client:
        chat = client.post("/v1/classify", json=asked).json()["data"][0]["probs"]
        bare = client.post("/v1/classify", json={"model": "t", "input": rendered, "add_special_tokens": False}).json()
        templated = client.post("/v1/classify", json={"model": "t", "input": rendered}).json()["data"][0]["probs"]
        refusals = [
            client.post("/v1/classify", json={**asked, "input": "both"}),
            client.post("/v1/classify", json={**asked, "chat_template": "{{ 7 * 7 }}"}),
            client.post("/v1/classify", json={**asked, "continue_final_message": True}),
        ]
    assert chat == pytest.approx(expected, abs=1e-4) and bare["data"][0]["probs"] == pytest.approx(expected, abs=1e-4)
    assert templated == pytest.approx(wrapped, abs=1e-4)  # `input` keeps the prompt template
    for refused in refusals:
        assert refused.status_code == 400 and set(refused.json()["error"]) == {"message", "type", "param", "code"}
    with TestClient(create_app(Settings(model_id=str(downloaded(causal_lm, tmp_path / "plain", spec)), dtype="fp32",
                                        reload_interval_s=0, backend="torch"))) as client:  # fmt: skip
        none = client.post("/v1/classify", json={"messages": messages})
    assert none.status_code == 400 and "no chat template" in none.json()["error"]["message"]


def test_the_docs_command_trains_a_label_token_classifier(smoke_dir, tmp_path):
    """docs/launching.md's command, its label tokens and template as written, on a tiny Qwen3 and the smoke rows."""
    import shlex

    from tests.helpers.docs import block

    words = shlex.split(block("docs/launching.md", "--label_tokens").code.replace("\\\n", " "))
    flags = {name: words[words.index(name) + 1] for name in ("--label_tokens", "--template")}
    lm = write_causal_lm(tmp_path / "lm", "qwen3", smoke_dir)
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--model_name_or_path", str(lm), "--tokenizer_name", str(lm / "tokenizer"),
            "--from_scratch", "false", "--output_dir", str(out), "--max_train_steps", "5",
            "--checkpointing_steps", "none", *[part for pair in flags.items() for part in pair]]  # fmt: skip
    result, _ = run_train(args)
    assert result.returncode == 0, describe(result)
    config = json.loads((out / files.CONFIG).read_text())
    assert config[templates.CONFIG_FIELD] == flags["--template"] == "Classify the news story. Story: {text} Topic:"
    assert config["label_tokens"] == {"method": "tokens", "tokens": [" World", " Sports", " Business", " Science"]}
    assert "Head started from the LM's label tokens" in result.stderr
