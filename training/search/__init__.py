"""The hyper-parameter search behind `agnews tune` (training/tune.py): space.py (what is searched), study.py (the
optuna study and what each trial tells it), summary.py (tune.json, the folder kept), ray_trials.py (--ray: trials
side by side as Ray tasks).
"""
