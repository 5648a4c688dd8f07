"""fp16 with dynamic loss scaling, and bf16, against plain PyTorch under torch.autocast and
torch.amp.GradScaler on the same device and data (issue 14): on a GPU (skipped without one and a
CUDA build; scripts/test-gpu runs it), and on the CPU where the build's LibTorch runs fp16
autocast there (2.5 or later: Note [fp16 on the CPU]; the 2.x leg), the same calls as on a GPU.

One rank (partition_num=1, one micro-batch), so autostage runs the traced model under the same
autocast as the plain model: losses and parameters agree to fp16 rounding, and both scalers make
the same decisions (scale after every step exactly equal). With fp16, an inf in the batch at
step 2 makes both skip that step (bf16 has no loss scaling: no overflow step there)."""
import math

import pytest
import torch

import autostage
from autostage import _autostage

STEPS, OVERFLOW_STEP = 5, 2

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not _autostage._cpu_fp16_autocast(),
        reason="this build's LibTorch has no fp16 CPU autocast (before 2.5; the 2.x leg runs it)")),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a GPU and a CUDA build (scripts/test-gpu)")),
]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(23)
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                        torch.nn.Linear(64, 64), torch.nn.GELU(),
                                        torch.nn.Linear(64, 8))

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.body(x).float(), y)


def data(step, overflow, device):
    g = torch.Generator().manual_seed(700 + step)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    if overflow and step == OVERFLOW_STEP:
        x[3, 5] = math.inf
    return x.to(device), y.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_autocast_and_loss_scaling_equal_plain_pytorch(precision, device):
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    plain, mine = Net().to(device), Net().to(device)
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    opt = torch.optim.Adam(mine.parameters(), lr=1e-3)
    try:
        wrapped = autostage.Module(mine, opt, precision=precision, partition_num=1,
                                   pipeline_num=1, device=device)
        scale_on = precision == "fp16"
        plain_scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2,
                                            enabled=scale_on)
        scaler = autostage.GradScaler(wrapped, init_scale=2.0**10, growth_interval=2,
                                      enabled=scale_on)
        for step in range(STEPS):
            # The overflow step only with loss scaling: without a scaler to skip it, plain
            # PyTorch's parameters turn NaN as well (2026-11-28, bf16).
            x, y = data(step, overflow=scale_on, device=device)
            with torch.autocast(device, dtype=dtype):
                plain_loss = plain(x, y)
            plain_scaler.scale(plain_loss).backward()
            plain_scaler.step(plain_opt)
            plain_scaler.update()
            plain_opt.zero_grad()
            loss = wrapped.train_step(x, y)
            assert loss.device == x.device
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if not (scale_on and step == OVERFLOW_STEP):
                torch.testing.assert_close(loss.float(), plain_loss.float(), rtol=2e-2, atol=1e-3)
            assert scaler.get_scale() == plain_scaler.get_scale(), step
            for p, q in zip(mine.parameters(), plain.parameters()):
                assert p.dtype == torch.float32 and p.device.type == device
                torch.testing.assert_close(p, q, rtol=2e-2, atol=2e-3)
        if scale_on:  # 2^10, x2 after steps 0-1, /2 at the overflow, x2 after steps 3-4
            assert scaler.get_scale() == 2.0**11
            assert set(scaler.state_dict()) == set(plain_scaler.state_dict())
    finally:
        for key, value in (("precision", "fp32"), ("partition_num", "0"), ("pipeline_num", "0"),
                           ("device", "auto")):
            _autostage._set_option(key, value)
