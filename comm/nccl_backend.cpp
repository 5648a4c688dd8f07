#include "comm/nccl_backend.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/deadline.h"
#include "comm/mpi_environment.h"
#include "comm/nccl_impl.h"
#include "comm/tensor_util.h"
#include "core/log.h"

namespace autostage::comm {

ncclDataType_t ncclTypeOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kLong:
      return ncclInt64;
    case at::kInt:
      return ncclInt32;
    case at::kShort:
      return ncclFloat16;  // moved bitwise; allReduce widens to int32 first
    case at::kChar:
      return ncclInt8;
    case at::kByte:
    case at::kBool:
      return ncclUint8;
    default:
      throw UnsupportedError("the NCCL backend cannot move dtype " +
                             std::string(c10::toString(tensor.scalar_type())));
  }
}

namespace {
// Rank i on a node takes local GPU i; the node's ranks come from MPI's shared-memory split (the
// same layout the job resolves: Note [Resolving the job] in driver/job.h), whatever launched them.
int pickDevice(const MpiBackend& control) {
  const int localRank = control.localRank();
  int count = 0;
  AUTOSTAGE_CUDA_CHECK(cudaGetDeviceCount(&count), "counting GPUs on rank ", control.rank());
  AUTOSTAGE_CHECK_AS(CommError, localRank < count, "rank ", control.rank(), " is local rank ",
                     localRank, " on its node and needs GPU ", localRank, ", but only ", count,
                     " GPUs are visible; start at most one process per GPU on each node");
  return localRank;
}

// A point-to-point operation; it is launched with its batch (Note [Grouped point-to-point]) when
// this or another operation of the batch is waited on or polled, or a collective starts. wait()
// polls the batch's completion event against the timeout.
class NcclP2pWork : public Work {
 public:
  using Batch = P2pGrouper<std::shared_ptr<CUevent_st>>::Batch;
  NcclP2pWork(NcclBackend::Impl& impl, std::shared_ptr<Batch> batch, ncclComm_t comm,
              at::Tensor tensor, std::string what)
      : impl_(impl),
        batch_(std::move(batch)),
        comm_(comm),
        tensor_(std::move(tensor)),
        what_(std::move(what)) {}
  void wait() override {
    if (completed_) return;
    launched();
    impl_.waitDone(batch_->done().get(), comm_, [&] { return what_; });
    completed_ = true;
  }
  bool isCompleted() override {
    if (!completed_) {
      launched();
      completed_ = cudaEventQuery(batch_->done().get()) == cudaSuccess;
    }
    return completed_;
  }

 private:
  void launched() {
    if (!batch_->launched()) impl_.launchP2p();
    AUTOSTAGE_CHECK_AS(CommError, batch_->launched(), "rank ", impl_.control->rank(),
                       ": the group of point-to-point transfers with ", what_,
                       " failed to launch (see the error reported before this one)");
  }

  NcclBackend::Impl& impl_;
  std::shared_ptr<Batch> batch_;
  ncclComm_t comm_;
  at::Tensor tensor_;  // kept alive until the operation finished
  std::string what_;
  bool completed_ = false;
};
}  // namespace

void NcclBackend::Impl::orderAfterDefaultStream() {
  cudaEvent_t queued;
  AUTOSTAGE_CUDA_CHECK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming), "ordering");
  AUTOSTAGE_CUDA_CHECK(cudaEventRecord(queued, nullptr), "ordering after the default stream");
  AUTOSTAGE_CUDA_CHECK(cudaStreamWaitEvent(stream, queued, 0), "ordering after the default stream");
  cudaEventDestroy(queued);
}

void NcclBackend::Impl::launchP2p() {
  p2p.launch(
      [&] {
        orderAfterDefaultStream();
        AUTOSTAGE_NCCL_CHECK(ncclGroupStart(), "rank ", control->rank(),
                             " grouping point-to-point transfers");
      },
      [&] {
        AUTOSTAGE_NCCL_CHECK(ncclGroupEnd(), "rank ", control->rank(),
                             " launching a group of point-to-point transfers");
        return std::shared_ptr<CUevent_st>(recordDone(),
                                           [](cudaEvent_t event) { cudaEventDestroy(event); });
      });
}

void NcclBackend::Impl::beforeCollective() {
  launchP2p();
  orderAfterDefaultStream();
}

cudaEvent_t NcclBackend::Impl::recordDone() {
  cudaEvent_t done;
  AUTOSTAGE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "completion event");
  AUTOSTAGE_CUDA_CHECK(cudaEventRecord(done, stream), "completion event");
  return done;
}

void NcclBackend::Impl::waitDone(cudaEvent_t done, ncclComm_t comm,
                                 const std::function<std::string()>& what) {
  Deadline deadline(options.timeoutSeconds);
  for (auto sleep = std::chrono::microseconds(10);;
       sleep = std::min(sleep * 2, std::chrono::microseconds(1000))) {
    cudaError_t state = cudaEventQuery(done);
    if (state == cudaSuccess) return;
    AUTOSTAGE_CHECK_AS(CommError, state == cudaErrorNotReady, "rank ", control->rank(),
                       ": CUDA failed while waiting for ", what(), ": ", cudaGetErrorString(state));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      forget(comm);
      throw CommError("rank " + std::to_string(control->rank()) +
                      ": NCCL failed while waiting for " + what() + ": " +
                      ncclGetErrorString(async));
    }
    if (deadline.expired()) {
      forget(comm);
      throw CommError(timeoutMessage(control->rank(), deadline.seconds(), what()));
    }
    std::this_thread::sleep_for(sleep);
  }
}

// Aborting is the only way to unblock a communicator whose peer is gone.
void NcclBackend::Impl::forget(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = comms.begin(); it != comms.end(); ++it)
    if (it->second == comm) {
      ncclCommAbort(comm);
      comms.erase(it);
      return;
    }
}

ncclComm_t NcclBackend::Impl::communicator(const Group& group) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = comms.find(group.ranks());
  if (it != comms.end()) return it->second;
  ncclUniqueId id;
  std::string idBytes(sizeof(id), '\0');
  if (control->rank() == group.leader()) {
    AUTOSTAGE_NCCL_CHECK(ncclGetUniqueId(&id), "group ", group.toString());
    idBytes.assign(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  // Over MPI with a deadline: every member is known alive before the blocking NCCL init.
  control->broadcastBytes(idBytes, group.leader(), group);
  std::memcpy(&id, idBytes.data(), sizeof(id));
  ncclComm_t comm;
  AUTOSTAGE_CUDA_CHECK(cudaSetDevice(device), "selecting GPU ", device);
  AUTOSTAGE_NCCL_CHECK(ncclCommInitRank(&comm, group.size(), id, group.indexOf(control->rank())),
                       "rank ", control->rank(), " creating the communicator of group ",
                       group.toString());
  comms.emplace(group.ranks(), comm);
  return comm;
}

NcclBackend::NcclBackend(std::shared_ptr<MpiBackend> control, CommOptions options)
    : impl_(std::make_unique<Impl>()) {
  AUTOSTAGE_CHECK(control, "the NCCL backend needs the MPI backend for its control plane");
  options.validate();
  impl_->control = std::move(control);
  impl_->options = options;
  impl_->device = pickDevice(*impl_->control);
  AUTOSTAGE_CUDA_CHECK(cudaSetDevice(impl_->device), "selecting GPU ", impl_->device);
  AUTOSTAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "stream");
  core::logger("Comm")->debug("NCCL backend: rank {} uses GPU {}, {}", rank(), impl_->device,
                              options.toString());
}

NcclBackend::~NcclBackend() {
  for (auto& [ranks, comm] : impl_->comms) ncclCommDestroy(comm);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

int NcclBackend::rank() const { return impl_->control->rank(); }
int NcclBackend::worldSize() const { return impl_->control->worldSize(); }
int NcclBackend::localSize() const { return impl_->control->localSize(); }
int NcclBackend::localRank() const { return impl_->control->localRank(); }
int NcclBackend::device() const { return impl_->device; }
c10::Device NcclBackend::tensorDevice() const {
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(impl_->device));
}

std::unique_ptr<Work> NcclBackend::pointToPoint(const at::Tensor& tensor, int peer, int tag,
                                                bool isRecv) {
  const char* operation = isRecv ? "recv" : "send";
  checkCommTensor(tensor, c10::DeviceType::CUDA, operation);
  checkPeer(peer, tag, operation);
  ncclComm_t comm = impl_->communicator(world());
  // Queued, launched with the rest of its batch (Note [Grouped point-to-point]). The queued
  // operation holds the tensor: its batch keeps it alive until the batch's works are gone.
  const size_t count = static_cast<size_t>(tensor.numel());
  const ncclDataType_t type = ncclTypeOf(tensor);
  const int me = rank();
  cudaStream_t stream = impl_->stream;
  auto batch = impl_->p2p.post([tensor, count, type, peer, comm, stream, me, isRecv] {
    if (isRecv)
      AUTOSTAGE_NCCL_CHECK(ncclRecv(tensor.data_ptr(), count, type, peer, comm, stream), "rank ",
                           me, " receiving from rank ", peer);
    else
      AUTOSTAGE_NCCL_CHECK(ncclSend(tensor.data_ptr(), count, type, peer, comm, stream), "rank ",
                           me, " sending to rank ", peer);
  });
  std::string detail =
      " (tag " + std::to_string(tag) + ", " + operation + " of " + describeTensor(tensor) + ")";
  std::string what = isRecv ? "a tensor from rank " + std::to_string(peer) + detail
                            : "rank " + std::to_string(peer) + " to receive a tensor" + detail;
  return std::make_unique<NcclP2pWork>(*impl_, std::move(batch), comm, tensor, what);
}

void NcclBackend::send(const at::Tensor& tensor, int dst, int tag) {
  isend(tensor, dst, tag)->wait();
}
void NcclBackend::recv(const at::Tensor& tensor, int src, int tag) {
  irecv(tensor, src, tag)->wait();
}

std::unique_ptr<Work> NcclBackend::isend(const at::Tensor& tensor, int dst, int tag) {
  return pointToPoint(tensor, dst, tag, false);
}

std::unique_ptr<Work> NcclBackend::irecv(const at::Tensor& tensor, int src, int tag) {
  return pointToPoint(tensor, src, tag, true);
}

// The control plane blocks too: queued transfers a peer may be waiting for go out first.
void NcclBackend::broadcastBytes(std::string& data, int root, const Group& group) {
  impl_->launchP2p();
  impl_->control->broadcastBytes(data, root, group);
}

std::vector<std::string> NcclBackend::allGatherBytes(const std::string& data, const Group& group) {
  impl_->launchP2p();
  return impl_->control->allGatherBytes(data, group);
}

void NcclBackend::abortJob(const std::string& message) { MpiEnvironment::abortJob(message); }

}  // namespace autostage::comm
