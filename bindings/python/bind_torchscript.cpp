#include <pybind11/stl.h>
#include <torch/csrc/jit/python/module_python.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/python/bindings.h"
#include "bindings/python/ivalue_cast.h"
#include "core/error.h"
#include "frontend/torchscript/autocast.h"
#include "frontend/torchscript/exporter.h"
#include "frontend/torchscript/importer.h"

namespace autostage::bindings {
namespace {

namespace py = pybind11;
using torchscript::ExportedFunction;
using torchscript::ImportedModel;

// An exported subgraph with the IR names of its boundary values.
struct ExportedSubgraph {
  ExportedFunction function;
  std::vector<std::string> inputNames;
  std::vector<std::string> outputNames;
};

std::vector<std::string> valueNames(const core::Graph& g, const std::vector<core::ValueId>& ids) {
  std::vector<std::string> names;
  for (core::ValueId v : ids) names.push_back(g.value(v).name);
  return names;
}

std::shared_ptr<ImportedModel> importModule(const py::object& module, const py::sequence& inputs) {
  auto scripted = torch::jit::as_module(module);
  AUTOSTAGE_CHECK(scripted.has_value(), "expected a torch.jit.ScriptModule, got ",
                  std::string(py::str(py::type::handle_of(module))));
  std::vector<c10::IValue> values;
  for (const py::handle& obj : inputs) values.push_back(toIValue(obj));
  return std::make_shared<ImportedModel>(torchscript::importModule(*scripted, values));
}

ExportedSubgraph exportNodes(const ImportedModel& model, const std::vector<core::NodeId>& nodes) {
  ExportedFunction fn = torchscript::exportSubgraph(model.graph, nodes);
  auto inputs = valueNames(model.graph, fn.inputs());
  auto outputs = valueNames(model.graph, fn.outputs());
  return {std::move(fn), std::move(inputs), std::move(outputs)};
}

py::tuple runExported(const ExportedSubgraph& sub, const py::args& args) {
  std::vector<c10::IValue> inputs;
  for (const py::handle& obj : args) inputs.push_back(toIValue(obj));
  std::vector<c10::IValue> outputs;
  {
    py::gil_scoped_release release;
    outputs = sub.function.run(std::move(inputs));
  }
  py::tuple result(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) result[i] = toPython(outputs[i]);
  return result;
}

}  // namespace

void bindTorchscript(py::module_& m) {
  py::class_<ImportedModel, std::shared_ptr<ImportedModel>>(m, "IR")
      .def("__str__", [](const ImportedModel& ir) { return ir.graph.toString(); })
      .def_property_readonly("node_count",
                             [](const ImportedModel& ir) { return ir.graph.nodeCount(); })
      .def_property_readonly("param_names", [](const ImportedModel& ir) { return ir.paramNames; })
      .def_property_readonly("param_tensors",
                             [](const ImportedModel& ir) { return ir.paramTensors; })
      .def_property_readonly(
          "input_names",
          [](const ImportedModel& ir) { return valueNames(ir.graph, ir.graph.batchInputs()); })
      .def_property_readonly(
          "output_names",
          [](const ImportedModel& ir) { return valueNames(ir.graph, ir.graph.outputs()); })
      .def_property_readonly("tuple_output", [](const ImportedModel& ir) { return ir.tupleOutput; })
      .def_property_readonly("front_end", [](const ImportedModel& ir) { return ir.frontEnd; })
      .def_property_readonly("graph_hash", [](const ImportedModel& ir) { return ir.graph.hash(); })
      .def_property_readonly("graph", [](const ImportedModel& ir) { return ir.graph; },
                             "A copy of the IR graph (autostage.Graph).")
      .def("node_kind",
           [](const ImportedModel& ir, core::NodeId id) { return ir.graph.node(id).kind; })
      .def("is_convex",
           [](const ImportedModel& ir, const std::vector<core::NodeId>& nodes) {
             return ir.graph.isConvex(nodes);
           })
      .def("export", &exportNodes, py::arg("node_ids"),
           "Exports a convex node subset as a callable taking its input_names in order.");

  py::class_<ExportedSubgraph>(m, "ExportedSubgraph")
      .def_readonly("input_names", &ExportedSubgraph::inputNames)
      .def_readonly("output_names", &ExportedSubgraph::outputNames)
      .def_property_readonly(
          "graph_text",
          [](const ExportedSubgraph& s) {
            return s.function.graph() ? s.function.graph()->toString(false) : std::string();
          },
          "The TorchScript graph it runs; empty for a torch.export capture (run by the ATen "
          "dispatcher, see executor).")
      .def_property_readonly("executor",
                             [](const ExportedSubgraph& s) { return s.function.executor(); })
      .def("__call__", &runExported, "Runs the subgraph; returns a tuple of its outputs.");

  m.def("_import_module", &importModule, py::arg("script_module"), py::arg("example_inputs"),
        "Imports a torch.jit.ScriptModule's forward as IR (use autostage.trace_to_ir).");
  m.def("_cpu_fp16_autocast", &torchscript::cpuAutocastSupportsFp16,
        "Whether this build runs precision='fp16' on the CPU (Note [fp16 on the CPU]: LibTorch "
        "2.5 or later).");
}

}  // namespace autostage::bindings
