// Tensor-parallel stages on thread ranks (Note [Tensor-parallel stages] in
// staging/tensor_parallel.h): a transformer block (attention with 4 heads and an MLP) trained
// with one stage of tp=2 (also recomputed), with tp=2 x 2 replicas, and as 2 stages of tp=2,
// against the plain module on the same data: the loss, the gathered state after an SGD step on
// every rank's own (sliced) parameters, and that the sharded parameters are really slices; and
// its dropouts drawing the group's masks (Note [Tensor-parallel dropout]). Also a vocabulary
// embedding and an LM head split over the vocabulary, the head's loss computed on the slices
// (Note [Vocabulary-parallel loss]), its operators against torch's losses.
#include "staging/tensor_parallel.h"

#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <set>

#include "catch_torch.h"
#include "comm/thread_backend.h"
#include "decomposer/tensor_parallel_patterns.h"
#include "driver/module.h"
#include "driver/split_models.h"
#include "profiler/profiler.h"
#include "staging/tensor_parallel_ops.h"
#include "test_support.h"

namespace autostage::driver {
namespace {

using namespace staging;
using testing::allClose;
using testing::makeLinear;

constexpr int64_t kLocal = 4;
constexpr double kLr = 0.1;

// Attention over q, k, v of [N, heads, 4, 4] (K and V of one head broadcast over Q's heads)
// with the output projection `o`, then a residual tanh MLP; the loss against y.
constexpr const char* kHeadsThenMlp = R"(
def heads_then_mlp(self, q, k, v, x, y):
    att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / 2.0, dim=-1)
    o = torch.matmul(att, v).transpose(1, 2).reshape(-1, 4, 16)
    h = x + self.o.forward(o)
    h = h + self.down.forward(torch.tanh(self.up.forward(h)))
    return torch.mean((h - y) * (h - y))
)";

// The same over q, k, v of [N, 4, 16] (4 heads of 4 features): shared by both blocks (with
// kHeadsThenMlp).
constexpr const char* kAttendAndMlp = R"(
def attend(self, q, k, v, x, y):
    q = q.view(-1, 4, 4, 4).transpose(1, 2)
    k = k.view(-1, 4, 4, 4).transpose(1, 2)
    v = v.view(-1, 4, 4, 4).transpose(1, 2)
    return self.heads_then_mlp(q, k, v, x, y)
)";

// x [N, 4, 16]: sequence 4, 4 heads of 4 features (the view's sizes are all 4: only the head
// count may be halved), then a tanh MLP of 32 features.
torch::jit::Module makeBlock() {
  torch::jit::Module m("Block");
  for (const char* name : {"q", "k", "v", "o"}) m.register_module(name, makeLinear(16, 16));
  m.register_module("up", makeLinear(16, 32));
  m.register_module("down", makeLinear(32, 16));
  m.define(kHeadsThenMlp);
  m.define(kAttendAndMlp);
  m.define(R"(
def forward(self, x, y):
    return self.attend(self.q.forward(x), self.k.forward(x), self.v.forward(x), x, y)
)");
  return m;
}

// The same block with one fused Q/K/V projection (GPT-2's c_attn) split three ways; its bias
// is a separate add on the fused output.
torch::jit::Module makeFusedBlock() {
  torch::jit::Module m("FusedBlock");
  m.register_module("qkv", makeLinear(16, 48));
  m.register_module("o", makeLinear(16, 16));
  m.register_module("up", makeLinear(16, 32));
  m.register_module("down", makeLinear(32, 16));
  m.define(kHeadsThenMlp);
  m.define(kAttendAndMlp);
  m.define(R"(
def forward(self, x, y):
    q, k, v = self.qkv.forward(x).split(16, dim=2)
    return self.attend(q, k, v, x, y)
)");
  return m;
}

struct RankResult {
  double loss = 0;
  std::map<std::string, at::Tensor> state;  // gathered after the step
  std::map<std::string, std::vector<int64_t>> localShapes;
  std::map<std::string, at::Tensor> loaded;  // gathered after loading `load` (stepOnThreadRanks)
};

// Plans every stage of `ranks` (cut evenly by node count) at tensor-parallel `degree`.
PlanningCallback planAt(std::vector<std::vector<int>> ranks, int degree, int microBatches,
                        std::vector<bool> recompute = {}) {
  return [=](const PlanningInput& in) {
    core::Deployment d =
        testing::makeDeployment(in.model.graph, ranks, in.worldSize, microBatches, "gpipe",
                                recompute.empty() ? std::vector<bool>(ranks.size()) : recompute);
    for (core::StageDeployment& s : d.stages) s.tensorParallel = degree;
    return d;
  };
}

// One forward, backward and SGD step (kLr) of copies[r] on thread rank r of copies.size(), each
// rank fed rows [r kLocal, (r + 1) kLocal) of every input, under `plan`'s deployment; the state
// is gathered after the step (a collective) on every rank. With `load`, that state is then
// loaded (load_state_dict) and gathered again.
std::vector<RankResult> stepOnThreadRanks(std::vector<torch::jit::Module>& copies,
                                          const std::vector<at::Tensor>& inputs,
                                          const PlanningCallback& plan,
                                          const std::map<std::string, at::Tensor>& load = {}) {
  std::vector<RankResult> results(copies.size());
  testing::rethrowFirst(comm::runThreadRanks(int(copies.size()), [&](comm::ThreadBackend& backend) {
    const int rank = backend.rank();
    ModuleOptions options;
    options.backend = testing::borrow(backend);
    options.planner = plan;
    Module module(copies[rank], options);
    std::vector<c10::IValue> local;
    for (const at::Tensor& t : inputs) local.emplace_back(t.narrow(0, rank * kLocal, kLocal));
    at::Tensor loss = module.forward(local)[0];
    loss.backward();
    RankResult& result = results[rank];
    result.loss = loss.item<double>();
    {
      at::NoGradGuard noGrad;
      for (const auto& [name, t] : module.namedParameters()) {
        result.localShapes[name] = t.sizes().vec();
        t.sub_(kLr * t.grad());
      }
    }
    for (const auto& [name, t] : module.stateDict()) result.state[name] = t;
    if (load.empty()) return;
    module.loadStateDict(std::vector<std::pair<std::string, at::Tensor>>(load.begin(), load.end()));
    for (const auto& [name, t] : module.stateDict()) result.loaded[name] = t;
  }));
  return results;
}

// The module's parameters after one SGD step (kLr) on the gradients it holds.
std::map<std::string, at::Tensor> steppedParameters(const torch::jit::Module& module) {
  std::map<std::string, at::Tensor> state;
  for (const auto& p : module.named_parameters())
    state[p.name] = (p.value - kLr * p.value.grad()).detach();
  return state;
}

// The plain module `make` gives (after torch::manual_seed(41)): its loss on `inputs` and its
// parameters after one SGD step (kLr).
std::pair<double, std::map<std::string, at::Tensor>> referenceStep(
    const std::function<torch::jit::Module()>& make, const std::vector<at::Tensor>& inputs) {
  torch::manual_seed(41);
  torch::jit::Module ref = make();
  at::Tensor loss = ref.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())).toTensor();
  loss.backward();
  return {loss.item<double>(), steppedParameters(ref)};
}

// `ranks` copies of the module `make` gives (each after torch::manual_seed(41)), stepped once on
// thread ranks under `plan` (stepOnThreadRanks).
std::vector<RankResult> stepCopies(const std::function<torch::jit::Module()>& make, int ranks,
                                   const std::vector<at::Tensor>& inputs,
                                   const PlanningCallback& plan,
                                   const std::map<std::string, at::Tensor>& load = {}) {
  std::vector<torch::jit::Module> copies;
  for (int r = 0; r < ranks; ++r) torch::manual_seed(41), copies.push_back(make());
  return stepOnThreadRanks(copies, inputs, plan, load);
}

// Every parameter of `want` is in `got` and close to it.
void checkState(const std::map<std::string, at::Tensor>& got,
                const std::map<std::string, at::Tensor>& want, double rtol = 1e-5,
                double atol = 1e-6) {
  for (const auto& [name, w] : want) {
    INFO("parameter " << name);
    REQUIRE(got.count(name));
    CHECK(allClose(got.at(name), w, rtol, atol));
  }
}

std::vector<core::NodeId> allNodes(const core::Graph& graph) {
  std::vector<core::NodeId> all;
  for (const core::Node& n : graph.nodes()) all.push_back(n.id);
  return all;
}

// The whole of `graph` as one stage of tp=2 (group handle 7).
ShardedStage shardWhole(const core::Graph& graph) {
  return shardStage(graph, allNodes(graph), 2, 7);
}

// Multi-query attention (Note [Whole K/V heads] in decomposer/tensor_parallel_split.h): Q of 4
// heads, K and V of one head of 4 features repeated to every Q head (transformers' repeat_kv:
// unsqueeze, expand, reshape), then the MLP.
torch::jit::Module makeMultiQueryBlock() {
  torch::jit::Module m("MultiQueryBlock");
  m.register_module("q", makeLinear(16, 16));
  for (const char* name : {"k", "v"}) m.register_module(name, makeLinear(16, 4));
  m.register_module("o", makeLinear(16, 16));
  m.register_module("up", makeLinear(16, 32));
  m.register_module("down", makeLinear(32, 16));
  m.define(kHeadsThenMlp);
  m.define(R"(
def repeat(self, t):
    return t.view(-1, 4, 1, 4).transpose(1, 2).unsqueeze(2).expand(-1, 1, 4, 4, 4).reshape(-1, 4, 4, 4)

def forward(self, x, y):
    q = self.q.forward(x).view(-1, 4, 4, 4).transpose(1, 2)
    k = self.repeat(self.k.forward(x))
    v = self.repeat(self.v.forward(x))
    return self.heads_then_mlp(q, k, v, x, y)
)");
  return m;
}

// Note [Fused parts] in decomposer/tensor_parallel_split.h, Phi-3's layout: one projection of
// Q (4 heads of 4 features) then K and V (2 heads each), cut apart by slices; K and V repeated
// to every Q head; a fused gated MLP (gate and up halves of one projection, chunked).
torch::jit::Module makeFusedGroupedBlock() {
  torch::jit::Module m("FusedGroupedBlock");
  m.register_module("qkv", makeLinear(16, 32));
  m.register_module("o", makeLinear(16, 16));
  m.register_module("gate_up", makeLinear(16, 64));
  m.register_module("down", makeLinear(32, 16));
  m.define(R"(
def repeat(self, t):
    return t.view(-1, 4, 2, 4).transpose(1, 2).unsqueeze(2).expand(-1, 2, 2, 4, 4).reshape(-1, 4, 4, 4)

def forward(self, x, y):
    qkv = self.qkv.forward(x)
    q = qkv[:, :, :16].view(-1, 4, 4, 4).transpose(1, 2)
    k = self.repeat(qkv[:, :, 16:24])
    v = self.repeat(qkv[:, :, 24:])
    att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / 2.0, dim=-1)
    o = torch.matmul(att, v).transpose(1, 2).reshape(-1, 4, 16)
    h = x + self.o.forward(o)
    gate, up = self.gate_up.forward(h).chunk(2, dim=-1)
    h = h + self.down.forward(torch.tanh(gate) * torch.tanh(up))
    return torch.mean((h - y) * (h - y))
)");
  return m;
}

// GPT-BigCode's multi-query layout: one projection of Q (4 heads of 4) and one K/V head, split
// with unequal sizes after an unsqueeze; K and V broadcast over Q's heads; then the MLP.
torch::jit::Module makeFusedMultiQueryBlock() {
  torch::jit::Module m("FusedMultiQueryBlock");
  m.register_module("qkv", makeLinear(16, 24));
  m.register_module("o", makeLinear(16, 16));
  m.register_module("up", makeLinear(16, 32));
  m.register_module("down", makeLinear(32, 16));
  m.define(kHeadsThenMlp);
  m.define(R"(
def forward(self, x, y):
    q, k, v = self.qkv.forward(x).unsqueeze(1).split([16, 4, 4], dim=3)
    q = q.view(-1, 4, 4, 4).transpose(1, 2)
    return self.heads_then_mlp(q, k, v, x, y)
)");
  return m;
}

// ModernBERT's layout: one projection of Q, K and V (4 heads of 4 each) viewed into (3, heads,
// features) and unbound: the view cuts the rows into three parts (Note [Fused parts]).
torch::jit::Module makeViewCutBlock() {
  torch::jit::Module m("ViewCutBlock");
  m.register_module("qkv", makeLinear(16, 48));
  m.register_module("o", makeLinear(16, 16));
  m.register_module("up", makeLinear(16, 32));
  m.register_module("down", makeLinear(32, 16));
  m.define(kHeadsThenMlp);
  m.define(R"(
def forward(self, x, y):
    q, k, v = self.qkv.forward(x).view(-1, 4, 3, 4, 4).unbind(2)
    return self.heads_then_mlp(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), x, y)
)");
  return m;
}

// `stages`: each stage's ranks and its degree; the block's nodes are cut evenly by count.
void runCase(const std::vector<std::vector<int>>& ranks, int degree, int world,
             bool recompute = false, torch::jit::Module (*make)() = makeBlock) {
  torch::manual_seed(41);
  torch::jit::Module ref = make();
  at::Tensor x = torch::randn({world * kLocal, 4, 16});
  at::Tensor y = torch::randn({world * kLocal, 4, 16});
  at::Tensor refLoss = ref.forward({x, y}).toTensor();
  refLoss.backward();
  const std::map<std::string, at::Tensor> refParams = steppedParameters(ref);

  std::vector<torch::jit::Module> copies;
  for (int r = 0; r < world; ++r) torch::manual_seed(41), copies.push_back(make());
  std::vector<RankResult> results = stepOnThreadRanks(
      copies, {x, y}, planAt(ranks, degree, 2, std::vector<bool>(ranks.size(), recompute)));
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(std::abs(results[r].loss - refLoss.item<double>()) <= 1e-5);
    checkState(results[r].state, refParams);
  }
  // Some rank holds a column-parallel weight (Q's [16, 16], the MLP's [32, 16] or [64, 16]) in
  // slices.
  bool anySliced = false;
  for (int r = 0; r < world; ++r)
    for (const auto& [name, whole] :
         std::map<std::string, std::vector<int64_t>>{{"q.weight", {16, 16}},
                                                     {"qkv.weight", {48, 16}},
                                                     {"up.weight", {32, 16}},
                                                     {"gate_up.weight", {64, 16}}})
      if (results[r].localShapes.count(name))
        anySliced = anySliced ||
                    results[r].localShapes.at(name) == std::vector<int64_t>{whole[0] / degree, 16};
  CHECK(anySliced);
}

TEST_CASE("the block's attention and MLP shard for a tensor-parallel member", "[staging]") {
  torch::manual_seed(41);
  torchscript::ImportedModel model = torchscript::importModule(
      makeBlock(), {torch::randn({4, 4, 4 * 4}), torch::randn({4, 4, 16})});
  const std::vector<core::NodeId> all = allNodes(model.graph);
  ShardedStage stage = shardStage(model.graph, all, 2, 7);
  std::string skipped;
  for (const std::string& s : stage.skipped) skipped += s + "\n";
  INFO(skipped);
  CHECK(stage.sharded == 2);
  CHECK(stage.skipped.empty());
  // q, k, v, o, up, down weights; q, k, v, up biases (o's and down's stay whole).
  CHECK(stage.shards.size() == 10);
  std::vector<core::ValueId> planned, built;  // the plan-only pass finds the same slices
  for (const ParamShard& s : shardedParameters(model.graph, all, 2)) planned.push_back(s.param);
  for (const ParamShard& s : stage.shards) built.push_back(s.param);
  CHECK(planned == built);
  int copies = 0, reduces = 0;
  for (const core::Node& n : stage.graph.nodes()) {
    copies += n.kind == "autostage::tp_copy";
    reduces += n.kind == "autostage::tp_reduce";
  }
  CHECK(copies == 2);   // one per pattern input (x for Q, K, V; h for up)
  CHECK(reduces == 2);  // o and down
  CHECK(stage.inputs == model.graph.boundary(all).inputs);
  CHECK(stage.outputs == model.graph.boundary(all).outputs);
  // patternNodes: the patterns' own nodes, each run by a node of the member's graph.
  std::vector<core::NodeId> inPatterns;
  std::vector<std::string> unused;
  for (const decomposer::PatternPlan& p : decomposer::planPatterns(model.graph, all, 2, unused))
    inPatterns.insert(inPatterns.end(), p.nodes.begin(), p.nodes.end());
  std::sort(inPatterns.begin(), inPatterns.end());
  CHECK(stage.patternNodes == inPatterns);
  CHECK(stage.patternNodes.size() < all.size());
  for (core::NodeId n : stage.patternNodes)
    CHECK(std::count(stage.origin.begin(), stage.origin.end(), n) == 1);
}

TEST_CASE("multi-query attention keeps K and V whole and slices their repeated heads",
          "[staging]") {
  torch::manual_seed(41);
  torchscript::ImportedModel model = torchscript::importModule(
      makeMultiQueryBlock(), {torch::randn({4, 4, 16}), torch::randn({4, 4, 16})});
  const std::vector<core::NodeId> all = allNodes(model.graph);
  for (int degree : {2, 4}) {
    INFO("degree " << degree);
    ShardedStage stage = shardStage(model.graph, all, degree, 7);
    std::string skipped;
    for (const std::string& s : stage.skipped) skipped += s + "\n";
    INFO(skipped);
    CHECK(stage.sharded == 2);
    CHECK(stage.skipped.empty());
    std::set<std::string> sliced, partial;
    for (const ParamShard& s : stage.shards) sliced.insert(model.graph.value(s.param).name);
    for (core::ValueId v : stage.partial) partial.insert(model.graph.value(v).name);
    // Q and the MLP split; K and V whole, each member's gradient of them its heads' share.
    CHECK(partial == std::set<std::string>{"k.weight", "k.bias", "v.weight", "v.bias"});
    for (const std::string& name : partial) CHECK(sliced.count(name) == 0);
    CHECK(sliced.count("q.weight") == 1);
    int copies = 0, slices = 0;
    for (const core::Node& n : stage.graph.nodes()) {
      copies += n.kind == "autostage::tp_copy";
      slices += n.kind == "autostage::tp_slice";
      if (n.kind == "autostage::tp_slice")  // [N, 4 heads, ...] -> the member's heads
        CHECK(stage.graph.value(n.outputs.at(0)).type.shape().at(1) == 4 / degree);
    }
    CHECK(copies == 2);  // x, read by Q, K and V; h, read by up
    CHECK(slices == 2);  // K's transpose at the scores' matmul, V at the output's
  }
  // The planner's view (addShardableSpans): the attention splits at 2 and 4, running K's and V's
  // projections and repeats whole (their time and activations undivided), Q's split.
  const std::vector<decomposer::ShardPattern> patterns = decomposer::findShardPatterns(model.graph);
  const decomposer::SplitDegrees split = decomposer::splitDegrees(model.graph, patterns);
  auto reader = [&](const std::string& param) {  // the linear node (matmul of weight.t())
    for (const core::Node& n : model.graph.nodes())
      for (core::ValueId v : n.inputs)
        if (model.graph.value(v).name == param) return model.graph.consumers(n.outputs.at(0)).at(0);
    return core::kNoNode;
  };
  REQUIRE(patterns.size() == 2);
  for (size_t i = 0; i < patterns.size(); ++i) {
    INFO("pattern " << i);
    if (!patterns[i].attention) {
      CHECK(split.wholeNodes[i].empty());
      continue;
    }
    CHECK(split.degrees[i] == ((1u << 2) | (1u << 4)));
    for (int degree : {2, 4}) {
      const std::set<core::NodeId>& whole = split.wholeNodes[i].at(degree);
      CHECK(whole.count(reader("k.weight")) == 1);
      CHECK(whole.count(reader("v.weight")) == 1);
      CHECK(whole.count(reader("q.weight")) == 0);
      CHECK(whole.size() > 2);  // the views, expands and reshapes of the repeats too
    }
  }
}

TEST_CASE("tp_slice takes the member's part of each block, zeros in its backward", "[staging]") {
  at::set_num_threads(1);
  const at::Tensor x = torch::arange(2 * 8 * 3, torch::kFloat).reshape({2, 8, 3});
  std::vector<at::Tensor> out(2), grad(2);
  testing::rethrowFirst(comm::runThreadRanks(2, [&](comm::ThreadBackend& backend) {
    const int rank = backend.rank();
    TensorParallelGroup group(testing::borrow(backend), comm::Group({0, 1}), rank);
    auto op = c10::Dispatcher::singleton()
                  .findSchemaOrThrow("autostage::tp_slice", "")
                  .typed<at::Tensor(const at::Tensor&, int64_t, int64_t, int64_t, int64_t)>();
    at::Tensor leaf = x.clone().requires_grad_(true);
    out[rank] = op.call(leaf, 1, 4, 2, group.handle());  // 2 blocks of 4 along dim 1, halved
    out[rank].sum().backward();
    grad[rank] = leaf.grad();
  }));
  for (int member : {0, 1}) {
    INFO("member " << member);
    // Indices 2m, 2m + 1 of each block of 4: {0, 1, 4, 5} and {2, 3, 6, 7}.
    const at::Tensor index =
        torch::tensor({2 * member, 2 * member + 1, 4 + 2 * member, 5 + 2 * member});
    CHECK(torch::equal(out[member], x.index_select(1, index)));
    at::Tensor want = torch::zeros_like(x);
    want.index_fill_(1, index, 1);
    CHECK(torch::equal(grad[member], want));
  }
}

TEST_CASE("tensor-parallel stages train as the plain module: tp=2, with replicas, in 2 stages",
          "[staging]") {
  at::set_num_threads(1);
  runCase({{0, 1}}, 2, 2);          // one stage, one group of 2
  runCase({{0, 1, 2, 3}}, 2, 4);    // one stage, 2 replicas of tp=2
  runCase({{0, 1}, {2, 3}}, 2, 4);  // 2 stages of tp=2 (a pattern cut by the stages stays whole)
  runCase({{0, 1}}, 2, 2, /*recompute=*/true);     // the all-reduces run again in the re-run
  runCase({{0, 1}}, 2, 2, false, makeFusedBlock);  // each of Q, K, V's thirds cut in halves
  runCase({{0, 1}}, 2, 2, false, makeMultiQueryBlock);        // K and V whole on each member
  runCase({{0, 1, 2, 3}}, 4, 4, false, makeMultiQueryBlock);  // one head each
}

TEST_CASE("fused projections of unequal parts, or cut by a view, train as the plain module",
          "[staging]") {
  at::set_num_threads(1);
  runCase({{0, 1}}, 2, 2, false, makeFusedGroupedBlock);        // every part cut
  runCase({{0, 1, 2, 3}}, 4, 4, false, makeFusedGroupedBlock);  // K and V whole
  runCase({{0, 1, 2, 3}}, 2, 4, false, makeFusedGroupedBlock);  // 2 replicas of tp=2
  runCase({{0, 1}}, 2, 2, false, makeFusedMultiQueryBlock);     // K and V whole
  runCase({{0, 1, 2, 3}}, 2, 4, false, makeFusedMultiQueryBlock);
  runCase({{0, 1, 2, 3}}, 4, 4, false, makeFusedMultiQueryBlock);
  runCase({{0, 1}}, 2, 2, false, makeViewCutBlock);  // parts cut by a view
  runCase({{0, 1, 2, 3}}, 4, 4, false, makeViewCutBlock);
}

TEST_CASE("a fused projection's parts: cut where their heads divide, else whole", "[staging]") {
  using decomposer::ShardPart;
  struct Case {
    torch::jit::Module (*make)();
    int degree;
    std::vector<ShardPart> qkv;  // the fused projection's weight's parts
    int64_t rows;                // a member's rows of it
    double share;                // of its rows held whole at some degree (the planner's count)
  };
  for (const Case& c : std::vector<Case>{
           {makeFusedGroupedBlock, 2, {{16, false}, {8, false}, {8, false}}, 16, 0.5},
           {makeFusedGroupedBlock, 4, {{16, false}, {8, true}, {8, true}}, 20, 0.5},
           {makeFusedMultiQueryBlock, 2, {{16, false}, {4, true}, {4, true}}, 16, 8.0 / 24},
           {makeFusedMultiQueryBlock, 4, {{16, false}, {4, true}, {4, true}}, 12, 8.0 / 24},
           {makeViewCutBlock, 2, {{16, false}, {16, false}, {16, false}}, 24, 0},
           {makeViewCutBlock, 4, {{16, false}, {16, false}, {16, false}}, 12, 0}}) {
    INFO("degree " << c.degree << ", fused rows " << c.rows);
    torchscript::ImportedModel model =
        torchscript::importModule(c.make(), {torch::randn({4, 4, 16}), torch::randn({4, 4, 16})});
    ShardedStage stage = shardStage(model.graph, allNodes(model.graph), c.degree, 7);
    std::string skipped;
    for (const std::string& s : stage.skipped) skipped += s + "\n";
    INFO(skipped);
    CHECK(stage.sharded == 2);  // the attention and the MLP
    std::map<std::string, ParamShard> shards;
    for (const ParamShard& s : stage.shards) shards[model.graph.value(s.param).name] = s;
    std::string names;
    for (const auto& [name, s] : shards) names += name + " ";
    INFO(names);
    for (const char* name : {"qkv.weight", "qkv.bias"}) {
      const auto it = std::find_if(shards.begin(), shards.end(), [&](const auto& e) {
        return e.first.find(name) != std::string::npos;
      });
      REQUIRE(it != shards.end());
      CHECK(it->second.dim == 0);
      CHECK(it->second.parts == c.qkv);
      CHECK(decomposer::memberExtent(it->second.parts, c.degree) == c.rows);
    }
    // The planner counts the rows held whole at some degree (at 4 for the grouped block's K and
    // V) undivided: SplitDegrees::wholeShare.
    const std::vector<decomposer::ShardPattern> patterns =
        decomposer::findShardPatterns(model.graph);
    const decomposer::SplitDegrees split = decomposer::splitDegrees(model.graph, patterns);
    double share = 0;
    for (const auto& byParam : split.wholeShare)
      for (const auto& [param, s] : byParam)
        if (model.graph.value(param).name.find("qkv.weight") != std::string::npos) share = s;
    CHECK(share == Approx(c.share));
    // The member's projection computes its rows; the MLP's fused halves are cut each.
    bool gateUp = false;
    for (const auto& [name, s] : shards)
      if (name.find("gate_up.weight") != std::string::npos)
        gateUp = s.parts == std::vector<ShardPart>{{32, false}, {32, false}};
    CHECK(gateUp == (c.make == makeFusedGroupedBlock));
    // shardTensor and unshardTensor: the member's rows, and the whole again from them.
    const at::Tensor whole =
        torch::arange(48 * 3).view({-1, 3}).narrow(0, 0, c.qkv[0].size + 2 * c.qkv[1].size);
    ParamShard layout;
    layout.parts = c.qkv;
    std::vector<at::Tensor> slices;
    for (int j = 0; j < c.degree; ++j) {
      slices.push_back(shardTensor(whole, layout, c.degree, j));
      CHECK(slices.back().size(0) == c.rows);
      // Member j's Q rows are its slice; K's and V's rows are whole or its slice of them.
      CHECK(torch::equal(slices.back().narrow(0, 0, 16 / c.degree),
                         whole.narrow(0, j * 16 / c.degree, 16 / c.degree)));
    }
    CHECK(torch::equal(unshardTensor(slices, layout, whole.size(0)), whole));
  }
}

TEST_CASE("a fused Q/K/V projection is cut per part, its bias too", "[staging]") {
  torchscript::ImportedModel model = torchscript::importModule(
      makeFusedBlock(), {torch::randn({4, 4, 16}), torch::randn({4, 4, 16})});
  ShardedStage stage = shardWhole(model.graph);
  std::string skipped;
  for (const std::string& s : stage.skipped) skipped += s + "\n";
  std::string found;
  for (const auto& pt : decomposer::findShardPatterns(model.graph))
    found += (pt.attention ? "attention " : "mlp ") + std::to_string(pt.nodes.size()) + "\n";
  INFO(skipped << found);
  CHECK(stage.sharded == 2);
  int fused = 0;
  for (const ParamShard& s : stage.shards) fused += s.parts.size() == 3;
  CHECK(fused == 2);  // qkv.weight and qkv.bias
}

// TorchScript's names for code defined here: torch (aten) and autostage (this project's operators).
struct AutostageOps : torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(
      const std::string& name, torch::jit::GraphFunction& f,
      const torch::jit::SourceRange& loc) override {
    if (name == "autostage") return std::make_shared<torch::jit::BuiltinModule>("autostage");
    return torch::jit::nativeResolver()->resolveValue(name, f, loc);
  }
};

// The block with dropouts: on its input and on the residual after attention (replicated over
// a group), and with `attentionDropout` on the attention probabilities (split by heads). The
// reference (`reference`) draws its dropouts with tp_dropout from the group handle it is given.
torch::jit::Module makeDropoutBlock(bool reference, bool attentionDropout = false) {
  torch::jit::Module m("DropoutBlock");
  for (const char* name : {"q", "k", "v", "o"}) m.register_module(name, makeLinear(16, 16));
  m.register_module("up", makeLinear(16, 32));
  m.register_module("down", makeLinear(32, 16));
  std::string code = R"(
def forward(self, x, y, GROUP):
    x = DROP(x, 0.25, True)
    q = self.q.forward(x).view(-1, 4, 4, 4).transpose(1, 2)
    k = self.k.forward(x).view(-1, 4, 4, 4).transpose(1, 2)
    v = self.v.forward(x).view(-1, 4, 4, 4).transpose(1, 2)
    att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / 2.0, dim=-1)
    ATTENTION
    o = torch.matmul(att, v).transpose(1, 2).reshape(-1, 4, 16)
    h = DROP(x + self.o.forward(o), 0.25, True)
    h = h + self.down.forward(torch.tanh(self.up.forward(h)))
    return torch.mean((h - y) * (h - y))
)";
  auto replace = [&](const std::string& from, const std::string& to) {
    for (size_t at = code.find(from); at != std::string::npos; at = code.find(from, at + to.size()))
      code.replace(at, from.size(), to);
  };
  replace("ATTENTION", attentionDropout ? "att = torch.dropout(att, 0.5, True)" : "");
  replace(", GROUP", reference ? ", group: int" : "");
  replace("DROP(", reference ? "autostage.tp_dropout(" : "torch.dropout(");
  replace(", True)", reference ? ", True, 0, group)" : ", True)");
  m.define(code, std::make_shared<AutostageOps>());
  return m;
}

// One stage of tp=2 on 2 thread ranks, one micro-batch of all 8 rows: a forward, backward and
// SGD step of the dropout block.
std::vector<RankResult> runDropoutBlock(const at::Tensor& x, const at::Tensor& y,
                                        bool attentionDropout, bool recompute) {
  return stepCopies([&] { return makeDropoutBlock(false, attentionDropout); }, 2, {x, y},
                    planAt({{0, 1}}, 2, 1, {recompute}));
}

// A vocabulary of 16,384 rows (decomposer::kVocabularyRows) embedded, then a residual tanh MLP;
// the loss against y.
// With `tied`, the table also scores h against every row (as a tied LM head would).
torch::jit::Module makeVocabularyModel(bool tied = false) {
  torch::jit::Module m("Vocabulary");
  m.register_parameter("table", (torch::randn({16384, 8}) * 0.1).requires_grad_(), false);
  m.register_module("up", makeLinear(8, 16));
  m.register_module("down", makeLinear(16, 8));
  m.define(std::string(R"(
def forward(self, ids, y):
    h = torch.embedding(self.table, ids, 3)
    h = h + self.down.forward(torch.tanh(self.up.forward(h)))
    return torch.mean((h - y) * (h - y)))") +
           (tied ? " + torch.mean(torch.matmul(h, self.table.t()))\n" : "\n"));
  return m;
}

TEST_CASE("a vocabulary embedding is split by rows over the group", "[staging]") {
  at::set_num_threads(1);
  torch::manual_seed(41);
  // Ids in both halves of the table, and the padding row 3 (no gradient).
  at::Tensor ids = torch::randint(0, 16384, {2 * kLocal, 4}, torch::kLong);
  ids.index_put_({0, 0}, 3);
  ids.index_put_({1, 2}, 8192);
  const at::Tensor y = torch::randn({2 * kLocal, 4, 8});
  const auto make = [] { return makeVocabularyModel(); };
  const auto [refLoss, refState] = referenceStep(make, {ids, y});
  for (const RankResult& r : stepCopies(make, 2, {ids, y}, planAt({{0, 1}}, 2, 2))) {
    CHECK(std::abs(r.loss - refLoss) <= 1e-5);
    CHECK(r.localShapes.at("table") == std::vector<int64_t>{8192, 8});
    checkState(r.state, refState);
  }

  // The rewrite: one tp_embedding, the table in row halves; tied to a second reader, it stays.
  torchscript::ImportedModel model = torchscript::importModule(makeVocabularyModel(), {ids, y});
  ShardedStage stage = shardWhole(model.graph);
  int embeddings = 0;
  for (const core::Node& n : stage.graph.nodes()) embeddings += n.kind == "autostage::tp_embedding";
  CHECK(embeddings == 1);
  bool table = false;
  for (const ParamShard& s : stage.shards)
    table =
        table || (model.graph.value(s.param).name.find("table") != std::string::npos && s.dim == 0);
  CHECK(table);
  CHECK(stage.skipped.empty());
  torchscript::ImportedModel tied = torchscript::importModule(makeVocabularyModel(true), {ids, y});
  ShardedStage whole = shardWhole(tied.graph);
  REQUIRE(whole.skipped.size() == 1);
  CHECK_THAT(whole.skipped[0], Catch::Contains("vocabulary embedding") &&
                                   Catch::Contains("stays replicated: its weight is also read by"));
  for (const ParamShard& s : whole.shards)
    CHECK(tied.graph.value(s.param).name.find("table") == std::string::npos);
}

// An untied LM head over a vocabulary of 16,384 (decomposer::kVocabularyRows) and its loss:
// `loss` 0 is cross entropy (mean, ignore_index -100, label smoothing 0.1) of the logits
// flattened to [rows, vocabulary], 1 log-softmax then nll_loss summed, 2 cross entropy of the
// logits transposed to [batch, vocabulary, positions] (the transformer example's); 3 is 0 with
// the head's weight also read outside it (as a tied table is).
torch::jit::Module makeHeadModel(int loss) {
  torch::jit::Module m("Head");
  m.register_module("up", makeLinear(8, 8));
  m.register_module("head", makeLinear(8, 16384));
  // The residual keeps up -> tanh -> head from matching as an MLP (head row-parallel).
  const std::string logits = R"(
def forward(self, x, t):
    logits = self.head.forward(x + torch.tanh(self.up.forward(x)))
)";
  const char* ends[] = {
      "    return torch.cross_entropy_loss(logits.view(-1, 16384), t.view(-1), None, 1, -100,\n"
      "                                    0.1)\n",
      "    logp = torch.log_softmax(logits.view(-1, 16384), -1)\n"
      "    return torch.nll_loss(logp, t.view(-1), None, 2, -100)\n",
      "    return torch.cross_entropy_loss(logits.transpose(1, 2), t, None, 1, -100, 0.0)\n",
      "    loss = torch.cross_entropy_loss(logits.view(-1, 16384), t.view(-1), None, 1, -100,\n"
      "                                    0.1)\n"
      "    return loss + torch.mean(self.head.weight)\n"};
  m.define(logits + ends[loss]);
  return m;
}

TEST_CASE("an LM head is split over the vocabulary, its loss computed on the slices", "[staging]") {
  at::set_num_threads(1);
  torch::manual_seed(41);
  const at::Tensor x = torch::randn({2 * kLocal, 4, 8});
  // Targets in both halves, at the halves' boundary, and ignored (-100).
  at::Tensor t = torch::randint(0, 16384, {2 * kLocal, 4}, torch::kLong);
  t.index_put_({0, 0}, 8191);
  t.index_put_({0, 1}, 8192);
  t.index_put_({1, 2}, -100);
  t.index_put_({5, 3}, -100);
  for (int loss : {0, 1, 2}) {
    INFO("loss " << loss);
    const auto make = [loss] { return makeHeadModel(loss); };
    const auto [refLoss, refState] = referenceStep(make, {x, t});
    // One micro-batch: a mean over the rows not ignored is not the mean of micro-batches' means.
    for (const RankResult& r : stepCopies(make, 2, {x, t}, planAt({{0, 1}}, 2, 1))) {
      CHECK(std::abs(r.loss - refLoss) <= 1e-5 * std::abs(refLoss));
      CHECK(r.localShapes.at("head.weight") == std::vector<int64_t>{8192, 8});
      CHECK(r.localShapes.at("head.bias") == std::vector<int64_t>{8192});
      checkState(r.state, refState);
    }

    // The rewrite: the head's input through tp_copy, its loss on the slices.
    torchscript::ImportedModel model = torchscript::importModule(makeHeadModel(loss), {x, t});
    ShardedStage stage = shardWhole(model.graph);
    CHECK(stage.skipped.empty());
    CHECK(stage.sharded == 1);
    std::map<std::string, int> kinds;
    for (const core::Node& n : stage.graph.nodes()) kinds[n.kind]++;
    CHECK(kinds["autostage::tp_copy"] == 1);
    if (loss != 1) {
      CHECK(kinds["autostage::tp_cross_entropy"] == 1);
      CHECK(kinds["aten::cross_entropy_loss"] == 0);
    } else {
      CHECK(kinds["autostage::tp_log_softmax"] == 1);
      CHECK(kinds["autostage::tp_nll_loss"] == 1);
      CHECK(kinds["aten::nll_loss"] + kinds["aten::log_softmax"] == 0);
    }
  }

  // A head whose weight something else reads stays whole, and says why.
  torchscript::ImportedModel tied = torchscript::importModule(makeHeadModel(3), {x, t});
  ShardedStage whole = shardWhole(tied.graph);
  REQUIRE(whole.skipped.size() == 1);
  CHECK_THAT(whole.skipped[0], Catch::Contains("the vocabulary head at") &&
                                   Catch::Contains("stays replicated: parameter") &&
                                   Catch::Contains("is also read by"));
  CHECK(whole.shards.empty());
}

// A table of 16,384 rows tied to both ends: embedded, a residual tanh MLP, scored against every
// row, the cross entropy of the next id (as GPT-2 ties wte to its head).
torch::jit::Module makeTiedModel() {
  torch::jit::Module m("Tied");
  m.register_parameter("table", (torch::randn({16384, 8}) * 0.1).requires_grad_(), false);
  m.register_module("up", makeLinear(8, 8));
  m.define(R"(
def forward(self, ids, t):
    h = torch.embedding(self.table, ids, -1)
    h = h + torch.tanh(self.up.forward(h))
    logits = torch.matmul(h, self.table.t())
    return torch.cross_entropy_loss(logits.view(-1, 16384), t.view(-1), None, 1, -100, 0.0)
)");
  return m;
}

TEST_CASE("a table tied to the embedding and the LM head is split once for both", "[staging]") {
  at::set_num_threads(1);
  torch::manual_seed(41);
  at::Tensor ids = torch::randint(0, 16384, {2 * kLocal, 4}, torch::kLong);
  ids.index_put_({0, 0}, 8191);
  ids.index_put_({0, 1}, 8192);
  const at::Tensor t = torch::randint(0, 16384, {2 * kLocal, 4}, torch::kLong);
  const auto [refLoss, refState] = referenceStep(makeTiedModel, {ids, t});
  for (const RankResult& r : stepCopies(makeTiedModel, 2, {ids, t}, planAt({{0, 1}}, 2, 1))) {
    CHECK(std::abs(r.loss - refLoss) <= 1e-5 * std::abs(refLoss));
    CHECK(r.localShapes.at("table") == std::vector<int64_t>{8192, 8});
    checkState(r.state, refState);  // the table's gradient from both ends, in its rows
  }

  torchscript::ImportedModel model = torchscript::importModule(makeTiedModel(), {ids, t});
  ShardedStage stage = shardWhole(model.graph);
  CHECK(stage.skipped.empty());
  CHECK(stage.sharded == 1);
  REQUIRE(stage.shards.size() == 1);
  CHECK(stage.shards[0].dim == 0);
  std::map<std::string, int> kinds;
  for (const core::Node& n : stage.graph.nodes()) kinds[n.kind]++;
  CHECK(kinds["autostage::tp_embedding"] == 1);
  CHECK(kinds["autostage::tp_cross_entropy"] == 1);
  // Held by a stage without the embedding (a pipeline's last), the head splits the table alone
  // (Note [Tied tables across stages]); so does a stage holding the embedding alone.
  std::vector<core::NodeId> tail, front;
  for (const core::Node& n : model.graph.nodes())
    (n.kind != "aten::embedding" ? tail : front).push_back(n.id);
  ShardedStage last = shardStage(model.graph, tail, 2, 7);
  CHECK(last.skipped.empty());
  CHECK(last.sharded == 1);
  REQUIRE(last.shards.size() == 1);
  CHECK(model.graph.value(last.shards[0].param).name ==
        model.graph.value(stage.shards[0].param).name);
  std::map<std::string, int> lastKinds;
  for (const core::Node& n : last.graph.nodes()) lastKinds[n.kind]++;
  CHECK(lastKinds["autostage::tp_embedding"] == 0);
  CHECK(lastKinds["autostage::tp_cross_entropy"] == 1);
  ShardedStage first = shardStage(model.graph, front, 4, 7);
  CHECK(first.sharded == 1);
  REQUIRE(first.shards.size() == 1);
  CHECK(first.patternNodes == front);
}

// Note [Tied tables across stages]: the tied model in 2 stages, the embedding's at degree
// degrees[0] (ranks {0, .., n0 - 1}) and the head's at degrees[1], each stage `replicas` groups;
// one SGD step against the plain module's on the same data.
void runTiedAcross(std::array<int, 2> degrees, int replicas) {
  INFO("degrees " << degrees[0] << " and " << degrees[1] << ", " << replicas << " replicas");
  const int n0 = degrees[0] * replicas, world = n0 + degrees[1] * replicas;
  torch::manual_seed(43);
  at::Tensor ids = torch::randint(0, 16384, {world * kLocal, 4}, torch::kLong);
  const at::Tensor t = torch::randint(0, 16384, {world * kLocal, 4}, torch::kLong);
  const auto [refLoss, refState] = referenceStep(makeTiedModel, {ids, t});
  std::vector<std::vector<int>> ranks(2);
  for (int r = 0; r < world; ++r) ranks[r < n0 ? 0 : 1].push_back(r);
  const PlanningCallback plan = [=](const PlanningInput& in) {
    core::Deployment d = testing::makeDeployment(in.model.graph, ranks, in.worldSize, 2);
    for (int s = 0; s < 2; ++s) {
      d.stages[s].tensorParallel = degrees[s];
      for (core::NodeId n : d.stages[s].nodes)  // the ends apart: the embedding first
        AUTOSTAGE_CHECK(
            in.model.graph.node(n).kind != (s == 0 ? "aten::matmul" : "aten::embedding"),
            "the test's cut puts the tied table's ends in one stage");
    }
    return d;
  };
  // Loaded after the step: the initial state, cut into each rank's slices and gathered back.
  torch::manual_seed(41);
  std::map<std::string, at::Tensor> initial;
  for (const auto& p : makeTiedModel().named_parameters()) initial[p.name] = p.value.detach();
  const std::vector<RankResult> results = stepCopies(makeTiedModel, world, {ids, t}, plan, initial);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    const int degree = degrees[r < n0 ? 0 : 1];
    CHECK(std::abs(results[r].loss - refLoss) <= 1e-5 * std::abs(refLoss));
    CHECK(results[r].localShapes.at("table") == std::vector<int64_t>{16384 / degree, 8});
    checkState(results[r].state, refState);  // the table's rows summed over both ends
    checkState(results[r].loaded, initial, 0, 0);
    CHECK_FALSE(allClose(results[r].loaded.at("table"), results[r].state.at("table"), 1e-5, 1e-6));
  }
}

TEST_CASE("a tied table split by the stages holding its ends, each at its own degree",
          "[staging]") {
  at::set_num_threads(1);
  runTiedAcross({2, 2}, 1);  // sliced alike: each slice summed over its two holders
  runTiedAcross({1, 2}, 2);  // whole on the first stage's replicas, halves on the last
  runTiedAcross({2, 4}, 1);  // quarters summed with the halves holding them
  runTiedAcross({4, 1}, 1);
}

TEST_CASE("tp_cross_entropy and tp_nll_loss on vocabulary slices match torch's losses",
          "[staging]") {
  at::set_num_threads(1);
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({6, 10}, torch::kDouble) * 3;
  at::Tensor target = torch::randint(0, 10, {6}, torch::kLong);
  target.index_put_({1}, -100);
  target.index_put_({2}, 4);  // the last class of member 0
  target.index_put_({3}, 5);  // the first of member 1
  struct Case {
    int64_t reduction;
    double smoothing;
  };
  for (Case c : {Case{1, 0.0}, Case{1, 0.1}, Case{2, 0.0}, Case{0, 0.2}}) {
    INFO("reduction " << c.reduction << ", label smoothing " << c.smoothing);
    at::Tensor leaf = x.clone().requires_grad_(true);
    at::Tensor want = at::cross_entropy_loss(leaf, target, {}, c.reduction, -100, c.smoothing);
    want.sum().backward();
    at::Tensor nllLeaf = x.clone().requires_grad_(true);
    at::Tensor wantNll = at::nll_loss(at::log_softmax(nllLeaf, 1), target, {}, c.reduction, -100);
    wantNll.sum().backward();
    std::vector<at::Tensor> got(2), grads(2), gotNll(2), nllGrads(2);
    testing::rethrowFirst(comm::runThreadRanks(2, [&](comm::ThreadBackend& backend) {
      const int rank = backend.rank();
      TensorParallelGroup group(testing::borrow(backend), comm::Group({0, 1}), rank);
      c10::Dispatcher& d = c10::Dispatcher::singleton();
      auto crossEntropy = d.findSchemaOrThrow("autostage::tp_cross_entropy", "")
                              .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                                int64_t, double, int64_t)>();
      auto logSoftmax = d.findSchemaOrThrow("autostage::tp_log_softmax", "")
                            .typed<at::Tensor(const at::Tensor&, int64_t, int64_t)>();
      auto nll =
          d.findSchemaOrThrow("autostage::tp_nll_loss", "")
              .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t)>();
      at::Tensor slice = x.narrow(1, 5 * rank, 5).clone().requires_grad_(true);
      got[rank] = crossEntropy.call(slice, target, c.reduction, -100, c.smoothing, group.handle());
      got[rank].sum().backward();
      grads[rank] = slice.grad();
      at::Tensor nllSlice = x.narrow(1, 5 * rank, 5).clone().requires_grad_(true);
      gotNll[rank] = nll.call(logSoftmax.call(nllSlice, 1, group.handle()), target, c.reduction,
                              -100, group.handle());
      gotNll[rank].sum().backward();
      nllGrads[rank] = nllSlice.grad();
    }));
    for (int r = 0; r < 2; ++r) {
      CHECK(allClose(got[r], want, 1e-12, 1e-12));
      CHECK(allClose(gotNll[r], wantNll, 1e-12, 1e-12));
    }
    CHECK(allClose(at::cat(grads, 1), leaf.grad(), 1e-12, 1e-12));
    CHECK(allClose(at::cat(nllGrads, 1), nllLeaf.grad(), 1e-12, 1e-12));
  }

  // Logits [batch, classes, positions], a transposed view (the transformer example's loss).
  const at::Tensor logits = torch::randn({3, 4, 10}, torch::kDouble).transpose(1, 2);
  at::Tensor targets = torch::randint(0, 10, {3, 4}, torch::kLong);
  targets.index_put_({0, 1}, -100);
  at::Tensor leaf = logits.detach().clone().requires_grad_(true);
  at::cross_entropy_loss(leaf, targets, {}, 1, -100, 0.1).backward();
  std::vector<at::Tensor> grads(2);
  testing::rethrowFirst(comm::runThreadRanks(2, [&](comm::ThreadBackend& backend) {
    const int rank = backend.rank();
    TensorParallelGroup group(testing::borrow(backend), comm::Group({0, 1}), rank);
    auto crossEntropy = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("autostage::tp_cross_entropy", "")
                            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                              int64_t, double, int64_t)>();
    at::Tensor slice = logits.narrow(1, 5 * rank, 5).detach().requires_grad_(true);
    const at::Tensor loss = crossEntropy.call(slice, targets, 1, -100, 0.1, group.handle());
    CHECK(allClose(loss, at::cross_entropy_loss(logits, targets, {}, 1, -100, 0.1), 1e-12, 1e-12));
    loss.backward();
    grads[rank] = slice.grad();
  }));
  CHECK(allClose(at::cat(grads, 1), leaf.grad(), 1e-12, 1e-12));
}

TEST_CASE("tp_dropout: the group's masks, the member's own where split", "[staging]") {
  at::set_num_threads(1);
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({64, 64});
  std::vector<std::map<std::string, at::Tensor>> drawn(2);
  testing::rethrowFirst(comm::runThreadRanks(2, [&](comm::ThreadBackend& backend) {
    const int rank = backend.rank();
    TensorParallelGroup group(testing::borrow(backend), comm::Group({0, 1}), rank);
    CHECK(group.seed() == 7);  // the first member's torch.initial_seed()
    auto op = c10::Dispatcher::singleton()
                  .findSchemaOrThrow("autostage::tp_dropout", "")
                  .typed<at::Tensor(const at::Tensor&, double, bool, int64_t, int64_t)>();
    std::map<std::string, at::Tensor>& mine = drawn[rank];
    mine["replicated"] = op.call(x, 0.25, true, 0, group.handle());
    mine["split"] = op.call(x, 0.25, true, 1, group.handle());
    mine["next"] = op.call(x, 0.25, true, 0, group.handle());
    CHECK(group.draws() == 3);
    group.setDraws(1);  // what a recompute stage's re-run does
    mine["split again"] = op.call(x, 0.25, true, 1, group.handle());
    mine["eval"] = op.call(x, 0.25, false, 0, group.handle());
    CHECK(group.draws() == 2);  // eval draws nothing
    at::Tensor leaf = x.clone().requires_grad_(true);
    op.call(leaf, 0.25, true, 1, group.handle()).sum().backward();
    mine["grad"] = leaf.grad();
    mine["grad mask"] = op.call(x, 0.25, true, 1, (group.setDraws(2), group.handle()));
  }));
  const auto& a = drawn[0];
  const auto& b = drawn[1];
  CHECK(torch::equal(a.at("replicated"), b.at("replicated")));  // the same elements dropped
  CHECK_FALSE(torch::equal(a.at("split"), b.at("split")));      // each member's own
  CHECK_FALSE(torch::equal(a.at("replicated"), a.at("next")));  // a new mask per draw
  CHECK(torch::equal(a.at("split"), a.at("split again")));
  CHECK(torch::equal(a.at("eval"), x));
  for (const auto* d : {&a, &b}) {
    // Kept elements scaled by 1 / (1 - p), as torch.dropout; about 3/4 of 4,096 kept.
    const at::Tensor kept = d->at("replicated") != 0;
    CHECK(torch::allclose(d->at("replicated").masked_select(kept), x.masked_select(kept) / 0.75));
    const double share = kept.to(at::kDouble).mean().item<double>();
    CHECK(share > 0.70);
    CHECK(share < 0.80);
    // The gradient is the mask: 1 / (1 - p) where kept, 0 where dropped.
    const at::Tensor mask = d->at("grad mask") != 0;
    CHECK(torch::allclose(d->at("grad"), mask.to(at::kFloat) / 0.75));
  }
}

TEST_CASE("a tensor-parallel stage's dropouts draw the group's masks", "[staging]") {
  at::set_num_threads(1);
  torch::manual_seed(41);
  const at::Tensor x = torch::randn({2 * kLocal, 4, 16});
  const at::Tensor y = torch::randn({2 * kLocal, 4, 16});

  // Replicated dropouts: tp=2 trains exactly as the plain block drawing the same stream (the
  // first member's seed, one draw per dropout in the graph's order), also recomputed. A member
  // drawing other masks would feed its slices other activations: the sums would differ.
  torch::manual_seed(41);
  torch::jit::Module ref = makeDropoutBlock(true);
  at::Tensor refLoss;
  testing::rethrowFirst(comm::runThreadRanks(1, [&](comm::ThreadBackend& backend) {
    TensorParallelGroup group(testing::borrow(backend), comm::Group({0}), 0);
    refLoss = ref.forward({x, y, group.handle()}).toTensor();
    refLoss.backward();
  }));
  const std::map<std::string, at::Tensor> refState = steppedParameters(ref);
  for (bool recompute : {false, true}) {
    INFO("recompute " << recompute);
    torch::manual_seed(41);
    for (const RankResult& r : runDropoutBlock(x, y, false, recompute)) {
      CHECK(std::abs(r.loss - refLoss.item<double>()) <= 1e-5);
      checkState(r.state, refState);
    }
  }

  // Split by heads, the attention's dropout draws each member's own mask; a recompute stage's
  // re-run draws them again: the same loss and step as without recompute.
  torch::manual_seed(41);
  const RankResult plain = runDropoutBlock(x, y, true, false)[0];
  torch::manual_seed(41);
  const RankResult recomputed = runDropoutBlock(x, y, true, true)[0];
  CHECK(plain.loss == recomputed.loss);
  CHECK(std::abs(plain.loss - refLoss.item<double>()) > 1e-6);  // the attention dropped
  checkState(recomputed.state, plain.state, 1e-6, 1e-7);

  // The rewrite: three dropouts, the attention's split.
  torchscript::ImportedModel model =
      torchscript::importModule(makeDropoutBlock(false, true), {x, y});
  ShardedStage stage = shardWhole(model.graph);
  std::vector<int64_t> splits;
  for (const core::Node& n : stage.graph.nodes()) {
    CHECK(n.kind != "aten::dropout");
    if (n.kind != "autostage::tp_dropout") continue;
    const core::Node& flag = stage.graph.node(stage.graph.producer(n.inputs.at(3)));
    splits.push_back(std::get<int64_t>(flag.findAttribute("value")->value));
  }
  CHECK(splits == std::vector<int64_t>{0, 1, 0});
  CHECK(stage.sharded == 2);
}

}  // namespace
}  // namespace autostage::driver

namespace autostage::driver {
namespace {

// Note [Tensor-parallel profile]: the member model the profiler runs at a degree, and the times
// it adds to the profile.
TEST_CASE("the profiler times the block's patterns on a member's slices", "[profiler]") {
  torch::manual_seed(41);
  const std::vector<c10::IValue> inputs{torch::randn({8, 4, 16}), torch::randn({8, 4, 16})};
  const torchscript::ImportedModel model = torchscript::importModule(makeBlock(), inputs);

  decomposer::PlanOptions options;
  options.tensorParallel = "auto";
  CHECK(splitProfileDegrees(model.graph, options, 4, 4) == std::vector<int>{2, 4});
  CHECK(splitProfileDegrees(model.graph, options, 4, 2) == std::vector<int>{2});
  CHECK(splitProfileDegrees(model.graph, options, 8, 8) == std::vector<int>{2, 4, 8});
  options.tensorParallel = "4";
  CHECK(splitProfileDegrees(model.graph, options, 4, 4) == std::vector<int>{4});
  options.tensorParallel = "1";
  CHECK(splitProfileDegrees(model.graph, options, 4, 4).empty());

  std::optional<profiler::SplitModel> split = memberModel(model, 2);
  REQUIRE(split);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (size_t i = 0; i < split->model.paramTensors.size(); ++i) {
    const at::Tensor& t = split->model.paramTensors[i];
    shapes[split->model.paramNames.at(i)] = t.sizes().vec();
    CHECK(t.requires_grad());
  }
  CHECK(shapes.at("q.weight") == std::vector<int64_t>{8, 16});   // column-parallel: rows halved
  CHECK(shapes.at("q.bias") == std::vector<int64_t>{8});
  CHECK(shapes.at("up.weight") == std::vector<int64_t>{16, 16});
  CHECK(shapes.at("o.weight") == std::vector<int64_t>{16, 8});   // row-parallel: columns halved
  CHECK(shapes.at("o.bias") == std::vector<int64_t>{16});        // added after the all-reduce
  CHECK(shapes.at("down.weight") == std::vector<int64_t>{16, 16});
  CHECK(split->model.graph.batchInputs().size() == 2);
  std::set<core::NodeId> patternNodes;
  for (const decomposer::ShardPattern& p : decomposer::findShardPatterns(model.graph))
    patternNodes.insert(p.nodes.begin(), p.nodes.end());
  REQUIRE(!split->measured.empty());
  for (core::NodeId n : split->measured) CHECK(patternNodes.count(split->origin.at(n)) == 1);

  profiler::ProfilerOptions profilerOptions;
  profilerOptions.calibrationBlocks = 0;
  profilerOptions.passes = 1;
  profilerOptions.passSeconds = 0;
  profilerOptions.progressBar = false;
  profilerOptions.batchSizes = {2, 4};
  const auto backend = profiler::createCpuMeasurementBackend();
  const core::GraphProfile plain =
      profiler::profileGraph(model, inputs, *backend, profilerOptions);
  profilerOptions.splitDegrees = {2, 4};
  const core::GraphProfile profile = profiler::profileGraph(
      model, inputs, *backend, profilerOptions,
      [&](int degree) { return memberModel(model, degree); });
  REQUIRE(profile.nodes.size() == model.graph.nodeCount());
  // Every measured group's original node has times at 2 and 4, and only pattern nodes have them;
  // the linear layers all do (the q, k, v, o, up and down groups).
  int measured = 0, linears = 0;
  for (core::NodeId n = 0; n < static_cast<core::NodeId>(model.graph.nodeCount()); ++n) {
    const core::NodeProfile& p = profile.nodes[n];
    CHECK(plain.nodes[n].split.empty());
    if (p.split.empty()) continue;
    INFO(core::nodeLabel(model.graph, n));
    ++measured;
    CHECK(patternNodes.count(n) == 1);
    REQUIRE(p.split.size() == 2);
    CHECK(p.split[0].degree == 2);
    CHECK(p.split[1].degree == 4);
    for (const core::SplitTimes& s : p.split)
      CHECK(s.forwardSeconds.at(4) + s.backwardSeconds.at(4) > 0);
    linears += decomposer::isLinearNode(model.graph, n);
  }
  CHECK(linears == 6);
  CHECK(measured >= 6);
  // The profile's key names the degrees measured, so a profile without them is not reused.
  profiler::ProfilerOptions without = profilerOptions;
  without.splitDegrees.clear();
  CHECK(profiler::profileKey(model, inputs, profilerOptions, "cpu").text !=
        profiler::profileKey(model, inputs, without, "cpu").text);
  CHECK(profilerOptions.measurementText().find("split_degrees=2,4") != std::string::npos);
  // Asked for degrees without a way to make the member models: refused.
  CHECK_THROWS_WITH(profiler::profileGraph(model, inputs, *backend, profilerOptions),
                    Catch::Contains("no member model"));
}

}  // namespace
}  // namespace autostage::driver
