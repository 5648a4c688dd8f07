"""Run under mpirun on 2 or 4 ranks (see test_tensor_parallel.py; PyTorch 2.x with transformers)
with a model name (test_tensor_parallel.py runs every name of a rank count in one launch, through
mpi_phases.py): a transformers model captured with torch.export, trained with
tensor_parallel=<ranks> against the plain model on the same data: the loss of each of 2 SGD steps
and the gathered state_dict after them (rtol 1e-4), and that its attention and MLP weights are held
in slices. Models: `gpt2` (a fused QKV Conv1D, addmm, split three ways), `llama` (rotary embeddings,
4 heads over 2 K/V heads, a gated MLP), `llama_gqa` (Llama through sdpa with enable_gqa, K and V not
repeated, as transformers calls it where no mask is needed on CUDA; on 4 ranks its K and V are kept
whole: Note [Whole K/V heads], each member reading the one K/V head its Q heads use), `gemma`
(multi-query attention: 4 heads over one K/V head, kept whole), `gpt_neox` (a fused QKV laid out per
head: viewed into heads, then chunked), `gptj` (attention and MLP side by side on one norm, rotary
embeddings rotating every two features), `phi` (side by side, partial rotary embeddings), `qwen3`
(an RMSNorm of each head's Q and K features, its weight each member's share of the gradient summed
over the group), `phi3` (one projection of Q, K and V cut apart by slices, 4 heads over 2 K/V heads,
and a fused gated MLP, chunked: Note [Fused parts]; on 4 ranks its K and V parts are kept whole),
`gemma3` (its Q and K norms scale each head's features by 1 + w, computed in float32 outside the
attention: w's gradient is summed over the group), `mpt` (ALiBi: a constant bias of one slope per
head added to the scores, each member adding its heads'), `bart` (an encoder-decoder: the decoder's
cross-attention reads Q from its state, K and V from the encoder's output, whose gradient is
all-reduced over the group as the decoder state's is), `modernbert` (an encoder whose fused Wqkv is
viewed into (3, heads, features) and unbound into Q, K and V: the view cuts its rows into three
parts, Note [Fused parts]), `persimmon` (a fused projection laid out per head, each head's Q, K and
V taken off by index, Q and K normalised by a LayerNorm of each head's features whose weight and
bias are summed over the group, a squared-ReLU MLP), `nemotron` (a squared-ReLU MLP), `xglm`
(fairseq's layout: batch and heads merged into one dimension by `view(bsz * heads, -1, head_dim)`,
the scores floored by `max(s, finfo.min)`: Note [Heads merged with the batch]), `codegen` (a fused
projection laid out in 4 blocks of Q, V and K, each of a quarter of the heads, viewed into those
blocks), `gpt_bigcode` (multi-query attention from one projection of unequal parts,
split_with_sizes: the K/V head's rows whole on every member), `falcon_new` (Falcon-40B's and -180B's
layout: one projection viewed into K/V groups, each of its Q heads, K and V, K and V taken off by
index and broadcast to the group's Q heads; split by groups) or `falcon` (linear layers reading
`w.T`; its multi-query attention, one K/V head after a view into heads, stays replicated). Dropout
is off; vocabularies are small (no vocabulary split).
`gpt2-dropout`: GPT-2 with its dropouts on (0.1) through torch.export, the masks drawn from the
group's stream (Note [Tensor-parallel dropout]; tests/driver/tensor_parallel_test.cpp checks
them exactly), which plain PyTorch does not draw: each step's loss within 5% of plain PyTorch's,
whose dropouts draw masks of their own, and the first one not the loss without dropout."""
import os
import sys

import torch
import transformers

import autostage
from mpi_launch import finish

rank, world = autostage.get_rank(), autostage.get_world_size()
vocab = 512


def make(name):
    torch.manual_seed(7)
    if name.startswith("gpt2"):
        p = 0.1 if name == "gpt2-dropout" else 0.0
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=vocab,
                                         n_positions=32, resid_pdrop=p, embd_pdrop=p,
                                         attn_pdrop=p)
        return transformers.GPT2LMHeadModel(config), "transformer.h.0.attn.c_attn.weight", 1
    small = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=vocab)
    if name == "gemma3":
        config = transformers.Gemma3TextConfig(intermediate_size=128, num_key_value_heads=2,
                                               head_dim=16, max_position_embeddings=32, **small)
        return transformers.Gemma3ForCausalLM(config), "model.layers.0.self_attn.q_proj.weight", 0
    if name == "mpt":
        config = transformers.MptConfig(vocab_size=vocab, d_model=64, n_layers=2, n_heads=4,
                                        max_seq_len=32)
        return transformers.MptForCausalLM(config), "transformer.blocks.0.attn.Wqkv.weight", 0
    if name == "bart":
        config = transformers.BartConfig(
            vocab_size=vocab, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0)
        return (transformers.BartForConditionalGeneration(config),
                "model.decoder.layers.0.encoder_attn.k_proj.weight", 0)
    if name == "modernbert":  # an encoder: masked-language-model loss, no causal mask
        config = transformers.ModernBertConfig(
            intermediate_size=128, max_position_embeddings=32, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, cls_token_id=1, sep_token_id=2, attn_implementation="sdpa", **small)
        return transformers.ModernBertForMaskedLM(config), "model.layers.0.attn.Wqkv.weight", 0
    if name == "persimmon":
        config = transformers.PersimmonConfig(intermediate_size=128, max_position_embeddings=32,
                                              **small)
        return (transformers.PersimmonForCausalLM(config),
                "model.layers.0.self_attn.query_key_value.weight", 0)
    if name == "nemotron":
        config = transformers.NemotronConfig(intermediate_size=128, num_key_value_heads=2,
                                             max_position_embeddings=32, **small)
        return transformers.NemotronForCausalLM(config), "model.layers.0.mlp.up_proj.weight", 0
    if name == "codegen":
        config = transformers.CodeGenConfig(n_layer=2, n_embd=64, n_head=4, n_positions=32,
                                            rotary_dim=8, resid_pdrop=0.0, embd_pdrop=0.0,
                                            attn_pdrop=0.0, vocab_size=vocab)
        return transformers.CodeGenForCausalLM(config), "transformer.h.0.attn.qkv_proj.weight", 0
    if name == "xglm":
        config = transformers.XGLMConfig(vocab_size=vocab, d_model=64, num_layers=2,
                                         attention_heads=4, ffn_dim=128, max_position_embeddings=32,
                                         dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        return transformers.XGLMForCausalLM(config), "model.layers.0.self_attn.q_proj.weight", 0
    if name == "gpt_neox":
        config = transformers.GPTNeoXConfig(intermediate_size=128, max_position_embeddings=32,
                                            hidden_dropout=0.0, attention_dropout=0.0, **small)
        return (transformers.GPTNeoXForCausalLM(config),
                "gpt_neox.layers.0.attention.query_key_value.weight", 0)
    if name == "gptj":
        config = transformers.GPTJConfig(n_layer=2, n_embd=64, n_head=4, n_positions=32,
                                         rotary_dim=8, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, vocab_size=vocab)
        return transformers.GPTJForCausalLM(config), "transformer.h.0.attn.q_proj.weight", 0
    if name == "phi":
        config = transformers.PhiConfig(intermediate_size=128, max_position_embeddings=32,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                                        **small)
        return transformers.PhiForCausalLM(config), "model.layers.0.self_attn.q_proj.weight", 0
    if name == "qwen3":
        config = transformers.Qwen3Config(intermediate_size=128, num_key_value_heads=2,
                                          head_dim=16, max_position_embeddings=32, **small)
        return transformers.Qwen3ForCausalLM(config), "model.layers.0.self_attn.q_proj.weight", 0
    if name == "gemma":
        config = transformers.GemmaConfig(intermediate_size=128, num_key_value_heads=1,
                                          head_dim=16, max_position_embeddings=32, **small)
        return transformers.GemmaForCausalLM(config), "model.layers.0.self_attn.q_proj.weight", 0
    if name == "phi3":
        config = transformers.Phi3Config(intermediate_size=128, num_key_value_heads=2,
                                         max_position_embeddings=32, pad_token_id=0,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                                         **small)
        return transformers.Phi3ForCausalLM(config), "model.layers.0.self_attn.qkv_proj.weight", 0
    if name == "gpt_bigcode":
        config = transformers.GPTBigCodeConfig(n_layer=2, n_embd=64, n_head=4, n_positions=32,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                               vocab_size=vocab)
        return (transformers.GPTBigCodeForCausalLM(config),
                "transformer.h.0.attn.c_attn.weight", 0)
    if name == "falcon_new":
        config = transformers.FalconConfig(hidden_dropout=0.0, attention_dropout=0.0,
                                           new_decoder_architecture=True, num_kv_heads=2, **small)
        return (transformers.FalconForCausalLM(config),
                "transformer.h.0.self_attention.query_key_value.weight", 0)
    if name == "falcon":
        config = transformers.FalconConfig(hidden_dropout=0.0, attention_dropout=0.0, **small)
        return transformers.FalconForCausalLM(config), "transformer.h.0.mlp.dense_h_to_4h.weight", 0
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=vocab, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config), "model.layers.0.self_attn.q_proj.weight", 0


def check(name):
    """Trains model `name` tensor-parallel and plainly; returns its failures."""
    failures = []
    model, sliced, dim = make(name)
    reference, _, _ = make(name)
    reference.load_state_dict(model.state_dict())
    model.train()
    reference.train()
    ids = torch.randint(0, vocab, (2 * world, 8), generator=torch.Generator().manual_seed(3))
    local = ids[2 * rank:2 * (rank + 1)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    wrapped = autostage.Module(model, optimizer, tensor_parallel=world)
    dropout = name == "gpt2-dropout"
    rtol, atol = (5e-2, 0.0) if dropout else (1e-4, 1e-5)
    if dropout:
        reference.eval()
        with torch.no_grad():
            without_dropout = reference(input_ids=ids, labels=ids, use_cache=False).loss
        reference.train()
    for step in range(2):
        loss = wrapped(input_ids=local, labels=local, use_cache=False)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        want = reference(input_ids=ids, labels=ids, use_cache=False).loss
        want.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        if not torch.allclose(loss.detach(), want.detach(), rtol=rtol, atol=atol):
            failures.append(f"step {step}: loss {loss.item()} but plain PyTorch {want.item()}")
        if dropout and step == 0 and torch.allclose(loss.detach(), without_dropout, rtol=1e-4):
            failures.append(f"the loss {loss.item()} is the loss without dropout")
    state = wrapped.state_dict()
    for key, value in ([] if dropout else reference.state_dict().items()):
        got = state.get(key)
        if got is None or got.shape != value.shape or not torch.allclose(got, value, rtol=1e-4,
                                                                          atol=1e-5):
            failures.append(f"{key} after 2 steps differs from plain PyTorch")
    held = dict(model.named_parameters())[sliced].shape
    whole = dict(reference.named_parameters())[sliced].shape
    # Q's rows in slices; GPT-BigCode's K/V head (16 rows each for K and V) whole on every member;
    # Phi-3's 2 K/V heads in slices on 2 ranks, whole on 4 (16 + 16 rows each of K and V).
    kept = {"gpt_bigcode": 32, "phi3": 64 if world == 4 else 0}.get(name, 0)
    if held[dim] != (whole[dim] - kept) // world + kept:
        failures.append(f"{sliced} is held as {tuple(held)}, not in {world} slices of "
                        f"{tuple(whole)}" + (f" with {kept} rows whole" if kept else ""))
    print(f"rank {rank}: tensor_parallel {name} checked; {len(failures)} failures", flush=True)
    return [f"{name}: {failure}" for failure in failures]


name = sys.argv[1]
# Read by transformers at each attention call; unset after (mpi_phases.py runs more models in
# this process).
if name == "llama_gqa":
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
try:
    failures = check(name)
finally:
    os.environ.pop("TRANSFORMERS_SDPA_FORCE_GQA", None)
finish(rank, failures)
