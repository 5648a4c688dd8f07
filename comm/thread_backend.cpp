#include "comm/thread_backend.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cstring>
#include <thread>

#include "comm/tensor_util.h"
#include "core/error.h"

namespace autostage::comm {

namespace {

Mail mailOf(const at::Tensor& tensor) {
  Mail mail;
  mail.dtype = tensor.scalar_type();
  mail.numel = tensor.numel();
  mail.bytes.resize(tensorBytes(tensor));
  if (!mail.bytes.empty()) std::memcpy(mail.bytes.data(), tensor.data_ptr(), mail.bytes.size());
  return mail;
}

// Copies a received message into `into` after checking it is what the receiver expected.
void deliver(const Mail& mail, const at::Tensor& into, int rank, const std::string& what) {
  AUTOSTAGE_CHECK_AS(CommError, mail.dtype == into.scalar_type() && mail.numel == into.numel(),
                     "rank ", rank, " expected ", describeTensor(into), " (", into.numel(),
                     " elements) for ", what, " but the sender sent ", c10::toString(mail.dtype),
                     " with ", mail.numel,
                     " elements; sender and receiver must agree on dtype "
                     "and size");
  if (!mail.bytes.empty()) std::memcpy(into.data_ptr(), mail.bytes.data(), mail.bytes.size());
}

std::string fromText(int src, int tag, const char* operation) {
  return "a tensor from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ", " +
         operation + ")";
}

class DoneWork : public Work {
 public:
  void wait() override {}
  bool isCompleted() override { return true; }
};

class ThreadRecvWork : public Work {
 public:
  ThreadRecvWork(std::shared_ptr<ThreadWorld> world, MailKey key, at::Tensor into,
                 const char* operation)
      : world_(std::move(world)),
        key_(std::move(key)),
        into_(std::move(into)),
        ticket_(world_->reserve(key_)),
        operation_(operation) {}
  void wait() override {
    if (done_) return;
    Deadline deadline(world_->options().timeoutSeconds);
    std::optional<Mail> mail = world_->take(key_, ticket_, deadline);
    std::string what = fromText(key_.src, key_.tag, operation_);
    AUTOSTAGE_CHECK_AS(CommError, mail, timeoutMessage(key_.dst, deadline.seconds(), what));
    finish(*mail, what);
  }
  bool isCompleted() override {
    if (done_) return true;
    if (std::optional<Mail> mail = world_->tryTake(key_, ticket_))
      finish(*mail, fromText(key_.src, key_.tag, operation_));
    return done_;
  }

 private:
  void finish(const Mail& mail, const std::string& what) {
    done_ = true;
    deliver(mail, into_, key_.dst, what);
  }
  std::shared_ptr<ThreadWorld> world_;
  MailKey key_;
  at::Tensor into_;
  int64_t ticket_;
  const char* operation_;
  bool done_ = false;
};

std::string channelOf(const char* operation, const Group& group) {
  return std::string(operation) + " " + group.toString();
}

}  // namespace

ThreadBackend::ThreadBackend(std::shared_ptr<ThreadWorld> world, int rank)
    : world_(std::move(world)), rank_(rank) {
  AUTOSTAGE_CHECK(world_, "ThreadBackend needs a ThreadWorld");
  AUTOSTAGE_CHECK(rank >= 0 && rank < world_->worldSize(), "ThreadBackend rank ", rank,
                  " is outside the world of size ", world_->worldSize());
}

void ThreadBackend::send(const at::Tensor& tensor, int dst, int tag) { isend(tensor, dst, tag); }

void ThreadBackend::recv(const at::Tensor& tensor, int src, int tag) {
  checkCommTensor(tensor, c10::DeviceType::CPU, "recv");
  checkPeer(src, tag, "recv");
  ThreadRecvWork(world_, MailKey{src, rank_, tag, ""}, tensor, "recv").wait();
}

std::unique_ptr<Work> ThreadBackend::isend(const at::Tensor& tensor, int dst, int tag) {
  checkCommTensor(tensor, c10::DeviceType::CPU, "send");
  checkPeer(dst, tag, "send");
  world_->post({rank_, dst, tag, ""}, mailOf(tensor));
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> ThreadBackend::irecv(const at::Tensor& tensor, int src, int tag) {
  checkCommTensor(tensor, c10::DeviceType::CPU, "irecv");
  checkPeer(src, tag, "irecv");
  return std::make_unique<ThreadRecvWork>(world_, MailKey{src, rank_, tag, ""}, tensor, "irecv");
}

void ThreadBackend::postTo(int dst, const std::string& channel, int tag, const at::Tensor& tensor) {
  world_->post({rank_, dst, tag, channel}, mailOf(tensor));
}

void ThreadBackend::takeFrom(int src, const std::string& channel, int tag, const at::Tensor& into,
                             const Deadline& deadline, const std::string& what) {
  MailKey key{src, rank_, tag, channel};
  int64_t ticket = world_->reserve(key);
  std::optional<Mail> mail = world_->take(key, ticket, deadline);
  AUTOSTAGE_CHECK_AS(CommError, mail, timeoutMessage(rank_, deadline.seconds(), what));
  deliver(*mail, into, rank_, what);
}

// Members send to the leader, which sums in ascending rank order and sends the result back.
void ThreadBackend::allReduce(const at::Tensor& tensor, ReduceOp op, const Group& group) {
  checkCommTensor(tensor, c10::DeviceType::CPU, "allReduce");
  checkMember(group, "allReduce");
  if (op == ReduceOp::Average) checkAverageable(tensor);
  std::string channel = channelOf("allReduce", group);
  Deadline deadline(world_->options().timeoutSeconds);
  auto what = [&](int peer) {
    return "rank " + std::to_string(peer) + " (allReduce over group " + group.toString() + ")";
  };
  if (rank_ != group.leader()) {
    postTo(group.leader(), channel, 0, tensor);
    takeFrom(group.leader(), channel, 1, tensor, deadline, what(group.leader()));
    return;
  }
  at::Tensor incoming = at::empty_like(tensor);
  for (int member : group.ranks()) {
    if (member == rank_) continue;
    takeFrom(member, channel, 0, incoming, deadline, what(member));
    accumulate(tensor, incoming);
  }
  if (op == ReduceOp::Average) tensor.div_(group.size());
  for (int member : group.ranks())
    if (member != rank_) postTo(member, channel, 1, tensor);
}

void ThreadBackend::broadcast(const at::Tensor& tensor, int root, const Group& group) {
  checkCommTensor(tensor, c10::DeviceType::CPU, "broadcast");
  checkMember(group, "broadcast", root);
  std::string channel = channelOf("broadcast", group);
  if (rank_ == root) {
    for (int member : group.ranks())
      if (member != rank_) postTo(member, channel, 0, tensor);
    return;
  }
  Deadline deadline(world_->options().timeoutSeconds);
  takeFrom(root, channel, 0, tensor, deadline,
           "rank " + std::to_string(root) + " (broadcast root, group " + group.toString() + ")");
}

std::vector<at::Tensor> ThreadBackend::allGather(const at::Tensor& tensor, const Group& group) {
  checkCommTensor(tensor, c10::DeviceType::CPU, "allGather");
  checkMember(group, "allGather");
  std::string channel = channelOf("allGather", group);
  for (int member : group.ranks())
    if (member != rank_) postTo(member, channel, 0, tensor);
  Deadline deadline(world_->options().timeoutSeconds);
  std::vector<at::Tensor> out;
  for (int member : group.ranks()) {
    out.push_back(member == rank_ ? tensor.clone() : at::empty_like(tensor));
    if (member == rank_) continue;
    takeFrom(member, channel, 0, out.back(), deadline,
             "rank " + std::to_string(member) + " (allGather over group " + group.toString() + ")");
  }
  return out;
}

// Note [Sharded collectives] over the thread world: an allreduce of a copy of the whole input,
// of which this member keeps its chunk (the same sums, in the same ascending rank order).
void ThreadBackend::reduceScatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                  const Group& group) {
  checkCommTensor(input, c10::DeviceType::CPU, "reduceScatter");
  checkCommTensor(output, c10::DeviceType::CPU, "reduceScatter");
  checkShards(input, output, group, "reduceScatter");
  at::Tensor whole = input.clone();
  allReduce(whole, op, group);
  const int64_t count = output.numel();
  output.view(-1).copy_(whole.view(-1).narrow(0, group.indexOf(rank_) * count, count));
}

void ThreadBackend::allGatherInto(const at::Tensor& input, const at::Tensor& output,
                                  const Group& group) {
  checkCommTensor(input, c10::DeviceType::CPU, "allGatherInto");
  checkCommTensor(output, c10::DeviceType::CPU, "allGatherInto");
  checkShards(output, input, group, "allGatherInto");
  std::vector<at::Tensor> chunks = allGather(input.reshape(-1), group);
  const int64_t count = input.numel();
  for (size_t i = 0; i < chunks.size(); ++i)
    output.view(-1).narrow(0, static_cast<int64_t>(i) * count, count).copy_(chunks[i]);
}

void ThreadBackend::barrier(const Group& group) {
  checkMember(group, "barrier");
  at::Tensor token = at::empty({0}, at::kByte);
  std::string channel = channelOf("barrier", group);
  Deadline deadline(world_->options().timeoutSeconds);
  auto what = [&](int peer) {
    return "rank " + std::to_string(peer) + " (barrier over group " + group.toString() + ")";
  };
  if (rank_ != group.leader()) {
    postTo(group.leader(), channel, 0, token);
    takeFrom(group.leader(), channel, 1, token, deadline, what(group.leader()));
    return;
  }
  for (int member : group.ranks())
    if (member != rank_) takeFrom(member, channel, 0, token, deadline, what(member));
  for (int member : group.ranks())
    if (member != rank_) postTo(member, channel, 1, token);
}

void ThreadBackend::broadcastBytes(std::string& data, int root, const Group& group) {
  broadcastBytesViaTensors(data, root, group);
}

std::vector<std::string> ThreadBackend::allGatherBytes(const std::string& data,
                                                       const Group& group) {
  return allGatherBytesViaTensors(data, group);
}

std::vector<std::exception_ptr> runThreadRanks(int worldSize,
                                               const std::function<void(ThreadBackend&)>& body,
                                               CommOptions options) {
  auto world = std::make_shared<ThreadWorld>(worldSize, options);
  std::vector<std::exception_ptr> errors(worldSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < worldSize; ++rank)
    threads.emplace_back([&, rank] {
      try {
        ThreadBackend backend(world, rank);
        body(backend);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  for (auto& thread : threads) thread.join();
  return errors;
}

}  // namespace autostage::comm
