// Synthetic transformer, ResNet and MLP graphs; see synthetic.h.
#include "decomposer/synthetic.h"

#include <map>
#include <sstream>

#include "core/error.h"
#include "decomposer/synthetic_builder.h"

namespace autostage::decomposer {
namespace {

using detail::SyntheticBuilder;
using core::ValueId;

struct LayerParams {
  ValueId ln1w, ln1b, wq, bq, wk, bk, wv, bv, wo, bo, ln2w, ln2b, w1, b1, w2, b2;
};

// `kv`: the K and V projections' output features (h unless grouped).
LayerParams layerParams(SyntheticBuilder& b, const std::string& p, int64_t h, int64_t kv) {
  return {b.param(p + "ln1.weight", {h}),
          b.param(p + "ln1.bias", {h}),
          b.param(p + "attn.q.weight", {h, h}),
          b.param(p + "attn.q.bias", {h}),
          b.param(p + "attn.k.weight", {kv, h}),
          b.param(p + "attn.k.bias", {kv}),
          b.param(p + "attn.v.weight", {kv, h}),
          b.param(p + "attn.v.bias", {kv}),
          b.param(p + "attn.out.weight", {h, h}),
          b.param(p + "attn.out.bias", {h}),
          b.param(p + "ln2.weight", {h}),
          b.param(p + "ln2.bias", {h}),
          b.param(p + "mlp.fc1.weight", {4 * h, h}),
          b.param(p + "mlp.fc1.bias", {4 * h}),
          b.param(p + "mlp.fc2.weight", {h, 4 * h}),
          b.param(p + "mlp.fc2.bias", {h})};
}

int64_t kvHeadsOf(const TransformerShape& s) { return s.kvHeads > 0 ? s.kvHeads : s.heads; }

// One transformer layer: kTransformerLayerNodes IR nodes, the shape of a traced BERT/GPT block.
ValueId transformerLayer(SyntheticBuilder& b, ValueId x, const LayerParams& w,
                         const TransformerShape& s, const std::string& scope) {
  const int64_t S = s.sequence, H = s.hidden, n = s.heads, d = H / n, kv = kvHeadsOf(s);
  const double sh = static_cast<double>(S) * H, lin = 2.0 * S * H * H, attn = 2.0 * S * S * H;
  const std::vector<int64_t> seqShape{1, S, H}, heads{1, n, S, d}, split{1, S, n, d};
  const bool fused = s.fusedKernels;  // Note [Device presets]: Megatron-LM's fused kernels
  ValueId ln1 = b.op("aten::layer_norm", {x, w.ln1w, w.ln1b}, seqShape, 5 * sh, scope + ".ln1");
  ValueId size = b.scalarOp("aten::size", {x}, scope);
  ValueId num = b.scalarOp("prim::NumToTensor", {size}, scope);
  ValueId batch = b.scalarOp("aten::Int", {num}, scope);
  std::vector<ValueId> qkv;
  for (auto [wt, bias, name] : {std::tuple{w.wq, w.bq, ".q"}, {w.wk, w.bk, ".k"}, {w.wv, w.bv, ".v"}}) {
    const int64_t h = name == std::string(".q") ? n : kv;  // this projection's heads
    ValueId y = b.linear(ln1, wt, bias, {1, S, h * d}, lin * h / n, scope + ".attn" + name, fused);
    ValueId viewed = b.shapeOp("aten::view", y, {1, S, h, d}, scope + ".attn");
    qkv.push_back(b.shapeOp("aten::permute", viewed, {1, h, S, d}, scope + ".attn", {0, 2, 1, 3}));
    if (h == n) continue;
    // transformers' repeat_kv: each K/V head read by n / kv query heads.
    ValueId one = b.op("aten::unsqueeze", {qkv.back(), b.intConstant(2, scope)}, {1, h, 1, S, d}, 0,
                       scope + ".attn", false);
    ValueId many = b.shapeOp("aten::expand", one, {1, h, n / h, S, d}, scope + ".attn");
    qkv.back() = b.shapeOp("aten::reshape", many, heads, scope + ".attn");
  }
  for (int i = 0; i < 2; ++i) {  // head-count bookkeeping TorchScript keeps
    ValueId sz = b.scalarOp("aten::size", {qkv[i]}, scope);
    b.scalarOp("aten::Int", {b.scalarOp("prim::NumToTensor", {sz}, scope)}, scope);
  }
  ValueId kT = b.op("aten::transpose", {qkv[1], b.intConstant(-1, scope), b.intConstant(-2, scope)},
                    {1, n, d, S}, 0, scope + ".attn", false);
  ValueId scores = b.op("aten::matmul", {qkv[0], kT}, {1, n, S, S}, attn, scope + ".attn");
  // Scale and mask: elementwise passes over the scores, or part of the fused softmax kernel.
  auto scoresOp = [&](const std::string& kind, const std::vector<ValueId>& inputs) {
    if (fused) return b.fusedOp(kind, inputs, {1, n, S, S}, scope + ".attn", false);
    return b.op(kind, inputs, {1, n, S, S}, 0, scope + ".attn", false);
  };
  ValueId scaled = scoresOp("aten::div", {scores, b.constant(scope)});
  ValueId masked = scoresOp("aten::add", {scaled, b.constant(scope), batch});
  ValueId probs = b.op("aten::softmax", {masked, b.intConstant(-1, scope)}, {1, n, S, S},
                       5.0 * n * S * S, scope + ".attn", true, true);
  // aten::dropout(x, p, train), each with its own constants (a constant two blocks share would
  // make the later block non-convex)
  const auto dropoutInputs = [&](ValueId v) {
    return std::vector<ValueId>{v, b.floatConstant(0.1, scope), b.intConstant(1, scope)};
  };
  ValueId dropped = b.op("aten::dropout", dropoutInputs(probs), {1, n, S, S}, 0, scope + ".attn");
  ValueId ctx = b.op("aten::matmul", {dropped, qkv[2]}, heads, attn, scope + ".attn");
  ValueId perm = b.shapeOp("aten::permute", ctx, split, scope + ".attn", {0, 2, 1, 3});
  ValueId cont = b.op("aten::contiguous", {perm}, split, 0, scope + ".attn", false);
  ValueId merged = b.shapeOp("aten::view", cont, seqShape, scope + ".attn");
  // The dropout before each residual add: its own pass, or one bias-dropout-add kernel.
  auto dropout = [&](ValueId v) {
    return fused ? b.fusedOp("aten::dropout", dropoutInputs(v), seqShape, scope)
                 : b.op("aten::dropout", dropoutInputs(v), seqShape, 0, scope);
  };
  ValueId out = b.linear(merged, w.wo, w.bo, seqShape, lin, scope + ".attn.out", fused);
  ValueId res1 = b.op("aten::add", {dropout(out), x}, seqShape, sh, scope);
  ValueId ln2 = b.op("aten::layer_norm", {res1, w.ln2w, w.ln2b}, seqShape, 5 * sh, scope + ".ln2");
  ValueId h1 = b.linear(ln2, w.w1, w.b1, {1, S, 4 * H}, 4 * lin, scope + ".mlp.fc1", fused);
  ValueId act = b.op("aten::gelu", {h1}, {1, S, 4 * H}, 8 * sh, scope + ".mlp");
  ValueId h2 = b.linear(act, w.w2, w.b2, seqShape, 4 * lin, scope + ".mlp.fc2", fused);
  return b.op("aten::add", {dropout(h2), res1}, seqShape, sh, scope);
}

}  // namespace

SyntheticModel syntheticTransformer(const TransformerShape& s, const DeviceModel& device) {
  AUTOSTAGE_CHECK_AS(ConfigError, s.layers >= 1 && s.hidden >= 1 && s.heads >= 1 &&
                         s.hidden % s.heads == 0 && s.sequence >= 1 && s.vocabulary >= 1,
                     "transformer shape layers=", s.layers, " hidden=", s.hidden, " heads=", s.heads,
                     " seq=", s.sequence, " vocab=", s.vocabulary,
                     ": all must be >= 1 and hidden divisible by heads");
  AUTOSTAGE_CHECK_AS(ConfigError, s.kvHeads >= 0 && s.heads % kvHeadsOf(s) == 0,
                     "transformer shape kv_heads=", s.kvHeads, " with heads=", s.heads,
                     ": K/V heads must divide the heads (0: as many as the heads)");
  SyntheticBuilder b(s.causal ? "gpt" : "bert", device,
                     device.activationType.value_or(core::DType::Float16));
  const int64_t S = s.sequence, H = s.hidden, V = s.vocabulary;
  ValueId ids = b.batchInput("input_ids", {1, S}, core::DType::Int64);
  ValueId labels = b.batchInput("labels", {1, S}, core::DType::Int64);
  ValueId wordEmb = b.param("embeddings.word.weight", {V, H});
  ValueId posEmb = b.param("embeddings.position.weight", {S, H});
  ValueId lnw = b.param("embeddings.ln.weight", {H}), lnb = b.param("embeddings.ln.bias", {H});
  std::vector<LayerParams> layers;
  const int64_t kvFeatures = H / s.heads * kvHeadsOf(s);
  for (int l = 0; l < s.layers; ++l)
    layers.push_back(layerParams(b, "layers." + std::to_string(l) + ".", H, kvFeatures));
  ValueId headW = s.tiedHead ? wordEmb : b.param("lm_head.weight", {V, H});
  ValueId headB = b.param("lm_head.bias", {V});
  ValueId flnw = b.param("final_ln.weight", {H}), flnb = b.param("final_ln.bias", {H});

  const double sh = static_cast<double>(S) * H;
  ValueId tok = b.op("aten::embedding", {wordEmb, ids}, {1, S, H}, sh, "embeddings.word");
  ValueId pos = b.paramOp("aten::embedding", posEmb, {S, H}, "embeddings.position");
  ValueId x = b.op("aten::add", {tok, pos}, {1, S, H}, sh, "embeddings");
  x = b.op("aten::layer_norm", {x, lnw, lnb}, {1, S, H}, 5 * sh, "embeddings.ln");
  for (int l = 0; l < s.layers; ++l)
    x = transformerLayer(b, x, layers[l], s, "layers." + std::to_string(l));
  x = b.op("aten::layer_norm", {x, flnw, flnb}, {1, S, H}, 5 * sh, "final_ln");
  ValueId logits = b.linear(x, headW, headB, {1, S, V}, 2.0 * S * H * V, "lm_head", s.fusedKernels);
  // cross_entropy(logits.view(-1, V), labels.view(-1)), as a causal LM computes its loss
  ValueId flat = b.shapeOp("aten::view", logits, {S, V}, "lm_head", {-1, V});
  ValueId flatLabels = b.shapeOp("aten::view", labels, {S}, "loss", {-1});
  ValueId loss = b.op("aten::cross_entropy",
                      {flat, flatLabels, b.noneConstant("loss"), b.intConstant(1, "loss"),
                       b.intConstant(-100, "loss"), b.floatConstant(0.0, "loss")},
                      {}, 4.0 * S * V, "loss", false, true);
  return b.finish(loss);
}

SyntheticModel syntheticMlp(const MlpShape& s, const DeviceModel& device) {
  AUTOSTAGE_CHECK_AS(ConfigError, s.layers >= 1 && s.hidden >= 1, "mlp shape layers=", s.layers,
                     " hidden=", s.hidden, ": both must be >= 1");
  SyntheticBuilder b("mlp", device, core::DType::Float32);
  const int64_t H = s.hidden;
  ValueId x = b.batchInput("x", {1, H}, core::DType::Float32);
  ValueId labels = b.batchInput("labels", {1}, core::DType::Int64);
  std::vector<std::pair<ValueId, ValueId>> params;
  for (int l = 0; l < s.layers; ++l) {
    std::string p = "layers." + std::to_string(l);
    params.push_back({b.param(p + ".weight", {H, H}), b.param(p + ".bias", {H})});
  }
  for (int l = 0; l < s.layers; ++l) {
    std::string scope = "layers." + std::to_string(l);
    x = b.op("aten::relu", {b.linear(x, params[l].first, params[l].second, {1, H}, 2.0 * H * H, scope)},
             {1, H}, static_cast<double>(H), scope);
  }
  ValueId loss = b.op("aten::cross_entropy", {x, labels}, {}, 4.0 * H, "loss", false);
  return b.finish(loss);
}

}  // namespace autostage::decomposer
