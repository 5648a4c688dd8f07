#include "service/planner_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "core/proto/planner_service.grpc.pb.h"
#include "service/planner_server.h"

namespace autostage::service {

struct PlannerClient::Channel {
  std::unique_ptr<proto::Planner::Stub> stub;
};

PlannerClient::PlannerClient(const std::string& address)
    : address_(address), channel_(std::make_unique<Channel>()) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(INT32_MAX);
  channel_->stub = proto::Planner::NewStub(grpc::CreateCustomChannel(
      grpcTarget(address), grpc::InsecureChannelCredentials(), arguments));
}

PlannerClient::~PlannerClient() = default;

namespace {

template <typename Call, typename Answer, typename Method>
Answer ask(const std::string& address, const char* what, Method method, const Call& call,
           double timeoutSeconds) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000)));
  Answer answer;
  grpc::Status status = method(&context, call, &answer);
  if (status.ok()) return answer;
  const std::string message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNIMPLEMENTED:
      throw ServiceUnavailable("the planning service at " + address + " did not answer " + what +
                               " (" + message + ")");
    default:
      break;
  }
  std::string errorClass;
  auto trailing = context.GetServerTrailingMetadata();
  if (auto found = trailing.find("autostage-error-class"); found != trailing.end())
    errorClass.assign(found->second.data(), found->second.size());
  if (errorClass == "NotStored") throw NotStored(message);
  if (errorClass == "PlanError") throw PlanError(message);
  if (errorClass == "ConfigError") throw ConfigError(message);
  if (errorClass == "FormatError") throw FormatError(message);
  if (errorClass == "UnsupportedError") throw UnsupportedError(message);
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    if (message.find("larger than max") != std::string::npos)
      throw ConfigError("the planning service at " + address + " refused the " + what +
                        " call: " + message + " (raise its --max-request-mib)");
    // Every call thread is taken (4x --workers, at least 16): like no answer, the caller may
    // plan itself.
    throw ServiceUnavailable("the planning service at " + address +
                             " is busy and did not take "
                             "the " +
                             what + " call (" + message + "; raise its --workers)");
  }
  throw Error("the planning service at " + address + " failed the " + what + " call: " + message);
}

}  // namespace

proto::PlanAnswer PlannerClient::plan(const proto::PlanCall& call, double timeoutSeconds) {
  auto* stub = channel_->stub.get();
  return ask<proto::PlanCall, proto::PlanAnswer>(
      address_, "Plan", [stub](auto* c, const auto& q, auto* a) { return stub->Plan(c, q, a); },
      call, timeoutSeconds);
}

proto::WhatIfAnswer PlannerClient::whatIf(const proto::WhatIfCall& call, double timeoutSeconds) {
  auto* stub = channel_->stub.get();
  return ask<proto::WhatIfCall, proto::WhatIfAnswer>(
      address_, "WhatIf", [stub](auto* c, const auto& q, auto* a) { return stub->WhatIf(c, q, a); },
      call, timeoutSeconds);
}

proto::NeighboursAnswer PlannerClient::neighbours(const proto::NeighboursCall& call,
                                                  double timeoutSeconds) {
  auto* stub = channel_->stub.get();
  return ask<proto::NeighboursCall, proto::NeighboursAnswer>(
      address_, "Neighbours",
      [stub](auto* c, const auto& q, auto* a) { return stub->Neighbours(c, q, a); }, call,
      timeoutSeconds);
}

proto::StatusAnswer PlannerClient::status(double timeoutSeconds) {
  auto* stub = channel_->stub.get();
  return ask<proto::StatusCall, proto::StatusAnswer>(
      address_, "Status", [stub](auto* c, const auto& q, auto* a) { return stub->Status(c, q, a); },
      proto::StatusCall(), timeoutSeconds);
}

}  // namespace autostage::service
