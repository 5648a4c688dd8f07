#pragma once
// `autostage serve` (the planning service, Note [Planning service]) and `autostage status`.

#include <ostream>
#include <string>
#include <vector>

namespace autostage::cli {

// Serves until SIGTERM or SIGINT; calls in progress finish first. Returns the exit code.
int runServeCommand(const std::vector<std::string>& args, std::ostream& out);
// Prints a running service's Status.
int runStatusCommand(const std::vector<std::string>& args, std::ostream& out);
std::string serveUsage();

}  // namespace autostage::cli
