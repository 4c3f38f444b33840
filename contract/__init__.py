"""What training and serving agree on, owned by neither: the checkpoint folder's file names (files.py), the problem
type and thresholds (problem_types.py), long-text windowing and pooling (long_text.py), the precision vocabulary
(precision.py) and the Hub probe (hub.py). Imports nothing from `training` or `inference`; both import it."""
