"""RaNNC's Apex tests (test_half_amp.py, test_half_loss_amp*.py, test_simple.py's use_amp=True)
prepare the model and optimizer with Apex's ``amp.initialize`` on a GPU. autostage does not run
Apex (its fp16 model copy and master weights): such an optimizer is refused by name, and
mixed precision is the option ``precision`` (docs/rannc-migration.md). These tests need a GPU and
Apex, and skip without them."""
import pytest
import torch

import models

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
def test_apex_prepared_optimizer_is_refused(init_dist):
    """By RaNNCModule(enable_apex_amp=True) and by the pyrannc.amp helpers."""
    amp = pytest.importorskip("apex.amp", reason="needs NVIDIA Apex")
    from autostage import _autostage
    from autostage import rannc as pyrannc
    model = models.SmallParamModel().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O2")
    with pytest.raises(_autostage.UnsupportedError, match="prepared by Apex"):
        pyrannc.RaNNCModule(model, opt, enable_apex_amp=True)
    with pytest.raises(_autostage.UnsupportedError, match="prepared by Apex"):
        pyrannc.amp.named_master_params(model, opt)
