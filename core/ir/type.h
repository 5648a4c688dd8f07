#pragma once
// IR types: tensors (dtype, shape, requires_grad), scalars, lists, tuples, optionals, None, strings.
// Pure value type; knows nothing of torch. Text form: `Float(8, 16, requires_grad)`, `int[]`,
// `(Tensor, int)`, `Tensor?`, `NoneType`, `str`, `Float(6, 32, not_batch_major)`.
//
// Note [Rows of a value]
// A tensor whose dim 0 equals the traced batch is taken for batch-major (its rows are samples,
// so the runtime may split it between micro-batches and replicas) unless the front end knows
// otherwise. TorchScript's trace records concrete sizes only, so on that front end a per-expert
// value of a mixture-of-experts layer whose expert count happens to equal the batch is
// indistinguishable from a batch-major one. torch.export records sizes symbolically: its
// importer marks every activation whose dim 0 is not exactly the batch symbol
// `not_batch_major`, and the planner never cuts where such a value crosses (Note [Non-tensor
// values are not cut] in decomposer/coarsen.h). The mark says nothing about how the value's size
// scales with the batch (a [batch * seq, vocab] flattening is not batch-major and still grows).

#include <cstdint>
#include <string>
#include <vector>

namespace autostage::core {

enum class DType { Undefined, Float32, Float64, Float16, BFloat16, Int64, Int32, Int16, Int8, UInt8, Bool };

// Bytes of one element; 0 for Undefined.
int64_t elementSize(DType dtype);
// Scalar-type name as TorchScript prints it (`Float`, `Long`, ...); "Tensor" for Undefined.
std::string dtypeName(DType dtype);
// Inverse of dtypeName; throws FormatError for an unknown name.
DType dtypeFromName(const std::string& name);
bool isFloatingPoint(DType dtype);

enum class TypeKind { Tensor, Int, Float, Bool, String, Device, None, List, Tuple, Optional, Other };

class Type {
 public:
  Type() = default;  // an unknown tensor
  static Type tensor(DType dtype, std::vector<int64_t> shape, bool requiresGrad = false);
  static Type unknownTensor();
  static Type scalar(TypeKind kind);  // Int, Float, Bool, String, Device, None
  static Type list(Type element);
  static Type tuple(std::vector<Type> elements);
  static Type optional(Type element);
  static Type other(std::string name);  // a type the IR only carries by name

  TypeKind kind() const { return kind_; }
  bool isTensor() const { return kind_ == TypeKind::Tensor; }
  DType dtype() const { return dtype_; }
  bool shapeKnown() const { return shapeKnown_; }
  // Dimensions, batch dimension first; -1 marks an unknown extent. Empty when shape unknown.
  const std::vector<int64_t>& shape() const { return shape_; }
  bool requiresGrad() const { return requiresGrad_; }
  // Whether the front end knows that dim 0 is not the batch (Note [Rows of a value]).
  bool notBatchMajor() const { return notBatchMajor_; }
  // This tensor type marked not_batch_major; requires a tensor of known, non-empty shape.
  Type withNotBatchMajor() const;
  const std::vector<Type>& elements() const { return elements_; }
  const std::string& otherName() const { return otherName_; }

  // Element count and byte size of a tensor with fully known shape and dtype; -1 otherwise.
  int64_t numel() const;
  int64_t bytes() const;
  // Copy with dimension 0 replaced (used to re-derive shapes for another batch size).
  Type withBatchSize(int64_t batch) const;

  std::string toString() const;
  static Type parse(const std::string& text);  // throws FormatError naming the bad text
  // Parses one type starting at *pos and advances *pos past it (for embedding in larger text).
  static Type parsePrefix(const std::string& text, size_t* pos);
  bool operator==(const Type& other) const;
  bool operator!=(const Type& other) const { return !(*this == other); }

 private:
  TypeKind kind_ = TypeKind::Tensor;
  DType dtype_ = DType::Undefined;
  bool shapeKnown_ = false;
  std::vector<int64_t> shape_;
  bool requiresGrad_ = false;
  bool notBatchMajor_ = false;
  std::vector<Type> elements_;
  std::string otherName_;
  friend class TypeParser;
};

}  // namespace autostage::core
