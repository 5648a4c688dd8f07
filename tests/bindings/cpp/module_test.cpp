// The C++ API as a user sees it (bindings/cpp/module.h): config keys as options, state dicts in and
// out, bad input with the Python API's messages. In-process ranks (thread backend).
#include <torch/torch.h>

#include "bindings/cpp/module.h"
#include "comm/thread_backend.h"
#include "core/config.h"
#include "core/error.h"
#include "test_support.h"
#include "scratch_files.h"

#include "catch_torch.h"  // last: glog's CHECK must not replace Catch2's (NOTES-libtorch.md)

namespace autostage {
namespace {

constexpr int kWorld = 2;

// The process-wide config is not safe to set while other threads read it (thread ranks making
// Modules do): set what these tests need once, before any test runs. zero=0 is what the C++ API
// turns zero=auto into when a Module is made (Note [ZeRO-1]); set here, no rank thread writes it.
const bool kConfigured = [] {
  core::globalConfig().set("measure_comm", "false", "test");
  core::globalConfig().set("profile_pass_seconds", "0", "test");
  core::globalConfig().set("zero", "0", "test");
  return true;
}();

// Options for in-process ranks: this rank's thread backend, the default planner over it.
ModuleOptions threadOptions(comm::Backend& backend) {
  ModuleOptions options = ModuleOptions::fromConfig();
  options.backend = staging::testing::borrow(backend);
  return options;
}

// A deep copy whose parameters are leaves that require grad, like the original's.
torch::jit::Module copyOf(const torch::jit::Module& module) {
  torch::NoGradGuard noGrad;  // else the copies are outputs of clone() in the autograd graph
  torch::jit::Module copy = module.deepcopy();
  for (at::Tensor p : copy.parameters()) p.requires_grad_(true);
  return copy;
}

// One copy per rank, made here: clone() or deepcopy() of one jit::Module from several thread
// ranks at once is not thread-safe (it corrupted the heap about once in 30 runs).
std::vector<torch::jit::Module> perRank(const torch::jit::Module& module) {
  std::vector<torch::jit::Module> copies;
  for (int r = 0; r < kWorld; ++r) copies.push_back(copyOf(module));
  return copies;
}

TEST_CASE("a config key that does not exist is a ConfigError naming it", "[api]") {
  torch::manual_seed(1);
  CHECK_THROWS_AS(Module(staging::testing::makeMlp(), ConfigOptions{{"partition_nmu", "2"}}),
                  ConfigError);
  CHECK_THROWS_WITH(Module(staging::testing::makeMlp(), ConfigOptions{{"partition_nmu", "2"}}),
                    Catch::Contains("unknown option 'partition_nmu'") &&
                        Catch::Contains("known options"));
  CHECK_THROWS_WITH(Module(staging::testing::makeMlp(), ConfigOptions{{"partition_num", "two"}}),
                    Catch::Contains("partition_num"));
}

TEST_CASE("the C++ API plans without ZeRO-1 and refuses zero=1", "[api]") {
  std::string refused, planned;
  auto construct = [&](const std::string& zero) {
    core::globalConfig().set("zero", zero, "test");
    std::string message;
    staging::testing::rethrowFirst(comm::runThreadRanks(1, [&](comm::ThreadBackend& backend) {
      message = staging::testing::errorOf([&] {
        Module module(staging::testing::makeMlp(), threadOptions(backend));
        module.forward({torch::randn({4, 8})});
        planned = module.deployment().options.at("zero");
      });
    }));
    return message;
  };
  refused = construct("1");
  CHECK(construct("auto").empty());
  // Note [Per-module plan options]: this module plans with zero=0, the process keeps auto.
  const std::string processWide = core::globalConfig().getString("zero");
  core::globalConfig().set("zero", "0", "test");  // as kConfigured left it
  CHECK_THAT(refused, Catch::Contains("zero=1") && Catch::Contains("shardsOptimizer") &&
                          Catch::Contains("ZeroParameters"));
  CHECK(planned == "0");
  CHECK(processWide == "auto");
}

TEST_CASE("a module without parameters runs, as in Python", "[api]") {
  at::set_num_threads(1);
  torch::jit::Module relu("Relu");
  relu.define("def forward(self, x):\n    return torch.relu(x)\n");
  at::Tensor x = torch::randn({kWorld * 4, 3});
  const std::vector<torch::jit::Module> copies = perRank(relu);
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(copies[b.rank()], threadOptions(b));
    at::Tensor rows = x.narrow(0, 4 * b.rank(), 4);
    RANK_CHECK(torch::equal(module.forward({rows})[0], torch::relu(rows)));
    RANK_CHECK(module.parameters().empty());
  }));
}

TEST_CASE("inputs on a device autostage cannot move from are refused on every rank", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(3);
  const std::vector<torch::jit::Module> copies = perRank(staging::testing::makeMlp());
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(copies[b.rank()], threadOptions(b));
    // Rank 1 alone passes a tensor of another device (meta: this machine has no GPU).
    at::Tensor x = b.rank() == 1 ? at::empty({4, 8}, at::TensorOptions().device(at::kMeta))
                                 : torch::randn({4, 8});
    module.forward({x});
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                      Catch::Contains("rank 1: input 0 is on meta") &&
                          Catch::Contains("pass inputs on the cpu or a CUDA device"));
  }
}

// Note [Placing the model]: a model whose tensors sit on another device than the stages' is
// refused when the Module is made, on every rank. Without a GPU here, "another device" is meta
// (the CUDA cases are unit-tested over device values in tests/driver/model_device_test.cpp).
TEST_CASE("a model with a parameter on another device is refused on every rank", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(3);
  std::vector<torch::jit::Module> copies = perRank(staging::testing::makeMlp());
  copies[1].attr("fc2").toModule().setattr(
      "weight", at::empty({16, 16}, at::TensorOptions().device(at::kMeta)));
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(copies[b.rank()], threadOptions(b));
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[r]), ConfigError);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                      Catch::Contains("placing the model on cpu failed on rank 1: the model's "
                                      "tensor 'fc2.weight' is on meta, but this rank's stages "
                                      "run on cpu"));
  }
  // On the stages' device (the CPU here) the model is left as it is, tensors and all.
  const std::vector<torch::jit::Module> fine = perRank(staging::testing::makeMlp());
  const void* weight = fine[0].attr("fc1").toModule().attr("weight").toTensor().data_ptr();
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(fine[b.rank()], threadOptions(b));
  }));
  CHECK(fine[0].attr("fc1").toModule().attr("weight").toTensor().data_ptr() == weight);
}

TEST_CASE("loadStateDict loads on every rank and refuses what does not fit, loading nothing",
          "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(2);
  torch::jit::Module reference = staging::testing::makeMlp();
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& p : reference.named_parameters()) state.emplace_back(p.name, p.value * 3);
  at::Tensor x = torch::randn({kWorld * 4, 8});
  at::Tensor expected;
  {
    torch::NoGradGuard noGrad;
    for (const auto& p : reference.named_parameters()) p.value.mul_(3);
    expected = reference.forward({x}).toTensor();
  }
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    torch::manual_seed(5);
    Module module(staging::testing::makeMlp(), threadOptions(b));
    at::Tensor rows = x.narrow(0, 4 * b.rank(), 4);
    module.forward({rows});  // deployed first: the stages see what is loaded later
    auto wrong = state;
    wrong[0].second = torch::zeros({1, 1});
    wrong.emplace_back("extra", torch::zeros({2}));
    const auto before = module.stateDict();
    RANK_CHECK(staging::testing::throwsAs<FormatError>([&] { module.loadStateDict(wrong); }));
    RANK_CHECK_THAT(staging::testing::errorOf([&] { module.loadStateDict(wrong); }),
                    Catch::Contains("'" + state[0].first + "' has shape [1, 1]") &&
                        Catch::Contains("'extra' is in the checkpoint but not in the model") &&
                        Catch::Contains("Nothing was loaded"));
    const auto after = module.stateDict();
    for (size_t i = 0; i < before.size(); ++i)
      RANK_CHECK_INFO(before[i].first, torch::equal(before[i].second, after[i].second));
    module.loadStateDict(state);
    at::Tensor out = module.forward({rows})[0];
    RANK_CHECK(staging::testing::allClose(out, expected.narrow(0, 4 * b.rank(), 4)));
  }));
}

// forward(x) = relu(x w1) [* 0.5 in train mode] w2: the modes compute differently, like Dropout.
torch::jit::Module makeModeNet() {
  torch::jit::Module net("ModeNet");
  net.register_attribute("training", c10::BoolType::get(), true);
  net.register_parameter("w1", torch::randn({8, 16}).requires_grad_(), false);
  net.register_parameter("w2", torch::randn({16, 4}).requires_grad_(), false);
  net.define(R"(
def forward(self, x):
    h = torch.relu(torch.mm(x, self.w1))
    if self.training:
        h = h * 0.5
    return torch.mm(h, self.w2)
)");
  return net;
}


TEST_CASE("train()/eval() run each mode's own deployment, sharing the parameters", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(4);
  torch::jit::Module reference = makeModeNet();
  const torch::jit::Module initial = copyOf(reference);
  at::Tensor x = torch::randn({kWorld * 4, 8});
  // Plain LibTorch: a train-mode step of SGD, then an eval forward, then train again. Each rank
  // backpropagates the sum of its rows' outputs and gradients are averaged over the ranks (like
  // DistributedDataParallel): the gradient of sum(out) / world.
  at::Tensor trainOut = reference.forward({x}).toTensor();
  (trainOut.sum() / kWorld).backward();
  std::map<std::string, at::Tensor> grads;
  {
    torch::NoGradGuard noGrad;
    for (const auto& p : reference.named_parameters()) {
      grads[p.name] = p.value.grad().clone();
      p.value.sub_(0.1 * p.value.grad());
    }
  }
  reference.eval();
  at::Tensor evalOut;
  {
    torch::NoGradGuard noGrad;
    evalOut = reference.forward({x}).toTensor();
  }
  reference.train();
  at::Tensor trainAgain = reference.forward({x}).toTensor().detach();

  const std::vector<torch::jit::Module> copies = perRank(initial);
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(copies[b.rank()], threadOptions(b));
    const at::Tensor rows = x.narrow(0, 4 * b.rank(), 4);
    auto mine = [&](const at::Tensor& global) { return global.narrow(0, 4 * b.rank(), 4); };
    RANK_CHECK(module.isTraining());
    at::Tensor out = module.forward({rows})[0];
    RANK_CHECK(staging::testing::allClose(out, mine(trainOut)));
    out.sum().backward();
    for (const auto& [name, p] : module.namedParameters()) {
      RANK_CHECK_INFO(name, staging::testing::allClose(p.grad(), grads.at(name)));
      torch::NoGradGuard noGrad;
      p.sub_(0.1 * p.grad());
    }
    const int selection = module.trainingSelection();
    module.eval();
    RANK_CHECK(!module.isTraining());
    {
      torch::NoGradGuard noGrad;
      RANK_CHECK(staging::testing::allClose(module.forward({rows})[0], mine(evalOut)));
    }
    RANK_CHECK(module.usage() == core::PlanUsage::Inference);
    RANK_CHECK(module.trainingSelection() == selection);  // the optimizer's parameters stay
    module.train();
    RANK_CHECK(staging::testing::allClose(module.forward({rows})[0].detach(), mine(trainAgain)));
    RANK_CHECK(module.usage() == core::PlanUsage::ForwardBackward);
    RANK_CHECK(module.deploymentCount() == 2);  // train mode's came back, not planned again
    RANK_CHECK(module.trainingSelection() == selection);
  }));
}

TEST_CASE("eval() of a module without modes says what is missing", "[api]") {
  torch::jit::Module relu("Relu");
  relu.define("def forward(self, x):\n    return torch.relu(x)\n");
  staging::testing::rethrowFirst(comm::runThreadRanks(1, [&](comm::ThreadBackend& b) {
    Module module(relu.clone(), threadOptions(b));
    CHECK_THROWS_AS(module.eval(), UnsupportedError);
    CHECK_THROWS_WITH(module.eval(), Catch::Contains("has no 'training' attribute") &&
                                         Catch::Contains("register_attribute(\"training\""));
  }));
}

TEST_CASE("saveDeployment writes what a later job loads instead of planning", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(8);
  const torch::jit::Module net = makeModeNet();
  const std::string path = testing::scratchPath("api_tests", "saved.deployment").string();
  at::Tensor x = torch::randn({kWorld * 4, 8});
  std::vector<core::Deployment> planned(kWorld), loaded(kWorld);
  const std::vector<torch::jit::Module> firstCopies = perRank(net), secondCopies = perRank(net);
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    at::Tensor rows = x.narrow(0, 4 * b.rank(), 4);
    at::Tensor first;
    {
      Module module(firstCopies[b.rank()], threadOptions(b));
      first = module.forward({rows})[0].detach();
      planned[b.rank()] = module.deployment();
      if (b.rank() == 0) module.saveDeployment(path);
      module.barrier();
    }
    ModuleOptions options = threadOptions(b);
    options.deploymentPath = path;
    Module module(secondCopies[b.rank()], options);
    RANK_CHECK(torch::equal(module.forward({rows})[0], first));
    loaded[b.rank()] = module.deployment();
  }));
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    CHECK(loaded[r].stages.size() == planned[r].stages.size());
    CHECK(loaded[r].microBatchCount == planned[r].microBatchCount);
    for (size_t s = 0; s < planned[r].stages.size(); ++s)
      CHECK(loaded[r].stages[s].ranks == planned[r].stages[s].ranks);
  }
}

TEST_CASE("gradient accumulation and clipGradNorm equal plain LibTorch", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(9);
  torch::jit::Module reference = makeModeNet();
  const torch::jit::Module initial = copyOf(reference);
  at::Tensor x1 = torch::randn({kWorld * 4, 8}), x2 = torch::randn({kWorld * 4, 8});
  // Plain LibTorch: two accumulated backwards (each rank's sum, averaged over ranks), then the
  // whole model's gradients clipped to norm 0.5.
  (reference.forward({x1}).toTensor().sum() / kWorld).backward();
  (reference.forward({x2}).toTensor().sum() / kWorld).backward();
  std::vector<at::Tensor> params;
  for (const auto& p : reference.named_parameters()) params.push_back(p.value);
  const double norm = torch::nn::utils::clip_grad_norm_(params, 0.5);
  std::map<std::string, at::Tensor> clipped;
  for (const auto& p : reference.named_parameters()) clipped[p.name] = p.value.grad();

  Module::delayGradAllreduce(true);  // process-wide, like autostage.delay_grad_allreduce
  const std::vector<torch::jit::Module> copies = perRank(initial);
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    ModuleOptions options = threadOptions(b);
    options.planner = [](const driver::PlanningInput& in) {  // one stage on both ranks
      return staging::testing::makeDeployment(in.model.graph, {{0, 1}}, in.worldSize, 2);
    };
    Module module(copies[b.rank()], options);
    module.forward({x1.narrow(0, 4 * b.rank(), 4)})[0].sum().backward();
    module.forward({x2.narrow(0, 4 * b.rank(), 4)})[0].sum().backward();
    module.allreduceGrads();
    const double mineNorm = module.clipGradNorm(0.5);
    RANK_CHECK_INFO(mineNorm << " vs " << norm, mineNorm == Approx(norm).epsilon(1e-5));
    for (const auto& [name, p] : module.namedParameters())
      RANK_CHECK_INFO(name, staging::testing::allClose(p.grad(), clipped.at(name)));
  });
  Module::delayGradAllreduce(false);
  staging::testing::rethrowFirst(errors);
}

TEST_CASE("ZeRO-1 through the C++ API: Adam over ZeroParameters equals plain LibTorch", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(21);
  torch::jit::Module reference = staging::testing::makeMlp();
  const torch::jit::Module initial = copyOf(reference);
  constexpr int kSteps = 3;
  std::vector<at::Tensor> xs, ys, refParams;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(torch::randn({kWorld * 4, 8}));
    ys.push_back(torch::randn({kWorld * 4, 4}));
  }
  for (const at::Tensor& p : reference.parameters()) refParams.push_back(p);
  torch::optim::Adam refOptimizer(refParams, torch::optim::AdamOptions(0.01));
  std::vector<std::map<std::string, at::Tensor>> expected(kSteps);  // parameters after each step
  for (int s = 0; s < kSteps; ++s) {
    refOptimizer.zero_grad();
    torch::mse_loss(reference.forward({xs[s]}).toTensor(), ys[s]).backward();
    refOptimizer.step();
    for (const auto& p : reference.named_parameters()) expected[s][p.name] = p.value.detach().clone();
  }

  const std::vector<torch::jit::Module> copies = perRank(initial);
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    ModuleOptions options = threadOptions(b);
    options.planner = [](const driver::PlanningInput& in) {  // one stage, 2 replicas, ZeRO-1
      core::Deployment d =
          staging::testing::makeDeployment(in.model.graph, {{0, 1}}, in.worldSize, 2);
      d.stages[0].zero = true;
      return d;
    };
    Module module(copies[b.rank()], options, /*shardsOptimizer=*/true);
    std::unique_ptr<ZeroParameters> pieces;
    std::unique_ptr<torch::optim::Adam> optimizer;
    for (int s = 0; s < kSteps; ++s) {
      at::Tensor out = module.forward({xs[s].narrow(0, 4 * b.rank(), 4)})[0];
      torch::mse_loss(out, ys[s].narrow(0, 4 * b.rank(), 4)).backward();
      if (!pieces) {  // after the first training call, like an optimizer over parameters()
        pieces = std::make_unique<ZeroParameters>(module);
        optimizer = std::make_unique<torch::optim::Adam>(pieces->tensors(),
                                                         torch::optim::AdamOptions(0.01));
      }
      pieces->step(*optimizer);
      for (const auto& [name, p] : module.namedParameters())
        RANK_CHECK_INFO(name << " after step " << s,
                        staging::testing::allClose(p, expected[s].at(name)));
      for (const at::Tensor& p : module.parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
    }
    // Each replica steps about half of the elements: its optimizer state is halved.
    int64_t stepped = 0, whole = 0;
    for (const at::Tensor& t : pieces->tensors()) stepped += t.numel();
    for (const at::Tensor& p : module.parameters()) whole += p.numel();
    RANK_CHECK_INFO(stepped << " of " << whole, stepped > 0 && stepped <= whole / 2 + 1);
  });
  staging::testing::rethrowFirst(errors);
}

TEST_CASE("backward runs after the Module that made the outputs is gone", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(10);
  torch::jit::Module reference = makeModeNet();
  const torch::jit::Module initial = copyOf(reference);
  at::Tensor x = torch::randn({kWorld * 4, 8});
  (reference.forward({x}).toTensor().sum() / kWorld).backward();
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : reference.named_parameters()) grads[p.name] = p.value.grad();
  const std::vector<torch::jit::Module> copies = perRank(initial);
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    torch::jit::Module mine = copies[b.rank()];
    at::Tensor out;
    {
      Module module(mine, threadOptions(b));
      out = module.forward({x.narrow(0, 4 * b.rank(), 4)})[0];
    }
    out.sum().backward();  // the stages' executor and imported model outlive the Module
    for (const auto& p : mine.named_parameters()) {
      if (!p.value.grad().defined()) continue;  // held by the other rank
      RANK_CHECK_INFO(p.name, staging::testing::allClose(p.value.grad(), grads.at(p.name)));
    }
  }));
}

TEST_CASE("after an eval import fails, train mode takes its deployment back", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(11);
  torch::jit::Module net("BadEval");
  net.register_attribute("training", c10::BoolType::get(), true);
  net.register_parameter("w", torch::randn({8, 4}).requires_grad_(), false);
  net.define(R"(
def forward(self, x):
    if self.training:
        return torch.mm(x, self.w)
    return torch.mm(x, self.w[:3])
)");
  const torch::jit::Module initial = copyOf(net);
  at::Tensor x = torch::randn({kWorld * 4, 8});
  const std::vector<torch::jit::Module> copies = perRank(initial);
  staging::testing::rethrowFirst(comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(copies[b.rank()], threadOptions(b));
    at::Tensor rows = x.narrow(0, 4 * b.rank(), 4);
    module.forward({rows});
    module.eval();
    RANK_CHECK_THAT(staging::testing::errorOf([&] { module.forward({rows}); }),
                    Catch::Contains("tracing and importing the model"));
    module.train();
    at::Tensor expected = torch::mm(rows, initial.attr("w").toTensor());
    RANK_CHECK(staging::testing::allClose(module.forward({rows})[0], expected));
    RANK_CHECK(module.deploymentCount() == 1);  // taken back, not planned again
  }));
}

TEST_CASE("a rank calling in another mode is refused on every rank", "[api]") {
  at::set_num_threads(1);
  torch::manual_seed(6);
  const std::vector<torch::jit::Module> copies = perRank(makeModeNet());
  auto errors = comm::runThreadRanks(kWorld, [&](comm::ThreadBackend& b) {
    Module module(copies[b.rank()], threadOptions(b));
    at::Tensor rows = torch::randn({4, 8});
    module.forward({rows});
    if (b.rank() == 1) module.eval();
    module.forward({rows});
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r]);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                      Catch::Contains("ranks called the module differently (rank 0: forward, "
                                      "train mode; rank 1: forward, eval mode)"));
  }
}

}  // namespace
}  // namespace autostage
