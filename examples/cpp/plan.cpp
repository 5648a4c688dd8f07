// C++ example of the torch-free planner (autostage::decomposer, target autostage::decomposer):
// describe a model as a sequence of blocks with their costs, ask for a plan on a cluster, print
// the partition log and the plan.
//
//   plan [DEVICES] [MEMORY_GIB]      (defaults: 8 devices of 16 GiB, 4 per node)
//
// The request here is 24 equal transformer-layer blocks of 50 M parameters; a real one comes from
// a profiled graph (decomposer::makeBlocking) or `autostage plan --graph`.
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "decomposer/dp_stage_search.h"
#include "decomposer/planner.h"

int main(int argc, char** argv) {
  using namespace autostage::decomposer;
  try {
    PlanRequest request;
    for (int layer = 0; layer < 24; ++layer) {
      BlockCost block;
      block.name = "layers." + std::to_string(layer);
      block.forwardSeconds = {2e-4, 1.5e-4};  // fixed + per sample (seconds)
      block.backwardSeconds = {4e-4, 3e-4};
      block.activationBytes = {0, 24e6};      // kept for backward, per sample
      block.workingBytes = {1e6, 4e6};
      block.cutBytesAfter = {0, 2e6};         // activations crossing a cut after this block
      block.paramBytes = 50e6 * 4;            // 50 M fp32 parameters
      request.blocks.push_back(block);
    }
    request.comm.p2pIntraNode = request.comm.p2pInterNode = {20e-6, 50e9};
    request.comm.allreduceIntraNode = request.comm.allreduceInterNode = {50e-6, 40e9};
    request.devices = argc > 1 ? std::atoi(argv[1]) : 8;
    request.devicesPerNode = 4;
    request.deviceMemory = (argc > 2 ? std::atof(argv[2]) : 16.0) * (1 << 30);
    request.batchSize = 64;
    request.options.usage = PlanUsage::TrainStep;  // the API that will run it: 1f1b allowed
    request.validate();
    Plan plan = planDynamicProgramming(request);
    PlanEvaluation evaluation = evaluatePlan(request, plan);
    logPlan(request, plan, evaluation);  // the partition log, RaNNC's shape
    std::printf("plan: %s\n", plan.toString().c_str());
    std::printf("predicted iteration %.1f ms, peak memory %.2f GiB per device\n",
                evaluation.iterationSeconds * 1e3, evaluation.peakMemoryBytes / (1 << 30));
  } catch (const autostage::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
