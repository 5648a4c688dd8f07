// Note [Tensor-parallel patterns]: what the IR matcher shards in a transformer and an MLP, and
// the blocks' ShardableCost it fills.
#include "decomposer/tensor_parallel_patterns.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/cluster_spec.h"
#include "decomposer/coarsen.h"
#include "decomposer/cost_model.h"
#include "decomposer/planner.h"
#include "decomposer/synthetic.h"
#include "decomposer/tensor_parallel_split.h"

using namespace autostage;
using namespace autostage::decomposer;

namespace {

SyntheticModel smallTransformer(int layers, int hidden = 256, int heads = 4, int kvHeads = 0) {
  TransformerShape shape;
  shape.layers = layers;
  shape.hidden = hidden;
  shape.heads = heads;
  shape.kvHeads = kvHeads;
  shape.sequence = 64;
  shape.vocabulary = 1000;
  shape.causal = true;
  return syntheticTransformer(shape, DeviceModel{});
}

}  // namespace

TEST_CASE("a transformer layer has one attention and one MLP pattern", "[decomposer]") {
  const SyntheticModel m = smallTransformer(3);
  const std::vector<ShardPattern> patterns = findShardPatterns(m.graph);
  REQUIRE(patterns.size() == 6);
  int attention = 0;
  for (const ShardPattern& p : patterns) {
    attention += p.attention;
    REQUIRE(m.graph.node(p.rowLinear).kind == "aten::matmul");
    REQUIRE(p.nodes.back() == p.rowLinear);  // the row-parallel linear ends the pattern
    // Every pattern's row output is the hidden state: [1, seq, hidden].
    REQUIRE(m.graph.value(m.graph.node(p.rowLinear).outputs[0]).type.shape() ==
            std::vector<int64_t>{1, 64, 256});
    // Layer norms, residual adds and the embedding stay outside (replicated).
    for (core::NodeId n : p.nodes) {
      REQUIRE(m.graph.node(n).kind != "aten::layer_norm");
      REQUIRE(m.graph.node(n).kind != "aten::embedding");
    }
  }
  REQUIRE(attention == 3);
}

TEST_CASE("grouped K/V heads split with the attention, or stay whole where they do not divide",
          "[decomposer]") {
  // Note [Whole K/V heads]: 8 query heads over 2 K/V heads. At 2 K and V split by heads; at 4 and
  // 8 each member computes them whole, and the planner leaves their time undivided.
  const SyntheticModel m = smallTransformer(2, 256, 8, 2);
  const std::vector<ShardPattern> patterns = findShardPatterns(m.graph);
  REQUIRE(patterns.size() == 4);
  const SplitDegrees split = splitDegrees(m.graph, patterns);
  // The K projection's matmul of a layer: the reader of the transposed weight.
  auto kProjection = [&](int layer) {
    for (const core::Node& n : m.graph.nodes())
      if (n.kind == "aten::t" && m.graph.value(n.inputs.at(0)).name ==
                                     "layers." + std::to_string(layer) + ".attn.k.weight")
        return m.graph.consumers(n.outputs.at(0)).at(0);
    return core::kNoNode;
  };
  int layer = 0;
  for (size_t i = 0; i < patterns.size(); ++i) {
    INFO("pattern " << i);
    CHECK(split.degrees[i] == ShardableSpan::kAllDegrees);
    if (!patterns[i].attention) {
      CHECK(split.wholeNodes[i].empty());
      continue;
    }
    CHECK(split.wholeNodes[i].count(2) == 0);
    for (int t : {4, 8}) CHECK(split.wholeNodes[i].at(t).count(kProjection(layer)) == 1);
    ++layer;
  }
  const Blocking b = buildBlocking(m.graph, m.profile, 256, 8, true);
  int attention = 0;
  for (const ShardableSpan& s : b.request.shardable) {
    const double whole = s.cost.forwardSeconds.perSample;
    if (!s.measured[ShardableSpan::slot(4)]) {  // an MLP: every node divided
      CHECK(s.costAt(4).memberForwardSeconds.perSample == Approx(whole / 4));
      continue;
    }
    ++attention;
    CHECK_FALSE(s.measured[ShardableSpan::slot(2)].has_value());  // K and V split at 2
    CHECK(s.costAt(2).memberForwardSeconds.perSample == Approx(whole / 2));
    // At 4 and 8 more than the whole / t (K's and V's projections whole), less than the whole.
    for (int t : {4, 8}) {
      const double member = s.costAt(t).memberForwardSeconds.perSample;
      CHECK(member > whole / t * 1.05);
      CHECK(member < whole);
    }
  }
  CHECK(attention == 2);
}

TEST_CASE("an MLP whose linear layers feed residual adds has no pattern", "[decomposer]") {
  MlpShape shape;  // linear -> relu -> linear -> relu ...: each linear's output reaches the next
  shape.layers = 4;
  const SyntheticModel m = syntheticMlp(shape, DeviceModel{});
  // Pairs of consecutive linear layers through relu: 2 of 4, each linear used once.
  const std::vector<ShardPattern> patterns = findShardPatterns(m.graph);
  REQUIRE(patterns.size() == 2);
  for (const ShardPattern& p : patterns) REQUIRE_FALSE(p.attention);
}

TEST_CASE("a transformer's request carries the patterns' spans only when asked", "[decomposer]") {
  const SyntheticModel m = smallTransformer(4);
  for (int maxBlocks : {6, 24, 256}) {
    // The blocks are the same with and without; only the request's spans differ.
    const Blocking plain = buildBlocking(m.graph, m.profile, maxBlocks, 8);
    const Blocking b = buildBlocking(m.graph, m.profile, maxBlocks, 8, true);
    REQUIRE(plain.request.shardable.empty());
    REQUIRE(b.blockFirstGroup == plain.blockFirstGroup);
    int pairs = 0, cut = 0;
    double sharded = 0, total = 0;
    for (const BlockCost& c : b.request.blocks) total += c.paramBytes;
    for (const ShardableSpan& s : b.request.shardable) {
      pairs += s.cost.allreducePairs;
      sharded += s.cost.paramBytes;
      cut += s.firstBlock < s.lastBlock;
      double forward = 0, params = 0;
      for (int blk = s.firstBlock; blk <= s.lastBlock; ++blk)
        forward += b.request.blocks[blk].forwardSeconds.perSample,
            params += b.request.blocks[blk].paramBytes;
      REQUIRE(s.cost.forwardSeconds.perSample <= forward * (1 + 1e-12));
      REQUIRE(s.cost.paramBytes <= params);
      REQUIRE(s.cost.allreduceBytes.perSample > 0);
    }
    INFO("max_blocks " << maxBlocks << ": " << b.request.blocks.size() << " blocks, " << cut
                       << " spans over several blocks");
    REQUIRE(pairs == 8);
    if (maxBlocks == 256) REQUIRE(cut > 0);  // fine blocks cut patterns
    if (maxBlocks == 6) REQUIRE(cut == 0);   // layer-sized blocks do not
    // Sharded per layer: Q, K, V (weights and biases), the output projection's weight, fc1
    // (weight and bias) and fc2's weight: 12 H^2 + 7 H elements. The output projection's and
    // fc2's biases are added after the all-reduce, with the layer norms: replicated.
    const core::Value& anyParam = m.graph.value(m.graph.paramInputs().front());
    int64_t elements = 1;
    for (int64_t d : anyParam.type.shape()) elements *= d;
    const double elementBytes = static_cast<double>(anyParam.type.bytes()) / elements;
    const double hidden = 256;
    REQUIRE(sharded == Approx(4 * (12 * hidden * hidden + 7 * hidden) * elementBytes));
    REQUIRE(sharded / total > 0.5);
    // Activations: the patterns' nodes' own, but for the column-parallel linears' (Q, K, V and
    // fc1 keep their input, whole on every member).
    std::vector<bool> main(m.graph.nodeCount());
    for (const AtomicGroup& g : b.groups) main[g.main] = true;
    double split = 0, whole = 0, spans = 0;
    for (const ShardPattern& p : findShardPatterns(m.graph))
      for (core::NodeId n : p.nodes) {
        if (!main[n]) continue;
        const double bytes = m.profile.nodes[n].activationBytes.perSample;
        (isLinearNode(m.graph, n) && n != p.rowLinear ? whole : split) += bytes;
      }
    for (const ShardableSpan& s : b.request.shardable) spans += s.cost.activationBytes.perSample;
    REQUIRE(whole > 0);
    REQUIRE(split > 0);
    CHECK(spans == Approx(split));
  }
}

// The smallest memory any plan of `request` at tensor-parallel degree 1 needs: its neediest
// block alone, over every replica count and ZeRO-1, recomputed, one sample per micro-batch.
double smallestPlainMemory(const PlanRequest& request) {
  const CostModel model(request);
  double needed = 0;
  for (int b = 0; b < static_cast<int>(request.blocks.size()); ++b) {
    double least = std::numeric_limits<double>::infinity();
    for (int r = 1; r <= request.devices && r <= request.batchSize; ++r)
      for (bool zero : {false, true}) {
        const StageChoice c{b, b, r, 0, true, 0, zero, 1};
        least = std::min(least, model.stage(c, 1, Schedule::OneFOneB).totalMemoryBytes);
      }
    needed = std::max(needed, least);
  }
  return needed;
}

TEST_CASE("a synthetic GPT whose layers do not fit one device plans tensor-parallel",
          "[decomposer]") {
  SyntheticModel m = smallTransformer(4, 1024);
  m.profile.comm.p2pIntraNode = m.profile.comm.allreduceIntraNode = {1e-5, 1e11};
  m.profile.comm.p2pInterNode = m.profile.comm.allreduceInterNode = {2e-5, 1e10};
  core::ClusterSpec cluster;
  cluster.devices = 32;
  cluster.devicesPerNode = 8;
  cluster.memoryPerDevice = int64_t{1} << 40;
  PlanOptions options;
  options.tensorParallel = "1";
  // Just below what the neediest block of the plain blocking needs whole, on any replicas.
  const double plainNeed =
      smallestPlainMemory(makeBlocking(m.graph, m.profile, cluster, 8, options).request);
  cluster.memoryPerDevice = static_cast<int64_t>(0.97 * plainNeed / 0.9);
  const Blocking plain = makeBlocking(m.graph, m.profile, cluster, 8, options);
  REQUIRE_THROWS_WITH(planStages(plain.request), Catch::Contains("tensor_parallel=auto"));
  options.tensorParallel = "auto";
  const Blocking blocking = makeBlocking(m.graph, m.profile, cluster, 8, options);
  const Plan plan = planStages(blocking.request);
  INFO(plan.toString());
  bool sharded = false;
  for (const StagePlan& s : plan.stages) sharded = sharded || s.tensorParallel > 1;
  REQUIRE(sharded);
  REQUIRE(evaluatePlan(blocking.request, plan).feasible);
  // The deployment records each stage's degree and its replicas' groups of ranks (the runtime
  // refuses it for now: staging's verifyDeployment).
  const PlanResult result = planGraph(m.graph, m.profile, cluster, 8, options);
  REQUIRE(result.deployment.stages.size() == result.plan.stages.size());
  for (size_t s = 0; s < result.plan.stages.size(); ++s) {
    const StagePlan& p = result.plan.stages[s];
    const core::StageDeployment& d = result.deployment.stages[s];
    CHECK(d.tensorParallel == p.tensorParallel);
    CHECK(d.replicaCount() == p.replicaCount);
    REQUIRE(d.ranks.size() == static_cast<size_t>(p.rankCount()));
    for (int r = 0; r < p.rankCount(); ++r) CHECK(d.ranks[r] == p.firstRank + r);
  }
}

TEST_CASE("a GPT's vocabulary embedding and LM head are split over the vocabulary",
          "[decomposer]") {
  TransformerShape shape;
  shape.layers = 2;
  shape.hidden = 256;
  shape.heads = 4;
  shape.sequence = 64;
  shape.vocabulary = 32000;  // a tokenizer's vocabulary: at least kVocabularyRows
  shape.causal = true;
  const SyntheticModel m = syntheticTransformer(shape, DeviceModel{});
  const std::vector<ShardPattern> patterns = findShardPatterns(m.graph);
  int embeddings = 0, heads = 0;
  for (const ShardPattern& p : patterns) {
    if (p.vocabulary == ShardPattern::Vocabulary::Embedding) {
      ++embeddings;
      REQUIRE(p.nodes.size() == 1);
      REQUIRE(m.graph.node(p.nodes[0]).kind == "aten::embedding");
      // The word table (32000 rows), not the position table (64 rows).
      REQUIRE(m.graph.node(p.nodes[0]).scope == "embeddings.word");
      REQUIRE(p.allreduced == m.graph.node(p.nodes[0]).outputs[0]);
    } else if (p.vocabulary == ShardPattern::Vocabulary::Head) {
      ++heads;
      REQUIRE(m.graph.node(p.nodes.front()).kind == "aten::matmul");
      REQUIRE(m.graph.node(p.nodes.back()).kind == "aten::cross_entropy");
      REQUIRE(m.graph.value(p.allreduced).type.shape() == std::vector<int64_t>{1, 64, 256});
    }
  }
  REQUIRE(embeddings == 1);
  REQUIRE(heads == 1);
  REQUIRE(patterns.size() == 2 * 2 + 2);  // attention and MLP per layer, embedding, head
  // Costed: the word table's and the head's parameters (weight and bias) are split, and each
  // pattern's one all-reduce is counted as half its bytes each way.
  double table = 0;  // bytes of the word table, as the graph types it
  for (const ShardPattern& p : patterns)
    if (p.vocabulary == ShardPattern::Vocabulary::Embedding)
      table = static_cast<double>(m.graph.value(m.graph.node(p.nodes[0]).inputs[0]).type.bytes());
  REQUIRE(table >= 32000.0 * 256);
  const Blocking b = buildBlocking(m.graph, m.profile, 256, 8, true);
  const std::vector<ShardableSpan>& spans = b.request.shardable;
  REQUIRE(spans.size() == patterns.size());
  CHECK(spans.front().cost.paramBytes == Approx(table));                   // the embedding
  CHECK(spans.back().cost.paramBytes == Approx(table * (1 + 1.0 / 256)));  // head weight + bias
  const core::LinearCost hidden = valueBytes(m.graph, m.profile, patterns.front().allreduced);
  CHECK(spans.front().cost.allreduceBytes.perSample == Approx(hidden.perSample / 2));
  CHECK(spans.front().cost.allreducePairs == 1);
  // A smaller table (the toy vocabulary of 1000) stays replicated.
  shape.vocabulary = 1000;
  for (const ShardPattern& p : findShardPatterns(syntheticTransformer(shape, DeviceModel{}).graph))
    REQUIRE(p.vocabulary == ShardPattern::Vocabulary::None);

  // Tied (the head reads the word table): one pattern from the embedding to the loss, which
  // splits the table once, and both all-reduces (the embedding's output, the head's input).
  shape.vocabulary = 32000;
  shape.tiedHead = true;
  const SyntheticModel tied = syntheticTransformer(shape, DeviceModel{});
  const std::vector<ShardPattern> tiedPatterns = findShardPatterns(tied.graph);
  REQUIRE(tiedPatterns.size() == 2 * 2 + 1);
  const ShardPattern& head = tiedPatterns.front();  // it starts at the embedding
  REQUIRE(head.vocabulary == ShardPattern::Vocabulary::Head);
  REQUIRE(head.tiedEmbedding == head.nodes.front());
  REQUIRE(tied.graph.node(head.tiedEmbedding).scope == "embeddings.word");
  REQUIRE(tied.graph.node(head.head).kind == "aten::matmul");
  REQUIRE(tied.graph.node(head.nodes.back()).kind == "aten::cross_entropy");
  const Blocking tb = buildBlocking(tied.graph, tied.profile, 256, 8, true);
  // Note [Tied tables across stages]: a span per end, each splitting the table, and a correction
  // over both taking one table back.
  REQUIRE(tb.patterns == tiedPatterns.size());
  REQUIRE(tb.request.shardable.size() == tiedPatterns.size() + 2);
  const ShardableSpan *embeddingEnd = nullptr, *headEnd = nullptr, *both = nullptr;
  const core::LinearCost embedded =
      valueBytes(tied.graph, tied.profile, tied.graph.node(head.tiedEmbedding).outputs[0]);
  const core::LinearCost headInput = valueBytes(tied.graph, tied.profile, head.allreduced);
  for (const ShardableSpan& s : tb.request.shardable) {  // ascending by their last blocks
    if (s.correction())
      both = &s;
    else if (s.cost.paramBytes >= table)
      (embeddingEnd ? headEnd : embeddingEnd) = &s;
  }
  REQUIRE(embeddingEnd);
  REQUIRE(headEnd);
  REQUIRE(both);
  CHECK(embeddingEnd->cost.allreduceBytes.perSample == Approx(embedded.perSample / 2));
  CHECK(headEnd->cost.allreduceBytes.perSample == Approx(headInput.perSample / 2));
  const int last = tb.blockCount() - 1;
  CHECK(embeddingEnd->firstBlock == 0);
  CHECK(embeddingEnd->cost.paramBytes == Approx(table));
  CHECK(headEnd->lastBlock == last);
  CHECK(headEnd->firstBlock > embeddingEnd->lastBlock);
  CHECK(headEnd->cost.paramBytes ==
        Approx(table * (1 + 1.0 / 256)));  // the table + the head's bias
  CHECK(both->firstBlock == 0);
  CHECK(both->lastBlock >= headEnd->firstBlock);  // the first block reading the table after it
  CHECK(both->lastBlock < last);
  CHECK(both->cost.paramBytes == Approx(-table));
  CHECK(both->cost.allreducePairs == 0);
  // A stage holding one end splits the whole table; one holding both splits it once.
  PlanRequest request = tb.request;
  request.options.tensorParallel = "auto";
  const RangeIndex index(request);
  auto split = [&](int first, int lastBlock) { return index.shardable(first, lastBlock, 2); };
  const double layers = split(embeddingEnd->lastBlock + 1, headEnd->firstBlock - 1).paramBytes;
  CHECK(split(0, embeddingEnd->lastBlock).paramBytes == Approx(table));
  CHECK(split(headEnd->firstBlock, last).paramBytes == Approx(table * (1 + 1.0 / 256)));
  CHECK(split(0, last).paramBytes == Approx(table * (1 + 1.0 / 256) + layers));
  CHECK(split(0, last).allreducePairs == 2 * 2 + 2);
  // Holding the embedding and the head's matmul, not its loss: the table runs whole (the head
  // reads it so), its embedding end too.
  CHECK(split(0, both->lastBlock).paramBytes ==
        Approx(split(embeddingEnd->lastBlock + 1, both->lastBlock).paramBytes));
  CHECK(index.range(0, last).paramBytes >= table);
  // The correction survives the request's text form (the planning service's); one taking back
  // more than the spans within it count, or with a cost of its own, is refused, naming it.
  request.devices = request.devicesPerNode = 8;
  request.deviceMemory = 1e12;
  request.batchSize = 8;
  request.validate();
  const PlanRequest back = PlanRequest::parse(request.toText());
  REQUIRE(back.shardable.size() == request.shardable.size());
  CHECK(std::count_if(back.shardable.begin(), back.shardable.end(),
                      [](const ShardableSpan& s) { return s.correction(); }) == 1);
  const size_t k = static_cast<size_t>(both - tb.request.shardable.data());
  PlanRequest bad = request;
  bad.shardable[k].cost.paramBytes = -2 * table;
  REQUIRE_THROWS_WITH(bad.validate(), Catch::Contains("tied table's correction") &&
                                          Catch::Contains("taking back no more than"));
  bad = request;
  bad.shardable[k].cost.allreducePairs = 1;
  REQUIRE_THROWS_WITH(bad.validate(), Catch::Contains("tied table's correction"));
}

TEST_CASE("a pattern is counted split only at the degrees the runtime splits it at",
          "[decomposer]") {
  // ShardableSpan::degrees, from splitDegrees (the check staging's rewrite runs): 12 heads
  // split 2 and 4 ways, not 8; a vocabulary of 50,257 rows at no degree; 32,000 at every one.
  TransformerShape shape;
  shape.layers = 2;
  shape.hidden = 768;
  shape.heads = 12;
  shape.sequence = 64;
  shape.vocabulary = 50257;
  shape.causal = true;
  const SyntheticModel gpt2 = syntheticTransformer(shape, DeviceModel{});
  const std::vector<ShardPattern> patterns = findShardPatterns(gpt2.graph);
  REQUIRE(patterns.size() == 2 * 2 + 2);
  const SplitDegrees split = splitDegrees(gpt2.graph, patterns);
  REQUIRE(split.degrees.size() == patterns.size());
  const unsigned all = ShardableSpan::kAllDegrees;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const ShardPattern& p = patterns[i];
    INFO("pattern " << i << " ending at " << gpt2.graph.node(p.nodes.back()).scope);
    if (p.vocabulary != ShardPattern::Vocabulary::None) CHECK(split.degrees[i] == 0u);
    else if (p.attention) CHECK(split.degrees[i] == ((1u << 2) | (1u << 4)));
    else CHECK(split.degrees[i] == all);  // the MLP: 3,072 features
  }
  REQUIRE(split.replicated.count(8));
  CHECK(split.replicated.at(8).size() == 2 + 2);  // the attentions, the embedding and the head
  CHECK(split.replicated.at(2).size() == 2);      // the embedding and the head
  bool heads = false;
  for (const std::string& line : split.replicated.at(8))
    heads = heads || line.find("not divisible by 8") != std::string::npos;
  CHECK(heads);
  const Blocking b = buildBlocking(gpt2.graph, gpt2.profile, 256, 8, true);
  REQUIRE(b.request.shardable.size() == patterns.size());
  int vocabulary = 0;
  for (const ShardableSpan& s : b.request.shardable) vocabulary += s.degrees == 0;
  CHECK(vocabulary == 2);

  shape.vocabulary = 32000;
  shape.heads = 16;
  const SyntheticModel even = syntheticTransformer(shape, DeviceModel{});
  const std::vector<ShardPattern> evenPatterns = findShardPatterns(even.graph);
  for (unsigned degrees : splitDegrees(even.graph, evenPatterns).degrees) CHECK(degrees == all);

  // A forced degree no pattern splits at is refused, naming why; auto plans without it.
  shape.layers = 1;
  shape.hidden = 15;
  shape.heads = 5;  // 5 heads of 3, an MLP of 60 features: neither splits 8 ways
  shape.vocabulary = 1000;
  const SyntheticModel odd = syntheticTransformer(shape, DeviceModel{});
  PlanOptions options;
  options.tensorParallel = "8";
  core::ClusterSpec cluster;
  cluster.devices = cluster.devicesPerNode = 8;
  cluster.memoryPerDevice = int64_t{1} << 34;
  REQUIRE_THROWS_WITH(makeBlocking(odd.graph, odd.profile, cluster, 8, options),
                      Catch::Contains("none of the 2 pattern(s)") &&
                          Catch::Contains("splits over 8 ranks"));
  options.tensorParallel = "2";
  REQUIRE(makeBlocking(odd.graph, odd.profile, cluster, 8, options).request.shardable.size() == 2);
}

TEST_CASE("a pattern's time on a member comes from the profile's split times where measured",
          "[decomposer]") {
  // Note [Tensor-parallel profile]: at degree 2 every pattern node measured but one (its whole
  // / 2 then), one of them slower split than whole (counted as the whole); none at 4.
  const SyntheticModel m = smallTransformer(2);
  core::GraphProfile profile = m.profile;
  profile.calibration = 0.5;
  const std::vector<ShardPattern> patterns = findShardPatterns(m.graph);
  REQUIRE(patterns.size() == 4);
  const Blocking plain = buildBlocking(m.graph, profile, 256, 8, true);
  std::vector<bool> main(m.graph.nodeCount());
  for (const AtomicGroup& g : plain.groups) main[g.main] = true;
  const core::NodeId unmeasured = patterns[0].rowLinear, slower = patterns[1].rowLinear;
  double expectForward = 0, expectBackward = 0, wholeForward = 0;
  for (const ShardPattern& p : patterns)
    for (core::NodeId n : p.nodes) {
      if (!main[n]) continue;
      core::NodeProfile& node = profile.nodes[n];
      const core::LinearCost f = node.forwardSeconds, b = node.backwardSeconds;
      wholeForward += 0.5 * f.perSample;
      if (n == unmeasured) {
        expectForward += 0.5 * f.perSample / 2;
        expectBackward += 0.5 * b.perSample / 2;
        continue;
      }
      const double share = n == slower ? 3.0 : 0.7;
      node.split.push_back({2, {f.fixed * share, f.perSample * share},
                            {b.fixed * 0.6, b.perSample * 0.6}});
      expectForward += 0.5 * f.perSample * std::min(1.0, share);
      expectBackward += 0.5 * b.perSample * 0.6;
    }
  const Blocking b = buildBlocking(m.graph, profile, 256, 8, true);
  REQUIRE(b.blockFirstGroup == plain.blockFirstGroup);
  double forward = 0, backward = 0, whole = 0;
  for (const ShardableSpan& s : b.request.shardable) {
    REQUIRE(s.measured[ShardableSpan::slot(2)].has_value());
    CHECK_FALSE(s.measured[ShardableSpan::slot(4)].has_value());
    forward += s.measured[0]->forwardSeconds.perSample;
    backward += s.measured[0]->backwardSeconds.perSample;
    whole += s.cost.forwardSeconds.perSample;
    // At 4 (not measured): the whole / 4.
    CHECK(s.costAt(4).memberForwardSeconds.perSample ==
          Approx(s.cost.forwardSeconds.perSample / 4));
    CHECK(s.costAt(2).memberForwardSeconds.perSample == s.measured[0]->forwardSeconds.perSample);
  }
  CHECK(whole == Approx(wholeForward));
  CHECK(forward == Approx(expectForward));
  CHECK(backward == Approx(expectBackward));
  PlanRequest request = b.request;  // each member time within its whole
  request.devices = request.devicesPerNode = 8;
  request.deviceMemory = 1e12;
  request.batchSize = 8;
  request.validate();
}

// The planner counts a pattern split in a stage of blocks [f, l] at degree t when its span lies
// in [f, l] and it splits at t in the whole graph (ShardableSpan::degrees); the runtime shards
// what planPatterns finds in the stage's own nodes. Its checks that look outside the pattern
// (a weight's aten::t reader, a view's size list) read values no block boundary cuts (neither
// non-tensor values nor tensors without a batch dimension cross one), so the two agree on
// every block range: checked here for every range of a GPT's blocks, at 2, 4 and 8, with an
// untied and a tied head.
TEST_CASE("every block range shards at run time exactly the spans the planner counts split",
          "[decomposer]") {
  for (bool tied : {false, true}) {
    TransformerShape shape;
    shape.layers = 2;
    shape.hidden = 384;
    shape.heads = 12;  // 12 heads of 32: the attention splits at 2 and 4, not 8
    shape.sequence = 64;
    shape.vocabulary = 32000;
    shape.causal = true;
    shape.tiedHead = tied;
    const SyntheticModel gpt = syntheticTransformer(shape, DeviceModel{});
    const Blocking b = buildBlocking(gpt.graph, gpt.profile, 12, 8, true);
    const int blocks = b.blockCount();
    INFO((tied ? "tied" : "untied") << " head, " << blocks << " blocks");
    REQUIRE(blocks >= 6);
    std::vector<int> blockOf(gpt.graph.nodeCount(), -1);
    for (int k = 0; k < blocks; ++k)
      for (core::NodeId n : b.stageNodes(k, k)) blockOf[n] = k;
    const std::vector<ShardPattern> patterns = findShardPatterns(gpt.graph);
    const SplitDegrees split = splitDegrees(gpt.graph, patterns);
    // The spans are the patterns' block ranges with their degrees; a tied table's (Note [Tied
    // tables across stages]) are its ends' and a correction from the embedding to the first
    // block reading the table after it.
    std::vector<std::tuple<int, int, unsigned, bool>> spans, expected;
    for (const ShardableSpan& s : b.request.shardable)
      spans.emplace_back(s.firstBlock, s.lastBlock, s.degrees, s.correction());
    struct Ends {
      int embedding = -1, reader = -1, headFirst = -1;  // blocks
      core::NodeId headNode = core::kNoNode;            // the head end's first node
    };
    std::vector<Ends> ends(patterns.size());
    for (size_t i = 0; i < patterns.size(); ++i) {
      const ShardPattern& p = patterns[i];
      const int last = blockOf[p.nodes.back()];
      if (p.tiedEmbedding == core::kNoNode) {
        expected.emplace_back(blockOf[p.nodes.front()], last, split.degrees[i], false);
        continue;
      }
      Ends& e = ends[i];
      e.embedding = blockOf[p.tiedEmbedding];
      e.headNode = p.nodes[1];
      e.headFirst = blockOf[e.headNode];
      e.reader = blocks;
      for (core::NodeId c : gpt.graph.consumers(gpt.graph.node(p.tiedEmbedding).inputs[0]))
        if (c != p.tiedEmbedding) e.reader = std::min(e.reader, blockOf[c]);
      REQUIRE(e.embedding < e.headFirst);
      REQUIRE(e.reader < blocks);
      expected.emplace_back(e.headFirst, last, split.degrees[i], false);
      expected.emplace_back(e.embedding, e.embedding, split.degrees[i], false);
      expected.emplace_back(e.embedding, e.reader, split.degrees[i], true);
    }
    std::sort(spans.begin(), spans.end());
    std::sort(expected.begin(), expected.end());
    REQUIRE(spans == expected);
    REQUIRE(patterns.size() == (tied ? 2 * 2 + 1 : 2 * 2 + 2));
    int ranges = 0, sharded = 0, tiedEnds = 0;
    for (int first = 0; first < blocks; ++first)
      for (int last = first; last < blocks; ++last)
        for (int t : {2, 4, 8}) {
          std::vector<core::NodeId> counted, run;
          for (size_t i = 0; i < patterns.size(); ++i) {
            const int pf = blockOf[patterns[i].nodes.front()],
                      pl = blockOf[patterns[i].nodes.back()];
            if (((split.degrees[i] >> t) & 1u) == 0) continue;
            if (first <= pf && pl <= last) {
              counted.push_back(patterns[i].nodes.front());
            } else if (ends[i].embedding >= 0) {  // one end alone
              const Ends& e = ends[i];
              const bool embedding = first <= e.embedding && e.embedding <= last;
              const size_t before = counted.size();
              if (!embedding && first <= e.headFirst && pl <= last)
                counted.push_back(e.headNode);
              else if (embedding && last < e.reader)
                counted.push_back(patterns[i].tiedEmbedding);
              tiedEnds += counted.size() > before;
            }
          }
          std::vector<std::string> skipped;
          for (const PatternPlan& p :
               planPatterns(gpt.graph, b.stageNodes(first, last), t, skipped))
            run.push_back(p.nodes.front());
          std::sort(counted.begin(), counted.end());
          std::sort(run.begin(), run.end());
          INFO("blocks [" << first << ", " << last << "] at " << t);
          CHECK(run == counted);
          ++ranges;
          sharded += !run.empty();
        }
    CHECK(ranges == 3 * blocks * (blocks + 1) / 2);
    CHECK(sharded > ranges / 4);
    if (tied) CHECK(tiedEnds > 0);
  }
}

TEST_CASE("a linear layer's weight is read through any 2-D transpose", "[decomposer]") {
  // Note [Tensor-parallel patterns]: aten::t (nn.Linear traced), aten::numpy_T (`x @ w.T`),
  // transpose of the two dimensions, permute by [1, 0]; not a 3-D transpose, nor permute [0, 1].
  core::Graph g;
  const auto f32 = [](std::vector<int64_t> shape) {
    return core::Type::tensor(core::DType::Float32, std::move(shape));
  };
  const auto constant = [&](core::AttributeValue value, core::Type type) {
    return g.node(g.addNode("prim::Constant", {}, {std::move(type)}, {{"value", std::move(value)}}))
        .outputs[0];
  };
  const auto integer = [&](int64_t v) {
    return constant(v, core::Type::scalar(core::TypeKind::Int));
  };
  const core::Type ints = core::Type::list(core::Type::scalar(core::TypeKind::Int));
  const core::ValueId w = g.addInput("w", f32({4, 8}), core::ValueClass::Param);
  const core::ValueId cube = g.addInput("cube", f32({2, 4, 8}), core::ValueClass::Param);
  const auto node = [&](const char* kind, std::vector<core::ValueId> inputs,
                        std::vector<int64_t> shape) {
    return g.addNode(kind, inputs, {f32(std::move(shape))});
  };
  CHECK(transposes2d(g, node("aten::t", {w}, {8, 4})));
  CHECK(transposes2d(g, node("aten::numpy_T.default", {w}, {8, 4})));
  CHECK(transposes2d(g, node("aten::transpose.int", {w, integer(0), integer(1)}, {8, 4})));
  CHECK(transposes2d(g, node("aten::transpose.int", {w, integer(-1), integer(-2)}, {8, 4})));
  CHECK(transposes2d(
      g, node("aten::permute", {w, constant(std::vector<int64_t>{1, 0}, ints)}, {8, 4})));
  const core::NodeId listed = g.addNode("prim::ListConstruct", {integer(1), integer(0)}, {ints});
  CHECK(transposes2d(g, node("aten::permute.default", {w, g.node(listed).outputs[0]}, {8, 4})));
  CHECK_FALSE(transposes2d(
      g, node("aten::permute", {w, constant(std::vector<int64_t>{0, 1}, ints)}, {4, 8})));
  CHECK_FALSE(transposes2d(g, node("aten::transpose", {w, integer(0), integer(0)}, {4, 8})));
  CHECK_FALSE(transposes2d(g, node("aten::transpose", {cube, integer(1), integer(2)}, {2, 8, 4})));
  CHECK_FALSE(transposes2d(g, node("aten::t", {cube}, {2, 8, 4})));
  CHECK_FALSE(transposes2d(g, node("aten::relu", {w}, {4, 8})));
}
