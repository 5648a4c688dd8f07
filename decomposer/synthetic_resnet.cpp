// Synthetic ResNet-shaped graph (bottleneck blocks) and the synthetic spec parser.
#include <map>
#include <sstream>

#include "core/error.h"
#include "decomposer/synthetic.h"
#include "decomposer/synthetic_builder.h"

namespace autostage::decomposer {
namespace {

using core::ValueId;
using detail::SyntheticBuilder;

struct ConvParams {
  ValueId weight, bnWeight, bnBias, bnMean, bnVar;
};

ConvParams convParams(SyntheticBuilder& b, const std::string& name, int64_t in, int64_t out, int64_t k) {
  return {b.param(name + ".weight", {out, in, k, k}), b.param(name + ".bn.weight", {out}),
          b.param(name + ".bn.bias", {out}), b.param(name + ".bn.running_mean", {out}),
          b.param(name + ".bn.running_var", {out})};
}

// conv + batch_norm (+ relu): 2 or 3 nodes.
ValueId convBn(SyntheticBuilder& b, ValueId x, const ConvParams& p, std::vector<int64_t> out,
               int64_t in, int64_t k, bool relu, const std::string& scope) {
  const double spatial = static_cast<double>(out[1]) * out[2] * out[3];
  ValueId y = b.op("aten::conv2d", {x, p.weight}, out, 2.0 * spatial * in * k * k, scope);
  y = b.op("aten::batch_norm", {y, p.bnWeight, p.bnBias, p.bnMean, p.bnVar}, out, 5 * spatial, scope + ".bn");
  return relu ? b.op("aten::relu", {y}, out, spatial, scope) : y;
}

struct BlockPlan {
  int64_t in, mid, out, size;
  bool downsample;
};

}  // namespace

SyntheticModel syntheticResNet(const ResNetShape& s, const DeviceModel& device) {
  AUTOSTAGE_CHECK_AS(ConfigError, s.blocks >= 1 && s.width >= 1 && s.image >= 32 && s.classes >= 1,
                     "resnet shape blocks=", s.blocks, " width=", s.width, " image=", s.image,
                     ": blocks, width >= 1 and image >= 32");
  SyntheticBuilder b("resnet", device, core::DType::Float32);
  ValueId image = b.batchInput("image", {1, 3, s.image, s.image}, core::DType::Float32);
  ValueId labels = b.batchInput("labels", {1}, core::DType::Int64);
  ConvParams stem = convParams(b, "stem", 3, s.width, 7);
  std::vector<BlockPlan> plans;
  int64_t channels = s.width, size = s.image / 4;
  for (int i = 0; i < s.blocks; ++i) {
    int stage = i * 4 / s.blocks;
    int64_t mid = s.width << stage, out = mid * 4;
    bool first = i == 0 || (i * 4 / s.blocks) != ((i - 1) * 4 / s.blocks);
    int64_t blockSize = (first && i > 0) ? size / 2 : size;
    plans.push_back({channels, mid, out, blockSize, first});
    channels = out;
    size = blockSize;
  }
  std::vector<std::vector<ConvParams>> params;
  for (size_t i = 0; i < plans.size(); ++i) {
    const BlockPlan& p = plans[i];
    std::string name = "layers." + std::to_string(i);
    params.push_back({convParams(b, name + ".conv1", p.in, p.mid, 1), convParams(b, name + ".conv2", p.mid, p.mid, 3),
                      convParams(b, name + ".conv3", p.mid, p.out, 1)});
    if (p.downsample) params.back().push_back(convParams(b, name + ".downsample", p.in, p.out, 1));
  }
  ValueId fcW = b.param("fc.weight", {s.classes, channels}), fcB = b.param("fc.bias", {s.classes});

  ValueId x = convBn(b, image, stem, {1, s.width, s.image / 2, s.image / 2}, 3, 7, true, "stem");
  x = b.op("aten::max_pool2d", {x}, {1, s.width, s.image / 4, s.image / 4}, 0, "stem", false);
  for (size_t i = 0; i < plans.size(); ++i) {
    const BlockPlan& p = plans[i];
    std::string scope = "layers." + std::to_string(i);
    ValueId y = convBn(b, x, params[i][0], {1, p.mid, p.size, p.size}, p.in, 1, true, scope + ".conv1");
    y = convBn(b, y, params[i][1], {1, p.mid, p.size, p.size}, p.mid, 3, true, scope + ".conv2");
    y = convBn(b, y, params[i][2], {1, p.out, p.size, p.size}, p.mid, 1, false, scope + ".conv3");
    ValueId shortcut = p.downsample ? convBn(b, x, params[i][3], {1, p.out, p.size, p.size}, p.in, 1,
                                             false, scope + ".downsample")
                                    : x;
    const double elems = static_cast<double>(p.out) * p.size * p.size;
    x = b.op("aten::relu", {b.op("aten::add", {y, shortcut}, {1, p.out, p.size, p.size}, elems, scope)},
             {1, p.out, p.size, p.size}, elems, scope);
  }
  x = b.op("aten::adaptive_avg_pool2d", {x}, {1, channels, 1, 1}, 0, "pool");
  x = b.shapeOp("aten::flatten", x, {1, channels}, "pool");
  ValueId logits = b.linear(x, fcW, fcB, {1, s.classes}, 2.0 * channels * s.classes, "fc");
  return b.finish(b.op("aten::cross_entropy", {logits, labels}, {}, 4.0 * s.classes, "loss", false));
}

namespace {

std::map<std::string, int> parseFields(const std::string& spec, const std::string& body,
                                       const std::string& known) {
  std::map<std::string, int> fields;
  std::istringstream in(body);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    AUTOSTAGE_CHECK_AS(ConfigError, eq != std::string::npos, "synthetic spec '", spec, "': '", item,
                       "' is not key=value; keys: ", known);
    std::string key = item.substr(0, eq);
    AUTOSTAGE_CHECK_AS(ConfigError, ("," + known + ",").find("," + key + ",") != std::string::npos,
                       "synthetic spec '", spec, "': unknown key '", key, "'; keys: ", known);
    try {
      fields[key] = std::stoi(item.substr(eq + 1));
    } catch (const std::exception&) {
      throw ConfigError("synthetic spec '" + spec + "': value of '" + key + "' is not an integer");
    }
  }
  return fields;
}

int field(const std::map<std::string, int>& f, const std::string& key, int fallback) {
  auto it = f.find(key);
  return it == f.end() ? fallback : it->second;
}

}  // namespace

SyntheticModel syntheticFromSpec(const std::string& spec, const DeviceModel& device) {
  size_t colon = spec.find(':');
  std::string family = spec.substr(0, colon), body = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (family == "bert" || family == "gpt") {
    auto f = parseFields(spec, body, "layers,hidden,heads,seq,vocab,tied,fused,kv_heads");
    TransformerShape s;
    s.layers = field(f, "layers", s.layers);
    s.hidden = field(f, "hidden", s.hidden);
    s.heads = field(f, "heads", s.heads);
    s.sequence = field(f, "seq", s.sequence);
    s.vocabulary = field(f, "vocab", family == "gpt" ? 50257 : s.vocabulary);
    s.tiedHead = field(f, "tied", 0) != 0;
    s.fusedKernels = field(f, "fused", 0) != 0;
    s.kvHeads = field(f, "kv_heads", 0);
    s.causal = family == "gpt";
    return syntheticTransformer(s, device);
  }
  if (family == "resnet") {
    auto f = parseFields(spec, body, "blocks,width,image,classes");
    ResNetShape s;
    s.blocks = field(f, "blocks", s.blocks);
    s.width = field(f, "width", s.width);
    s.image = field(f, "image", s.image);
    s.classes = field(f, "classes", s.classes);
    return syntheticResNet(s, device);
  }
  if (family == "mlp") {
    auto f = parseFields(spec, body, "layers,hidden");
    MlpShape s;
    s.layers = field(f, "layers", s.layers);
    s.hidden = field(f, "hidden", s.hidden);
    return syntheticMlp(s, device);
  }
  throw ConfigError("synthetic spec '" + spec + "': unknown model family '" + family +
                    "'; use bert, gpt, resnet or mlp, e.g. bert:layers=24,hidden=1024,heads=16,seq=512");
}

}  // namespace autostage::decomposer
