"""The HTTP service for the fine-tuned classifier. Imports nothing from `training`."""
