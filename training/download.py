"""`agnews download`: model, tokenizer and dataset fetched once, for nodes without internet, with a train_config.yaml
pointing train.py at them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import datasets
import yaml
from transformers import AutoModel, AutoTokenizer

from contract.errors import UserError
from contract.hub import explain_missing, hub_reachable, is_offline
from training import arguments
from training.cli import run_command
from training.data.errors import DataError

logger = logging.getLogger("download")

CONFIG_NAME = "train_config.yaml"


def require_hub(sources: list[str]) -> None:
    """Fail at once when a needed Hub does not answer."""
    remote = [s for s in sources if not Path(s).exists()]
    if remote and (is_offline() or not hub_reachable()):
        raise UserError(
            f"Cannot download {', '.join(remote)}: the Hugging Face Hub is out of reach"
            f"{' (HF_HUB_OFFLINE is set)' if is_offline() else ''}. Run `python -m training.download` on a machine "
            "with internet (a login node), into a folder the compute nodes can read."
        )


def save_model(name: str, folder: Path) -> None:
    """The pretrained encoder and its tokenizer."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModel.from_pretrained(name)
    except OSError as exc:
        raise explain_missing(f"model {name!r}", exc) from None
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)  # safetensors
    logger.info("Model %s -> %s (%.1f M parameters)", name, folder, model.num_parameters() / 1e6)


def save_dataset(name: str, folder: Path, label_column: str) -> tuple[dict[str, Path], list[str] | None]:
    """Every split as parquet, and the class names."""
    try:
        splits = datasets.load_dataset(name)
    except (ConnectionError, FileNotFoundError, OSError) as exc:
        raise explain_missing(f"dataset {name!r}", exc) from None
    if "train" not in splits:
        raise DataError(f"dataset {name!r} has no 'train' split (found: {', '.join(splits)})")
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, ds in splits.items():
        files[split] = folder / f"{split}.parquet"
        ds.to_parquet(str(files[split]))
        logger.info("Dataset %s[%s]: %d rows -> %s", name, split, len(ds), files[split])
    feature = splits["train"].features.get(label_column)
    return files, list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


def train_config(
    model_dir: Path, files: dict[str, Path], label_names: list[str] | None, args: argparse.Namespace
) -> dict:
    config = {
        "model_name_or_path": str(model_dir.resolve()),
        "train_file": str(files["train"].resolve()),
        "text_column_names": args.text_column_names.split(","),
        "label_column": args.label_column,
    }
    if label_names:
        config["label_names"] = label_names
    if "validation" in files:
        config["validation_file"] = str(files["validation"].resolve())
    if "test" in files:
        config["test_file"] = str(files["test"].resolve())
    return config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return arguments.download().parse_args(argv)


def download(args: argparse.Namespace) -> Path:
    out = Path(args.output_dir)
    require_hub([args.model_name_or_path, args.dataset_name])
    save_model(args.model_name_or_path, out / "model")
    files, label_names = save_dataset(args.dataset_name, out / "data", args.label_column)
    config_file = out / CONFIG_NAME
    config_file.write_text(yaml.safe_dump(train_config(out / "model", files, label_names, args), sort_keys=False))
    logger.info(
        "Wrote %s. On the compute nodes:\n  HF_HUB_OFFLINE=1 accelerate launch training/train.py --config %s",
        config_file,
        config_file.resolve(),
    )
    return config_file


def cli(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stdout)  # a report for the terminal
    args = parse_args(argv)
    return run_command(lambda: download(args))


if __name__ == "__main__":
    sys.exit(cli())
