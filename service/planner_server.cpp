#include "service/planner_server.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/proto/planner_service.grpc.pb.h"
#include "service/planner_client.h"

namespace autostage::service {

std::string grpcTarget(const std::string& address) {
  if (address.rfind("unix:", 0) == 0 && address.size() > 5) return address;
  if (address.rfind("tcp:", 0) == 0) {
    std::string rest = address.substr(4);
    if (!rest.empty() && rest.find(':') == std::string::npos) return "127.0.0.1:" + rest;
    if (rest.find(':') != std::string::npos && rest.find(':') > 0) return rest;
  }
  throw ConfigError("planner address '" + address +
                    "' is not unix:PATH, tcp:PORT or "
                    "tcp:HOST:PORT (e.g. unix:/run/autostage/planner.sock or tcp:127.0.0.1:7070)");
}

namespace {

// The autostage error class travels in trailing metadata, so the client rethrows the same class.
grpc::Status errorStatus(grpc::ServerContext* context) {
  try {
    throw;
  } catch (const DeadlineExceeded& e) {
    context->AddTrailingMetadata("autostage-error-class", "DeadlineExceeded");
    return {grpc::StatusCode::DEADLINE_EXCEEDED, e.what()};
  } catch (const CallCancelled& e) {
    context->AddTrailingMetadata("autostage-error-class", "CallCancelled");
    return {grpc::StatusCode::CANCELLED, e.what()};
  } catch (const NotStored& e) {
    context->AddTrailingMetadata("autostage-error-class", "NotStored");
    return {grpc::StatusCode::NOT_FOUND, e.what()};
  } catch (const PlanError& e) {
    context->AddTrailingMetadata("autostage-error-class", "PlanError");
    return {grpc::StatusCode::FAILED_PRECONDITION, e.what()};
  } catch (const ConfigError& e) {
    context->AddTrailingMetadata("autostage-error-class", "ConfigError");
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  } catch (const FormatError& e) {
    context->AddTrailingMetadata("autostage-error-class", "FormatError");
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  } catch (const UnsupportedError& e) {
    context->AddTrailingMetadata("autostage-error-class", "UnsupportedError");
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  } catch (const std::exception& e) {
    context->AddTrailingMetadata("autostage-error-class", "Error");
    return {grpc::StatusCode::INTERNAL, e.what()};
  }
}

// Note [Call deadlines]: whether the client still waits. IsCancelled() turns true when the
// client's deadline passes or it cancels (or goes away); the deadline tells which.
CallerCheck callerOf(grpc::ServerContext* context) {
  return [context] {
    if (!context->IsCancelled()) return CallerState::kWaiting;
    return std::chrono::system_clock::now() >= context->deadline() ? CallerState::kDeadlinePassed
                                                                   : CallerState::kCancelled;
  };
}

}  // namespace

class PlannerServer::Service final : public proto::Planner::Service {
 public:
  Service(PlanningCore& core, std::string listen) : core_(core), listen_(std::move(listen)) {}

  grpc::Status Plan(grpc::ServerContext* context, const proto::PlanCall* call,
                    proto::PlanAnswer* answer) override {
    return run(context, "Plan", [&] {
      *answer = core_.plan(*call, callerOf(context));
      return answer->from_store() ? "answered from the store (plan " + answer->plan_key() + ")"
                                  : "planned " + std::to_string(answer->stages()) +
                                        " stage(s) in " + std::to_string(answer->plan_seconds()) +
                                        " s (plan " + answer->plan_key() + ")";
    });
  }
  grpc::Status WhatIf(grpc::ServerContext* context, const proto::WhatIfCall* call,
                      proto::WhatIfAnswer* answer) override {
    return run(context, "WhatIf", [&] {
      *answer = core_.whatIf(*call, callerOf(context));
      return std::to_string(answer->points_size()) + " point(s)";
    });
  }
  grpc::Status Neighbours(grpc::ServerContext* context, const proto::NeighboursCall* call,
                          proto::NeighboursAnswer* answer) override {
    return run(context, "Neighbours", [&] {
      *answer = core_.neighbours(*call);
      return std::to_string(answer->queued_size()) + " device count(s) queued";
    });
  }
  grpc::Status Status(grpc::ServerContext* context, const proto::StatusCall*,
                      proto::StatusAnswer* answer) override {
    return run(context, "Status", [&] {
      *answer = core_.status();
      answer->set_in_flight(answer->in_flight() - 1);  // not this Status call
      answer->set_listen(listen_);
      return std::string("answered");
    });
  }

 private:
  // One log line per call; its text is made only when the level prints it.
  template <typename F>
  grpc::Status run(grpc::ServerContext* context, const char* what, F&& body) {
    core_.enter();
    grpc::Status status;
    try {
      std::string done = body();
      if (log_->should_log(spdlog::level::info))
        log_->info("{} from {}: {}", what, context->peer(), done);
    } catch (...) {
      status = errorStatus(context);
      log_->warn("{} from {} refused: {}", what, context->peer(), status.error_message());
    }
    core_.leave();
    core_.countRequest(!status.ok());
    return status;
  }

  PlanningCore& core_;
  const std::string listen_;
  const std::shared_ptr<spdlog::logger> log_ = core::logger("Service");
};

PlannerServer::PlannerServer(ServerOptions options) : options_(std::move(options)) {
  const std::string target = grpcTarget(options_.listen);
  if (target.rfind("unix:", 0) == 0) {
    // A socket file left by a service that died would make the bind fail: remove it, unless a
    // service still answers there.
    const std::string path = target.substr(5);
    struct stat info {};
    if (::stat(path.c_str(), &info) == 0) {
      AUTOSTAGE_CHECK_AS(ConfigError, S_ISSOCK(info.st_mode), "cannot listen on ", path,
                         ": a file that is not a socket is there; choose another --listen path");
      bool answered = false;
      try {
        PlannerClient(options_.listen).status(2.0);
        answered = true;
      } catch (const Error&) {
      }
      AUTOSTAGE_CHECK_AS(ConfigError, !answered, "a planning service already listens on ", path,
                         ": stop it or choose another --listen path");
      ::unlink(path.c_str());
    }
  }
  const int workers = options_.workers > 0
                          ? options_.workers
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  PlanningOptions planning;
  planning.storeDirectory = options_.storeDirectory;
  planning.storeMaxBytes = options_.storeMaxBytes;
  planning.maxConcurrentPlans = workers;
  planning.maxPlanSeconds = options_.maxPlanSeconds;
  planning.memoryBytes = options_.memoryBytes;
  core_ = std::make_unique<PlanningCore>(planning);
  service_ = std::make_unique<Service>(*core_, options_.listen);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(target, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(options_.maxRequestBytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(INT32_MAX);
  // Calls wait on their thread for plans made on the core's threads, and for a worker when every
  // one is busy (Note [Call deadlines]); answers from the store take a millisecond or two. So many
  // more calls than plans can be in flight, each thread mostly asleep: a burst of clients must
  // not be refused while plans are made. gRPC's own poller needs one more thread.
  const int callThreads = std::max(64, 4 * workers);
  grpc::ResourceQuota quota("autostage-planner");
  quota.SetMaxThreads(callThreads + 1);
  builder.SetResourceQuota(quota);
  server_ = builder.BuildAndStart();
  AUTOSTAGE_CHECK_AS(ConfigError, server_ != nullptr && (target.rfind("unix:", 0) == 0 || port > 0),
                     "cannot listen on ", options_.listen,
                     " (address in use, or a directory that "
                     "does not exist or is not writable)");
  core::logger("Service")->info(
      "Planning service listening on {} ({} plan(s) at once, {} call threads, store {} ({} "
      "entries, {:.1f} MiB, {}), answers kept in memory up to {:.1f} MiB, requests up to {} "
      "bytes, calls up to {} s)",
      options_.listen, workers, callThreads,
      options_.storeDirectory.empty() ? "in memory only" : options_.storeDirectory,
      core_->store().entries(), core_->store().bytes() / 1048576.0,
      options_.storeMaxBytes > 0
          ? fmt::format("evicting above {:.1f} MiB", options_.storeMaxBytes / 1048576.0)
          : std::string("no size limit"),
      options_.memoryBytes / 1048576.0, options_.maxRequestBytes, options_.maxPlanSeconds);
}

PlannerServer::~PlannerServer() {
  shutdown();
  wait();
}

void PlannerServer::shutdown(double graceSeconds) {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(graceSeconds * 1000)));
}

void PlannerServer::wait() {
  if (!server_) return;
  server_->Wait();
  server_.reset();
  const std::string target = grpcTarget(options_.listen);
  if (target.rfind("unix:", 0) == 0) ::unlink(target.substr(5).c_str());
  core::logger("Service")->info(
      "Planning service stopped after {} request(s); store {}", core_->status().requests(),
      options_.storeDirectory.empty() ? "in memory (dropped)" : "consistent");
}

}  // namespace autostage::service
