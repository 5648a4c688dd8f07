#pragma once
// MpiBackend's internal state and the deadline-polled wait. Internal to comm/.

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/comm_options.h"
#include "comm/deadline.h"
#include "comm/mpi_backend.h"

namespace autostage::comm {

struct MpiBackend::Impl {
  CommOptions options;
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localSize = 1;
  int tagUpperBound = 32767;
  MPI_Comm p2pComm = MPI_COMM_NULL;   // user send/recv
  MPI_Comm collComm = MPI_COMM_NULL;  // world collectives, group handshakes, parent of groups
  std::mutex groupsMutex;
  std::map<std::vector<int>, MPI_Comm> groups;  // created sub-group communicators
  // Set when a collective timed out: its request is still pending on a communicator, so the
  // communicators must never be freed (MPI would touch freed state when it completes).
  std::atomic<bool> abandonedRequests{false};

  // The communicator for `group`, created on first use (see Note [Group creation]).
  MPI_Comm communicator(const Group& group);
  void freeAll();

 private:
  void handshake(const Group& group);
};

// MPI datatype for a tensor's elements (float16/bfloat16 as 16-bit words: move, not reduce).
MPI_Datatype mpiTypeOf(const at::Tensor& tensor);
// Throws Error unless `tensor` is one the MPI backend moves: checkCommTensor's checks, on the CPU
// or on CUDA (through host memory: Note [CUDA tensors over MPI] in host_staging.h).
void checkMpiTensor(const at::Tensor& tensor, const char* operation);
// Element count as MPI's int; UnsupportedError beyond INT_MAX.
int mpiCount(const at::Tensor& tensor, const char* operation);

enum class OnTimeout { Cancel, Free, Leave };

// Polls `request` with MPI_Test until it completes or `deadline` passes. On timeout, cancels or
// frees the request as asked and throws CommError with timeoutMessage(rank, ..., what()).
void waitRequest(MPI_Request& request, MPI_Status* status, const Deadline& deadline, int rank,
                 const std::function<std::string()>& what, OnTimeout onTimeout);

// Note [Liveness probe] (mpi_collectives.cpp): after a timeout, which other members of `group`
// are alive and also timed out. Returns a clause ("; a liveness probe ...") to append to the
// timeout message.
std::string probeReport(MpiBackend::Impl& impl, const Group& group);
// Where waiting ranks answer probes: the collective communicator of the latest MPI backend
// (MPI_COMM_NULL: none). answerProbes() answers pending probes without blocking; waitRequest
// calls it while it sleeps, so a rank blocked in any wait counts as alive.
void setProbeCommunicator(MPI_Comm comm);
MPI_Comm probeCommunicator();
void answerProbes();

}  // namespace autostage::comm
