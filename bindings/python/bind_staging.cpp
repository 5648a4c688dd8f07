// autostage.Module's C++ side (autostage::Module), process-group functions and options.
#include <map>
#include <string>

#include <pybind11/stl.h>
#include <torch/csrc/jit/python/module_python.h>  // as_module; see bindings/python/ivalue_cast.h
#include <torch/csrc/utils/pybind.h>

#include "bindings/cpp/module.h"
#include "bindings/python/bindings.h"
#include "comm/agreement.h"
#include "comm/registry.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/proto/deployment_file.h"
#include "staging/call_inputs.h"
#include "staging/checkpoint.h"

namespace autostage::bindings {
namespace {

namespace py = pybind11;

// Calls the Python tracer (autostage.module's _trace of the user's model) with the GIL held; a
// Python exception becomes the autostage error of the same class name (Error otherwise), so
// comm::runAgreed can report it on every rank.
driver::TraceCallback pythonTracer(py::object tracer) {
  auto shared = std::make_shared<py::object>(std::move(tracer));
  return [shared](const std::vector<c10::IValue>& inputs) {
    py::gil_scoped_acquire gil;
    std::string errorClass, message;
    try {
      py::list tensors;
      for (const c10::IValue& v : inputs) tensors.append(v.toTensor());
      py::object captured = (*shared)(tensors);
      driver::CapturedModel out;
      if (py::isinstance<torchscript::ImportedModel>(captured)) {
        out.imported = captured.cast<std::shared_ptr<torchscript::ImportedModel>>();
        return out;
      }
      auto module = torch::jit::as_module(captured);
      AUTOSTAGE_CHECK(module.has_value(), "the tracer returned a ",
                      std::string(py::str(py::type::handle_of(captured))),
                      ", not a torch.jit.ScriptModule or autostage IR");
      out.script = *module;
      return out;
    } catch (py::error_already_set& e) {
      errorClass = py::str(e.type().attr("__name__"));
      message = py::str(e.value());
    }
    comm::throwErrorOfClass(errorClass, message);
  };
}

std::unique_ptr<Module> makeModule(const py::object& tracer, const std::string& deploymentPath,
                                   const std::map<std::string, std::string>& planOptions) {
  ModuleOptions options = ModuleOptions::fromConfig();
  if (!deploymentPath.empty()) options.deploymentPath = deploymentPath;  // else load_deployment
  options.planOptions = planOptions;  // Note [Per-module plan options] (driver/plan_sources.cpp)
  options.tracer = pythonTracer(tracer);
  // Note [ZeRO-1 optimizer] (autostage/optimizer.py): the Python optimizer steps the pieces.
  return std::make_unique<Module>(torch::jit::Module("autostage_untraced"), options,
                                  /*shardsOptimizer=*/true);
}

// Calls that communicate with other ranks or run the model release the GIL while they do (the
// arguments are converted before, the result after, with the GIL held).
using Released = py::call_guard<py::gil_scoped_release>;

// forward / trainStep on the tensors of a Python call.
template <typename Method>
std::vector<at::Tensor> callModule(Module& module, Method method,
                                   const std::vector<at::Tensor>& inputs, bool agreed) {
  return (module.*method)(std::vector<c10::IValue>(inputs.begin(), inputs.end()), agreed);
}

py::dict deploymentInfo(const core::Deployment& d) {
  py::list stages;
  for (const core::StageDeployment& stage : d.stages) {
    py::dict entry;
    entry["name"] = stage.name;
    entry["ranks"] = stage.ranks;
    entry["recompute"] = stage.recompute;
    entry["zero"] = stage.zero;
    entry["tensor_parallel"] = stage.tensorParallel;
    entry["node_count"] = stage.nodes.size();
    entry["forward_seconds"] = stage.forwardSeconds;
    entry["backward_seconds"] = stage.backwardSeconds;
    entry["memory_bytes"] = stage.totalMemoryBytes;
    entry["parameter_bytes"] = stage.paramBytes;
    entry["gradient_bytes"] = stage.gradientBytes;
    entry["optimizer_bytes"] = stage.optimizerBytes;
    entry["activation_bytes"] = stage.activationBytes;
    stages.append(entry);
  }
  py::dict info;
  info["micro_batches"] = d.microBatchCount;
  info["schedule"] = d.schedule;
  info["virtual_stages"] = d.virtualStages;
  info["stages"] = stages;
  info["world_size"] = d.worldSize;
  info["batch_size"] = d.batchSize;
  info["device_memory"] = d.deviceMemory;
  info["graph_hash"] = d.graphHash;
  info["options"] = d.options;
  info["predicted_iteration_seconds"] = d.predictedIterationSeconds;
  return info;
}

comm::Backend& world() { return *comm::sharedBackend("mpi"); }

}  // namespace

void bindStaging(py::module_& m) {
  comm::registerBuiltinBackends();
  py::class_<staging::LossScaler>(m, "_LossScaler",
                                  "Dynamic loss scaling's state (Note [Dynamic loss scaling]).")
      .def(py::init([](double initScale, double growthFactor, double backoffFactor,
                       int64_t growthInterval) {
             return staging::LossScaler({initScale, growthFactor, backoffFactor, growthInterval});
           }),
           py::arg("init_scale"), py::arg("growth_factor"), py::arg("backoff_factor"),
           py::arg("growth_interval"))
      .def_property_readonly("scale", &staging::LossScaler::scale)
      .def_property_readonly("growth_tracker", &staging::LossScaler::growthTracker)
      .def_property_readonly("growth_factor",
                             [](const staging::LossScaler& s) { return s.options().growthFactor; })
      .def_property_readonly("backoff_factor",
                             [](const staging::LossScaler& s) { return s.options().backoffFactor; })
      .def_property_readonly(
          "growth_interval",
          [](const staging::LossScaler& s) { return s.options().growthInterval; })
      .def("update", &staging::LossScaler::update, py::arg("finite"))
      .def("set_scale", &staging::LossScaler::setScale, py::arg("scale"))
      .def("load", &staging::LossScaler::load, py::arg("scale"), py::arg("growth_tracker"))
      .def("__repr__", &staging::LossScaler::toString);

  py::class_<Module>(m, "_Module")
      .def(py::init(&makeModule), py::arg("tracer"), py::arg("deployment_path") = "",
           py::arg("plan_options") = std::map<std::string, std::string>{})
      .def(
          "forward",
          [](Module& mod, const std::vector<at::Tensor>& inputs, bool agreed) {
            return callModule(mod, &Module::forward, inputs, agreed);
          },
          py::arg("inputs"), py::arg("agreed") = false, Released(),
          "agreed: _agree_call ran for this call (Note [One agreement per call]).")
      .def(
          "train_step",
          [](Module& mod, const std::vector<at::Tensor>& inputs, bool agreed) {
            return callModule(mod, &Module::trainStep, inputs, agreed);
          },
          py::arg("inputs"), py::arg("agreed") = false, Released())
      .def_property_readonly("ready", &Module::ready)
      .def("train", &Module::train, py::arg("on"),
           "Note [Train and eval modes]: the mode the traced model is in for the next call; "
           "the module switches to that mode's deployments (local).")
      .def_property_readonly("deployment_count", &Module::deploymentCount)
      .def_property_readonly("training_selection", &Module::trainingSelection)
      .def_property_readonly("usage",
                             [](const Module& mod) { return core::usageName(mod.usage()); })
      .def("parameters", &Module::parameters)
      .def("place_tensors", &Module::placeTensors, py::arg("tensors"), Released(),
           "Note [Placing the model] (driver/model_device.h): moves the model's (name, tensor) "
           "pairs from the CPU to this rank's stage device in place, or raises ConfigError on "
           "every rank when one is on another device. Collective.")
      .def_property_readonly("stage_device",
                             [](const Module& mod) { return mod.stageDevice().str(); })
      .def("named_parameters", &Module::namedParameters)
      .def(
          "local_tensors",
          [](Module& mod) {
            std::vector<at::Tensor> out;
            for (auto& named : mod.executor().params().namedTensors()) out.push_back(named.second);
            return out;
          },
          "Every parameter and buffer this rank holds (after deployment).")
      .def("set_optimizer_state_bytes", &Module::setOptimizerStateBytes, py::arg("bytes"),
           "Bytes of the optimizer state of this rank's parameters (for the measured memory).")
      .def(
          "last_step_memory",
          [](Module& mod) -> py::object {
            const auto& m = mod.executor().lastStepMemory();
            if (!m) return py::none();
            py::dict out;
            out["step"] = m->step;
            out["stage"] = m->stage;
            out["measured"] = m->measuredPeak;
            out["predicted"] = m->predicted;
            out["usable"] = m->usable;
            out["parameters"] = m->parameters;
            out["gradients"] = m->gradients;
            out["optimizer"] = m->optimizer;
            out["transient"] = m->transient;
            return out;
          },
          "This rank's measured memory in the last step against the plan (bytes), or None.")
      .def(
          "deployment_info", [](const Module& mod) { return deploymentInfo(mod.deployment()); },
          "Micro-batches, schedule and per-stage ranks/recompute of the deployment.")
      .def("save_deployment",
           [](const Module& mod, const std::string& path) {
             core::saveDeployment(mod.deployment(), path);
           })
      .def("state_dict", &Module::stateDict, Released(),
           "The whole model's state (key, tensor) on every rank. Collective.")
      .def("slice_state", &Module::sliceState, py::arg("state"),
           "The (key, tensor) pairs with the tensors this rank holds in tensor-parallel slices "
           "cut to its slice.")
      .def("share_state", &Module::shareState, Released(),
           "Writes the current parameters and buffers into every rank's tensors. Collective.")
      .def(
          "allreduce_grads", [](Module& mod) { mod.trainingExecutor().allreduceGrads(); },
          Released(), "Sums the gradients over their holders now (after delay_grad_allreduce).")
      .def(
          "clip_grad_norm",
          [](Module& mod, double maxNorm) { return mod.trainingExecutor().clipGradNorm(maxNorm); },
          py::arg("max_norm"), Released(),
          "Global gradient norm clipping; returns the norm before clipping.")
      .def("set_loss_scale", &Module::setLossScale, py::arg("scale"),
           "The gradient train_step starts each loss's backward from (Note [Dynamic loss "
           "scaling]); the losses it returns are not scaled.")
      .def("unscale_grads", &Module::unscaleGradients, py::arg("scale"), Released(),
           "Divides the training deployment's gradients by scale; returns their global norm, "
           "not finite when any rank's gradients overflowed. Collective.")
      .def(
          "held_slices",
          [](Module& mod) {
            py::list out;
            for (const staging::Executor::HeldSlice& s : mod.trainingExecutor().heldSlices()) {
              py::list parts;
              for (const decomposer::ShardPart& part :
                   decomposer::partsOf(s.shard, s.whole.at(s.shard.dim)))
                parts.append(py::make_tuple(part.size, part.whole));
              out.append(py::make_tuple(s.name, s.shard.dim, py::tuple(parts), s.degree, s.index,
                                        s.whole));
            }
            return out;
          },
          "(name, dim, parts, degree, index, whole shape) of each parameter this rank holds "
          "in tensor-parallel slices (Note [Tensor-parallel parameters]).")
      .def(
          "zero_shards",
          [](Module& mod) {
            py::list out;
            const staging::Executor& executor = mod.trainingExecutor();
            for (const staging::ShardPiece& piece : executor.zeroShards())
              out.append(py::make_tuple(executor.params().tensor(piece.param), piece.offset,
                                        piece.length));
            return out;
          },
          "ZeRO-1: (parameter, offset, length) pieces of the flattened parameters this rank's "
          "optimizer steps; empty without ZeRO-1.")
      .def_property_readonly(
          "zero_stage",
          [](Module& mod) -> py::object {
            for (const core::StageDeployment& s : mod.trainingExecutor().deployment().stages)
              if (s.zero) return py::int_(s.id);
            return py::none();
          },
          "The first stage of the training deployment that runs ZeRO-1, or None.")
      .def(
          "gather_params", [](Module& mod) { mod.trainingExecutor().gatherParams(); }, Released(),
          "ZeRO-1: all-gathers the stepped parameter pieces into every replica. Collective.")
      .def(
          "gather_grads", [](Module& mod) { mod.trainingExecutor().gatherGrads(); }, Released(),
          "ZeRO-1: all-gathers the owned pieces of the summed gradients into every replica's "
          ".grad. Collective.")
      .def_property_readonly("rank", &Module::rank)
      .def_property_readonly("world_size", &Module::worldSize);

  py::register_exception<driver::DryRunFinished>(m, "DryRunFinished", m.attr("Error").ptr());
  m.def(
      "_read_deployment",
      [](const std::string& path) { return deploymentInfo(core::loadDeployment(path)); },
      py::arg("path"), "The fields of a saved deployment file as a dict.");
  m.def(
      "_broadcast",
      [](const at::Tensor& tensor, int root) { world().broadcast(tensor, root, world().world()); },
      py::arg("tensor"), py::arg("root"), Released(),
      "In place, from `root` to every rank. Collective.");
  m.def(
      "_all_gather",
      [](const at::Tensor& tensor) {
        return world().allGather(tensor.contiguous(), world().world());
      },
      py::arg("tensor"), Released(),
      "Every rank's tensor (same shape on all ranks), in rank order.");
  m.def("delay_grad_allreduce", &staging::setDelayGradAllreduce, py::arg("delay"),
        "While true, backward leaves gradients local; model.allreduce_grads() sums them once.");
  m.def(
      "get_rank", [] { return world().rank(); }, "This process's rank (MPI_COMM_WORLD).");
  m.def("get_world_size", [] { return world().worldSize(); });
  m.def(
      "barrier", [] { world().barrier(world().world()); }, Released(),
      "Waits until every rank arrives (fails after comm_timeout_s naming the missing ranks).");
  m.def(
      "_agree",
      [](const std::string& step, const std::string& errorClass, const std::string& message) {
        comm::agreeOnStatus(world(), step, {errorClass, message});
      },
      py::arg("step"), py::arg("error_class") = "", py::arg("message") = "", Released(),
      "Collective: raises on every rank the agreed error when any rank passed an error class.");
  m.def(
      "_agree_call",
      [](const std::string& step, const std::string& errorClass, const std::string& message,
         const std::string& how, const std::vector<at::Tensor>& inputs) {
        std::vector<c10::IValue> values(inputs.begin(), inputs.end());
        driver::agreeOnCall(world(), values, how, {errorClass, message}, step);
      },
      py::arg("step"), py::arg("error_class"), py::arg("message"), py::arg("how"),
      py::arg("inputs"), Released(),
      "Collective: the one exchange of a call (Note [One agreement per call], driver/module.h): "
      "a problem found on any rank, `how` each rank calls the module (method, mode, arguments) "
      "and its input tensors; raises the same error on every rank when anything is wrong or "
      "differs. Then call forward/train_step with agreed=True.");
  m.def("_last_agreed_error", &comm::lastAgreedError);
  m.def(
      "_gather_from_owners",
      [](const staging::NamedTensors& owned, const std::string& how) {
        return staging::gatherFromOwners(world(), owned, how);
      },
      py::arg("owned"), py::arg("how"), Released(),
      "Collective: every rank's owned (name, tensor) pairs, one per name, sorted by name; `how` "
      "names the call (the same on every rank, or every rank raises an error naming each "
      "rank's call).");
  m.def(
      "_log_info",
      [](const std::string& component, const std::string& message) {
        core::logger(component)->info(message);
      },
      py::arg("component"), py::arg("message"));
  m.def(
      "_abort_job", [](const std::string& message) { world().abortJob(message); },
      py::arg("message"), "Logs the message and ends the whole job (MPI_Abort).");
  m.def(
      "_set_option",
      [](const std::string& key, const std::string& value) {
        core::globalConfig().set(key, value, "autostage.Module(" + key + "=...)");
      },
      py::arg("key"), py::arg("value"));
  m.def(
      "_get_option",
      [](const std::string& key) {
        std::string text = core::globalConfig().text(key);
        if (text.size() >= 2 && text.front() == '"' && text.back() == '"')
          text = text.substr(1, text.size() - 2);
        return text;
      },
      py::arg("key"),
      "An option's effective value as text (strings unquoted); ConfigError for an unknown key.");
  m.def(
      "_plans_without_zero",
      [](bool trainable, const std::string& problem) {
        return driver::plansWithoutZero(core::globalConfig(), trainable, problem);
      },
      py::arg("trainable"), py::arg("problem"),
        "Note [Choosing ZeRO-1 for a module] (driver/plan_sources.h): whether this module plans "
        "with zero=0; UnsupportedError for zero=1 with a problem.");
  m.def(
      "show_config", [] { return core::globalConfig().toString(); },
      "Effective option values and where each came from.");
}

}  // namespace autostage::bindings
