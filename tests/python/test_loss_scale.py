"""fp16 dynamic loss scaling (issue 14): autostage.GradScaler equals plain PyTorch with
GradScaler's rules on 2 and 4 ranks, skips an overflowed step on every rank
(loss_scale_check.py), and refuses misuse with clear errors."""
import re
import shutil

import pytest
import torch

import autostage
from mpi_launch import run_driver
from device_under_test import device_of

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


@needs_mpirun
@pytest.mark.parametrize("ranks,phase,zero", [(2, "train_step", 0), (2, "backward", 0),
                                              (4, "train_step", 1), (4, "backward", 0)])
def test_grad_scaler_equals_plain_pytorch(ranks, phase, zero):
    log = run_driver("loss_scale_check.py", phase, zero, ranks=ranks)
    for rank in range(ranks):
        # 2^10, doubled after steps 0-1, halved at the overflow (step 2), doubled after 3-4.
        assert re.search(rf"rank {rank}: loss scale {phase} checked \(final scale 2048\); "
                         r"0 failures", log), log


def test_grad_scaler_refuses_misuse():
    model = autostage.Module(torch.nn.Linear(3, 2))
    with pytest.raises(TypeError, match="takes the autostage.Module"):
        autostage.GradScaler(torch.nn.Linear(3, 2))
    with pytest.raises(autostage.ConfigError, match="growth_factor must be > 1"):
        autostage.GradScaler(model, growth_factor=1.0)
    with pytest.raises(autostage.ConfigError, match="init_scale must be a positive finite"):
        autostage.GradScaler(model, init_scale=float("inf"))
    scaler = autostage.GradScaler(model, init_scale=8.0)
    with pytest.raises(RuntimeError, match="no step was unscaled since the last update"):
        scaler.update()
    with pytest.raises(autostage.Error, match="has not run a training step yet"):
        scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="takes tensors"):
        scaler.scale("loss")
    scaled = scaler.scale({"loss": torch.tensor(2.0), "parts": [torch.tensor(1.0)]})
    assert scaled["loss"].item() == 16.0 and scaled["parts"][0].item() == 8.0
    scaler.update(new_scale=4.0)
    assert scaler.get_scale() == 4.0
    with pytest.raises(KeyError, match="missing _growth_tracker"):
        scaler.load_state_dict({"scale": 2.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                "growth_interval": 10})
    off = autostage.GradScaler(model, enabled=False)
    assert off.get_scale() == 1.0 and off.state_dict() == {} and not off.is_enabled()
    assert off.scale(torch.tensor(3.0)).item() == 3.0


def test_two_optimizers_unscale_once_and_share_the_verdict():
    torch.manual_seed(5)
    net = torch.nn.Linear(3, 2)
    ref = torch.nn.Linear(3, 2)
    ref.load_state_dict(net.state_dict())
    model = autostage.Module(net)
    ref.to(device_of(net))  # autostage moved net to its device (AUTOSTAGE_DEVICE)
    x = torch.randn(4, 3, device=device_of(net))
    scaler = autostage.GradScaler(model, init_scale=8.0)
    scaler.scale(model(x).sum()).backward()
    ref(x).sum().backward()
    assert torch.allclose(net.weight.grad, 8.0 * ref.weight.grad)
    opt_a = torch.optim.SGD([net.weight], lr=0.1)
    opt_b = torch.optim.SGD([net.bias], lr=0.1)
    scaler.unscale_(opt_a)
    scaler.unscale_(opt_b)  # the gradients are divided once, not twice
    assert torch.allclose(net.weight.grad, ref.weight.grad)
    assert torch.allclose(net.bias.grad, ref.bias.grad)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt_a)
    before = net.weight.detach().clone()
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
    assert torch.allclose(net.weight, before - 0.1 * ref.weight.grad)
    assert scaler.get_scale() == 8.0  # one finite step of the default 2000
