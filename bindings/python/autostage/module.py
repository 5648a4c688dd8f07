"""autostage.Module: wrap a model, launch with mpirun, train with the single-process loop."""

import torch

from . import _autostage
from .torchscript import _as_tuple, _trace


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
        self._load_deployment = load_deployment or ""
        self._impl = None

    @property
    def ready(self):
        return self._impl is not None and self._impl.ready

    def forward(self, *inputs):
        outputs = self._call("forward", inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def train_step(self, *inputs):
        """1F1B forward + backward + gradient averaging for a model whose forward returns the
        loss; returns the loss of the global batch."""
        outputs = self._call("train_step", inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def local_parameters(self):
        """This rank's parameters (those of its stage), after deployment."""
        return self._impl.parameters() if self._impl is not None else []

    def save_deployment(self, path):
        self._require_ready("save_deployment")
        self._impl.save_deployment(str(path))

    def _call(self, method, inputs):
        inputs = _as_tuple(inputs[0] if len(inputs) == 1 and isinstance(inputs[0], tuple) else inputs)
        first = self._impl is None
        if first:
            script = _trace(self.model, inputs)
            self._impl = _autostage._Module(script, self._load_deployment)
        outputs = getattr(self._impl, method)(list(inputs))
        if first and self._optimizer is not None:
            self._keep_local_parameters(self._optimizer)
        return outputs

    def _keep_local_parameters(self, optimizer):
        local = {p.data_ptr() for p in self._impl.parameters()}
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if p.data_ptr() in local]

    def _require_ready(self, what):
        if not self.ready:
            raise _autostage.Error(
                f"{what}: the module is not deployed yet; call it once on a batch first")
