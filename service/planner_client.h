#pragma once
// Asking a planning service (`autostage serve`): jobs (planner_address), `autostage plan
// --server`, `autostage whatif --server`, `autostage status`.

#include <memory>
#include <string>

#include "core/error.h"
#include "core/proto/planner_service.pb.h"
#include "service/plan_call.h"  // NotStored

namespace autostage::service {

// The service did not answer (not running, wrong address, deadline passed): the caller may plan
// locally. Errors the service answered with (a bad call, no plan fits) keep their own class.
class ServiceUnavailable : public Error {
  using Error::Error;
};

class PlannerClient {
 public:
  // address: unix:PATH | tcp:PORT | tcp:HOST:PORT. Connects lazily.
  explicit PlannerClient(const std::string& address);
  ~PlannerClient();
  // Each call waits at most timeoutSeconds; throws ServiceUnavailable or the class of the
  // service's error (PlanError, ConfigError, FormatError, NotStored, ...) with its message.
  proto::PlanAnswer plan(const proto::PlanCall& call, double timeoutSeconds);
  proto::WhatIfAnswer whatIf(const proto::WhatIfCall& call, double timeoutSeconds);
  proto::NeighboursAnswer neighbours(const proto::NeighboursCall& call, double timeoutSeconds);
  proto::StatusAnswer status(double timeoutSeconds);

 private:
  struct Channel;
  std::string address_;
  std::unique_ptr<Channel> channel_;
};

}  // namespace autostage::service
