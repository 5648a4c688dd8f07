#pragma once
// An in-process backend: N threads act as N ranks over a shared ThreadWorld mailbox.
//
// Same semantics as the MPI backend (CPU tensors, tags, groups, collectives, byte control
// plane, timeouts naming the peer), so routing and collective logic can be unit-tested with
// 4 ranks without mpirun. Sends are buffered (they complete at once); receives and collectives
// wait up to the world's timeout. Collectives gather to the group's lowest rank, which reduces
// in ascending rank order, and send the result back. A receive also checks dtype and element
// count against what was sent.

#include <exception>
#include <functional>
#include <memory>

#include "comm/backend.h"
#include "comm/thread_world.h"

namespace autostage::comm {

class ThreadBackend : public Backend {
 public:
  ThreadBackend(std::shared_ptr<ThreadWorld> world, int rank);

  std::string name() const override { return "thread"; }
  int rank() const override { return rank_; }
  int worldSize() const override { return world_->worldSize(); }
  // Thread ranks share one process, so one node.
  int localSize() const override { return worldSize(); }
  int localRank() const override { return rank_; }

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

  void broadcastBytes(std::string& data, int root, const Group& group) override;
  std::vector<std::string> allGatherBytes(const std::string& data, const Group& group) override;

 private:
  // Internal traffic of a collective: channel `<operation> <group>`, tag 0.
  void postTo(int dst, const std::string& channel, int tag, const at::Tensor& tensor);
  void takeFrom(int src, const std::string& channel, int tag, const at::Tensor& into,
                const Deadline& deadline, const std::string& what);

  std::shared_ptr<ThreadWorld> world_;
  int rank_;
};

// Runs `body` on `worldSize` threads, each with its own ThreadBackend over one new ThreadWorld.
// Returns one entry per rank: nullptr when the body returned, else the exception it threw.
std::vector<std::exception_ptr> runThreadRanks(int worldSize,
                                               const std::function<void(ThreadBackend&)>& body,
                                               CommOptions options = CommOptions());

}  // namespace autostage::comm
