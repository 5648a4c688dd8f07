// MpiBackend's collectives and sub-group communicators.
#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/host_staging.h"
#include "comm/mpi_backend.h"
#include "comm/mpi_check.h"
#include "comm/mpi_environment.h"
#include "comm/mpi_impl.h"
#include "comm/tensor_util.h"

namespace autostage::comm {

namespace {
// Tags on collComm for the group-creation handshake; user tags live on p2pComm.
constexpr int kHelloTag = 1;
constexpr int kReadyTag = 2;
constexpr int kCreateTag = 3;

int groupFingerprint(const Group& group) {
  return static_cast<int>(std::hash<std::string>()(group.toString()) & 0x7fffffff);
}
}  // namespace

// Note [Group creation]: MPI_Comm_create_group blocks until every member calls it and has no
// deadline. So members first say hello to the leader and wait for its "ready" with deadlines;
// only when all members are known alive and creating the same group do they call it.
void MpiBackend::Impl::handshake(const Group& group) {
  Deadline deadline(options.timeoutSeconds);
  int mine[2] = {group.size(), groupFingerprint(group)};
  auto what = [&](int peer, const char* step) {
    return std::function<std::string()>([=, &group] {
      return "rank " + std::to_string(peer) + " (" + step + " while creating group " +
             group.toString() + ")";
    });
  };
  if (rank != group.leader()) {
    MPI_Request request;
    AUTOSTAGE_MPI_CHECK(MPI_Isend(mine, 2, MPI_INT, group.leader(), kHelloTag, collComm, &request),
                        "group ", group.toString(), " hello");
    waitRequest(request, nullptr, deadline, rank, what(group.leader(), "hello"), OnTimeout::Free);
    int ready = 0;
    AUTOSTAGE_MPI_CHECK(
        MPI_Irecv(&ready, 1, MPI_INT, group.leader(), kReadyTag, collComm, &request), "group ",
        group.toString(), " ready");
    waitRequest(request, nullptr, deadline, rank, what(group.leader(), "ready"), OnTimeout::Cancel);
    return;
  }
  for (int member : group.ranks()) {
    if (member == rank) continue;
    int theirs[2] = {0, 0};
    MPI_Request request;
    AUTOSTAGE_MPI_CHECK(MPI_Irecv(theirs, 2, MPI_INT, member, kHelloTag, collComm, &request),
                        "group ", group.toString(), " hello");
    waitRequest(request, nullptr, deadline, rank, what(member, "hello"), OnTimeout::Cancel);
    AUTOSTAGE_CHECK_AS(CommError, theirs[0] == mine[0] && theirs[1] == mine[1], "rank ", member,
                       " is creating a different group than ", group.toString(), " (leader rank ",
                       rank, "); members must first use overlapping groups in the same order");
  }
  for (int member : group.ranks()) {
    if (member == rank) continue;
    int ready = 1;
    MPI_Request request;
    AUTOSTAGE_MPI_CHECK(MPI_Isend(&ready, 1, MPI_INT, member, kReadyTag, collComm, &request),
                        "group ", group.toString(), " ready");
    waitRequest(request, nullptr, deadline, rank, what(member, "ready"), OnTimeout::Free);
  }
}

MPI_Comm MpiBackend::Impl::communicator(const Group& group) {
  if (group.size() == worldSize) return collComm;
  std::lock_guard<std::mutex> lock(groupsMutex);
  auto it = groups.find(group.ranks());
  if (it != groups.end()) return it->second;
  handshake(group);
  MPI_Group worldGroup, subGroup;
  MPI_Comm_group(collComm, &worldGroup);
  MPI_Group_incl(worldGroup, group.size(), group.ranks().data(), &subGroup);
  MPI_Comm comm;
  int code = MPI_Comm_create_group(collComm, subGroup, kCreateTag, &comm);
  MPI_Group_free(&subGroup);
  MPI_Group_free(&worldGroup);
  AUTOSTAGE_MPI_CHECK(code, "rank ", rank, " creating group ", group.toString());
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  groups.emplace(group.ranks(), comm);
  return comm;
}

void MpiBackend::Impl::freeAll() {
  if (abandonedRequests) return;  // see abandonedRequests: leaking is the safe choice
  std::lock_guard<std::mutex> lock(groupsMutex);
  for (auto& [ranks, comm] : groups) MPI_Comm_free(&comm);
  groups.clear();
  if (p2pComm != MPI_COMM_NULL) MPI_Comm_free(&p2pComm);
  if (collComm != MPI_COMM_NULL) MPI_Comm_free(&collComm);
}

void MpiBackend::createGroup(const Group& group) {
  checkMember(group, "createGroup");
  impl_->communicator(group);
}

namespace {
// Note [Liveness probe]
// A timed-out collective cannot tell which member is missing, and a timed-out receive cannot tell
// whether its peer died or waits for someone else. So a rank that timed out sends a one-byte
// probe to every other member of the group (the world, for point-to-point waits) over the world
// collective communicator (whose point-to-point traffic never meets its collectives) and listens
// for theirs for a short window (comm_timeout_s / 4, at most 2 s). Ranks that timed out at about
// the same time answer each other; one that died, or is stuck elsewhere, does not. When every
// member of a collective's group answers, they all wait for a rank outside it (a replica of this
// stage waiting for a dead rank of the next stage), so this rank probes the other ranks of the
// world too and names the silent ones. The backend
// is not to be used after a timeout (Backend contract), so probes of a later timeout never meet
// stale ones.
constexpr int kProbeTag = 32001;

std::vector<int> silentMembers(MpiBackend::Impl& impl, const Group& group, double seconds) {
  std::vector<int> others;
  for (int r : group.ranks())
    if (r != impl.rank) others.push_back(r);
  // Static: a probe may never be received, and its buffer must outlive the send. The answer
  // buffers are freed on return: every receive has completed or been cancelled and waited for.
  static const char probe = 1;
  std::vector<char> answers(others.size());
  std::vector<MPI_Request> sends(others.size()), recvs(others.size());
  for (size_t i = 0; i < others.size(); ++i) {
    MPI_Isend(&probe, 1, MPI_CHAR, others[i], kProbeTag, impl.collComm, &sends[i]);
    MPI_Irecv(&answers[i], 1, MPI_CHAR, others[i], kProbeTag, impl.collComm, &recvs[i]);
  }
  std::vector<bool> answered(others.size(), false);
  Deadline window(seconds);
  size_t pending = others.size();
  while (pending > 0 && !window.expired()) {
    for (size_t i = 0; i < others.size(); ++i) {
      int done = 0;
      if (!answered[i] && MPI_Test(&recvs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[i] = true;
        --pending;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<int> silent;
  for (size_t i = 0; i < others.size(); ++i) {
    if (!answered[i]) {
      MPI_Cancel(&recvs[i]);
      // A wait on a cancelled receive returns whatever the peers do (MPI 3.1, 3.8.4); after it
      // no late answer can be written into `answers`. (It may have arrived since the last test.)
      MPI_Status status;
      MPI_Wait(&recvs[i], &status);
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (cancelled) silent.push_back(others[i]);
    }
    int done = 0;
    MPI_Test(&sends[i], &done, MPI_STATUS_IGNORE);
    if (!done) MPI_Request_free(&sends[i]);
  }
  return silent;
}

std::atomic<MPI_Comm> probeComm{MPI_COMM_NULL};

}  // namespace

void setProbeCommunicator(MPI_Comm comm) { probeComm.store(comm); }
MPI_Comm probeCommunicator() { return probeComm.load(); }

void answerProbes() {
  MPI_Comm comm = probeComm.load();
  if (comm == MPI_COMM_NULL) return;
  static const char answer = 1;
  for (;;) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, kProbeTag, comm, &flag, &message, &status) != MPI_SUCCESS ||
        !flag)
      return;
    char byte = 0;
    MPI_Mrecv(&byte, 1, MPI_CHAR, &message, MPI_STATUS_IGNORE);  // matched: never blocks
    MPI_Request request;
    if (MPI_Isend(&answer, 1, MPI_CHAR, status.MPI_SOURCE, kProbeTag, comm, &request) ==
        MPI_SUCCESS)
      MPI_Request_free(&request);
  }
}

namespace {

// "; a liveness probe of group G got no answer within S s from rank(s) R: ..." for `silent`.
std::string silentClause(const Group& probed, double seconds, const std::vector<int>& silent) {
  std::ostringstream out;
  out << "; a liveness probe of group " << probed.toString() << " got no answer within " << seconds
      << " s from " << (silent.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < silent.size(); ++i) out << (i ? "," : "") << silent[i];
  out << ": " << (silent.size() == 1 ? "it has" : "they have") << " probably died or "
      << (silent.size() == 1 ? "is" : "are") << " stuck elsewhere";
  return out.str();
}

}  // namespace

std::string probeReport(MpiBackend::Impl& impl, const Group& group) {
  double seconds = std::clamp(impl.options.timeoutSeconds / 4, 0.2, 2.0);
  std::vector<int> silent = silentMembers(impl, group, seconds);
  if (!silent.empty()) return silentClause(group, seconds, silent);
  std::ostringstream out;
  out << "; every other member of group " << group.toString()
      << " answered a liveness probe: all are alive";
  // They wait for someone outside the group (e.g. a replica for a dead rank of the next stage):
  // probe the rest of the world too (Note [Liveness probe]).
  std::vector<int> rest{impl.rank};
  for (int r = 0; r < impl.worldSize; ++r)
    if (!group.contains(r)) rest.push_back(r);
  if (rest.size() > 1) {
    Group outside(rest);
    std::vector<int> silentOutside = silentMembers(impl, outside, seconds);
    if (!silentOutside.empty()) out << silentClause(outside, seconds, silentOutside);
  }
  return out.str();
}

namespace {
// Runs one non-blocking collective to completion against the timeout. Collective requests
// cannot be cancelled, so a timed-out one is left behind (the backend is unusable after it).
void runCollective(MpiBackend::Impl& impl, const char* operation, const Group& group,
                   const std::string& payload,
                   const std::function<int(MPI_Comm, MPI_Request*)>& start) {
  MPI_Request request;
  AUTOSTAGE_MPI_CHECK(start(impl.communicator(group), &request), "rank ", impl.rank, " starting ",
                      operation, " over group ", group.toString());
  auto what = [&] {
    std::string others;
    for (int r : group.ranks())
      if (r != impl.rank) others += (others.empty() ? "" : ",") + std::to_string(r);
    bool one = group.size() == 2;
    return std::string(one ? "rank " : "ranks ") + others +
           (one ? ", the other member" : ", the other members") + " of group " +
           group.toString() + " (" + operation + (payload.empty() ? "" : " of " + payload) + ")";
  };
  try {
    waitRequest(request, nullptr, Deadline(impl.options.timeoutSeconds), impl.rank, what,
                OnTimeout::Leave);
  } catch (const CommError& e) {
    impl.abandonedRequests = true;
    throw CommError(e.what() + probeReport(impl, group));
  }
}
}  // namespace

// Note [CUDA tensors over MPI] (host_staging.h): every collective below runs on host views.
void MpiBackend::allReduce(const at::Tensor& tensor, ReduceOp op, const Group& group) {
  checkMpiTensor(tensor, "allReduce");
  checkMember(group, "allReduce");
  if (op == ReduceOp::Average) checkAverageable(tensor);
  if (group.size() == 1) return;
  HostStaging staging = HostStaging::of(tensor, HostUse::ReadWrite);
  const at::Tensor& host = staging.host();
  bool halfWidth = host.scalar_type() == at::kHalf || host.scalar_type() == at::kBFloat16;
  // MPI cannot add 16-bit floats: reduce a float32 copy.
  at::Tensor work = halfWidth ? host.to(at::kFloat) : host;
  MPI_Op mpiOp = work.scalar_type() == at::kBool ? MPI_LOR : MPI_SUM;
  int count = mpiCount(work, "allReduce");
  runCollective(*impl_, "allReduce", group, describeTensor(tensor),
                [&](MPI_Comm comm, MPI_Request* request) {
                  return MPI_Iallreduce(MPI_IN_PLACE, work.data_ptr(), count, mpiTypeOf(work),
                                        mpiOp, comm, request);
                });
  if (op == ReduceOp::Average) work.div_(group.size());
  if (halfWidth) host.copy_(work);
  staging.finish();
}

void MpiBackend::broadcast(const at::Tensor& tensor, int root, const Group& group) {
  checkMpiTensor(tensor, "broadcast");
  checkMember(group, "broadcast", root);
  if (group.size() == 1) return;
  HostStaging staging =
      HostStaging::of(tensor, root == impl_->rank ? HostUse::Read : HostUse::Write);
  const at::Tensor& host = staging.host();
  int count = mpiCount(host, "broadcast");
  runCollective(*impl_, "broadcast", group, describeTensor(tensor),
                [&](MPI_Comm comm, MPI_Request* request) {
                  return MPI_Ibcast(host.data_ptr(), count, mpiTypeOf(host), group.indexOf(root),
                                    comm, request);
                });
  staging.finish();
}

std::vector<at::Tensor> MpiBackend::allGather(const at::Tensor& tensor, const Group& group) {
  checkMpiTensor(tensor, "allGather");
  checkMember(group, "allGather");
  HostStaging staging = HostStaging::of(tensor, HostUse::Read);
  const at::Tensor& host = staging.host();
  std::vector<int64_t> shape = {group.size()};
  for (int64_t size : tensor.sizes()) shape.push_back(size);
  at::Tensor gathered = at::empty(shape, host.options());
  int count = mpiCount(host, "allGather");
  MPI_Datatype type = mpiTypeOf(host);
  if (group.size() == 1) {
    gathered.select(0, 0).copy_(host);
  } else {
    runCollective(*impl_, "allGather", group, describeTensor(tensor),
                  [&](MPI_Comm comm, MPI_Request* request) {
                    return MPI_Iallgather(host.data_ptr(), count, type, gathered.data_ptr(), count,
                                          type, comm, request);
                  });
  }
  if (gathered.device() != tensor.device()) gathered = gathered.to(tensor.device());
  std::vector<at::Tensor> out;
  for (int i = 0; i < group.size(); ++i) out.push_back(gathered.select(0, i));
  return out;
}

// Note [Sharded collectives]. MPI cannot add 16-bit floats: they reduce as float32 copies.
void MpiBackend::reduceScatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                               const Group& group) {
  checkMpiTensor(input, "reduceScatter");
  checkMpiTensor(output, "reduceScatter");
  checkShards(input, output, group, "reduceScatter");
  if (op == ReduceOp::Average) checkAverageable(input);
  HostStaging in = HostStaging::of(input, HostUse::Read);
  HostStaging out = HostStaging::of(output, HostUse::Write);
  bool halfWidth = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  at::Tensor send = halfWidth ? in.host().to(at::kFloat) : in.host();
  at::Tensor receive = halfWidth ? at::empty(output.sizes(), send.options()) : out.host();
  if (group.size() == 1) {
    receive.copy_(send.view(receive.sizes()));
  } else {
    MPI_Op mpiOp = send.scalar_type() == at::kBool ? MPI_LOR : MPI_SUM;
    int count = mpiCount(receive, "reduceScatter");
    runCollective(*impl_, "reduceScatter", group, describeTensor(input),
                  [&](MPI_Comm comm, MPI_Request* request) {
                    return MPI_Ireduce_scatter_block(send.data_ptr(), receive.data_ptr(), count,
                                                     mpiTypeOf(send), mpiOp, comm, request);
                  });
  }
  if (op == ReduceOp::Average) receive.div_(group.size());
  if (halfWidth) out.host().copy_(receive);
  out.finish();
}

void MpiBackend::allGatherInto(const at::Tensor& input, const at::Tensor& output,
                               const Group& group) {
  checkMpiTensor(input, "allGatherInto");
  checkMpiTensor(output, "allGatherInto");
  checkShards(output, input, group, "allGatherInto");
  if (group.size() == 1) {
    output.view(-1).copy_(input.reshape(-1));
    return;
  }
  HostStaging in = HostStaging::of(input, HostUse::Read);
  HostStaging out = HostStaging::of(output, HostUse::Write);
  int count = mpiCount(in.host(), "allGatherInto");
  MPI_Datatype type = mpiTypeOf(in.host());
  runCollective(*impl_, "allGatherInto", group, describeTensor(input),
                [&](MPI_Comm comm, MPI_Request* request) {
                  return MPI_Iallgather(in.host().data_ptr(), count, type,
                                        out.host().data_ptr(), count, type, comm, request);
                });
  out.finish();
}

void MpiBackend::barrier(const Group& group) {
  checkMember(group, "barrier");
  if (group.size() == 1) return;
  runCollective(*impl_, "barrier", group, "",
                [&](MPI_Comm comm, MPI_Request* request) { return MPI_Ibarrier(comm, request); });
}

}  // namespace autostage::comm
