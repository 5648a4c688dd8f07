#pragma once
// The NCCL backend for CUDA tensors; compiled only when AUTOSTAGE_WITH_CUDA is ON.
//
// One NCCL communicator per rank group, created on first use: the group's lowest rank makes a
// unique id and broadcasts it over the MPI backend (deadline-guarded), then the members call
// ncclCommInitRank. Rank i on a node uses local GPU i (MpiBackend::localRank()).
// Operations are stream-ordered: they wait for work already queued on the legacy default
// stream (where LibTorch queues by default), run on the backend's own stream, and blocking
// calls return once the operation finished; a wait longer than the timeout aborts the
// communicator and throws CommError naming the rank, peer or group. NCCL has no tags: messages
// between one pair match in issue order, the tag only appears in messages. Barrier and the byte
// control plane go through the MPI backend.

#include <memory>

#include "comm/backend.h"
#include "comm/comm_options.h"
#include "comm/mpi_backend.h"

namespace autostage::comm {

class NcclBackend : public Backend {
 public:
  // Collective over the world (selects the device; communicators come later, per group).
  explicit NcclBackend(std::shared_ptr<MpiBackend> control,
                       CommOptions options = CommOptions::fromConfig());
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }
  int rank() const override;
  int worldSize() const override;
  int localSize() const override;
  int localRank() const override;
  int device() const;
  c10::Device tensorDevice() const override;  // cuda:device()

  void send(const at::Tensor& tensor, int dst, int tag) override;
  void recv(const at::Tensor& tensor, int src, int tag) override;
  std::unique_ptr<Work> isend(const at::Tensor& tensor, int dst, int tag) override;
  std::unique_ptr<Work> irecv(const at::Tensor& tensor, int src, int tag) override;

  void allReduce(const at::Tensor& tensor, ReduceOp op, const Group& group) override;
  void broadcast(const at::Tensor& tensor, int root, const Group& group) override;
  std::vector<at::Tensor> allGather(const at::Tensor& tensor, const Group& group) override;
  void reduceScatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                     const Group& group) override;
  void allGatherInto(const at::Tensor& input, const at::Tensor& output,
                     const Group& group) override;
  void barrier(const Group& group) override;
  void createGroup(const Group& group) override;

  void broadcastBytes(std::string& data, int root, const Group& group) override;
  std::vector<std::string> allGatherBytes(const std::string& data, const Group& group) override;
  [[noreturn]] void abortJob(const std::string& message) override;

  struct Impl;  // CUDA and NCCL handles; defined in nccl_impl.h

 private:
  std::unique_ptr<Work> pointToPoint(const at::Tensor& tensor, int peer, int tag, bool isRecv);
  std::unique_ptr<Impl> impl_;
};

}  // namespace autostage::comm
