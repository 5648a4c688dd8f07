#pragma once
// `autostage serve`: the planning service over gRPC (core/proto/planner_service.proto), answering
// from a PlanningCore (Note [Planning service]).

#include <cstdint>
#include <memory>
#include <string>

#include "service/planning_core.h"

namespace grpc {
class Server;
}

namespace autostage::service {

// "unix:PATH" -> "unix:PATH"; "tcp:HOST:PORT" -> "HOST:PORT"; "tcp:PORT" -> "127.0.0.1:PORT"
// (loopback unless a host is named). Throws ConfigError for anything else.
std::string grpcTarget(const std::string& address);

struct ServerOptions {
  std::string listen = "unix:/tmp/autostage-planner.sock";
  std::string storeDirectory;  // empty: in memory only
  int workers = 0;  // plans made at once (Note [Call deadlines]); 0: cores. Calls: 4x, >= 64
  int64_t maxRequestBytes = int64_t{256} << 20;
  // Note [Call deadlines]: a Plan or WhatIf call fails with DEADLINE_EXCEEDED after this (or its
  // caller's deadline, when sooner); a plan goes on and is stored.
  double maxPlanSeconds = 300;
  int64_t storeMaxBytes = 0;                            // Note [Store eviction]; 0: no limit
  int64_t memoryBytes = PlanningOptions().memoryBytes;  // Note [Answers from memory]
};

class PlannerServer {
 public:
  // Starts listening; throws ConfigError when the address cannot be bound (in use, bad path).
  explicit PlannerServer(ServerOptions options);
  ~PlannerServer();  // shutdown(), then waits
  // Stops accepting calls; calls in progress finish (up to graceSeconds), then the store is
  // consistent (every entry written atomically). Safe to call from another thread.
  void shutdown(double graceSeconds = 60);
  // Blocks until shutdown() has finished.
  void wait();
  PlanningCore& core() { return *core_; }
  const ServerOptions& options() const { return options_; }

 private:
  class Service;
  ServerOptions options_;
  std::unique_ptr<PlanningCore> core_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace autostage::service
