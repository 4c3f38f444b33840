"""python -m training.predict: every row once, in input order, identical on 1 and 2 processes, any format in
and out, any servable folder, bounded memory on a large file, one-line errors."""

from __future__ import annotations

import csv
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from contract import files
from contract.loading import load_model
from tests.helpers.files import read_only, write_rows
from tests.helpers.processes import ROOT, cli_env, describe, fault_env, launch

pytestmark = pytest.mark.slow
LABELS = ["World", "Sports", "Business", "Sci/Tech"]
WORDS = "stocks fell rose the yankees won nasa launched oil prices leaders signed a ceasefire google released".split()


@pytest.fixture(scope="module")
def model_dir(smoke_model) -> Path:
    return smoke_model  # read only: prediction writes its output elsewhere


def sentences(n: int, seed: int = 0, longest: int = 40) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, longest))) for _ in range(n)]


def predict(*args: str, processes: int = 1):
    result, _ = launch(["-m", "training.predict", *args], processes=processes)
    return result


@torch.no_grad()
def expected_probabilities(model: Path, texts: list[str]) -> torch.Tensor:
    loaded = load_model(str(model), device="cpu", dtype="fp32")
    rows = [
        loaded.model(**loaded.tokenizer(t, truncation=True, max_length=64, return_tensors="pt")).logits[0]
        for t in texts
    ]
    return torch.stack(rows).softmax(-1)


def test_every_row_once_in_order_identical_on_one_and_two_processes(model_dir, tmp_path):
    texts = sentences(1003)  # 10 chunks of 100 and one of 3; batches of 32 leave an uneven last batch
    source = write_rows(tmp_path / "in.csv", [{"id": i, "text": t, "note": f"n{i % 7}"} for i, t in enumerate(texts)])
    outputs = []
    for processes in (1, 2):
        out = tmp_path / f"out{processes}.csv"
        result = predict(
            "--checkpoint_dir",
            str(model_dir),
            "--input_file",
            str(source),
            "--output_file",
            str(out),
            "--chunk_size",
            "100",
            "--per_device_batch_size",
            "32",
            "--mixed_precision",  # compared with fp32 below; auto is bf16 on a CPU with AVX512-BF16 or AMX
            "fp32",
            processes=processes,
        )
        assert result.returncode == 0, describe(result)
        outputs.append(out)
    assert outputs[0].read_bytes() == outputs[1].read_bytes()
    frame = pd.read_csv(outputs[0])
    assert list(frame.columns) == [
        "id",
        "text",
        "note",
        "predicted_label",
        "predicted_score",
        "decision",  # the label, or `review` inside a review band (this model has none)
        *(f"score_{label}" for label in LABELS),
    ]
    assert frame["id"].tolist() == list(range(1003)) and frame["text"].tolist() == texts
    expected = expected_probabilities(model_dir, texts[:50] + texts[-5:])
    got = torch.tensor(
        frame[[f"score_{label}" for label in LABELS]].to_numpy()[list(range(50)) + list(range(998, 1003))]
    )
    assert torch.allclose(got.float(), expected, atol=1e-5)
    assert frame["predicted_label"].tolist()[:50] == [LABELS[i] for i in expected[:50].argmax(-1).tolist()]
    assert (frame["predicted_score"] == frame[[f"score_{label}" for label in LABELS]].max(axis=1)).all()
    assert frame["decision"].tolist() == frame["predicted_label"].tolist()
    assert not list(tmp_path.glob(".out*"))  # no temporary file or part folder left
    # the last line counts the rows each label went to and shows the first rows, as written
    counts = frame["predicted_label"].value_counts()
    said = result.stderr.strip().splitlines()[-1]
    assert f"Wrote 1003 rows to {outputs[1]}" in said and "by label: " in said, said
    assert all(f"{label} {count}" in said for label, count in counts.items()), said
    assert f"first rows: '{texts[0][:45]}" in said and f"-> {frame['predicted_label'][0]};" in said, said


def test_formats_in_and_out_and_a_save_pretrained_folder(model_dir, tmp_path):
    rows = [{"Title": f"title {i}", "Description": t, "Class Index": 1 + i % 4} for i, t in enumerate(sentences(40))]
    source = write_rows(tmp_path / "kaggle.jsonl", rows)
    hf_only = Path(shutil.copytree(model_dir, tmp_path / "hf_only"))
    (hf_only / files.WEIGHTS).unlink()
    shutil.rmtree(hf_only / files.TOKENIZER_DIR)
    answers = {}
    for model, out in ((model_dir, tmp_path / "a.parquet"), (hf_only, tmp_path / "b.jsonl")):
        result = predict(
            "--checkpoint_dir",
            str(model),
            "--input_file",
            str(source),
            "--output_file",
            str(out),
            "--text_column_names",
            "Title,Description",
            "--mixed_precision",  # compared with fp32 below
            "fp32",
        )
        assert result.returncode == 0, describe(result)
        answers[out.suffix] = pd.read_parquet(out) if out.suffix == ".parquet" else pd.read_json(out, lines=True)
    a, b = answers[".parquet"], answers[".jsonl"]
    assert a["Class Index"].tolist() == b["Class Index"].tolist() == [r["Class Index"] for r in rows]
    assert a["predicted_label"].tolist() == b["predicted_label"].tolist()
    joined = [f"{r['Title']} {r['Description']}" for r in rows]
    assert torch.allclose(
        torch.tensor(a["score_Sports"].to_numpy()).float(), expected_probabilities(model_dir, joined)[:, 1], atol=1e-5
    )


def peak_rss_mb(args: list[str]) -> float:
    """Peak resident memory of one predict process (a fresh parent per measurement: RUSAGE_CHILDREN is a max)."""
    code = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 if r.returncode == 0 else -1)"
    )
    env = cli_env()
    env.pop("OMP_NUM_THREADS")  # both cores: this test is about memory, and it has 200,000 rows to score
    result = subprocess.run(
        [sys.executable, "-c", code, sys.executable, "-m", "training.predict", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return float(result.stdout.strip().splitlines()[-1])


def test_memory_stays_bounded_on_100000_rows(model_dir, tmp_path):
    def write(n: int) -> Path:
        path = tmp_path / f"rows{n}.csv"
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["id", "text"])
            writer.writerows((i, t) for i, t in enumerate(sentences(n, seed=n, longest=8)))
        return path

    peaks = {}
    for n in (10_000, 100_000):  # short rows: 2 to 8 words
        out = tmp_path / f"out{n}.parquet"
        peaks[n] = peak_rss_mb(
            [
                "--checkpoint_dir",
                str(model_dir),
                "--input_file",
                str(write(n)),
                "--output_file",
                str(out),
                "--per_device_batch_size",
                "256",
            ]
        )
        assert peaks[n] > 0 and len(pd.read_parquet(out, columns=["id"])) == n
    print(f"peak RSS: {peaks[10_000]:.0f} MB for 10,000 rows, {peaks[100_000]:.0f} MB for 100,000 rows")
    assert peaks[100_000] - peaks[10_000] < 100, peaks  # ten times the rows, not ten times the memory


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--input_file", "{tmp}/absent.csv", "--output_file", "{tmp}/o.csv"], 1, "absent.csv: file not found"),
        (["--input_file", "{src}", "--output_file", "{tmp}/o.txt"], 2, "--output_file must end in one of"),
        (
            ["--input_file", "{src}", "--output_file", "{tmp}/o.csv", "--text_column_names", "body"],
            1,
            "missing column 'body'",
        ),
        (["--input_file", "{src}", "--output_file", "{tmp}/no/such/dir/o.csv"], 1, "output folder not found"),
        (["--input_file", "{src}", "--output_file", "{src}"], 1, "in.csv would replace the input"),
        (["--input_file", "{src}", "--output_file", "{tmp}/../{tmp.name}/in.csv"], 1, "would replace the input"),
        (
            ["--input_file", "{tmp}/labelled.csv", "--output_file", "{tmp}/again.csv"],
            1,
            "labelled.csv: already has prediction columns (predicted_label, score_World); pass "
            "--overwrite_prediction_columns",
        ),
        (
            ["--input_file", "{tmp}/twice.csv", "--output_file", "{tmp}/x.csv"],
            1,
            "twice.csv: column 'text' is named 2 times in its header",
        ),
    ],
)
def test_errors_are_one_line_and_write_nothing(model_dir, tmp_path, args, code, words, capsys, caplog):
    from training.predict import cli

    src = write_rows(tmp_path / "in.csv", [{"text": t} for t in sentences(5)])
    write_rows(tmp_path / "labelled.csv", [{"text": "x", "predicted_label": "World", "score_World": 0.9}])
    (tmp_path / "twice.csv").write_text("text,text\na,b\n")
    inputs = {p: p.read_bytes() for p in tmp_path.iterdir()}
    argv = ["--checkpoint_dir", str(model_dir), *(a.format(tmp=tmp_path, src=src) for a in args)]
    try:
        returned = cli(argv)
    except SystemExit as exc:  # argparse: usage errors exit 2
        returned = exc.code
    assert returned == code
    assert words in capsys.readouterr().err + caplog.text
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == inputs  # nothing written, nothing changed


def test_prediction_columns_are_replaced_only_when_asked_and_stay_unique(model_dir, tmp_path):
    """An input that is an earlier output: with --overwrite_prediction_columns its prediction columns are replaced
    (before, the parquet output had duplicate names and pyarrow could not read it)."""
    rows = [{"id": i, "text": t} for i, t in enumerate(sentences(30, seed=4))]
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    args = ["--checkpoint_dir", str(model_dir), "--mixed_precision", "fp32"]
    assert predict(*args, "--input_file", str(write_rows(tmp_path / "in.csv", rows)), "--output_file", str(first))
    stale = pd.read_parquet(first)
    stale["predicted_label"] = "stale"
    stale.to_parquet(first)
    result = predict(*args, "--input_file", str(first), "--output_file", str(second), "--overwrite_prediction_columns")
    assert result.returncode == 0, describe(result)
    table = pd.read_parquet(second)  # pyarrow reads it: every name once
    names = ["predicted_label", "predicted_score", "decision", *(f"score_{x}" for x in LABELS)]
    assert list(table.columns) == ["id", "text", *names]
    # a csv's cells pass through as the text they were written as
    assert "stale" not in set(table["predicted_label"]) and table["id"].tolist() == [str(i) for i in range(30)]


def test_two_runs_writing_one_output_stage_apart_and_leave_a_whole_file(model_dir, tmp_path):
    """Two runs with one --output_file at once: each stages under its own name (before, they shared one staging
    folder and one removed the other's parts); the output is one run's whole answer and nothing else is left."""
    texts = sentences(3000, seed=5)
    source = write_rows(tmp_path / "in.csv", [{"text": t} for t in texts])
    out = tmp_path / "out.csv"
    args = ["--checkpoint_dir", str(model_dir), "--input_file", str(source), "--output_file", str(out)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "training.predict", *args, "--chunk_size", "256"],
            cwd=ROOT,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    written = pd.read_csv(out)
    assert written["text"].tolist() == texts and written["predicted_label"].notna().all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.csv"]


@pytest.mark.parametrize("processes", [1, 2])
def test_a_read_only_output_folder_is_one_line_and_exit_1(model_dir, tmp_path, processes):
    """The main process finds out; every rank stops on its broadcast answer (none left waiting at a barrier)."""
    source = write_rows(tmp_path / "in.csv", [{"text": t} for t in sentences(20)])
    folder = tmp_path / "read_only"
    folder.mkdir()
    paths = {"--checkpoint_dir": model_dir, "--input_file": source, "--output_file": folder / "o.csv"}
    with read_only(folder):
        result = predict(*(str(part) for pair in paths.items() for part in pair), processes=processes)
    assert result.returncode == 1, describe(result)
    assert "[rank0]: Traceback" not in result.stderr and "[rank1]: Traceback" not in result.stderr
    if processes == 1:
        assert "Traceback" not in result.stderr  # with 2, accelerate's launcher prints its own on a failed child
    lines = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(lines) == 1 and f"cannot write {folder}: Operation not permitted" in lines[0], describe(result)
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-5), ("bf16", 2e-2)])
def test_evaluate_and_predict_compute_the_same_numbers_at_each_precision(
    model_dir, smoke_dir, tmp_path, precision, tolerance
):
    """evaluate and predict agree in fp32 and bf16."""
    folder = Path(shutil.copytree(model_dir, tmp_path / "ckpt", ignore=shutil.ignore_patterns("state", "runtime")))
    rows = pd.read_csv(smoke_dir / "test.csv")
    scored = tmp_path / "scored.csv"
    common = ["--mixed_precision", precision]
    result, _ = launch(
        [
            "-m",
            "training.evaluate",
            "--checkpoint_dir",
            str(folder),
            "--test_file",
            str(smoke_dir / "test.csv"),
            *common,
        ]
    )
    assert result.returncode == 0, describe(result)
    result = predict(
        "--checkpoint_dir",
        str(folder),
        "--input_file",
        str(smoke_dir / "test.csv"),
        "--output_file",
        str(scored),
        *common,
    )
    assert result.returncode == 0, describe(result)
    evaluated = pd.read_json(folder / files.EVAL_RESULTS, typ="series")["metrics"]
    predicted = pd.read_csv(scored)
    probabilities = torch.tensor(predicted[[f"score_{label}" for label in LABELS]].to_numpy(), dtype=torch.float64)
    truth = torch.tensor(rows["label"].to_numpy())
    loss = torch.nn.functional.nll_loss(probabilities.log(), truth).item()
    accuracy = (predicted["predicted_label"] == [LABELS[i] for i in rows["label"]]).mean()
    assert abs(evaluated["loss"] - loss) <= tolerance, (evaluated["loss"], loss)
    assert abs(evaluated["accuracy"] - accuracy) <= (1e-9 if precision == "fp32" else 2 / len(rows))  # 1e-9: float sums


@pytest.mark.parametrize("processes", [1, 2])
def test_a_full_disk_while_writing_predictions_is_one_line_and_leaves_nothing(model_dir, tmp_path, processes):
    """pyarrow's ENOSPC on the second part file (tests/helpers/faults: on every rank that writes one): was a pyarrow
    traceback; now one line naming the folder and the cause, exit 1, on every rank together, and no file left."""
    source = write_rows(tmp_path / "in.csv", [{"text": t} for t in sentences(40)])
    out = tmp_path / "out.csv"
    args = ["-m", "training.predict", "--checkpoint_dir", str(model_dir), "--input_file", str(source)]
    args += ["--output_file", str(out), "--chunk_size", "8"]
    result, _ = launch(args, processes=processes, env=fault_env("enospc_in_predict:2"))
    assert result.returncode == 1, describe(result)
    assert "[rank0]: Traceback" not in result.stderr and "[rank1]: Traceback" not in result.stderr, describe(result)
    lines = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(lines) == 1 and f"cannot write {out}'s parts in {tmp_path}: no space left on device" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]
