// `autostage show` and `autostage report`; see report_command.h.
#include "bindings/cli/report_command.h"

#include "bindings/cli/cli_args.h"
#include "bindings/cli/deployment_view.h"
#include "bindings/cli/report_html.h"
#include "core/error.h"
#include "core/proto/deployment_file.h"
#include "core/proto/file_format.h"

namespace autostage::cli {
namespace {

// Splits off the one positional argument (the deployment file); the rest are options.
std::string takeFile(std::vector<std::string>& args, const std::string& usage) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("-", 0) == 0) {
      if (args[i] == "-o" || (args[i].find('=') == std::string::npos && args[i] != "--help")) ++i;
      continue;
    }
    std::string file = args[i];
    args.erase(args.begin() + static_cast<long>(i));
    return file;
  }
  throw ConfigError("missing the deployment file\n" + usage);
}

}  // namespace

std::string showUsage() { return "usage: autostage show deployment.pb\n"; }

std::string reportUsage() {
  return "usage: autostage report deployment.pb -o report.html [--trace FILE|DIR] [--title TEXT]\n"
         "  --trace: Chrome-trace JSON written with trace_events=true (a file, a comma-separated\n"
         "           list of files, or the trace_events_dir with one file per rank)\n";
}

int runShowCommand(const std::vector<std::string>& given, std::ostream& out) {
  std::vector<std::string> args = given;
  if (args.size() == 1 && args[0] == "--help") return out << showUsage(), 0;
  const std::string file = takeFile(args, showUsage());
  Arguments a(args, {}, {});
  printDeployment(out, core::loadDeployment(file));
  return 0;
}

int runReportCommand(const std::vector<std::string>& given, std::ostream& out) {
  std::vector<std::string> args;
  for (const std::string& a : given) args.push_back(a == "-o" ? "--out" : a);
  if (args.size() == 1 && args[0] == "--help") return out << reportUsage(), 0;
  const std::string file = takeFile(args, reportUsage());
  Arguments a(args, {"out", "trace", "title"}, {});
  AUTOSTAGE_CHECK_AS(ConfigError, a.has("out"), "missing -o report.html\n", reportUsage());
  ReportInput input;
  input.deployment = core::loadDeployment(file);
  input.source = "deployment file: " + file;
  input.title = a.get("title", input.title);
  if (a.has("trace")) {
    input.trace = loadMeasuredTrace(a.get("trace"));
    input.source += "; trace: " + a.get("trace");
  }
  core::writeFileAtomically(a.get("out"), renderReportHtml(input), "report");
  out << a.get("out") << "\n";
  return 0;
}

}  // namespace autostage::cli
