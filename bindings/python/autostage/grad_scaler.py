"""Dynamic loss scaling for ``precision="fp16"``: ``autostage.GradScaler``.

The same calls as ``torch.cuda.amp.GradScaler`` (``scale``, ``unscale_``, ``step``, ``update``,
``get_scale``, ``state_dict``), with its defaults and rules, for a model wrapped in
``autostage.Module`` (Note [Dynamic loss scaling] in staging/loss_scaler.h)::

    scaler = autostage.GradScaler(model)          # model = autostage.Module(net, opt, precision="fp16")
    for x, y in data:
        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()             # or: loss = model.train_step(x, y) (scaled inside)
        scaler.step(opt)                          # skipped on every rank after an overflow
        scaler.update()
        opt.zero_grad()

A rank holds only its stages' gradients, so whether a step overflowed is decided for the whole
model: ``unscale_`` divides this rank's gradients by the scale and computes the global gradient
norm (one collective), and every rank reads the same verdict from it. So every rank must call
``unscale_`` / ``step`` / ``update`` at the same points. ``train_step`` seeds its backward with
the current scale (the losses it returns are not scaled); ``scale()`` multiplies what a forward
returned, for ``loss.backward()``.
"""

import math

import torch

from . import _autostage
from .module import Module


class GradScaler:
    """``GradScaler(module, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True)``: see the module's docstring."""

    def __init__(self, module, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if not isinstance(module, Module):
            raise TypeError("autostage.GradScaler(module, ...) takes the autostage.Module whose "
                            f"gradients it scales, not a {type(module).__name__}")
        self._module = module
        self._enabled = bool(enabled)
        self._state = _autostage._LossScaler(float(init_scale), float(growth_factor),
                                             float(backoff_factor), int(growth_interval))
        self._overflowed = {}  # id(optimizer) -> whether its step overflowed, since update()
        self._verdict = None   # whether this iteration's gradients overflowed, once unscaled
        module._grad_scaler = self if self._enabled else None

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        """The current scale (1.0 when disabled)."""
        return self._state.scale if self._enabled else 1.0

    def scale(self, outputs):
        """``outputs`` (a tensor, or lists, tuples and dicts of them) times the scale."""
        if not self._enabled:
            return outputs
        scale = self._state.scale

        def scaled(value):
            if isinstance(value, torch.Tensor):
                return value * scale
            if isinstance(value, (list, tuple)):
                return type(value)(scaled(v) for v in value)
            if isinstance(value, dict):
                return {k: scaled(v) for k, v in value.items()}
            raise TypeError("GradScaler.scale takes tensors (or lists, tuples and dicts of "
                            f"them), not {type(value).__name__}")

        return scaled(outputs)

    def unscale_(self, optimizer):
        """Divides this rank's gradients by the scale and decides, for all ranks at once,
        whether the step overflowed. Collective: call it on every rank (``step`` calls it when
        you did not, e.g. before gradient clipping). The module's gradients are unscaled once
        per iteration, by the first optimizer that asks; a second optimizer of the same module
        gets the same verdict."""
        if not self._enabled:
            return
        if id(optimizer) in self._overflowed:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update()")
        if not self._module.ready:
            raise _autostage.Error("GradScaler.unscale_: the module has not run a training step "
                                   "yet (call it after backward)")
        if self._verdict is None:
            norm = self._module._impl.unscale_grads(self._state.scale)
            self._verdict = not math.isfinite(norm)
        self._overflowed[id(optimizer)] = self._verdict

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step(*args, **kwargs)`` unless the gradients overflowed on any rank
        (then nothing, on every rank; returns None). Unscales first when ``unscale_`` was not
        called. Collective."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if id(optimizer) not in self._overflowed:
            self.unscale_(optimizer)
        if self._overflowed[id(optimizer)]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        """Backs off after an overflow, grows after ``growth_interval`` finite steps, or sets
        ``new_scale``. Call it once per iteration, after ``step``, on every rank."""
        if not self._enabled:
            return
        if new_scale is not None:
            value = new_scale.item() if isinstance(new_scale, torch.Tensor) else new_scale
            self._state.set_scale(float(value))
        else:
            if not self._overflowed:
                raise RuntimeError("GradScaler.update: no step was unscaled since the last "
                                   "update() (call scaler.step(optimizer) first)")
            self._state.update(not any(self._overflowed.values()))
        self._overflowed.clear()
        self._verdict = None

    def state_dict(self):
        """torch.cuda.amp.GradScaler's keys, so either loads the other's."""
        if not self._enabled:
            return {}
        return {"scale": self._state.scale, "growth_factor": self._state.growth_factor,
                "backoff_factor": self._state.backoff_factor,
                "growth_interval": self._state.growth_interval,
                "_growth_tracker": self._state.growth_tracker}

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("GradScaler.load_state_dict: the state dict is empty (it came "
                               "from a disabled scaler)")
        missing = [k for k in ("scale", "growth_factor", "backoff_factor", "growth_interval",
                               "_growth_tracker") if k not in state_dict]
        if missing:
            raise KeyError(f"GradScaler.load_state_dict: missing {', '.join(missing)}")
        state = _autostage._LossScaler(float(state_dict["scale"]),
                                       float(state_dict["growth_factor"]),
                                       float(state_dict["backoff_factor"]),
                                       int(state_dict["growth_interval"]))
        state.load(float(state_dict["scale"]), int(state_dict["_growth_tracker"]))
        self._state = state

    def __repr__(self):
        return f"autostage.GradScaler({self._state!r}, enabled={self._enabled})"
