"""RaNNC's test_simple_bfloat16.py: the wrapped model's parameters and inputs in bfloat16, compared
with the float32 reference at RaNNC's relative tolerance (0.1) plus an absolute 0.05 for values
near zero (bfloat16 keeps 8 bits of mantissa: an output of ~5 summed from a few products is off
by up to ~0.02 whatever its size; RaNNC ran it on GPUs that accumulate bfloat16 products in
float32)."""
import torch

import common
import models


def test_small_param(init_dist, batch_size, iteration, workdir):
    common.run(models.SmallParamModel, batch_size, iteration, workdir, dtype=torch.bfloat16,
               rtol=0.1, atol=5e-2)
