#pragma once
// Devices autostage can plan for without having them (`autostage plan --device-preset`): data-sheet
// figures and the efficiency assumptions that turn them into a synthetic model's costs.
//
// Note [Device presets]
// Each preset holds the vendor's data-sheet figures for one GPU in an 8-GPU server (NVIDIA's
// A100 and H100 Tensor Core GPU data sheets, H200 product brief; DGX A100/H100 networking): the
// memory nvidia-smi reports, dense peak FLOP/s per precision (fp32 without TF32, as PyTorch runs
// fp32 matmuls by default; bf16 and fp16 on tensor cores), HBM bandwidth, NVLink bandwidth per
// direction and the network bandwidth per GPU (one 200 Gb/s HDR or 400 Gb/s NDR port each).
// What a training step achieves of those peaks is an assumption, written down here and used by
// syntheticFromSpec through DeviceModel (roofline form) and CommProfile. Per operation kind:
//   - matmuls and attention products: their FLOPs at kComputeEfficiency (0.6) of peak FLOP/s.
//     Megatron-LM's 1T-parameter GPT achieves 52% of peak end to end, pipeline bubble, tensor-
//     parallel communication and element-wise kernels included (Narayanan et al., SC'21,
//     Table 1), so its matmuls run above 52%; 0.6 is the value this model had before any
//     comparison, not fitted to the checks below;
//   - every operation's input and output activations (element-wise, normalisation, softmax,
//     dropout, copies, and the matmuls' own operands): once through HBM at kMemoryEfficiency
//     (0.8) of its bandwidth; views (view, permute, transpose, t) copy nothing;
//   - an operation takes the longer of its FLOP time and its byte time (roofline: a kernel's
//     loads overlap its arithmetic), plus 5 us per kernel launch; backward twice forward;
//   - point-to-point transfers at kLinkEfficiency (0.8) of NVLink inside a server and of one
//     network port between servers, 5 us and 20 us latency; the gradient allreduce (bus
//     bandwidth) inside a server at 0.8 of NVLink, between servers at 0.8 of all the server's
//     ports together (capped by NVLink): NCCL runs one ring per port, and NVIDIA measures
//     192 GB/s allreduce bus bandwidth between DGX A100s of 8 x 200 Gb/s ports (NVIDIA/nccl
//     issue 812). A replica group with fewer members per server than ports gets fewer rings;
//     the model does not see that and is optimistic there.
// Kernel fusion belongs to the model's implementation, not to the device: the synthetic
// transformer is unfused, as TorchScript records a model; `fused=1` in the spec
// (TransformerShape::fusedKernels) fuses as Megatron-LM does (Narayanan et al., section 4.2:
// bias + GeLU and bias + dropout + add fused, scale + mask + softmax one kernel; the linear
// layers' biases in the GEMM or the next fused kernel). The attention dropout stays its own pass
// over the heads x seq x seq probabilities, as in Megatron-LM.
//
// Checked against Megatron-LM's published runs (Narayanan et al., SC'21, Table 1: Selene's
// 80 GB A100s, fp16, sequence 2048, vocabulary 51200, activation recomputation), the measured
// step being the paper's FLOPs per step, 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), over the
// achieved TFLOP/s (tests/decomposer/device_presets_test.cpp):
//   - 1.7B (24 layers, hidden 2304, 24 heads), 32 GPUs data-parallel, batch 512, 137 TFLOP/s:
//     3.53 s. The same configuration (`autostage plan --synthetic gpt:layers=24,hidden=2304,
//     heads=24,seq=2048,vocab=51200,tied=1,fused=1 --devices 32 --device-preset a100-80gb
//     --precision fp16 --batch 512 --partition-num 1 --recompute always`) predicts 3.81 s,
//     1.08x (8 micro-batches of 2; the gradient allreduce 80 ms of it). Unfused: 4.82 s, 1.37x.
//   - 3.6B (30 layers, hidden 3072, 32 heads), 64 GPUs as 2-way tensor x 32-way data
//     parallelism, batch 512, 138 TFLOP/s: 3.70 s. Planned so (--tensor-parallel 2, Note
//     [Tensor-parallel cost]) it predicts 3.99 s, 1.08x; as 64 replicas of one stage (the same
//     FLOPs per GPU) 3.87 s, 1.05x; as 2 pipeline stages x 32 replicas, 4.04 s, 1.09x.
//   - 7.5B (36 layers, hidden 4096, 32 heads), 128 GPUs as 4-way tensor x 32-way data,
//     batch 512, 142 TFLOP/s: 3.70 s. Planned so (--tensor-parallel 4) it predicts 4.01 s,
//     1.08x; as 4 pipeline stages x 32 replicas (16 micro-batches, 1f1b, whose bubble
//     Megatron's configuration does not have) 4.18 s, 1.13x.
//   - The largest runs, planned as Megatron ran them (--tensor-parallel 8, --partition-num the
//     pipeline depth, --virtual-stages 1, the micro-batch size free), are further off
//     (2026-12-07, this machine): 145B on 1,536 GPUs (batch 2,304 in Table 1: 24 replicas of 96
//     samples) 27.2 s against 24.8 s (1.10x), 310B on 1,920 43.7 s against 37.6 s (1.16x), 530B on
//     2,520 69.5 s against 54.1 s (1.28x; 84.3 s, 1.56x, with micro-batches of one sample as
//     Megatron ran it), 1T on 3,072 126.4 s against 102.6 s (1.23x). Before, with the free
//     micro-batch counts powers of two only, the 145B, 310B and 530B predicted 27.9, 54.6 and 77.6
//     s (Note [Free micro-batch counts] in plan.h; an earlier version of this Note compared the
//     145B with 19.3 s, the step of a batch of 1,792, which 24 replicas cannot split evenly); the
//     1T was 151.8 s while an LM head tied to the first stage's embedding ran whole on the last
//     stage (Note [Tied tables across stages] in staging/gradient_sync.h). Seen in the plans,
//     not modelled: the stages are cut at block boundaries, which do not fall on layers. The
//     planner's own plans (tensor_parallel=auto) are faster in this model: 25.6, 42.4, 63.8 and
//     118.0 s; the 1T's is tested never to be slower than Megatron's configuration.
// Before this calibration the 1.7B run was predicted at 6.13 s (1.74x): unfused, every
// operation's bytes added to its FLOP time, views copied, and the allreduce between servers at
// one port's bandwidth (0.69 s of the 6.13 s). Not modelled: the overlap of Megatron's
// tensor-parallel allreduces with compute, backward kernels that move fewer than twice the
// forward's bytes, and the LM head recomputed with the layers (Megatron recomputes the layers
// only).

#include <string>
#include <vector>

#include "core/profile.h"

namespace autostage::decomposer {

struct DeviceModel;

// Achieved fractions of the data sheet's peaks (Note [Device presets]).
constexpr double kComputeEfficiency = 0.6;  // of peak FLOP/s: matmuls, attention products
constexpr double kMemoryEfficiency = 0.8;   // of HBM bandwidth: every operation's activations
constexpr double kLinkEfficiency = 0.8;     // of NVLink and network bandwidth

struct DevicePreset {
  std::string name;        // a100-40gb, a100-80gb, h100-80gb, h200
  std::string model;       // the device kind plans record, e.g. "synthetic:NVIDIA A100-SXM4-80GB"
  double memoryBytes = 0;  // as nvidia-smi reports it
  double peakFp32 = 0, peakBf16 = 0, peakFp16 = 0;  // dense FLOP/s
  double hbmBytesPerSecond = 0;
  double nvlinkBytesPerSecond = 0;   // per direction, per GPU
  double networkBytesPerSecond = 0;  // per GPU, between servers
  int devicesPerServer = 8;

  // Peak FLOP/s for precision fp32, bf16 or fp16 (ConfigError otherwise).
  double peakFlops(const std::string& precision) const;
  // The synthetic model's device for `precision`, with the efficiency assumptions above
  // (roofline form).
  DeviceModel deviceModel(const std::string& precision) const;
  // Point-to-point and allreduce links inside a server and between servers (the allreduce
  // between servers over all of a server's network ports).
  core::CommProfile comm() const;
};

// The preset named `name`; ConfigError listing the known names otherwise.
const DevicePreset& devicePreset(const std::string& name);
std::vector<std::string> devicePresetNames();

}  // namespace autostage::decomposer
