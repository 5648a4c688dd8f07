#include "comm/mpi_backend.h"

#include <climits>
#include <thread>

#include "comm/host_staging.h"
#include "comm/mpi_check.h"
#include "comm/mpi_environment.h"
#include "comm/mpi_impl.h"
#include "comm/tensor_util.h"
#include "core/log.h"

namespace autostage::comm {

MPI_Datatype mpiTypeOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kHalf:
    case at::kBFloat16:
      return MPI_UINT16_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    case at::kShort:
      return MPI_INT16_T;
    case at::kChar:
      return MPI_INT8_T;
    case at::kByte:
      return MPI_UINT8_T;
    case at::kBool:
      return MPI_C_BOOL;
    default:
      throw UnsupportedError("the MPI backend cannot move dtype " +
                             std::string(c10::toString(tensor.scalar_type())));
  }
}

void checkMpiTensor(const at::Tensor& tensor, const char* operation) {
  checkCommTensor(tensor, {c10::DeviceType::CPU, c10::DeviceType::CUDA}, operation);
}

int mpiCount(const at::Tensor& tensor, const char* operation) {
  AUTOSTAGE_CHECK_AS(UnsupportedError, tensor.numel() <= INT_MAX, operation, ": ",
                     describeTensor(tensor),
                     " has more than INT_MAX elements, which one MPI "
                     "call cannot move; split the tensor");
  return static_cast<int>(tensor.numel());
}

// Spins on MPI_Test for the first 10 ms, like OpenMPI's own blocking calls: MPI progresses
// large messages and non-blocking collectives only inside MPI calls, so any pause (even a
// yield) stalls them. Longer waits (a peer still computing) sleep, growing to 1 ms, to leave
// oversubscribed cores to the peers.
void waitRequest(MPI_Request& request, MPI_Status* status, const Deadline& deadline, int rank,
                 const std::function<std::string()>& what, OnTimeout onTimeout) {
  MPI_Status ignored;
  MPI_Status* out = status ? status : &ignored;
  const auto spinUntil = Deadline::Clock::now() + std::chrono::milliseconds(10);
  auto sleep = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    AUTOSTAGE_MPI_CHECK(MPI_Test(&request, &done, out), "waiting for ", what());
    if (done) return;
    if (deadline.expired()) break;
    if (Deadline::Clock::now() < spinUntil) continue;  // every MPI_Test advances the transfer
    answerProbes();  // Note [Liveness probe]
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
  if (onTimeout == OnTimeout::Cancel) {
    MPI_Cancel(&request);
    MPI_Request_free(&request);
  } else if (onTimeout == OnTimeout::Free) {
    MPI_Request_free(&request);
  }
  throw CommError(timeoutMessage(rank, deadline.seconds(), what()));
}

namespace {

// A pending isend/irecv. The deadline starts when wait() is called. Owns the host view of the
// tensor (Note [CUDA tensors over MPI]): a send's stays alive until it completes; a receive's is
// copied into the caller's tensor when it completes.
class MpiWork : public Work {
 public:
  MpiWork(MPI_Request request, HostStaging staging, MpiBackend::Impl* impl, int rank, int peer,
          int tag, bool isRecv, double timeoutSeconds)
      : impl_(impl),
        request_(request),
        staging_(std::move(staging)),
        tensor_(staging_.host()),
        rank_(rank),
        peer_(peer),
        tag_(tag),
        isRecv_(isRecv),
        timeoutSeconds_(timeoutSeconds) {}
  ~MpiWork() override {
    if (request_ != MPI_REQUEST_NULL && !MpiEnvironment::finalized()) {
      if (isRecv_) MPI_Cancel(&request_);
      MPI_Request_free(&request_);
    }
  }
  void wait() override {
    if (done_) return;
    MPI_Status status;
    try {
      waitRequest(
          request_, &status, Deadline(timeoutSeconds_), rank_, [&] { return text(); },
          isRecv_ ? OnTimeout::Cancel : OnTimeout::Free);
    } catch (const CommError& e) {
      throw CommError(e.what() + probeReport(*impl_, Group::world(impl_->worldSize)));
    }
    finish(status);
  }
  bool isCompleted() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    AUTOSTAGE_MPI_CHECK(MPI_Test(&request_, &flag, &status), "testing ", text());
    if (flag) finish(status);
    return done_;
  }

 private:
  std::string text() const {
    std::string detail = " (tag " + std::to_string(tag_) + ", " + (isRecv_ ? "recv" : "send") +
                         " of " + describeTensor(tensor_) + ")";
    return isRecv_ ? "a tensor from rank " + std::to_string(peer_) + detail
                   : "rank " + std::to_string(peer_) + " to receive a tensor" + detail;
  }
  void finish(const MPI_Status& status) {
    done_ = true;
    if (!isRecv_) return;
    int count = 0;
    MPI_Get_count(&status, mpiTypeOf(tensor_), &count);
    AUTOSTAGE_CHECK_AS(CommError, count == tensor_.numel(), "rank ", rank_, " expected ",
                       tensor_.numel(), " elements (", describeTensor(tensor_), ") from rank ",
                       peer_, " (tag ", tag_, ") but received ", count,
                       "; sender and receiver must agree on dtype and shape");
    staging_.finish();
  }
  MpiBackend::Impl* impl_;  // the backend outlives its Work handles
  MPI_Request request_;
  HostStaging staging_;
  at::Tensor tensor_;  // what MPI moves: staging_.host()
  int rank_, peer_, tag_;
  bool isRecv_;
  double timeoutSeconds_;
  bool done_ = false;
};

}  // namespace

MpiBackend::MpiBackend(CommOptions options) : impl_(std::make_unique<Impl>()) {
  options.validate();
  impl_->options = options;
  MpiEnvironment::instance();
  AUTOSTAGE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->p2pComm),
                      "creating the p2p communicator");
  AUTOSTAGE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->collComm),
                      "creating the collective communicator");
  for (MPI_Comm comm : {impl_->p2pComm, impl_->collComm})
    AUTOSTAGE_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                        "setting the error handler");
  MPI_Comm_rank(impl_->p2pComm, &impl_->rank);
  MPI_Comm_size(impl_->p2pComm, &impl_->worldSize);
  int* tagUb = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(impl_->p2pComm, MPI_TAG_UB, &tagUb, &flag);
  if (flag && tagUb) impl_->tagUpperBound = *tagUb;
  MPI_Comm local;
  AUTOSTAGE_MPI_CHECK(MPI_Comm_split_type(impl_->collComm, MPI_COMM_TYPE_SHARED, impl_->rank,
                                          MPI_INFO_NULL, &local),
                      "finding the ranks on this node");
  MPI_Comm_rank(local, &impl_->localRank);
  MPI_Comm_size(local, &impl_->localSize);
  MPI_Comm_free(&local);
  setProbeCommunicator(impl_->collComm);
  core::setLogRank(impl_->rank, impl_->worldSize);
  core::logger("Comm")->debug("MPI backend: rank {} of {} (local {} of {}), tag bound {}, {}",
                              impl_->rank, impl_->worldSize, impl_->localRank, impl_->localSize,
                              impl_->tagUpperBound, options.toString());
}

MpiBackend::~MpiBackend() {
  if (probeCommunicator() == impl_->collComm) setProbeCommunicator(MPI_COMM_NULL);
  if (!MpiEnvironment::finalized()) impl_->freeAll();
}

int MpiBackend::rank() const { return impl_->rank; }
int MpiBackend::worldSize() const { return impl_->worldSize; }
int MpiBackend::localRank() const { return impl_->localRank; }
int MpiBackend::localSize() const { return impl_->localSize; }
const CommOptions& MpiBackend::options() const { return impl_->options; }

void MpiBackend::checkTag(int tag, const char* operation) const {
  AUTOSTAGE_CHECK(tag <= impl_->tagUpperBound, operation, " on rank ", impl_->rank, ": tag ", tag,
                  " exceeds this MPI's tag bound ", impl_->tagUpperBound, "; use smaller tags");
}

void MpiBackend::send(const at::Tensor& tensor, int dst, int tag) {
  isend(tensor, dst, tag)->wait();
}

void MpiBackend::recv(const at::Tensor& tensor, int src, int tag) {
  irecv(tensor, src, tag)->wait();
}

std::unique_ptr<Work> MpiBackend::isend(const at::Tensor& tensor, int dst, int tag) {
  checkMpiTensor(tensor, "send");
  checkPeer(dst, tag, "send");
  checkTag(tag, "send");
  HostStaging staging = HostStaging::of(tensor, HostUse::Read);
  const at::Tensor& host = staging.host();
  MPI_Request request;
  AUTOSTAGE_MPI_CHECK(MPI_Isend(host.data_ptr(), mpiCount(host, "send"), mpiTypeOf(host), dst, tag,
                                impl_->p2pComm, &request),
                      "rank ", impl_->rank, " sending to rank ", dst, " tag ", tag);
  return std::make_unique<MpiWork>(request, std::move(staging), impl_.get(), impl_->rank, dst, tag,
                                   false, impl_->options.timeoutSeconds);
}

std::unique_ptr<Work> MpiBackend::irecv(const at::Tensor& tensor, int src, int tag) {
  checkMpiTensor(tensor, "recv");
  checkPeer(src, tag, "recv");
  checkTag(tag, "recv");
  HostStaging staging = HostStaging::of(tensor, HostUse::Write);
  const at::Tensor& host = staging.host();
  MPI_Request request;
  AUTOSTAGE_MPI_CHECK(MPI_Irecv(host.data_ptr(), mpiCount(host, "recv"), mpiTypeOf(host), src, tag,
                                impl_->p2pComm, &request),
                      "rank ", impl_->rank, " receiving from rank ", src, " tag ", tag);
  return std::make_unique<MpiWork>(request, std::move(staging), impl_.get(), impl_->rank, src, tag,
                                   true, impl_->options.timeoutSeconds);
}

void MpiBackend::abortJob(const std::string& message) { MpiEnvironment::abortJob(message); }

void MpiBackend::broadcastBytes(std::string& data, int root, const Group& group) {
  broadcastBytesViaTensors(data, root, group);
}

std::vector<std::string> MpiBackend::allGatherBytes(const std::string& data, const Group& group) {
  return allGatherBytesViaTensors(data, group);
}

}  // namespace autostage::comm
