"""Steps the GPU need not wait for, proven on CPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from contract import files, shapes
from tests.helpers.cuda_graphs.stand_in import REPORT, on_parameters_device
from tests.helpers.processes import ROOT, cli_env, describe, graphs_env, run_train
from training.config_parsing import load_config
from training.data.batching import Collator, make_dataloaders, pad_multiple, pad_widths
from training.data.reading import load_splits
from training.data.tokenizing import tokenize_splits
from training.model import load_tokenizer
from training.speed import capture
from training.train import cli

STEPS = 50
FOUR_WIDTHS = ("--pad_buckets", "4")  # the GPU's default: four graphs to compile, not the CPU's sixteen
CAPTURED = ("--torch_compile", "reduce-overhead")  # what `auto` picks on a GPU
EXACT = ["--dropout", "0", "--mixed_precision", "no", "--pad_buckets", "4", "--learning_rate", "5e-4"]


def guarded(tmp_path: Path, *args: str) -> dict:
    report = tmp_path / "syncs.json"
    command = [sys.executable, str(ROOT / "tests" / "helpers" / "guarded_train.py"), str(report), *args]
    result = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, describe(result)
    return json.loads(report.read_text())


@pytest.mark.slow
def test_a_training_step_never_waits_for_the_device(smoke_dir, tmp_path):
    """SDPA (the GPU default) in bf16 with gradient accumulation and clipping: 24 micro-batches, no sync in any of
    them; logging, evaluation and the stop checks (every 5 steps) read the device outside the steps, as allowed."""
    report = guarded(
        tmp_path,
        *("--preset", "smoke", "--output_dir", str(tmp_path / "out"), "--max_train_steps", "12"),
        *("--attn_implementation", "sdpa", "--mixed_precision", "bf16", "--gradient_accumulation_steps", "2"),
        *("--logging_steps", "5", "--stop_check_steps", "5", "--eval_steps", "6", "--max_grad_norm", "1"),
    )
    assert report["exit"] == 0 and report["ops"] > 5000  # the guard saw the steps' work
    syncs = "\n".join(f"step {s['step']}: {s['op']} at {' <- '.join(reversed(s['stack']))}" for s in report["syncs"])
    assert not report["syncs"], f"host-device syncs inside training steps:\n{syncs}"


def test_bucket_widths_are_few_fixed_multiples_of_8_up_to_max_length():
    assert shapes.bucket_widths(128, 4) == (32, 64, 96, 128)
    assert shapes.bucket_widths(64, 4) == (16, 32, 48, 64)
    assert shapes.bucket_widths(100, 3) == (40, 72, 100)  # rounded up to 8, the widest exactly max_length
    assert shapes.bucket_widths(16, 8) == (8, 16)  # no more widths than multiples of 8
    assert [shapes.width_for(n, (32, 64)) for n in (1, 32, 33, 64)] == [32, 32, 64, 64]
    assert shapes.width_for(70, (32, 64), multiple=8) == 72  # past the widest: rounded, never cut
    assert shapes.width_for(13) == 13 and shapes.width_for(13, multiple=8) == 16
    with pytest.raises(ValueError):
        shapes.bucket_widths(128, 0)


def test_fixed_widths_only_where_a_step_is_compiled_dynamic_multiples_of_8_on_an_eager_gpu():
    """issue 39, finding 6: an eager GPU run padded to 4 fixed widths (23 % padding instead of ~8 %) for graphs that
    nothing captures; now the default widths follow the resolved compile mode."""
    from training.speed.capture import bucket_count

    assert bucket_count(None, "reduce-overhead", "cuda") == bucket_count(None, "default", "cuda") == 4
    assert bucket_count(None, "none", "cuda") == 0  # was DEFAULT_BUCKETS
    assert bucket_count(None, "default", "cpu") == shapes.CPU_COMPILED_BUCKETS == 16
    assert shapes.bucket_widths(128, 16) == tuple(range(8, 129, 8))  # every multiple of 8: at most 7 padded tokens
    assert bucket_count(None, "none", "cpu") == 0
    assert bucket_count(6, "default", "cpu") == 6 and bucket_count(0, "none", "cuda") == 0
    cfg = load_config(["--preset", "smoke"])
    assert pad_multiple(cfg, "cuda") == 8 and pad_widths(cfg, "cuda", "none") == ()  # rounded to 8, not bucketed
    assert pad_widths(cfg, "cuda", "reduce-overhead") == shapes.bucket_widths(64, 4)


def test_auto_never_picks_a_compiled_step_that_cannot_run():
    """issue 39, finding 3: `auto` with --pad_buckets 0 on a long GPU run compiled with a recompile limit of one
    graph and failed at the second batch width; now auto compiles only with fixed widths."""
    from training.speed.capture import resolve

    assert resolve("auto", None, "cuda", 1000) == "reduce-overhead"
    assert resolve("auto", 4, "cuda", 5000) == "reduce-overhead"
    assert resolve("auto", 0, "cuda", 5000) == "none"  # was reduce-overhead
    assert resolve("auto", None, "cuda", 999) == resolve("auto", None, "cpu", 10**6) == "none"
    assert resolve("default", None, "cpu", 10) == "default"  # explicit modes as asked (config refuses 0 widths)


def test_auto_never_picks_a_compiled_step_on_several_gpus(caplog):
    """A compiled, captured step under multi-GPU DDP has never run on any machine here: auto leaves it off there,
    an explicit request is taken with a warning that it is unproven; one GPU and CPU processes are unchanged."""
    from training.speed.capture import resolve

    assert resolve("auto", None, "cuda", 10**6, processes=2) == "none"
    assert resolve("auto", None, "cuda", 10**6, processes=1) == "reduce-overhead"
    assert resolve("auto", None, "cpu", 10**6, processes=2) == "none"
    assert not caplog.records
    with caplog.at_level("WARNING"):
        assert resolve("reduce-overhead", None, "cuda", 10, processes=8) == "reduce-overhead"
        assert resolve("default", None, "cpu", 10, processes=2) == "default"  # CPU processes: tested here
    assert [r.getMessage() for r in caplog.records] == [
        "--torch_compile reduce-overhead on 8 GPUs: a compiled step under DDP or FSDP with CUDA graphs is unproven "
        "here (no multi-GPU machine has run it); --torch_compile none is the tested path"
    ]


def test_training_batches_take_the_smallest_width_that_holds_them_and_the_same_examples(smoke_dir):
    def batches(*extra: str) -> list[dict]:
        cfg = load_config(["--preset", "smoke", "--per_device_train_batch_size", "8", "--num_samples", "200", *extra])
        tokenizer = load_tokenizer(cfg)
        splits = tokenize_splits(load_splits(cfg), tokenizer, cfg)
        train, _, validation, _ = make_dataloaders(splits, tokenizer, cfg, num_processes=1)
        return list(train) + list(validation)

    dynamic, bucketed = batches(), batches("--pad_buckets", "4")
    widths = shapes.bucket_widths(64, 4)  # the smoke preset's max_length
    assert {b["input_ids"].shape[1] for b in bucketed} <= set(widths)
    for plain, padded in zip(dynamic, bucketed, strict=True):
        longest = int(plain["attention_mask"].sum(1).max())
        assert plain["input_ids"].shape[1] == longest  # CPU default: the longest text, no rounding
        assert padded["input_ids"].shape[1] == shapes.width_for(longest, widths)
        width = plain["input_ids"].shape[1]  # the same examples and labels, only more padding
        assert torch.equal(padded["input_ids"][:, :width], plain["input_ids"])
        assert torch.equal(padded["attention_mask"].sum(1), plain["attention_mask"].sum(1))
        assert torch.equal(padded["labels"], plain["labels"])


def test_the_collator_stacks_labels_as_the_loss_expects():
    features = [{"input_ids": [1, 5, 2], "labels": [1.0, 0.0]}, {"input_ids": [1, 2], "labels": [0.0, 1.0]}]
    batch = Collator(pad_token_id=0, widths=(4, 8))(features)
    assert batch["input_ids"].tolist() == [[1, 5, 2, 0], [1, 2, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert batch["labels"].dtype == torch.float32  # multi-hot; class ids stay int64
    assert Collator(0)([{"input_ids": [3], "labels": 2}])["labels"].dtype == torch.long
    left = Collator(pad_token_id=0, left=True)(features)
    assert left["input_ids"].tolist() == [[1, 5, 2], [0, 1, 2]]


def test_compiling_without_fixed_widths_is_refused_before_anything_loads(tmp_path, capsys):
    """train.py's entry point in this process: a usage error before any accelerator, data or model."""
    args = ["--preset", "smoke", "--output_dir", str(tmp_path), "--torch_compile", "default", "--pad_buckets", "0"]
    assert cli(args) == 2
    assert "pad_buckets: must be at least 1 with --torch_compile" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- compiled


def train(out: Path, *extra: str) -> dict:
    """A smoke run; compiled ones with CUDA graph steps, their step rule played on the CPU (tests/helpers)."""
    args = ["--preset", "smoke", "--output_dir", str(out), "--max_train_steps", str(STEPS), "--logging_steps", "1"]
    captured = CAPTURED[1] in extra
    env = graphs_env() if captured else None
    result, _ = run_train([*args, "--checkpointing_steps", "25", "--eval_steps", "25", *extra], env=env)
    assert result.returncode == 0, describe(result)
    if captured:  # the stand-in ran: the compiled model's outputs went through its pool
        assert int(result.stderr.rpartition(f"{REPORT}: ")[2].split()[0]) > 0, describe(result)
    return json.loads((out / files.METRICS).read_text())


@pytest.fixture(scope="module")
def compiled_runs(smoke_dir, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("compiled")
    runs = {
        "eager": EXACT,
        "compiled": [*EXACT, *CAPTURED, *FOUR_WIDTHS],
        "compiled dropout": [*CAPTURED, "--mixed_precision", "no", *FOUR_WIDTHS],
    }
    return {name: (root / name, train(root / name, *args)) for name, args in runs.items()}


@pytest.mark.slow
def test_compiled_training_gives_the_losses_of_eager_training(compiled_runs):
    eager, compiled = compiled_runs["eager"][1], compiled_runs["compiled"][1]
    losses = [[entry["loss"] for entry in run["train_loss"]] for run in (eager, compiled)]
    assert len(losses[0]) == len(losses[1]) == STEPS
    worst = max(abs(a - b) / abs(a) for a, b in zip(*losses))
    print(f"compiled vs eager: largest relative loss difference {worst:.2e} over {STEPS} steps")
    assert worst <= 1e-4
    assert eager["compilation"]["mode"] == "none" and compiled["compilation"]["mode"] == "reduce-overhead"


@pytest.mark.slow
def test_compilation_makes_one_graph_per_width_and_two_for_the_clipped_optimizer_step(compiled_runs):
    for name in ("compiled", "compiled dropout"):
        report = compiled_runs[name][1]["compilation"]
        print(f"{name}: {report}")
        assert set(report["widths"]) <= set(shapes.bucket_widths(64, 4)) and report["widths"]
        # + the clipping and the AdamW step (torch.optim breaks the graph between them); a recompilation past the
        # widths would have failed the run
        assert report["graphs"] <= len(report["widths"]) + 2
        assert report["compile_seconds"] > 0


@pytest.mark.slow
def test_the_steady_window_leaves_out_the_steps_that_compile_or_record(compiled_runs):
    """The rates a captured row reports (training/speed/throughput.py SteadyWindow): every eager step counts; a captured
    run leaves out the first RECORDING_USES steps of each width and nothing else."""
    eager = compiled_runs["eager"][1]["throughput"]
    assert eager["steady"]["examples"] == eager["examples"] > 0
    assert 0 < eager["steady"]["seconds"] <= eager["train_seconds"]
    for name in ("compiled", "compiled dropout"):
        metrics = compiled_runs[name][1]
        speed, report = metrics["throughput"], metrics["compilation"]
        batch = metrics["config"]["per_device_train_batch_size"]
        warming = speed["examples"] - speed["steady"]["examples"]
        assert 0 < warming <= capture.RECORDING_USES * len(report["widths"]) * batch, (speed, report)
        assert report["record_seconds"] > 0 and speed["steady"]["examples_per_second"] > 0


def test_a_step_is_steady_once_its_width_has_compiled_and_recorded():
    for mode, warming in ((capture.REDUCE_OVERHEAD, capture.RECORDING_USES), ("default", 1), (capture.NONE, 0)):
        report = capture.CompiledSteps(mode)
        verdicts = []
        for width in (16, 16, 32, 16, 32, 32, 16, 32, 32):
            verdicts.append(report.begin_step({"input_ids": torch.zeros(2, width)}))
            report.end_step()
        uses: dict[int, int] = {}
        expected = []
        for width in (16, 16, 32, 16, 32, 32, 16, 32, 32):
            expected.append(uses.get(width, 0) >= warming)
            uses[width] = uses.get(width, 0) + 1
        assert verdicts == expected, mode


@pytest.mark.slow
def test_a_compiled_run_resumed_mid_epoch_finishes_bitwise_identical(compiled_runs, tmp_path):
    """With dropout on: the compiled graphs draw their random numbers from the restored generator state."""
    out, metrics = compiled_runs["compiled dropout"]
    resumed = tmp_path / "resumed"
    shutil.copytree(out / files.STATE_DIR / "step_25", resumed / files.STATE_DIR / "step_25")
    again = train(resumed, *CAPTURED, "--mixed_precision", "no", *FOUR_WIDTHS, "--resume_from_checkpoint", "latest")
    last = f"{files.STATE_DIR}/step_{STEPS}/model.safetensors"
    a, b = load_file(out / last), load_file(resumed / last)
    assert a.keys() == b.keys() and not [k for k in a if k.startswith(("_orig_mod.", "module."))]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert again["train_loss"][-1] == metrics["train_loss"][-1] and again["test"] == metrics["test"]


@pytest.mark.slow
def test_a_compiled_state_resumes_eagerly_only_when_allowed_and_then_without_a_traceback(compiled_runs, tmp_path):
    """A compiled run's optimizer state refused by an eager resume, in one line."""
    out, _ = compiled_runs["compiled dropout"]
    resumed = tmp_path / "resumed"
    shutil.copytree(out / files.STATE_DIR / "step_25", resumed / files.STATE_DIR / "step_25")
    args = ["--preset", "smoke", "--output_dir", str(resumed), "--max_train_steps", str(STEPS), "--eval_steps", "25"]
    args += [
        "--checkpointing_steps",
        "25",
        "--mixed_precision",
        "no",
        *FOUR_WIDTHS,
        "--resume_from_checkpoint",
        "latest",
    ]
    refused, _ = run_train([*args, "--torch_compile", "none"])
    assert refused.returncode == 1 and "settings.torch_compile reduce-overhead -> none" in refused.stderr, describe(
        refused
    )
    assert "Traceback" not in refused.stderr
    allowed, _ = run_train([*args, "--torch_compile", "none", "--allow_inexact_resume"])
    assert allowed.returncode == 0 and "Traceback" not in allowed.stderr, describe(allowed)
    assert json.loads((resumed / files.METRICS).read_text())["global_step"] == STEPS


def test_keep_optimizer_kind_makes_a_loaded_state_fit_the_optimizer_this_run_built():
    from training.model import keep_optimizer_kind

    params = [torch.nn.Parameter(torch.randn(3))]
    compiled = torch.optim.AdamW(params, lr=1e-2, foreach=True, capturable=True)
    compiled.param_groups[0]["lr"] = torch.tensor(1e-2)
    params[0].grad = torch.ones(3)
    torch.compile(compiled.step)()  # the compiled step runs capturable AdamW on the CPU, as training does
    eager_params = [torch.nn.Parameter(params[0].detach().clone())]
    eager = torch.optim.AdamW(eager_params, lr=1e-2)
    eager.load_state_dict(compiled.state_dict())
    keep_optimizer_kind(eager)
    assert eager.param_groups[0]["capturable"] is False and isinstance(eager.param_groups[0]["lr"], float)
    eager_params[0].grad = torch.ones(3)
    eager.step()  # before: AssertionError (capturable=True on CPU tensors)
    again = torch.optim.AdamW([torch.nn.Parameter(torch.randn(3))], lr=1e-2, foreach=True, capturable=True)
    again.load_state_dict(eager.state_dict())
    keep_optimizer_kind(again)
    assert again.param_groups[0]["capturable"] is True and isinstance(again.param_groups[0]["lr"], torch.Tensor)


def test_a_resumed_capturable_optimizer_keeps_its_state_beside_the_parameters():
    """The capturable AdamW's learning rate follows its parameters' device."""
    from training.model import keep_optimizer_kind

    saved = torch.optim.AdamW([torch.nn.Parameter(torch.randn(3))], lr=1e-2, foreach=True, capturable=True)
    saved.param_groups[0]["lr"] = torch.tensor(1e-2)  # as compile_optimizer_step leaves it, saved from the CPU
    saved.param_groups[0]["params"][0].grad = torch.ones(3)
    torch.compile(saved.step)()
    on_gpu = torch.optim.AdamW(
        [torch.nn.Parameter(torch.empty(3, device="meta"))], lr=1e-2, foreach=True, capturable=True
    )
    on_gpu.load_state_dict(saved.state_dict())
    assert on_parameters_device(on_gpu) == ["group 0 lr on cpu"]  # what load_state_dict alone leaves
    keep_optimizer_kind(on_gpu)
    assert on_parameters_device(on_gpu) == []
    assert isinstance(on_gpu.param_groups[0]["lr"], torch.Tensor) and on_gpu.param_groups[0]["capturable"]
