"""RaNNC's test_bn.py: BatchNorm with and without affine weights and running statistics.

BatchNorm's statistics are those of the rows one replica runs at once. DDP runs each rank's own
rows in one piece, so the plan that computes what DDP computes is one stage on every rank and one
micro-batch; any other plan splits the batch differently (as a different DDP rank count would)
and is not comparable."""
import pytest

import common
import models


@pytest.mark.parametrize("model_cls", [models.BufferModel1, models.BufferModel2,
                                       models.BufferModel3], ids=lambda m: m.__name__)
def test_buffer(init_dist, batch_size, iteration, workdir, model_cls):
    with common.options(decomposer="data_parallel", pipeline_num=1):
        common.run(model_cls, batch_size, iteration, workdir, check_unused_values=False)
