"""RaNNC's test_simple_no_gather.py: ``gather_inputs=False``, the batch rank 0 passes is the
batch; the reference is the traced model without DDP on the same batch."""
import pytest

import common
import models

CASES = [
    (models.BasicModel, {}),
    (models.SmallParamModel, {}),
    (models.ForkJoinModel, {}),
    (models.SharedParamModel, {}),
    (models.OneOpModel, {}),
    (models.TensorMulModel, {}),
    (models.EmbeddingModel, {"dataset": models.EmbeddingModel.dataset}),
    (models.FunctionModel, {"dataset": models.FunctionModel.dataset}),
    (models.LossOutModel, {"loss_out": True}),
]


@pytest.mark.parametrize("model_cls, args", CASES, ids=[c[0].__name__ for c in CASES])
def test_no_gather(init_dist, batch_size, iteration, workdir, model_cls, args):
    common.run(model_cls, batch_size, iteration, workdir, gather_inputs=False, **args)
