#pragma once
// A value of the IR: produced by exactly one node (or a graph input), used by any number of nodes.

#include <cstdint>
#include <string>
#include <vector>

#include "core/ir/type.h"

namespace autostage::core {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr NodeId kNoNode = -1;

// What a value depends on, which decides where it may live in a plan.
//   Batch: depends on a model input whose dim 0 is the sample dimension.
//   Param: depends on parameters/buffers (and constants) only.
//   Const: depends on nothing but constants.
//   Loss:  a scalar floating-point graph output that depends on the batch.
enum class ValueClass { Batch, Param, Const, Loss };
std::string valueClassName(ValueClass cls);  // "BATCH", "PARAM", "CONST", "LOSS"
ValueClass valueClassFromName(const std::string& name);

struct Use {
  NodeId node;
  int index;  // position among that node's inputs
  bool operator==(const Use& o) const { return node == o.node && index == o.index; }
};

struct Value {
  ValueId id = -1;
  std::string name;  // unique within the graph; parameters carry the module key (`fc1.weight`)
  Type type;
  ValueClass cls = ValueClass::Const;
  NodeId producer = kNoNode;  // kNoNode for graph inputs
  int outputIndex = -1;       // position among producer's outputs (or among graph inputs)
  std::vector<Use> uses;
};

}  // namespace autostage::core
