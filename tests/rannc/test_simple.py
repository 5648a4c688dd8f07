"""RaNNC's test_simple.py: every model of the suite, gradients allreduced after backward or
delayed and allreduced by ``pyrannc.allreduce_grads`` (RaNNC's ``allreduce_amp_master_params``
runs; without Apex the master parameters are the parameters). RaNNC's use_amp=True cases need
Apex and a GPU: test_gpu_amp.py."""
import pytest

import common
import models

CASES = [
    (models.SmallParamModel, {}),
    (models.NestModel, {}),
    (models.SharedInputModel, {}),
    (models.ForkJoinModel, {}),
    (models.SharedParamModel, {}),
    (models.OneOpModel, {}),
    (models.TensorMulModel, {}),
    (models.LayerNormModel, {}),
    (models.EmbeddingModel, {"dataset": models.EmbeddingModel.dataset}),
    (models.FunctionModel, {"dataset": models.FunctionModel.dataset}),
    (models.LossOutModel, {"loss_out": True}),
    (models.BasicModel, {}),
]


@pytest.mark.parametrize("model_cls, args", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("allreduce_amp_master_params", [False, True],
                         ids=["allreduce", "delayed_allreduce"])
def test_match(init_dist, batch_size, iteration, workdir, model_cls, args,
               allreduce_amp_master_params):
    common.run(model_cls, batch_size, iteration, workdir,
               allreduce_amp_master_params=allreduce_amp_master_params, **args)


@pytest.mark.parametrize("model_cls", [models.SmallParamModel, models.BasicModel],
                         ids=lambda m: m.__name__)
def test_gradient_accumulation(init_dist, batch_size, iteration, workdir, model_cls):
    common.run(model_cls, batch_size, 2 * iteration, workdir, gradient_accumulation_steps=2)


def test_identity_is_refused_naming_why(init_dist, batch_size):
    """RaNNC's suite leaves IdentityModel out (its test is commented out): a model that computes
    nothing has nothing to partition. autostage refuses it on every rank, saying so."""
    import torch
    from autostage import _autostage
    from autostage import rannc as pyrannc
    rmodel = pyrannc.RaNNCModule(models.IdentityModel())
    try:
        with pytest.raises(_autostage.PlanError, match="no operation on its batch inputs.*"
                                                       "nothing to partition"):
            rmodel(torch.randn(batch_size, 10))
    finally:
        pyrannc.clear()


def test_amp_helpers_without_apex(init_dist, batch_size):
    """pyrannc.amp on a model Apex did not prepare: the master parameters are the parameters,
    and its allreduce divides the sum over the ranks by ``prescale`` (as RaNNC's does)."""
    import torch
    from autostage import rannc as pyrannc
    model = models.SmallParamModel().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    checks = common.Checks()
    checks.equal("named_master_params", pyrannc.amp.named_master_params(model, opt),
                 dict(model.named_parameters()))
    checks.equal("master_params", [id(p) for p in pyrannc.amp.master_params(opt)],
                 [id(p) for p in model.parameters()])
    rank, world = pyrannc.get_rank(), pyrannc.get_world_size()
    for p in model.parameters():
        p.grad = torch.full_like(p, float(rank + 1))
    pyrannc.amp.allreduce_grads(opt, prescale=world)
    mean = sum(range(1, world + 1)) / world
    for name, p in model.named_parameters():
        checks.close(f"averaged gradient of {name}", p.grad, torch.full_like(p, mean), 0, 0)
    checks.agree()
