"""Data loading: labels as run_classification.py gives them, text columns, validation errors, the seeded
validation split, tokenization and padding."""

from __future__ import annotations

import datasets
import pytest
import torch

from tests.helpers.files import write_rows
from training.config_parsing import load_config
from training.data.batching import GPU_LOADER_WORKERS, loader_workers, make_dataloaders
from training.data.errors import DataError
from training.data.labels import LabelSpace
from training.data.reading import load_splits
from training.data.tokenizing import tokenize_splits
from training.model import load_tokenizer

NAMES = ["World", "Sports", "Business", "Sci/Tech"]
TEXTS = [
    "Stocks rallied on Wall Street",
    "The Yankees beat the Red Sox",
    "NASA launched a probe to Mars",
    "Leaders signed a ceasefire",
    "Oil prices fell again",
    "Federer won at Wimbledon",
]


def rows(n: int = 40, labels=(0, 1, 2, 3)) -> list[dict]:
    return [{"text": f"{TEXTS[i % len(TEXTS)]} number {i}", "label": labels[i % len(labels)]} for i in range(n)]


def config(train, *extra):
    return load_config(["--train_file", str(train), "--validation_split", "0.25", *extra])


def text_to_label(splits) -> dict:
    return {t: splits.label_names[y] for t, y in zip(splits.train["text"], splits.train["labels"])}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_integer_labels_are_sorted_ids_named_by_their_values_or_label_names(tmp_path, suffix):
    train = write_rows(tmp_path / f"ids{suffix}", rows())
    assert load_splits(config(train)).label_names == ["0", "1", "2", "3"]
    named = load_splits(config(train, "--label_names", "World,Sports,Business,Sci/Tech"))
    assert named.label_names == NAMES and named.labels.values == [0, 1, 2, 3]
    expected = {r["text"]: NAMES[r["label"]] for r in rows()}
    assert text_to_label(named) == {t: expected[t] for t in named.train["text"]}


def test_binary_labels_give_two_classes_and_1_to_4_give_four(tmp_path):
    binary = load_splits(config(write_rows(tmp_path / "b.csv", rows(labels=(0, 1)))))
    assert binary.label_names == ["0", "1"]
    kaggle = load_splits(
        config(
            write_rows(tmp_path / "k.csv", rows(labels=(1, 2, 3, 4))), "--label_names", "World,Sports,Business,Sci/Tech"
        )
    )
    assert kaggle.label_names == NAMES and kaggle.labels.values == [1, 2, 3, 4]
    assert sorted(set(kaggle.train["labels"]) | set(kaggle.validation["labels"])) == [0, 1, 2, 3]
    assert text_to_label(kaggle) == {
        r["text"]: NAMES[r["label"] - 1] for r in rows(labels=(1, 2, 3, 4)) if r["text"] in kaggle.train["text"]
    }


def test_string_labels_are_sorted_as_strings_and_can_be_renamed(tmp_path):
    data = [{"text": f"text {i}", "label": ["pos", "neg", "neutral"][i % 3]} for i in range(30)]
    train = write_rows(tmp_path / "t.csv", data)
    assert load_splits(config(train)).label_names == ["neg", "neutral", "pos"]
    renamed = load_splits(config(train, "--label_names", "negative,neutral,positive"))
    expected = {"neg": "negative", "neutral": "neutral", "pos": "positive"}
    assert text_to_label(renamed) == {
        r["text"]: expected[r["label"]] for r in data if r["text"] in renamed.train["text"]
    }


def test_integers_sort_numerically(tmp_path):
    splits = load_splits(config(write_rows(tmp_path / "t.csv", rows(labels=(10, 2, 1)))))
    assert splits.label_names == ["1", "2", "10"]


def test_a_word_among_integer_labels_is_refused_as_a_typo_unless_the_classes_are_named(tmp_path):
    """Mixed integer and text labels are refused naming the row."""
    data = rows(40) + [{"text": "Rain all week", "label": "Weather"}]
    train, test = write_rows(tmp_path / "t.csv", data), write_rows(tmp_path / "test.csv", rows(8))
    with pytest.raises(DataError, match=r"t\.csv: column 'label' holds integer labels \(0, 1, 2, 3\) and 'Weather' in "
                       r"1 row\(s\) \(row 41\): a typo\? .*name all 5 with --label_names"):  # fmt: skip
        load_splits(config(train, "--test_file", str(test)))
    named = load_splits(config(train, "--test_file", str(test), "--label_names", "w,s,b,t,weather"))
    assert named.labels.values == ["0", "1", "2", "3", "Weather"]
    assert named.test["labels"] == [r["label"] for r in rows(8)]  # 0-3 read as integers: the classes "0".."3"


def test_label_names_must_name_every_value(tmp_path):
    with pytest.raises(DataError, match=r"label_names: 3 names for the 4 label values of .*t\.csv \(0, 1, 2, 3"):
        load_splits(config(write_rows(tmp_path / "t.csv", rows()), "--label_names", "a,b,c"))


def test_a_hub_class_label_keeps_its_names(tmp_path):
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=NAMES)})
    ds = datasets.Dataset.from_list(rows(), features=features)
    ds.to_parquet(str(tmp_path / "hub.parquet"))  # as training.download saves a Hub dataset
    splits = load_splits(config(tmp_path / "hub.parquet"))
    assert splits.label_names == NAMES and splits.labels.values == [0, 1, 2, 3]


def test_several_text_columns_are_joined_and_any_label_column_name_works(tmp_path):
    data = [{"Class Index": 1 + i % 4, "Title": f"Title {i}", "Description": f"what happened {i}"} for i in range(40)]
    train = write_rows(tmp_path / "kaggle.csv", data)
    splits = load_splits(config(train, "--text_column_names", "Title,Description", "--label_column", "Class Index"))
    assert "Title 3 what happened 3" in set(splits.train["text"]) | set(splits.validation["text"])
    dashed = load_splits(
        config(
            train,
            "--text_column_names",
            "Title,Description",
            "--label_column",
            "Class Index",
            "--text_column_delimiter",
            " - ",
        )
    )
    assert "Title 3 - what happened 3" in set(dashed.train["text"]) | set(dashed.validation["text"])


def test_a_text_pair_column_is_kept_for_pair_tokenization(tmp_path, smoke_dir):
    data = [
        {"premise": f"premise {i}", "hypothesis": f"hypothesis {i}", "label": ["yes", "no"][i % 2]} for i in range(40)
    ]
    train = write_rows(tmp_path / "nli.jsonl", data)
    cfg = config(
        train,
        "--text_column_names",
        "premise",
        "--text_pair_column",
        "hypothesis",
        "--model_name_or_path",
        str(smoke_dir / "model"),
    )
    splits = load_splits(cfg)
    assert list(zip(splits.train["text"], splits.train["text_pair"]))[0][1].startswith("hypothesis")
    tokenizer = load_tokenizer(cfg)
    tokenized = tokenize_splits(splits, tokenizer, cfg)
    first = tokenized.train[0]
    expected = tokenizer(splits.train["text"][0], splits.train["text_pair"][0])["input_ids"]
    assert first["input_ids"] == expected and expected.count(tokenizer.sep_token_id) == 2


def test_validation_split_is_seeded_deterministic_and_disjoint(tmp_path):
    train = write_rows(tmp_path / "t.csv", rows(200))
    first, again = load_splits(config(train)), load_splits(config(train))
    other_seed = load_splits(config(train, "--seed", "7"))
    assert list(first.validation["text"]) == list(again.validation["text"])
    assert list(first.validation["text"]) != list(other_seed.validation["text"])
    assert len(first.validation) == 50 and len(first.train) == 150
    assert not set(first.validation["text"]) & set(first.train["text"])


def test_validation_and_test_files_and_num_samples(tmp_path):
    train = write_rows(tmp_path / "t.csv", rows(100))
    val = write_rows(tmp_path / "v.jsonl", rows(12))
    test = write_rows(tmp_path / "x.parquet", rows(20))
    splits = load_splits(config(train, "--validation_file", str(val), "--test_file", str(test), "--num_samples", "10"))
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (10, 10, 10)
    full = load_splits(config(train, "--validation_file", str(val), "--test_file", str(test)))
    assert (len(full.train), len(full.validation), len(full.test)) == (100, 12, 20)


@pytest.mark.parametrize(
    "bad_rows, message",
    [
        ([{"text": "a", "category": 1}] * 2, "missing column 'label'"),
        ([{"body": "a", "label": 1}] * 2, "missing column 'text'"),
        ([{"text": "ok", "label": 0}, {"text": "ok", "label": None}], "row 2: label None is not a class"),
        ([{"text": "ok", "label": 0}, {"text": "ok", "label": "World"}], "mixes label types"),
        ([{"text": "ok", "label": 0}] * 3, "1 distinct label"),
        ([{"text": "ok", "label": 0}, {"text": "   ", "label": 1}], "row 2: empty text"),
        ([{"text": "", "label": 0}, {"text": None, "label": 1}], "text column 'text' is empty in every row"),
    ],
)
def test_bad_rows_are_reported_with_file_and_row(tmp_path, bad_rows, message):
    train = write_rows(tmp_path / "bad.jsonl", bad_rows)
    with pytest.raises(DataError, match=message) as info:
        load_splits(config(train))
    assert "bad.jsonl" in str(info.value)


@pytest.mark.parametrize("split", ["validation", "test"])
def test_a_label_never_seen_in_training_names_the_value_the_file_and_the_row(tmp_path, split):
    train = write_rows(tmp_path / "t.csv", rows(40, labels=("neg", "pos")))
    other = write_rows(tmp_path / f"{split}.csv", [{"text": "ok", "label": "pos"}, {"text": "x", "label": "mixed"}])
    with pytest.raises(
        DataError,
        match=rf"{split}\.csv: row 2: label 'mixed' never appears in the training data "
        r"\(.*t\.csv: neg, pos\)",
    ):
        load_splits(config(train, f"--{split}_file", str(other)))


def test_empty_missing_and_unparsable_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not parquet at all" * 10)
    broken_json = tmp_path / "broken.jsonl"
    broken_json.write_text('{"text": "a", "label": 0}\n{"text": \n')
    for path, message in [
        (empty, "file is empty"),
        (header_only, "no rows"),
        (garbage, "cannot parse"),
        (broken_json, "cannot parse"),
        (tmp_path / "absent.csv", "file not found"),
    ]:
        with pytest.raises(DataError, match=message) as info:
            load_splits(config(path))
        assert path.name in str(info.value)


def duplicate_text_column(path):
    """Two columns named `text`: the first holds the real texts, the second something else."""
    rows = [("real news text number " + str(i), "other", i % 2) for i in range(20)]
    if path.suffix == ".csv":
        path.write_text("text,text,label\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    elif path.suffix == ".jsonl":
        path.write_text("".join(f'{{"text": "{a}", "text": "{b}", "label": {c}}}\n' for a, b, c in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = [pa.array([r[i] for r in rows]) for i in range(3)]
        pq.write_table(pa.Table.from_arrays(columns, names=["text", "text", "label"]), path)
    return path


@pytest.mark.parametrize(("suffix", "where"), [(".csv", "header"), (".jsonl", "first object"), (".parquet", "schema")])
def test_a_column_named_twice_is_one_line_naming_it(tmp_path, suffix, where):
    """pandas would have read the csv's second `text` as `text.1` and trained on the first without a word."""
    path = duplicate_text_column(tmp_path / f"train{suffix}")
    with pytest.raises(DataError) as info:
        load_splits(config(path))
    assert str(info.value) == (
        f"{path}: column 'text' is named 2 times in its {where}; rename or drop the extra ones, so that it is clear "
        "which column to read"
    )


def test_tokenized_batches_are_padded_to_the_longest_or_its_multiple_of_8(tmp_path, smoke_dir):
    train = write_rows(tmp_path / "t.csv", rows(64))
    cfg = config(
        train,
        "--model_name_or_path",
        str(smoke_dir / "model"),
        "--per_device_train_batch_size",
        "8",
        "--max_length",
        "12",
    )
    tokenizer = load_tokenizer(cfg)
    splits = tokenize_splits(load_splits(cfg), tokenizer, cfg)
    assert set(splits.train.column_names) == {"input_ids", "labels", "length", "document"}  # the collator adds the mask
    assert max(splits.train["length"]) <= 12  # truncated to max_length
    train_loader, sampler, val_loader, _ = make_dataloaders(splits, tokenizer, cfg, num_processes=1)
    for batch in list(train_loader) + list(val_loader):  # CPU default: to the longest text, no rounding
        assert batch["input_ids"].shape[1] == int(batch["attention_mask"].sum(1).max())
        assert batch["labels"].dtype == torch.long
    cfg.pad_to_multiple_of = 8  # the GPU default
    train_loader, _, val_loader, _ = make_dataloaders(splits, tokenizer, cfg, num_processes=1)
    for batch in list(train_loader) + list(val_loader):
        width = batch["input_ids"].shape[1]
        longest = int(batch["attention_mask"].sum(1).max())
        assert width % 8 == 0 and width - 8 < longest <= width
    # loader workers (the GPU default: collation off the training thread) give the very same batches
    assert loader_workers(cfg, "cuda") == GPU_LOADER_WORKERS and loader_workers(cfg, "cpu") == 0
    cfg.dataloader_num_workers = 2
    in_workers, _, _, _ = make_dataloaders(splits, tokenizer, cfg, num_processes=1)
    assert in_workers.num_workers == 2 and loader_workers(cfg, "cpu") == 2
    for ours, theirs in zip(list(in_workers), list(train_loader), strict=True):
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    # the second tokenization is read from the datasets cache: same fingerprint, no new cache file
    again = tokenize_splits(load_splits(cfg), tokenizer, cfg)
    assert again.train._fingerprint == splits.train._fingerprint
    assert again.train.cache_files == splits.train.cache_files


# ----------------------------------------------------------------------------------- other problem types


def tagged_rows(n: int = 40) -> list[dict]:
    tags = [["sports"], ["business", "world"], ["world"], ["sports", "tech", "world"]]
    return [{"text": f"{TEXTS[i % len(TEXTS)]} number {i}", "labels": tags[i % len(tags)]} for i in range(n)]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_list_labels_are_multi_label_with_the_sorted_union_as_classes(tmp_path, suffix):
    train = write_rows(tmp_path / f"tags{suffix}", tagged_rows())
    splits = load_splits(config(train, "--label_column", "labels"))
    assert splits.labels.problem_type == "multi_label_classification"
    assert splits.label_names == ["business", "sports", "tech", "world"]
    by_text = {r["text"]: r["labels"] for r in tagged_rows()}
    for text, hot in zip(splits.train["text"], splits.train["labels"]):
        assert [name for name, on in zip(splits.label_names, hot) if on] == sorted(by_text[text])


def test_a_delimited_string_column_is_multi_label_with_label_delimiter(tmp_path):
    rows = [{"text": r["text"], "tags": "|".join(r["labels"])} for r in tagged_rows()]
    train = write_rows(tmp_path / "tags.csv", rows)
    splits = load_splits(config(train, "--label_column", "tags", "--label_delimiter", "|"))
    assert splits.labels.problem_type == "multi_label_classification" and len(splits.label_names) == 4
    with pytest.raises(DataError, match="label 'business\\|world' holds '\\|'.*pass --label_delimiter '\\|'"):
        load_splits(config(train, "--label_column", "tags"))  # without it, 'a|b' would be one class named a|b


def test_a_hub_sequence_of_class_labels_keeps_its_names():
    names = ["toxic", "obscene", "threat"]
    features = datasets.Features(
        {"text": datasets.Value("string"), "labels": datasets.List(datasets.ClassLabel(names=names))}
    )
    ds = datasets.Dataset.from_dict({"text": ["a", "b"], "labels": [[0, 2], [1]]}, features=features)
    cfg = load_config(["--label_column", "labels"])
    space = LabelSpace.of_training_data(ds, "hub[train]", "labels", cfg)
    assert space.problem_type == "multi_label_classification" and space.names == names
    assert space.encode(ds, "hub[train]", "labels") == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]


def test_float_labels_are_regression_unless_told_otherwise(tmp_path):
    rows = [{"text": f"{TEXTS[i % 6]} {i}", "score": [0.5, 1.0, 2.25, 4.0][i % 4]} for i in range(40)]
    train = write_rows(tmp_path / "scores.csv", rows)
    splits = load_splits(config(train, "--label_column", "score"))
    assert splits.labels.problem_type == "regression" and splits.label_names == ["score"]
    assert sorted(set(splits.train["labels"]) | set(splits.validation["labels"])) == [0.5, 1.0, 2.25, 4.0]
    whole = write_rows(tmp_path / "whole.csv", [{**r, "score": float(i % 3)} for i, r in enumerate(rows)])
    assert load_splits(config(whole, "--label_column", "score")).labels.problem_type == "regression"
    classes = load_splits(config(whole, "--label_column", "score", "--do_regression", "false"))
    assert classes.labels.problem_type == "single_label_classification" and classes.label_names == ["0", "1", "2"]
    forced = load_splits(config(write_rows(tmp_path / "ints.csv", rows_with_ints()), "--do_regression"))
    assert forced.labels.problem_type == "regression"


def rows_with_ints() -> list[dict]:
    return [{"text": f"{TEXTS[i % 6]} {i}", "label": i % 5} for i in range(40)]


@pytest.mark.parametrize(
    "suffix,rows,column,message",
    [
        (".jsonl", [{"text": "a", "labels": ["x"]}, {"text": "b", "labels": []}], "labels", "row 2: no labels"),
        (".jsonl", [{"text": "a", "labels": ["x", 1]}, {"text": "b", "labels": ["y"]}], "labels", "mixes label types"),
        (".jsonl", [{"text": "a", "labels": ["x"]}, {"text": "b", "labels": "y"}], "labels", "row 2: labels 'y' are"),
        (
            ".csv",
            [{"text": "a", "score": 0.5}, {"text": "b", "score": float("nan")}],
            "score",
            "row 2: target (nan|None)",
        ),
        (".csv", [{"text": "a", "score": 1.5}, {"text": "b", "score": None}], "score", "row 2: target (nan|None)"),
    ],
)
def test_bad_labels_of_other_problem_types_name_the_row(tmp_path, suffix, rows, column, message):
    train = write_rows(tmp_path / f"bad{suffix}", rows * 10)
    with pytest.raises(DataError, match=message):
        load_splits(config(train, "--label_column", column))


@pytest.mark.parametrize("target", [1e300, -1e20, 2e19, 1.5e19, 1e16])
def test_a_regression_target_is_checked_in_float32_where_the_loss_sums_its_squares(tmp_path, target):
    rows = [{"text": f"{TEXTS[i % 6]} {i}", "score": [0.5, 1.0, 2.25, 4.0][i % 4]} for i in range(40)]
    rows[6]["score"] = target  # finite in float64; squared errors of a batch of such rows overflow float32
    for i in range(8, 40, 2):  # before, half the rows at 1.5e19 passed the per-row check and the loss hit inf
        rows[i]["score"] = target
    with pytest.raises(DataError, match=r"scores.csv: row 7: target .* too large for float32"):
        load_splits(config(write_rows(tmp_path / "scores.csv", rows), "--label_column", "score"))


def test_fractional_numbers_with_one_word_are_refused_not_made_classes(tmp_path):
    rows = [{"text": f"{TEXTS[i % 6]} {i}", "score": round(0.37 * i, 2)} for i in range(400)]
    rows[11]["score"] = "abc"  # pandas reads the whole column as text: 400 distinct 'classes'
    train = write_rows(tmp_path / "scores.csv", rows)
    with pytest.raises(DataError, match=r"scores.csv: column 'score' holds fractional numbers .* row 12 holds 'abc'"):
        load_splits(config(train, "--label_column", "score"))
    # told they are classes, they are (the user's call)
    classes = load_splits(config(train, "--label_column", "score", "--do_regression", "false"))
    assert classes.labels.problem_type == "single_label_classification"


def test_numbers_and_strings_mixed_in_a_jsonl_label_column_are_refused(tmp_path):
    rows = [{"text": f"{TEXTS[i % 6]} {i}", "score": [0.5, 1.5, "2.5"][i % 3]} for i in range(30)]
    with pytest.raises(DataError, match=r"column 'score' mixes label types \(numbers and strings\)"):
        load_splits(config(write_rows(tmp_path / "mixed.jsonl", rows), "--label_column", "score"))


def test_a_multi_label_validation_label_never_seen_in_training_is_named(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", tagged_rows())
    validation = write_rows(tmp_path / "validation.jsonl", [{"text": "x", "labels": ["sports", "opinion"]}])
    with pytest.raises(DataError, match=r"validation.jsonl: row 1: label 'opinion' never appears in the training"):
        load_splits(config(train, "--label_column", "labels", "--validation_file", str(validation)))


def test_remove_columns_and_a_seeded_shuffle(tmp_path):
    rows = [{**r, "note": "x"} for r in rows_with_ints()]
    train = write_rows(tmp_path / "train.csv", rows)
    with pytest.raises(DataError, match=r"missing column 'text'"):
        load_splits(config(train, "--remove_columns", "text"))
    kept = load_splits(config(train, "--remove_columns", "note", "--shuffle_train_dataset"))
    again = load_splits(config(train, "--remove_columns", "note", "--shuffle_train_dataset"))
    assert kept.train["text"] == again.train["text"] != load_splits(config(train)).train["text"]


def test_per_label_thresholds_on_single_label_data_are_refused_not_ignored(tmp_path):
    train = write_rows(tmp_path / "train.csv", rows())
    with pytest.raises(DataError, match="--threshold_strategy per_label fits a threshold per label of multi-label"):
        load_splits(config(train, "--threshold_strategy", "per_label"))


@pytest.mark.parametrize("bad", ["Sci|Tech", "World\n", "Sports\x07"])
def test_label_names_with_a_bar_or_a_control_character_are_refused(tmp_path, bad):
    train = write_rows(tmp_path / "train.jsonl", rows(labels=("Business", bad)))
    with pytest.raises(DataError, match="holds '\\|' or a control character"):
        load_splits(config(train))
    renamed = load_splits(config(train, "--label_names", "Business,Other"))  # renamed: fine
    assert renamed.label_names == ["Business", "Other"]


def test_a_chunked_pair_that_leaves_no_room_names_its_row_not_its_batch_index(tmp_path, smoke_dir):
    data = [{"premise": f"premise {i}", "hypothesis": f"hypothesis {i}", "label": i % 2} for i in range(1200)]
    data[1105]["hypothesis"] = " ".join(["reuters reported"] * 40)  # row 1106: a 'shorter' side filling the window
    data[1105]["premise"] = data[1105]["hypothesis"] + " and more"
    train = write_rows(tmp_path / "nli.jsonl", data)
    cfg = load_config(
        ["--train_file", str(train), "--validation_split", "0.0001", "--shuffle_train_dataset", "false"]
        + ["--text_column_names", "premise", "--text_pair_column", "hypothesis", "--long_text", "chunk"]
        + ["--max_length", "32", "--chunk_stride", "4", "--model_name_or_path", str(smoke_dir / "model")]
    )
    splits = load_splits(cfg)
    row = splits.train["text_pair"].index(data[1105]["hypothesis"]) + 1  # where it landed in the train split
    with pytest.raises(DataError, match=f"train: row {row}: the shorter text of a pair takes"):
        tokenize_splits(splits, load_tokenizer(cfg), cfg)
