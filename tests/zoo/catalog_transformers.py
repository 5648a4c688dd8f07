"""Models captured with torch.export for the zoo (issue 26), on the leg that has it and
transformers (the PyTorch 2.x leg pins it; scripts/requirements-torch2.txt): HuggingFace
transformers models, and one torchvision model whose plan shapes differ from its TorchScript
capture's.

Each model is built from a small config with random initialisation (no downloads), every dropout
probability 0, and called as a training loop calls it: ``model(input_ids, attention_mask=...,
labels=..., use_cache=False)``, the loss read from the returned ModelOutput. They are captured
by the torch.export front end (front_end=export; Note [Front ends] in autostage/export.py):
nothing in them is adapted to autostage.
"""
import torch

from catalog import (Entry, _generator, _segmentation, lm_batch, segmentation_batch,
                     segmentation_loss)

VOCAB = 50


def _causal_lm(config_class, model_class, **extra):
    def build():
        import transformers
        config = getattr(transformers, config_class)(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
            attention_dropout=0.0, **extra)
        return getattr(transformers, model_class)(config)
    return build


def llama_four_heads():
    """Llama with 4 heads and 4 K/V heads: its attention splits 2 and 4 ways."""
    import transformers
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
        attention_dropout=0.0))


def llama_grouped():
    """Llama with 4 heads over 2 K/V heads: at tensor_parallel=4 its K and V are computed whole
    on every rank (Note [Whole K/V heads] in decomposer/tensor_parallel_split.h)."""
    import transformers
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attention_dropout=0.0))


def gpt2():
    import transformers
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


def _masked_lm(config_class, model_class, **extra):
    def build():
        import transformers
        config = getattr(transformers, config_class)(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=32, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, **extra)
        return getattr(transformers, model_class)(config)
    return build


def t5():
    import transformers
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0))


def vit():
    import transformers
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_labels=10, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))


def causal_batch(rows, step):
    args, kwargs, target = lm_batch(rows, step)
    return args, dict(kwargs, use_cache=False), target


def masked_batch(rows, step):
    args, kwargs, target = lm_batch(rows, step)
    ids = args[0] % (VOCAB - 2) + 2  # ids 0 and 1 are padding for RoBERTa's positions
    return (ids,), dict(kwargs, labels=ids), target


def image_batch(rows, step):
    g = _generator(step)
    pixels = torch.randn(rows, 3, 16, 16, generator=g, dtype=torch.float64)
    return (pixels,), {"labels": torch.randint(0, 10, (rows,), generator=g)}, None


FAMILY = "HF transformers (torch.export)"
TEXT = "8 tokens; attention_mask, labels by keyword"
# Every model under 1, 2 and 4 stages, and with replicated stages (2 stages x 2 replicas).
PLANS = [(1, 1, 2, "forward"), (2, 2, 2, "forward"), (4, 4, 1, "forward"),
         (4, 2, 2, "forward")]
EXPORT = {"front_end": "export"}
# Tensor parallelism (issue 30): t = 2 alone, with 2 stages, with replicas; t = 4 alone. Every
# attention and MLP split (each rank holds its heads' and features' slices of the weights,
# compared with the same slices of plain PyTorch's); the vocabulary (50 ids) stays whole.
TP2_PLANS = [(2, 1, 2, "forward"), (4, 2, 2, "forward"), (4, 1, 2, "forward")]
TP4_PLANS = [(4, 1, 2, "forward")]
# Causal LMs' loss is float32: transformers computes it from logits.float().
NOTE = "loss in float32 (transformers' logits.float()): compared within rtol 1e-5"
ZOO = [
    Entry("GPT-2", FAMILY, gpt2, causal_batch, None, PLANS, loss_key="loss",
          input_text=TEXT + ", use_cache=False", options=EXPORT, note=NOTE),
    Entry("BERT (masked LM)", FAMILY, _masked_lm("BertConfig", "BertForMaskedLM"),
          masked_batch, None, PLANS, loss_key="loss",
          input_text=TEXT, options=EXPORT),
    Entry("RoBERTa (masked LM)", FAMILY,
          _masked_lm("RobertaConfig", "RobertaForMaskedLM", pad_token_id=1),
          masked_batch, None, PLANS, loss_key="loss",
          input_text=TEXT, options=EXPORT),
    Entry("Llama", FAMILY, _causal_lm("LlamaConfig", "LlamaForCausalLM"), causal_batch, None,
          PLANS, loss_key="loss", input_text=TEXT + ", use_cache=False", options=EXPORT,
          note=NOTE),
    Entry("Qwen2", FAMILY, _causal_lm("Qwen2Config", "Qwen2ForCausalLM"), causal_batch, None,
          PLANS, loss_key="loss",
          input_text=TEXT + ", use_cache=False", options=EXPORT, note=NOTE),
    Entry("T5 (encoder-decoder)", FAMILY, t5, causal_batch, None, PLANS, loss_key="loss",
          input_text=TEXT + "; decoder inputs from labels", options=EXPORT),
    Entry("Mixtral (mixture of experts)", FAMILY,
          _causal_lm("MixtralConfig", "MixtralForCausalLM", num_local_experts=6,
                     num_experts_per_tok=2),
          causal_batch, None, PLANS, loss_key="loss",
          input_text=TEXT + ", use_cache=False", options=EXPORT, dtype=torch.float32,
          note="float32 (its grouped_mm experts run no float64): compared within rtol 1e-5"),
    Entry("GPT-2, tensor_parallel=2", FAMILY, gpt2, causal_batch, None, TP2_PLANS,
          loss_key="loss", input_text=TEXT + ", use_cache=False",
          options=dict(EXPORT, tensor_parallel=2), note=NOTE),
    Entry("Llama (4 K/V heads), tensor_parallel=2", FAMILY, llama_four_heads, causal_batch, None,
          TP2_PLANS, loss_key="loss", input_text=TEXT + ", use_cache=False",
          options=dict(EXPORT, tensor_parallel=2), note=NOTE),
    Entry("Llama (4 K/V heads), tensor_parallel=4", FAMILY, llama_four_heads, causal_batch, None,
          TP4_PLANS, loss_key="loss", input_text=TEXT + ", use_cache=False",
          options=dict(EXPORT, tensor_parallel=4), note=NOTE),
    # Fewer K/V heads than the degree: K and V whole on every rank, their gradients summed.
    Entry("Qwen2 (1 K/V head of 2), tensor_parallel=2", FAMILY,
          _causal_lm("Qwen2Config", "Qwen2ForCausalLM"), causal_batch, None, TP2_PLANS,
          loss_key="loss", input_text=TEXT + ", use_cache=False",
          options=dict(EXPORT, tensor_parallel=2), note=NOTE),
    Entry("Llama (2 K/V heads of 4), tensor_parallel=4", FAMILY, llama_grouped, causal_batch,
          None, TP4_PLANS, loss_key="loss", input_text=TEXT + ", use_cache=False",
          options=dict(EXPORT, tensor_parallel=4), note=NOTE),
    Entry("ViT", FAMILY, vit, image_batch, None, PLANS,
          loss_key="loss", input_text="3x16x16, labels by keyword", options=EXPORT),
    Entry("deeplabv3_mobilenet_v3_large (aux), torch.export", "torchvision segmentation",
          _segmentation("deeplabv3_mobilenet_v3_large", num_classes=4, aux_loss=True),
          segmentation_batch(32, 4), segmentation_loss, [(4, 4, 1, "forward")],
          input_text="3x32x32", options=EXPORT,
          note="x.shape[-2:] is a constant of the export (only the batch is dynamic), so the "
               "size no longer crosses every cut: 4 stages, where TorchScript's trace allows 1"),
]
