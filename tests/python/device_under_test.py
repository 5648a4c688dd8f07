"""The device the tests' autostage jobs run on, for checks that compare with plain PyTorch.

scripts/test-gpu runs the suites with AUTOSTAGE_DEVICE=cuda: autostage.Module then moves the
model there (as model.cuda() would), its parameters, gradients, state_dict and outputs of CUDA
inputs are CUDA tensors, while a check's reference may be a CPU model. `host` copies a value to
the CPU for comparing; `allclose`/`equal` compare on the CPU; `device_of(model)` is where a
wrapped model's parameters now live, for running the plain reference on the same device (the
only place where bit-equality claims hold: a GPU runs other kernels than the CPU)."""
import torch


def host(value):
    """`value` detached on the CPU when it is a tensor; anything else unchanged."""
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def allclose(a, b, **tolerances):
    return torch.allclose(host(a), host(b), **tolerances)


def equal(a, b):
    return torch.equal(host(a), host(b))


def device_of(model):
    """The device of `model`'s first parameter or buffer (the CPU for one without any)."""
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return torch.device("cpu")
