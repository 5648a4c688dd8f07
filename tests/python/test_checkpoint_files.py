"""autostage.save_checkpoint / load_checkpoint in one process: the write is atomic (an
interrupted save leaves the old file and no temporary file), and a checkpoint that is damaged or
does not fit the model is refused with a message naming the problem, before any parameter
changes."""
import os

import pytest
import torch

import autostage


def make(out=2, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                               torch.nn.Linear(3, out))


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_unchanged(model, before):
    after = model.state_dict()
    assert list(after) == list(before)
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def test_round_trip_is_a_plain_torch_save_file(tmp_path):
    path = tmp_path / "model.pt"
    source = make(seed=1)
    assert autostage.save_checkpoint(source, path)
    assert os.listdir(tmp_path) == ["model.pt"]
    plain = torch.load(path)  # still readable without autostage
    for key, value in source.state_dict().items():
        assert torch.equal(plain[key], value), key
    target = make(seed=2)
    state = autostage.load_checkpoint(path, target)
    assert list(state) == list(source.state_dict())
    assert_unchanged(target, source.state_dict())


def test_save_over_an_old_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "model.pt"
    autostage.save_checkpoint(make(seed=1), path)
    os.chmod(path, 0o640)
    autostage.save_checkpoint(make(seed=3), path)
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert torch.equal(torch.load(path)["0.weight"], make(seed=3)[0].weight)


@pytest.mark.parametrize("interruption", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_interrupted_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch,
                                                                interruption):
    path = tmp_path / "model.pt"
    autostage.save_checkpoint(make(seed=1), path)
    old = path.read_bytes()

    def failing_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")  # some bytes reach the file, then it fails
        raise interruption

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(type(interruption)):
        autostage.save_checkpoint(make(seed=2), path)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["model.pt"]


def test_shape_mismatch_is_refused_naming_key_and_both_shapes(tmp_path):
    path = tmp_path / "wide.pt"
    autostage.save_checkpoint(make(out=5, seed=1), path)  # last layer 3 -> 5, model has 3 -> 2
    model = make(out=2, seed=2)
    before = snapshot(model)
    with pytest.raises(autostage.FormatError) as error:
        autostage.load_checkpoint(path, model)
    message = str(error.value)
    assert "'2.weight' has shape [5, 3] in the checkpoint but [2, 3] in the model" in message
    assert "'2.bias' has shape [5] in the checkpoint but [2] in the model" in message
    assert "Nothing was loaded (the model is unchanged)" in message
    assert "strict=False" not in message  # it would not help with shapes
    # torch's load_state_dict would have copied layers 0 and 1 before raising: nothing moved.
    assert_unchanged(model, before)
    # The same through autostage.Module.load_state_dict (before deployment) and strict=False.
    wrapped = autostage.Module(model)
    for strict in (True, False):
        with pytest.raises(autostage.FormatError, match=r"'2\.weight' has shape \[5, 3\]"):
            wrapped.load_state_dict(torch.load(path), strict=strict)
        assert_unchanged(model, before)


def test_missing_and_unexpected_keys_are_refused_when_strict(tmp_path):
    source = make(seed=1)
    state = source.state_dict()
    del state["1.running_var"]
    state["3.weight"] = torch.zeros(2, 2)
    path = tmp_path / "keys.pt"
    autostage.save_checkpoint(state, path)
    model = make(seed=2)
    before = snapshot(model)
    with pytest.raises(autostage.FormatError) as error:
        autostage.load_checkpoint(path, model)
    assert "'1.running_var' is missing from the checkpoint" in str(error.value)
    assert "'3.weight' is in the checkpoint but not in the model" in str(error.value)
    assert "or pass strict=False" in str(error.value)
    assert_unchanged(model, before)
    # strict=False loads what fits and leaves the rest.
    autostage.load_checkpoint(path, model, strict=False)
    assert torch.equal(model[0].weight, source[0].weight)
    assert torch.equal(model[1].running_var, before["1.running_var"])


def test_damaged_files_are_refused_and_the_model_kept(tmp_path):
    source, model = make(seed=1), make(seed=2)
    before = snapshot(model)
    path = tmp_path / "model.pt"
    autostage.save_checkpoint(source, path)
    data = path.read_bytes()

    # One flipped byte inside the weight data: torch.load alone would return wrong values.
    raw = source[0].weight.detach().numpy().tobytes()
    at = data.find(raw)
    assert at > 0
    flipped = bytearray(data)
    flipped[at + 1] ^= 0x55
    path.write_bytes(bytes(flipped))
    with pytest.raises(autostage.FormatError, match=r"is corrupted: member '.*data/0' fails its "
                                                    r"CRC-32 check"):
        autostage.load_checkpoint(path, model)

    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(autostage.FormatError, match="is not a torch.save archive"):
        autostage.load_checkpoint(path, model)

    with pytest.raises(autostage.FormatError, match="no such file"):
        autostage.load_checkpoint(tmp_path / "missing.pt", model)

    path.write_bytes(b"")
    with pytest.raises(autostage.FormatError, match="is not a torch.save archive"):
        autostage.load_checkpoint(path, model)
    assert_unchanged(model, before)


def test_a_checkpoint_that_is_not_a_state_dict_is_refused(tmp_path):
    path = tmp_path / "tensor.pt"
    autostage.save_checkpoint(torch.ones(3), path)
    assert torch.equal(autostage.load_checkpoint(path), torch.ones(3))  # no model: just read
    with pytest.raises(autostage.FormatError, match="holds a Tensor, not a state dict"):
        autostage.load_checkpoint(path, make())
