"""The data pipeline, one module per stage, in the order train.py calls them: reading.py (`load_splits`: Hub or
local csv/jsonl/parquet into text and labels columns), labels.py (`LabelSpace`: the label space and problem type),
tokenizing.py (`tokenize_splits`, cached), batching.py (`make_dataloaders`: length-grouped batches, padded to
fixed widths or the longest text), errors.py (`DataError`, named by file and row).
"""
