// Checks of a module call's inputs and of how ranks call; see call_inputs.h.
#include "staging/call_inputs.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "comm/agreement.h"
#include "core/error.h"

namespace autostage::staging {

std::vector<at::Tensor> tensorsOf(const std::vector<c10::IValue>& inputs) {
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < inputs.size(); ++i) {
    AUTOSTAGE_CHECK_AS(UnsupportedError, inputs[i].isTensor(), "input ", i, " is a ",
                       inputs[i].tagKind(), "; autostage::Module takes tensors with the batch in "
                       "dim 0 as forward arguments");
    tensors.push_back(inputs[i].toTensor());
  }
  return tensors;
}

void checkDevices(const std::vector<at::Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::Device device = inputs[i].device();
    AUTOSTAGE_CHECK(device.is_cpu() || device.is_cuda(), "input ", i, " is on ", device,
                    "; pass inputs on the cpu or a CUDA device (autostage moves them to the "
                    "device of this rank's stages, and the rows to the ranks that need them)");
  }
}

// Every input must be a tensor with the batch in dim 0, all with the same number of rows.
void checkBatchDims(const std::vector<at::Tensor>& inputs) {
  AUTOSTAGE_CHECK_AS(UnsupportedError, !inputs.empty(),
                     "the model was called without inputs; autostage splits the inputs along dim "
                     "0 (the batch), so forward needs at least one tensor argument");
  for (size_t i = 0; i < inputs.size(); ++i) {
    AUTOSTAGE_CHECK(inputs[i].dim() >= 1, "input ", i, " is a 0-dim tensor; every input is split "
                    "along dim 0 (the batch): give it a batch dimension, or make a value shared "
                    "by all samples a buffer or constant of the model");
    AUTOSTAGE_CHECK(inputs[i].size(0) == inputs[0].size(0), "input ", i, " has ",
                    inputs[i].size(0), " rows in dim 0 but input 0 has ", inputs[0].size(0),
                    "; dim 0 of every input must be the batch (same size for all inputs): move "
                    "the batch to dim 0, or make a value shared by all samples part of the model");
  }
  AUTOSTAGE_CHECK(inputs[0].size(0) >= 1, "the inputs have an empty batch (0 rows in dim 0); "
                  "every rank must pass at least one sample");
}

// "(Float[8, 16], Long[8])"; with `batchAsB`, dim 0 is written as B.
std::string signatureOf(const std::vector<at::Tensor>& inputs, bool batchAsB) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    out << (i ? ", " : "") << c10::toString(inputs[i].scalar_type()) << "[";
    for (int64_t d = 0; d < inputs[i].dim(); ++d) {
      out << (d ? ", " : "");
      if (d == 0 && batchAsB) out << "B"; else out << inputs[i].size(d);
    }
    out << "]";
  }
  out << ")";
  return out.str();
}

// What prepareStep exchanges: "<rows>\n<signature with B>\n<full signature>".
std::string inputSummary(const std::vector<at::Tensor>& inputs) {
  if (inputs.empty()) return "";
  return std::to_string(inputs[0].size(0)) + "\n" + signatureOf(inputs, true) + "\n" +
         signatureOf(inputs, false);
}

// Every rank must pass the same shapes and dtypes; the message lists each rank's.
void checkSameAcrossRanks(const std::vector<std::string>& summaries) {
  bool same = std::all_of(summaries.begin(), summaries.end(),
                          [&](const std::string& s) { return s == summaries[0]; });
  if (same) return;
  std::vector<std::vector<std::string>> parts;  // per rank: rows, signature with B, full
  for (const std::string& s : summaries) {
    std::vector<std::string> fields;
    std::istringstream in(s);
    for (std::string field; std::getline(in, field);) fields.push_back(field);
    fields.resize(3);
    parts.push_back(fields);
  }
  bool onlyRows = std::all_of(parts.begin(), parts.end(),
                              [&](const auto& p) { return p[1] == parts[0][1]; });
  std::ostringstream list;
  for (size_t r = 0; r < parts.size(); ++r)
    list << (r ? ", " : "") << "rank " << r << ": " << parts[r][onlyRows ? 0 : 2];
  if (onlyRows) {
    comm::throwAgreed("Error", "ranks passed different local batch sizes (" + list.str() +
                                   "); every rank must pass the same number of samples");
  }
  comm::throwAgreed("Error", "ranks passed inputs of different shapes or dtypes (" + list.str() +
                                 "); every rank must pass tensors of the same dtypes and shapes, "
                                 "including the local batch size in dim 0");
}

// Note [Calls in different modes]
// Every rank must call the module the same way: the same method, in the same train/eval mode
// and the same grad mode. A rank that called model.eval() alone would otherwise switch
// deployments (a collective hand-over) while the others run the step's collectives, and each
// side would fail with a confusing message from mismatched data. The call agreement gathers each
// rank's `how` ("forward, eval mode, no_grad") and every rank raises this error from the same
// gathered list, ranks with the same answer grouped: "ranks 0,2,3: ...; rank 1: ...". The
// other collective calls of a module open with the same exchange (agreeOnHow): state_dict()
// and the optimizer's gathered state_dict; a rank in one of them while the others step gets
// this error, not a parse of the others' data.
void checkCalledAlike(const std::vector<std::string>& hows) {
  if (std::all_of(hows.begin(), hows.end(), [&](const std::string& h) { return h == hows[0]; }))
    return;
  std::vector<std::pair<std::string, std::vector<size_t>>> groups;  // in order of first rank
  for (size_t r = 0; r < hows.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == hows[r]; });
    if (it == groups.end()) it = groups.insert(groups.end(), {hows[r], {}});
    it->second.push_back(r);
  }
  std::ostringstream list;
  for (size_t g = 0; g < groups.size(); ++g) {
    list << (g ? "; " : "") << (groups[g].second.size() > 1 ? "ranks " : "rank ");
    for (size_t i = 0; i < groups[g].second.size(); ++i) list << (i ? "," : "") << groups[g].second[i];
    list << ": " << groups[g].first;
  }
  comm::throwAgreed("Error", "ranks called the module differently (" + list.str() +
                                 "); call model.train() or model.eval(), and torch.no_grad(), "
                                 "alike on every rank, and the same method");
}

std::vector<std::string> agreeOnHow(comm::Backend& backend, const std::string& step,
                                    const comm::StepStatus& problem, const std::string& how,
                                    const std::string& payload) {
  AUTOSTAGE_INTERNAL_ASSERT(how.find('\n') == std::string::npos, "a call's description '", how,
                            "' spans lines");
  std::vector<std::string> gathered = comm::agreeAndGather(backend, step, problem, how + "\n" + payload);
  std::vector<std::string> hows;
  for (std::string& text : gathered) {
    const size_t end = text.find('\n');
    hows.push_back(text.substr(0, end));
    text.erase(0, end == std::string::npos ? text.size() : end + 1);
  }
  checkCalledAlike(hows);
  return gathered;
}

}  // namespace autostage::staging
