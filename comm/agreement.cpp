#include "comm/agreement.h"

#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "core/error.h"

namespace autostage::comm {
namespace {

std::mutex& lastMutex() {
  static std::mutex mutex;
  return mutex;
}

std::string& lastMessage() {
  static std::string message;
  return message;
}

// Encoded as "<class>\n<message>"; "" for success.
std::string encode(const StepStatus& status) {
  return status.ok() ? std::string() : status.errorClass + "\n" + status.message;
}

StepStatus decode(const std::string& text) {
  if (text.empty()) return {};
  size_t cut = text.find('\n');
  if (cut == std::string::npos) return {"Error", text};
  return {text.substr(0, cut), text.substr(cut + 1)};
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  return out.str();
}

// "<step> failed on rank 2: m" / "... on ranks 0,1: m; on rank 3: m2" (messages in rank order
// of their first failing rank).
std::string agreedMessage(const std::string& step, const std::vector<StepStatus>& all) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].ok()) continue;
    auto it = groups.begin();
    while (it != groups.end() && it->first != all[r].message) ++it;
    if (it == groups.end()) it = groups.insert(groups.end(), {all[r].message, {}});
    it->second.push_back(static_cast<int>(r));
  }
  std::ostringstream out;
  out << step << " failed";
  for (size_t g = 0; g < groups.size(); ++g)
    out << (g ? "; on " : " on ") << joinRanks(groups[g].second) << ": " << groups[g].first;
  return out.str();
}

}  // namespace

StepStatus StepStatus::fromCurrentException() {
  try {
    throw;
  } catch (const ConfigError& e) {
    return {"ConfigError", e.what()};
  } catch (const FormatError& e) {
    return {"FormatError", e.what()};
  } catch (const UnsupportedError& e) {
    return {"UnsupportedError", e.what()};
  } catch (const PlanError& e) {
    return {"PlanError", e.what()};
  } catch (const CommError& e) {
    return {"CommError", e.what()};
  } catch (const InternalError& e) {
    return {"InternalError", e.what()};
  } catch (const Error& e) {
    return {"Error", e.what()};
  } catch (const c10::Error& e) {
    return {"Error", e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {"Error", e.what()};
  } catch (...) {
    return {"Error", "unknown exception"};
  }
}

void throwErrorOfClass(const std::string& errorClass, const std::string& message) {
  if (errorClass == "ConfigError") throw ConfigError(message);
  if (errorClass == "FormatError") throw FormatError(message);
  if (errorClass == "UnsupportedError") throw UnsupportedError(message);
  if (errorClass == "PlanError") throw PlanError(message);
  if (errorClass == "CommError") throw CommError(message);
  if (errorClass == "InternalError") throw InternalError(message);
  throw Error(message);
}

void throwAgreed(const std::string& errorClass, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(lastMutex());
    lastMessage() = message;
  }
  throwErrorOfClass(errorClass, message);
}

std::vector<std::string> agreeAndGather(Backend& backend, const std::string& step,
                                        const StepStatus& local, const std::string& payload) {
  // "<status length>\n<status><payload>": the status may itself contain newlines.
  std::string status = encode(local);
  std::vector<std::string> texts{std::to_string(status.size()) + "\n" + status + payload};
  if (backend.worldSize() > 1) texts = backend.allGatherBytes(texts[0], backend.world());
  std::vector<StepStatus> all;
  std::vector<std::string> payloads;
  for (const std::string& text : texts) {
    size_t cut = text.find('\n');
    AUTOSTAGE_INTERNAL_ASSERT(cut != std::string::npos, "malformed status exchange");
    size_t length = std::stoull(text.substr(0, cut));
    all.push_back(decode(text.substr(cut + 1, length)));
    payloads.push_back(text.substr(cut + 1 + length));
  }
  for (const StepStatus& s : all)
    if (!s.ok()) throwAgreed(s.errorClass, agreedMessage(step, all));
  return payloads;
}

void agreeOnStatus(Backend& backend, const std::string& step, const StepStatus& local) {
  agreeAndGather(backend, step, local, "");
}

void runAgreed(Backend& backend, const std::string& step, const std::function<void()>& body) {
  StepStatus status;
  try {
    body();
  } catch (...) {
    status = StepStatus::fromCurrentException();
  }
  agreeOnStatus(backend, step, status);
}

std::string lastAgreedError() {
  std::lock_guard<std::mutex> lock(lastMutex());
  return lastMessage();
}

}  // namespace autostage::comm
