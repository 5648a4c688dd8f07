#pragma once
// The communication interface the runtime uses: point-to-point, collectives and groups over
// tensors, plus a byte-string control plane.
//
// Contract shared by every backend:
//  - Ranks are world ranks; every collective takes the Group it runs over and must be called by
//    all of that group's members, in the same order. Non-members never take part.
//  - Tensors must be contiguous and on the backend's device (tensorDevice(); MPI takes CUDA
//    tensors too, through host memory); received tensors are preallocated
//    with the expected dtype and element count (the receiver knows the shape from the IR).
//    Operations write into the tensor's storage and never rebind the handle, so views (such as a
//    batch slice of a larger buffer) can be passed.
//  - No operation waits forever: a blocking wait that exceeds CommOptions::timeoutSeconds throws
//    CommError naming this rank, the peer or group, the tag and the operation. After a CommError
//    the backend's state is undefined; report the error and end the job (see abortJob).
//  - Required operations are pure virtual; optional capabilities throw UnsupportedError.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"

namespace autostage::comm {

// Average divides the sum by the group size; it needs a floating-point tensor. Sum of Bool
// tensors is a logical or.
enum class ReduceOp { Sum, Average };
std::string reduceOpName(ReduceOp op);

// Handle of a non-blocking operation. Holds the tensor alive until done.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completes; throws CommError on timeout or failure.
  virtual void wait() = 0;
  // True once the operation has completed (never blocks).
  virtual bool isCompleted() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  // The ranks sharing this rank's node (host), and this rank's index among them: what the job
  // resolves "ranks per node" from (Note [Resolving the job] in driver/job.h). A backend that
  // cannot tell says 1 and 0 (each rank alone on its node).
  virtual int localSize() const { return 1; }
  virtual int localRank() const { return 0; }
  Group world() const { return Group::world(worldSize()); }
  // The device whose tensors this backend moves as they are: where a caller puts tensors it
  // makes only to communicate (loss sums, norms). CPU unless overridden (NCCL: its GPU). The
  // MPI backend also takes CUDA tensors, through host copies (Note [CUDA tensors over MPI] in
  // host_staging.h).
  virtual c10::Device tensorDevice() const { return c10::Device(c10::DeviceType::CPU); }

  // Point-to-point. Messages between one pair with one tag arrive in the order sent. Tags are
  // >= 0; large tags may be limited by the backend (MPI: MPI_TAG_UB, at least 32767).
  virtual void send(const at::Tensor& tensor, int dst, int tag) = 0;
  virtual void recv(const at::Tensor& tensor, int src, int tag) = 0;
  virtual std::unique_ptr<Work> isend(const at::Tensor& tensor, int dst, int tag) = 0;
  virtual std::unique_ptr<Work> irecv(const at::Tensor& tensor, int src, int tag) = 0;

  // Collectives over `group`; this rank must be a member.
  virtual void allReduce(const at::Tensor& tensor, ReduceOp op, const Group& group) = 0;
  // `root` is a world rank and a member of `group`.
  virtual void broadcast(const at::Tensor& tensor, int root, const Group& group) = 0;
  // One tensor per member, in ascending rank order; every member passes the same shape.
  virtual std::vector<at::Tensor> allGather(const at::Tensor& tensor, const Group& group) = 0;
  // Note [Sharded collectives] (ZeRO-1): `input` holds group.size() equal chunks of
  // output.numel() elements; the member at index i of the group (ascending ranks) receives in
  // `output` the reduction over the members of their chunk i. Same dtype, both contiguous.
  virtual void reduceScatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                             const Group& group) = 0;
  // The inverse layout: chunk i of `output` (group.size() * input.numel() elements) becomes the
  // `input` of the member at index i. Writes into `output`'s storage (a view may be passed).
  virtual void allGatherInto(const at::Tensor& input, const at::Tensor& output,
                             const Group& group) = 0;
  virtual void barrier(const Group& group) = 0;

  // Creates the communicator behind `group` now instead of on first use (collective over its
  // members). Default: nothing to create.
  virtual void createGroup(const Group& group) {}

  // Control plane (optional): the root's `data` replaces every member's `data`.
  virtual void broadcastBytes(std::string& data, int root, const Group& group);
  // Every member's string, in ascending rank order.
  virtual std::vector<std::string> allGatherBytes(const std::string& data, const Group& group);

  // Logs `message` and ends the whole job (MPI_Abort) for errors that cannot be recovered from.
  // Optional; the default throws UnsupportedError.
  virtual void abortJob(const std::string& message);

 protected:
  // Shared implementation of the byte operations over CPU uint8/int64 tensors, for backends
  // that handle CPU tensors.
  void broadcastBytesViaTensors(std::string& data, int root, const Group& group);
  std::vector<std::string> allGatherBytesViaTensors(const std::string& data, const Group& group);
  static constexpr int kNoRoot = -1000000;
  // Throws Error unless this rank is in `group` (and `root`, when given, is too).
  void checkMember(const Group& group, const char* operation, int root = kNoRoot) const;
  // Throws Error unless input/output sizes and dtypes fit a reduceScatter (`whole` = input) or an
  // allGatherInto (`whole` = output) over `group` (Note [Sharded collectives]).
  void checkShards(const at::Tensor& whole, const at::Tensor& shard, const Group& group,
                   const char* operation) const;
  // Throws Error unless `peer` is a valid world rank other than this one and `tag` >= 0.
  void checkPeer(int peer, int tag, const char* operation) const;
};

}  // namespace autostage::comm
