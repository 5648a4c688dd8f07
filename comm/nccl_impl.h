#pragma once
// NcclBackend's internal state and checking macros. Internal to comm/.

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/nccl_backend.h"
#include "comm/p2p_group.h"
#include "core/error.h"

#define AUTOSTAGE_NCCL_CHECK(call, ...)                                                  \
  do {                                                                                   \
    ncclResult_t autostageNcclCode_ = (call);                                            \
    if (autostageNcclCode_ != ncclSuccess && autostageNcclCode_ != ncclInProgress)       \
      throw ::autostage::CommError(::autostage::detail::concat(                          \
          #call, " failed: ", ncclGetErrorString(autostageNcclCode_), " (", __VA_ARGS__, \
          "). Check NCCL_DEBUG=INFO output and the other ranks' logs"));                 \
  } while (false)

#define AUTOSTAGE_CUDA_CHECK(call, ...)                                                         \
  do {                                                                                          \
    cudaError_t autostageCudaCode_ = (call);                                                    \
    if (autostageCudaCode_ != cudaSuccess)                                                      \
      throw ::autostage::CommError(::autostage::detail::concat(                                 \
          #call, " failed: ", cudaGetErrorString(autostageCudaCode_), " (", __VA_ARGS__, ")")); \
  } while (false)

namespace autostage::comm {

struct NcclBackend::Impl {
  std::shared_ptr<MpiBackend> control;
  CommOptions options;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::mutex mutex;
  std::map<std::vector<int>, ncclComm_t> comms;

  // Point-to-point operations queued since the last launch (Note [Grouped point-to-point] in
  // p2p_group.h); a batch completes with the event recorded after its ncclGroupEnd.
  P2pGrouper<std::shared_ptr<CUevent_st>> p2p;

  // The communicator of `group`, created on first use (collective over its members).
  ncclComm_t communicator(const Group& group);
  // Launches the queued point-to-point operations as one NCCL group, after the work queued on
  // the default stream.
  void launchP2p();
  // Before a collective: launches the queued point-to-point operations (a peer may be blocked on
  // one of them) and orders after the default stream.
  void beforeCollective();
  // Makes the backend stream wait for work queued so far on the legacy default stream.
  void orderAfterDefaultStream();
  // An event recorded on the backend stream after the operation just queued.
  cudaEvent_t recordDone();
  // Polls `done` until it completes or the timeout passes; on timeout or an asynchronous NCCL
  // error, aborts `comm` (dropping it from the cache) and throws CommError.
  void waitDone(cudaEvent_t done, ncclComm_t comm, const std::function<std::string()>& what);
  void forget(ncclComm_t comm);
};

// NCCL datatype for the tensor's elements; int16 moves as 16-bit words (not reducible).
ncclDataType_t ncclTypeOf(const at::Tensor& tensor);

}  // namespace autostage::comm
