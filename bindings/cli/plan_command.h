#pragma once
// `autostage plan`: plans a saved (--graph) or synthetic (--synthetic) model for a cluster and
// prints the partition log (stderr) and, with --json, a JSON summary (stdout).

#include <ostream>
#include <string>
#include <vector>

namespace autostage::cli {

// Runs the command; throws autostage errors on bad input. Returns the process exit code.
int runPlanCommand(const std::vector<std::string>& args, std::ostream& out);
std::string planUsage();
// `autostage whatif`: a sweep of device counts, memory, batch sizes and schedules.
int runWhatIfCommand(const std::vector<std::string>& args, std::ostream& out);
std::string whatIfUsage();

}  // namespace autostage::cli
