"""What a resume compares: every recorded value, except settings a newer version records that the state lacks."""

from __future__ import annotations

from training.output.provenance import changes, describe

SAVED = {
    "data": {"train": {"file": "a.csv", "bytes": 10, "sha256": "aa"}},
    "labels": {"names": ["x", "y"], "values": [0, 1]},
    "settings": {"max_length": 128, "learning_rate": 5e-5},
}


def test_a_changed_value_is_named_and_a_moved_file_is_not():
    now = {
        "data": {"train": {"file": "moved/a.csv", "bytes": 10, "sha256": "bb"}},
        "labels": SAVED["labels"],
        "settings": {"max_length": 64, "learning_rate": 5e-5},
    }
    changed = changes(SAVED, now)
    assert set(changed) == {"data.train.sha256", "settings.max_length"}
    assert describe(changed) == "data.train.sha256 aa -> bb, settings.max_length 128 -> 64"


def test_settings_recorded_only_since_the_state_was_saved_are_not_compared_but_new_data_is():
    now = {
        **SAVED,
        "labels": {**SAVED["labels"], "problem_type": "single_label_classification"},
        "settings": {**SAVED["settings"], "class_weights": "none", "threshold_strategy": "fixed"},
    }
    assert changes(SAVED, now) == {}
    with_validation = {**now, "data": {**SAVED["data"], "validation": {"file": "v.csv", "bytes": 3, "sha256": "cc"}}}
    assert set(changes(SAVED, with_validation)) == {"data.validation.bytes", "data.validation.sha256"}
