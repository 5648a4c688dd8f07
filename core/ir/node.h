#pragma once
// A node of the IR: one operator application. Attributes are kept generically so that any
// operator can be carried through the IR and exported back without the IR knowing its meaning.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/ir/type.h"
#include "core/ir/value.h"

namespace autostage::core {

// Raw tensor constant (row-major, native byte order).
struct TensorData {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  std::string bytes;
  bool operator==(const TensorData& o) const {
    return dtype == o.dtype && shape == o.shape && bytes == o.bytes;
  }
};

using AttributeValue = std::variant<int64_t, double, std::string, std::vector<int64_t>,
                                    std::vector<double>, std::vector<std::string>, TensorData>;

struct Attribute {
  std::string name;
  AttributeValue value;
  bool operator==(const Attribute& o) const { return name == o.name && value == o.value; }
};

struct Node {
  NodeId id = kNoNode;
  std::string kind;  // qualified operator name, e.g. `aten::linear`, `prim::Constant`
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<Attribute> attributes;
  std::string scope;  // module path of the user's model, e.g. `layers.3.attn` (may be empty)
  // Self-contained body of a control-flow node (prim::Loop, prim::If) in the exporter's text
  // format; opaque to the IR. Empty for ordinary nodes.
  std::string body;

  const Attribute* findAttribute(const std::string& name) const;
};

}  // namespace autostage::core
