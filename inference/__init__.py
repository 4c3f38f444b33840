"""Serving the fine-tuned classifier over HTTP (FastAPI). Imports nothing from `training`."""
