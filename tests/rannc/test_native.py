"""RaNNC's test_native.py: a model calling a C++ operator of its own (compiled here with
torch.utils.cpp_extension, registered with TORCH_LIBRARY) from Python and from a scripted
function; forward only, as in RaNNC's (the operator has no derivative)."""
import common
import models


def test_native(init_dist, batch_size, iteration, workdir):
    models.load_native_ops()
    common.run(models.NativeCallModel, batch_size, iteration, workdir)
