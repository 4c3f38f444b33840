"""The data pipeline, one module per stage: load (Hub or local csv/jsonl/parquet) -> validate -> split -> tokenize
(cached) -> batches.

The pieces, in the order train.py calls them:
- reading.py     `load_splits`: train/validation/test as `text` (text columns joined; `text_pair` for pair tasks) and
                 a `labels` column (class ids, multi-hot vectors or regression targets)
- labels.py      the label space and problem type (run_classification.py's convention): `LabelSpace`
- tokenizing.py  `tokenize_splits`: `datasets.map` (cached on disk) adding input ids and each text's token count
- batching.py    `make_dataloaders`: a length-grouped batch sampler for training, length-sorted batches for
                 evaluation, padding to a few fixed widths (--pad_buckets) or to the longest text in the batch
- errors.py      `DataError`: bad input data, named by file (or dataset) and row
"""
