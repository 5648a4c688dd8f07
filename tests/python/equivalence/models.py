"""Models of the equivalence matrix (see driver.py).

Every entry of MODELS is a ModelSpec: `build()` returns a freshly seeded model (calling it twice
gives identical parameters), `batch(global_batch, step)` returns (inputs, target) of the global
batch for one step (target is None for a model returning its loss), `loss(out, target)` is the
mean-reduced loss the training loop applies to the model's output.

Choices that keep float32 comparisons meaningful under Adam (which maps any gradient whose true
value is zero but whose computed value is rounding noise to a full +-lr step): no bias in front of
a BatchNorm, and the attention's key projection has no bias (softmax ignores it, so its gradient
would be pure noise).
"""
import collections

import torch
import torch.nn.functional as F
from torch import nn

ModelSpec = collections.namedtuple("ModelSpec", "build batch loss has_batchnorm returns_loss")


def _gen(step, salt):
    return torch.Generator().manual_seed(1000 * salt + step)


def _seeded(builder):
    def build():
        torch.manual_seed(4321)
        return builder()
    return build


# ---- MLP ------------------------------------------------------------------------------------

def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def _mlp_batch(n, step):
    g = _gen(step, 1)
    return (torch.randn(n, 16, generator=g),), torch.randn(n, 4, generator=g)


# ---- CNN with BatchNorm ------------------------------------------------------------------------

def _cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _cnn_batch(n, step):
    g = _gen(step, 2)
    return (torch.randn(n, 3, 8, 8, generator=g),), torch.randn(n, 4, generator=g)


# ---- transformer encoder (dropout 0) -------------------------------------------------------------

WIDTH, SEQUENCE = 16, 6


class EncoderLayer(nn.Module):
    def __init__(self, width=WIDTH, heads=2, hidden=32):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.norm1 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        self.norm2 = nn.LayerNorm(width)

    # Shapes from `t.shape`: the traced aten::size ints must stay inside one stage
    # (decomposer Note [Non-tensor values are not cut]).
    def _split(self, t):
        b, s, w = t.shape
        return t.reshape(b, s, self.heads, w // self.heads).transpose(1, 2)

    def forward(self, x):
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1)
        attended = (scores @ v).transpose(1, 2).reshape(x.shape)
        x = self.norm1(x + self.proj(attended))
        return self.norm2(x + self.ff(x))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(EncoderLayer(), EncoderLayer(), EncoderLayer())
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.layers(x).mean(dim=1))


def _encoder_batch(n, step):
    g = _gen(step, 3)
    return (torch.randn(n, SEQUENCE, WIDTH, generator=g),), torch.randn(n, 4, generator=g)


# ---- resnet18 ----------------------------------------------------------------------------------
# In float64: its last BatchNorm layers normalise 2-4 values per channel (1x1 maps, pieces of 2-4
# samples), which makes float32 results depend on summation order alone. 1F1B sums the
# micro-batches' gradients in another order than gpipe and the single-process reference, and
# Adam turns those rounding differences (1e-7) into parameter differences above rtol 1e-5 (seen:
# 3e-2 in float32 at 2 ranks, 4 micro-batches; 6e-12 in float64).

def _resnet():
    import torchvision
    return torchvision.models.resnet18(num_classes=10).double()


def _resnet_batch(n, step):
    g = _gen(step, 4)
    x = torch.randn(n, 3, 32, 32, generator=g, dtype=torch.float64)
    return (x,), torch.randint(0, 10, (n,), generator=g)


# ---- tied parameters: the embedding weight is also the output projection -------------------------

class TiedLM(nn.Module):
    def __init__(self, vocab=40, width=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Sequential(nn.Linear(width, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                                  nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, width), nn.Tanh())

    def forward(self, tokens):
        return self.body(self.embed(tokens)) @ self.embed.weight.t()


def _tied_batch(n, step):
    g = _gen(step, 5)
    return (torch.randint(0, 40, (n, 5), generator=g),), torch.randint(0, 40, (n, 5), generator=g)


def _tied_loss(out, target):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


# ---- fork-join: `a` is read early and by the last layer ------------------------------------------

class ForkJoin(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(24, 24) for _ in range(7))
        self.entry = nn.Linear(12, 24)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        a = torch.tanh(self.entry(x))
        h = a
        for i, layer in enumerate(self.layers):
            h = torch.tanh(layer(h))
            if i == 2:
                h = h + a  # first join, early in the pipeline
        return self.head(h * a)  # second join, in the last stage


def _forkjoin_batch(n, step):
    g = _gen(step, 6)
    return (torch.randn(n, 12, generator=g),), torch.randn(n, 3, generator=g)


# ---- a model returning its loss --------------------------------------------------------------

class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _mlp()

    def forward(self, x, y):
        # F.mse_loss traces to broadcast_tensors -> Tensor[] -> ListUnpack: the list must stay
        # inside one stage (decomposer Note [Non-tensor values are not cut]).
        return F.mse_loss(self.net(x), y)


def _withloss_batch(n, step):
    (x,), y = _mlp_batch(n, step)
    return (x, y), None


# ---- a model calling a scripted function with a loop -----------------------------------------

@torch.jit.script
def residual_steps(x: torch.Tensor, weight: torch.Tensor, steps: int) -> torch.Tensor:
    for _ in range(steps):
        x = x + 0.5 * torch.tanh(x @ weight)
    return x


class ScriptedLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.entry = nn.Linear(10, 20)
        self.weight = nn.Parameter(torch.randn(20, 20) * 0.2)
        self.mid = nn.Linear(20, 20)
        self.head = nn.Linear(20, 2)

    def forward(self, x):
        h = residual_steps(torch.tanh(self.entry(x)), self.weight, 3)
        return self.head(torch.tanh(self.mid(h)))


def _loop_batch(n, step):
    g = _gen(step, 7)
    return (torch.randn(n, 10, generator=g),), torch.randn(n, 2, generator=g)


MODELS = {
    "mlp": ModelSpec(_seeded(_mlp), _mlp_batch, F.mse_loss, False, False),
    "cnn_bn": ModelSpec(_seeded(_cnn), _cnn_batch, F.mse_loss, True, False),
    "encoder": ModelSpec(_seeded(Encoder), _encoder_batch, F.mse_loss, False, False),
    "resnet18": ModelSpec(_seeded(_resnet), _resnet_batch, F.cross_entropy, True, False),
    "tied": ModelSpec(_seeded(TiedLM), _tied_batch, _tied_loss, False, False),
    "forkjoin": ModelSpec(_seeded(ForkJoin), _forkjoin_batch, F.mse_loss, False, False),
    "withloss": ModelSpec(_seeded(WithLoss), _withloss_batch, None, False, True),
    "scripted": ModelSpec(_seeded(ScriptedLoop), _loop_batch, F.mse_loss, False, False),
}


# ---- any model with its loss inside, for train_step ------------------------------------------

class ModelAndLoss(nn.Module):
    """`model` followed by the training loop's loss: forward(*inputs, target) returns the loss,
    so that train_step (which needs a model returning its loss) runs any model of the table."""

    def __init__(self, model, loss):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, *inputs_and_target):
        *inputs, target = inputs_and_target
        return self.loss(self.model(*inputs), target)


def with_loss(spec):
    """The ModelSpec of `spec`'s model with its loss inside (spec itself when it has one)."""
    if spec.returns_loss:
        return spec

    def batch(n, step):
        inputs, target = spec.batch(n, step)
        return tuple(inputs) + (target,), None

    return ModelSpec(lambda: ModelAndLoss(spec.build(), spec.loss), batch, None,
                     spec.has_batchnorm, True)
