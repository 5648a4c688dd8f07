#pragma once
// The MPI backend: CPU tensors of every IR dtype, and the control plane (byte broadcast and
// allgather). Built on OpenMPI non-blocking calls polled against a deadline, so a dead or stuck
// peer produces a CommError naming it instead of a hang.
//
// Construction is collective over the world (it duplicates MPI_COMM_WORLD twice: one
// communicator for user point-to-point traffic, one for collectives and group creation, so user
// tags never meet internal traffic). Sub-group communicators are created on first use, with a
// deadline-guarded handshake among the members only, then MPI_Comm_create_group.
// Thread-safe when MPI provides MPI_THREAD_MULTIPLE.

#include <memory>

#include "comm/backend.h"
#include "comm/comm_options.h"

namespace autostage::comm {

class MpiBackend : public Backend {
 public:
  explicit MpiBackend(CommOptions options = CommOptions::fromConfig());
  ~MpiBackend() override;

  std::string name() const override { return "mpi"; }
  int rank() const override;
  int worldSize() const override;
  // Rank among the processes on this node, and their count (MPI_Comm_split_type).
  int localRank() const override;
  int localSize() const override;
  const CommOptions& options() const;

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

  struct Impl;  // MPI handles; defined in mpi_impl.h

 private:
  void checkTag(int tag, const char* operation) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace autostage::comm
