"""The data pipeline, one module per stage, in train.py's order: reading, labels, tokenizing, batching."""
