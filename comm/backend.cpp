#include "comm/backend.h"

#include <ATen/ops/empty.h>

#include <cstring>

#include "core/error.h"

namespace autostage::comm {

std::string reduceOpName(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "average"; }

void Backend::broadcastBytes(std::string& data, int root, const Group& group) {
  throw UnsupportedError("backend '" + name() +
                         "' has no byte broadcast; use the MPI backend for the control plane");
}

std::vector<std::string> Backend::allGatherBytes(const std::string& data, const Group& group) {
  throw UnsupportedError("backend '" + name() +
                         "' has no byte allgather; use the MPI backend for the control plane");
}

void Backend::abortJob(const std::string& message) {
  throw UnsupportedError("backend '" + name() +
                         "' cannot abort the job; the error was: " + message);
}

namespace {
at::Tensor bytesTensor(const std::string& data, int64_t size) {
  at::Tensor tensor = at::empty({size}, at::kByte);
  if (!data.empty()) std::memcpy(tensor.data_ptr(), data.data(), data.size());
  return tensor;
}
}  // namespace

// Two steps: the length (so receivers can size their buffer), then the bytes.
void Backend::broadcastBytesViaTensors(std::string& data, int root, const Group& group) {
  checkMember(group, "broadcastBytes", root);
  at::Tensor length = at::empty({1}, at::kLong);
  length.data_ptr<int64_t>()[0] = static_cast<int64_t>(data.size());
  broadcast(length, root, group);
  int64_t size = length.data_ptr<int64_t>()[0];
  at::Tensor bytes = bytesTensor(rank() == root ? data : std::string(), size);
  broadcast(bytes, root, group);
  if (rank() != root) data.assign(static_cast<const char*>(bytes.data_ptr()), size);
}

// Gathers lengths, pads every string to the longest, gathers the padded bytes.
std::vector<std::string> Backend::allGatherBytesViaTensors(const std::string& data,
                                                           const Group& group) {
  checkMember(group, "allGatherBytes");
  at::Tensor length = at::empty({1}, at::kLong);
  length.data_ptr<int64_t>()[0] = static_cast<int64_t>(data.size());
  std::vector<at::Tensor> lengths = allGather(length, group);
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.data_ptr<int64_t>()[0]);
  std::vector<at::Tensor> gathered = allGather(bytesTensor(data, longest), group);
  std::vector<std::string> out;
  for (size_t i = 0; i < gathered.size(); ++i)
    out.emplace_back(static_cast<const char*>(gathered[i].data_ptr()),
                     lengths[i].data_ptr<int64_t>()[0]);
  return out;
}

void Backend::checkMember(const Group& group, const char* operation, int root) const {
  AUTOSTAGE_CHECK(group.contains(rank()), operation, " over group ", group.toString(),
                  " was called on rank ", rank(),
                  ", which is not a member; only members call a group's collectives");
  AUTOSTAGE_CHECK(group.ranks().back() < worldSize(), operation, ": group ", group.toString(),
                  " names a rank outside the world of size ", worldSize());
  if (root != kNoRoot)
    AUTOSTAGE_CHECK(group.contains(root), operation, ": root rank ", root,
                    " is not a member of group ", group.toString(), "; pick a member as root");
}

void Backend::checkShards(const at::Tensor& whole, const at::Tensor& shard, const Group& group,
                          const char* operation) const {
  checkMember(group, operation);
  AUTOSTAGE_CHECK(whole.scalar_type() == shard.scalar_type(), operation, " on rank ", rank(),
                  ": the whole tensor is ", whole.scalar_type(), " but the shard is ",
                  shard.scalar_type(), "; pass tensors of one dtype");
  AUTOSTAGE_CHECK(whole.numel() == shard.numel() * group.size(), operation, " on rank ", rank(),
                  ": the whole tensor has ", whole.numel(), " elements, expected group size ",
                  group.size(), " x shard ", shard.numel(),
                  "; pad it to a multiple of the group size");
  AUTOSTAGE_CHECK(whole.is_contiguous() && shard.is_contiguous(), operation, " on rank ", rank(),
                  ": tensors must be contiguous");
}

void Backend::checkPeer(int peer, int tag, const char* operation) const {
  AUTOSTAGE_CHECK(peer >= 0 && peer < worldSize(), operation, " on rank ", rank(), ": peer rank ",
                  peer, " is outside the world of size ", worldSize());
  AUTOSTAGE_CHECK(peer != rank(), operation, " on rank ", rank(),
                  ": the peer is this rank itself; copy the tensor locally instead");
  AUTOSTAGE_CHECK(tag >= 0, operation, " on rank ", rank(), ": tag must be >= 0, got ", tag);
}

}  // namespace autostage::comm
