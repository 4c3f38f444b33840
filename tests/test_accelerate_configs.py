"""Every launch config loads with accelerate's own parser and describes the topology its name promises."""

from __future__ import annotations

import pytest
from accelerate.commands.config.config_args import load_config_from_file

from tests.helpers.processes import ROOT

EXPECTED = {  # file: (distributed_type, num_machines, num_processes, mixed_precision, use_cpu)
    "cpu.yaml": ("NO", 1, 1, "no", True),
    "cpu_2proc.yaml": ("MULTI_GPU", 1, 2, "no", False),  # torchrun starts 2; Accelerator(cpu=True) -> gloo
    "single_gpu.yaml": ("NO", 1, 1, "bf16", False),
    "kaggle_2xt4.yaml": ("MULTI_GPU", 1, 2, "fp16", False),  # T4 has no bf16
    "multi_gpu.yaml": ("MULTI_GPU", 1, 8, "bf16", False),
    "multi_node.yaml": ("MULTI_GPU", 2, 16, "bf16", False),
    "fsdp.yaml": ("FSDP", 1, 8, "bf16", False),  # FSDP2, layers wrapped, sharded states: test_fsdp_config_shards
}


def test_the_set_of_configs_is_complete():
    assert sorted(p.name for p in (ROOT / "accelerate_configs").glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_and_matches_its_purpose(name):
    path = ROOT / "accelerate_configs" / name
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("#")
    assert f"accelerate launch --config_file accelerate_configs/{name}" in path.read_text()
    config = load_config_from_file(str(path))
    kind, machines, processes, precision, use_cpu = EXPECTED[name]
    assert config.distributed_type.value == kind
    assert (config.num_machines, config.num_processes, str(config.mixed_precision), config.use_cpu) == (
        machines,
        processes,
        precision,
        use_cpu,
    )
    if machines > 1:
        assert config.main_process_ip and config.main_process_port


def test_fsdp_config_shards_every_transformer_layer_and_saves_sharded_states():
    config = load_config_from_file(str(ROOT / "accelerate_configs" / "fsdp.yaml")).fsdp_config
    assert config["fsdp_version"] == 2 and config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT" and "fsdp_transformer_layer_cls_to_wrap" not in config
