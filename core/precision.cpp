#include "core/precision.h"

#include "core/error.h"

namespace autostage::core {

std::string precisionName(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

Precision parsePrecision(const std::string& text) {
  if (text == "fp32") return Precision::Fp32;
  if (text == "bf16") return Precision::Bf16;
  if (text == "fp16") return Precision::Fp16;
  throw ConfigError("option precision='" + text + "' is unknown; use fp32, bf16 or fp16");
}

double castCopyRatio(Precision precision) { return precision == Precision::Fp32 ? 0.0 : 0.5; }

}  // namespace autostage::core
