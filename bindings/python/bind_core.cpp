#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings/python/bindings.h"
#include "core/error.h"
#include "core/ir/graph.h"
#include "core/proto/graph_file.h"
#include "decomposer/tensor_parallel_patterns.h"
#include "decomposer/tensor_parallel_split.h"

namespace autostage::bindings {

namespace py = pybind11;

namespace {

// Note [Tensor-parallel patterns]: (kind, scope of its first node, names of its nodes' first
// outputs, the degrees of 2, 4 and 8 it splits at in a stage holding the whole graph) per
// pattern, in node order.
using PatternRow = std::tuple<std::string, std::string, std::vector<std::string>, std::vector<int>>;
std::vector<PatternRow> shardPatterns(const core::Graph& g) {
  using V = decomposer::ShardPattern::Vocabulary;
  const std::vector<decomposer::ShardPattern> patterns = decomposer::findShardPatterns(g);
  const decomposer::SplitDegrees split = decomposer::splitDegrees(g, patterns);
  std::vector<PatternRow> result;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const decomposer::ShardPattern& p = patterns[i];
    const std::string kind = p.vocabulary == V::Embedding ? "embedding"
                             : p.vocabulary == V::Head    ? "lm_head"
                             : p.attention                ? "attention"
                                                          : "mlp";
    std::vector<std::string> names;
    for (core::NodeId n : p.nodes)
      if (!g.node(n).outputs.empty()) names.push_back(g.value(g.node(n).outputs[0]).name);
    std::vector<int> degrees;
    for (int t : {2, 4, 8})
      if (split.degrees[i] & (1u << t)) degrees.push_back(t);
    const core::NodeId first = p.vocabulary == V::Head ? p.head : p.nodes.front();
    result.emplace_back(kind, g.node(first).scope, names, degrees);
  }
  return result;
}

}  // namespace

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
  m.def("_shard_patterns", &shardPatterns, py::arg("graph"));
}

}  // namespace autostage::bindings
