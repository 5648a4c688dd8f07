"""The model zoo: models autostage's authors did not write, at sizes a 2-core CI trains in seconds.

Each Entry builds an unmodified library model (torchvision, torch.nn, torchaudio) or, for the
HF-style causal LM, a model written here the way transformers writes them (keyword arguments
in, a dict with `loss` and `logits` out). Everything runs in float64, so that summation order
(which differs between stages, micro-batches and one process) cannot hide or fake a mismatch:
issue 17 reports float32 drift for ill-conditioned models such as densenet121 at 4 stages
(BatchNorm over few values per channel at 1x1). Dropout is set to p=0 (a random mask cannot be compared; the
dropout ops stay in the graph), which the docs table says.

`plans` lists the plan shapes each model trains under: (ranks, partition_num, pipeline_num,
call), where call is "forward" (output = model(...), loss.backward(), gpipe), "train_step"
(Module.train_step, 1f1b: only for a model whose tensor outputs are all losses, which no zoo
model is: the LM returns its logits beside the loss) or "PlanError" (the shape cannot be
honoured: every rank must raise autostage.PlanError). Models with BatchNorm get one replica per stage (partition_num == ranks): the reference
normalises each micro-batch piece separately (Note [BatchNorm reference] in
tests/python/equivalence/reference.py), which needs one replica count for all stages.
"""
import dataclasses
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

BATCHNORM = nn.modules.batchnorm._BatchNorm


@dataclasses.dataclass
class Entry:
    name: str
    family: str
    build: Callable[[], nn.Module]
    # (global batch, step) -> (args, kwargs, target): the call is model(*args, **kwargs).
    batch: Callable
    # (output, target) -> scalar loss; None: the output holds the loss (`loss_key`).
    loss: Optional[Callable]
    plans: list
    loss_key: Optional[str] = None
    input_text: str = ""
    local_batch: int = 4
    note: str = ""
    options: dict = dataclasses.field(default_factory=dict)  # autostage.Module options
    # float64 unless the model cannot run in it (grouped_mm, Mixtral's experts: float32 at most)
    dtype: torch.dtype = torch.float64

    def model(self):
        torch.manual_seed(0)
        model = self.build().to(self.dtype).train()
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        return model

    @property
    def has_batchnorm(self):
        return any(isinstance(m, BATCHNORM) for m in self.model().modules())


def _generator(step):
    return torch.Generator().manual_seed(100 + step)


def images(size, classes):
    def batch(rows, step):
        g = _generator(step)
        x = torch.randn(rows, 3, size, size, generator=g, dtype=torch.float64)
        return (x,), {}, torch.randint(0, classes, (rows,), generator=g)
    return batch


def classification_loss(output, target):
    return F.cross_entropy(output, target)


def segmentation_batch(size, classes):
    def batch(rows, step):
        g = _generator(step)
        x = torch.randn(rows, 3, size, size, generator=g, dtype=torch.float64)
        return (x,), {}, torch.randint(0, classes, (rows, size, size), generator=g)
    return batch


def segmentation_loss(output, target):
    """torchvision's reference recipe: the main head plus half the auxiliary head."""
    loss = F.cross_entropy(output["out"], target)
    if "aux" in output:
        loss = loss + 0.5 * F.cross_entropy(output["aux"], target)
    return loss


def transformer_batch(rows, step):
    """src (B, 6, 16), tgt (B, 5, 16), key padding masks by keyword (True: padding)."""
    g = _generator(step)
    src = torch.randn(rows, 6, 16, generator=g, dtype=torch.float64)
    tgt = torch.randn(rows, 5, 16, generator=g, dtype=torch.float64)
    src_pad = torch.arange(6).expand(rows, 6) >= torch.randint(3, 7, (rows, 1), generator=g)
    tgt_pad = torch.arange(5).expand(rows, 5) >= torch.randint(2, 6, (rows, 1), generator=g)
    kwargs = {"src_key_padding_mask": src_pad, "tgt_key_padding_mask": tgt_pad,
              "memory_key_padding_mask": src_pad}
    return (src, tgt), kwargs, torch.randn(rows, 5, 16, generator=g, dtype=torch.float64)


def mse_loss(output, target):
    return F.mse_loss(output, target)


class CausalLMBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, hidden, causal_mask, padding_mask):
        h = self.ln_1(hidden)
        hidden = hidden + self.attn(h, h, h, attn_mask=causal_mask,
                                    key_padding_mask=padding_mask, need_weights=False)[0]
        return hidden + self.mlp(self.ln_2(hidden))


class TinyCausalLM(nn.Module):
    """A GPT-2-shaped language model called the way transformers' models are:
    ``model(input_ids, attention_mask=mask, labels=ids)`` returns
    ``{"loss": ..., "logits": ...}`` (``return_dict=False``: a tuple), the LM head tied to the
    token embedding."""

    def __init__(self, vocab=50, width=16, layers=3, heads=2, positions=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(positions, width)
        self.h = nn.ModuleList(CausalLMBlock(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=True,
                output_hidden_states=False):
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        hidden = self.wte(input_ids) + self.wpe(positions)
        causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).triu(1)
        padding = None if attention_mask is None else attention_mask == 0
        states = [hidden]
        for block in self.h:
            hidden = block(hidden, causal, padding)
            states.append(hidden)
        logits = self.lm_head(self.ln_f(hidden))
        loss = None
        if labels is not None:  # next-token loss, mean over every position (Note [Loss outputs])
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1))
        if not return_dict:
            return (loss, logits) if loss is not None else (logits,)
        out = {"loss": loss, "logits": logits}
        if output_hidden_states:
            out["hidden_states"] = tuple(states)
        return out


def lm_batch(rows, step):
    g = _generator(step)
    ids = torch.randint(0, 50, (rows, 8), generator=g)
    mask = torch.ones(rows, 8, dtype=torch.long)
    mask[:, 6:] = (torch.rand(rows, 2, generator=g) > 0.5).long()  # some right padding
    return (ids,), {"attention_mask": mask, "labels": ids}, None


def wav2vec2_tiny():
    from torchaudio.models import wav2vec2_model
    return wav2vec2_model(
        extractor_mode="group_norm", extractor_conv_layer_config=[(8, 10, 5), (8, 3, 2)],
        extractor_conv_bias=False, encoder_embed_dim=16, encoder_projection_dropout=0.0,
        encoder_pos_conv_kernel=8, encoder_pos_conv_groups=4, encoder_num_layers=2,
        encoder_num_heads=2, encoder_attention_dropout=0.0, encoder_ff_interm_features=32,
        encoder_ff_interm_dropout=0.0, encoder_dropout=0.0, encoder_layer_norm_first=False,
        encoder_layer_drop=0.0, aux_num_out=6)


def wav2vec2_batch(rows, step):
    """400 samples of waveform, `lengths` by keyword (the first sample full length)."""
    g = _generator(step)
    wave = torch.randn(rows, 400, generator=g, dtype=torch.float64)
    lengths = torch.randint(250, 401, (rows,), generator=g)
    lengths[0] = 400
    return (wave,), {"lengths": lengths}, None


def wav2vec2_loss(output, target):
    logits, lengths = output
    return logits.pow(2).mean() + 0.0 * lengths.sum()


def conformer_tiny():
    from torchaudio.models import Conformer
    return Conformer(input_dim=16, num_heads=2, ffn_dim=32, num_layers=2,
                     depthwise_conv_kernel_size=3, dropout=0.0)


def conformer_batch(rows, step):
    """(B, 10, 16) features and their lengths. Every other sample is full length, so each
    micro-batch piece has one: Conformer sizes its padding mask by max(lengths), a Python int
    the trace records as a constant (10)."""
    g = _generator(step)
    x = torch.randn(rows, 10, 16, generator=g, dtype=torch.float64)
    lengths = torch.randint(6, 11, (rows,), generator=g)
    lengths[::2] = 10
    return (x, lengths), {}, torch.randn(rows, 10, 16, generator=g, dtype=torch.float64)


def conformer_loss(output, target):
    return F.mse_loss(output[0], target)


def _torchvision(name, **kwargs):
    def build():
        import torchvision
        return getattr(torchvision.models, name)(weights=None, **kwargs)
    return build


def _segmentation(name, **kwargs):
    def build():
        from torchvision.models import segmentation
        return getattr(segmentation, name)(weights=None, weights_backbone=None, **kwargs)
    return build


# Models whose capture needs the TorchScript front end (front_end=auto is torch.export on 2.x).
TORCHSCRIPT = {"front_end": "torchscript"}
BN_PLANS = [(1, 1, 2, "forward"), (2, 2, 2, "forward"), (4, 4, 2, "forward")]  # 1 replica each
# Replicated stages (2 ranks for 1 stage, 4 ranks for 2 stages), then 4 stages.
REPLICA_PLANS = [(2, 1, 2, "forward"), (4, 2, 2, "forward"), (4, 4, 1, "forward")]
ZOO = [
    Entry("resnet18", "torchvision classification", _torchvision("resnet18", num_classes=10),
          images(32, 10), classification_loss, BN_PLANS, input_text="3x32x32"),
    Entry("densenet121", "torchvision classification",
          _torchvision("densenet121", num_classes=10), images(32, 10), classification_loss,
          [(4, 4, 2, "forward")], input_text="3x32x32",
          note="1x1 feature maps at the end; by hand in float32 this plan matched within "
               "rtol 1e-5 (max error 2.2e-7)"),
    Entry("mobilenet_v3_small", "torchvision classification",
          _torchvision("mobilenet_v3_small", num_classes=10), images(32, 10),
          classification_loss, [(2, 2, 2, "forward")], input_text="3x32x32"),
    Entry("squeezenet1_1", "torchvision classification",
          _torchvision("squeezenet1_1", num_classes=10), images(48, 10), classification_loss,
          [(2, 1, 2, "forward"), (4, 2, 2, "forward"), (4, 3, 1, "forward")],
          input_text="3x48x48"),
    Entry("lraspp_mobilenet_v3_large", "torchvision segmentation",
          _segmentation("lraspp_mobilenet_v3_large", num_classes=4),
          segmentation_batch(32, 4), segmentation_loss, [(2, 2, 2, "forward")],
          input_text="3x32x32"),
    Entry("deeplabv3_mobilenet_v3_large (aux)", "torchvision segmentation",
          _segmentation("deeplabv3_mobilenet_v3_large", num_classes=4, aux_loss=True),
          segmentation_batch(32, 4), segmentation_loss,
          [(1, 1, 2, "forward"), (4, 4, 1, "PlanError")], input_text="3x32x32",
          note="forward reads x.shape[-2:] first and uses it last: one cuttable block (traced "
               "with TorchScript on both legs; torch.export makes those sizes constants, and "
               "the model then trains at 4 stages: table below)", options=TORCHSCRIPT),
    Entry("nn.Transformer", "torch.nn", lambda: nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
        dropout=0.0, batch_first=True), transformer_batch, mse_loss, REPLICA_PLANS,
        input_text="src 6x16, tgt 5x16, 3 key padding masks by keyword"),
    Entry("TinyCausalLM (HF-style)", "HF-style causal LM (in tests)", TinyCausalLM, lm_batch,
          None, [(2, 1, 2, "forward"), (4, 2, 2, "forward"), (4, 3, 2, "forward")],
          loss_key="loss",
          input_text="8 tokens; attention_mask, labels by keyword"),
    Entry("wav2vec2 (tiny config)", "torchaudio", wav2vec2_tiny, wav2vec2_batch,
          wav2vec2_loss, REPLICA_PLANS, input_text="400 samples; lengths by keyword",
          note="TorchScript on both legs: torch.export refuses its LayerDrop branch on a random "
               "number (`if self.training and torch.rand(1) <= layer_drop`, data-dependent)",
          options=TORCHSCRIPT),
    Entry("Conformer", "torchaudio", conformer_tiny, conformer_batch, conformer_loss,
          [(2, 2, 2, "forward"), (4, 4, 1, "forward")], input_text="10x16 frames + lengths",
          note="TorchScript on both legs: torch.export refuses `max(lengths)` as a size "
               "(data-dependent), which the trace bakes in as a constant", options=TORCHSCRIPT),
]
# Issue 26: models captured with torch.export, on the leg that has it and transformers (2.x).
try:
    import transformers  # noqa: F401
    HAS_EXPORT_ZOO = hasattr(torch, "export") and hasattr(torch.export, "Dim")
except ImportError:
    HAS_EXPORT_ZOO = False
if HAS_EXPORT_ZOO:
    from catalog_transformers import ZOO as _EXPORT_ZOO
    ZOO += _EXPORT_ZOO
BY_NAME = {e.name: e for e in ZOO}


def configs(world):
    """(entry, partition_num, pipeline_num, call) for every plan of `world` ranks, in ZOO
    order."""
    return [(e, p, m, c) for e in ZOO for (r, p, m, c) in e.plans if r == world]


RANK_COUNTS = sorted({plan[0] for e in ZOO for plan in e.plans})
