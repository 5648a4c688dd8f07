#include "comm/comm_options.h"

#include <sstream>

#include "core/config.h"
#include "core/error.h"

namespace autostage::comm {

CommOptions CommOptions::fromConfig() {
  CommOptions options;
  options.timeoutSeconds = core::globalConfig().getFloat("comm_timeout_s");
  return options;
}

void CommOptions::validate() const {
  AUTOSTAGE_CHECK_AS(ConfigError, timeoutSeconds > 0, "comm_timeout_s must be > 0 seconds; got ",
                     timeoutSeconds, ". Set AUTOSTAGE_COMM_TIMEOUT_S or comm_timeout_s in config.toml");
}

std::string CommOptions::toString() const {
  std::ostringstream out;
  out << "CommOptions(timeout=" << timeoutSeconds << " s)";
  return out.str();
}

}  // namespace autostage::comm
