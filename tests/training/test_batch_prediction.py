"""`agnews predict` over many files: a glob, a folder or a URL in, one output per shard in --output_dir, resumable
(a record beside each output), on several processes, and through Ray Data (--ray) with the same outputs."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.docs import block
from tests.helpers.processes import describe, fault_env, launch
from training.batch import shards

pytestmark = pytest.mark.slow
FP32 = ["--mixed_precision", "fp32"]  # comparable to 1e-5 whatever the batches hold
SHARDS = 6


@pytest.fixture(scope="module")
def inputs(smoke_dir, tmp_path_factory) -> tuple[Path, Path]:
    """6 csv shards of the smoke test file and the file they were cut from."""
    folder = tmp_path_factory.mktemp("lake")
    rows = pd.read_csv(smoke_dir / "test.csv").head(SHARDS * 40)
    for i in range(SHARDS):
        rows.iloc[i * 40 : (i + 1) * 40].to_csv(folder / f"day{i}.csv", index=False)
    whole = folder.parent / f"{folder.name}-whole.csv"
    rows.to_csv(whole, index=False)
    return folder, whole


def predict(model: Path, source: str, out: str, *extra: str, processes: int = 1, env: dict | None = None):
    args = ["--checkpoint_dir", str(model), "--input_file", source, *out.split(), *FP32, *extra]
    result, _ = launch(["-m", "training.predict", *args], processes=processes, env=env)
    return result


def assert_same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns) and len(got) == len(expected)
    scores = [c for c in expected.columns if c.startswith("score_") or c == "predicted_score"]
    assert (got["text"] == expected["text"]).all() and (got["predicted_label"] == expected["predicted_label"]).all()
    assert (got[scores] - expected[scores]).abs().to_numpy().max() <= 1e-5


@pytest.fixture(scope="module")
def labelled(smoke_model, inputs, tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """The glob into a folder, and the whole file in one run."""
    folder, whole = inputs
    out = tmp_path_factory.mktemp("labelled")
    result = predict(smoke_model, str(folder / "day*.csv"), f"--output_dir {out / 'shards'}")
    assert result.returncode == 0, describe(result)
    result = predict(smoke_model, str(whole), f"--output_file {out / 'whole.csv'}")
    assert result.returncode == 0, describe(result)
    return out / "shards", pd.read_csv(out / "whole.csv")


def test_six_shards_give_six_outputs_equal_to_one_run_over_their_concatenation(labelled):
    shards_dir, whole = labelled
    written = sorted(shards_dir.glob("day*.csv"))
    assert [p.name for p in written] == [f"day{i}.csv" for i in range(SHARDS)]
    assert_same_rows(pd.concat([pd.read_csv(p) for p in written], ignore_index=True), whole)
    record = json.loads((shards_dir / f"day0.csv{shards.DONE}").read_text())
    assert record["input"].endswith("day0.csv") and len(record["model"]) == 64 and record["size"] > 0


def test_a_rerun_on_two_processes_recomputes_only_the_missing_output(smoke_model, inputs, labelled, tmp_path):
    folder, _ = inputs
    shards_dir, _ = labelled
    copy = tmp_path / "shards"
    copy.mkdir()
    for path in shards_dir.iterdir():
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    (copy / "day3.csv").unlink()
    before = {p.name: p.stat().st_mtime_ns for p in copy.glob("day*.csv")}
    result = predict(smoke_model, str(folder / "day*.csv"), f"--output_dir {copy}", processes=2)
    assert result.returncode == 0, describe(result)
    assert "Skipped 5 of 6 shards" in result.stdout + result.stderr
    assert {p.name: p.stat().st_mtime_ns for p in copy.glob("day*.csv") if p.name != "day3.csv"} == before
    assert_same_rows(pd.read_csv(copy / "day3.csv"), pd.read_csv(shards_dir / "day3.csv"))
    # other settings are another computation: every shard again
    result = predict(smoke_model, str(folder), f"--output_dir {copy}", "--max_length", "32")
    assert result.returncode == 0, describe(result)
    assert "Skipped" not in result.stdout + result.stderr


def test_a_job_killed_after_three_shards_resumes_with_the_other_three(smoke_model, inputs, labelled, tmp_path):
    folder, _ = inputs
    shards_dir, _ = labelled
    out = tmp_path / "out"
    killed = predict(smoke_model, str(folder), f"--output_dir {out}", env=fault_env("kill_after_shard:3"))
    assert killed.returncode == -9, describe(killed)
    assert sorted(p.name for p in out.glob("day*.csv")) == ["day0.csv", "day1.csv", "day2.csv"]
    result = predict(smoke_model, str(folder), f"--output_dir {out}")
    assert result.returncode == 0, describe(result)
    assert "Skipped 3 of 6 shards" in result.stdout + result.stderr
    for i in range(SHARDS):
        assert_same_rows(pd.read_csv(out / f"day{i}.csv"), pd.read_csv(shards_dir / f"day{i}.csv"))


def test_an_unreadable_shard_is_one_line_and_the_others_finish(smoke_model, inputs, tmp_path):
    folder, _ = inputs
    lake = tmp_path / "lake"
    lake.mkdir()
    for i in (0, 1):
        (lake / f"day{i}.csv").write_bytes((folder / f"day{i}.csv").read_bytes())
    (lake / "broken.csv").write_text("title,body\nno text column,here\n")
    result = predict(smoke_model, str(lake), f"--output_dir {tmp_path / 'out'} --output_format parquet")
    assert result.returncode == 1, describe(result)
    assert "1 of 3 shards not labelled (the others are written); first:" in result.stderr
    assert "broken.csv" in result.stderr and "missing column 'text'" in result.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parquet")) == ["day0.parquet", "day1.parquet"]
    assert not list((tmp_path / "out").glob(".*"))  # no staged leftovers


def test_ray_data_writes_the_same_outputs(smoke_model, inputs, labelled, tmp_path):
    pytest.importorskip("ray", reason="pip install 'distilbert-agnews[ray]' (in the dev extra)")
    folder, _ = inputs
    shards_dir, _ = labelled
    words = shlex.split(block("docs/batch-prediction.md", "--ray").code.replace("\\\n", " "), comments=True)
    flags = words[words.index("--ray") :]  # docs/batch-prediction.md's flags, on this module's shards
    assert flags[:3] == ["--ray", "--num_replicas", "2"], words
    result = predict(smoke_model, str(folder / "day*.csv"), f"--output_dir {tmp_path / 'ray'}", *flags)
    assert result.returncode == 0, describe(result)
    for i in range(SHARDS):
        assert_same_rows(pd.read_csv(tmp_path / "ray" / f"day{i}.csv"), pd.read_csv(shards_dir / f"day{i}.csv"))
    assert (tmp_path / "ray" / f"day0.csv{shards.DONE}").is_file()


def test_replicas_that_would_take_every_cpu_are_refused_before_ray_waits_forever():
    """Ray's readers need a share of a CPU: replicas holding all of them would leave the pipeline waiting."""
    from contract.errors import UsageError
    from training.batch.ray_data import check_room

    with pytest.raises(UsageError, match="--num_replicas 2 x --replica_cpus 1 take 2 of the Ray cluster's 2 CPUs"):
        check_room(argparse.Namespace(num_replicas=2, replica_cpus=1.0), 2.0)
    check_room(argparse.Namespace(num_replicas=2, replica_cpus=0.5), 2.0)


def test_the_service_scores_the_shards_with_the_runtime_it_chooses(checkpoint_copy, inputs, labelled, tmp_path):
    """--runtime onnxruntime: `python -m inference` scores every shard (one process for the job), with the precision
    its agreement guard keeps; the decisions are PyTorch fp32's on at least that share of the rows. On a copy: the
    service records its choice beside the checkpoint."""
    pytest.importorskip("onnxruntime", reason="pip install 'distilbert-agnews[onnxruntime]' (in the dev extra)")
    folder, _ = inputs
    shards_dir, _ = labelled
    result = predict(
        checkpoint_copy, str(folder / "day*.csv"), f"--output_dir {tmp_path / 'rt'}", "--runtime", "onnxruntime"
    )
    assert result.returncode == 0, describe(result)
    assert "Scoring with the service's runtime: onnxruntime" in result.stdout + result.stderr
    got = pd.concat([pd.read_csv(tmp_path / "rt" / f"day{i}.csv") for i in range(SHARDS)], ignore_index=True)
    torch = pd.concat([pd.read_csv(shards_dir / f"day{i}.csv") for i in range(SHARDS)], ignore_index=True)
    assert list(got.columns) == list(torch.columns) and (got["text"] == torch["text"]).all()
    assert (got["predicted_label"] == torch["predicted_label"]).mean() >= 0.995
    refused = predict(
        checkpoint_copy, str(folder), f"--output_dir {tmp_path / 'x'}", "--runtime", "auto", "--max_length", "32"
    )
    assert refused.returncode == 2 and "--runtime: the service scores in one process" in refused.stderr, describe(
        refused
    )


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    """A user's lake: ids and ZIP codes with leading zeros, 1e5, flags, NA, empty cells; a shard with a label column
    in another order; one without rows."""
    folder = tmp_path_factory.mktemp("lake_as_written")
    (folder / "monday.csv").write_text(
        "id,text,zip,flag,note\n000123,Stocks fell sharply,02134,TRUE,NA\n1e5,The team won the final,00501,false,\n"
    )
    (folder / "tuesday.csv").write_text("text,id,label,zip\nNew chip doubles speed,007,Sci/Tech,02134\n")
    (folder / "wednesday.csv").write_text("id,text\n")
    return folder


def cells(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_columns_pass_through_as_written_and_every_path_writes_the_same_files(smoke_model, lake, tmp_path):
    """Three paths, the same files: cells as written, each shard's own columns, the empty shard refused alike (at
    53a86bc: 123, 2134, true, an extra label column and exit 0 under Ray)."""
    pytest.importorskip("ray", reason="pip install 'distilbert-agnews[ray]' (in the dev extra)")
    ray_flags = ["--ray", "--num_replicas", "1", "--replica_cpus", "0.5"]
    runs = {"local": predict(smoke_model, str(lake), f"--output_dir {tmp_path / 'local'}")}
    runs["ray"] = predict(smoke_model, str(lake / "*.csv"), f"--output_dir {tmp_path / 'ray'}", *ray_flags)
    for name, result in runs.items():
        assert result.returncode == 1, describe(result)
        assert "1 of 3 shards not labelled (the others are written); first:" in result.stderr, name
        assert "wednesday.csv: no rows" in result.stderr, name
    ray_output = runs["ray"].stdout + runs["ray"].stderr
    assert "core_worker.cc" not in ray_output and "deprecated" not in ray_output.lower(), ray_output
    for shard in ("monday", "tuesday"):
        one = predict(smoke_model, str(lake / f"{shard}.csv"), f"--output_file {tmp_path / f'{shard}.csv'}")
        assert one.returncode == 0, describe(one)
        given, got = cells(lake / f"{shard}.csv"), cells(tmp_path / f"{shard}.csv")
        header = list(given[0])
        assert list(got[0])[: len(header)] == header and "label" not in list(got[0])[len(header) :]
        assert [{c: row[c] for c in header} for row in got] == given
        for path in ("local", "ray"):  # the same file: scores to fp32's last digits (a replica runs one thread)
            other = cells(tmp_path / path / f"{shard}.csv")
            assert [list(row) for row in other] == [list(row) for row in got]
            for mine, theirs in zip(got, other, strict=True):
                scored = [c for c in mine if c.startswith("score_") or c == "predicted_score"]
                assert {c: v for c, v in mine.items() if c not in scored} == {
                    c: v for c, v in theirs.items() if c not in scored
                }
                assert all(abs(float(mine[c]) - float(theirs[c])) <= 1e-6 for c in scored)
    assert cells(tmp_path / "monday.csv")[0]["id"] == "000123" and cells(tmp_path / "monday.csv")[1]["id"] == "1e5"
    assert not (tmp_path / "ray" / "wednesday.csv").exists() and not (tmp_path / "local" / "wednesday.csv").exists()


@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])
def test_a_csv_shard_passes_through_as_text_in_every_output_format(smoke_model, lake, tmp_path, output_format):
    result = predict(smoke_model, str(lake / "monday.csv"), f"--output_file {tmp_path / f'out.{output_format}'}")
    assert result.returncode == 0, describe(result)
    got = pd.read_json(tmp_path / "out.jsonl", lines=True, dtype=False) if output_format == "jsonl" else None
    got = pd.read_parquet(tmp_path / "out.parquet") if got is None else got
    assert got[["id", "zip", "flag", "note"]].to_dict("records") == [
        {"id": "000123", "zip": "02134", "flag": "TRUE", "note": "NA"},
        {"id": "1e5", "zip": "00501", "flag": "false", "note": ""},
    ]


@pytest.mark.parametrize("how", ["the folder itself", "a link to it", "a hard link to an input"])
@pytest.mark.parametrize("ray", [False, True], ids=["local", "ray"])
def test_outputs_that_would_replace_an_input_are_refused_before_anything_is_written(
    smoke_model, lake, tmp_path, how, ray
):
    """Outputs onto the inputs (by path, a link, a hard link): one line, exit 1, nothing written, on both paths (at
    53a86bc Ray replaced the inputs, exit 0)."""
    inputs = tmp_path / "lake"
    shutil.copytree(lake, inputs)
    before = {p.name: p.read_bytes() for p in inputs.iterdir()}
    out = inputs
    if how == "a link to it":
        out = tmp_path / "linked"
        out.symlink_to(inputs)
    elif how == "a hard link to an input":
        out = tmp_path / "out"
        out.mkdir()
        os.link(inputs / "tuesday.csv", out / "tuesday.csv")
    flags = ["--ray", "--num_replicas", "1", "--replica_cpus", "0.5"] if ray else []
    result = predict(smoke_model, str(inputs / "*.csv"), f"--output_dir {out}", *flags)
    assert result.returncode == 1, describe(result)
    assert "would replace the input" in result.stderr and "nothing was written" in result.stderr, describe(result)
    assert {p.name: p.read_bytes() for p in inputs.iterdir()} == before
    assert sorted(p.name for p in out.iterdir()) == (["tuesday.csv"] if out.name == "out" else sorted(before))
