"""A sharded state runs no code and stays in its folder."""

from __future__ import annotations

import inspect
import io
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from accelerate.utils import fsdp_utils

from training.output.state_files import LayoutOnlyReader, StateRefused, restricted_reading, unsafe_file


class RunsCommand:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def saved(folder: Path) -> Path:
    """A one-process DCP checkpoint: a tensor and two byte items (what an optimizer's param_groups become)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized": one process, as intended
        dcp.save({"w": torch.arange(3.0), "extra": {"lr": 0.1, "name": "x"}}, checkpoint_id=str(folder), no_dist=True)
    return folder


def load(folder: Path, reader_class=LayoutOnlyReader) -> dict:
    target = {"w": torch.zeros(3), "extra": {"lr": 0.0, "name": ""}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=reader_class(folder), no_dist=True)
    return target


def index_of(folder: Path, name: str = ".metadata"):
    with open(folder / name, "rb") as fh:
        return pickle.load(fh)  # our own file, written above


def test_a_plain_checkpoint_loads_through_the_restricted_reader(tmp_path):
    loaded = load(saved(tmp_path / "ck"))
    assert torch.equal(loaded["w"], torch.arange(3.0)) and loaded["extra"] == {"lr": 0.1, "name": "x"}
    assert unsafe_file(tmp_path / "ck") is None


@pytest.mark.parametrize("name", [".metadata", "__0.metadata"])
def test_an_index_naming_code_is_refused_at_the_check_and_at_the_read(tmp_path, name):
    """`__0.metadata`: the rank-local index torch's reader falls back to when `.metadata` is missing; the check read
    only files named exactly `.metadata`."""
    folder, marker = saved(tmp_path / "ck"), tmp_path / "ran"
    if name != ".metadata":
        (folder / ".metadata").unlink()
    (folder / name).write_bytes(pickle.dumps(RunsCommand(f"touch {marker}")))
    assert f"{folder / name}: holds more than a checkpoint's layout (it would import posix.system)" in unsafe_file(
        folder
    )
    rank = None if name == ".metadata" else 0
    with pytest.raises(StateRefused, match="posix.system"):
        LayoutOnlyReader(folder).read_metadata(rank=rank)
    assert not marker.exists()


def test_a_byte_item_that_would_run_code_is_refused_while_torchs_own_reader_runs_it(tmp_path):
    """The index is only layout, but one byte item points at a pickle of os.system: torch's planner unpickles byte
    items unrestricted. Checked with torch's own reader first, so the test shows the attack is real."""
    folder, marker = saved(tmp_path / "ck"), tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save(RunsCommand(f"touch {marker}"), buffer)  # how DCP writes a byte item
    evil = buffer.getvalue()
    (folder / "evil.distcp").write_bytes(evil)
    index = index_of(folder)
    for key, info in index.storage_data.items():
        if key.fqn == "extra.name":
            info.relative_path, info.offset, info.length = "evil.distcp", 0, len(evil)
    (folder / ".metadata").write_bytes(pickle.dumps(index))
    assert unsafe_file(folder) is None  # only layout in the index: the check alone cannot see it
    with pytest.raises(StateRefused, match="extra.name.*not plain data"), restricted_reading():
        load(folder)
    assert not marker.exists()
    load(folder, dcp.FileSystemReader)
    assert marker.exists()  # what a resume ran before


@pytest.mark.parametrize("path", ["../outside.distcp", "/etc/passwd", "sub/__0_0.distcp"])
def test_an_index_naming_a_data_file_outside_its_folder_is_refused(tmp_path, path):
    folder = saved(tmp_path / "ck")
    index = index_of(folder)
    next(iter(index.storage_data.values())).relative_path = path
    (folder / ".metadata").write_bytes(pickle.dumps(index))
    assert "names a data file outside its folder" in unsafe_file(folder)
    with pytest.raises(StateRefused, match="outside its folder"):
        LayoutOnlyReader(folder).read_metadata()


@pytest.mark.parametrize("absolute", [False, True])
def test_a_shard_folder_or_file_replaced_by_a_link_is_refused(tmp_path, absolute):
    """The shard folder replaced by a link to a folder holding a poisoned index (relative and absolute), and a data
    file replaced by a link: the check names the link, the reader does not follow it."""
    elsewhere = saved(tmp_path / "elsewhere")
    (elsewhere / ".metadata").write_bytes(pickle.dumps(RunsCommand(f"touch {tmp_path / 'ran'}")))
    state = tmp_path / "state"
    state.mkdir()
    shard = state / "pytorch_model_fsdp_0"
    shard.symlink_to(elsewhere if absolute else Path("..") / "elsewhere")
    assert f"{shard}: a symbolic link" in unsafe_file(state)
    with pytest.raises(StateRefused, match="symbolic link is refused"):
        LayoutOnlyReader(shard).read_metadata()

    folder = saved(tmp_path / "ck")
    (folder / "__0_0.distcp").rename(tmp_path / "data.distcp")
    (folder / "__0_0.distcp").symlink_to(tmp_path / "data.distcp")
    assert "__0_0.distcp: a symbolic link" in unsafe_file(folder)
    with pytest.raises(StateRefused, match="symbolic link is refused"), restricted_reading():
        load(folder)
    assert not (tmp_path / "ran").exists()


def test_accelerates_fsdp_loading_reads_through_the_restricted_reader_while_a_state_loads():
    """accelerate builds torch's reader by name inside load_fsdp_model and load_fsdp_optimizer: the swap covers both
    while a state loads and is undone after."""
    for function in (fsdp_utils.load_fsdp_model, fsdp_utils.load_fsdp_optimizer):
        assert "dist_cp.FileSystemReader(" in inspect.getsource(function), function.__name__
    original = dcp.FileSystemReader
    with restricted_reading():
        assert dcp.FileSystemReader is LayoutOnlyReader
    assert dcp.FileSystemReader is original
