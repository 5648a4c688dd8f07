#pragma once
// What `autostage show` and `autostage report` derive from a deployment file alone: the
// per-stage timings for the pipeline simulator, memory parts and the text summary.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/deployment.h"
#include "decomposer/simulator.h"

namespace autostage::cli {

// Per-device memory of a stage, split as the cost model counts it (bytes).
struct MemoryParts {
  double params = 0, gradients = 0, optimizer = 0, activations = 0, working = 0, comm = 0;
  double total() const { return params + gradients + optimizer + activations + working + comm; }
};
MemoryParts memoryParts(const core::StageDeployment& stage);

// memoryMargin and usableMemory: core/deployment.h.
using core::memoryMargin;
using core::usableMemory;
// devicesPerNode as recorded, or worldSize (one node) for files that did not record it.
int devicesPerNode(const core::Deployment& deployment);

// Simulates one iteration from the deployment's recorded per-stage times.
decomposer::SimulationResult simulateDeployment(const core::Deployment& deployment);

// "1.23 ms", "4.5 s"; "2.00 GiB", "512.0 MiB".
std::string formatSeconds(double seconds);
std::string formatBytes(double bytes);
// "0-3", "0,2,5", "4-5,7".
std::string formatRanks(const std::vector<int>& ranks);
// The hosts `ranks` (every rank when empty) ran on, "a, b" in order of first appearance; "" when
// the deployment records no hosts (Note [Hosts of a deployment] in core/deployment.h).
std::string hostNames(const core::Deployment& deployment, const std::vector<int>& ranks);

// The text `autostage show` prints; for a deployment that ran on several hosts, after the
// summary, the lines `hosts: a (ranks 0,1), b (ranks 2,3)` and `stages on hosts: STAGE_0_3 on a
// (ranks 0,1); ...` (Note [Hosts of a deployment] in core/deployment.h).
void printDeployment(std::ostream& out, const core::Deployment& deployment);

}  // namespace autostage::cli
