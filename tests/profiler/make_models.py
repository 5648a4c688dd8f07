"""Traces the models the profiler tests and benchmarks use and saves them as TorchScript.

usage: make_models.py OUT_DIR NAME...   (names: transformer, resnet18, bert24, resnet50)
Writes OUT_DIR/NAME.pt and OUT_DIR/NAME.input.pt (the example input, saved with torch.save of a
TorchScript container module so C++ can read it with torch::jit::load).
"""
import os
import sys

import torch
import torchvision


class Inputs(torch.nn.Module):
    def __init__(self, x):
        super().__init__()
        self.register_buffer("x", x)


def transformer(layers, hidden, heads, batch, seq):
    layer = torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return model, torch.randn(batch, seq, hidden)


def build(name):
    torch.manual_seed(0)
    if name == "transformer":
        return transformer(4, 256, 4, 8, 32)
    if name == "bert24":
        return transformer(24, 256, 4, 8, 128)
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=100), torch.randn(8, 3, 112, 112)
    if name == "resnet50":
        return torchvision.models.resnet50(num_classes=100), torch.randn(8, 3, 128, 128)
    raise SystemExit("unknown model " + name)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    for name in sys.argv[2:]:
        model, x = build(name)
        model.train()
        traced = torch.jit.trace(model, (x,), check_trace=False)
        traced.save(os.path.join(out, name + ".pt"))
        torch.jit.script(Inputs(x)).save(os.path.join(out, name + ".input.pt"))


if __name__ == "__main__":
    main()
