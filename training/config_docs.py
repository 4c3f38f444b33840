"""docs/configuration.md, generated from the config's fields and presets: `python -m training.config_docs`."""

from __future__ import annotations

from training.config import GROUP_TITLES, GROUPS
from training.smoke import presets


def markdown() -> str:
    """Every field, by group: type, default, documentation."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `training/config.py` by `python -m training.config_docs > docs/configuration.md`; "
        "a test checks that it matches. Precedence: defaults < `--preset` < `--config file.yaml` < flags. "
        "A YAML file lists fields flat (`learning_rate: 3e-5`) or under their group "
        "(`optimization: {learning_rate: 3e-5}`). `none` sets an optional field to None.",
        "",
    ]
    for group, cls in GROUPS.items():
        lines += [
            f"## {GROUP_TITLES[group].capitalize()} (`{group}:`)",
            "",
            "| flag | default | what it does |",
            "|---|---|---|",
        ]
        for name, field in cls.model_fields.items():
            doc = " ".join((field.description or "").split()).replace("|", "\\|")
            lines.append(f"| `--{name}` | `{field.default!r}` | {doc} |")
        lines.append("")
    preset_lines = [
        f"- `{name}`: "
        + ", ".join(f"`{k}={v!r}`" for k, v in values.items() if k != "model_name_or_path" and not k.endswith("_file"))
        for name, values in presets().items()
    ]
    return "\n".join([*lines, "## Presets", "", *preset_lines, ""])


if __name__ == "__main__":
    print(markdown(), end="")
