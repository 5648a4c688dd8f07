// Dead-peer scenario, run by dead_peer_check.py under mpirun -n 4 with a short comm timeout.
// Rank 3 stops taking part (mode exit: returns from main; kill/collective: SIGKILL), the others
// wait for it (p2p receive, or an allReduce) and must fail with a CommError naming it.
// Survivors print `SURVIVOR rank R: <message>`, then exit with status 3 (mode exit) or end the
// job with abortJob (modes kill and collective).
#include <ATen/ATen.h>

#include <csignal>
#include <cstdio>
#include <cstring>

#include "comm/mpi_backend.h"
#include "core/error.h"

using namespace autostage;
using namespace autostage::comm;

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "exit";
  MpiBackend backend;
  backend.barrier(backend.world());
  if (backend.rank() == 3) {
    if (mode == "exit") return 0;
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  try {
    at::Tensor t = at::ones({16});
    if (mode == "collective")
      backend.allReduce(t, ReduceOp::Sum, backend.world());
    else
      backend.recv(t, 3, 1);
    std::printf("NO ERROR on rank %d\n", backend.rank());
    return 0;
  } catch (const CommError& e) {
    std::printf("SURVIVOR rank %d: %s\n", backend.rank(), e.what());
    std::fflush(stdout);
    if (mode == "exit") return 3;  // the peer exited cleanly: finalize normally
    // A killed peer: end the job as the runtime does for unrecoverable errors (finalizing with a
    // dead peer may block in OpenMPI).
    backend.abortJob("rank " + std::to_string(backend.rank()) + " lost a peer");
  }
}
