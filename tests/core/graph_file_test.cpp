#include "core/proto/graph_file.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/proto/file_format.h"
#include "tests/core/scratch_files.h"

using namespace autostage;
using namespace autostage::core;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return testing::scratchPath("graph_file_test", name); }

std::string readBytes(const fs::path& path) { return testing::readFileBytes(path); }

Type floatTensor(std::vector<int64_t> shape, bool requiresGrad = false) {
  return Type::tensor(DType::Float32, std::move(shape), requiresGrad);
}

// A graph that exercises every part of the encoding: every attribute alternative (including
// tensor bytes with NULs and non-UTF-8 strings), nested tuple/list/optional/Other types, unknown
// shapes and dims, scopes, bodies, a node without outputs, renamed duplicate names, explicit
// classes and a repeated graph output.
Graph richGraph() {
  Graph g("rich graph");
  ValueId x = g.addInput("x", floatTensor({8, 16}), ValueClass::Batch);
  ValueId x2 = g.addInput("x", floatTensor({-1, 16}), ValueClass::Batch);  // renamed "x.1"
  ValueId w = g.addInput("fc.weight", floatTensor({4, 16}, true), ValueClass::Param);
  ValueId mask = g.addInput("mask", Type::parse("Bool"), ValueClass::Batch);
  ValueId any = g.addInput("", Type::unknownTensor(), ValueClass::Param);  // named by id
  ValueId grad = g.addInput("g", Type::parse("Double(requires_grad)"), ValueClass::Param);
  ValueId h =
      g.addInput("h", Type::optional(Type::tensor(DType::BFloat16, {-1, 16})), ValueClass::Batch);

  auto constant = [&](AttributeValue value, Type type) {
    return g.node(g.addNode("prim::Constant", {}, {std::move(type)}, {{"value", std::move(value)}}))
        .outputs[0];
  };
  ValueId i = constant(int64_t{-7}, Type::scalar(TypeKind::Int));
  ValueId f = constant(0.1, Type::scalar(TypeKind::Float));
  ValueId s = constant(std::string("caf\xc3\xa9 \xff\x00!", 9), Type::scalar(TypeKind::String));
  ValueId is =
      constant(std::vector<int64_t>{1, -2, INT64_MAX}, Type::list(Type::scalar(TypeKind::Int)));
  ValueId fs =
      constant(std::vector<double>{-0.0, 1e-300, 3.5}, Type::list(Type::scalar(TypeKind::Float)));
  ValueId ss = constant(std::vector<std::string>{"a", "", "b\nc"},
                        Type::list(Type::scalar(TypeKind::String)));
  TensorData t{
      DType::Float16, {2, 3}, std::string("\x00\x3c\x00\x00\xff\x7b\x01\x02\x03\x04\x05\x06", 12)};
  ValueId tensor = constant(t, Type::tensor(DType::Float16, {2, 3}));
  ValueId dev = constant(std::string("cpu"), Type::scalar(TypeKind::Device));
  ValueId none = g.node(g.addNode("prim::Constant", {}, {Type::scalar(TypeKind::None)})).outputs[0];

  NodeId lin =
      g.addNode("aten::linear", {x, w, none}, {floatTensor({8, 4})}, {}, "layers.0.fc", {"y"});
  ValueId y = g.node(lin).outputs[0];
  Type tupleType =
      Type::tuple({floatTensor({8, 4}).withNotBatchMajor(),  // Note [Rows of a value]
                   Type::list(Type::optional(Type::scalar(TypeKind::Bool))),
                   Type::other("__torch__.Foo"), Type::tuple({})});
  NodeId tup =
      g.addNode("prim::TupleConstruct", {y, i, mask, y}, {tupleType},
                {{"n", int64_t{3}}, {"mode", std::string("x")}, {"alpha", 2.5}}, "layers.1");
  NodeId loop =
      g.addNode("prim::Loop", {i, x2, g.node(tup).outputs[0]},
                {floatTensor({-1, 16}), Type::scalar(TypeKind::Int)}, {}, "layers.2", {"carried"});
  g.setBody(loop, "block0(%i : int, %a : Tensor):\n  %b = aten::relu(%a)\n  -> (%b)\n");
  g.addNode("prim::RaiseException", {s, f, is, fs, ss, tensor, dev, any, grad, h}, {});
  NodeId sum =
      g.addNode("aten::sum", {g.node(loop).outputs[0]}, {Type::tensor(DType::Float32, {})});
  ValueId loss = g.node(sum).outputs[0];
  g.addOutput(loss);
  g.addOutput(g.node(loop).outputs[1]);
  g.addOutput(loss);
  g.classifyValues();
  g.setValueClass(g.node(loop).outputs[1], ValueClass::Const);
  return g;
}

// Field-by-field comparison, independent of the text form.
void requireSameGraph(const Graph& a, const Graph& b) {
  REQUIRE(a.name() == b.name());
  REQUIRE(a.inputs() == b.inputs());
  REQUIRE(a.outputs() == b.outputs());
  REQUIRE(a.valueCount() == b.valueCount());
  for (size_t v = 0; v < a.valueCount(); ++v) {
    const Value& va = a.values()[v];
    const Value& vb = b.values()[v];
    REQUIRE(va.name == vb.name);
    REQUIRE(va.type == vb.type);
    REQUIRE(va.cls == vb.cls);
    REQUIRE(va.producer == vb.producer);
    REQUIRE(va.outputIndex == vb.outputIndex);
    REQUIRE(va.uses == vb.uses);
  }
  REQUIRE(a.nodeCount() == b.nodeCount());
  for (size_t n = 0; n < a.nodeCount(); ++n) {
    const Node& na = a.nodes()[n];
    const Node& nb = b.nodes()[n];
    REQUIRE(na.kind == nb.kind);
    REQUIRE(na.inputs == nb.inputs);
    REQUIRE(na.outputs == nb.outputs);
    REQUIRE(na.attributes == nb.attributes);
    REQUIRE(na.scope == nb.scope);
    REQUIRE(na.body == nb.body);
  }
  REQUIRE(a.toString() == b.toString());
  REQUIRE(a.hash() == b.hash());
}

std::string frame(const proto::Graph& message) {
  return encodeFramed(kGraphFileKind, kGraphFormatVersion, message.SerializeAsString());
}

}  // namespace

TEST_CASE("graph files round-trip every type, attribute, scope and body", "[core][proto]") {
  Graph g = richGraph();
  REQUIRE_NOTHROW(g.verify());
  REQUIRE(g.value(1).name == "x.1");
  REQUIRE(g.value(4).name == "4");
  std::string path = scratch("rich.graph").string();
  saveGraph(g, path);
  Graph back = loadGraph(path);
  requireSameGraph(g, back);
  REQUIRE(back == g);
  REQUIRE(std::get<TensorData>(back.node(6).attributes[0].value).bytes.size() == 12);
  // The file holds exactly the encoded bytes, and encoding is deterministic.
  REQUIRE(readBytes(path) == encodeGraph(g));
  REQUIRE(encodeGraph(g) == encodeGraph(back));
  requireSameGraph(g, decodeGraph(encodeGraph(g)));
}

TEST_CASE("an empty graph round-trips", "[core][proto]") {
  Graph empty("empty");
  requireSameGraph(empty, decodeGraph(encodeGraph(empty)));
}

TEST_CASE("every truncation and a flipped payload byte of a graph file are FormatErrors",
          "[core][proto]") {
  std::string good = encodeGraph(richGraph());
  for (size_t cut = 0; cut < good.size(); ++cut)
    REQUIRE_THROWS_AS(decodeGraph(good.substr(0, cut)), FormatError);
  std::string flipped = good;
  flipped[flipped.size() - 40] ^= 0x01;
  REQUIRE_THROWS_WITH(decodeGraph(flipped, "g.bin"),
                      Catch::Contains("g.bin") && Catch::Contains("corrupted"));
}

TEST_CASE("a graph reader refuses other kinds and versions", "[core][proto]") {
  std::string payload = toProto(richGraph()).SerializeAsString();
  REQUIRE_THROWS_WITH(decodeGraph(encodeFramed("profile", 1, payload)),
                      Catch::Contains("is a profile file, expected a graph file"));
  REQUIRE_THROWS_WITH(
      decodeGraph(encodeFramed("graph", 2, payload)),
      Catch::Contains("graph format version 2") && Catch::Contains("reads version 1"));
  REQUIRE_THROWS_WITH(loadGraph(scratch("missing.graph").string()),
                      Catch::Contains("cannot open graph file"));
}

TEST_CASE("inconsistent graph messages are FormatErrors naming the node or value",
          "[core][proto]") {
  const Graph g = richGraph();
  const proto::Graph good = toProto(g);
  REQUIRE_NOTHROW(decodeGraph(frame(good)));
  const int lin = 9;  // aten::linear: inputs x, fc.weight, none
  REQUIRE(good.nodes(lin).kind() == "aten::linear");
  // Decodes `good` changed by `mutate`; requires a FormatError whose message holds every part.
  auto requireRefused = [&](auto&& mutate, std::initializer_list<std::string> parts) {
    proto::Graph bad = good;
    mutate(bad);
    std::string message = "no error";
    try {
      decodeGraph(frame(bad), "bad.graph");
    } catch (const FormatError& e) {
      message = e.what();
    }
    REQUIRE_THAT(message, Catch::StartsWith("bad.graph: "));
    for (const std::string& part : parts) REQUIRE_THAT(message, Catch::Contains(part));
  };
  using P = proto::Graph;

  SECTION("input value id out of range") {
    requireRefused([](P& m) { m.mutable_nodes(lin)->set_inputs(1, 999); },
                   {"node 9 (aten::linear) input 1 refers to value 999", "expected an id in 0.."});
    requireRefused([](P& m) { m.mutable_nodes(lin)->set_inputs(0, -1); },
                   {"node 9 (aten::linear)", "value -1"});
  }
  SECTION("input produced by a later node") {
    int later = good.nodes(lin + 1).outputs(0);
    requireRefused([&](P& m) { m.mutable_nodes(lin)->set_inputs(0, later); },
                   {"node 9 (aten::linear)", "refers to value " + std::to_string(later)});
  }
  SECTION("duplicate value id") {
    requireRefused([](P& m) { m.mutable_values(5)->set_id(4); },
                   {"value entry 5", "has id 4, expected 5"});
  }
  SECTION("output ids not dense") {
    int id = good.nodes(lin).outputs(0);
    requireRefused([&](P& m) { m.mutable_nodes(lin)->set_outputs(0, id + 1); },
                   {"node 9 (aten::linear) output 0 has value id " + std::to_string(id + 1),
                    "expected " + std::to_string(id)});
    requireRefused([&](P& m) { m.mutable_nodes(lin)->add_outputs(id + 5); },
                   {"node 9 (aten::linear) output 1 has value id " + std::to_string(id + 5),
                    "expected " + std::to_string(id + 1)});
  }
  SECTION("values that belong to no node") {
    requireRefused([](P& m) { m.add_values()->set_id(m.values_size() - 1); },
                   {"are neither graph inputs nor node outputs"});
  }
  SECTION("graph inputs not first") {
    requireRefused([](P& m) { m.set_inputs(2, 3); },
                   {"graph input 2 refers to value 3", "expected 2"});
  }
  SECTION("graph output out of range") {
    requireRefused([](P& m) { m.add_outputs(5000); }, {"graph output 3 refers to value 5000"});
  }
  SECTION("duplicate or invalid value name") {
    requireRefused([](P& m) { m.mutable_values(2)->set_name("x"); },
                   {"value 2 ('x')", "valid, unique value name"});
    requireRefused([](P& m) { m.mutable_values(2)->set_name("a b"); },
                   {"value 2 ('a b')", "would rename it 'a_b'"});
  }
  SECTION("unknown enum values") {
    requireRefused([](P& m) { m.mutable_values(0)->mutable_type()->set_kind(proto::TypeKind(99)); },
                   {"value 0 ('x')", "unknown type kind 99"});
    requireRefused(
        [](P& m) { m.mutable_values(0)->mutable_type()->set_dtype(proto::DTYPE_UNSPECIFIED); },
        {"value 0 ('x')", "unknown dtype 0"});
    requireRefused([](P& m) { m.mutable_values(3)->set_cls(proto::ValueClass(7)); },
                   {"value 3 ('mask')", "unknown value class 7"});
    int y = good.nodes(lin).outputs(0);
    requireRefused([&](P& m) { m.mutable_values(y)->set_cls(proto::VALUE_CLASS_UNSPECIFIED); },
                   {"('y')", "unknown value class 0"});
  }
  SECTION("malformed types and attributes") {
    requireRefused([](P& m) { m.mutable_values(6)->mutable_type()->clear_elements(); },
                   {"value 6 ('h')", "exactly 1 element type, found 0"});
    requireRefused([](P& m) { m.mutable_nodes(0)->mutable_attributes(0)->clear_value(); },
                   {"node 0 (prim::Constant) attribute 'value'", "has no value"});
    requireRefused(
        [](P& m) {
          m.mutable_nodes(6)->mutable_attributes(0)->mutable_tensor()->set_dtype(proto::DType(42));
        },
        {"node 6 (prim::Constant) attribute 'value'", "unknown tensor dtype 42"});
  }
}

TEST_CASE("random byte changes in a graph payload never crash the decoder", "[core][proto]") {
  const std::string payload = toProto(richGraph()).SerializeAsString();
  std::mt19937 random(12345);
  int decoded = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = payload;
    for (int k = 0; k < 1 + trial % 3; ++k)
      bad[random() % bad.size()] = static_cast<char>(random() % 256);
    std::string bytes = encodeFramed(kGraphFileKind, kGraphFormatVersion, bad);
    try {
      Graph g = decodeGraph(bytes);
      g.verify();
      ++decoded;
    } catch (const FormatError&) {
      ++refused;  // any other exception type fails the test
    }
  }
  REQUIRE(decoded + refused == 3000);
  REQUIRE(refused > 0);
}
