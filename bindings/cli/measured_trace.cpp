// Chrome-trace reading; see measured_trace.h. A small JSON reader (objects, arrays, strings,
// numbers, literals) is enough for the files the runtime writes and for hand-edited ones.
#include "bindings/cli/measured_trace.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "core/error.h"

namespace autostage::cli {
namespace {

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;
  const Json* get(const std::string& key) const {
    auto it = fields.find(key);
    return it == fields.end() ? nullptr : &it->second;
  }
};

class Reader {
 public:
  Reader(const std::string& text, const std::string& origin) : s_(text), origin_(origin) {}
  Json document() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(origin_ + ": invalid trace JSON at offset " + std::to_string(i_) + ": " +
                      what + "; expected a Chrome trace written with trace_events=true");
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  Json value() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    // Trace files nest 4 deep; a limit keeps a crafted file from exhausting the stack.
    if (depth_ >= kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    struct Nesting {
      int& depth;
      ~Nesting() { --depth; }
    } nesting{++depth_};
    const char c = s_[i_];
    Json v;
    if (c == '{') {
      v.kind = Json::Object;
      ++i_;
      if (eat('}')) return v;
      do {
        skip();
        std::string key = string();
        expect(':');
        v.fields[key] = value();
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::Array;
      ++i_;
      if (eat(']')) return v;
      do v.items.push_back(value());
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::String;
      v.text = string();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::Bool;
      v.number = s_[i_] == 't';
      i_ += s_[i_] == 't' ? 4 : 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      v.kind = Json::Number;
      const char* begin = s_.c_str() + i_;
      char* end = nullptr;
      v.number = std::strtod(begin, &end);
      if (end == begin) fail("expected a value");
      i_ += static_cast<size_t>(end - begin);
    }
    return v;
  }
  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    std::string out;
    for (++i_; i_ < s_.size() && s_[i_] != '"'; ++i_) {
      if (s_[i_] != '\\') {
        out += s_[i_];
        continue;
      }
      if (++i_ >= s_.size()) break;
      const char e = s_[i_];
      if (e == 'u') {
        if (i_ + 4 >= s_.size()) fail("short \\u escape");
        out += '?';  // names we read are ASCII; other characters only label events
        i_ += 4;
      } else {
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

  const std::string& s_;
  std::string origin_;
  size_t i_ = 0;
  int depth_ = 0;
  static constexpr int kMaxDepth = 64;
};

double numberField(const Json& object, const std::string& key, double fallback) {
  const Json* v = object.get(key);
  return v && v->kind == Json::Number ? v->number : fallback;
}

const char* kindName(const Json* v) {
  static const char* const names[] = {"null",     "a boolean", "a fractional number",
                                      "a string", "an array",  "an object"};  // by Json::Kind
  return v ? names[v->kind] : "nothing";
}

// A field of a peak_memory event: the runtime writes every one as an integer, so anything else
// is a damaged or foreign file rather than something to guess around.
int64_t integerField(const Json* object, const char* key, const std::string& where) {
  const Json* v = object ? object->get(key) : nullptr;
  const bool integer = v && v->kind == Json::Number && std::isfinite(v->number) &&
                       v->number == std::floor(v->number) && std::fabs(v->number) < 9.2e18;
  AUTOSTAGE_CHECK_AS(FormatError, integer, where, ": expected an integer \"", key, "\", got ",
                     kindName(v), "; peak_memory events are written by trace_events=true (Note [Trace files])");
  return static_cast<int64_t>(v->number);
}

MeasuredMemory memoryRecord(const Json& item, const std::string& where) {
  const Json* args = item.get("args");
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
  e.name = item.get("name")->text;
  e.rank = static_cast<int>(numberField(item, "pid", 0));
  e.startSeconds = numberField(item, "ts", 0) * 1e-6;
  e.endSeconds = e.startSeconds + numberField(item, "dur", 0) * 1e-6;
  if (const Json* args = item.get("args")) {
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
  const Json doc = Reader(json, origin).document();
  const Json* list = doc.kind == Json::Array ? &doc : doc.get("traceEvents");
  AUTOSTAGE_CHECK_AS(FormatError, list && list->kind == Json::Array, origin,
                     ": no \"traceEvents\" array; expected a Chrome trace written with trace_events=true");
  TraceRecords records;
  for (size_t i = 0; i < list->items.size(); ++i) {
    const Json& item = list->items[i];
    const Json* phase = item.get("ph");
    const Json* name = item.get("name");
    if (item.kind != Json::Object || !phase || !name) continue;
    if (phase->text == "X") {
      records.events.push_back(completeEvent(item));
    } else if (phase->text == "i" && name->text == "peak_memory") {
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
