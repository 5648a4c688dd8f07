#include <pybind11/stl.h>

#include "bindings/python/bindings.h"
#include "core/error.h"
#include "core/ir/graph.h"
#include "core/proto/graph_file.h"

namespace autostage::bindings {

namespace py = pybind11;

void bindCore(py::module_& m) {
  m.attr("__version__") = AUTOSTAGE_VERSION;
  // pybind11 tries translators newest first, so subclasses registered after the base win.
  auto& base = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<ConfigError>(m, "ConfigError", base.ptr());
  py::register_exception<FormatError>(m, "FormatError", base.ptr());
  py::register_exception<UnsupportedError>(m, "UnsupportedError", base.ptr());
  py::register_exception<PlanError>(m, "PlanError", base.ptr());
  py::register_exception<CommError>(m, "CommError", base.ptr());
  py::register_exception<InternalError>(m, "InternalError", base.ptr());

  py::class_<core::Graph>(m, "Graph", "An autostage IR graph (no parameter values).")
      .def("__str__", &core::Graph::toString)
      .def_property_readonly("name", &core::Graph::name)
      .def_property_readonly("node_count", &core::Graph::nodeCount)
      .def_property_readonly("value_count", &core::Graph::valueCount)
      .def_property_readonly("graph_hash", &core::Graph::hash)
      .def("__eq__", &core::Graph::operator==)
      .def_static("parse", &core::Graph::parse, py::arg("text"), "Graph from its text form.");
  m.def("_save_graph", &core::saveGraph, py::arg("graph"), py::arg("path"));
  m.def("_load_graph", &core::loadGraph, py::arg("path"));
}

}  // namespace autostage::bindings
