"""The project's `evaluate` modules, one folder each (scoring/metrics.py loads them by path); `common` holds what
they share."""
