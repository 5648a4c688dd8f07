"""Model -> IR with torch.export (PyTorch 2.x): the front end that replaces TorchScript.

Note [Front ends]
autostage has one IR and two front ends. On PyTorch 2.x, ``autostage.Module`` captures the model
with ``torch.export.export(strict=False)`` (the training IR: ATen operator overloads before
decomposition, parameters and buffers lifted to graph inputs) and writes that program into the IR
here; each stage then runs its nodes through the ATen dispatcher from C++
(frontend/export/interpreter.h, Note [Export node kinds]), with autograd recorded as in eager
PyTorch. On LibTorch 1.13, for a ScriptModule, and for C++ users' ``torch::jit::load`` models,
the TorchScript front end traces (torchscript.py) and runs TorchScript functions. The option
``front_end`` chooses (auto: export where torch.export has the training IR, except for a model
that runs TorchScript code of its own, ``scripted_code``: its scripted loops and branches are
TorchScript's IR already, and export could only trace through them with the example's values; the
log says which). Nothing falls back silently from one to the other: a model export refuses raises
UnsupportedError quoting export's reason, and ``front_end=torchscript`` is the user's explicit way
back.

Dynamic batch: every batch input's dim 0 is exported as ``Dim.AUTO``, so size arithmetic stays
symbolic (``sym_size`` nodes and ``_operator::*`` nodes) and micro-batches of any size run the
same graph. Where the model specialises the batch dimension (export found it must be one value),
the capture says so once in the log, and the job profiles at that size and plans micro-batches of
exactly that many rows per replica (Note [Fixed micro-batch size] in decomposer/plan.h): replicas
x micro-batches x that size is the batch, so the graph never runs another row count.

Note [Calls through export's specs]
On this front end the model itself is exported with the call's own arguments (positional
tensors, keywords with tensors nested in lists, tuples and dicts, constants such as
``return_dict=True`` or ``use_cache=False``), through ``_ModelCall``, whose forward signature
names exactly those arguments so that each gets its dynamic batch dimension even where the
model's forward takes ``**kwargs``. What export records is then the call's structure: its input
spec (the pytree of ``(args, kwargs)``; non-tensor leaves are constants of the program) orders
the IR's inputs, and its output spec with the output's constants (``ExportedOutput``) rebuilds
what the model returns (tuples, dicts, namedtuples, transformers' ModelOutput: any type
registered with torch's pytree). ``CallStructure`` (structure.py) still splits the call before
the first capture (every rank compares its signature) and is checked against export's spec:
the same tensors in the same order, or an internal error. The TorchScript front end traces a
flat-tensor wrapper instead (Note [Call structure]), since ``torch.jit.trace`` takes tensors only.
"""

import inspect
import operator

import torch
from torch.utils import _pytree as pytree

from . import _autostage
from .structure import CONSTANT_TYPES, positional_names, share_module_state
from .torchscript import _DATA_DEPENDENT_OPS, buffers_kept, data_dependent_error

# ScalarType, Layout and MemoryFormat are ints in a boxed call (c10's enum values).
_SCALAR_TYPES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
    torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.complex64: 9,
    torch.complex128: 10, torch.bool: 11, torch.bfloat16: 15,
}
_LAYOUTS = {torch.strided: 0, torch.sparse_coo: 1}
_MEMORY_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1,
                   torch.channels_last: 2, torch.channels_last_3d: 3}
# IR dtype names (core/ir/type.h).
_DTYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
    torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
    torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
}
# Python arithmetic on sizes (Note [Export node kinds]).
_ARITHMETIC = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.floordiv: "floordiv",
    operator.truediv: "truediv", operator.mod: "mod", operator.neg: "neg", operator.pow: "pow",
    operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le",
    operator.gt: "gt", operator.ge: "ge",
}
if hasattr(torch, "sym_max"):  # PyTorch 2.x (this module is imported on 1.13 too)
    _ARITHMETIC.update({torch.sym_max: "max", torch.sym_min: "min"})
# Checks export inserts for its own guards; they return nothing and are not run. (The dtype
# checks of _assert_tensor_metadata would fail under the stages' autocast, which the capture
# does not run under: Note [Autocast execution].)
_SKIPPED = ("aten::_assert_scalar", "aten::sym_constrain_range_for_size",
            "aten::sym_constrain_range", "aten::_assert_async", "aten::_assert_tensor_metadata")


def available():
    """True when this PyTorch has torch.export with the training IR (2.5 and later)."""
    return hasattr(torch, "export") and hasattr(torch.export, "Dim") and \
        hasattr(torch.export.Dim, "AUTO")


def _size(value):
    """A concrete size of the captured example: a SymInt's hint, else the int."""
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else -1
    return int(value)


def _tensor_type(t, requires_grad=None, batch=None):
    """The IR type text of tensor ``t``; with ``batch`` (the batch's size symbols) an activation
    whose dim 0 is none of them is marked not_batch_major (Note [Rows of a value] in
    core/ir/type.h)."""
    if t.dtype not in _DTYPE_NAMES:
        raise _autostage.UnsupportedError(
            f"unsupported dtype {t.dtype} in the exported program: autostage's IR carries "
            f"{', '.join(str(d) for d in _DTYPE_NAMES)}")
    dims = [str(_size(d)).replace("-1", "*") for d in t.shape] or ["scalar"]
    grad = t.requires_grad if requires_grad is None else requires_grad
    details = dims + (["requires_grad"] if grad else [])
    if batch and t.dim() > 0 and _symbol(t.shape[0]) not in batch:
        details.append("not_batch_major")
    return f"{_DTYPE_NAMES[t.dtype]}({', '.join(details)})"


def _symbol(size):
    """A size's symbolic expression (None for a concrete size)."""
    return size.node.expr if isinstance(size, torch.SymInt) else None


def _value_type(val, where, batch=None):
    if isinstance(val, torch.Tensor):
        return _tensor_type(val, batch=batch)
    if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
        return "int"
    if isinstance(val, (torch.SymFloat, float)):
        return "float"
    if isinstance(val, (torch.SymBool, bool)):
        return "bool"
    raise _autostage.UnsupportedError(
        f"unsupported value {type(val).__name__} produced by {where} in the exported program: "
        "autostage's IR carries tensors, ints, floats and bools between operators")


# Note [Sizes read where they are used]
# torch.export reads a symbolic size once: the first read of the batch's size (`x.shape[0]`)
# becomes one sym_size node at the top of the program, and every later use of that size, where
# the model reads it again included, refers to that node (and to arithmetic nodes over it). An
# int cannot cross a stage boundary (a replica's size is its own: Note [Non-tensor values are not
# cut] in decomposer/coarsen.h), so such a size used by the last layer kept the whole model in
# one block. The importer therefore writes each use of a symbolic size by a tensor operation as a
# read of that operation's own operand: a dim whose symbolic extent is the size (sym_size), or a
# whole multiple of it (its rows divided, `flat.view(x.shape[0], -1)` over a flattened tensor) or
# a whole fraction (multiplied, `h.reshape(rows * 8, 2)`). The extents are export's symbolic
# expressions, so the read is right at every batch size the program runs, and an operand is in
# the stage of the operation that uses it. A size no operand has (`torch.ones(rows, 1)`, or one
# used by size arithmetic) keeps its node as export wrote it; a size node left with no user is
# not written.


def _is_size(node):
    """Whether fx ``node`` computes a symbolic size (sym_size, size arithmetic), not a tensor."""
    return node.op == "call_function" and isinstance(
        node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def _operands(node):
    """The fx nodes among ``node``'s arguments (lists and tuples flattened), in order."""
    found = []

    def walk(value):
        if isinstance(value, torch.fx.Node):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
    walk(node.args)
    walk(node.kwargs)
    return found


def _local_source(consumer, size):
    """Note [Sizes read where they are used]: (tensor, dim, op, factor) such that the size is
    ``sym_size(tensor, dim)`` (op None), that divided by ``factor`` (op "floordiv") or times it
    (op "mul"), ``tensor`` an operand of ``consumer``; None where no operand has it."""
    val = size.meta.get("val")
    expr = _symbol(val) if isinstance(val, torch.SymInt) else None
    if expr is None or expr.is_number:
        return None
    ratios = []
    for operand in _operands(consumer):
        t = operand.meta.get("val")
        if not isinstance(t, torch.Tensor):
            continue
        for dim, extent in enumerate(t.shape):
            e = _symbol(extent)
            if e is None:
                continue
            if e == expr:
                return operand, dim, None, 1
            for op, ratio in (("floordiv", e / expr), ("mul", expr / e)):
                if ratio.is_Integer and ratio > 1:
                    ratios.append((operand, dim, op, int(ratio)))
    return ratios[0] if ratios else None


def _schema_element_type(argument_type):
    """The IR element type of a list argument (`int[]`, `Tensor[]`, `Tensor?[]`, ...)."""
    if isinstance(argument_type, torch._C.OptionalType):  # int[]? (mean's dim)
        argument_type = argument_type.getElementType()
    if not isinstance(argument_type, torch._C.ListType):
        return None
    text = str(argument_type.getElementType())
    return {"int": "int", "SymInt": "int", "float": "float", "bool": "bool", "Tensor": "Tensor",
            "Optional[Tensor]": "Tensor?"}.get(text)


class _Importer:
    """One pass over ``ep.graph``, writing each node through the C++ builder."""

    def __init__(self, ep, model, model_name):
        self.ep, self.model, self.model_name = ep, model, model_name
        self.builder = _autostage._ExportBuilder(model_name)
        self.ids = {}       # fx node -> IR value id (or list of ids for multi-output nodes)
        self.constants = {}  # (type, repr) -> IR value id, one constant node per value
        self.constant_inputs = {}  # fx placeholder -> the call's non-tensor argument
        # Note [Sizes read where they are used]: (consumer, size node) -> where the consumer
        # reads that size itself, and the size nodes no longer written because of it.
        self.local_sizes, self.dropped_sizes = {}, set()
        self.consumer = None  # the node whose arguments argument() is writing

    # Inputs -------------------------------------------------------------------------------
    def inputs(self, leaves):
        """Writes the IR's inputs: the call's tensors among ``leaves`` (the call's arguments
        flattened as export's input spec flattens them; the other leaves are constants of the
        call), then the lifted parameters, buffers and constants; returns (those tensors, their
        names)."""
        spec_of = {s.arg.name: s for s in self.ep.graph_signature.input_specs
                   if hasattr(s.arg, "name")}
        placeholders = [n for n in self.ep.graph.nodes if n.op == "placeholder"]
        kinds = torch.export.graph_signature.InputKind
        user = [n for n in placeholders if spec_of[n.name].kind == kinds.USER_INPUT]
        self.user_nodes = user
        if len(user) != len(leaves):
            raise _autostage.Error(
                f"internal: the exported program has {len(user)} user inputs for the call's "
                f"{len(leaves)} arguments")
        # The batch's size symbols: dim 0 of the call's tensors, where export kept it dynamic.
        self.batch = {_symbol(n.meta["val"].shape[0]) for n, v in zip(user, leaves)
                      if isinstance(v, torch.Tensor) and v.dim() > 0} - {None}
        for node, value in zip(user, leaves):
            if isinstance(value, torch.Tensor):
                self.ids[node] = self.builder.add_input(node.name, _tensor_type(value), False)
            else:
                self.constant_inputs[node] = value
        named = dict(self.model.named_parameters(remove_duplicate=False))
        named.update(self.model.named_buffers(remove_duplicate=False))
        tensors, names = [], []
        seen = {}  # id(tensor) -> IR input: tied parameters (lifted once per name) appear once
        for node in placeholders:
            spec = spec_of[node.name]
            if spec.kind == kinds.USER_INPUT:
                continue
            if spec.kind in (kinds.PARAMETER, kinds.BUFFER):
                tensor = named[spec.target]
            elif spec.kind == kinds.CONSTANT_TENSOR:
                tensor = self.ep.constants[spec.target]
            else:
                raise _autostage.UnsupportedError(
                    f"unsupported input {node.name} of kind {spec.kind.name} in the exported "
                    f"program of {self.model_name}")
            if id(tensor) in seen:
                self.ids[node] = seen[id(tensor)]
                continue
            self.ids[node] = seen[id(tensor)] = self.builder.add_input(
                spec.target, _tensor_type(tensor), True)
            tensors.append(tensor)
            names.append(spec.target)
        return tensors, names

    # Sizes -------------------------------------------------------------------------------
    def read_sizes_where_used(self):
        """Note [Sizes read where they are used]: decides, before any node is written, which
        operations read a size from one of their own tensor operands, and which size nodes
        nothing reads any more."""
        nodes = [n for n in self.ep.graph.nodes if n.op in ("call_function", "output")]
        needed, dropped = set(), set()
        for consumer in reversed(nodes):  # every user of a node before the node itself
            if isinstance(consumer.target, torch._ops.OpOverload) and \
                    consumer.target._schema.name in _SKIPPED:
                continue  # not written: reads nothing
            if consumer in dropped and consumer not in needed:  # not written either, so its
                dropped.update(s for s in _operands(consumer) if _is_size(s))  # operands lose it
                continue
            for size in _operands(consumer):
                if not _is_size(size):
                    continue
                source = None
                if consumer.op == "call_function" and not _is_size(consumer):
                    source = _local_source(consumer, size)
                if source is None:
                    needed.add(size)
                else:
                    self.local_sizes[(consumer, size)] = source
                    dropped.add(size)
        self.dropped_sizes = dropped - needed

    def local_size(self, size, source):
        """Writes ``size`` read again from the consumer's own operand (``_local_source``)."""
        tensor, dim, op, factor = source
        name = f"{self.consumer.name}.{size.name}"
        read = self.builder.add_node("aten::sym_size.int",
                                     [self.ids[tensor], self.constant(dim, "int")], ["int"],
                                     [name if op is None else name + ".read"], None,
                                     _scope(self.consumer))[0]
        if op is None:
            return read
        return self.builder.add_node(f"_operator::{op}", [read, self.constant(factor, "int")],
                                     ["int"], [name], None, _scope(self.consumer))[0]

    # Constants and arguments --------------------------------------------------------------
    def constant(self, value, type_text):
        key = (type_text, repr(value))
        if key not in self.constants:
            self.constants[key] = self.builder.add_node(
                "prim::Constant", [], [type_text], [""], value, "")[0]
        return self.constants[key]

    def argument(self, value, argument_type, where):
        """The IR value id for one argument of an operator call."""
        if isinstance(value, torch.fx.Node) and value in self.constant_inputs:
            return self.argument(self.constant_inputs[value], argument_type, where)
        if isinstance(value, torch.fx.Node):
            source = self.local_sizes.get((self.consumer, value))
            if source is not None:  # Note [Sizes read where they are used]
                return self.local_size(value, source)
            ref = self.ids.get(value)
            if isinstance(ref, list) or ref is None:
                raise _autostage.UnsupportedError(
                    f"unsupported use of {value.name} (a {value.target} result) by {where}")
            return ref
        if value is None:
            return self.constant(None, "NoneType")
        if isinstance(value, bool):
            return self.constant(value, "bool")
        if isinstance(value, int):
            return self.constant(value, "int")
        if isinstance(value, float):
            return self.constant(value, "float")
        if isinstance(value, str):
            return self.constant(value, "str")
        if isinstance(value, torch.dtype):
            return self.constant(_SCALAR_TYPES[value], "int")
        if isinstance(value, torch.layout):
            return self.constant(_LAYOUTS[value], "int")
        if isinstance(value, torch.memory_format):
            return self.constant(_MEMORY_FORMATS[value], "int")
        if isinstance(value, torch.device):
            return self.constant(str(value), "Device")
        if isinstance(value, (list, tuple)):
            return self.list_argument(list(value), argument_type, where)
        raise _autostage.UnsupportedError(
            f"unsupported argument {value!r} ({type(value).__name__}) of {where} in the exported "
            f"program of {self.model_name}")

    def list_argument(self, values, argument_type, where):
        element = _schema_element_type(argument_type) if argument_type is not None else None
        if element is None:
            raise _autostage.UnsupportedError(
                f"unsupported list argument of type {argument_type} of {where}")
        if element in ("int", "float", "bool") and \
                not any(isinstance(v, torch.fx.Node) for v in values):
            return self.constant([v for v in values], f"{element}[]")
        ids = [self.argument(v, None, where) for v in values]
        return self.builder.add_node("prim::ListConstruct", ids, [f"{element}[]"], [""], None,
                                     "")[0]

    # Nodes --------------------------------------------------------------------------------
    def node(self, node):
        if node in self.dropped_sizes:  # Note [Sizes read where they are used]
            return
        self.consumer = node
        target = node.target
        if target is operator.getitem:
            producer, index = node.args
            ref = self.ids.get(producer)
            if not isinstance(ref, list):
                raise _autostage.UnsupportedError(
                    f"unsupported indexing of {producer.name} at {node.name}")
            self.ids[node] = ref[index]
            return
        if target in _ARITHMETIC:
            ids = [self.argument(a, None, node.name) for a in node.args]
            self.ids[node] = self.builder.add_node(
                f"_operator::{_ARITHMETIC[target]}", ids,
                [_value_type(node.meta["val"], node.name)], [node.name], None, "")[0]
            return
        if not isinstance(target, torch._ops.OpOverload):
            raise _autostage.UnsupportedError(
                f"unsupported operation {getattr(target, '__name__', target)} ({node.name}) in "
                f"the exported program of {self.model_name}: autostage runs ATen operators "
                "and size arithmetic; control flow (torch.cond, while_loop) and other "
                "higher-order operators cannot be cut into stages")
        schema = target._schema
        if schema.name in _SKIPPED:
            return
        self.check_shapes_backed(node, schema)
        kind = f"{schema.name}.{target._overloadname}"
        where = f"{kind} ({node.name})"
        ids = []
        for i, argument in enumerate(schema.arguments):
            if i < len(node.args) and not argument.kwarg_only:
                value = node.args[i]
            elif argument.name in node.kwargs:
                value = node.kwargs[argument.name]
            elif argument.has_default_value():
                value = argument.default_value
            else:
                raise _autostage.UnsupportedError(
                    f"{where} lacks its argument '{argument.name}'")
            ids.append(self.argument(value, argument.type, where))
        val = node.meta.get("val")
        multiple = len(schema.returns) > 1 or (
            len(schema.returns) == 1 and isinstance(val, (list, tuple)))
        values = list(val) if multiple else ([] if not schema.returns else [val])
        types = [_value_type(v, where, self.batch) for v in values]
        names = [f"{node.name}.{i}" for i in range(len(values))] if multiple else [node.name]
        outputs = self.builder.add_node(kind, ids, types, names[:len(types)], None,
                                        _scope(node))
        self.ids[node] = list(outputs) if multiple else (outputs[0] if outputs else None)

    def check_shapes_backed(self, node, schema):
        """Note [Data-dependent shapes] (torchscript.py): export gives an operation whose
        result's size depends on the input values an unbacked size (no example value); refused
        by name, as the TorchScript front end refuses it."""
        values = node.meta.get("val")
        values = values if isinstance(values, (list, tuple)) else [values]
        for value in values:
            if isinstance(value, torch.Tensor) and any(
                    isinstance(d, torch.SymInt) and d.node.hint is None for d in value.shape):
                what = _DATA_DEPENDENT_OPS.get(schema.name)
                if schema.name == "aten::where":
                    what = "torch.where(condition)"
                raise data_dependent_error(schema.name, what or "a result sized by input values",
                                           _scope(node), self.model_name)

    def outputs(self):
        kinds = torch.export.graph_signature.OutputKind
        for spec in self.ep.graph_signature.output_specs:
            if spec.kind != kinds.USER_OUTPUT:
                raise _autostage.UnsupportedError(
                    f"unsupported output {spec.arg} of kind {spec.kind.name} in the exported "
                    f"program of {self.model_name}")
        output = next(n for n in self.ep.graph.nodes if n.op == "output")
        self.consumer = output
        for value in output.args[0]:  # constants among them are ExportedOutput's
            if isinstance(value, torch.fx.Node):
                self.builder.add_output(self.argument(value, None, "the output"))


class _CustomFunctions:
    """Records the custom torch.autograd.Function classes a model applies while it is exported
    (torch.export inlines their forward and loses their backward)."""

    def __init__(self):
        self.names, self.original = [], None

    def __enter__(self):
        function = torch.autograd.Function
        self.original = function.__dict__["apply"]
        names, original = self.names, self.original

        def apply(cls, *args, **kwargs):
            if cls.__module__.split(".")[0] != "torch":  # torch's own run under export
                names.append(cls.__qualname__)
            return original.__func__(cls, *args, **kwargs)
        function.apply = classmethod(apply)
        return self

    def __exit__(self, *exc):
        torch.autograd.Function.apply = self.original


def _scope(node):
    """The module path of the node's innermost module (`layers.3.attn`), as in the partition log."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path.split("@")[0]


def _export_reason(error):
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[:6])[:1200] if lines else type(error).__name__


def scripted_code(model):
    """What TorchScript code `model` runs, or None: a ScriptModule among its modules, or a
    ``torch.jit.script`` function named by the code of a method of one of its modules' classes
    (RaNNC's FunctionModel calls a scripted loop from forward). Such a model is captured with
    TorchScript under front_end=auto (Note [Front ends])."""
    for path, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            return f"the scripted module {path or type(module).__name__}"
        for cls in type(module).__mro__:
            if cls.__module__.startswith("torch."):
                break
            for attr in vars(cls).values():
                code = getattr(attr, "__code__", None)
                if code is None:
                    continue
                for name in code.co_names:
                    if isinstance(attr.__globals__.get(name), torch.jit.ScriptFunction):
                        return f"the scripted function {name} in {cls.__name__}.{attr.__name__}"
    return None


def export_to_ir(model, inputs, model_name=None, log=None):
    """Captures ``model`` (called as ``model(*inputs)`` with tensors) with torch.export and
    returns its :class:`autostage.IR` (Note [Front ends]). Parameters stay the module's own
    tensors. Raises UnsupportedError quoting export's reason when export rejects the model."""
    return export_call(model, tuple(inputs), {}, model_name, log)[0]


def export_call(model, args, kwargs, model_name=None, log=None):
    """Captures the call ``model(*args, **kwargs)`` with torch.export: (the IR, an
    :class:`ExportedOutput` that rebuilds the model's output from the IR's outputs). The IR's
    inputs are the call's tensors in the order of export's input spec (Note [Calls through
    export's specs])."""
    model_name = model_name or type(model).__name__
    entry = _ModelCall(model, args, kwargs)
    try:
        with buffers_kept(model), _CustomFunctions() as functions:
            ep = torch.export.export(entry, args, kwargs, dynamic_shapes=entry.dynamic_shapes,
                                     strict=False)
        if functions.names:
            raise _autostage.UnsupportedError(
                f"unsupported operation torch.autograd.Function (the custom autograd.Function "
                f"{functions.names[0]}) in {model_name}: torch.export records the operations of "
                "its forward and drops its backward, so its gradients would be wrong; write it "
                "with torch operations (autograd then derives its backward), or set "
                "front_end=torchscript")
    except _autostage.Error:
        raise
    except Exception as e:  # export reports graph breaks, data-dependent shapes, ... as errors
        raise _autostage.UnsupportedError(
            f"torch.export of {model_name} failed ({type(e).__name__}: {_export_reason(e)}); "
            "autostage captures the model with torch.export (front_end=export): make the "
            "forward exportable (no data-dependent control flow or output sizes, no returned "
            "cache objects; pass use_cache=False to transformers models), or set "
            "front_end=torchscript") from e
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    if in_spec != ep.call_spec.in_spec:
        raise _autostage.Error(f"internal: the call's structure {in_spec} is not the input "
                               f"spec {ep.call_spec.in_spec} of the program exported from it")
    importer = _Importer(ep, model, model_name)
    tensors, names = importer.inputs(leaves)
    from torch.fx.experimental.symbolic_shapes import is_concrete_int
    batch = [(n, v) for n, v in zip(importer.user_nodes, leaves)
             if isinstance(v, torch.Tensor) and v.dim() > 0]
    fixed = [n.name for n, v in batch if is_concrete_int(n.meta["val"].shape[0])]
    fixed_rows = batch[0][1].shape[0] if fixed else 0
    if fixed and log is not None:
        why = ("torch.export specialises sizes 0 and 1; capture with a batch of 2 or more to "
               "keep it dynamic" if fixed_rows < 2 else "the model's code fixes it")
        log(f"torch.export specialised the batch dimension of {', '.join(fixed)} to the "
            f"captured size {fixed_rows} ({why}): the captured graph runs only that many rows, "
            f"so it is profiled at {fixed_rows} rows and planned with micro-batches of exactly "
            f"{fixed_rows} rows per replica (micro_batch_size={fixed_rows})")
    importer.read_sizes_where_used()
    for node in ep.graph.nodes:
        if node.op == "call_function":
            importer.node(node)
        elif node.op not in ("placeholder", "output"):
            raise _autostage.UnsupportedError(
                f"unsupported {node.op} node {node.name} in the exported program of "
                f"{model_name}")
    importer.outputs()
    output = ExportedOutput(ep, model_name)
    return importer.builder.finish(tensors, names, output.tensor_count != 1, fixed_rows), output


class ExportedOutput:
    """The model's output structure as torch.export recorded it (Note [Calls through export's
    specs]): ``rebuild`` puts the IR's flat output tensors into it, with the output's constants
    (None, numbers, strings) where export found them."""

    def __init__(self, ep, model_name):
        self._spec = ep.call_spec.out_spec
        self._leaves = []  # per output leaf: None for a tensor, else ("constant", value)
        for spec in ep.graph_signature.output_specs:
            arg = spec.arg
            if isinstance(arg, torch.export.graph_signature.TensorArgument):
                self._leaves.append(None)
            elif isinstance(arg, torch.export.graph_signature.ConstantArgument):
                self._leaves.append(("constant", arg.value))
            else:
                raise _autostage.UnsupportedError(
                    f"unsupported output {arg} ({type(arg).__name__}) of {model_name}: "
                    "autostage returns tensors and constants; return sizes as tensors or "
                    "compute them from the outputs")
        self.tensor_count = self._leaves.count(None)
        if self.tensor_count == 0:
            returned = (type(self._leaves[0][1]) if self._spec.is_leaf() and self._leaves
                        else self._spec.type)
            raise _autostage.UnsupportedError(
                f"forward of {model_name} returned no tensor (it returned "
                f"{returned.__name__}): autostage runs the model's "
                "tensor outputs through the pipeline; return a tensor, or tensors in a tuple, "
                "list or dict")

    def rebuild(self, flat):
        flat = iter(flat)
        leaves = [next(flat) if leaf is None else leaf[1] for leaf in self._leaves]
        return pytree.tree_unflatten(leaves, self._spec)


class _ModelCall(torch.nn.Module):
    """What is exported in place of the model: the model itself, called with one call's
    arguments by name. forward's signature lists exactly this call's arguments (the model's
    positional parameter names, then the keywords given), so the dynamic shapes are given per
    argument even where forward takes ``**kwargs``. The model's dicts are shared, so the
    parameter and buffer names are the model's own (Note [Call structure])."""

    def __init__(self, model, args, kwargs):
        super().__init__()
        share_module_state(self, model)
        object.__setattr__(self, "_model", model)  # not registered: no "model." prefix
        names = positional_names(model, len(args), set(kwargs))
        parameter = inspect.Parameter
        self.forward = lambda *a, **k: _checked_output(self._model(*a, **k), type(model))
        self.forward.__signature__ = inspect.Signature(
            [parameter(n, parameter.POSITIONAL_ONLY) for n in names] +
            [parameter(k, parameter.KEYWORD_ONLY) for k in kwargs])
        batch = lambda v: ({0: torch.export.Dim.AUTO}  # noqa: E731
                           if isinstance(v, torch.Tensor) and v.dim() > 0 else None)
        self.dynamic_shapes = {n: pytree.tree_map(batch, v) for n, v in zip(names, args)}
        self.dynamic_shapes.update({k: pytree.tree_map(batch, v) for k, v in kwargs.items()})


def _checked_output(output, model_class):
    """``output``, when every leaf of its pytree is a tensor or a constant; else the
    UnsupportedError naming the first other leaf (export would fail on it less clearly)."""
    for path, leaf in pytree.tree_flatten_with_path(output)[0]:
        if not isinstance(leaf, (torch.Tensor,) + CONSTANT_TYPES):
            raise _autostage.UnsupportedError(
                f"unsupported output output{pytree.keystr(path)} of type "
                f"{type(leaf).__name__} from forward of {model_class.__name__}: autostage "
                "returns tensors in tuples, namedtuples, lists, dicts and types registered with "
                "torch's pytree, and constants (None, numbers, strings); return the tensors "
                "that object holds instead")
    return output
