// The autograd bridge (Note [The autograd bridge] in autograd_bridge.h).
#include "driver/autograd_bridge.h"

#include <sstream>

#include <torch/csrc/autograd/custom_function.h>

#include "comm/agreement.h"
#include "core/error.h"

namespace autostage::driver {
namespace {

// The TorchScript interpreter wraps an op's error in a script traceback of the generated stage
// graph, which names no user code; its last line ("RuntimeError: index out of range in self")
// is the part worth reporting.
std::string withoutScriptTraceback(const std::string& message) {
  if (message.find("failed in the TorchScript interpreter") == std::string::npos) return message;
  size_t end = message.find_last_not_of("\n ");
  if (end == std::string::npos) return message;
  size_t begin = message.rfind('\n', end);
  begin = begin == std::string::npos ? 0 : begin + 1;
  return message.substr(begin, end + 1 - begin) + " (in the TorchScript interpreter)";
}

}  // namespace

std::string whereOf(const staging::Executor& executor, int rank) {
  std::ostringstream out;
  out << "rank " << rank;
  const std::vector<int> stages = executor.localStages();
  if (stages.empty()) return out.str() + " (no stage)";
  out << (stages.size() > 1 ? ", stages " : ", stage ");
  for (size_t i = 0; i < stages.size(); ++i)
    out << (i ? ", " : "") << stages[i] << " (" << executor.deployment().stages[stages[i]].name
        << ")";
  return out.str();
}

[[noreturn]] void rethrowAt(const std::string& where) {
  comm::StepStatus status = comm::StepStatus::fromCurrentException();
  comm::throwErrorOfClass(status.errorClass,
                          where + ": " + withoutScriptTraceback(status.message));
}

std::vector<at::Tensor> movedTo(const std::vector<at::Tensor>& tensors, c10::Device device) {
  std::vector<at::Tensor> moved;
  for (const at::Tensor& t : tensors)
    moved.push_back(t.defined() && t.device() != device ? t.to(device) : t);
  return moved;
}

namespace {

// Keeps the executor of one forward, and the imported model it runs, alive until its backward
// has run, even when the Module is destroyed first (`autostage.Module(m)(x).sum().backward()`).
struct PipelineStep : torch::CustomClassHolder {
  std::shared_ptr<const torchscript::ImportedModel> model;
  std::shared_ptr<staging::Executor> executor;
  int rank = 0;
  std::vector<at::Tensor> outputs;  // on the stages' device
  c10::Device callerDevice = c10::Device(c10::DeviceType::CPU);  // where the outputs go
  bool backwardRan = false;  // the pipeline backward of this forward ran (it frees its state)
};

// The autograd node behind Module::forward's outputs: its backward is the pipeline backward.
struct PipelineFunction : public torch::autograd::Function<PipelineFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& anchor,
                                                c10::intrusive_ptr<PipelineStep> step) {
    ctx->saved_data["step"] = c10::IValue::make_capsule(step);
    // The caller's gradients come back on the caller's device; Executor::backward moves them.
    return movedTo(step->outputs, step->callerDevice);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto step = c10::static_intrusive_pointer_cast<PipelineStep>(
        ctx->saved_data["step"].toCapsule());
    try {
      // A second backward through the same outputs (retain_graph=True, or a loss computed from
      // them after the first backward) would find the stages' forward state released.
      AUTOSTAGE_CHECK_AS(UnsupportedError, !step->backwardRan,
                         "backward through the outputs of this forward ran already: the pipeline "
                         "backward runs once per forward (retain_graph cannot keep the stages' "
                         "state); sum the losses and call backward once, or detach what is "
                         "computed from the outputs after their backward, or run forward again");
      step->backwardRan = true;
      step->executor->backward(grads);
    } catch (...) {
      rethrowAt(whereOf(*step->executor, step->rank));
    }
    return {at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> pipelineOutputs(const at::Tensor& anchor,
                                        std::shared_ptr<const torchscript::ImportedModel> model,
                                        std::shared_ptr<staging::Executor> executor, int rank,
                                        std::vector<at::Tensor> outputs,
                                        c10::Device callerDevice) {
  auto step = c10::make_intrusive<PipelineStep>();
  step->callerDevice = callerDevice;
  step->model = std::move(model);
  step->executor = std::move(executor);
  step->rank = rank;
  step->outputs = std::move(outputs);
  std::vector<at::Tensor> result = PipelineFunction::apply(anchor, step);
  step->outputs.clear();  // the outputs hold the autograd node that holds `step`: no cycle
  return result;
}

}  // namespace autostage::driver
