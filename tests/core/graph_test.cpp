#include "core/ir/graph.h"

#include <catch2/catch.hpp>

#include <boost/graph/topological_sort.hpp>

#include "core/error.h"
#include "core/ir/boost_view.h"

using namespace autostage;
using namespace autostage::core;

namespace {

// x -> linear(w1) -> relu -> linear(w2) -> sum (loss); a side branch relu -> neg feeds add.
//   n0 linear(x, w1)   n1 relu   n2 neg(n1)   n3 add(n1, n2)   n4 linear(n3, w2)   n5 sum
Graph smallGraph() {
  Graph g("small");
  ValueId x = g.addInput("x", Type::tensor(DType::Float32, {8, 4}), ValueClass::Batch);
  ValueId w1 = g.addInput("fc1.weight", Type::tensor(DType::Float32, {4, 4}, true), ValueClass::Param);
  ValueId w2 = g.addInput("fc2.weight", Type::tensor(DType::Float32, {2, 4}, true), ValueClass::Param);
  auto t = [](std::vector<int64_t> s) { return Type::tensor(DType::Float32, std::move(s)); };
  NodeId n0 = g.addNode("aten::linear", {x, w1}, {t({8, 4})}, {}, "fc1");
  NodeId n1 = g.addNode("aten::relu", {g.node(n0).outputs[0]}, {t({8, 4})});
  NodeId n2 = g.addNode("aten::neg", {g.node(n1).outputs[0]}, {t({8, 4})});
  NodeId n3 = g.addNode("aten::add", {g.node(n1).outputs[0], g.node(n2).outputs[0]}, {t({8, 4})});
  NodeId n4 = g.addNode("aten::linear", {g.node(n3).outputs[0], w2}, {t({8, 2})}, {}, "fc2");
  NodeId n5 = g.addNode("aten::sum", {g.node(n4).outputs[0]}, {t({})});
  g.addOutput(g.node(n5).outputs[0]);
  g.classifyValues();
  return g;
}

}  // namespace

TEST_CASE("graph building keeps producers, uses and topological order", "[core]") {
  Graph g = smallGraph();
  REQUIRE_NOTHROW(g.verify());
  REQUIRE(g.nodeCount() == 6);
  REQUIRE(g.consumers(g.node(1).outputs[0]) == std::vector<NodeId>{2, 3});
  REQUIRE(g.predecessors(3) == std::vector<NodeId>{1, 2});
  REQUIRE(g.successors(1) == std::vector<NodeId>{2, 3});
  REQUIRE(g.producer(g.inputs()[0]) == kNoNode);
  REQUIRE(g.topologicalOrder() == std::vector<NodeId>{0, 1, 2, 3, 4, 5});
  REQUIRE(g.paramInputs().size() == 2);
  REQUIRE(g.batchInputs() == std::vector<ValueId>{0});
}

TEST_CASE("value classes propagate from inputs and mark the loss", "[core]") {
  Graph g = smallGraph();
  REQUIRE(g.value(g.node(0).outputs[0]).cls == ValueClass::Batch);
  REQUIRE(g.value(g.outputs()[0]).cls == ValueClass::Loss);

  Graph p("params");
  ValueId w = p.addInput("w", Type::tensor(DType::Float32, {4}), ValueClass::Param);
  NodeId c = p.addNode("prim::Constant", {}, {Type::scalar(TypeKind::Int)}, {{"value", int64_t{2}}});
  NodeId m = p.addNode("aten::mul", {w, p.node(c).outputs[0]}, {Type::tensor(DType::Float32, {4})});
  p.addOutput(p.node(m).outputs[0]);
  p.classifyValues();
  REQUIRE(p.value(p.node(c).outputs[0]).cls == ValueClass::Const);
  REQUIRE(p.value(p.node(m).outputs[0]).cls == ValueClass::Param);
}

TEST_CASE("convexity: a subset that skips a node on a path between its members is not convex", "[core]") {
  Graph g = smallGraph();
  REQUIRE(g.isConvex({0, 1, 2}));
  REQUIRE(g.isConvex({1, 2, 3}));
  REQUIRE(g.isConvex({3, 4, 5}));
  REQUIRE(g.isConvex({2}));
  REQUIRE_FALSE(g.isConvex({1, 3}));     // 1 -> 2 -> 3 leaves and re-enters
  REQUIRE_FALSE(g.isConvex({0, 4}));     // path through 1..3
  REQUIRE(g.isConvex({}));
}

TEST_CASE("boundary lists values entering and leaving a subset", "[core]") {
  Graph g = smallGraph();
  Boundary b = g.boundary({1, 2, 3});
  REQUIRE(b.inputs == std::vector<ValueId>{g.node(0).outputs[0]});
  REQUIRE(b.outputs == std::vector<ValueId>{g.node(3).outputs[0]});
  Boundary whole = g.boundary({0, 1, 2, 3, 4, 5});
  REQUIRE(whole.inputs == std::vector<ValueId>{0, 1, 2});
  REQUIRE(whole.outputs == g.outputs());
  Boundary head = g.boundary({0, 1});
  REQUIRE(head.outputs == std::vector<ValueId>{g.node(1).outputs[0]});  // used by 2 and 3
}

TEST_CASE("text form round-trips exactly, including attributes and bodies", "[core]") {
  Graph g("attrs");
  ValueId x = g.addInput("x", Type::tensor(DType::Float32, {2, -1}, false), ValueClass::Batch);
  TensorData td{DType::Int64, {2}, std::string("\x01\x00\x00\x00\x00\x00\x00\x00\xff\x00\x00\x00\x00\x00\x00\x00", 16)};
  std::vector<Attribute> attrs = {{"i", int64_t{-3}},
                                  {"f", 0.1},
                                  {"s", std::string("a \"quoted\"\nline\\")},
                                  {"is", std::vector<int64_t>{1, -2}},
                                  {"fs", std::vector<double>{1e-30, -2.5}},
                                  {"ss", std::vector<std::string>{"x", ""}},
                                  {"t", td}};
  NodeId n = g.addNode("prim::Constant", {}, {Type::list(Type::scalar(TypeKind::Int))}, attrs, "a.b");
  NodeId l = g.addNode("prim::Loop", {x, g.node(n).outputs[0]},
                       {Type::tuple({Type::unknownTensor(), Type::optional(Type::scalar(TypeKind::Float))}),
                        Type::other("__torch__.Foo")});
  g.setBody(l, "graph(%a : Tensor):\n  -> (%a)\n");
  g.addOutput(g.node(l).outputs[0]);
  std::string text = g.toString();
  Graph back = Graph::parse(text);
  REQUIRE(back.toString() == text);
  REQUIRE(back.node(0).attributes == attrs);
  REQUIRE(back.node(1).body == g.node(1).body);
  REQUIRE(back.node(0).scope == "a.b");
  REQUIRE(back.value(x).type == g.value(x).type);
  REQUIRE(back.hash() == g.hash());

  Graph s = smallGraph();
  REQUIRE(Graph::parse(s.toString()).toString() == s.toString());
}

TEST_CASE("parse reports truncated and malformed text with a line number", "[core]") {
  std::string text = smallGraph().toString();
  std::string truncated = text.substr(0, text.find("return"));
  REQUIRE_THROWS_WITH(Graph::parse(truncated), Catch::Contains("truncated"));
  std::string undefined = text;
  undefined.replace(undefined.find("%fc1.weight)"), 11, "%nope");
  REQUIRE_THROWS_AS(Graph::parse(undefined), FormatError);
  REQUIRE_THROWS_WITH(Graph::parse(undefined), Catch::Contains("line 2") && Catch::Contains("%nope"));
  REQUIRE_THROWS_WITH(Graph::parse("graph g(%x : Flaot(2) BATCH):\n  return (%x)\n"),
                      Catch::Contains("Flaot"));
}

TEST_CASE("types print, parse and measure", "[core]") {
  for (const char* text : {"Float(8, 16, requires_grad)", "Long(scalar)", "Tensor", "int[]",
                           "(Tensor, int?)", "float[][]", "NoneType", "str", "Device",
                           "Half(*, 4)", "Other<__torch__.M>", "Float(6, 32, not_batch_major)",
                           "Float(6, requires_grad, not_batch_major)"})
    REQUIRE(Type::parse(text).toString() == text);
  // Note [Rows of a value]: the mark is part of the type (and so of the graph's text and hash).
  Type perExpert = Type::parse("Float(6, 32, not_batch_major)");
  REQUIRE(perExpert.notBatchMajor());
  REQUIRE(perExpert != Type::tensor(DType::Float32, {6, 32}));
  REQUIRE(perExpert == Type::tensor(DType::Float32, {6, 32}).withNotBatchMajor());
  REQUIRE_THROWS_AS(Type::parse("Float(not_batch_major)"), FormatError);
  REQUIRE_THROWS_AS(Type::parse("Float(scalar, not_batch_major)"), FormatError);
  REQUIRE(Type::tensor(DType::Float16, {3, 5}).bytes() == 30);
  REQUIRE(Type::tensor(DType::Float32, {-1, 5}).bytes() == -1);
  REQUIRE(Type::tensor(DType::Float32, {4, 5}).withBatchSize(2).shape() == std::vector<int64_t>{2, 5});
  REQUIRE_THROWS_AS(Type::parse("Float(2"), FormatError);
}

TEST_CASE("boost view has one edge per dependent node pair", "[core]") {
  Graph g = smallGraph();
  BoostGraph bg = toBoostGraph(g);
  REQUIRE(boost::num_vertices(bg) == 6);
  REQUIRE(boost::num_edges(bg) == 6);  // 0-1, 1-2, 1-3, 2-3, 3-4, 4-5
  std::vector<size_t> order;
  boost::topological_sort(bg, std::back_inserter(order));
  REQUIRE(order.front() == 5);  // reverse topological order
}
