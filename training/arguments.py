"""The parsers of evaluate, predict, push, download and check-env, built without torch for a fast --help."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from contract import precision
from contract.help import HelpFormatter, prog
from contract.long_text import MODES, LongText
from contract.runtimes import RUNTIMES
from training.smoke import presets

if TYPE_CHECKING:
    from contract.loading import LoadedModel

OUTPUT_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")
RUNTIME_CHOICES = ("auto", *RUNTIMES)  # the service's BACKEND values beside torch


def _parser(module: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog(module), description=description, epilog=epilog, formatter_class=HelpFormatter
    )


def _checkpoint_parser(module: str, description: str) -> argparse.ArgumentParser:
    """A command reading a saved model: --checkpoint_dir first."""
    parser = _parser(module, description)
    parser.add_argument(
        "--checkpoint_dir", default="checkpoints", help="a training output folder or any save_pretrained folder"
    )
    return parser


def _data_arguments(parser: argparse.ArgumentParser) -> None:
    """How texts are read; default: as in training."""
    parser.add_argument("--text_column_names", type=lambda s: s.split(","), help="text column(s), comma-separated")
    parser.add_argument("--text_column_delimiter", help="joins several text columns (default: a space)")
    parser.add_argument("--text_pair_column", help="the second text of sentence-pair tasks")
    parser.add_argument("--max_length", type=int, help="tokens per text; default: the training run's, else 128")
    parser.add_argument(
        "--long_text",
        choices=MODES,
        help="texts longer than max_length: truncate, or chunk (every window scored, logits pooled as the model's "
        "config.json says); default: the model's config.json, else truncate",
    )
    parser.add_argument(
        "--chunk_stride", type=int, help="tokens shared by consecutive windows; default: the model's, else 32"
    )


def long_text_for(loaded: LoadedModel, args: argparse.Namespace) -> LongText:
    """The model's long-text settings, with --long_text and --chunk_stride over them (evaluate, predict)."""
    recorded = loaded.long_text
    stride = recorded.stride if args.chunk_stride is None else args.chunk_stride
    return dataclasses.replace(recorded, mode=args.long_text or recorded.mode, stride=stride)


def evaluate() -> argparse.ArgumentParser:
    parser = _checkpoint_parser("training.evaluate", "Score a saved checkpoint on a labelled split.")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--test_file", help="csv, jsonl or parquet with text and label columns")
    source.add_argument("--dataset_name", help="a Hub dataset (default when no file is given: ag_news)")
    source.add_argument("--preset", choices=list(presets()), help="a smoke preset's test file (offline)")
    parser.add_argument("--dataset_config_name", help="the Hub dataset's configuration (subset) name")
    parser.add_argument("--split", default="test", help="the Hub dataset's split")
    _data_arguments(parser)
    parser.add_argument("--label_column", help="the label column; default: the training run's, else label")
    parser.add_argument("--per_device_eval_batch_size", type=int, default=64, help="texts per forward pass")
    parser.add_argument(
        "--mixed_precision",
        type=precision.canonical,
        help=f"one of {', '.join(precision.ACCEPTED)}: the weights are cast to it, as predict and the service cast "
        "them, so all three compute the same numbers; default: the preset's (smoke: fp32), else auto",
    )
    parser.add_argument(
        "--extra_metrics",
        type=lambda s: [m for m in s.split(",") if m],
        default=[],
        help="more `evaluate` metrics, comma-separated (Hub names or local paths)",
    )
    parser.add_argument(
        "--teacher",
        help="a distilled student's teacher: its metrics on the same rows and their agreement beside (default: the "
        "teacher the student's distillation.json names, where that folder is here)",
    )
    return parser


def predict() -> argparse.ArgumentParser:
    parser = _checkpoint_parser("training.predict", "Label csv, jsonl or parquet files with a checkpoint.")
    parser.add_argument(
        "--input_file",
        required=True,
        help="csv, jsonl or parquet with the text column(s); or many: a glob ('shards/*.parquet'), a folder, or an "
        "fsspec URL (s3://bucket/shards/*.parquet with s3fs installed) with --output_dir",
    )
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--output_file", help=f"{', '.join(OUTPUT_SUFFIXES)}: the format follows the extension")
    out.add_argument(
        "--output_dir",
        help="one output per input shard, same stem, written atomically; a rerun skips the shards already done with "
        "this model",
    )
    parser.add_argument(
        "--output_format", choices=[s[1:] for s in OUTPUT_SUFFIXES], help="with --output_dir; default: the input's"
    )
    parser.add_argument(
        "--ray", action="store_true", help="score the shards with Ray Data (map_batches over model replicas)"
    )
    parser.add_argument("--ray_address", help="a Ray cluster (ray://host:10001, or auto); default: a local Ray")
    parser.add_argument("--num_replicas", type=int, default=1, help="with --ray: model replicas (actors)")
    parser.add_argument("--replica_cpus", type=float, default=1, help="with --ray: CPUs per replica (its threads)")
    parser.add_argument("--replica_gpus", type=float, default=0, help="with --ray: GPUs per replica")
    _data_arguments(parser)
    parser.add_argument(
        "--overwrite_prediction_columns",
        action="store_true",
        help="replace the input's own prediction columns (predicted_label(s), predicted_score, predicted_value, "
        "score_<label>) instead of refusing",
    )
    parser.add_argument("--per_device_batch_size", type=int, default=64, help="texts per forward pass")
    parser.add_argument("--chunk_size", type=int, default=4096, help="rows read, scored and written at a time")
    parser.add_argument(
        "--runtime",
        choices=("torch", *RUNTIME_CHOICES),
        default="torch",
        help="torch: PyTorch here at --mixed_precision; auto, openvino or onnxruntime: the service scores (a process "
        "on 127.0.0.1) with the runtime and precision it chooses (int8 where it agrees with fp32)",
    )
    parser.add_argument(
        "--mixed_precision",
        type=precision.canonical,
        default="auto",
        help="the service's DTYPE names; auto: bf16 where native, fp16 on GPUs without bf16, else fp32",
    )
    return parser


def push() -> argparse.ArgumentParser:
    parser = _parser("training.push", "Upload a training output folder to the Hugging Face Hub.")
    parser.add_argument("--checkpoint_dir", default="checkpoints", help="a training output folder")
    parser.add_argument("--hub_model_id", required=True, help="user/name or org/name")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    return parser


DOWNLOAD_EPILOG = """\
On a machine with internet, then copy the folder to the offline machines and train there:
  agnews download --output_dir offline
  HF_HUB_OFFLINE=1 accelerate launch training/train.py --config offline/train_config.yaml"""


def download() -> argparse.ArgumentParser:
    parser = _parser("training.download", "Fetch a model and a dataset for machines without the Hub.", DOWNLOAD_EPILOG)
    parser.add_argument("--output_dir", required=True, help="folder to fill (created; existing files are replaced)")
    parser.add_argument("--model_name_or_path", default="distilbert-base-uncased", help="Hub model id or folder")
    parser.add_argument("--dataset_name", default="ag_news", help="Hub dataset id or local dataset folder")
    parser.add_argument("--text_column_names", default="text", help="text column(s), comma-separated")
    parser.add_argument("--label_column", default="label", help="the label column")
    return parser


CHECK_ENV_EPILOG = """\
  agnews check-env                      this process: devices, precision, collectives
  agnews check-env --num_processes 2    the same across 2 processes, started with accelerate launch"""


def check_env() -> argparse.ArgumentParser:
    parser = _parser(
        "training.check_env",
        "What this machine and its processes can do: devices, collectives, speed.",
        CHECK_ENV_EPILOG,
    )
    parser.add_argument(
        "--num_processes",
        type=int,
        help="without a launcher: check, then start this many processes with accelerate launch",
    )
    parser.add_argument("--main_process_port", type=int, default=29500, help="rendezvous port for --num_processes")
    parser.add_argument(
        "--config_file",
        help="accelerate config for --num_processes (default: --multi_gpu on GPUs, the 2-process CPU config on CPU)",
    )
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for all processes to join")
    parser.add_argument(
        "--buffer_mb", type=float, help="all-reduce size for the bandwidth probe (default: 256 MB on GPU, 16 on CPU)"
    )
    return parser


def distill() -> argparse.ArgumentParser:
    parser = _parser(
        "training.distill",
        "Distil a teacher into a student on unlabelled files; other flags go to `agnews train`.",
    )
    parser.allow_abbrev = False  # a train flag passed through is never taken for one of these
    parser.add_argument("--teacher", required=True, help="the teacher's checkpoint folder, or its service's URL")
    parser.add_argument("--input_file", required=True, help="unlabelled csv / jsonl / parquet: a file, glob or folder")
    parser.add_argument("--output_dir", required=True, help="the student's checkpoint folder (its work in distill/)")
    student = parser.add_mutually_exclusive_group(required=True)
    student.add_argument("--student_layers", help="a copy of the teacher with these layers (0,2,4) or this many (3)")
    student.add_argument("--model_name_or_path", help="the student to start from, any model `agnews train` takes")
    parser.add_argument("--train_file", help="labelled rows mixed in (their labels weigh --distill_alpha)")
    parser.add_argument("--text_column", default="text", help="the texts' column in every file")
    parser.add_argument("--text_pair_column", help="a pair's second text (a reranker's passages), in every file")
    parser.add_argument(
        "--label_column",
        default="label",
        help="the labels' column in --train_file and --test_file (and the student's training rows)",
    )
    parser.add_argument(
        "--held_out",
        type=int,
        default=500,
        help="texts held out to measure agreement on (at most a fifth of the files)",
    )
    parser.add_argument("--seed", type=int, default=42, help="shuffles the texts before holding some out")
    parser.add_argument("--config_file", help="an accelerate config for the training (several processes, FSDP)")
    parser.add_argument("--ray", action="store_true", help="the teacher scores the files on Ray Data")
    parser.add_argument("--num_replicas", help="with --ray: teacher replicas")
    return parser
