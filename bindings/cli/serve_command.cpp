#include "bindings/cli/serve_command.h"

#include <csignal>
#include <iomanip>
#include <thread>

#include "bindings/cli/cli_args.h"
#include "core/error.h"
#include "core/log.h"
#include "service/planner_client.h"
#include "service/planner_server.h"

namespace autostage::cli {

std::string serveUsage() {
  return "usage: autostage serve [--listen unix:PATH|tcp:PORT|tcp:HOST:PORT] [--store DIR]\n"
         "         [--workers N] [--max-request-mib M] [--max-plan-s S] [--store-max-mib N]\n"
         "         [--memory-mib N]\n"
         "  The planning service: jobs (planner_address), `autostage plan --server` and\n"
         "  `autostage whatif --server` ask it. --listen defaults to\n"
         "  unix:/tmp/autostage-planner.sock (tcp:PORT listens on 127.0.0.1 only); --store keeps\n"
         "  graphs, profiles and plans across restarts (default: in memory). SIGTERM or SIGINT\n"
         "  stops it after the calls in progress. A Plan or WhatIf call fails with\n"
         "  DEADLINE_EXCEEDED after --max-plan-s (default 300; the plan goes on and is stored);\n"
         "  --store-max-mib evicts the least recently used entries above N MiB (default 0: no\n"
         "  limit); --memory-mib bounds each of the decoded answers, profile keys and call files\n"
         "  kept in memory to N MiB (default 256; 0: none kept, every stored answer read again).\n"
         "       autostage status [--server ADDR] [--json]   a running service's counters\n";
}

int runServeCommand(const std::vector<std::string>& args, std::ostream& out) {
  Arguments a(args,
              {"listen", "store", "workers", "max-request-mib", "max-plan-s", "store-max-mib",
               "memory-mib"},
              {"help"});
  if (a.has("help")) {
    out << serveUsage();
    return 0;
  }
  service::ServerOptions options;
  options.listen = a.get("listen", options.listen);
  options.storeDirectory = a.get("store", "");
  options.workers = static_cast<int>(a.getInt("workers", 0));
  const int64_t mib = a.getInt("max-request-mib", options.maxRequestBytes >> 20);
  AUTOSTAGE_CHECK_AS(ConfigError, mib >= 1 && mib <= 2047,
                     "--max-request-mib must be in [1, 2047], "
                     "got ",
                     mib);
  options.maxRequestBytes = mib << 20;
  AUTOSTAGE_CHECK_AS(ConfigError, options.workers >= 0, "--workers must be >= 0 (0: one per core)");
  options.maxPlanSeconds = a.getFloat("max-plan-s", options.maxPlanSeconds);
  AUTOSTAGE_CHECK_AS(ConfigError, options.maxPlanSeconds > 0, "--max-plan-s must be > 0, got ",
                     options.maxPlanSeconds);
  const int64_t storeMib = a.getInt("store-max-mib", 0);
  AUTOSTAGE_CHECK_AS(ConfigError, storeMib >= 0 && storeMib <= (int64_t{1} << 30),
                     "--store-max-mib must be >= 0 (0: no limit), got ", storeMib);
  options.storeMaxBytes = storeMib << 20;
  // Note [Answers from memory] (service/stored_copies.h).
  const int64_t memoryMib = a.getInt("memory-mib", options.memoryBytes >> 20);
  AUTOSTAGE_CHECK_AS(ConfigError, memoryMib >= 0 && memoryMib <= (int64_t{1} << 30),
                     "--memory-mib must be >= 0 (0: nothing kept in memory), got ", memoryMib);
  options.memoryBytes = memoryMib << 20;
  // Block SIGTERM and SIGINT before any thread starts, so that only the waiting thread below
  // receives them (gRPC's threads inherit the mask).
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGTERM);
  sigaddset(&stopSignals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);
  service::PlannerServer server(options);
  std::thread stopper([&] {
    int signal = 0;
    sigwait(&stopSignals, &signal);
    core::logger("Service")->info("{} received: finishing the calls in progress",
                                  signal == SIGTERM ? "SIGTERM" : "SIGINT");
    server.shutdown();
  });
  server.wait();
  stopper.join();
  return 0;
}

int runStatusCommand(const std::vector<std::string>& args, std::ostream& out) {
  Arguments a(args, {"server", "timeout-s"}, {"json", "help"});
  if (a.has("help")) {
    out << serveUsage();
    return 0;
  }
  const std::string address = a.get("server", service::ServerOptions().listen);
  proto::StatusAnswer s = service::PlannerClient(address).status(a.getFloat("timeout-s", 10));
  if (a.has("json")) {
    out << std::setprecision(10) << "{\"uptime_seconds\": " << s.uptime_seconds()
        << ", \"requests\": " << s.requests() << ", \"failed\": " << s.failed()
        << ", \"plans_made\": " << s.plans_made() << ", \"store_hits\": " << s.store_hits()
        << ", \"hit_rate\": " << s.hit_rate() << ", \"in_flight\": " << s.in_flight()
        << ", \"store_entries\": " << s.store_entries() << ", \"store_bytes\": " << s.store_bytes()
        << ", \"background_queued\": " << s.background_queued()
        << ", \"waiting_for_worker\": " << s.waiting_for_worker()
        << ", \"store_evictions\": " << s.store_evictions()
        << ", \"store_max_bytes\": " << s.store_max_bytes() << "}\n";
    return 0;
  }
  out << std::fixed << std::setprecision(1) << "planning service at " << address << "\n"
      << "  up " << s.uptime_seconds() << " s; " << s.requests() << " request(s) answered, "
      << s.failed() << " refused, " << s.in_flight() << " in flight ("
      << s.waiting_for_worker() << " waiting for a worker)\n"
      << "  plans made " << s.plans_made() << ", answered from the store " << s.store_hits()
      << " (hit rate " << s.hit_rate() * 100 << "%), " << s.background_queued()
      << " background plan(s) queued\n"
      << "  store " << (s.store_dir().empty() ? "in memory" : s.store_dir()) << ": "
      << s.store_entries() << " entries, " << s.store_bytes() << " bytes"
      << (s.store_max_bytes() > 0 ? " (limit " + std::to_string(s.store_max_bytes()) + " bytes, " +
                                        std::to_string(s.store_evictions()) + " evicted)"
                                  : std::string(" (no size limit)"))
      << "\n";
  return 0;
}

}  // namespace autostage::cli
