"""Keyword arguments and structured outputs (issue 17; Note [Call structure] in
autostage/structure.py, Note [Call signature] in autostage/module.py).

Unit tests of the call and output structures, single-rank calls of autostage.Module in this
process, and a 2-rank job (call_structure_check.py) that trains and replans with kwargs."""
import collections
import dataclasses
import gc
import shutil

import pytest
import torch

import autostage
from autostage.rannc import RaNNCModule
from autostage.structure import CallProblem, CallStructure, OutputStructure, map_tensors
from mpi_launch import run_driver

Pair = collections.namedtuple("Pair", "first second")


def forward_of(x, mask=None, scale=1.0, extra=None, **options):
    return x


class FakeModel(torch.nn.Module):
    def forward(self, x, mask=None, scale=1.0, extra=None, **options):
        return x


def test_call_structure_flattens_keyword_tensors_after_positional_ones():
    x, m, a, b = (torch.zeros(2, i + 1) for i in range(4))
    call = CallStructure(FakeModel(), (x,), {"scale": 2.0, "mask": m,
                                             "extra": {"a": a, "pair": (b, 3)}, "flag": True})
    assert [t.shape[1] for t in call.tensors] == [1, 2, 3, 4]
    assert call.signature == ("(Tensor, scale=2.0, mask=Tensor, extra={'a': Tensor, "
                              "'pair': (Tensor, 3)}, flag=True)")
    args, kwargs = call.rebuild([t + 1 for t in call.tensors])
    assert args[0].sum() == 2 and kwargs["mask"].sum() == 4 and kwargs["scale"] == 2.0
    assert kwargs["extra"]["pair"][1] == 3 and kwargs["extra"]["pair"][0].sum() == 8
    assert call.input_names(FakeModel()) == ["x", "mask", "extra_a", "extra_pair_0"]


def test_call_structure_signature_changes_with_constants_and_keywords():
    x = torch.zeros(2, 3)
    base = CallStructure(FakeModel(), (x,), {"scale": 2.0}).signature
    assert CallStructure(FakeModel(), (torch.ones(5, 3),), {"scale": 2.0}).signature == base
    assert CallStructure(FakeModel(), (x,), {"scale": 3.0}).signature != base
    assert CallStructure(FakeModel(), (x,), {"scale": x}).signature != base
    assert CallStructure(FakeModel(), (x,), {}).signature != base


def test_call_structure_refusals_name_the_argument():
    x = torch.zeros(2, 3)
    with pytest.raises(CallProblem, match=r"keyword argument extra\['f'\] \(of type function\) "
                                          "is neither a tensor nor a constant"):
        CallStructure(FakeModel(), (x,), {"extra": {"f": forward_of, "t": x}})
    with pytest.raises(CallProblem, match=r"input 1 \(of type float\) is not a tensor.*by "
                                          "keyword"):
        CallStructure(FakeModel(), (x, 2.0), {})
    with pytest.raises(CallProblem, match=r"does not match forward\(x, mask=None, scale=1.0, "
                                          r"extra=None, \*\*options\) of FakeModel: multiple "
                                          "values for argument 'mask'"):
        CallStructure(FakeModel(), (x, x), {"mask": x})


def test_output_structure_rebuilds_every_container():
    t = [torch.full((2,), float(i)) for i in range(5)]
    output = collections.OrderedDict(
        logits=t[0], loss=None, hidden=(t[1], [t[2], {"deep": t[3]}]), pair=Pair(t[4], "tag"))
    structure = OutputStructure(output, "M")
    tensors = structure.take_tensors()
    assert len(tensors) == 5 and structure.take_tensors() == [] and structure.tensor_count == 5
    rebuilt = structure.rebuild([x * 10 for x in tensors])
    assert type(rebuilt) is collections.OrderedDict and list(rebuilt) == list(output)
    assert rebuilt["loss"] is None and rebuilt["pair"].second == "tag"
    assert type(rebuilt["pair"]) is Pair and type(rebuilt["hidden"][1]) is list
    assert rebuilt["hidden"][1][1]["deep"][0] == 30
    doubled = map_tensors(lambda x: x * 2, output)
    assert doubled["pair"].first[0] == 8 and doubled["loss"] is None


@dataclasses.dataclass
class ModelOutput(collections.OrderedDict):
    """Like transformers' ModelOutput: a dataclass and an OrderedDict of the fields set."""
    loss: torch.Tensor = None
    logits: torch.Tensor = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) is not None:
                self[field.name] = getattr(self, field.name)


def test_output_structure_rebuilds_a_dataclass_mapping():
    output = ModelOutput(logits=torch.ones(2, 3))
    structure = OutputStructure(output, "M")
    rebuilt = structure.rebuild([t * 2 for t in structure.take_tensors()])
    assert type(rebuilt) is ModelOutput and list(rebuilt) == ["logits"]
    assert rebuilt.loss is None and rebuilt.logits[0, 0] == 2 and rebuilt["logits"][1, 2] == 2


def test_output_structure_refusals():
    with pytest.raises(CallProblem, match="returned no tensor"):
        OutputStructure((None, 3), "M")
    with pytest.raises(CallProblem, match=r"unsupported output output\['x'\] of type object"):
        OutputStructure({"y": torch.zeros(1), "x": object()}, "M")


class DictModel(torch.nn.Module):
    """Keyword tensors and flags in, a dict with a loss, or a namedtuple, out."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 3)
        self.register_buffer("offset", torch.full((3,), 0.5))

    def forward(self, x, mask=None, labels=None, as_pair=False):
        h = torch.relu(self.a(x))
        h = h * mask if mask is not None else h
        logits = self.b(h) + self.offset
        if as_pair:
            return Pair(logits, h)
        loss = None if labels is None else torch.nn.functional.mse_loss(logits, labels)
        return {"logits": logits, "loss": loss}


def test_module_keeps_names_structure_and_gradients_on_one_rank():
    torch.manual_seed(0)
    model, reference = DictModel(), DictModel()
    reference.load_state_dict(model.state_dict())
    wrapped = autostage.Module(model, partition_num=1, pipeline_num=2)
    x, mask, labels = torch.randn(4, 4), (torch.rand(4, 8) > 0.3).float(), torch.randn(4, 3)
    out = wrapped(x, mask=mask, labels=labels)
    want = reference(x, mask=mask, labels=labels)
    assert list(out) == ["logits", "loss"]
    assert torch.allclose(out["loss"], want["loss"]) and out["loss"].dim() == 0
    out["logits"].sum().backward()  # not the loss: any element starts backward
    want["logits"].sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert sorted(n for n, _ in wrapped._impl.named_parameters()) == \
        sorted(n for n, _ in model.named_parameters())
    with pytest.raises(autostage.Error, match=r"the call's arguments \(Tensor, mask=Tensor, "
                       r"as_pair=True\) differ from those of the traced call \(Tensor, "
                       r"mask=Tensor, labels=Tensor\) \(train mode\)"):
        wrapped(x, mask=mask, as_pair=True)
    model.eval()  # another mode traces its own call: a namedtuple
    reference.eval()
    with torch.no_grad():
        pair = wrapped(x, mask=mask, as_pair=True)
        assert type(pair) is Pair
        assert torch.allclose(pair.first, reference(x, mask=mask, as_pair=True).first)


class Repeats(torch.nn.Module):
    """Returns one tensor twice and an input as it came."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        return {"y": y, "again": y, "pair": (y, x)}


def test_repeated_and_passed_through_outputs():
    torch.manual_seed(0)
    model, reference = Repeats(), Repeats()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 4)
    out = autostage.Module(model, partition_num=1)(x)
    want = reference(x)
    assert torch.equal(out["y"], out["again"]) and torch.equal(out["pair"][1], x)
    (out["again"].sum() + out["pair"][0].pow(2).sum()).backward()
    (want["again"].sum() + want["pair"][0].pow(2).sum()).backward()
    assert torch.allclose(model.a.weight.grad, reference.a.weight.grad, atol=1e-6)


def test_backward_after_the_module_is_dropped():
    """Note [Module lifetime during backward]: the outputs keep their Module alive."""
    torch.manual_seed(0)
    model, reference = Repeats(), Repeats()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(8, 4)
    out = autostage.Module(model, partition_num=1)(x)  # no reference to the Module is kept
    gc.collect()
    out["y"].pow(2).sum().backward()
    reference(x)["y"].pow(2).sum().backward()
    assert torch.allclose(model.a.weight.grad, reference.a.weight.grad, atol=1e-6)


class LossDict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x, target=None):
        return {"loss": torch.nn.functional.mse_loss(self.a(x), target), "note": "mean"}


def test_train_step_returns_the_structure_of_a_loss_dict():
    torch.manual_seed(0)
    model, reference = LossDict(), LossDict()
    reference.load_state_dict(model.state_dict())
    x, target = torch.randn(4, 4), torch.randn(4, 4)
    out = autostage.Module(model, partition_num=1).train_step(x, target=target)
    want = reference(x, target=target)
    want["loss"].backward()
    assert out["note"] == "mean" and torch.allclose(out["loss"], want["loss"].detach())
    assert torch.allclose(model.a.weight.grad, reference.a.weight.grad, atol=1e-6)


def test_rannc_module_passes_keywords_and_structures():
    torch.manual_seed(0)
    model, reference = DictModel(), DictModel()
    reference.load_state_dict(model.state_dict())
    wrapped = RaNNCModule(model, gather_inputs=False)
    x, labels = torch.randn(4, 4), torch.randn(4, 3)
    out = wrapped(x, labels=labels)
    assert torch.allclose(out["loss"], reference(x, labels=labels)["loss"])


class Detector(torch.nn.Module):
    """Keeps the boxes whose score passes a threshold: the output's size depends on values."""

    def __init__(self):
        super().__init__()
        self.score = torch.nn.Linear(4, 1)

    def forward(self, x):
        scores = self.score(x).squeeze(1)
        return x[torch.nonzero(scores > 0).squeeze(1)]


def test_data_dependent_operations_are_refused_by_name():
    with pytest.raises(autostage.UnsupportedError,
                       match=r"unsupported data-dependent operation aten::nonzero \(torch.nonzero"
                             r" / torch.where\(condition\), in forward\) in Detector"):
        autostage.Module(Detector(), partition_num=1)(torch.randn(4, 4))


def test_torchvision_detection_is_refused_by_name():
    detection = pytest.importorskip("torchvision.models.detection")
    model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3).eval()
    # TorchScript front end (1.13) / torch.export, which quotes export's reason (2.x).
    with torch.no_grad(), pytest.raises(
            autostage.UnsupportedError,
            match=r"unsupported data-dependent operation aten::where \(torch.where\(condition\), "
                  r"in rpn\) in FasterRCNN|torch.export of FasterRCNN failed "
                  r"\(GuardOnDataDependentSymNode: Could not guard on data-dependent"):
        autostage.Module(model, partition_num=1)(torch.rand(2, 3, 64, 64))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_keywords_and_structures_on_two_ranks_match_plain_pytorch():
    log = run_driver("call_structure_check.py", ranks=2)
    for rank in range(2):
        for step in ("train dict with loss", "eval without labels",
                     "replanned for scale=2.0, backward from logits",
                     "return_dict=False: a tuple"):
            assert f"rank {rank}: ok {step}" in log, log
    assert "Call arguments changed from" in log, log
