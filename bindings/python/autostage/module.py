"""autostage.Module: wrap a model, launch with mpirun, train with the single-process loop."""

import collections
import weakref

import torch
from torch.utils import _pytree as pytree

from . import _autostage
from .abort_hook import install_abort_hook
from .checkpoint import load_state_dict_checked
from .export import export_call, scripted_code
from .options import front_end, last_capture, option_enabled, option_text, option_value
from .optimizer import make_shards, patch_optimizer, patch_zero_step, zero_problem
from .structure import CallProblem, CallStructure, _CallWrapper
from .torchscript import _check_shapes_static, _trace

_MODE_NAMES = {True: "train", False: "eval"}


class Module(torch.nn.Module):
    """Pipeline-parallel wrapper around an unmodified model.

    ``autostage.Module(model, optimizer=None, **options)``: options are config keys (see
    ``autostage.show_config()``), e.g. ``partition_num=2``; they set the process-wide options (Note
    [Per-module plan options] in driver/plan_sources.cpp), so a later module of the same process
    plans and runs with them too unless it sets them again. The first call traces the model with
    that call's inputs, profiles it, plans stages on rank 0 (or loads ``load_deployment``),
    broadcasts the plan and deploys it. Every rank passes its local batch and gets back the output
    rows of that batch; ``loss.backward()`` runs the pipeline backward and averages gradients over
    each stage's replicas, like DistributedDataParallel. After deployment the optimizer holds only
    this rank's parameters, so ``optimizer.step()`` is unchanged; ``optimizer.state_dict(
    from_global=True)`` / ``load_state_dict(sd, from_global=True)`` give and take the whole model's
    optimizer state in PyTorch's layout (autostage/optimizer.py).

    Note [Train and eval deployments]
    Dropout and BatchNorm trace differently in train and eval mode, so each mode gets its own
    trace and its own deployments, made on the first call in that mode and kept. The one
    staging module (``_impl``) switches between them: each call gives it ``model.training``
    (Note [Train and eval modes] in driver/module.h, the one mode switch). Within a mode it keeps
    one deployment per usage (forward with gradients, forward under no_grad, train_step; Note
    [One deployment per usage] in driver/module.h). All deployments feed the model's own
    parameter and buffer tensors, but each rank holds (and updates) only those of its stage, and
    the plans may give a rank different stages. So on a switch the ranks first share the current
    values from the last holders (the staging module does), and this side sets the gradients of
    parameters outside the optimizer's selection to None (so gradients accumulated across a
    switch without zero_grad() survive only where a parameter keeps its holders). The optimizer
    follows the training deployment: when the one that ran is a training deployment other than the
    one it holds the parameters of (``training_selection``), its global state is gathered under
    the old selection and loaded under the new one. An inference deployment never changes it.
    Every rank must switch at the same call.

    Note [Call signature]
    The model is called like the plain model: tensors by position or keyword (also inside lists,
    tuples and dicts) are the batch inputs, other keyword arguments are constants of the trace,
    and the output keeps its structure (Note [Call structure] in structure.py). The staging
    module compares only the flat tensors' dtypes and shapes with the traced ones, so this side
    compares the rest: each mode records the signature of the call it traced (which keywords,
    how tensors nest, the constants' values). A later call with another signature is handled
    like changed shapes: an Error naming both, or, with allow_replan=true, both modes are
    undeployed (``_undeploy``) and this call traces and plans again. Every rank must call with
    the same signature: it is part of what the ranks compare before the call, whenever it has
    keywords or differs from the traced one (so ranks that disagree on whether to replan raise
    the same error instead of hanging).
    """

    def __init__(self, model, optimizer=None, load_deployment=None, **options):
        super().__init__()
        for key, value in options.items():
            _autostage._set_option(key, option_text(value))
        # zero=auto without an optimizer it can shard: this module plans with zero=0.
        self._zero_off = _choose_zero(model, optimizer)
        self.model = model
        self._optimizer = optimizer
        # The optimizer's full parameter lists, to re-select the local ones after a replan.
        self._all_params = ([list(g["params"]) for g in optimizer.param_groups]
                            if optimizer is not None else [])
        self._load_deployment = load_deployment or ""
        self._impl = None       # the staging module (Note [Train and eval deployments])
        self._last_mode = None  # model.training at the last call that ran
        self._selection = None  # (staging module, training_selection) the optimizer follows
        self._selected = None   # data_ptrs of the parameters the optimizer holds
        # Note [Call signature]: per mode, the traced call's signature and output structure.
        self._traced_calls = {}
        self._output_structures = {}
        self._pending_call = None  # the CallStructure of the call in progress (for _trace)
        # Note [ZeRO-1 optimizer] (optimizer.py): {id(shard): (shard, param, offset, length)}.
        self._shards = {}
        self._sharded_params = []  # every sharded parameter this rank holds (zero_grad)
        # Note [Tensor-parallel optimizer state] (optimizer.py): {id(param): (dim, parts,
        # degree, index, whole shape)} of the parameters this rank holds in slices.
        self._slices = {}
        self._grad_scaler = None  # autostage.GradScaler(self): train_step seeds with its scale
        if optimizer is not None:
            owner = weakref.ref(self)
            patch_optimizer(optimizer, self._all_params,
                            lambda: owner() is not None and owner().ready,
                            lambda: owner()._shards if owner() is not None else {},
                            lambda: owner()._slices if owner() is not None else {})
        install_abort_hook()

    @property
    def ready(self):
        return self._impl is not None and self._impl.ready

    def forward(self, *inputs, **kwargs):
        """Calls the model as ``model(*inputs, **kwargs)`` would be called and returns its
        output's structure (Note [Call structure] in structure.py)."""
        return self._call("forward", inputs, kwargs)

    def train_step(self, *inputs, **kwargs):
        """1F1B forward + backward + gradient averaging for a model whose forward returns the
        loss (alone or inside its output, e.g. ``{"loss": ..., "logits": ...}``); returns the
        output with the loss of the global batch."""
        return self._call("train_step", inputs, kwargs)

    def local_parameters(self):
        """This rank's parameters (those of its stage), after deployment."""
        return self._impl.parameters() if self._impl is not None else []

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """The whole model's state with the original module's keys, current on every rank
        (gathered from the stages that hold it; collective after deployment, so call it on every
        rank). A plain, unwrapped model loads it with ``load_state_dict``."""
        own = self.model.state_dict(keep_vars=True)
        gathered = dict(self._impl.state_dict()) if self.ready else {}
        # A tied tensor has several keys (fc2.weight is fc1.weight) but one name in the
        # gathered state: every key of that tensor takes the gathered value.
        by_tensor = {}
        for key, value in own.items():
            if key in gathered:
                by_tensor.setdefault(id(value), gathered[key])
        result = collections.OrderedDict() if destination is None else destination
        for key, value in own.items():
            current = gathered.get(key, by_tensor.get(id(value)))
            if current is None:
                current = value if keep_vars else value.detach()
            result[prefix + key] = current
        return result

    def load_state_dict(self, state_dict, strict=True):
        """Loads a state dict of the original model (e.g. from ``state_dict()`` or from a plain
        model), before or after deployment: the deployed stages share the model's tensors, so
        each rank's stages see the new values. Call it on every rank with the same dict. A dict
        that does not fit the model (key or shape) raises FormatError and changes nothing."""
        if self.ready and isinstance(state_dict, dict):  # Note [Tensor-parallel parameters]
            # A tied tensor's other keys (an LM head sharing the embedding's table) are sliced
            # as the key the deployment knows it by: the first with that tensor.
            first, canonical = {}, {}
            for key, value in self.model.state_dict(keep_vars=True).items():
                canonical[key] = first.setdefault(id(value), key)
            keys = [k for k, v in state_dict.items() if isinstance(v, torch.Tensor)]
            sliced = self._impl.slice_state([(canonical.get(k, k), state_dict[k]) for k in keys])
            sliced = {k: tensor for k, (_, tensor) in zip(keys, sliced)}
            state_dict = type(state_dict)((k, sliced.get(k, v)) for k, v in state_dict.items())
        return load_state_dict_checked(self.model, state_dict, strict=strict)

    def allreduce_grads(self):
        """Sums the gradients accumulated under ``autostage.delay_grad_allreduce(True)`` over
        their replicas (and tied stages) once. Collective: call on every rank."""
        self._require_ready("allreduce_grads")
        self._impl.allreduce_grads()

    def clip_grad_norm(self, max_norm):
        """Clips the gradients of the whole model by their global L2 norm, each parameter counted
        once over all stages and replicas, like ``torch.nn.utils.clip_grad_norm_`` on the plain
        model; returns the norm before clipping. Collective: call on every rank."""
        self._require_ready("clip_grad_norm")
        return self._impl.clip_grad_norm(float(max_norm))

    def save_deployment(self, path):
        """Writes the deployment this module runs to ``path`` (load it with
        ``load_deployment=path`` or the ``load_deployment``/``deployment_file`` options)."""
        self._require_ready("save_deployment")
        self._impl.save_deployment(str(path))

    def _call(self, method, inputs, kwargs):
        if len(inputs) == 1 and isinstance(inputs[0], tuple):
            inputs = inputs[0]
        mode = self.model.training
        call, problem = self._bind(inputs, kwargs)
        changed = call is not None and mode in self._traced_calls and \
            call.signature != self._traced_calls[mode]
        # Note [Bad input on one rank] (driver/module.h): a problem found here on any rank is
        # raised on every rank, so none is left waiting in the collective call below.
        # Note [Calls in different modes] (staging/call_inputs.cpp): every rank must call alike,
        # including the keywords and constants (Note [Call signature]).
        how = (f"{method}, {_MODE_NAMES[mode]} mode"
               + ("" if torch.is_grad_enabled() else ", no_grad")
               + (f", arguments {call.signature}" if call is not None and
                  (call.keywords or changed) else ""))
        if not problem[0] and changed and not option_enabled("allow_replan"):
            problem = ("Error", f"the call's arguments {call.signature} differ from those of "
                       f"the traced call {self._traced_calls[mode]} ({_MODE_NAMES[mode]} mode) "
                       "in keywords, structure or constants (non-tensor arguments are "
                       "constants of the trace); call the module as traced, or set "
                       "allow_replan=true to retrace and replan")
        # Note [One agreement per call] (driver/module.h): this exchange also checks the inputs;
        # the deployment below runs them with agreed=True.
        _autostage._agree_call("checking the call", *problem, how,
                               list(call.tensors) if call is not None else [])
        if changed:
            _autostage._log_info("Module", f"Call arguments changed from "
                                 f"{self._traced_calls[mode]} to {call.signature}: retracing "
                                 "and replanning (allow_replan=true)")
            self._undeploy()
        self._pending_call = call
        try:
            outputs = self._run(method, call.tensors)
        finally:
            self._pending_call = None
        self._keep_alive_for_backward(outputs)
        return self._output_structures[mode].rebuild(outputs)

    def _keep_alive_for_backward(self, outputs):
        """Note [Module lifetime during backward]
        The pipeline backward runs in the outputs' autograd node, and the staging executor it
        calls refers to the staging module's imported model, which lives only as long as this
        Module. A Module dropped before backward (``loss_fn(autostage.Module(m)(x)).backward()``)
        would leave the executor reading freed memory, so the node's metadata holds this Module
        until the graph is freed (after backward, or when the outputs go)."""
        for output in outputs:
            if output.grad_fn is not None:
                output.grad_fn.metadata["autostage.Module"] = self
                return

    def _run(self, method, inputs):
        """Runs the flat tensor inputs through the deployment of the model's mode (tracing,
        planning and deploying it first when needed); returns the flat outputs."""
        mode = self.model.training
        if self._impl is None:
            # The C++ side keeps the tracer: a weak reference avoids a cycle through it. A saved
            # deployment is for the first deployment this module makes.
            owner = weakref.ref(self)
            # Note [Per-module plan options] (driver/plan_sources.cpp): this module's zero.
            self._impl = _autostage._Module(lambda xs: owner()._trace(xs), self._load_deployment,
                                            {"zero": "0"} if self._zero_off else {})
            self._load_deployment = ""
            # Note [Placing the model] (driver/model_device.h): on the stages' device before the
            # first trace; a tensor on another device is refused on every rank.
            self._impl.place_tensors(list(self.model.named_parameters()) +
                                     list(self.model.named_buffers()))
        elif self._impl.ready and self._last_mode is not None and self._last_mode != mode:
            self._drop_stale_grads()
        # Note [Train and eval modes] (driver/module.h): the staging module switches to this
        # mode's import and deployments (sharing the current state first), tracing and planning
        # them on the mode's first call.
        self._impl.train(mode)
        self._impl.set_optimizer_state_bytes(self._optimizer_state_bytes())
        # Note [Dynamic loss scaling] (staging/loss_scaler.h): train_step's backward starts from
        # the scaler's current scale.
        self._impl.set_loss_scale(self._grad_scaler.get_scale()
                                  if self._grad_scaler is not None else 1.0)
        try:
            outputs = getattr(self._impl, method)(list(inputs), agreed=True)
        except _autostage.DryRunFinished:
            # partitioning_dry_run_np: the plan is saved; end the process as RaNNC does (MPI is
            # finalized at interpreter exit). Catch SystemExit to carry on instead.
            raise SystemExit(0)
        self._last_mode = mode
        self._follow_training()
        return outputs

    def _follow_training(self):
        """Note [Train and eval deployments]: after a call, moves the optimizer onto the
        parameters of the training deployment that ran, when it changed. Collective."""
        selection = (self._impl, self._impl.training_selection)
        if selection[1] == 0 or (self._selection is not None and
                                 self._selection[0] is selection[0] and
                                 self._selection[1] == selection[1]):
            return  # inference only so far, or the same training deployment
        state = None
        if self._selection is not None and self._optimizer is not None:
            state = self._optimizer.state_dict(from_global=True)  # under the old selection
        elif self._optimizer is not None and self._optimizer.state:
            # State loaded into the full optimizer before deployment: its layout is the global
            # one (the groups still hold every parameter).
            state = self._optimizer.state_dict()
        self._selection = selection
        self._keep_local_parameters()
        if state is not None:
            self._optimizer.load_state_dict(state, from_global=True)

    def _optimizer_state_bytes(self):
        """Bytes of the optimizer's state tensors, over the parameters it holds (this rank's once
        deployed), for the measured memory (Note [Measured memory]); -1 without an optimizer."""
        if self._optimizer is None:
            return -1
        total = 0
        for group in self._optimizer.param_groups:
            for p in group["params"]:
                for value in self._optimizer.state.get(p, {}).values():
                    if isinstance(value, torch.Tensor):
                        total += value.numel() * value.element_size()
        return total

    def _drop_stale_grads(self):
        """Note [Train and eval deployments]: on a mode switch, gradients live on the holders:
        drops the stale ones of parameters the optimizer does not hold, which the other mode's
        deployment may give this rank (a zero_grad() did not reach them)."""
        if self._selected is not None:
            for p in self.model.parameters():
                if p.data_ptr() not in self._selected:
                    p.grad = None

    def _undeploy(self):
        """Drops the deployments of both modes; the next call traces and plans again. The
        parameters, buffers and optimizer state carry over (Note [Train and eval deployments]).
        Collective when deployed: call on every rank."""
        state = None
        if self.ready:
            state = (self._optimizer.state_dict(from_global=True)
                     if self._optimizer is not None else None)
            self._impl.share_state()
        self._impl, self._last_mode, self._selection, self._selected = None, None, None, None
        self._traced_calls, self._output_structures = {}, {}
        self._shards, self._sharded_params = {}, []
        if self._optimizer is not None:
            for group, params in zip(self._optimizer.param_groups, self._all_params):
                group["params"] = list(params)
            if state is not None:
                self._optimizer.load_state_dict(state, from_global=True)

    def _trace(self, inputs):
        """The tracer the staging module calls (first call, or changed shapes under
        allow_replan): traces the model called as the call in progress was, and records that
        call's signature and output structure for this mode (Note [Call signature])."""
        call, mode = self._pending_call, self.model.training
        name = type(self.model).__name__
        # Note [Front ends] (export.py); a ScriptModule has no Python forward to export, and
        # under front_end=auto a model that calls TorchScript code is traced by TorchScript.
        use_export = front_end() == "export" and not isinstance(self.model, torch.jit.ScriptModule)
        scripted = scripted_code(self.model) if use_export and option_value("front_end") in (
            "", "auto") else None
        if scripted:
            _autostage._log_info("Module", f"{name} calls TorchScript code ({scripted}): "
                                 "front_end=auto captures it with TorchScript, which keeps the "
                                 "scripted control flow (torch.export would trace through it)")
            use_export = False
        if use_export:
            # Note [Calls through export's specs] (export.py)
            args, kwargs = call.rebuild(list(inputs))
            order = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
            if len(order) != len(inputs) or any(a is not b for a, b in zip(order, inputs)):
                raise _autostage.Error(f"internal: the call {call.signature} flattens its "
                                       "tensors in another order than torch.export's input spec")
            captured, output = export_call(self.model, args, kwargs, name,
                                           lambda line: _autostage._log_info("Module", line))
        else:
            wrapper = _CallWrapper.around(self.model, call)
            captured = _trace(wrapper, tuple(inputs), name)
            _check_shapes_static(captured, name)
            output = wrapper.output_structure
        last_capture.update(model=name, front_end="torch.export" if use_export else "TorchScript",
                             why="" if not scripted else "it calls TorchScript code")
        self._output_structures[mode] = output
        self._traced_calls[mode] = call.signature
        return captured

    def _bind(self, inputs, kwargs):
        """(CallStructure or None, ("ErrorClass", message) for what is wrong with this call on
        this rank, or ("", ""))."""
        try:
            call = CallStructure(self.model, inputs, kwargs)
        except CallProblem as e:
            return None, (e.error_class, str(e))
        if self._selection is None and self._optimizer is not None:
            return call, self._optimizer_problem()
        return call, ("", "")

    def _optimizer_problem(self):
        own = {id(p) for p in self.model.parameters()}
        for g, params in enumerate(self._all_params):
            foreign = [i for i, p in enumerate(params) if id(p) not in own]
            if foreign:
                return ("ConfigError",
                        f"the optimizer's param_groups[{g}] holds {len(foreign)} parameter(s) "
                        f"that are not in the wrapped model (positions {foreign[:5]}): pass an "
                        "optimizer built over model.parameters() of the model given to "
                        "autostage.Module")
        return ("", "")

    def _keep_local_parameters(self):
        local = {p.data_ptr() for p in self._impl.parameters()}
        named = dict(self.model.named_parameters())
        self._slices = {id(named[name]): (dim, parts, degree, index, tuple(whole))
                        for name, dim, parts, degree, index, whole in self._impl.held_slices()
                        if name in named}
        self._selected = local
        pieces = self._impl.zero_shards()
        sharded = self._impl.zero_stage
        if sharded is not None and self._optimizer is None:
            raise _autostage.ConfigError(
                f"stage {sharded} of this deployment runs ZeRO-1 (its optimizer state is split "
                "over its replicas), which needs the optimizer: pass it to "
                "autostage.Module(model, optimizer, ...), or set zero=0")
        if self._optimizer is None:
            return
        if sharded is not None:
            if zero_problem(self._optimizer):
                raise _autostage.UnsupportedError(zero_problem(self._optimizer))
            owner = weakref.ref(self)
            patch_zero_step(self._optimizer,
                            lambda: owner()._shards if owner() is not None else {},
                            lambda: owner() is not None and owner()._gather_params(),
                            lambda: owner()._sharded_params if owner() is not None else [])
        self._shards, by_param = make_shards(pieces)
        self._sharded_params = list({p.data_ptr(): p for p, _, _ in pieces}.values())
        sharded_ptrs = {p.data_ptr() for p, _, _ in pieces}
        for group, params in zip(self._optimizer.param_groups, self._all_params):
            kept = []
            for p in params:
                if p.data_ptr() in by_param:
                    kept += by_param.pop(p.data_ptr())  # a parameter listed twice: once
                elif p.data_ptr() in local and p.data_ptr() not in sharded_ptrs:
                    kept.append(p)
            group["params"] = kept
        # Keep only the state of what the optimizer now holds (_follow_training brings the
        # state of the whole model over, as the shards' under ZeRO-1).
        held = {id(p) for group in self._optimizer.param_groups for p in group["params"]}
        for p in [p for p in self._optimizer.state if id(p) not in held]:
            del self._optimizer.state[p]

    def _gather_params(self):
        """Note [ZeRO-1 optimizer]: after optimizer.step(), all-gathers the stepped pieces of
        the ZeRO-1 stages into every replica (collective; nothing to do without ZeRO-1)."""
        if self._selection is not None:
            self._selection[0].gather_params()

    def _require_ready(self, what):
        if not self.ready:
            raise _autostage.Error(
                f"{what}: the module is not deployed yet; call it once on a batch first")


def _choose_zero(model, optimizer):
    """Note [ZeRO-1 optimizer]: ZeRO-1 steps the optimizer this Module wraps. What stops it here
    (no optimizer, or one it cannot shard) goes to the one decision (Note [Choosing ZeRO-1 for a
    module], driver/plan_sources.h): True when this module plans with zero=0; UnsupportedError
    for zero=1 with such a problem."""
    problem = ("no optimizer was passed to autostage.Module; zero=1 shards the optimizer state "
               "over the replicas, so pass it: autostage.Module(model, optimizer, ...), or set "
               "zero=0" if optimizer is None else zero_problem(optimizer))
    trainable = any(p.requires_grad for p in model.parameters())
    return _autostage._plans_without_zero(trainable, problem)
