"""autostage.Module: wrap a model, launch with mpirun, train with the single-process loop."""

import collections
import sys
import weakref

import torch

from . import _autostage
from .checkpoint import load_state_dict_checked
from .torchscript import _trace


def _option_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Module(torch.nn.Module):
    """Pipeline-parallel wrapper around an unmodified model.

    ``autostage.Module(model, optimizer=None, **options)``: options are config keys (see
    ``autostage.show_config()``), e.g. ``partition_num=2``. The first call traces the model with
    that call's inputs, profiles it, plans stages on rank 0 (or loads ``load_deployment``),
    broadcasts the plan and deploys it. Every rank passes its local batch and gets back the output
    rows of that batch; ``loss.backward()`` runs the pipeline backward and averages gradients over
    each stage's replicas, like DistributedDataParallel. After deployment the optimizer holds only
    this rank's parameters, so ``optimizer.step()`` is unchanged.
    """

    def __init__(self, model, optimizer=None, load_deployment=None, **options):
        super().__init__()
        for key, value in options.items():
            _autostage._set_option(key, _option_text(value))
        self.model = model
        self._optimizer = optimizer
        # The optimizer's full parameter lists, to re-select the local ones after a replan.
        self._all_params = ([list(g["params"]) for g in optimizer.param_groups]
                            if optimizer is not None else [])
        self._load_deployment = load_deployment or ""
        self._impl = None
        self._deployments = 0
        self._traced_training = None  # the model's mode when it was traced
        _install_abort_hook()

    @property
    def ready(self):
        return self._impl is not None and self._impl.ready

    def forward(self, *inputs, **kwargs):
        outputs = self._call("forward", inputs, kwargs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def train_step(self, *inputs, **kwargs):
        """1F1B forward + backward + gradient averaging for a model whose forward returns the
        loss; returns the loss of the global batch."""
        outputs = self._call("train_step", inputs, kwargs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def local_parameters(self):
        """This rank's parameters (those of its stage), after deployment."""
        return self._impl.parameters() if self._impl is not None else []

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """The whole model's state with the original module's keys, current on every rank
        (gathered from the stages that hold it; collective after deployment, so call it on every
        rank). A plain, unwrapped model loads it with ``load_state_dict``."""
        own = self.model.state_dict(keep_vars=keep_vars)
        gathered = dict(self._impl.state_dict()) if self.ready else {}
        result = collections.OrderedDict() if destination is None else destination
        for key, value in own.items():
            result[prefix + key] = gathered.get(key, value)
        return result

    def load_state_dict(self, state_dict, strict=True):
        """Loads a state dict of the original model (e.g. from ``state_dict()`` or from a plain
        model), before or after deployment: the deployed stages share the model's tensors, so
        each rank's stages see the new values. Call it on every rank with the same dict. A dict
        that does not fit the model (key or shape) raises FormatError and changes nothing."""
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
        self._require_ready("save_deployment")
        self._impl.save_deployment(str(path))

    def _call(self, method, inputs, kwargs):
        if len(inputs) == 1 and isinstance(inputs[0], tuple):
            inputs = inputs[0]
        if self._impl is None:
            # The C++ side keeps the tracer: a weak reference avoids a cycle through it.
            owner = weakref.ref(self)
            self._impl = _autostage._Module(lambda xs: owner()._trace(xs), self._load_deployment)
        # Note [Bad input on one rank] (staging/module.h): a problem found here on any rank is
        # raised on every rank, so none is left waiting in the collective call below.
        _autostage._agree("checking the call", *self._call_problem(inputs, kwargs))
        outputs = getattr(self._impl, method)(list(inputs))
        if self._impl.deployment_count != self._deployments:
            self._deployments = self._impl.deployment_count
            self._keep_local_parameters()
        return outputs

    def _trace(self, inputs):
        self._traced_training = self.model.training
        return _trace(self.model, tuple(inputs))

    def _call_problem(self, inputs, kwargs):
        """("ErrorClass", message) for what is wrong with this call on this rank, or ("", "")."""
        if kwargs:
            return ("UnsupportedError",
                    f"keyword arguments ({', '.join(sorted(kwargs))}) are not supported: "
                    "autostage passes model inputs positionally; call the module with "
                    "positional tensors in forward's order")
        for i, value in enumerate(inputs):
            if not isinstance(value, torch.Tensor):
                return ("UnsupportedError",
                        f"input {i} (of type {type(value).__name__}) is not a tensor: autostage "
                        "splits every input along dim 0 (the batch); pass tensors, and make other "
                        "values attributes of the model")
        if self._traced_training is not None and self.model.training != self._traced_training:
            traced, now = (("train", "eval") if self._traced_training else ("eval", "train"))
            return ("UnsupportedError",
                    f"the model was traced and planned in {traced} mode but is now in {now} mode "
                    "(dropout and BatchNorm behave differently), and a deployed module does not "
                    f"switch modes yet: switch back with .{traced}(), or for {now} copy the "
                    "state into the model on every rank (model.load_state_dict("
                    "wrapped.state_dict())) and wrap it in a new autostage.Module in "
                    f"{now} mode")
        if self._deployments == 0 and self._optimizer is not None:
            return self._optimizer_problem()
        return ("", "")

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
        if self._optimizer is None:
            return
        local = {p.data_ptr() for p in self._impl.parameters()}
        for group, params in zip(self._optimizer.param_groups, self._all_params):
            group["params"] = [p for p in params if p.data_ptr() in local]

    def _require_ready(self, what):
        if not self.ready:
            raise _autostage.Error(
                f"{what}: the module is not deployed yet; call it once on a batch first")


_hook_installed = False


def _install_abort_hook():
    """Note [Uncaught errors]: an exception that reaches the top level on one rank only (an error
    inside a stage, a lost peer) would leave the other ranks waiting, so the hook prints it and
    ends the whole job with MPI_Abort. Errors every rank raised alike (agreed bad-input errors,
    comm/agreement.h) let each rank exit normally instead."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(etype, value, tb):
        previous(etype, value, tb)
        if issubclass(etype, KeyboardInterrupt) or str(value) == _autostage._last_agreed_error():
            return
        if _autostage.get_world_size() > 1:
            sys.stderr.flush()
            _autostage._abort_job(f"uncaught {etype.__name__} on rank {_autostage.get_rank()}: "
                                  f"{value}")

    sys.excepthook = hook
