"""Fine-tuning: config, data, model, checkpoints and the training loop (entry point: training/train.py)."""
