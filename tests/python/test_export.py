"""Issue 26: the torch.export front end (autostage/export.py, frontend/export/interpreter.h).
Whole-graph and split execution through the ATen dispatcher must match the plain model exactly
(outputs, parameter gradients, BatchNorm statistics), at the captured batch size and at others.
Runs where torch.export has the training IR (the PyTorch 2.x leg)."""
import copy
import dataclasses
import os
import re
import shutil
import sys

import pytest
import torch
import torch.nn as nn

import autostage
from autostage.export import available
from test_torchscript import LossModel, TiedModel, check_model, run_parts
from device_under_test import device_of

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not available(), reason="torch.export training IR needs 2.5+")


@pytest.fixture(autouse=True)
def _front_end_reset():
    """Options are process-wide: later tests in this process get the default front end."""
    yield
    autostage._autostage._set_option("front_end", "auto")


def export_check(model, inputs, **kwargs):
    ir = check_model(model, inputs, capture=autostage.export_to_ir, **kwargs)
    assert ir.front_end == "torch.export"
    assert ir.export(list(range(ir.node_count))).executor == "dispatcher"
    return ir


def test_mlp_kinds_and_scopes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Tanh())
    ir = export_check(model, (torch.randn(8, 16),), split_count=3)
    assert ir.param_names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    text = str(ir)
    assert "aten::linear.default" in text and 'scope="2"' in text
    assert "TorchScript" not in ir.front_end


def test_batchnorm_train_mode_updates_the_buffers():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).train()
    ir = export_check(model, (torch.randn(4, 3, 16, 16),))
    assert "1.running_mean" in ir.param_names
    assert int(model[1].num_batches_tracked) == 2  # whole + one split run, like the reference


def test_transformer_encoder_loss_tied_and_resnet():
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True)
    export_check(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False),
                 (torch.randn(2, 5, 32),), split_count=3)
    ir = export_check(TiedModel(), (torch.randint(0, 20, (3, 7)),))
    assert ir.param_names.count("embed.weight") + ir.param_names.count("out.weight") == 1
    ir = export_check(LossModel(), (torch.randn(5, 10), torch.randint(0, 3, (5,))))
    assert " LOSS" in str(ir)
    torchvision = pytest.importorskip("torchvision")
    export_check(torchvision.models.resnet18(num_classes=10).train(),
                 (torch.randn(2, 3, 32, 32),))


class Reshaping(nn.Module):
    """Size arithmetic on the batch: view(batch * 2, -1), a split, a number times a tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        h = h.view(h.size(0) * 2, 2, -1).reshape(h.size(0), -1)
        a, b = h.split(8, dim=1)
        return self.out((a + b * 2).view(-1, 4)).view(x.size(0), -1)


def test_other_batch_sizes_run_the_captured_graph():
    torch.manual_seed(3)
    model = Reshaping()
    ir = autostage.export_to_ir(model, (torch.randn(4, 8),))
    assert "_operator::mul" in str(ir)  # the batch stays symbolic
    n = ir.node_count
    for batch in (1, 3, 7):
        x = torch.randn(batch, 8)
        for parts in ([list(range(n))], [list(range(n // 2)), list(range(n // 2, n))]):
            got = run_parts(ir, [x], parts)
            assert torch.equal(got[0], model(x)), (batch, parts)


class SizesReadEarly(nn.Module):
    """The batch's size read at the start and used at the end, three ways: as it is, from a
    flattened tensor (its rows divided), and multiplied (Note [Sizes read where they are used])."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        rows = x.shape[0]
        h = self.b(self.a(x).relu()).relu()
        flat = self.c(h).reshape(-1)                         # 4 x rows values
        pairs = h.view(rows, 8, 2).reshape(rows * 8, 2)      # the size as it is, then times 8
        return flat.view(x.shape[0], -1).sum(1) + pairs.sum(1).view(rows, 8).mean(1)


def test_sizes_read_early_are_read_again_where_they_are_used():
    torch.manual_seed(6)
    model = SizesReadEarly()
    ir = export_check(model, (torch.randn(4, 8),), split_count=3)
    lines = str(ir).splitlines()
    defined = {}  # int value -> line defining it
    for i, line in enumerate(lines):
        name = line.split(" : ")[0].strip()
        if " : int BATCH = " in line:
            defined[name] = i
    # Each size is read from a tensor the operation using it has, right before it (sym_size,
    # at most a division or product, the size list, the operation); none from the input.
    assert defined and not any("aten::sym_size.int(%x," in line for line in lines), lines
    assert any("_operator::floordiv" in line for line in lines)
    assert any("_operator::mul" in line for line in lines)
    for name, i in defined.items():
        uses = [k for k, line in enumerate(lines) if re.search(re.escape(name) + r"(?![\w.])", line)
                and k != i]
        assert uses and max(uses) - i <= 4, (name, lines[i:max(uses) + 1])
    n = ir.node_count
    for batch in (1, 3, 7):  # the sizes read again are right at other batch sizes
        x = torch.randn(batch, 8)
        got = run_parts(ir, [x], [list(range(n // 3)), list(range(n // 3, n))])
        assert torch.equal(got[0], model(x)), batch


def test_a_graph_break_is_refused_with_exports_reason():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y if y.sum() > 0 else -y  # control flow on a tensor's value

    with pytest.raises(autostage.UnsupportedError,
                       match=r"torch.export of Branchy failed \(.*data-dependent.*"
                             r"front_end=torchscript"):
        autostage.export_to_ir(Branchy(), (torch.randn(3, 4),))


def test_module_trains_like_plain_pytorch_with_keywords_and_output_structure():
    class KeywordModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x, labels=None, scale=1.0):
            logits = self.fc(x) * scale
            loss = nn.functional.cross_entropy(logits, labels)
            return {"loss": loss, "logits": logits}

    torch.manual_seed(4)
    model = KeywordModel().double()
    reference = copy.deepcopy(model)
    wrapped = autostage.Module(model, front_end="export", partition_num=1, pipeline_num=1)
    device = device_of(model)  # bit-equal on the same device (AUTOSTAGE_DEVICE)
    reference.to(device)
    for step in range(2):
        x = torch.randn(6 + step, 6, dtype=torch.float64, device=device)
        labels = torch.randint(0, 3, (6 + step,), device=device)
        out = wrapped(x, labels=labels, scale=0.5)
        expected = reference(x, labels=labels, scale=0.5)
        assert set(out) == {"loss", "logits"}
        assert torch.equal(out["loss"], expected["loss"])
        assert torch.equal(out["logits"], expected["logits"])
        out["loss"].backward()
        expected["loss"].backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.grad, q.grad), name


@dataclasses.dataclass
class Prediction:
    """An output type that is neither a tuple nor a Mapping, registered with torch's pytree."""
    score: torch.Tensor
    parts: tuple


if available():
    torch.utils._pytree.register_dataclass(Prediction)


def test_keywords_in_kwargs_constants_and_outputs_come_from_exports_specs():
    """Note [Calls through export's specs]: tensors nested in **kwargs get a dynamic batch, the
    output is rebuilt from export's output spec (constants included, a pytree-registered
    dataclass), and a later batch size runs the same capture."""
    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 5)

        def forward(self, x, extra=None, scale=2, **more):
            y = self.fc(x) * scale + extra[0] + more["side"]["bias"]
            return {"y": y, "none": None, "count": 7,
                    "pair": (y.sum(), "text"), "pred": Prediction(y.mean(1), (y[:, 0],))}

    torch.manual_seed(6)
    model = Nested().double()
    reference = copy.deepcopy(model)
    wrapped = autostage.Module(model, front_end="export", partition_num=1, pipeline_num=1)
    device = device_of(model)
    reference.to(device)
    for batch in (4, 3):
        data = [torch.randn(batch, 5, dtype=torch.float64, device=device) for _ in range(3)]
        out = wrapped(data[0], extra=[data[1]], scale=3, side={"bias": data[2]})
        expected = reference(data[0], extra=[data[1]], scale=3, side={"bias": data[2]})
        assert list(out) == ["y", "none", "count", "pair", "pred"]
        assert out["none"] is None and out["count"] == 7 and out["pair"][1] == "text"
        assert isinstance(out["pred"], Prediction)
        assert torch.equal(out["y"], expected["y"])
        assert torch.equal(out["pair"][0], expected["pair"][0])
        assert torch.equal(out["pred"].score, expected["pred"].score)
        assert torch.equal(out["pred"].parts[0], expected["pred"].parts[0])
        (out["y"].sum() + out["pred"].score.sum()).backward()
        (expected["y"].sum() + expected["pred"].score.sum()).backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.grad, q.grad), name


def test_an_output_size_is_refused_by_name():
    class ReturnsSize(nn.Module):
        def forward(self, x):
            return x * 2, x.size(0)

    with pytest.raises(autostage.UnsupportedError, match=r"unsupported output .* of ReturnsSize"):
        autostage.Module(ReturnsSize(), front_end="export")(torch.randn(4, 3))


def test_values_without_the_batch_in_dim_0_are_marked_even_when_sizes_coincide():
    """Note [Rows of a value] (core/ir/type.h): 4 experts and a batch of 4; export's symbolic
    sizes tell the per-expert values from the batch-major ones, which TorchScript's could not."""
    class PerExpert(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.Parameter(torch.randn(4, 3))

        def forward(self, x):
            counts = torch.histc(x.argmax(1).float(), bins=4, min=0, max=3)  # per expert
            weighted = self.experts * counts[:, None]                        # per expert
            return (x @ weighted.t()).relu()                                 # per sample

    ir = autostage.export_to_ir(PerExpert(), (torch.randn(4, 3),))
    types = {line.split(" : ")[0].strip(): line.split(" : ")[1].split(" = ")[0]
             for line in str(ir).splitlines() if " = " in line and " : " in line}
    marked = {name for name, t in types.items() if "not_batch_major" in t}
    assert {"%histc", "%unsqueeze", "%mul"} <= marked, types
    assert {"%argmax", "%to", "%matmul", "%relu"}.isdisjoint(marked), types
    assert types["%histc"].startswith("Float(4") and types["%relu"].startswith("Float(4, 4")


def test_front_end_option_is_checked():
    with pytest.raises(autostage.ConfigError, match="front_end='jit' is not a front end"):
        autostage.Module(nn.Linear(2, 2), front_end="jit")(torch.randn(2, 2))


def test_auto_captures_with_torch_export_and_says_so(capfd):
    """The 2.x leg runs with the export front end unless a test asks otherwise: a job that fell
    back to TorchScript would log `with TorchScript`."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    wrapped = autostage.Module(model, partition_num=1, pipeline_num=1)
    x = torch.randn(4, 4, device=device_of(model))
    assert torch.equal(wrapped(x), model(x))
    err = capfd.readouterr().err
    assert "Captured Sequential with torch.export:" in err, err
    assert "with TorchScript" not in err
    # show_config says what front_end resolves to here, and what the last capture used.
    config = autostage.show_config()
    assert re.search(r"front end: front_end=\w+ captures with torch.export here \(PyTorch "
                     r"2\.", config), config
    assert "the last model captured, Sequential, used torch.export" in config, config


def test_a_specialised_batch_dimension_is_said_once():
    class FixedBatch(nn.Module):
        def forward(self, x):
            return x.reshape(4, -1) * 2  # the model's code fixes the batch at 4

    lines = []
    ir = autostage.export_to_ir(FixedBatch(), (torch.randn(4, 3),), log=lines.append)
    assert len(lines) == 1 and "specialised the batch dimension of x" in lines[0], lines
    assert ir.front_end == "torch.export"
    lines.clear()
    autostage.export_to_ir(Reshaping(), (torch.randn(4, 8),), log=lines.append)
    assert lines == []  # a dynamic batch says nothing


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
@pytest.mark.parametrize("partition", [1, 2])
def test_a_fixed_batch_size_plans_micro_batches_of_that_size(partition):
    # Note [Fixed micro-batch size]: profiled at the captured 4 rows, planned so that every
    # micro-batch has 4 rows (2 replicas, or 2 stages of 2 micro-batches), equal to plain PyTorch.
    from mpi_launch import run_driver
    log = run_driver("fixed_batch_check.py", partition, ranks=2)
    for rank in range(2):
        assert f"rank {rank}: fixed batch partition_num={partition} checked; 0 failures" in log, log
    assert "planned with micro-batches of exactly 4 rows per replica (micro_batch_size=4)" in log
    assert "batch_sizes=[4]" in log, log  # profiled at the captured size only
    assert re.search(r"Planner options: .* micro_batch_size=4\b", log), log


def test_micro_batch_size_against_a_fixed_batch_is_refused():
    class IntBatch(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 4)

        def forward(self, x):
            return self.a(x).reshape(int(x.shape[0]), 2, 2)

    try:
        wrapped = autostage.Module(IntBatch(), micro_batch_size=2)  # a process-wide option
        with pytest.raises(autostage.ConfigError, match=r"micro_batch_size=2 .* fixed this "
                                                        r"model's batch dimension to the 4 rows"):
            wrapped(torch.randn(4, 3))
    finally:
        autostage._autostage._set_option("micro_batch_size", "0")
