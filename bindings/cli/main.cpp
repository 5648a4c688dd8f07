// The `autostage` command-line tool.
#include <iostream>
#include <string>
#include <vector>

#include "bindings/cli/plan_command.h"
#include "core/error.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::cout << "usage: autostage plan ...   (autostage plan --help for the options)\n";
    return args.empty() ? 2 : 0;
  }
  try {
    if (args[0] == "plan")
      return autostage::cli::runPlanCommand({args.begin() + 1, args.end()}, std::cout);
    std::cerr << "autostage: unknown command '" << args[0] << "'; known commands: plan\n";
    return 2;
  } catch (const autostage::Error& e) {
    std::cerr << "autostage: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "autostage: unexpected error: " << e.what() << "\n";
    return 1;
  }
}
