#pragma once
// Training precision (config key `precision`): fp32, or torch.autocast-style mixed precision in
// which the stages' ops run in bfloat16/float16 where autocast chooses to, while parameters,
// gradients and optimizer state stay fp32 (master weights). Torch-free; the autocast guard that
// applies it is frontend/torchscript/autocast.h.

#include <string>

namespace autostage::core {

enum class Precision { Fp32, Bf16, Fp16 };

// "fp32", "bf16", "fp16".
std::string precisionName(Precision precision);
// Parses the names above; throws ConfigError listing them on anything else.
Precision parsePrecision(const std::string& text);
// Bytes of the autocast copy of an fp32 parameter per parameter byte: 0.5 for bf16/fp16
// (2-byte copies of 4-byte weights), 0 for fp32 (Note [Pipeline cost model]).
double castCopyRatio(Precision precision);

}  // namespace autostage::core
