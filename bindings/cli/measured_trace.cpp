// Chrome-trace reading; see measured_trace.h. The JSON is parsed by nlohmann-json.
#include "bindings/cli/measured_trace.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace autostage::cli {
namespace {

using Json = nlohmann::json;

// Trace files nest 4 deep; a limit keeps a crafted file from costing memory without bound.
constexpr int kMaxDepth = 64;

Json parseDocument(const std::string& text, const std::string& origin) {
  const std::string expected = "; expected a Chrome trace written with trace_events=true";
  auto limitDepth = [&](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start ||
         event == Json::parse_event_t::array_start) && depth >= kMaxDepth)
      throw FormatError(origin + ": invalid trace JSON: nested deeper than " +
                        std::to_string(kMaxDepth) + " levels" + expected);
    return true;
  };
  try {
    return Json::parse(text, limitDepth);
  } catch (const Json::parse_error& e) {
    throw FormatError(origin + ": invalid trace JSON at offset " + std::to_string(e.byte) + ": " +
                      e.what() + expected);
  }
}

// The member `key` of `object` (an object), or nullptr.
const Json* field(const Json* object, const char* key) {
  if (!object || !object->is_object()) return nullptr;
  auto it = object->find(key);
  return it == object->end() ? nullptr : &*it;
}

double numberField(const Json& object, const char* key, double fallback) {
  const Json* v = field(&object, key);
  return v && v->is_number() ? v->get<double>() : fallback;
}

bool isText(const Json* v, const char* text) { return v && v->is_string() && *v == text; }

const char* kindName(const Json* v) {
  if (!v) return "nothing";
  if (v->is_null()) return "null";
  if (v->is_boolean()) return "a boolean";
  if (v->is_number()) return "a fractional number";
  if (v->is_string()) return "a string";
  return v->is_array() ? "an array" : "an object";
}

// A field of a peak_memory event: the runtime writes every one as an integer, so anything else
// is a damaged or foreign file rather than something to guess around.
int64_t integerField(const Json* object, const char* key, const std::string& where) {
  const Json* v = field(object, key);
  const double number = v && v->is_number() ? v->get<double>() : NAN;
  const bool integer = v && (v->is_number_integer() ||
                             (std::isfinite(number) && number == std::floor(number) &&
                              std::fabs(number) < 9.2e18));
  AUTOSTAGE_CHECK_AS(FormatError, integer, where, ": expected an integer \"", key, "\", got ",
                     kindName(v), "; peak_memory events are written by trace_events=true (Note [Trace files])");
  return v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(number);
}

MeasuredMemory memoryRecord(const Json& item, const std::string& where) {
  const Json* args = field(&item, "args");
  MeasuredMemory m;
  m.rank = static_cast<int>(integerField(&item, "pid", where));
  m.step = static_cast<long>(integerField(args, "step", where + " args"));
  m.stage = static_cast<int>(integerField(args, "stage", where + " args"));
  m.measuredPeak = integerField(args, "measured", where + " args");
  m.predicted = integerField(args, "predicted", where + " args");
  m.usable = integerField(args, "usable", where + " args");
  m.parameters = integerField(args, "parameters", where + " args");
  m.gradients = integerField(args, "gradients", where + " args");
  m.optimizer = integerField(args, "optimizer", where + " args");
  m.transient = integerField(args, "transient", where + " args");
  return m;
}

MeasuredEvent completeEvent(const Json& item) {
  MeasuredEvent e;
  e.name = item.at("name").get<std::string>();
  e.rank = static_cast<int>(numberField(item, "pid", 0));
  e.startSeconds = numberField(item, "ts", 0) * 1e-6;
  e.endSeconds = e.startSeconds + numberField(item, "dur", 0) * 1e-6;
  if (const Json* args = field(&item, "args"); args && args->is_object()) {
    e.stage = static_cast<int>(numberField(*args, "stage", -1));
    e.microBatch = static_cast<int>(numberField(*args, "micro_batch", -1));
    e.step = static_cast<long>(numberField(*args, "step", -1));
  }
  return e;
}

std::vector<std::string> traceFiles(const std::string& path) {
  std::vector<std::string> files;
  if (std::filesystem::is_directory(path)) {
    for (const auto& entry : std::filesystem::directory_iterator(path))
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    AUTOSTAGE_CHECK_AS(FormatError, !files.empty(), "trace directory '", path, "' holds no .json file");
    return files;
  }
  std::stringstream list(path);
  for (std::string item; std::getline(list, item, ',');)
    if (!item.empty()) files.push_back(item);
  return files;
}

}  // namespace

double MeasuredTrace::spanSeconds() const {
  double span = 0;
  for (const MeasuredEvent& e : events) span = std::max(span, e.endSeconds);
  return span;
}

TraceRecords parseTraceRecords(const std::string& json, const std::string& origin) {
  const Json doc = parseDocument(json, origin);
  const Json* list = doc.is_array() ? &doc : field(&doc, "traceEvents");
  AUTOSTAGE_CHECK_AS(FormatError, list && list->is_array(), origin,
                     ": no \"traceEvents\" array; expected a Chrome trace written with trace_events=true");
  TraceRecords records;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& item = (*list)[i];
    const Json* name = field(&item, "name");
    if (!name || !name->is_string()) continue;  // not an event the runtime writes
    if (isText(field(&item, "ph"), "X")) {
      records.events.push_back(completeEvent(item));
    } else if (isText(field(&item, "ph"), "i") && *name == "peak_memory") {
      const std::string where = origin + ": traceEvents[" + std::to_string(i) + "] (peak_memory)";
      records.memory.push_back(memoryRecord(item, where));
    }
  }
  return records;
}

std::vector<MeasuredEvent> parseChromeTrace(const std::string& json, const std::string& origin) {
  return parseTraceRecords(json, origin).events;
}

MeasuredTrace selectLastStep(std::vector<MeasuredEvent> events, std::vector<MeasuredMemory> memory) {
  std::map<int, long> lastStepOfRank;
  for (const MeasuredEvent& e : events)
    lastStepOfRank[e.rank] = std::max(lastStepOfRank.count(e.rank) ? lastStepOfRank[e.rank] : -1, e.step);
  AUTOSTAGE_CHECK_AS(FormatError, !lastStepOfRank.empty(), "the trace has no complete (\"ph\": \"X\") events");
  MeasuredTrace trace;
  trace.step = lastStepOfRank.begin()->second;
  for (const auto& [rank, step] : lastStepOfRank) trace.step = std::min(trace.step, step);
  double origin = 0;
  bool first = true;
  std::set<int> ranks;
  for (MeasuredEvent& e : events) {
    if (e.step != trace.step) continue;
    origin = first ? e.startSeconds : std::min(origin, e.startSeconds);
    first = false;
    ranks.insert(e.rank);
    trace.events.push_back(std::move(e));
  }
  for (MeasuredEvent& e : trace.events) e.startSeconds -= origin, e.endSeconds -= origin;
  trace.ranks.assign(ranks.begin(), ranks.end());
  for (MeasuredMemory& m : memory)
    if (m.step == trace.step) trace.memory.push_back(m);
  std::stable_sort(trace.memory.begin(), trace.memory.end(),
                   [](const MeasuredMemory& a, const MeasuredMemory& b) { return a.rank < b.rank; });
  return trace;
}

MeasuredTrace loadMeasuredTrace(const std::string& path) {
  TraceRecords all;
  for (const std::string& file : traceFiles(path)) {
    std::ifstream in(file, std::ios::binary);
    AUTOSTAGE_CHECK_AS(FormatError, in.good(), "cannot read trace file '", file, "'");
    std::stringstream text;
    text << in.rdbuf();
    TraceRecords records = parseTraceRecords(text.str(), "'" + file + "'");
    all.events.insert(all.events.end(), records.events.begin(), records.events.end());
    all.memory.insert(all.memory.end(), records.memory.begin(), records.memory.end());
  }
  return selectLastStep(std::move(all.events), std::move(all.memory));
}

}  // namespace autostage::cli
