#include "staging/transfer_plan.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace autostage::staging {
namespace {

constexpr int kMaxTag = 32766;  // MPI guarantees tags up to 32767; gradients use tag + 1

struct Endpoint {
  int rank;
  int stage;
  SampleRange rows;
  bool gradient = true;  // the group's first member (Note [Tensor-parallel stages])
};

std::vector<Endpoint> holders(const core::Deployment& dep, const core::Route& route,
                              const BatchLayout& layout, int micro) {
  std::vector<Endpoint> out;
  SampleRange mb = layout.microBatch(micro);
  if (route.producerStage == core::kFeederStage) {
    for (int r = 0; r < layout.worldSize(); ++r) {
      SampleRange rows = layout.rankRows(r).intersect(mb);
      if (!rows.empty()) out.push_back({r, core::kFeederStage, rows});
    }
    return out;
  }
  const core::StageDeployment& stage = dep.stages.at(route.producerStage);
  for (int i = 0; i < stage.replicaCount(); ++i)
    out.push_back({stage.ranks[i * stage.tensorParallel], stage.id,
                   layout.replicaRows(micro, i, stage.replicaCount())});
  return out;
}

std::vector<Endpoint> needers(const core::Deployment& dep, const core::Route& route,
                              const BatchLayout& layout, int micro) {
  std::vector<Endpoint> out;
  for (int id : route.consumerStages) {
    const core::StageDeployment& stage = dep.stages.at(id);
    for (int i = 0; i < stage.replicaCount(); ++i)
      for (int k = 0; k < stage.tensorParallel; ++k)
        out.push_back({stage.ranks[i * stage.tensorParallel + k], id,
                       layout.replicaRows(micro, i, stage.replicaCount()), k == 0});
  }
  if (route.graphOutput) {
    SampleRange mb = layout.microBatch(micro);
    for (int r = 0; r < layout.worldSize(); ++r) {
      SampleRange rows = layout.rankRows(r).intersect(mb);
      if (!rows.empty()) out.push_back({r, -1, rows});
    }
  }
  return out;
}

}  // namespace

TransferPlan::TransferPlan(const core::Deployment& deployment, const BatchLayout& layout,
                           const std::vector<bool>& skipRoutes) {
  for (const core::StageDeployment& stage : deployment.stages)
    layout.checkReplicaCount(stage.replicaCount(), stage.name);
  const int micros = layout.microBatchCount();
  // One tag per (route, micro-batch, needing stage or the caller): a rank holding several stages
  // (Note [Pipeline schedules] in core/pipeline_schedule.h) may receive one route's rows twice
  // from the same sender, once per stage.
  int slots = 2;
  for (const core::Route& route : deployment.routes)
    slots = std::max(slots, static_cast<int>(route.consumerStages.size()) + 1);
  for (size_t r = 0; r < deployment.routes.size(); ++r) {
    const core::Route& route = deployment.routes[r];
    if (r < skipRoutes.size() && skipRoutes[r]) continue;
    for (int m = 0; m < micros; ++m) {
      for (const Endpoint& src : holders(deployment, route, layout, m)) {
        for (const Endpoint& dst : needers(deployment, route, layout, m)) {
          SampleRange rows = src.rows.intersect(dst.rows);
          if (rows.empty()) continue;
          const auto& consumers = route.consumerStages;
          const int slot = dst.stage < 0 ? static_cast<int>(consumers.size())
                                         : static_cast<int>(std::find(consumers.begin(),
                                                                      consumers.end(), dst.stage) -
                                                            consumers.begin());
          const int64_t tag64 = ((int64_t(r) * micros + m) * slots + slot) * 2;
          const int tag = static_cast<int>(std::min<int64_t>(tag64, kMaxTag));
          AUTOSTAGE_CHECK_AS(UnsupportedError, tag64 < kMaxTag, "the deployment has ",
                             deployment.routes.size(), " routes and ", micros,
                             " micro-batches: too many for the message tag space (",
                             kMaxTag, "); plan with fewer stages or micro-batches");
          transfers_.push_back({static_cast<int>(r), route.value, m, src.rank, dst.rank,
                                src.stage, dst.stage, rows, src.rows, dst.rows, tag,
                                dst.gradient});
        }
      }
    }
  }
}

std::vector<const Transfer*> TransferPlan::incoming(int rank, int dstStage, int micro) const {
  std::vector<const Transfer*> out;
  for (const Transfer& t : transfers_)
    if (t.dstRank == rank && t.dstStage == dstStage && t.micro == micro) out.push_back(&t);
  return out;
}

std::vector<const Transfer*> TransferPlan::outgoing(int rank, int srcStage, int micro) const {
  std::vector<const Transfer*> out;
  for (const Transfer& t : transfers_)
    if (t.srcRank == rank && t.srcStage == srcStage && t.micro == micro) out.push_back(&t);
  return out;
}

std::string TransferPlan::toString() const {
  std::ostringstream out;
  for (const Transfer& t : transfers_) {
    out << "route " << t.route << " value " << t.value << " micro " << t.micro << ": stage "
        << t.srcStage << "@rank" << t.srcRank << " -> "
        << (t.toCaller() ? std::string("caller") : "stage " + std::to_string(t.dstStage))
        << "@rank" << t.dstRank << " rows " << t.rows.toString() << "\n";
  }
  return out.str();
}

}  // namespace autostage::staging
