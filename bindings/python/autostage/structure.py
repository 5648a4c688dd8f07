"""How a model call maps to the flat tensors the pipeline runs, and back.

Note [Call structure]
The pipeline (staging::Module) takes a flat list of batch tensors and returns a flat list of
tensors. A model is called with positional tensors, tensors by keyword (also inside lists, tuples
and dicts) and non-tensor keyword arguments (flags, ints), and returns a tensor, a tuple, a
namedtuple, a list or a dict (OrderedDict, or a Mapping such as transformers' model outputs),
nested. ``CallStructure`` records one call: the tensors in order (positional ones first, then
keyword ones in the order given) become the flat inputs; every other value is a constant of
the traced call. ``_CallWrapper`` is what gets traced: its forward takes the flat tensors,
rebuilds the original call, calls the model and returns the output's tensors flat, recording
the output's structure (``OutputStructure``) so that each later call's flat outputs are rebuilt
into the same structure. Non-tensor values inside the output (None, ints, strings) are
constants of the trace and come back as traced.
The wrapper shares the model's ``_modules``, ``_parameters`` and ``_buffers`` dicts instead of
holding the model as a submodule: the traced module's parameter and buffer names, and so the
stages' state_dict keys, stay the model's own (no "model." prefix), and forward hooks of the
model still run because the wrapper calls ``model(...)``.
A call whose constants or structure (which keywords, which nesting) differ from the traced one
is treated like a call with changed shapes (Note [Call signature] in module.py).
"""

import collections
import dataclasses
import inspect
import keyword
import re

import torch

from . import _autostage

# Non-tensor argument types compared by value (their repr is their identity).
CONSTANT_TYPES = (bool, int, float, str, type(None), torch.dtype, torch.device)


class CallProblem(Exception):
    """A call autostage cannot run: (error class name, message)."""

    def __init__(self, error_class, message):
        super().__init__(message)
        self.error_class = error_class


def _is_constant(value):
    if isinstance(value, (tuple, list)):
        return all(_is_constant(v) for v in value)
    return isinstance(value, CONSTANT_TYPES)


def _contains_tensor(value):
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_contains_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_contains_tensor(v) for v in value.values())
    return False


class CallStructure:
    """One call's arguments: the flat tensors (``tensors``), the rest as constants, and a text
    (``signature``) equal for two calls exactly when they trace alike apart from tensor shapes."""

    def __init__(self, model, args, kwargs):
        self._check_binds(model, args, kwargs)
        self.tensors = []
        for i, value in enumerate(args):
            if not isinstance(value, torch.Tensor):
                raise CallProblem(
                    "UnsupportedError",
                    f"input {i} (of type {type(value).__name__}) is not a tensor: autostage "
                    "splits every positional input along dim 0 (the batch); pass tensors, pass "
                    "a flag or size by keyword (a constant of the traced call), or make other "
                    "values attributes of the model")
            self.tensors.append(value)
        self.positional = len(args)
        self.keywords = {name: self._template(name, value) for name, value in kwargs.items()}
        described = [f"{name}={_describe(t)}" for name, t in self.keywords.items()]
        self.signature = f"({', '.join(['Tensor'] * len(args) + described)})"

    @staticmethod
    def _check_binds(model, args, kwargs):
        try:
            signature = inspect.signature(model.forward)
        except ValueError:  # no signature to check (a builtin forward): the trace will tell
            return
        try:
            signature.bind(*args, **kwargs)
        except TypeError as e:
            raise CallProblem("Error", f"the call does not match forward{signature} of "
                              f"{type(model).__name__}: {e}; call the module as you would "
                              "call the model") from e

    def _template(self, path, value):
        """``value`` with each tensor replaced by ('tensor', flat index)."""
        if isinstance(value, torch.Tensor):
            self.tensors.append(value)
            return ("tensor", len(self.tensors) - 1)
        if isinstance(value, (tuple, list)) and _contains_tensor(value):
            return (type(value).__name__,
                    [self._template(f"{path}[{i}]", v) for i, v in enumerate(value)])
        if isinstance(value, dict) and _contains_tensor(value):
            return ("dict", [(k, self._template(f"{path}[{k!r}]", v)) for k, v in value.items()])
        if not _is_constant(value):
            raise CallProblem(
                "UnsupportedError",
                f"keyword argument {path} (of type {type(value).__name__}) is neither a tensor "
                "nor a constant autostage can compare: non-tensor keyword arguments are "
                "constants of the traced call, compared by value on later calls; pass bool, "
                "int, float, str, None, a dtype or a device (or tuples of them), or make the "
                "value an attribute of the model")
        return ("constant", value)

    def rebuild(self, flat):
        """(args, kwargs) of the original call with the tensors taken from ``flat``."""
        return (tuple(flat[:self.positional]),
                {name: _fill(t, flat) for name, t in self.keywords.items()})

    def input_names(self, model):
        """A name per flat tensor, after forward's parameters and the keywords."""
        names = positional_names(model, self.positional, set(self.keywords))
        for name, template in self.keywords.items():
            _names_of(template, name, names)
        return names


def positional_names(model, count, keywords):
    """Names for ``count`` positional arguments of ``model``: forward's parameter names where
    it has them, else ``input_i``; valid identifiers distinct from each other and from the
    ``keywords`` the call passes."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except ValueError:
        params = []
    names = []
    for i in range(count):
        fixed = i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                       params[i].POSITIONAL_OR_KEYWORD)
        names.append(params[i].name if fixed else f"input_{i}")
    return _identifiers(names, taken=keywords)


def share_module_state(module, model):
    """Gives ``module`` the model's own submodule, parameter and buffer dicts, so a module
    traced or exported in place of the model has the model's parameter and buffer names (no
    "model." prefix: the stages' state_dict keys stay the model's)."""
    module._modules = model._modules
    module._parameters = model._parameters
    module._buffers = model._buffers
    module._non_persistent_buffers_set = model._non_persistent_buffers_set
    module.training = model.training


def _describe(template):
    kind, payload = template
    if kind == "tensor":
        return "Tensor"
    if kind == "constant":
        return repr(payload)
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in payload) + "}"
    inner = ", ".join(_describe(v) for v in payload)
    return f"[{inner}]" if kind == "list" else f"({inner})"


def _fill(template, flat):
    kind, payload = template
    if kind == "tensor":
        return flat[payload]
    if kind == "constant":
        return payload
    if kind == "dict":
        return {k: _fill(v, flat) for k, v in payload}
    values = [_fill(v, flat) for v in payload]
    return values if kind == "list" else tuple(values)


def _names_of(template, name, names):
    kind, payload = template
    if kind == "tensor":
        names.append(name)
    elif kind == "dict":
        for k, v in payload:
            _names_of(v, f"{name}_{k}", names)
    elif kind in ("list", "tuple"):
        for i, v in enumerate(payload):
            _names_of(v, f"{name}_{i}", names)


class OutputStructure:
    """The structure of a model's output, recorded from one traced call; ``rebuild`` puts a flat
    list of tensors back into it. ``take_tensors()`` hands over the traced output's tensors
    (once: the structure keeps no tensor)."""

    def __init__(self, output, model_name):
        self._tensors = []
        self._template = _record(output, "output", self._tensors, model_name)
        self.tensor_count = len(self._tensors)
        if not self._tensors:
            raise CallProblem(
                "UnsupportedError",
                f"forward of {model_name} returned no tensor (it returned "
                f"{type(output).__name__}): autostage runs the model's tensor outputs through "
                "the pipeline; return a tensor, or tensors in a tuple, list or dict")

    def take_tensors(self):
        tensors, self._tensors = self._tensors, []
        return tensors

    def rebuild(self, flat):
        flat = list(flat)
        if len(flat) != self.tensor_count:
            raise RuntimeError(f"internal: {len(flat)} outputs for a structure of "
                               f"{self.tensor_count} tensors")
        return _build(self._template, iter(flat))


def _record(value, path, tensors, model_name):
    """The template of an output ``value``; its tensors are appended to ``tensors``."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("tensor", None)
    if isinstance(value, CONSTANT_TYPES):
        return ("constant", value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return ("namedtuple", (type(value), [_record(v, f"{path}.{f}", tensors, model_name)
                                             for f, v in zip(value._fields, value)]))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [_record(v, f"{path}[{i}]", tensors, model_name)
                                       for i, v in enumerate(value)])
    if isinstance(value, collections.abc.Mapping):
        return ("mapping", (type(value), [(k, _record(v, f"{path}[{k!r}]", tensors, model_name))
                                          for k, v in value.items()]))
    raise CallProblem(
        "UnsupportedError",
        f"unsupported output {path} of type {type(value).__name__} from forward of "
        f"{model_name}: autostage returns tensors in tuples, namedtuples, lists and dicts, and "
        "constants (None, numbers, strings); return the tensors that object holds instead")


def _build(template, flat):
    kind, payload = template
    if kind == "tensor":
        return next(flat)
    if kind == "constant":
        return payload
    if kind == "namedtuple":
        cls, items = payload
        return cls(*[_build(v, flat) for v in items])
    if kind == "mapping":
        cls, items = payload
        values = collections.OrderedDict((k, _build(v, flat)) for k, v in items)
        if cls in (dict, collections.OrderedDict):
            return cls(values)
        return cls(**values) if dataclasses.is_dataclass(cls) else cls(values)
    values = [_build(v, flat) for v in payload]
    return values if kind == "list" else tuple(values)


def map_tensors(fn, value):
    """``value`` with ``fn`` applied to every tensor in it (tuples, namedtuples, lists, dicts)."""
    tensors = []
    template = _record(value, "output", tensors, "the model")
    return _build(template, iter([fn(t) for t in tensors]))


class _CallWrapper(torch.nn.Module):
    """Note [Call structure]: traced in place of the model; forward(*flat tensors) -> the
    output's tensors, flat (one tensor alone, else a tuple)."""

    def __init__(self, model, call):
        super().__init__()
        share_module_state(self, model)
        object.__setattr__(self, "_model", model)  # not registered: no "model." prefix
        object.__setattr__(self, "_call", call)
        names = call.input_names(model)
        object.__setattr__(self, "forward", self._named_forward(names))

    @property
    def output_structure(self):
        """The structure of the last call's output (None before the first call)."""
        recorded = self.forward.recorded
        return recorded[-1] if recorded else None

    @classmethod
    def around(cls, model, call):
        """A wrapper of a subclass named like the model's class: the traced module's type name
        names the graph in logs, reports and saved files."""
        named = type(type(model).__name__, (cls,), {"__module__": cls.__module__})
        return named(model, call)

    def _named_forward(self, names):
        # Kept by the function, not the module: torch.export restores the module's attributes
        # (copies of them) after tracing, so a list the module held would lose the record.
        recorded = []

        def forward(*flat):
            args, kwargs = self._call.rebuild(flat)
            output = self._model(*args, **kwargs)
            try:
                structure = OutputStructure(output, type(self._model).__name__)
            except CallProblem as e:
                raise getattr(_autostage, e.error_class)(str(e)) from None
            recorded.append(structure)
            tensors = structure.take_tensors()
            return tensors[0] if len(tensors) == 1 else tuple(tensors)
        forward.recorded = recorded
        # torch.jit.trace names the graph inputs after forward's parameters.
        forward.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for n in _identifiers(names)])
        return forward


def _identifiers(names, taken=()):
    """``names`` made valid, distinct Python identifiers, none of them in ``taken``."""
    result, seen = [], set(taken)
    for name in names:
        name = re.sub(r"\W", "_", str(name))
        name = name if name and not name[0].isdigit() else f"input_{name}"
        unique, n = name, 1
        while unique in seen or keyword.iskeyword(unique):
            unique, n = f"{name}_{n}", n + 1
        seen.add(unique)
        result.append(unique)
    return result
