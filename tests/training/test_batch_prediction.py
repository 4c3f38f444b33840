"""`agnews predict` over many files: a glob, a folder or a URL in, one output per shard in --output_dir, resumable
(a record beside each output), on several processes, and through Ray Data (--ray) with the same outputs."""

from __future__ import annotations

import argparse
import json
import shlex
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
