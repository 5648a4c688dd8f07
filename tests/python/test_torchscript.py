"""trace_to_ir + export: whole-graph and split execution must match the plain PyTorch model
exactly (outputs, parameter gradients, BatchNorm running statistics)."""
import contextlib
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autostage


def run_parts(ir, inputs, parts):
    """Runs the IR as a chain of exported node subsets; returns the graph outputs."""
    env = dict(zip(ir.input_names, inputs))
    env.update(zip(ir.param_names, ir.param_tensors))
    for part in parts:
        fn = ir.export(part)
        outputs = fn(*[env[name] for name in fn.input_names])
        assert len(outputs) == len(fn.output_names)
        env.update(zip(fn.output_names, outputs))
    return [env[name] for name in ir.output_names]


def flatten(output):
    return list(output) if isinstance(output, (tuple, list)) else [output]


def backward(outputs):
    loss = sum(o.double().pow(2).sum() for o in outputs if o.is_floating_point())
    loss.backward()


def named_tensors(model):
    return model.state_dict(keep_vars=True)  # every key, tied parameters under each name


def check_model(model, inputs, split_count=2, reference_context=contextlib.nullcontext,
                reference=None, capture=None):
    """Compares `model` run through its IR against an identical eager copy, step by step.
    `capture` makes the IR (trace_to_ir, or export_to_ir in test_export.py)."""
    reference = copy.deepcopy(model) if reference is None else reference
    ir = (capture or autostage.trace_to_ir)(model, inputs)
    own, ref = named_tensors(model), named_tensors(reference)
    assert len(ir.param_names) == len(ir.param_tensors)
    for name, tensor in zip(ir.param_names, ir.param_tensors):
        assert tensor.data_ptr() == own[name].data_ptr(), name  # the module's own tensors
        assert torch.equal(own[name], ref[name]), name  # tracing left state untouched

    n = ir.node_count
    cuts = [n * k // split_count for k in range(split_count + 1)]
    splits = [[list(range(cuts[k], cuts[k + 1])) for k in range(split_count)]]
    for parts in [[list(range(n))]] + splits:
        assert all(ir.is_convex(p) for p in parts)
        with reference_context():
            expected = flatten(reference(*inputs))
        got = run_parts(ir, inputs, parts)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert torch.equal(g, e)
        backward(expected)
        backward(got)
        for name, tensor in zip(ir.param_names, ir.param_tensors):
            if tensor.requires_grad:
                assert tensor.grad is not None, name
                assert torch.equal(tensor.grad, ref[name].grad), name
            else:  # buffers: e.g. BatchNorm running stats, updated in place by both
                assert torch.equal(tensor, ref[name]), name
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    return ir


def test_package_basics():
    assert autostage.__version__ == "0.1.0"
    for cls in (autostage.ConfigError, autostage.FormatError, autostage.UnsupportedError,
                autostage.PlanError, autostage.CommError, autostage.InternalError):
        assert issubclass(cls, autostage.Error)


def test_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Tanh(),
                          nn.Linear(8, 4))
    ir = check_model(model, (torch.randn(8, 16),), split_count=3)
    assert ir.param_names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert ir.input_names == ["input"]
    assert len(ir.graph_hash) == 16
    assert "aten::linear" in str(ir) and 'scope="2"' in str(ir)


def test_cnn_batchnorm_train_mode():
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    model.train()
    ir = check_model(model, (torch.randn(4, 3, 16, 16),))
    assert "1.running_mean" in ir.param_names
    assert "1.num_batches_tracked" in ir.param_names
    assert int(model[1].num_batches_tracked) == 2  # whole + one split run, like the reference


def test_transformer_encoder():
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    check_model(model, (torch.randn(2, 5, 32),), split_count=3)


def test_resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(3)
    model = torchvision.models.resnet18(num_classes=10)
    model.train()
    check_model(model, (torch.randn(2, 3, 64, 64),))


class TiedModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.hidden = nn.Linear(16, 16)
        self.out = nn.Linear(16, 20, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.relu(self.hidden(self.embed(tokens))))


def test_tied_parameters_appear_once():
    torch.manual_seed(4)
    ir = check_model(TiedModel(), (torch.randint(0, 20, (3, 7)),))
    assert ir.param_names.count("embed.weight") == 1
    assert "out.weight" not in ir.param_names


@torch.jit.script
def repeated_tanh(x: torch.Tensor, w: torch.Tensor, steps: int) -> torch.Tensor:
    for _ in range(steps):
        x = torch.tanh(x @ w) + x
    return x


class ScriptLoopModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 8) * 0.2)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(repeated_tanh(self.fc(x), self.w, 4))


def test_script_function_with_loop():
    torch.manual_seed(5)
    # The reference calls the scripted function through the profiling graph executor, which
    # after its profiling run differentiates it with autodiff's symbolic gradients (not bit-equal
    # to autograd). Exported subgraphs run the plain interpreter, so compare against the
    # reference with that optimisation off: then outputs and gradients are bit-equal.
    ir = check_model(ScriptLoopModel(), (torch.randn(6, 8),),
                     reference_context=lambda: torch.jit.optimized_execution(False))
    assert "prim::Loop" in [ir.node_kind(i) for i in range(ir.node_count)]


class LossModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x, target):
        return F.cross_entropy(self.net(x), target)


def test_model_returning_loss():
    torch.manual_seed(6)
    ir = check_model(LossModel(), (torch.randn(5, 10), torch.randint(0, 3, (5,))))
    assert ir.input_names == ["x", "target"]
    output = ir.output_names[0]
    assert f"%{output} : Float(scalar, requires_grad) LOSS" in str(ir)


def test_tuple_output_is_flattened():
    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y.sum(), y

    ir = check_model(TwoOutputs(), (torch.randn(3, 4),))
    assert ir.tuple_output and len(ir.output_names) == 2


def test_non_convex_export_is_rejected():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    ir = autostage.trace_to_ir(model, (torch.randn(2, 4),))
    assert not ir.is_convex([0, 2])
    with pytest.raises(autostage.PlanError, match="non-convex subset"):
        ir.export([0, 2])


class KwargModel(nn.Module):
    def forward(self, x, *, scale=2.0):
        return x * scale


class KwargOnlyScriptModel(nn.Module):
    def forward(self, x, *, scale: float):
        return x * scale


class DictModel(nn.Module):
    def forward(self, x):
        return {"out": x * 2}


class ComplexModel(nn.Module):
    def forward(self, x):
        return torch.view_as_real(torch.view_as_complex(x) * 2)


def test_kwargs_are_unsupported():
    with pytest.raises(autostage.UnsupportedError, match="kwargs"):
        autostage.trace_to_ir(KwargModel(), (torch.randn(2, 3),))
    with pytest.raises(autostage.UnsupportedError, match="kwargs"):
        autostage.trace_to_ir(nn.Identity(), {"input": torch.randn(2, 3)})
    scripted = torch.jit.script(KwargOnlyScriptModel())
    with pytest.raises(autostage.UnsupportedError, match="keyword-only argument 'scale'"):
        autostage.trace_to_ir(scripted, (torch.randn(2, 3),))


def test_dict_output_is_unsupported():
    with pytest.raises(autostage.UnsupportedError, match="dict output"):
        autostage.trace_to_ir(DictModel(), (torch.randn(2, 3),))


def test_complex_dtype_is_unsupported():
    with pytest.raises(autostage.UnsupportedError, match="ComplexFloat"):
        autostage.trace_to_ir(ComplexModel(), (torch.randn(2, 3, 2),))
    with pytest.raises(autostage.UnsupportedError, match="ComplexFloat"):
        autostage.trace_to_ir(nn.Identity(), (torch.randn(2, 3, dtype=torch.cfloat),))


class TimesTwo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class CustomFunctionModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(3, 3))

    def forward(self, x):
        return TimesTwo.apply(self.inner(x)) + 1


def test_custom_autograd_function_is_unsupported():
    with pytest.raises(autostage.UnsupportedError,
                       match=r"unsupported operation prim::PythonOp \(the custom autograd.Function "
                             r"TimesTwo, in forward\) in CustomFunctionModel: it calls back into "
                             r"Python"):
        autostage.trace_to_ir(CustomFunctionModel(), (torch.randn(2, 3),))


def test_loaded_script_module_gets_shapes_from_example_run():
    import io
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(model, torch.randn(2, 4)), buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)  # graphs of loaded modules carry no shapes
    x = torch.randn(5, 4)
    ir = autostage.trace_to_ir(loaded, (x,))
    text = str(ir)
    assert "Float(5, 6, requires_grad) BATCH = aten::relu" in text
    assert f"%{ir.output_names[0]} : Float(5, 3, requires_grad) BATCH" in text
    (out,) = ir.export(list(range(ir.node_count)))(x, *ir.param_tensors)
    assert torch.equal(out, model(x))


class ScriptedControlFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x.permute([1, 0]))
        if bool(h.sum() > 0):
            h = h * 2.0
        else:
            h = h - 1.0
        for i in range(2):
            h = torch.relu(self.fc(h)) + i
        offset = torch.zeros([1, 3], dtype=torch.float64, device=torch.device("cpu"))
        ones = torch.ones_like(h, dtype=torch.float64, device=torch.device("cpu"))
        return h + offset.float() + ones.float()


def test_scripted_module_with_if_loop_and_ival_constants():
    torch.manual_seed(8)
    eager = ScriptedControlFlow()
    model, reference = torch.jit.script(eager), torch.jit.script(copy.deepcopy(eager))
    # Fold the list and device literals into IValue/string prim::Constant nodes.
    torch._C._jit_pass_constant_propagation(model.graph)
    ir = check_model(model, (torch.randn(3, 4),), reference=reference,
                     reference_context=lambda: torch.jit.optimized_execution(False))
    kinds = [ir.node_kind(i) for i in range(ir.node_count)]
    assert "prim::If" in kinds and "prim::Loop" in kinds
    text = str(ir)
    assert "value=is:[1,0]" in text  # int[] constant (an IValue attribute in TorchScript)
    assert 'value=s:"cpu"' in text  # Device constant
    assert "value=t:Float[1,3]:" in text  # tensor constant (folded torch.zeros(...).float())


class TupleAndListInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, pair, extra):
        return self.fc(pair[0]) * pair[1] + extra[0]


def test_tuple_and_list_inputs():
    torch.manual_seed(9)
    inputs = ((torch.randn(2, 3), torch.randn(2, 3)), [torch.randn(2, 3)])
    ir = check_model(TupleAndListInputs(), inputs)
    assert ir.input_names == ["pair", "extra"]
    assert "%pair : (Float(2, 3), Float(2, 3)) BATCH" in str(ir)
