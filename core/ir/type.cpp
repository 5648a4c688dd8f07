#include "core/ir/type.h"

#include <cctype>
#include <sstream>

#include "core/error.h"

namespace autostage::core {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int64_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::Float32, "Float", 4}, {DType::Float64, "Double", 8}, {DType::Float16, "Half", 2},
    {DType::BFloat16, "BFloat16", 2}, {DType::Int64, "Long", 8}, {DType::Int32, "Int", 4},
    {DType::Int16, "Short", 2}, {DType::Int8, "Char", 1}, {DType::UInt8, "Byte", 1},
    {DType::Bool, "Bool", 1}, {DType::Undefined, "Tensor", 0},
};

struct ScalarName {
  TypeKind kind;
  const char* name;
};
constexpr ScalarName kScalars[] = {{TypeKind::Int, "int"},       {TypeKind::Float, "float"},
                                   {TypeKind::Bool, "bool"},     {TypeKind::String, "str"},
                                   {TypeKind::Device, "Device"}, {TypeKind::None, "NoneType"}};

}  // namespace

int64_t elementSize(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 0;
}

std::string dtypeName(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "Tensor";
}

DType dtypeFromName(const std::string& name) {
  for (const auto& info : kDTypes)
    if (name == info.name) return info.dtype;
  throw FormatError("unknown tensor dtype name '" + name +
                    "'; expected one of Float, Double, Half, BFloat16, Long, Int, Short, Char, "
                    "Byte, Bool, Tensor");
}

bool isFloatingPoint(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Float16 ||
         dtype == DType::BFloat16;
}

Type Type::tensor(DType dtype, std::vector<int64_t> shape, bool requiresGrad) {
  Type t;
  t.dtype_ = dtype;
  t.shapeKnown_ = true;
  t.shape_ = std::move(shape);
  t.requiresGrad_ = requiresGrad;
  return t;
}

Type Type::unknownTensor() { return Type(); }

Type Type::scalar(TypeKind kind) {
  AUTOSTAGE_INTERNAL_ASSERT(kind != TypeKind::Tensor && kind != TypeKind::List &&
                            kind != TypeKind::Tuple && kind != TypeKind::Optional &&
                            kind != TypeKind::Other);
  Type t;
  t.kind_ = kind;
  return t;
}

Type Type::list(Type element) {
  Type t;
  t.kind_ = TypeKind::List;
  t.elements_ = {std::move(element)};
  return t;
}

Type Type::tuple(std::vector<Type> elements) {
  Type t;
  t.kind_ = TypeKind::Tuple;
  t.elements_ = std::move(elements);
  return t;
}

Type Type::optional(Type element) {
  Type t;
  t.kind_ = TypeKind::Optional;
  t.elements_ = {std::move(element)};
  return t;
}

Type Type::other(std::string name) {
  Type t;
  t.kind_ = TypeKind::Other;
  t.otherName_ = std::move(name);
  return t;
}

int64_t Type::numel() const {
  if (!isTensor() || !shapeKnown_) return -1;
  int64_t n = 1;
  for (int64_t d : shape_) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

int64_t Type::bytes() const {
  int64_t n = numel();
  if (n < 0 || dtype_ == DType::Undefined) return -1;
  return n * elementSize(dtype_);
}

Type Type::withBatchSize(int64_t batch) const {
  Type t = *this;
  if (isTensor() && shapeKnown_ && !shape_.empty()) t.shape_[0] = batch;
  return t;
}

Type Type::withNotBatchMajor() const {
  AUTOSTAGE_INTERNAL_ASSERT(isTensor() && shapeKnown_ && !shape_.empty());
  Type t = *this;
  t.notBatchMajor_ = true;
  return t;
}

std::string Type::toString() const {
  std::ostringstream out;
  switch (kind_) {
    case TypeKind::Tensor: {
      out << dtypeName(dtype_);
      if (shapeKnown_ || requiresGrad_) {
        out << '(';
        bool first = true;
        if (shapeKnown_) {
          for (int64_t d : shape_) {
            out << (first ? "" : ", ") << (d < 0 ? std::string("*") : std::to_string(d));
            first = false;
          }
          if (shape_.empty()) out << "scalar", first = false;
        }
        if (requiresGrad_) out << (first ? "" : ", ") << "requires_grad";
        if (notBatchMajor_) out << ", not_batch_major";  // only with a non-empty shape
        out << ')';
      }
      break;
    }
    case TypeKind::List:
      out << elements_[0].toString() << "[]";
      break;
    case TypeKind::Optional:
      out << elements_[0].toString() << '?';
      break;
    case TypeKind::Tuple: {
      out << '(';
      for (size_t i = 0; i < elements_.size(); ++i) out << (i ? ", " : "") << elements_[i].toString();
      out << ')';
      break;
    }
    case TypeKind::Other:
      out << "Other<" << otherName_ << '>';
      break;
    default:
      for (const auto& s : kScalars)
        if (s.kind == kind_) out << s.name;
  }
  return out.str();
}

bool Type::operator==(const Type& o) const {
  return kind_ == o.kind_ && dtype_ == o.dtype_ && shapeKnown_ == o.shapeKnown_ &&
         shape_ == o.shape_ && requiresGrad_ == o.requiresGrad_ && notBatchMajor_ == o.notBatchMajor_ &&
         elements_ == o.elements_ &&
         otherName_ == o.otherName_;
}

// Recursive-descent parser for Type::toString output.
class TypeParser {
 public:
  explicit TypeParser(const std::string& text, size_t pos = 0) : text_(text), pos_(pos) {}

  Type parseAll() {
    Type t = parseType();
    skipSpace();
    if (pos_ != text_.size()) fail("unexpected trailing text");
    return t;
  }
  Type parsePrefix(size_t* end) {
    Type t = parseType();
    *end = pos_;
    return t;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw FormatError("cannot parse type '" + text_ + "' at column " + std::to_string(pos_) +
                      ": " + why);
  }
  void skipSpace() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  // A dimension is all digits and fits int64 (std::stoll would throw std::out_of_range or stop
  // at the first letter).
  int64_t dimension(const std::string& item) {
    bool digits = item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) fail("dimension '" + item + "' is not a non-negative integer");
    if (item.size() > 18) fail("dimension '" + item + "' is too large");
    return std::stoll(item);
  }
  bool accept(char c) {
    skipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) return ++pos_, true;
    return false;
  }
  std::string word() {
    skipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      ++pos_;
    return text_.substr(start, pos_ - start);
  }

  Type parseType() {
    Type t = parsePrimary();
    for (;;) {
      if (accept('?')) {
        t = Type::optional(std::move(t));
      } else if (accept('[')) {
        if (!accept(']')) fail("expected ']'");
        t = Type::list(std::move(t));
      } else {
        return t;
      }
    }
  }

  Type parsePrimary() {
    if (accept('(')) {
      std::vector<Type> elements;
      if (!accept(')')) {
        do elements.push_back(parseType());
        while (accept(','));
        if (!accept(')')) fail("expected ')' closing a tuple");
      }
      return Type::tuple(std::move(elements));
    }
    std::string name = word();
    if (name.empty()) fail("expected a type name");
    if (name == "Other") {
      if (!accept('<')) fail("expected '<'");
      size_t end = text_.find('>', pos_);
      if (end == std::string::npos) fail("expected '>'");
      Type t = Type::other(text_.substr(pos_, end - pos_));
      pos_ = end + 1;
      return t;
    }
    for (const auto& s : kScalars)
      if (name == s.name) return Type::scalar(s.kind);
    Type t;
    t.dtype_ = dtypeFromName(name);
    if (accept('(')) parseTensorDetails(t);
    return t;
  }

  void parseTensorDetails(Type& t) {
    if (accept(')')) return;
    do {
      std::string item = word();
      if (item.empty() && accept('*')) {
        t.shapeKnown_ = true, t.shape_.push_back(-1);
      } else if (item == "requires_grad") {
        t.requiresGrad_ = true;
      } else if (item == "not_batch_major") {
        if (t.shape_.empty()) fail("not_batch_major needs the dimensions before it");
        t.notBatchMajor_ = true;
      } else if (item == "scalar") {
        t.shapeKnown_ = true;
      } else if (!item.empty() && std::isdigit(static_cast<unsigned char>(item[0]))) {
        t.shapeKnown_ = true, t.shape_.push_back(dimension(item));
      } else {
        fail("expected a dimension, '*', 'scalar', 'requires_grad' or 'not_batch_major'");
      }
    } while (accept(','));
    if (!accept(')')) fail("expected ')' closing tensor details");
  }

  const std::string& text_;
  size_t pos_ = 0;
};

Type Type::parse(const std::string& text) { return TypeParser(text).parseAll(); }

Type Type::parsePrefix(const std::string& text, size_t* pos) {
  return TypeParser(text, *pos).parsePrefix(pos);
}

}  // namespace autostage::core
