"""The smoke preset's assets are the same in every process, so the smoke model is the same in every run."""

import subprocess
import sys

from training import smoke

_BUILD = (
    "import sys; from training import smoke; "
    "tok = smoke.train_tokenizer([text for text, _ in smoke.make_split(smoke.NUM_TRAIN, seed=1)]); "
    "sys.stdout.write(tok.backend_tokenizer.to_str())"
)


def test_the_smoke_tokenizer_is_identical_across_processes():
    # The tokenizers WordPiece trainer ordered tied tokens differently per process; the vocabulary is now built
    # from sorted sets. Separate interpreters, because hash randomization differs between them.
    built = [subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True, check=True).stdout]
    built.append(subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True, check=True).stdout)
    assert built[0] == built[1]
    assert '"[PAD]":0' in built[0].replace(" ", "")


def test_every_corpus_word_is_one_token_and_an_unseen_word_falls_back_to_characters():
    tokenizer = smoke.train_tokenizer(["Nasa launched the spacecraft."])
    assert tokenizer.tokenize("Nasa launched the spacecraft.") == ["nasa", "launched", "the", "spacecraft", "."]
    assert tokenizer.tokenize("Zyx 42") == ["z", "##y", "##x", "4", "##2"]
    assert tokenizer.unk_token_id not in tokenizer("Zyx 42, hello!")["input_ids"]
    assert tokenizer("spacecraft")["input_ids"][0] == tokenizer.cls_token_id
