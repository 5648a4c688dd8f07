// The `autostage` command-line tool.
#include <iostream>
#include <string>
#include <vector>

#include "bindings/cli/plan_command.h"
#include "bindings/cli/report_command.h"
#include "bindings/cli/serve_command.h"
#include "core/config.h"
#include "core/error.h"

namespace {

constexpr const char* kUsage =
    "usage: autostage plan ...            plan stages (autostage plan --help for the options)\n"
    "       autostage whatif ...          predicted time, memory and plan shape over a sweep\n"
    "       autostage serve [--listen ADDR] [--store DIR]   the planning service\n"
    "       autostage status [--server ADDR]              a running planning service's counters\n"
    "       autostage show deployment.pb  stages, ranks, predicted times and memory, routes\n"
    "       autostage report deployment.pb -o report.html [--trace FILE|DIR]  HTML plan report\n"
    "       autostage show-config         effective option values and where they came from\n"
    "       autostage options --markdown  the options table (as in docs/options.md)\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  try {
    if (args[0] == "plan")
      return autostage::cli::runPlanCommand({args.begin() + 1, args.end()}, std::cout);
    if (args[0] == "whatif")
      return autostage::cli::runWhatIfCommand({args.begin() + 1, args.end()}, std::cout);
    if (args[0] == "serve")
      return autostage::cli::runServeCommand({args.begin() + 1, args.end()}, std::cout);
    if (args[0] == "status")
      return autostage::cli::runStatusCommand({args.begin() + 1, args.end()}, std::cout);
    if (args[0] == "show") return autostage::cli::runShowCommand({args.begin() + 1, args.end()}, std::cout);
    if (args[0] == "report")
      return autostage::cli::runReportCommand({args.begin() + 1, args.end()}, std::cout);
    if (args[0] == "show-config") {
      std::cout << autostage::core::globalConfig().toString();
      return 0;
    }
    if (args[0] == "options" && args.size() == 2 && args[1] == "--markdown") {
      std::cout << autostage::core::optionTableMarkdown();
      return 0;
    }
    std::cerr << "autostage: unknown command '" << args[0] << "'\n" << kUsage;
    return 2;
  } catch (const autostage::Error& e) {
    std::cerr << "autostage: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "autostage: unexpected error: " << e.what() << "\n";
    return 1;
  }
}
