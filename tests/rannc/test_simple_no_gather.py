"""RaNNC's test_simple_no_gather.py: ``gather_inputs=False``, the batch rank 0 passes is the
batch; the reference is the traced model without DDP on the same batch."""
import pytest

import common
import models

CASES = models.ZERO_AND_NO_GATHER_CASES


@pytest.mark.parametrize("model_cls, args", CASES, ids=[c[0].__name__ for c in CASES])
def test_no_gather(init_dist, batch_size, iteration, workdir, model_cls, args):
    common.run(model_cls, batch_size, iteration, workdir, gather_inputs=False, **args)
