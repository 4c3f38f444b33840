"""What training and serving share, owned by neither: checkpoint file names, problem types, long texts, precisions, the
model call. Imports nothing from `training` or `inference`.
"""
