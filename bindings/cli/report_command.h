#pragma once
// `autostage show deployment.pb` (text summary on `out`) and
// `autostage report deployment.pb -o report.html [--trace FILE|DIR] [--title TEXT]`.

#include <ostream>
#include <string>
#include <vector>

namespace autostage::cli {

// Both throw autostage errors (FormatError for a damaged or wrong-kind file); return exit codes.
int runShowCommand(const std::vector<std::string>& args, std::ostream& out);
int runReportCommand(const std::vector<std::string>& args, std::ostream& out);
std::string showUsage();
std::string reportUsage();

}  // namespace autostage::cli
