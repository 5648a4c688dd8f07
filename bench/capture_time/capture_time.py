"""Capture + import time of a 24-layer BERT per front end (prints, never fails; issue 26).

    .venv-torch2/bin/python bench/capture_time/capture_time.py      # torch.export and TorchScript
    /usr/bin/python3 bench/capture_time/capture_time.py             # TorchScript (LibTorch 1.13)

The model: transformers' BertForMaskedLM (24 layers, hidden 1024, 16 heads: BERT-large) where
transformers is installed (the 2.x leg), else (or with --model nn) a BERT-large-shaped stack of
torch.nn.TransformerEncoderLayer with the same widths, so both platforms capture a model of the
same size. Each front end captures it `--repeats` times in one process, alternating, after one
untimed capture (the first torch.export in a process also imports its machinery: reported
apart); figures are medians of wall-clock seconds, capture and import together.
"""
import argparse
import statistics
import time

import torch

import autostage  # build/python or build-torch2/python, via the .pth scripts/test installs
from autostage.export import available, export_to_ir
from autostage.torchscript import _trace


class NnBert(torch.nn.Module):
    """BERT-large's shapes from torch.nn: embeddings, 24 post-norm encoder layers, an LM head."""

    def __init__(self, layers, hidden, heads, vocab=30522, positions=512):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Embedding(positions, hidden)
        layer = torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0,
                                                 activation="gelu", batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        return self.head(self.encoder(self.tokens(input_ids) + self.positions(positions)))


def build(args):
    try:
        if args.model == "nn":
            raise ImportError
        import transformers
    except ImportError:
        return "torch.nn BERT-large-shaped encoder", NnBert(args.layers, args.hidden, args.heads)
    config = transformers.BertConfig(num_hidden_layers=args.layers, hidden_size=args.hidden,
                                     num_attention_heads=args.heads,
                                     intermediate_size=4 * args.hidden)
    return f"transformers {transformers.__version__} BertForMaskedLM", \
        Logits(transformers.BertForMaskedLM(config))


class Logits(torch.nn.Module):
    """The model's logits alone (torch.jit.trace takes no ModelOutput)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", choices=["auto", "nn"], default="auto",
                   help="nn: the torch.nn model even where transformers is installed (the model "
                        "1.13 captures)")
    args = p.parse_args()
    torch.manual_seed(0)
    name, model = build(args)
    model.train()
    ids = torch.randint(0, 30000, (args.batch, args.seq))
    front_ends = {"torchscript": lambda: autostage._autostage._import_module(
        _trace(model, (ids,)), [ids])}
    if available():
        front_ends["torch.export"] = lambda: export_to_ir(model, (ids,))
    print(f"model: {name}, {args.layers} layers, hidden {args.hidden}; torch {torch.__version__}; "
          f"batch {args.batch} x {args.seq} tokens; {torch.get_num_threads()} threads")
    times = {key: [] for key in front_ends}
    for key, capture in front_ends.items():  # untimed first capture of each
        start = time.perf_counter()
        ir = capture()
        print(f"  first {key} capture: {time.perf_counter() - start:.2f} s ({ir.node_count} IR "
              "nodes)", flush=True)
    for _ in range(args.repeats):
        for key, capture in front_ends.items():
            start = time.perf_counter()
            capture()
            times[key].append(time.perf_counter() - start)
    for key, values in times.items():
        print(f"{key:>14}: median {statistics.median(values):.2f} s over {len(values)} captures "
              f"(min {min(values):.2f} s)")
    if len(times) == 2:
        ratio = statistics.median(times["torch.export"]) / statistics.median(times["torchscript"])
        print(f"torch.export / torchscript: {ratio:.2f}x")


if __name__ == "__main__":
    main()
