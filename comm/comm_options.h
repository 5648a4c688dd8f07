#pragma once
// Options every backend shares, filled from the config table.

#include <string>

namespace autostage::comm {

struct CommOptions {
  // Seconds a blocking receive, send or collective waits before failing with a CommError that
  // names this rank, the peer or group and the operation (config key `comm_timeout_s`).
  double timeoutSeconds = 60.0;

  // Reads `comm_timeout_s` from core::globalConfig().
  static CommOptions fromConfig();
  // Throws ConfigError unless timeoutSeconds > 0.
  void validate() const;
  std::string toString() const;
};

}  // namespace autostage::comm
