#include "staging/state_dict_load.h"

#include <map>
#include <sstream>

#include <ATen/ATen.h>

#include "core/error.h"

namespace autostage::staging {
namespace {

constexpr size_t kMaxListed = 8;  // problems listed in one message, as in checkpoint.py

std::map<std::string, at::Tensor> ownState(const torch::jit::Module& module) {
  std::map<std::string, at::Tensor> own;
  for (const auto& named : module.named_parameters(true)) own[named.name] = named.value;
  for (const auto& named : module.named_buffers(true)) own[named.name] = named.value;
  return own;
}

std::string shapeText(const at::Tensor& t) {
  std::ostringstream out;
  out << '[';
  for (int64_t d = 0; d < t.dim(); ++d) out << (d ? ", " : "") << t.size(d);
  return out.str() + "]";
}

// torch.nn.Module.load_state_dict accepts a 1-element vector for a 0-dim tensor.
bool shapesFit(const at::Tensor& given, const at::Tensor& own) {
  return given.sizes() == own.sizes() || (own.dim() == 0 && given.dim() == 1 && given.size(0) == 1);
}

}  // namespace

std::string stateDictProblem(const torch::jit::Module& module, const NamedTensors& state,
                             bool strict) {
  const std::map<std::string, at::Tensor> own = ownState(module);
  std::map<std::string, at::Tensor> given(state.begin(), state.end());
  std::vector<std::string> problems;
  bool keyProblems = false;
  for (const auto& [key, value] : own) {
    auto found = given.find(key);
    if (found == given.end()) {
      if (strict) problems.push_back("'" + key + "' is missing from the checkpoint");
      keyProblems = keyProblems || strict;
    } else if (!found->second.defined()) {
      problems.push_back("'" + key + "' is an undefined tensor in the checkpoint");
    } else if (!shapesFit(found->second, value)) {
      problems.push_back("'" + key + "' has shape " + shapeText(found->second) +
                         " in the checkpoint but " + shapeText(value) + " in the model");
    }
  }
  for (const auto& [key, value] : given) {
    if (strict && !own.count(key)) {
      problems.push_back("'" + key + "' is in the checkpoint but not in the model");
      keyProblems = true;
    }
  }
  if (problems.empty()) return "";
  std::ostringstream out;
  out << "the checkpoint does not fit " << module.type()->name()->name() << ": ";
  for (size_t i = 0; i < problems.size() && i < kMaxListed; ++i)
    out << (i ? "; " : "") << problems[i];
  if (problems.size() > kMaxListed) out << "; and " << problems.size() - kMaxListed << " more";
  out << ". Nothing was loaded (the model is unchanged); load a checkpoint saved from this model "
         "with the same sizes";
  if (keyProblems) out << ", or pass strict=false to skip missing and unexpected keys";
  return out.str();
}

void loadStateDict(torch::jit::Module& module, const NamedTensors& state, bool strict) {
  const std::string problem = stateDictProblem(module, state, strict);
  AUTOSTAGE_CHECK_AS(FormatError, problem.empty(), problem);
  std::map<std::string, at::Tensor> own = ownState(module);
  at::NoGradGuard noGrad;
  for (const auto& [key, value] : state) {
    auto found = own.find(key);
    if (found != own.end()) found->second.copy_(value.view_as(found->second));
  }
}

}  // namespace autostage::staging
