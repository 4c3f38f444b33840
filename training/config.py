"""The one typed training configuration: defaults < ``--preset`` < ``--config file.yaml`` < CLI flags.

Fields are grouped by concern; docs/configuration.md is generated from them (config_docs.py).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from contract import precision
from contract.errors import UsageError
from contract.long_text import DEFAULT_STRIDE, LongText
from contract.runtimes import RUNTIMES

SUPPORTED_DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet")
RENAMED = {"text_column": "text_column_names"}  # older field names, still accepted
TRACKERS = (
    "none",
    "all",
    "tensorboard",
    "wandb",
    "trackio",
    "comet_ml",
    "aim",
    "mlflow",
    "clearml",
    "dvclive",
    "swanlab",
)


ExportRuntime = Literal[("none", *RUNTIMES)]  # --export_runtime: the names contract/runtimes.py declares


class ConfigError(UsageError, ValueError):
    """An unknown, mistyped or impossible value; names the field."""


def class_weight_values(spec: str) -> list[float] | None:
    """--class_weights as numbers, or None."""
    try:
        values = [float(part) for part in spec.split(",")]
    except ValueError:
        return None
    return values if all(v > 0 and math.isfinite(v) for v in values) else None


# ------------------------------------------------------------------------------------- value checks


def _bound(op: str, limit: float):
    """A check after coercion; None passes."""
    tests = {">": lambda v: v > limit, ">=": lambda v: v >= limit, "<": lambda v: v < limit}

    def check(value):
        if value is not None and not tests[op](value):
            raise PydanticCustomError(
                "bound", "must be {op} {limit} (got {got})", {"op": op, "limit": limit, "got": repr(value)}
            )
        return value

    return AfterValidator(check)


def _comma_list(value: Any) -> Any:
    """`a,b c` or a YAML list → ["a", "b", "c"]."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, list) and all(isinstance(v, str) for v in items):
        return [part.strip() for item in items for part in item.split(",") if part.strip()]
    return value


def _precision(value: Any) -> Any:
    try:
        return precision.canonical(value)
    except ValueError:
        raise PydanticCustomError(
            "precision",
            "must be one of {names} (got {got})",
            {"names": ", ".join(precision.ACCEPTED), "got": repr(value)},
        ) from None


LORA_LEARNING_RATE = 2e-3  # LoRA's default peak rate: docs/benchmarks-log.md "LoRA against full fine-tuning"
AtLeast1 = Annotated[int, _bound(">=", 1)]
Names = Annotated[list[str], BeforeValidator(_comma_list)]
Fraction = Annotated[float, _bound(">=", 0), _bound("<", 1)]


class _Group(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


# the Trainer's --optim names of the same optimizers (transformers' OptimizerNames)
TRAINER_OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_bnb_8bit": "adamw_8bit"}


def _optimizer(value: Any) -> Any:
    return TRAINER_OPTIMIZERS.get(value, value) if isinstance(value, str) else value


# ------------------------------------------------------------------------------------------- groups


class ModelConfig(_Group):
    model_name_or_path: str = "distilbert-base-uncased"
    """Hub model id or local folder with a config, tokenizer and weights."""
    tokenizer_name: str | None = None
    """Tokenizer id or folder, when it differs from model_name_or_path."""
    from_scratch: bool = False
    """Build the model from model_name_or_path's config with random weights (smoke preset, speed benchmarks)."""
    label_tokens: str | None = None
    """Start a decoder LLM's classification head from its own next-token head: one word per label
    (`World=world,Sports=sports,...`), each one token, or `yes,no` for one output (logit_yes - logit_no, vLLM's
    from_2_way_softmax). At step 0 the classifier scores as the LM reads those tokens after --template (zero-shot).
    Recorded in config.json (label_tokens)."""
    template: str | None = None
    """A prompt template around every input, e.g. 'Topic of the story: {text}\nAnswer:' ({text_pair}, or
    {document}, for a pair's second text; {query} for {text}). Set as the tokenizer's post-processor and recorded in
    config.json (prompt_template): training, evaluate, predict and the service wrap inputs alike, and truncation and
    long-text windows cut the text, never the template."""
    dropout: Fraction | None = None
    """Override every dropout probability of the model config (0 for exactly reproducible comparisons)."""
    attn_implementation: Literal["sdpa", "eager"] | None = None
    """'sdpa' or 'eager' attention. Default: sdpa on GPU; on CPU eager, which trains faster there (docs/benchmarks.md),
    with FastDropout on the attention probabilities when --fast_dropout is on."""
    fast_dropout: bool = True
    """On CPU, replace the model's nn.Dropout modules, and the attention-probability dropout, with FastDropout
    (four 16-bit draws per 64-bit random number, same keep probability to 2^-16). No effect
    on GPU."""
    fused_optimizer: bool = True
    """Fused AdamW kernel (CPU and CUDA): one kernel for all parameters (docs/benchmarks.md)."""
    model_revision: str = "main"
    """The Hub revision (branch, tag or commit) of model_name_or_path and the tokenizer."""
    trust_remote_code: bool = False
    """Run the model repository's own code (a custom architecture); only for repositories you trust."""
    ignore_mismatched_sizes: bool = False
    """Load a checkpoint whose classification head has another number of labels: the head starts fresh."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them: much less memory for long
    --max_length (and large batches), about a third more compute per step (docs/benchmarks.md)."""
    lora_r: Annotated[int, _bound(">=", 0)] = 0
    """LoRA rank (peft: `pip install 'distilbert-agnews[peft]'`): low-rank adapters on --lora_target_modules, the
    pretrained weights frozen, the classification head trained whole. The checkpoint holds the merged weights (every
    consumer reads an ordinary classifier) and adapter/ what peft's PeftModel.from_pretrained loads. 0: every weight
    is trained."""
    lora_alpha: Annotated[float, _bound(">", 0)] = 16.0
    """LoRA scaling numerator: the adapters' update is scaled by lora_alpha / lora_r."""
    lora_dropout: Fraction = 0.1
    """Dropout on the adapters' input."""
    lora_target_modules: Names | None = None
    """Modules LoRA adapts, by name (e.g. query,value). Default: peft's choice for the architecture, else the
    model's query and value projections (or its fused query-key-value projection)."""


class DataConfig(_Group):
    dataset_name: str = "ag_news"
    """Hub dataset with train/test splits; ignored when --train_file is given."""
    dataset_config_name: str | None = None
    """The Hub dataset's configuration (subset) name, e.g. 'cola' of 'glue'."""
    train_split_name: str = "train"
    """The Hub dataset's training split."""
    validation_split_name: str | None = None
    """The Hub dataset's validation split (default: a seeded slice of the training split, see validation_split)."""
    test_split_name: str = "test"
    """The Hub dataset's test split, scored at the end when the dataset has it."""
    train_file: str | None = None
    """Local training data (.csv, .jsonl/.json or .parquet) with a text and a label column."""
    validation_file: str | None = None
    """Local validation data; default: a seeded slice of the training data (see validation_split)."""
    test_file: str | None = None
    """Local test data, scored once at the end with the best model; default: the Hub dataset's test split."""
    text_column_names: Names = ["text"]
    """Text column(s), comma-separated; several are joined with text_column_delimiter (e.g. Title,Description)."""
    text_column_delimiter: str = " "
    """What joins several text columns into one text."""
    text_pair_column: str | None = None
    """A second text column for sentence-pair tasks: each example is tokenized as (text, text_pair)."""
    label_column: str = "label"
    """Name of the label column (any name, e.g. "Class Index")."""
    label_names: Names | None = None
    """Class names, one per distinct training label value in sorted order (integers numerically, strings as strings),
    comma-separated. Default: a Hub dataset's ClassLabel names, else the values themselves. Regression: one name for
    the output (default: the label column's name)."""
    label_delimiter: str | None = None
    """Multi-label from a string column: the separator of a row's labels (e.g. '|' for 'sports|business'). A column of
    lists (jsonl / parquet, a Hub Sequence of ClassLabel) is multi-label without it."""
    do_regression: bool | None = None
    """Regression (one output, MSE loss). Default: a float label column is regression (the transformers examples' rule),
    anything else classification; false keeps whole-number floats as classes."""
    problem_type: Literal["reranking"] | None = None
    """'reranking': (query, passage) pairs with 0/1 or graded relevance labels (text_pair_column names the passages)
    train one relevance logit with binary cross-entropy, graded labels as soft targets (grade / largest grade);
    validation ranks each query's passages (NDCG@10, MRR@10, MAP). Default: read from the label column."""
    remove_columns: Names | None = None
    """Columns to drop from every split before anything else (comma-separated)."""
    shuffle_train_dataset: bool = False
    """Shuffle the training rows (seeded) once after loading, before the validation slice and --num_samples."""
    preprocessing_num_workers: AtLeast1 | None = None
    """Processes for tokenizing (datasets.map num_proc); default: one."""
    validation_split: Annotated[float, _bound(">", 0), _bound("<", 1)] | None = None
    """Fraction of the training data held out (seeded, deterministic) when no validation file is given. Default: 5 %,
    and at least 100 texts (what picking the best model, calibrating and fitting thresholds need) while that is at
    most a fifth of the data: 100 of 500 rows, 500 of 10,000."""
    num_samples: AtLeast1 | None = None
    """Use only N examples of each split (seeded shuffle), for quick runs."""
    max_length: Annotated[int, _bound(">=", 8)] = 128
    """Tokens per window: longer texts are truncated to it, or cut into windows of it with --long_text chunk."""
    long_text: Literal["truncate", "chunk"] = "truncate"
    """Texts longer than max_length: 'truncate' (cut off) or 'chunk': overlapping windows of max_length tokens, each a
    training example with its text's label; evaluation, prediction and the service score every window and pool their
    logits per text. Recorded in config.json."""
    chunk_stride: Annotated[int, _bound(">=", 0)] = DEFAULT_STRIDE
    """--long_text chunk: tokens shared by consecutive windows; below a window's text tokens (max_length less the
    special tokens)."""
    chunk_pooling: Literal["mean", "max"] = "mean"
    """--long_text chunk: a text's logits are the mean (or element-wise max) of its windows' logits. Recorded in
    config.json, so evaluation, prediction and the service pool the same way."""
    pad_to_multiple_of: AtLeast1 | None = None
    """Pad each batch to a multiple of this many tokens. Default: 8 on GPU (tensor-core shapes), 1 on CPU (no rounding,
    faster there). Used when --pad_buckets is off."""
    pad_buckets: Annotated[int, _bound(">=", 0)] | None = None
    """Pad every batch to the smallest of N fixed widths, evenly spaced up to max_length (multiples of 8), so a run
    sees N shapes: what compiled and graph-captured steps need. 0 pads each batch to its
    longest text (--pad_to_multiple_of). Default: 4 on GPU, 16 with --torch_compile on a CPU (a padded token costs a
    CPU as much as a real one: more, narrower widths), else 0."""
    packing: bool = False
    """Pack each training batch's texts end to end in one row, padded only to a token bucket:
    the linear layers do no work on padding; attention stays within each text (varlen attention on CUDA, SDPA over
    gathered texts elsewhere; neither drops attention probabilities). DistilBERT classifiers; evaluation stays
    padded. Off by default until a GPU run has measured it (docs/launching.md)."""
    group_by_length: bool | None = None
    """Batch texts of similar length together (less padding); every rank still gets an equal, disjoint shard.
    Default: the problem type's choice: on for classification, off for regression, whose
    target often follows the length (docs/benchmarks-log.md "Regression against the Trainer")."""
    dataloader_num_workers: Annotated[int, _bound(">=", 0)] | None = None
    """DataLoader worker processes per rank (0 = load in the training process). Default: 2 on GPU (collating in the
    training process holds up a captured step), 0 on CPU (the cores are busy with the matmuls)."""


class OptimizationConfig(_Group):
    num_train_epochs: AtLeast1 = 2
    """Passes over the training data."""
    max_train_steps: AtLeast1 | None = None
    """Stop after this many optimizer steps (overrides num_train_epochs)."""
    per_device_train_batch_size: AtLeast1 = 32
    """Training examples per process per forward pass."""
    auto_find_batch_size: bool = False
    """Before the first step, halve --per_device_train_batch_size (to a divisor of it) until a training pass at
    --max_length fits in memory, beside room for AdamW's states, and raise --gradient_accumulation_steps so the
    effective batch stays (accelerate's find_executable_batch_size). Every process uses the smallest found."""
    per_device_eval_batch_size: AtLeast1 = 64
    """Evaluation examples per process per forward pass."""
    gradient_accumulation_steps: AtLeast1 = 1
    """Forward/backward passes per optimizer step."""
    learning_rate: Annotated[float, _bound(">", 0)] = 5e-5
    """Peak learning rate (before --scale_lr). With LoRA (--lora_r) and no rate given: 2e-3
    (LORA_LEARNING_RATE, measured in docs/benchmarks.md)."""
    scale_lr: Literal["none", "linear"] = "none"
    """'linear' multiplies the learning rate by the number of processes (linear scaling rule); 'none' keeps it."""
    optim: Annotated[Literal["adamw", "adafactor", "adamw_8bit", "sgd"], BeforeValidator(_optimizer)] = "adamw"
    """The optimizer: 'adamw' (fused, or capturable when the step is compiled or captured: the only one a compiled or
    captured step runs; --torch_compile auto compiles nothing for the others), 'adafactor' (transformers' Adafactor
    at the given rate: factored second moments, less memory), 'adamw_8bit' (bitsandbytes' AdamW8bit, 8-bit states;
    needs bitsandbytes), 'sgd' (momentum 0.9)."""
    weight_decay: Annotated[float, _bound(">=", 0)] = 0.01
    """Weight decay of the optimizer; never applied to biases and normalisation weights (LayerNorm, RMSNorm, any
    *Norm layer), as the Trainer does."""
    warmup_ratio: Fraction = 0.1
    """Fraction of optimizer steps with linear warmup, then the --lr_scheduler_type schedule."""
    lr_scheduler_type: Literal[
        "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"
    ] = "linear"
    """Learning-rate schedule after warmup (transformers.get_scheduler): linear, cosine, cosine_with_restarts,
    polynomial, constant or constant_with_warmup."""
    max_grad_norm: Annotated[float, _bound(">=", 0)] = 1.0
    """Clip the gradient norm to this value (0 disables clipping)."""
    class_weights: str = "auto"
    """Weight the loss per class: 'none', 'balanced' (n / (classes x count), as scikit-learn; multi-label: each
    label's negatives / positives as BCE's pos_weight) or one weight per class in id order, comma-separated. 'auto':
    balanced for multi-label (measured to help rare and common labels alike), none otherwise."""
    label_smoothing_factor: Fraction = 0.0
    """Label smoothing of the classification targets (single- and multi-label); 0 turns it off."""
    teacher_column: str | None = None
    """Distillation (`agnews distill` sets it): the column of each row's teacher scores (a list: probabilities per
    label, or the value); the loss learns them (KL at distill_temperature for single-label, BCE on the probabilities
    for multi-label, MSE on the value for regression and on the logit for reranking)."""
    hard_label_column: str | None = None
    """Distillation: a 0/1 column, 1 where the row's label is a real one (distill_alpha's share of the loss learns
    it); rows without it learn the teacher only. Default: every label is real."""
    distill_alpha: Fraction = 0.0
    """Distillation: the hard labels' share of the loss, (1 - alpha) x teacher loss + alpha x label loss."""
    distill_temperature: Annotated[float, _bound(">", 0)] = 2.0
    """Distillation, single-label: the temperature both distributions are softened at (the loss scaled by T^2)."""
    mixed_precision: Annotated[str, BeforeValidator(_precision)] = precision.AUTO
    """auto, no/fp32, fp16 or bf16 (the same names as evaluation, prediction and serving).
    auto: the accelerate config's fp16/bf16 if it sets one, else bf16 where the hardware has native bf16 (bf16 GPUs;
    CPUs with AMX or AVX512-BF16), fp16 on other GPUs, else fp32."""
    seed: int = 42
    """Seed for model init, data order, dropout and the validation split."""
    torch_compile: Literal["auto", "none", "default", "reduce-overhead", "whole-step"] = "auto"
    """Compile the training step with torch.compile: the forward and backward pass (one graph
    per --pad_buckets width) and the optimizer step (a capturable multi-tensor AdamW with a tensor learning rate;
    under fp16 the fused AdamW, stepped eagerly by the GradScaler).
    'reduce-overhead' also captures CUDA graphs; 'auto' is reduce-overhead on one GPU for runs of at least 1000
    optimizer steps (compilation costs minutes at start: docs/launching.md) and none otherwise: on CPU, and on
    several GPUs, where a compiled step under DDP or FSDP is unproven (asking for it there warns).
    'whole-step' (one GPU, bf16 or fp32): the whole step, optimizer included, as one CUDA graph per width;
    under fp16, DDP or FSDP it is reduce-overhead, with a warning."""


class EvaluationConfig(_Group):
    eval_steps: AtLeast1 | None = None
    """Also evaluate every N optimizer steps (always at the end of each epoch)."""
    metric_for_best_model: str | None = None
    """Validation metric that picks the best model: any reported name (accuracy, macro_f1, recall_<label>, micro_f1,
    mse, pearson, loss, an --extra_metrics key, ...). Default: accuracy (single-label), micro_f1 (multi-label), mse
    (regression)."""
    greater_is_better: bool | None = None
    """Whether a larger metric_for_best_model is better. Default: by the metric's nature (loss, mse, mae and names
    ending in _loss or error: lower is better; anything else: higher)."""
    calibration: Literal["auto", "temperature", "none"] = "auto"
    """'temperature': once the best model is chosen, fit a temperature on the validation split (one for single-label,
    one per label for multi-label) and fold it into the output layer: every consumer of the
    checkpoint gets calibrated probabilities and the same decisions (multi-label thresholds move with their
    temperatures); metrics.json records T and the expected calibration error before and after. 'auto': for
    classification, the temperature only where it helps held-out texts (fitted on one half of validation, it must
    lower the other half's NLL or ECE by 2 % and raise neither, both halves in turn); none for regression."""
    review_precision: Annotated[float, _bound(">=", 0.5), _bound("<", 1)] | None = None
    """Fit a review band on the validation split once the model is calibrated, e.g. 0.99: the scores (the top score
    for single-label, each label's score around its threshold for multi-label) at which the model's decisions do not
    reach this precision on validation (a 95 % lower confidence bound, so the band holds on new texts), recorded in
    config.json. Every consumer then decides such inputs `review` (abstains) instead of a label; evaluate reports the
    coverage and the precision of the decided share. Fitted on 100 validation texts or more, else the run says so."""
    threshold_strategy: Literal["auto", "fixed", "per_label"] = "auto"
    """Multi-label decision thresholds: 'fixed' 0.5 for every label, or 'per_label': the threshold maximising each
    label's F1 on the validation data ('auto': per_label for multi-label data). Written to config.json; evaluation,
    prediction and the service use it."""
    early_stopping_patience: AtLeast1 | None = None
    """Stop after N evaluations without improvement of metric_for_best_model."""
    extra_metrics: Names | None = None
    """More `evaluate` metrics to report, by Hub name or local path (comma-separated), e.g. matthews_correlation;
    loaded and checked at start."""
    output_dir: str = "checkpoints"
    """Folder for the best model, tokenizer, config, metrics and resumable state."""
    export_hf_format: bool = True
    """Also write the best model in Hugging Face format (model.safetensors and tokenizer files beside config.json), so
    `transformers.pipeline("text-classification", model=output_dir)` loads it. Doubles the weights on disk."""
    export_runtime: ExportRuntime = "none"
    """At the end of the run, also convert the best model for the optimized CPU runtimes (every installed one, in fp32
    and in int8 when it agrees with fp32 on the recorded calibration texts) into output_dir/runtime/, so the service
    starts without converting; needs `pip install 'distilbert-agnews[openvino]'` (or `[onnxruntime]`)."""
    checkpointing_steps: str = "epoch"
    """Save resumable state every N optimizer steps, at each 'epoch' end, or 'none'."""
    save_total_limit: AtLeast1 | None = None
    """Keep only the newest N resumable states (by step) while the run trains; the best model's files are never
    deleted."""
    keep_states: bool = False
    """Keep the resumable states once the run has finished. By default a finished run removes them: what it left (the
    model, tokenizer, config and reports) is all that evaluating, serving, publishing or fine-tuning it further
    (--model_name_or_path RUN) reads, and `--resume_from_checkpoint latest` on it says there is nothing to resume."""
    resume_from_checkpoint: str | None = None
    """'latest' (newest state under output_dir/state, by recorded step) or a path to a state/step_N folder."""
    verbose: bool = False
    """Also log what the libraries say: accelerate's line per saved and loaded state file, transformers' progress
    bar and load report (the head it starts fresh) when the model loads."""
    overwrite_output_dir: bool = False
    """Start a new run in an --output_dir that holds an unfinished run or another model's files: what a run writes
    there (its states, model, tokenizer, adapter/, reports) is replaced as this run saves; other files stay. Without
    it such a folder is refused, unless resumed; a finished run's folder is replaced without it."""
    allow_inexact_resume: bool = False
    """Resume although the run would not continue exactly: the state's RNG files are missing or unreadable, or it
    was saved with other data (files' size and SHA-256, a Hub dataset's fingerprint), another model or label mapping,
    or other settings that change the result (max_length, learning rate and schedule, precision, ...); metrics.json
    then records both values of each change. Without it such a state is refused with one line naming what changed
    ('latest' falls back to an earlier complete state for missing RNG files)."""
    push_to_hub: bool = False
    """Upload the best model (Hugging Face format, state_dict, tokenizer, card, reports) to --hub_model_id at the end,
    from the main process."""
    hub_model_id: str | None = None
    """Hub repository (user/name or org/name) for --push_to_hub; the token comes from HF_TOKEN or `hf auth login`."""
    hub_private_repo: bool = False
    """Create the Hub repository as private."""


class RunConfig(_Group):
    preset: Literal["smoke", "smoke-multi-label", "smoke-regression", "smoke-reranking", "smoke-long"] | None = None
    """'smoke': offline synthetic news data, a tokenizer trained on it and a tiny DistilBERT (CPU, < 1 min).
    'smoke-multi-label' and 'smoke-regression': the same on the generator's multi-label topics and scored stories;
    'smoke-reranking': (query, passage) pairs with 0/1 relevance, 8 passages a query, a reranker fine-tuned from the
    pretrained MiniLM of the minilm extra (offline, about a minute on 2 cores);
    'smoke-long': long stories whose label sits past the first window, with --long_text chunk and 48-token windows.
    Each writes its own folder: checkpoints (smoke), runs/smoke-<name> for the others.
    Own data with another --model_name_or_path leaves its from_scratch, learning rate and max_length at defaults."""
    logging_steps: AtLeast1 = 50
    """Log the loss (mean over all ranks) every N optimizer steps; a short run more often (5 points at least)."""
    report_to: str = "none"
    """Experiment tracker(s) for accelerate: 'none', 'all', or comma-separated names such as 'tensorboard,wandb'."""
    stop_check_steps: AtLeast1 = 10
    """Every N optimizer steps the ranks agree (one tiny all-reduce) on stopping for SIGTERM or a diverged loss."""
    max_nonfinite_steps: AtLeast1 = 5
    """Stop with an error after this many consecutive batches with a NaN/inf loss."""
    ddp_timeout: AtLeast1 = 1800
    """Seconds a collective may wait for the other ranks before the job fails."""
    find_unused_parameters: bool = False
    """DDP option for models with parameters that get no gradient; slower, off by default."""


GROUPS: dict[str, type[_Group]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimization": OptimizationConfig,
    "evaluation": EvaluationConfig,  # evaluation and checkpoints
    "run": RunConfig,
}
GROUP_TITLES = {
    "model": "model",
    "data": "data",
    "optimization": "optimization",
    "evaluation": "evaluation and checkpoints",
    "run": "run",
}


class TrainConfig(RunConfig, EvaluationConfig, OptimizationConfig, DataConfig, ModelConfig):
    """Every field of every group, flat."""

    @model_validator(mode="after")
    def _lora_learning_rate(self) -> TrainConfig:
        """LoRA's default rate, unless one was given."""
        if self.lora_r and "learning_rate" not in self.model_fields_set:
            self.learning_rate = LORA_LEARNING_RATE
        return self

    def effective_batch_size(self, num_processes: int) -> int:
        """Examples per optimizer step across all ranks."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * num_processes

    def long_text_rule(self) -> LongText:
        """How long texts are windowed and pooled."""
        return LongText(self.long_text, self.chunk_stride, self.chunk_pooling, self.max_length)

    def to_dict(self) -> dict[str, Any]:
        """Flat field: value (metrics.json, trackers)."""
        return self.model_dump()

    def grouped(self) -> dict[str, dict[str, Any]]:
        """{group: {field: value}}, the grouped YAML form."""
        values = self.model_dump()
        return {group: {name: values[name] for name in cls.model_fields} for group, cls in GROUPS.items()}


# ------------------------------------------------------------------------------------------ checks


def _runtime_installed(runtime: str) -> bool:
    """Whether this runtime can convert (contract/runtimes.py declares what it needs)."""
    return RUNTIMES[runtime].installed()


def check(cfg: TrainConfig) -> None:
    """Combinations and the outside world; names the field."""

    def need(ok: bool, name: str, message: str) -> None:
        if not ok:
            raise ConfigError(f"{name}: {message} (got {getattr(cfg, name)!r})")

    need(bool(cfg.text_column_names), "text_column_names", "needs at least one column")
    need(not cfg.push_to_hub or bool(cfg.hub_model_id), "hub_model_id", "is needed with --push_to_hub")
    need(
        cfg.checkpointing_steps in ("epoch", "none")
        or (cfg.checkpointing_steps.isdigit() and int(cfg.checkpointing_steps) >= 1),
        "checkpointing_steps",
        "must be 'epoch', 'none' or a positive integer",
    )
    need(
        cfg.export_runtime == "none" or _runtime_installed(cfg.export_runtime),
        "export_runtime",
        f"needs {cfg.export_runtime}: pip install 'distilbert-agnews[{cfg.export_runtime}]'",
    )
    trackers = [t.strip() for t in cfg.report_to.split(",")]
    unknown = [t for t in trackers if t not in TRACKERS]
    need(not unknown, "report_to", f"unknown tracker {unknown[0] if unknown else ''!r}; use {', '.join(TRACKERS)}")
    # accelerate only warns about a missing tracker
    import accelerate.utils  # here: parsing and --help come before torch

    missing = [t for t in trackers if t not in ("none", "all") and not getattr(accelerate.utils, f"is_{t}_available")()]
    need(not missing, "report_to", f"tracker {missing[0] if missing else ''!r} is not installed (pip install it)")
    need(
        not cfg.label_names or len(set(cfg.label_names)) == len(cfg.label_names),
        "label_names",
        "needs distinct names",
    )
    need(
        class_weight_values(cfg.class_weights) is not None or cfg.class_weights in ("auto", "none", "balanced"),
        "class_weights",
        "must be 'auto', 'none', 'balanced' or positive numbers, comma-separated",
    )
    need(cfg.label_delimiter != "", "label_delimiter", "must not be empty")
    need(
        cfg.pad_buckets != 0 or cfg.torch_compile in ("auto", "none"),
        "pad_buckets",
        "must be at least 1 with --torch_compile: a compiled step needs fixed widths (each new one recompiles)",
    )
    need(
        not (cfg.packing and cfg.attn_implementation == "eager"),
        "packing",
        "needs --attn_implementation sdpa (packed texts attend through SDPA or varlen attention)",
    )
    need(  # the exact bound waits for the tokenizer
        cfg.long_text == "truncate" or cfg.chunk_stride < cfg.max_length,
        "chunk_stride",
        f"must be smaller than max_length ({cfg.max_length})",
    )
    _check_distillation(cfg, need)
    _check_lora(cfg, need)
    _check_optim(cfg, need)
    _check_reranking(cfg, need)
    _check_sources(cfg, need)


def _check_distillation(cfg: TrainConfig, need) -> None:
    """The distillation flags apply with the teacher's scores (`agnews distill` sets them all)."""
    for name in ("hard_label_column", "distill_alpha", "distill_temperature"):
        need(
            cfg.teacher_column is not None or name not in cfg.model_fields_set,
            name,
            "applies to distillation only: name the teacher's scores with --teacher_column (agnews distill does)",
        )


def _check_reranking(cfg: TrainConfig, need) -> None:
    """A reranker reads (query, passage) pairs and one relevance column."""
    reranking = bool(cfg.problem_type)  # the one type the flag names
    need(
        not reranking or bool(cfg.text_pair_column),
        "problem_type",
        "reranking scores (query, passage) pairs: name the passage column with --text_pair_column",
    )
    need(
        not reranking or not (cfg.do_regression or cfg.label_delimiter),
        "problem_type",
        "reranking excludes --do_regression and --label_delimiter",
    )


def _check_optim(cfg: TrainConfig, need) -> None:
    """Another optimizer than AdamW steps eagerly; the 8-bit one needs bitsandbytes."""
    need(
        cfg.optim == "adamw" or cfg.torch_compile in ("auto", "none"),
        "optim",
        f"{cfg.optim}: a compiled or captured step (--torch_compile {cfg.torch_compile}) runs AdamW only; use "
        "--optim adamw, or --torch_compile none",
    )
    need(
        cfg.optim != "adamw_8bit" or importlib.util.find_spec("bitsandbytes") is not None,
        "optim",
        "adamw_8bit needs bitsandbytes: pip install bitsandbytes",
    )


def _check_lora(cfg: TrainConfig, need) -> None:
    """LoRA flags need --lora_r, and --lora_r needs peft."""
    given = [name for name in ("lora_alpha", "lora_dropout", "lora_target_modules") if name in cfg.model_fields_set]
    need(cfg.lora_r > 0 or not given, "lora_r", f"must be set (e.g. 8) for --{given[0] if given else ''} to apply")
    if cfg.lora_r:
        from training.lora import peft_installed

        need(peft_installed(), "lora_r", "needs peft: pip install 'distilbert-agnews[peft]'")


def _check_sources(cfg: TrainConfig, need) -> None:
    """Data suffixes, a dataset, the state to resume."""
    for name in ("train_file", "validation_file", "test_file"):
        path = getattr(cfg, name)
        need(
            path is None or Path(path).suffix.lower() in SUPPORTED_DATA_SUFFIXES,
            name,
            f"must end in one of {', '.join(SUPPORTED_DATA_SUFFIXES)}",
        )
    need(
        cfg.train_file is not None or cfg.dataset_name.strip() != "",
        "dataset_name",
        "give a Hub dataset name or --train_file",
    )
    resume = cfg.resume_from_checkpoint
    need(
        resume in (None, "latest") or Path(resume).is_dir(),
        "resume_from_checkpoint",
        "must be 'latest' or an existing state folder",
    )


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "string": "a string",
    "list": "a list of strings",
    "literal": None,
}


def one_line(error: ValidationError) -> str:
    """A ValidationError's first problem, in one line."""
    err = error.errors()[0]
    name = ".".join(str(part) for part in err["loc"] if isinstance(part, str)) or "config"
    kind = err["type"]
    if kind in ("bound", "precision"):
        return f"{name}: {err['msg']}"
    if kind == "literal_error":
        return f"{name}: must be one of {err['ctx']['expected']} (got {err['input']!r})"
    if kind == "extra_forbidden":
        return f"{name}: unknown field"
    expected = next((word for key, word in _TYPE_WORDS.items() if kind.startswith(key) and word), None)
    if expected:
        return f"{name}: expected {expected} (got {err['input']!r})"
    return f"{name}: {err['msg']} (got {err['input']!r})"
