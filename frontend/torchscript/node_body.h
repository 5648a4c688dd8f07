#pragma once
// Control-flow nodes (prim::Loop, prim::If) and their bodies as self-contained TorchScript text.
//
// Note [Node body text]: a node with sub-blocks is stored in core::Node::body as a TorchScript
// graph whose inputs are the node's inputs followed by the values its blocks capture from the
// enclosing graph (free variables), containing just that node and returning its outputs. All
// values carry generated debug names, so the text is reproduced exactly by
// torch::jit::parseIR + print; the importer checks this round trip and rejects bodies that do not
// survive it (e.g. tensor constants inside a loop body).

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <vector>

namespace autostage::torchscript {

// Values used inside `node`'s blocks but defined outside the node, in first-use order.
std::vector<torch::jit::Value*> capturedValues(const torch::jit::Node* node);

// The body text of `node` (see Note [Node body text]); `inputs` = node inputs + captured values.
// Throws UnsupportedError naming `where` when the text does not round-trip.
std::string nodeBodyText(torch::jit::Node* node, const std::vector<torch::jit::Value*>& inputs,
                         const std::string& where);

// Parses `body` and clones its node into `target` (at the insertion point) reading `inputs`.
torch::jit::Node* insertNodeFromBody(const std::string& body, torch::jit::Graph& target,
                                     const std::vector<torch::jit::Value*>& inputs);

}  // namespace autostage::torchscript
