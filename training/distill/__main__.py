"""`agnews distill`: the teacher scores the unlabelled files, a student trains on its scores with training's own loop
(every train flag passes through), and the student's agreement with the teacher on held-out texts is recorded in
metrics.json, distillation.json and the model card. A rerun goes on where it stopped: scored shards are skipped, and
--resume_from_checkpoint resumes the training.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

from contract import agreement, files
from contract.errors import UsageError, UserError
from contract.loading import load_model
from training import arguments
from training.distill import students
from training.distill.teacher import HAS_LABEL, SCORES, Columns, Teacher, label_files, rows
from training.output.atomic import write_json

logger = logging.getLogger("training.distill")
ROOT = Path(__file__).resolve().parents[2]


def teacher_flags(args: argparse.Namespace) -> list[str]:
    return ["--ray", *(["--num_replicas", args.num_replicas] if args.num_replicas else [])] if args.ray else []


def columns_of(args: argparse.Namespace) -> Columns:
    return Columns(args.text_column, args.text_pair_column, args.label_column)


def training_rows(args: argparse.Namespace, teacher: Teacher, work: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows the student trains on, the held-out texts with the teacher's scores)."""
    columns = columns_of(args)
    lake = label_files(teacher, args.input_file, work / "teacher", columns, teacher_flags(args))
    # a text scored twice teaches nothing new, and a held-out text must not be trained on under another row
    lake = lake.drop_duplicates(subset=columns.texts()).sample(frac=1.0, random_state=args.seed)
    lake = lake.reset_index(drop=True)
    held = min(args.held_out, len(lake) // 5)
    taught = [rows(teacher, lake.iloc[held:], columns, None)]
    if args.train_file:
        scored = label_files(teacher, args.train_file, work / "labelled", columns, [])
        if args.label_column not in scored.columns:
            raise UserError(f"{args.train_file}: no column {args.label_column!r} (name it with --label_column)")
        labels = [teacher.label(c, i, args.train_file) for i, c in enumerate(scored[args.label_column], start=1)]
        taught.append(rows(teacher, scored, columns, labels))
    return pd.concat(taught, ignore_index=True), rows(teacher, lake.iloc[:held], columns, None)


def train_command(args: argparse.Namespace, rest: list[str], teacher: Teacher, student: str, data: Path) -> list[str]:
    flags = ["--train_file", str(data), *columns_of(args).flags(), "--label_column", args.label_column,
             "--label_names", ",".join(teacher.names), "--teacher_column", SCORES, "--hard_label_column", HAS_LABEL,
             "--model_name_or_path", student, "--output_dir", args.output_dir, "--seed", str(args.seed)]  # fmt: skip
    if teacher.problem.graded:  # its 0 / 1 decisions would read as two classes
        flags += ["--problem_type", "reranking"]
    if "--calibration" not in rest:  # the teacher's probabilities are the target: sharpening them again moves away
        flags += ["--calibration", "none"]
    if args.student_layers:
        flags += ["--tokenizer_name", str(Path(student) / files.TOKENIZER_DIR), "--from_scratch", "false"]
        given = set(rest)  # the copy reads its texts as the teacher did, unless told otherwise
        flags += [part for flag, value in zip(teacher.reading[::2], teacher.reading[1::2]) if flag not in given
                  for part in (flag, value)]  # fmt: skip
    script = [str(ROOT / "training" / "train.py"), *rest, *flags]
    if args.config_file:
        return [sys.executable, "-m", "training.launch", "--config_file", args.config_file, *script]
    return [sys.executable, *script]


def record_agreement(out: Path, teacher: Teacher, held: pd.DataFrame, args: argparse.Namespace, layers) -> dict:
    """The student (as saved) against the teacher's recorded scores on the held-out texts: metrics.json,
    distillation.json (what the service's AGREEMENT_WITH guard measures again) and the model card."""
    student = load_model(str(out), device="cpu", dtype="fp32")
    texts = held[args.text_column].tolist()
    pairs = held[args.text_pair_column].tolist() if args.text_pair_column else None
    recorded = agreement.logits_from_scores(teacher.problem, torch.tensor(held[SCORES].tolist()))
    measured = agreement.measure(teacher.problem, agreement.logits_of(student, texts, pairs), recorded)
    metrics = json.loads((out / files.METRICS).read_text())
    write_json(out / files.METRICS, {**metrics, "agreement_with_teacher": measured})
    kept = {"texts": texts, **({"text_pairs": pairs} if pairs else {}), SCORES: held[SCORES].tolist()}
    write_json(out / agreement.RECORD, {"teacher": teacher.where, "layers": layers, "agreement": measured,
                                        "held_out": kept})  # fmt: skip
    with (out / files.MODEL_CARD).open("a", encoding="utf-8") as card:
        card.write(f"\n## Agreement with its teacher\n\nDistilled from `{teacher.where}`"
                   f"{f' (its layers {layers})' if layers else ''}: {agreement.said(measured)}.\n")  # fmt: skip
    logger.info("Student against its teacher: %s", agreement.said(measured))
    return measured


def refuse_early(args: argparse.Namespace, teacher: Teacher) -> None:
    """What cannot work, said before the teacher scores anything or a file is written."""
    if args.train_file and teacher.problem.graded:
        raise UsageError("train_file: a reranker's own grades and the deciles of its teacher's scores differ in "
                         "scale; distil it on the teacher's scores alone")  # fmt: skip
    if args.student_layers and teacher.url:
        raise UsageError("student_layers: copies the teacher's own layers, so --teacher must be its folder")
    if args.student_layers:
        students.chosen_layers(args.student_layers, teacher.layers)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args, rest = arguments.distill().parse_known_args(argv)
    try:
        teacher = Teacher.of(args.teacher)
        refuse_early(args, teacher)
        work = Path(args.output_dir) / "distill"
        work.mkdir(parents=True, exist_ok=True)
        taught, held = training_rows(args, teacher, work)
        data = work / "train.parquet"
        teacher.write(taught, data, columns_of(args))
        student, layers = args.model_name_or_path, None
        if args.student_layers:
            student = str(work / "student")
            layers = students.smaller_copy(teacher.folder, args.student_layers, Path(student))
        logger.info("Student: training on %d texts (%d held out)", len(taught), len(held))
        code = subprocess.run(train_command(args, rest, teacher, student, data), check=False).returncode
        if code != 0:
            return code
        record_agreement(Path(args.output_dir), teacher, held, args, layers)
    except UsageError as exc:
        print(f"agnews distill: {exc}", file=sys.stderr)
        return 2
    except UserError as exc:
        print(f"agnews distill: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
