"""The models of RaNNC's test suite (nict-wisdom/rannc, test/models.py), written anew for the CPU.

Each class names its per-sample input and target shapes (INPUT_DIM, OUTPUT_DIM) as RaNNC's do;
models that take token ids give their own dataset (``dataset``). What a model exercises is said
in its docstring.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def random_dataset(size, input_dim, output_dim):
    """RaNNC's default dataset: normal inputs and targets."""
    return torch.randn((size,) + tuple(input_dim)), torch.randn((size,) + tuple(output_dim))


class BasicModel(nn.Module):
    """The PyTorch tutorial's CNN: the flattened size is a product of traced sizes computed in a
    Python loop (``num_flat_features``), then used in ``view(-1, n)``."""
    INPUT_DIM = (1, 32, 32)
    OUTPUT_DIM = (10,)

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3)
        self.conv2 = nn.Conv2d(6, 16, 3)
        self.fc1 = nn.Linear(16 * 6 * 6, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), (2, 2))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.view(-1, self.num_flat_features(x))
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

    @staticmethod
    def num_flat_features(x):
        features = 1
        for size in x.size()[1:]:
            features *= size
        return features


class SmallParamModel(nn.Module):
    """Two bias-free linear layers and two scalings."""
    INPUT_DIM = (3,)
    OUTPUT_DIM = (3,)

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4, bias=False)
        self.fc2 = nn.Linear(4, 3, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x)) * 2 * 3


class NestModel(nn.Module):
    """A submodule's parameters under a nested name (submodel.fc1.weight)."""
    INPUT_DIM = (3,)
    OUTPUT_DIM = (3,)

    def __init__(self):
        super().__init__()
        self.submodel = SmallParamModel()
        self.fc = nn.Linear(3, 3, bias=False)

    def forward(self, x):
        return self.fc(self.submodel(x)) * 2 * 3


class LossOutModel(nn.Module):
    """Takes the target and returns the loss (a scalar output)."""
    INPUT_DIM = (3,)
    OUTPUT_DIM = (3,)

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 3, bias=False)
        self.fc2 = nn.Linear(3, 3, bias=False)

    def forward(self, x, y):
        return nn.MSELoss()(self.fc2(self.fc1(x)), y)


class SharedParamModel(nn.Module):
    """One weight used by two layers (tied parameters)."""
    INPUT_DIM = (3,)
    OUTPUT_DIM = (3,)

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 3, bias=False)
        self.fc2 = nn.Linear(3, 3, bias=False)
        self.fc2.weight = self.fc1.weight

    def forward(self, x):
        return self.fc2(self.fc1(x)) * 2 * 3


class _FourLinear(nn.Module):
    """Four bias-free 3x3 linear layers fc1..fc4, wired by the subclass's forward."""
    INPUT_DIM = (3,)
    OUTPUT_DIM = (3,)

    def __init__(self):
        super().__init__()
        for i in range(1, 5):
            setattr(self, f"fc{i}", nn.Linear(3, 3, bias=False))


class ForkJoinModel(_FourLinear):
    """Two branches from one value, joined by an addition."""

    def forward(self, x):
        x = self.fc1(x)
        return self.fc4(self.fc2(x) + self.fc3(x) * 2)


class SharedInputModel(_FourLinear):
    """One value read by three layers and the output sum."""

    def forward(self, x):
        y = self.fc1(x)
        return y + self.fc2(y) + self.fc3(y) + self.fc4(y)


class BertLayerNorm(nn.Module):
    """BERT's hand-written layer norm, converting to its weights' dtype and back."""

    def __init__(self, hidden, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(self.weight.dtype)
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        x = self.weight * ((x - mean) / torch.sqrt(var + self.eps)) + self.bias
        return x.to(dtype)


class LayerNormModel(nn.Module):
    """A layer norm between two linear layers."""
    INPUT_DIM = (3,)
    OUTPUT_DIM = (3,)

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 2, bias=False)
        self.norm = BertLayerNorm(2)
        self.fc2 = nn.Linear(2, 3, bias=False)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)))


class _BatchNormModel(nn.Module):
    """A linear layer and a BatchNorm1d (RaNNC's BufferModel1-3 differ in the norm's flags)."""
    INPUT_DIM = (10,)
    OUTPUT_DIM = (10,)
    AFFINE = TRACK = False

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 10)
        self.bn = nn.BatchNorm1d(10, affine=self.AFFINE, track_running_stats=self.TRACK)

    def forward(self, x):
        return self.bn(self.fc(x))


class BufferModel1(_BatchNormModel):
    """Affine BatchNorm without running statistics."""
    AFFINE, TRACK = True, False


class BufferModel2(_BatchNormModel):
    """BatchNorm with running statistics (buffers updated by every forward)."""
    AFFINE, TRACK = False, True


class BufferModel3(_BatchNormModel):
    """BatchNorm with neither weights nor running statistics."""
    AFFINE, TRACK = False, False


class IdentityModel(nn.Module):
    """Returns its input: no operation, no parameter."""
    INPUT_DIM = (10,)
    OUTPUT_DIM = (10,)

    def forward(self, x):
        return x


class OneOpModel(nn.Module):
    """One operation and no parameter."""
    INPUT_DIM = (10,)
    OUTPUT_DIM = (10,)

    def forward(self, x):
        return x * 2


class TensorMulModel(nn.Module):
    """Multiplies by a tensor attribute that is neither a parameter nor a buffer (a constant of
    the captured graph; an integer tensor, so the product is promoted)."""
    INPUT_DIM = (10,)
    OUTPUT_DIM = (10,)

    def __init__(self):
        super().__init__()
        self._two = torch.tensor([2])

    def forward(self, x):
        return torch.mul(x, self._two)


class _TokenModel(nn.Module):
    """Token ids in, an embedding out."""
    SEQ_LEN, VOCAB_SIZE, EMB_SIZE = 16, 10, 8
    INPUT_DIM = OUTPUT_DIM = ()

    @classmethod
    def dataset(cls, size, input_dim, output_dim):
        return (torch.randint(cls.VOCAB_SIZE, (size, cls.SEQ_LEN)),
                torch.randn(size, cls.SEQ_LEN, cls.EMB_SIZE))

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(self.VOCAB_SIZE, self.EMB_SIZE)


class EmbeddingModel(_TokenModel):
    """An embedding lookup."""

    def forward(self, x):
        return self.emb(x)


@torch.jit.script
def zero_even_tokens(x):
    """A scripted function whose loops return nothing: they write into ``x`` in place."""
    for row in x:
        for i in range(0, row.numel()):
            if row[i] % 2 == 0:
                row[i] = 0
    return x


class FunctionModel(_TokenModel):
    """A scripted function with output-less loops before the embedding."""

    def forward(self, x):
        return self.emb(zero_even_tokens(x))


_NATIVE_SOURCE = r"""
#include <torch/script.h>

// The derivative of the sigmoid at z, registered as an operator of its own.
torch::Tensor sigmoid_derivative(torch::Tensor z) {
  auto s = torch::sigmoid(z);
  return (1 - s) * s;
}

TORCH_LIBRARY(autostage_test_ops, m) { m.def("sigmoid_derivative", sigmoid_derivative); }
"""


def load_native_ops():
    """Loads the C++ operator NativeCallModel calls, compiling it first where this build has
    not (under TORCH_EXTENSIONS_DIR, which run_suite.py sets per build and fills once before the
    ranks start), then scripts the function that calls it (the operator must exist before
    TorchScript compiles a call to it)."""
    global _native_scripted
    import hashlib
    import os
    import torch.utils.cpp_extension
    name = "autostage_test_ops_" + hashlib.sha1(_NATIVE_SOURCE.encode()).hexdigest()[:10]
    built = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", ""), name, name + ".so")
    if os.path.exists(built):
        torch.ops.load_library(built)
    else:
        torch.utils.cpp_extension.load_inline(name=name, cpp_sources=_NATIVE_SOURCE,
                                              is_python_module=False, verbose=False)

    @torch.jit.script
    def native_scripted(z):
        return torch.ops.autostage_test_ops.sigmoid_derivative(z)

    _native_scripted = native_scripted


_native_scripted = None  # set by load_native_ops


def _native_traced(z):
    return torch.ops.autostage_test_ops.sigmoid_derivative(z)


class NativeCallModel(nn.Module):
    """RaNNC's test_native.py model: a C++ operator (TORCH_LIBRARY) called from Python and from a
    scripted function. Call load_native_ops() first."""
    INPUT_DIM = (10,)
    OUTPUT_DIM = (10,)

    def forward(self, x):
        return _native_traced(x) * _native_scripted(x)


# The models RaNNC's test_simple_zero.py and test_simple_no_gather.py run, with their arguments
# to common.run.
ZERO_AND_NO_GATHER_CASES = [
    (BasicModel, {}),
    (SmallParamModel, {}),
    (ForkJoinModel, {}),
    (SharedParamModel, {}),
    (OneOpModel, {}),
    (TensorMulModel, {}),
    (EmbeddingModel, {"dataset": EmbeddingModel.dataset}),
    (FunctionModel, {"dataset": FunctionModel.dataset}),
    (LossOutModel, {"loss_out": True}),
]

