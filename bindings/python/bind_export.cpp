// The torch.export front end's builder: autostage/export.py walks the exported program and
// writes the IR through it (Note [Export node kinds] in frontend/export/interpreter.h).
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/python/bindings.h"
#include "core/error.h"
#include "core/log.h"
#include "frontend/torchscript/importer.h"

namespace autostage::bindings {
namespace {

namespace py = pybind11;
using torchscript::ImportedModel;

// A constant's Python value as the IR attribute `value` (bool as int, like TorchScript's).
core::AttributeValue attributeOf(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return int64_t(value.cast<bool>());
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    bool floats = false;
    for (const py::handle& e : value) floats = floats || py::isinstance<py::float_>(e);
    if (floats) return value.cast<std::vector<double>>();
    std::vector<int64_t> ints;
    for (const py::handle& e : value)
      ints.push_back(py::isinstance<py::bool_>(e) ? int64_t(e.cast<bool>()) : e.cast<int64_t>());
    return ints;
  }
  throw UnsupportedError("unsupported constant " + std::string(py::repr(value)) +
                         " in the exported program: expected bool, int, float, str or a list");
}

class ExportBuilder {
 public:
  explicit ExportBuilder(const std::string& name)
      : model_(std::make_shared<ImportedModel>(ImportedModel{core::Graph(name), {}, {}, false})) {
    model_->frontEnd = "torch.export";
  }

  core::ValueId addInput(const std::string& name, const std::string& type, bool param) {
    return model_->graph.addInput(name, core::Type::parse(type),
                                  param ? core::ValueClass::Param : core::ValueClass::Batch);
  }

  std::vector<core::ValueId> addNode(const std::string& kind,
                                     const std::vector<core::ValueId>& inputs,
                                     const std::vector<std::string>& outputTypes,
                                     const std::vector<std::string>& outputNames,
                                     const py::object& constant, const std::string& scope) {
    std::vector<core::Type> types;
    for (const std::string& t : outputTypes) types.push_back(core::Type::parse(t));
    std::vector<core::Attribute> attributes;
    if (!constant.is_none()) attributes.push_back({"value", attributeOf(constant)});
    core::NodeId id =
        model_->graph.addNode(kind, inputs, types, std::move(attributes), scope, outputNames);
    return model_->graph.node(id).outputs;
  }

  void addOutput(core::ValueId value) { model_->graph.addOutput(value); }

  // Completes the import: the parameter tensors (the model's own, one per PARAM input in order).
  std::shared_ptr<ImportedModel> finish(const std::vector<at::Tensor>& tensors,
                                        const std::vector<std::string>& names, bool tupleOutput,
                                        int64_t fixedBatchRows) {
    AUTOSTAGE_INTERNAL_ASSERT(
        tensors.size() == model_->graph.paramInputs().size() && names.size() == tensors.size(),
        "export builder: ", tensors.size(), " parameter tensors for ",
        model_->graph.paramInputs().size(), " parameter inputs");
    model_->paramTensors = tensors;
    model_->paramNames = names;
    model_->tupleOutput = tupleOutput;
    model_->fixedBatchRows = fixedBatchRows;
    model_->graph.classifyValues();
    model_->graph.verify();
    core::logger("Module")->debug(
        "imported '{}' from torch.export: {} nodes, {} parameters/buffers", model_->graph.name(),
        model_->graph.nodeCount(), names.size());
    return model_;
  }

 private:
  std::shared_ptr<ImportedModel> model_;
};

}  // namespace

void bindExport(py::module_& m) {
  py::class_<ExportBuilder>(m, "_ExportBuilder")
      .def(py::init<const std::string&>(), py::arg("name"))
      .def("add_input", &ExportBuilder::addInput, py::arg("name"), py::arg("type"),
           py::arg("param"))
      .def("add_node", &ExportBuilder::addNode, py::arg("kind"), py::arg("inputs"),
           py::arg("output_types"), py::arg("output_names"), py::arg("constant"), py::arg("scope"))
      .def("add_output", &ExportBuilder::addOutput, py::arg("value"))
      .def("finish", &ExportBuilder::finish, py::arg("tensors"), py::arg("names"),
           py::arg("tuple_output"), py::arg("fixed_batch_rows") = 0);
}

}  // namespace autostage::bindings
