#include "frontend/torchscript/importer.h"

#include <torch/csrc/jit/ir/irparser.h>

#include "catch_torch.h"
#include <set>

#include "core/error.h"
#include "test_models.h"

namespace autostage::torchscript {
namespace {

using testing::makeMlp;

const core::Node* findNode(const core::Graph& g, const std::string& kind) {
  for (const auto& n : g.nodes())
    if (n.kind == kind) return &n;
  return nullptr;
}

TEST_CASE("import MLP: inputs, parameters, shapes", "[torchscript]") {
  torch::manual_seed(0);
  torch::jit::Module m = makeMlp();
  ImportedModel model = importModule(m, {torch::randn({4, 8})});
  const core::Graph& g = model.graph;

  REQUIRE(g.batchInputs().size() == 1);
  CHECK(g.value(g.batchInputs()[0]).name == "x");
  CHECK(g.value(g.batchInputs()[0]).type == core::Type::tensor(core::DType::Float32, {4, 8}));

  std::set<std::string> names(model.paramNames.begin(), model.paramNames.end());
  CHECK(names == std::set<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  REQUIRE(model.paramTensors.size() == g.paramInputs().size());
  std::map<std::string, at::Tensor> own;
  for (const auto& p : m.named_parameters(true)) own[p.name] = p.value;
  for (size_t i = 0; i < model.paramNames.size(); ++i) {
    CHECK(model.paramTensors[i].is_same(own.at(model.paramNames[i])));
    CHECK(g.value(g.paramInputs()[i]).name == model.paramNames[i]);
  }

  // define()d modules carry no shapes; they come from the example run.
  for (const auto& v : g.values())
    if (v.type.isTensor()) CHECK(v.type.shapeKnown());
  REQUIRE(g.outputs().size() == 1);
  CHECK(g.value(g.outputs()[0]).type.shape() == std::vector<int64_t>{4, 3});
  CHECK(g.value(g.outputs()[0]).type.requiresGrad());
  CHECK(!model.tupleOutput);
}

TEST_CASE("import records the module path as scope", "[torchscript]") {
  ImportedModel model = importModule(makeMlp(), {torch::randn({2, 8})});
  std::set<std::string> matmulScopes;
  for (const auto& n : model.graph.nodes())
    if (n.kind == "aten::matmul") matmulScopes.insert(n.scope);
  CHECK(matmulScopes == std::set<std::string>{"fc1", "fc2"});
  const core::Node* relu = findNode(model.graph, "aten::relu");
  REQUIRE(relu);
  CHECK(relu->scope.empty());
}

TEST_CASE("imported graph survives the IR text round trip", "[torchscript]") {
  ImportedModel model = importModule(testing::makeLoopModel(), {torch::randn({3, 8})});
  std::string text = model.graph.toString();
  CHECK(core::Graph::parse(text).toString() == text);
}

TEST_CASE("import does not modify the module's tensors", "[torchscript]") {
  torch::jit::Module m = makeMlp();
  std::vector<at::Tensor> before;
  for (const auto& p : m.parameters()) before.push_back(p.clone());
  importModule(m, {torch::randn({2, 8})});
  size_t i = 0;
  for (const auto& p : m.parameters()) {
    CHECK(torch::equal(p, before[i++]));
    CHECK(!p.grad().defined());
  }
}

TEST_CASE("loop body is kept as TorchScript text that round-trips", "[torchscript]") {
  ImportedModel model = importModule(testing::makeLoopModel(), {torch::randn({3, 8})});
  const core::Node* loop = findNode(model.graph, "prim::Loop");
  REQUIRE(loop);
  REQUIRE(!loop->body.empty());
  auto parsed = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(loop->body, parsed.get());
  CHECK(parsed->toString(false) == loop->body);
  // The loop reads w and b from the enclosing graph: they are extra inputs of the IR node.
  CHECK(parsed->inputs().size() == loop->inputs.size());
  std::set<std::string> inputNames;
  for (core::ValueId v : loop->inputs) inputNames.insert(model.graph.value(v).name);
  CHECK(inputNames.count("w") == 1);
  CHECK(inputNames.count("b") == 1);
}

TEST_CASE("unsupported constructs are named", "[torchscript]") {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const UnsupportedError& e) {
      return std::string(e.what());
    }
    return std::string("<no UnsupportedError>");
  };
  CHECK_THAT(message([] {
               importModule(testing::makeDictOutputModel(), {torch::randn({2, 3})});
             }),
             Catch::Contains("dict output"));
  CHECK_THAT(message([] {
               importModule(testing::makeKwargModel(), {torch::randn({2, 3})});
             }),
             Catch::Contains("keyword-only argument 'scale'"));
  CHECK_THAT(message([] {
               importModule(makeMlp(), {torch::randn({2, 8}, at::kComplexFloat)});
             }),
             Catch::Contains("ComplexFloat"));
  CHECK_THAT(message([] { importModule(makeMlp(), {c10::IValue(int64_t(3))}); }),
             Catch::Contains("model input 'x'"));
}

}  // namespace
}  // namespace autostage::torchscript
