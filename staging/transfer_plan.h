#pragma once
// Every batch-row transfer of one step, derived from the deployment's routes only.
//
// For each route (Note [Routes] in core/deployment.h) and micro-batch, the *holders* of the value
// are the producer stage's replicas (or, for model inputs, every rank with its own rows) and the
// *needers* are the replicas of each consumer stage plus, for graph outputs, every rank for its
// own rows (the caller). A transfer is sent for every holder/needer pair whose sample ranges
// intersect (Note [Sample ranges]); sender and receiver may be the same rank (a local copy).
// Gradients travel the same transfers in reverse. A tensor-parallel replica (a group of ranks)
// holds its rows on its first member, which sends them; every member needs them, and the first
// member alone sends gradients back. Pure data: no torch, no comm.

#include <string>
#include <vector>

#include "core/deployment.h"
#include "staging/sample_range.h"

namespace autostage::staging {

struct Transfer {
  int route = 0;              // index into Deployment::routes
  core::ValueId value = -1;
  int micro = 0;
  int srcRank = 0;
  int dstRank = 0;
  int srcStage = core::kFeederStage;  // producer stage or kFeederStage
  int dstStage = -1;                  // consumer stage, or -1 for the caller
  SampleRange rows;           // global rows moved
  SampleRange srcRows;        // rows the sender holds (rows ⊆ srcRows)
  SampleRange dstRows;        // rows the receiver assembles (rows ⊆ dstRows)
  int tag = 0;                // forward tag; the gradient uses tag + 1
  // False for a copy to a tensor-parallel member other than the first (Note [Tensor-parallel
  // stages]): the group's first member alone sends the gradient back.
  bool carriesGradient = true;
  bool toCaller() const { return dstStage < 0; }
  bool local() const { return srcRank == dstRank; }
};

class TransferPlan {
 public:
  // Throws Error when a stage's replica count cannot be served by the layout. Routes whose
  // `skipRoutes` entry is true (scalar losses, moved by the executor instead) get no transfers.
  TransferPlan(const core::Deployment& deployment, const BatchLayout& layout,
               const std::vector<bool>& skipRoutes = {});

  const std::vector<Transfer>& transfers() const { return transfers_; }
  // Transfers received by `rank` for `dstStage` (-1: the caller) in `micro`, in plan order.
  std::vector<const Transfer*> incoming(int rank, int dstStage, int micro) const;
  // Transfers sent by `rank` from `srcStage` (kFeederStage: its own input rows) in `micro`.
  std::vector<const Transfer*> outgoing(int rank, int srcStage, int micro) const;
  // One line per transfer, for debug logs and tests.
  std::string toString() const;

 private:
  std::vector<Transfer> transfers_;
};

}  // namespace autostage::staging
