"""RaNNC's test_simple_zero.py: ZeRO (``enable_zero=True``); the test gathers the sharded
gradients and parameters into the original tensors with ``_sync_orig_params`` before comparing."""
import pytest
import torch
import torch.distributed as dist

from autostage import rannc as pyrannc

import common
import models

CASES = models.ZERO_AND_NO_GATHER_CASES


@pytest.mark.parametrize("model_cls, args", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("decomposer", ["dp", "data_parallel"])
def test_zero(init_dist, batch_size, iteration, workdir, model_cls, args, decomposer):
    """With the planner's plan (which may give a small model's stage one rank: nothing to shard)
    and with every rank a replica of one stage (each parameter split over all ranks)."""
    with common.options(decomposer=decomposer):
        common.run(model_cls, batch_size, iteration, workdir, enable_zero=True, **args)


def test_zero_ranges_cover_each_parameter_once(init_dist, batch_size):
    """The optimizer's ``param_zero_range`` (RaNNC's name): {id(parameter): slice} of each
    flattened parameter this rank's optimizer steps. Over all ranks the slices cover every
    parameter exactly once (a stage's replicas split it; a stage of one rank owns it whole); with
    more than one rank, no rank owns all of the data-parallel plan's parameters."""
    model = models.BasicModel()
    opt = torch.optim.Adam(model.parameters(), lr=common.LR)
    with common.options(decomposer="data_parallel"):  # one stage, replicated on every rank
        _check_zero_ranges(batch_size, model, opt)


def _check_zero_ranges(batch_size, model, opt):
    try:
        rmodel = pyrannc.RaNNCModule(model, opt, enable_zero=True)
        rmodel(torch.randn((batch_size,) + models.BasicModel.INPUT_DIM)).sum().backward()
        checks = common.Checks()
        owned_total = 0
        for name in sorted(rmodel.name_to_param):
            param = rmodel.name_to_param[name]
            covered = torch.zeros(param.numel(), dtype=torch.int64)
            owned = opt.param_zero_range.get(id(param))
            if owned is not None:
                covered[owned] += 1
                owned_total += owned.stop - owned.start
            dist.all_reduce(covered)
            checks.equal(f"{name}: elements covered once", covered.tolist(), [1] * param.numel())
        total = sum(p.numel() for p in model.parameters())
        if pyrannc.get_world_size() > 1:
            checks.equal("this rank owns a share, not all", 0 < owned_total < total, True)
        checks.agree()
    finally:
        pyrannc.clear()
