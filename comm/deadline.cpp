#include "comm/deadline.h"

#include <sstream>

namespace autostage::comm {

std::string timeoutMessage(int rank, double seconds, const std::string& what) {
  std::ostringstream out;
  out << "rank " << rank << " waited " << seconds << " s for " << what
      << ": the peer may have died or never reached the matching call (check its log for an "
         "earlier error); if it is only slow, raise comm_timeout_s (env AUTOSTAGE_COMM_TIMEOUT_S)";
  return out.str();
}

}  // namespace autostage::comm
