#pragma once
// Synthetic graphs with analytic profiles, for tests and benchmarks and for planning clusters we
// do not have. Shapes follow the usual models: a BERT/GPT-shaped transformer (embedding, layers of
// kTransformerLayerNodes IR nodes, each with the constants and operands the front ends record,
// so that the tensor-parallel check runs on them as on a captured model; LM head and loss), a ResNet-shaped CNN (bottleneck
// blocks) and an MLP. Profiles are analytic: an operation's FLOPs at peak FLOP/s * efficiency and
// its input and output bytes at the memory bandwidth, added (DeviceModel::roofline false) or the
// longer of the two (true), plus a per-kernel launch cost; backward twice forward; bytes from the
// shapes. Tensor shapes carry dim 0 = 1 (one sample); every cost is per sample.

#include <cstdint>
#include <optional>
#include <string>

#include "core/ir/graph.h"
#include "core/profile.h"

namespace autostage::decomposer {

struct DeviceModel {
  std::string kind = "synthetic:a100";
  double peakFlops = 312e12;
  double efficiency = 0.5;
  double memoryBandwidth = 1.5e12;  // bytes/s
  double launchSeconds = 5e-6;      // per kernel, forward
  // Note [Device presets]: true, an operation takes the longer of its FLOP time and its byte time
  // (a GPU kernel's loads overlap its arithmetic) and views (aten::view, permute, transpose, t)
  // move no bytes and launch no kernel; false, the two times add and views cost a copy (the
  // first synthetic model, whose figures the tests and benchmarks without a preset keep).
  bool roofline = false;
  // A transformer's parameters when set (fp32 for mixed precision: Note [Device presets]);
  // otherwise in the model's own type (fp16 for transformers).
  std::optional<core::DType> parameterType;
  std::optional<core::DType> activationType;  // likewise for its activations
};

struct TransformerShape {
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int sequence = 512;
  int vocabulary = 30522;
  bool causal = false;  // GPT-shaped when true (names only; same node structure)
  bool tiedHead = false;  // LM head reuses the word embedding
  // Note [Device presets]: the kernels fused as Megatron-LM fuses them. Same graph; the linear
  // layers' bias adds (GEMM epilogue or the next fused kernel), the attention scale and mask
  // (one kernel with the softmax) and the dropout before each residual add (one bias-dropout-add
  // kernel) take no time of their own.
  bool fusedKernels = false;
  // K/V heads (grouped-query attention, Llama's): K and V project to kvHeads heads, repeated to
  // every query head (unsqueeze, expand, reshape) before the scores; 0: as many as `heads`.
  int kvHeads = 0;
};

struct ResNetShape {
  int blocks = 16;  // bottleneck blocks, split over four resolution stages
  int width = 64;
  int image = 224;
  int classes = 1000;
};

struct MlpShape {
  int layers = 8;
  int hidden = 1024;
};

struct SyntheticModel {
  core::Graph graph;
  core::GraphProfile profile;
};

SyntheticModel syntheticTransformer(const TransformerShape& shape, const DeviceModel& device);
// IR nodes per layer of syntheticTransformer without kvHeads (bench/plan_scaling sizes its
// graphs by it); grouped K/V heads add 3 per K and V.
constexpr int kTransformerLayerNodes = 69;
SyntheticModel syntheticResNet(const ResNetShape& shape, const DeviceModel& device);
SyntheticModel syntheticMlp(const MlpShape& shape, const DeviceModel& device);

// "bert:layers=96,hidden=2048,heads=32,seq=512[,vocab=V,tied=1,fused=1,kv_heads=K]", "gpt:..."
// (causal),
// "resnet:blocks=16,width=64,image=224", "mlp:layers=8,hidden=1024". Throws ConfigError naming
// the bad part and the accepted keys.
SyntheticModel syntheticFromSpec(const std::string& spec, const DeviceModel& device);

}  // namespace autostage::decomposer
