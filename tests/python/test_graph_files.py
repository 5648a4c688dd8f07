"""autostage.save_graph / load_graph: round trip and refusal of damaged files."""
import pytest
import torch

import autostage


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


def test_save_and_load_graph_round_trip(tmp_path):
    ir = autostage.trace_to_ir(Small(), (torch.randn(5, 4),))
    path = tmp_path / "small.graph"
    autostage.save_graph(ir, path)
    loaded = autostage.load_graph(path)
    assert str(loaded) == str(ir)
    assert loaded.graph_hash == ir.graph_hash
    assert loaded.node_count == ir.node_count
    assert loaded == ir.graph
    assert autostage.Graph.parse(str(ir)) == loaded


def test_damaged_graph_files_raise_format_error(tmp_path):
    ir = autostage.trace_to_ir(Small(), (torch.randn(5, 4),))
    path = tmp_path / "small.graph"
    autostage.save_graph(ir, path)
    data = path.read_bytes()

    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(autostage.FormatError, match="truncated|corrupted"):
        autostage.load_graph(path)

    flipped = bytearray(data)
    flipped[-10] ^= 0x40
    path.write_bytes(bytes(flipped))
    with pytest.raises(autostage.FormatError, match="corrupted"):
        autostage.load_graph(path)

    with pytest.raises(autostage.FormatError, match="cannot open"):
        autostage.load_graph(tmp_path / "missing.graph")
