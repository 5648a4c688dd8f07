#pragma once
// Measured (or estimated) costs of a graph's nodes and of communication: what the planner
// consumes. Produced by profiler/ (or by decomposer/synthetic for graphs we cannot run);
// serialised by core/proto (profile_file.h). Torch-free plain data.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/ir/value.h"

namespace autostage::core {

// A quantity that grows linearly with the (micro-)batch size: fixed + perSample * batch.
struct LinearCost {
  double fixed = 0;
  double perSample = 0;
  double at(double batch) const { return fixed + perSample * batch; }
  bool operator==(const LinearCost& o) const { return fixed == o.fixed && perSample == o.perSample; }
};

// A node group's times on one member of a tensor-parallel group of `degree` ranks: the group run
// on that member's slices (Note [Tensor-parallel profile] in profiler/split_profile.h).
struct SplitTimes {
  int degree = 0;
  LinearCost forwardSeconds;
  LinearCost backwardSeconds;
  bool operator==(const SplitTimes& o) const {
    return degree == o.degree && forwardSeconds == o.forwardSeconds &&
           backwardSeconds == o.backwardSeconds;
  }
};

// Costs of one node group (a BATCH/LOSS node with the PARAM/CONST nodes feeding only it), keyed by
// the BATCH/LOSS node. PARAM/CONST nodes have all-zero profiles except paramBytes where relevant.
struct NodeProfile {
  NodeId node = kNoNode;
  LinearCost forwardSeconds;
  LinearCost backwardSeconds;
  LinearCost outputBytes;      // bytes of the node's outputs
  LinearCost activationBytes;  // bytes kept from forward for backward
  LinearCost workingBytes;     // peak temporary bytes while running (beyond inputs/outputs)
  int64_t paramBytes = 0;      // bytes of parameters this group owns (counted once per graph)
  // Largest batch this node ran at (-1: no limit known). A failure (e.g. out of memory) makes
  // larger batches infeasible for the planner; `failure` says what happened.
  int64_t maxBatch = -1;
  std::string failure;
  // Measured where a tensor-parallel pattern holding this group splits at the degree and the
  // job allows tensor parallelism; ascending degree. Absent: the planner divides by the degree.
  std::vector<SplitTimes> split;
  const SplitTimes* splitAt(int degree) const {
    for (const SplitTimes& s : split)
      if (s.degree == degree) return &s;
    return nullptr;
  }
  bool operator==(const NodeProfile& o) const;
};

// Latency + bytes/bandwidth model of one kind of transfer.
struct LinkCost {
  double latencySeconds = 0;
  double bytesPerSecond = 1;
  double seconds(double bytes) const { return bytes <= 0 ? 0 : latencySeconds + bytes / bytesPerSecond; }
  bool operator==(const LinkCost& o) const {
    return latencySeconds == o.latencySeconds && bytesPerSecond == o.bytesPerSecond;
  }
};

struct CommProfile {
  LinkCost p2pIntraNode, p2pInterNode;
  LinkCost allreduceIntraNode, allreduceInterNode;  // bus bandwidth: time = lat + 2(n-1)/n * bytes / bw
  // All-reduces among the first n ranks of one node, for n = 2, 4, 8 below the node's rank count
  // (tensor-parallel groups; Note [Tensor-parallel cost]): measured where a node has more ranks.
  std::map<int, LinkCost> allreduceGroups;
  bool measured = false;  // false: filled from config fallbacks (comm_bandwidth, ...)
  // The all-reduce among n ranks of one node: allreduceGroups' entry for n, else the node's.
  const LinkCost& allreduceWithinNode(int n) const;
  bool operator==(const CommProfile& o) const;
};

struct GraphProfile {
  std::string graphHash;   // Graph::hash() of the graph the profile belongs to
  std::string deviceKind;  // e.g. "cpu", "cuda:NVIDIA A100-SXM4-40GB", "synthetic:a100"
  std::string dtype = "Float";
  bool estimated = false;     // rescaled or analytic, not measured on the target device
  double calibration = 1.0;   // measured/predicted ratio applied to composed block times
  double calibrationError = 0;  // mean relative error of calibrated predictions on sample blocks
  std::vector<int64_t> batchSizes;  // batch sizes the fits were measured at
  std::vector<NodeProfile> nodes;   // indexed by node id; size == graph node count
  CommProfile comm;
  bool operator==(const GraphProfile& o) const;
};

}  // namespace autostage::core
