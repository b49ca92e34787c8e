"""replayrl.checkpoints at unit level: nests round-trip through safetensors + JSON, nothing is unpickled,
damaged or incomplete checkpoints are refused with the file named and a fallback suggested."""

import json
import pickle

import pytest
import torch

from replayrl.checkpoints import (
    COMPLETE_MARKER,
    CheckpointError,
    check_settings,
    last_complete_checkpoint,
    load_extra_state,
    mark_complete,
    resolve_resume,
    save_extra_state,
    verify_checkpoint,
)


def nest():
    return {
        "step": 3,
        "ratio": 0.5,
        "name": "x",
        "none": None,
        "flags": [True, False],
        "pair": (1, torch.arange(3)),
        "by_int": {0: torch.ones(2, 2), 1: {"exp_avg": torch.zeros(4, dtype=torch.bfloat16)}},
        "generator": torch.Generator().manual_seed(7).get_state(),
    }


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_state_round_trips_exactly(tmp_path):
    save_extra_state(tmp_path, "s", nest())
    assert_same(load_extra_state(tmp_path, "s"), nest())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.safetensors"]  # no temporary files left


def test_shared_and_non_contiguous_tensors_are_stored(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    save_extra_state(tmp_path, "s", {"a": base, "b": base, "t": base.t()})
    out = load_extra_state(tmp_path, "s")
    assert torch.equal(out["t"], base.t()) and torch.equal(out["a"], out["b"])


def test_objects_that_need_pickle_are_refused_at_save(tmp_path):
    with pytest.raises(TypeError, match="only tensors and JSON"):
        save_extra_state(tmp_path, "s", {"f": object()})


def test_a_pickle_in_place_of_the_tensor_file_is_refused_without_running_it(tmp_path):
    save_extra_state(tmp_path, "s", nest())

    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pickle ran')",))

    (tmp_path / "s.safetensors").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(CheckpointError, match="damaged"):
        load_extra_state(tmp_path, "s")


def test_damaged_or_foreign_json_is_refused_naming_the_files(tmp_path):
    save_extra_state(tmp_path, "s", nest())
    (tmp_path / "s.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"s\.json"):
        load_extra_state(tmp_path, "s")
    (tmp_path / "s.json").write_text(json.dumps({"format": "other", "state": 1}))
    with pytest.raises(CheckpointError, match="damaged"):
        load_extra_state(tmp_path, "s")


def test_missing_state_names_the_file_and_the_checkpoint_to_fall_back_to(tmp_path):
    good, bad = tmp_path / "checkpoint-2", tmp_path / "checkpoint-4"
    save_extra_state(good, "s", {"a": 1})
    mark_complete(good, {})
    bad.mkdir()
    with pytest.raises(CheckpointError, match=r"s\.safetensors is missing.*checkpoint-2"):
        load_extra_state(bad, "s")


def test_resume_uses_complete_checkpoints_only(tmp_path):
    for step in (2, 4, 6):
        (tmp_path / f"checkpoint-{step}").mkdir()
    mark_complete(tmp_path / "checkpoint-2", {})
    mark_complete(tmp_path / "checkpoint-4", {})
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    assert resolve_resume(True, str(tmp_path)) == tmp_path / "checkpoint-4"
    with pytest.raises(CheckpointError, match=r"checkpoint-6 is incomplete.*checkpoint-4"):
        resolve_resume(str(tmp_path / "checkpoint-6"), str(tmp_path))
    assert resolve_resume(None, str(tmp_path)) is None


def test_resume_true_with_nothing_to_resume_is_an_error(tmp_path):
    (tmp_path / "checkpoint-1").mkdir()  # killed during its first save
    with pytest.raises(CheckpointError, match="no complete checkpoint.*1 incomplete"):
        resolve_resume(True, str(tmp_path))
    with pytest.raises(CheckpointError, match="not a directory"):
        resolve_resume(str(tmp_path / "nope"), str(tmp_path))


def test_settings_mismatch_is_an_error_unless_adaptable(tmp_path):
    mark_complete(tmp_path, {"trainer": "T", "num_generations": 4, "size": 8})
    assert (tmp_path / COMPLETE_MARKER).is_file()
    assert check_settings(tmp_path, {"trainer": "T", "num_generations": 4, "size": 16}, {"size"}) == {"size": 8}
    with pytest.raises(CheckpointError, match="num_generations: checkpoint 4, now 8"):
        check_settings(tmp_path, {"trainer": "T", "num_generations": 8, "size": 8}, {"size"})


def overwrite_4k(path):
    """4 KiB of plausible float32 values over the middle of a file (all of it if smaller); the size is kept."""
    size = path.stat().st_size
    n = min(4096, size)
    start = (size - n) // 2
    noise = torch.randn(4096 // 4, generator=torch.Generator().manual_seed(0)).numpy().tobytes()[:n]
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(noise)


def test_marker_records_every_file_and_verify_names_each_damaged_one(tmp_path):
    good, bad = tmp_path / "checkpoint-2", tmp_path / "checkpoint-4"
    for directory in (good, bad):
        save_extra_state(directory, "state", {"w": torch.randn(3000)})
        (directory / "shard").mkdir()
        (directory / "shard" / "optimizer.bin").write_bytes(torch.randn(5000).numpy().tobytes())
        mark_complete(directory, {"trainer": "T"})
    recorded = json.loads((bad / COMPLETE_MARKER).read_text())["checksums"]
    assert sorted(recorded["files"]) == ["shard/optimizer.bin", "state.json", "state.safetensors"]
    assert verify_checkpoint(bad) == 3
    overwrite_4k(bad / "shard" / "optimizer.bin")
    (bad / "state.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"shard/optimizer\.bin \(contents.*state\.json \(2 bytes.*checkpoint-2"):
        resolve_resume(True, str(tmp_path))  # the last complete checkpoint is checked before it is used
    (bad / "state.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"state\.safetensors \(missing\)"):
        verify_checkpoint(bad)
    assert resolve_resume(str(bad), str(tmp_path), verify=False) == bad  # what the CLI uses before loading


def test_a_marker_without_checksums_is_still_resumed(tmp_path):
    """Checkpoints written before replayrl recorded checksums: nothing to compare, so nothing is refused."""
    save_extra_state(tmp_path, "state", {"w": torch.zeros(2)})
    (tmp_path / COMPLETE_MARKER).write_text(json.dumps({"trainer": "T"}))
    assert verify_checkpoint(tmp_path) == 0


def test_replayrl_verify_command(tmp_path, capsys):
    from replayrl.cli import main

    checkpoint = tmp_path / "checkpoint-3"
    save_extra_state(checkpoint, "state", {"w": torch.randn(3000)})
    mark_complete(checkpoint, {})
    assert main(["verify", str(checkpoint)]) == 0
    assert "ok (2 files match" in capsys.readouterr().out
    overwrite_4k(checkpoint / "state.safetensors")
    assert main(["verify", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replayrl: error: checkpoint") and "state.safetensors (contents changed" in err


def test_file_checksum_is_the_digest_of_the_bytes_across_chunks_and_for_an_empty_file(tmp_path):
    import hashlib

    import xxhash

    from replayrl.checksums import _CHUNK, file_checksum

    data = torch.randint(0, 256, (2 * _CHUNK + 5,), dtype=torch.uint8).numpy().tobytes()  # three mapped chunks
    (tmp_path / "big").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert file_checksum(tmp_path / "big") == xxhash.xxh3_128(data).hexdigest()
    assert file_checksum(tmp_path / "big", "sha256") == hashlib.sha256(data).hexdigest()
    assert file_checksum(tmp_path / "empty") == xxhash.xxh3_128(b"").hexdigest()
