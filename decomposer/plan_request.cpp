// PlanRequest: memory limit, validation and the replayable text form.
#include <iomanip>
#include <sstream>
#include <type_traits>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "decomposer/plan.h"
#include "decomposer/plan_option_fields.h"

namespace autostage::decomposer {

double PlanRequest::deviceMemoryBytes() const {
  return options.memLimitGb > 0 ? core::gibToBytes(options.memLimitGb) : deviceMemory;
}

double PlanRequest::memoryLimit() const { return deviceMemoryBytes() * (1.0 - options.memMargin); }

void PlanRequest::validate() const {
  options.validate();
  AUTOSTAGE_CHECK_AS(PlanError, !blocks.empty(), "plan request has no blocks; the graph has no ",
                     "BATCH nodes to place (is any model input marked BATCH?)");
  AUTOSTAGE_CHECK_AS(PlanError, devices >= 1 && devicesPerNode >= 1, "plan request: devices=",
                     devices, " devices_per_node=", devicesPerNode, "; both must be >= 1");
  AUTOSTAGE_CHECK_AS(PlanError, batchSize >= 1, "plan request: batch size ", batchSize,
                     " must be >= 1");
  AUTOSTAGE_CHECK_AS(PlanError, memoryLimit() > 0, "plan request: device memory ", deviceMemory,
                     " bytes (mem_limit_gb=", options.memLimitGb,
                     ") leaves no usable memory; give the device memory or mem_limit_gb");
  AUTOSTAGE_CHECK_AS(PlanError, outputBytesPerSample >= 0, "plan request: output bytes per sample ",
                     outputBytesPerSample, " must be >= 0");
  for (const SharedParam& p : sharedParams)
    for (int b : p.blocks)
      AUTOSTAGE_CHECK_AS(PlanError, b >= 0 && b < static_cast<int>(blocks.size()),
                         "plan request: shared parameter refers to block ", b, " of ",
                         blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::optional<core::LinearCost>& replicated = blocks[i].replicatedWorkingBytes;
    const core::LinearCost& working = blocks[i].workingBytes;
    AUTOSTAGE_CHECK_AS(PlanError,
                       !replicated || (replicated->fixed >= 0 && replicated->perSample >= 0 &&
                                       replicated->fixed <= working.fixed &&
                                       replicated->perSample <= working.perSample),
                       "plan request: block ", i, "'s working bytes outside its patterns (",
                       replicated ? replicated->fixed : 0, " + ",
                       replicated ? replicated->perSample : 0, " per sample) must lie between 0 ",
                       "and its working bytes (", working.fixed, " + ", working.perSample,
                       " per sample)");
  }
  options.tensorParallelCandidates(devicesPerNode);  // a forced degree must divide a node
  int previousLast = 0;
  for (const ShardableSpan& s : shardable) {
    AUTOSTAGE_CHECK_AS(PlanError,
                       0 <= s.firstBlock && s.firstBlock <= s.lastBlock &&
                           s.lastBlock < static_cast<int>(blocks.size()) &&
                           s.lastBlock >= previousLast && s.cost.allreducePairs >= 0,
                       "plan request: shardable span over blocks ", s.firstBlock, "..", s.lastBlock,
                       " (", s.cost.paramBytes, " parameter bytes, ", s.cost.allreducePairs,
                       " pairs) must lie within the ", blocks.size(),
                       " blocks, ascending by its last block, with pairs >= 0");
    const ShardableCost& c = s.cost;
    const auto none = [](const core::LinearCost& x) { return x.fixed == 0 && x.perSample == 0; };
    // A correction takes back what spans within it count (a tied table's second end), no more.
    double within = 0;
    for (size_t k = 0; s.correction() && k < shardable.size(); ++k) {
      const ShardableSpan& o = shardable[k];
      if (!o.correction() && s.firstBlock <= o.firstBlock && o.lastBlock <= s.lastBlock)
        within += o.cost.paramBytes;
    }
    AUTOSTAGE_CHECK_AS(
        PlanError,
        !s.correction() ||
            (c.allreducePairs == 0 && none(c.forwardSeconds) && none(c.backwardSeconds) &&
             none(c.activationBytes) && none(c.allreduceBytes) && !s.measured[0] &&
             !s.measured[1] && !s.measured[2] && -c.paramBytes <= within),
        "plan request: shardable span over blocks ", s.firstBlock, "..", s.lastBlock, " has ",
        c.paramBytes,
        " parameter bytes: a span with negative bytes is a "
        "tied table's correction, with no other cost and taking back no more than "
        "the ",
        within, " bytes the spans within it count");
    for (int t : {2, 4, 8}) {  // the search's lower bounds need no more than the whole
      const auto& m = s.measured[ShardableSpan::slot(t)];
      auto within = [](const core::LinearCost& part, const core::LinearCost& whole) {
        return part.fixed >= 0 && part.perSample >= 0 && part.fixed <= whole.fixed &&
               part.perSample <= whole.perSample;
      };
      AUTOSTAGE_CHECK_AS(PlanError,
                         !m || (within(m->forwardSeconds, s.cost.forwardSeconds) &&
                                within(m->backwardSeconds, s.cost.backwardSeconds)),
                         "plan request: shardable span over blocks ", s.firstBlock, "..",
                         s.lastBlock, ": its measured times at degree ", t, " must lie between 0 "
                         "and its whole times (fixed and per sample)");
    }
    previousLast = s.lastBlock;
  }
}

namespace {

void writeLinear(std::ostream& out, const core::LinearCost& c) { out << ' ' << c.fixed << ' ' << c.perSample; }
void writeLink(std::ostream& out, const core::LinkCost& c) { out << ' ' << c.latencySeconds << ' ' << c.bytesPerSecond; }

template <typename T>
void readField(std::istringstream& in, T& value, int line) {
  if (!(in >> value))
    throw FormatError("plan request text, line " + std::to_string(line) + ": missing or bad field");
}
void readLinear(std::istringstream& in, core::LinearCost& c, int line) {
  readField(in, c.fixed, line);
  readField(in, c.perSample, line);
}
void readLink(std::istringstream& in, core::LinkCost& c, int line) {
  readField(in, c.latencySeconds, line);
  readField(in, c.bytesPerSecond, line);
}

// ShardableSpan::degrees as "2,4,8" ("-": none).
std::string degreesText(unsigned degrees) {
  std::string text;
  for (int t : {2, 4, 8})
    if ((degrees >> t) & 1u) text += (text.empty() ? "" : ",") + std::to_string(t);
  return text.empty() ? "-" : text;
}

unsigned parseDegrees(const std::string& text, int line) {
  if (text == "-") return 0;
  unsigned degrees = 0;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item != "2" && item != "4" && item != "8")
      throw FormatError("plan request text, line " + std::to_string(line) +
                        ": shardable degrees '" + text + "' must list 2, 4 or 8, comma-separated "
                        "(or '-' for none)");
    degrees |= 1u << std::stoi(item);
  }
  return degrees;
}

void parseOptions(std::istringstream& in, PlanOptions& o, int line) {
  std::string item;
  while (in >> item) {
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw FormatError("plan request text, line " + std::to_string(line) + ": option '" + item +
                        "' is not key=value");
    std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "usage") {
      o.usage = parseUsage(v);
      continue;
    }
    try {
      setPlanOption(o, key, v);  // Note [Plan option fields]
    } catch (const ConfigError& e) {
      throw FormatError("plan request text, line " + std::to_string(line) + ": " + e.what());
    }
  }
}

}  // namespace

std::string PlanRequest::toText() const {
  std::ostringstream out;
  out << std::setprecision(17);
  out << "autostage-plan-request 1\n";
  out << "cluster " << devices << ' ' << devicesPerNode << ' ' << deviceMemory << ' ' << batchSize << '\n';
  out << "options " << options.toString() << '\n';
  out << "outputs " << outputBytesPerSample << '\n';
  out << "comm";
  writeLink(out, comm.p2pIntraNode);
  writeLink(out, comm.p2pInterNode);
  writeLink(out, comm.allreduceIntraNode);
  writeLink(out, comm.allreduceInterNode);
  out << ' ' << (comm.measured ? 1 : 0) << '\n';
  for (const auto& [ranks, link] : comm.allreduceGroups) {
    out << "comm_group " << ranks;
    writeLink(out, link);
    out << '\n';
  }
  for (const BlockCost& b : blocks) {
    out << "block " << (b.name.empty() ? "-" : b.name);
    for (const auto* c : {&b.forwardSeconds, &b.backwardSeconds, &b.activationBytes,
                          &b.workingBytes, &b.cutBytesAfter})
      writeLinear(out, *c);
    out << ' ' << b.paramBytes;
    if (b.replicatedWorkingBytes) writeLinear(out, *b.replicatedWorkingBytes);
    out << '\n';
  }
  for (const SharedParam& p : sharedParams) {
    out << "shared " << p.bytes;
    for (int b : p.blocks) out << ' ' << b;
    out << '\n';
  }
  for (const ShardableSpan& sp : shardable) {  // Note [Tensor-parallel cost]
    const ShardableCost& c = sp.cost;
    out << "shardable " << sp.firstBlock << ' ' << sp.lastBlock;
    for (const auto* l : {&c.forwardSeconds, &c.backwardSeconds, &c.activationBytes,
                          &c.allreduceBytes})
      writeLinear(out, *l);
    out << ' ' << c.paramBytes << ' ' << c.allreducePairs << ' ' << degreesText(sp.degrees);
    for (int t : {2, 4, 8})  // ShardableSpan::measured: "at<t>" and the member's times
      if (const auto& m = sp.measured[ShardableSpan::slot(t)]) {
        out << " at" << t;
        writeLinear(out, m->forwardSeconds);
        writeLinear(out, m->backwardSeconds);
      }
    out << '\n';
  }
  return out.str();
}

PlanRequest PlanRequest::parse(const std::string& text) {
  PlanRequest r;
  std::istringstream lines(text);
  std::string lineText;
  int line = 0;
  while (std::getline(lines, lineText)) {
    ++line;
    std::istringstream in(lineText);
    std::string tag;
    if (!(in >> tag)) continue;
    if (tag == "autostage-plan-request") {
      int version = 0;
      readField(in, version, line);
      AUTOSTAGE_CHECK_AS(FormatError, version == 1, "plan request text version ", version,
                         " is not supported (expected 1)");
    } else if (tag == "cluster") {
      readField(in, r.devices, line);
      readField(in, r.devicesPerNode, line);
      readField(in, r.deviceMemory, line);
      readField(in, r.batchSize, line);
    } else if (tag == "outputs") {
      readField(in, r.outputBytesPerSample, line);
    } else if (tag == "options") {
      parseOptions(in, r.options, line);
    } else if (tag == "comm") {
      for (auto* c : {&r.comm.p2pIntraNode, &r.comm.p2pInterNode, &r.comm.allreduceIntraNode,
                      &r.comm.allreduceInterNode})
        readLink(in, *c, line);
      int measured = 0;
      readField(in, measured, line);
      r.comm.measured = measured != 0;
    } else if (tag == "comm_group") {  // CommProfile::allreduceGroups
      int ranks = 0;
      readField(in, ranks, line);
      if (ranks < 2)
        throw FormatError("plan request text, line " + std::to_string(line) +
                          ": an all-reduce group needs 2 or more ranks, got " +
                          std::to_string(ranks));
      readLink(in, r.comm.allreduceGroups[ranks], line);
    } else if (tag == "block") {
      BlockCost b;
      readField(in, b.name, line);
      if (b.name == "-") b.name.clear();
      for (auto* c : {&b.forwardSeconds, &b.backwardSeconds, &b.activationBytes, &b.workingBytes,
                      &b.cutBytesAfter})
        readLinear(in, *c, line);
      readField(in, b.paramBytes, line);
      if (!(in >> std::ws).eof()) {  // BlockCost::replicatedWorkingBytes, when set
        core::LinearCost replicated;
        readLinear(in, replicated, line);
        b.replicatedWorkingBytes = replicated;
      }
      r.blocks.push_back(b);
    } else if (tag == "shared") {
      SharedParam p;
      readField(in, p.bytes, line);
      int b = 0;
      while (in >> b) p.blocks.push_back(b);
      r.sharedParams.push_back(p);
    } else if (tag == "shardable") {
      ShardableSpan sp;
      readField(in, sp.firstBlock, line);
      readField(in, sp.lastBlock, line);
      ShardableCost& c = sp.cost;
      for (auto* l : {&c.forwardSeconds, &c.backwardSeconds, &c.activationBytes, &c.allreduceBytes})
        readLinear(in, *l, line);
      readField(in, c.paramBytes, line);
      readField(in, c.allreducePairs, line);
      std::string degrees;
      if (in >> degrees) sp.degrees = parseDegrees(degrees, line);  // absent: every degree
      std::string at;
      while (in >> at) {
        const int t = at == "at2" ? 2 : at == "at4" ? 4 : at == "at8" ? 8 : 0;
        if (t == 0)
          throw FormatError("plan request text, line " + std::to_string(line) + ": '" + at +
                            "' is not a degree's measured times (at2, at4 or at8)");
        ShardableSpan::MemberTimes m;
        readLinear(in, m.forwardSeconds, line);
        readLinear(in, m.backwardSeconds, line);
        sp.measured[ShardableSpan::slot(t)] = m;
      }
      r.shardable.push_back(sp);
    } else {
      throw FormatError("plan request text, line " + std::to_string(line) + ": unknown record '" + tag + "'");
    }
  }
  return r;
}

}  // namespace autostage::decomposer
