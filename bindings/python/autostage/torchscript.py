"""Model -> IR: trace (or take a ScriptModule) and import its forward into the autostage IR."""

import contextlib
import inspect
import warnings

import torch

from . import _autostage


def _check_positional_forward(model):
    """Raise UnsupportedError when forward takes keyword-only or **kwargs arguments."""
    for name, param in inspect.signature(model.forward).parameters.items():
        if param.kind in (param.KEYWORD_ONLY, param.VAR_KEYWORD):
            raise _autostage.UnsupportedError(
                f"unsupported keyword argument '{name}' (kwargs) in forward of "
                f"{type(model).__name__}: autostage passes model inputs positionally; "
                "make it a positional argument")


def _as_tuple(example_inputs):
    if isinstance(example_inputs, dict):
        raise _autostage.UnsupportedError(
            "unsupported kwargs: example_inputs is a dict; pass the model inputs as a tuple "
            "of tensors in forward's positional order")
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    return tuple(example_inputs)


def _check_no_python_ops(traced, model_name):
    """A custom torch.autograd.Function is recorded as prim::PythonOp: a call back into Python
    that has no TorchScript body, so no stage can run it. Say so by name instead of failing later
    on its attributes."""
    for node in traced.inlined_graph.nodes():
        if node.kind() == "prim::PythonOp":
            scope = node.scopeName() or "forward"
            raise _autostage.UnsupportedError(
                f"unsupported operation prim::PythonOp (the custom autograd.Function "
                f"{node.pyname()}, in {scope}) in {model_name}: it calls back into Python, so "
                "autostage cannot run it in a pipeline stage; write it with torch operations "
                "(autograd then derives its backward)")


# Operations whose result's size depends on the values of their inputs (Note [Data-dependent
# shapes]), with what they usually are in a model.
_DATA_DEPENDENT_OPS = {
    "aten::nonzero": "torch.nonzero / torch.where(condition)",
    "aten::nonzero_numpy": "torch.where(condition)",
    "aten::masked_select": "masked_select",
    "aten::_unique": "torch.unique",
    "aten::_unique2": "torch.unique",
    "aten::unique_dim": "torch.unique",
    "aten::unique_consecutive": "torch.unique_consecutive",
    "torchvision::nms": "non-maximum suppression (a detection head)",
}


def _all_nodes(nodes):
    """The nodes and, recursively, those in their blocks (the bodies of scripted functions'
    control flow, e.g. torchvision's batched_nms)."""
    for node in nodes:
        yield node
        for block in node.blocks():
            yield from _all_nodes(block.nodes())


def _check_shapes_static(traced, model_name):
    """Note [Data-dependent shapes]
    A trace records one run: an operation whose output size depends on the input values (box
    selection and NMS in detection heads, nonzero, unique) gets the sizes of that run baked into
    every later operation, and its rows are not samples of the batch, so no stage could be
    planned or split for it. Refused by name right after tracing, before any profiling."""
    for node in _all_nodes(traced.inlined_graph.nodes()):
        what = _DATA_DEPENDENT_OPS.get(node.kind())
        if node.kind() == "aten::where" and node.inputsSize() == 1:
            what = "torch.where(condition)"
        if what is not None:
            raise data_dependent_error(node.kind(), what,
                                       node.scopeName().replace("__module.", ""), model_name)


def data_dependent_error(kind, what, scope, model_name):
    """Note [Data-dependent shapes]: the error both front ends raise."""
    return _autostage.UnsupportedError(
        f"unsupported data-dependent operation {kind} ({what}, in {scope or 'forward'}) in "
        f"{model_name}: the size of its result depends on the values of its inputs, so "
        "autostage can neither plan stages for fixed shapes nor split it by samples; "
        "wrap the part of the model before it (e.g. a detection model's backbone) and "
        "run the rest outside autostage")


@contextlib.contextmanager
def buffers_kept(model):
    """Restores the model's buffers after a capture (both front ends run forward once, and
    BatchNorm updates its statistics in place)."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _trace(model, inputs, model_name=None):
    """torch.jit.trace without side effects on the model's buffers (tracing runs forward once).
    ``model_name`` names the user's model in errors when ``model`` wraps it."""
    model_name = model_name or type(model).__name__
    try:
        with buffers_kept(model), warnings.catch_warnings():
            # Note [TorchScript deprecation on 2.x]: PyTorch 2.11 warns that torch.jit.trace is
            # deprecated. The warning is meant for a user's own call; this one is autostage's
            # capture, which the torch.export front end replaces (issue 26). Only that warning
            # is silenced, only around this call.
            warnings.filterwarnings("ignore", category=DeprecationWarning,
                                    message=r".*torch\.jit\.\w+` is deprecated")
            traced = torch.jit.trace(model, inputs, strict=False, check_trace=False)
        _check_no_python_ops(traced, model_name)
        return traced
    except _autostage.Error:
        raise
    except Exception as e:  # torch's tracer reports unsupported forwards as RuntimeError etc.
        raise _autostage.UnsupportedError(
            f"torch.jit.trace of {model_name} failed on the given inputs "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check the "
            "inputs' shapes and dtypes; autostage needs a forward that takes tensors and returns "
            "tensors (alone or in tuples, lists and dicts)") from e


def trace_to_ir(model, example_inputs):
    """Import `model` (an nn.Module, traced with torch.jit.trace, or a ScriptModule) as IR.

    `example_inputs` is a tensor or a tuple of forward's positional inputs. Returns an
    :class:`autostage.IR`: ``str(ir)`` is the IR text, and ``ir.export(node_ids)`` gives a
    callable for a convex node subset. Parameters stay the module's own tensors
    (``ir.param_tensors``), so gradients through exported subgraphs reach the model.
    """
    inputs = _as_tuple(example_inputs)
    if isinstance(model, torch.jit.ScriptModule):
        script = model
    elif isinstance(model, torch.nn.Module):
        _check_positional_forward(model)
        script = _trace(model, inputs)
    else:
        raise _autostage.UnsupportedError(
            f"trace_to_ir expects a torch.nn.Module or torch.jit.ScriptModule, got "
            f"{type(model).__name__}")
    return _autostage._import_module(script, list(inputs))
