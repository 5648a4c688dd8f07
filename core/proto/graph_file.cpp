#include "core/proto/graph_file.h"

#include <utility>
#include <vector>

#include "core/error.h"
#include "core/proto/file_format.h"

namespace autostage::core {
namespace {

// Explicit tables rather than casts: the proto numbering (0 = unspecified) is independent of the
// C++ enum order, so either side can grow without silently shifting the other.
constexpr std::pair<DType, proto::DType> kDTypes[] = {
    {DType::Undefined, proto::DTYPE_UNDEFINED}, {DType::Float32, proto::DTYPE_FLOAT32},
    {DType::Float64, proto::DTYPE_FLOAT64},     {DType::Float16, proto::DTYPE_FLOAT16},
    {DType::BFloat16, proto::DTYPE_BFLOAT16},   {DType::Int64, proto::DTYPE_INT64},
    {DType::Int32, proto::DTYPE_INT32},         {DType::Int16, proto::DTYPE_INT16},
    {DType::Int8, proto::DTYPE_INT8},           {DType::UInt8, proto::DTYPE_UINT8},
    {DType::Bool, proto::DTYPE_BOOL},
};
constexpr std::pair<TypeKind, proto::TypeKind> kKinds[] = {
    {TypeKind::Tensor, proto::TYPE_KIND_TENSOR}, {TypeKind::Int, proto::TYPE_KIND_INT},
    {TypeKind::Float, proto::TYPE_KIND_FLOAT},   {TypeKind::Bool, proto::TYPE_KIND_BOOL},
    {TypeKind::String, proto::TYPE_KIND_STRING}, {TypeKind::Device, proto::TYPE_KIND_DEVICE},
    {TypeKind::None, proto::TYPE_KIND_NONE},     {TypeKind::List, proto::TYPE_KIND_LIST},
    {TypeKind::Tuple, proto::TYPE_KIND_TUPLE},   {TypeKind::Optional, proto::TYPE_KIND_OPTIONAL},
    {TypeKind::Other, proto::TYPE_KIND_OTHER},
};
constexpr std::pair<ValueClass, proto::ValueClass> kClasses[] = {
    {ValueClass::Batch, proto::VALUE_CLASS_BATCH},
    {ValueClass::Param, proto::VALUE_CLASS_PARAM},
    {ValueClass::Const, proto::VALUE_CLASS_CONST},
    {ValueClass::Loss, proto::VALUE_CLASS_LOSS},
};

template <typename Core, typename Proto, size_t N>
Proto toProtoEnum(const std::pair<Core, Proto> (&table)[N], Core value) {
  for (const auto& [core, encoded] : table)
    if (core == value) return encoded;
  AUTOSTAGE_INTERNAL_ASSERT(false, "enum value ", static_cast<int>(value),
                            " has no proto encoding.");
  return table[0].second;
}

// Reports errors in a decoded message with the origin and what to do.
class Decoder {
 public:
  explicit Decoder(const std::string& origin) : origin_(origin) {}

  template <typename... Args>
  [[noreturn]] void fail(Args&&... parts) const {
    throw FormatError(origin_ + ": " + detail::concat(std::forward<Args>(parts)...) +
                      "; the graph message is inconsistent, regenerate the file");
  }

  template <typename Core, typename Proto, size_t N>
  Core fromProtoEnum(const std::pair<Core, Proto> (&table)[N], int value, const char* enumName,
                     const std::string& where) const {
    for (const auto& [core, encoded] : table)
      if (encoded == value) return core;
    fail(where, " has unknown ", enumName, " ", value);
  }

  Type type(const proto::Type& message, const std::string& where) const;
  AttributeValue attribute(const proto::Attribute& message, const std::string& where) const;

 private:
  const std::string& origin_;
};

void typeToProto(const Type& type, proto::Type* out) {
  out->set_kind(toProtoEnum(kKinds, type.kind()));
  if (type.isTensor()) {
    out->set_dtype(toProtoEnum(kDTypes, type.dtype()));
    out->set_shape_known(type.shapeKnown());
    for (int64_t d : type.shape()) out->add_dims(d);
    out->set_requires_grad(type.requiresGrad());
    out->set_not_batch_major(type.notBatchMajor());
  }
  for (const Type& element : type.elements()) typeToProto(element, out->add_elements());
  if (type.kind() == TypeKind::Other) out->set_other_name(type.otherName());
}

Type tensorFromProto(const proto::Type& message, DType dtype) {
  if (message.shape_known()) {
    std::vector<int64_t> dims(message.dims().begin(), message.dims().end());
    const bool rowsKnown = !dims.empty();
    Type t = Type::tensor(dtype, std::move(dims), message.requires_grad());
    return message.not_batch_major() && rowsKnown ? t.withNotBatchMajor() : t;
  }
  // Type has no factory for "dtype known, shape unknown"; its text form expresses exactly that.
  return Type::parse(dtypeName(dtype) + (message.requires_grad() ? "(requires_grad)" : ""));
}

Type Decoder::type(const proto::Type& message, const std::string& where) const {
  TypeKind kind = fromProtoEnum(kKinds, message.kind(), "type kind", where);
  std::vector<Type> elements;
  for (int i = 0; i < message.elements_size(); ++i)
    elements.push_back(type(message.elements(i), where + " element " + std::to_string(i)));
  bool wrapsOne = kind == TypeKind::List || kind == TypeKind::Optional;
  if (wrapsOne && elements.size() != 1)
    fail(where, ": a list or optional type needs exactly 1 element type, found ", elements.size());
  if (kind != TypeKind::Tuple && !wrapsOne && !elements.empty())
    fail(where, ": a type of kind ", static_cast<int>(message.kind()), " has ", elements.size(),
         " element types, expected none");
  switch (kind) {
    case TypeKind::Tensor:
      return tensorFromProto(message, fromProtoEnum(kDTypes, message.dtype(), "dtype", where));
    case TypeKind::List:
      return Type::list(std::move(elements[0]));
    case TypeKind::Optional:
      return Type::optional(std::move(elements[0]));
    case TypeKind::Tuple:
      return Type::tuple(std::move(elements));
    case TypeKind::Other:
      return Type::other(message.other_name());
    default:
      return Type::scalar(kind);
  }
}

void tensorDataToProto(const TensorData& tensor, proto::TensorData* out) {
  out->set_dtype(toProtoEnum(kDTypes, tensor.dtype));
  for (int64_t d : tensor.shape) out->add_shape(d);
  out->set_data(tensor.bytes);
}

void attributeToProto(const Attribute& attribute, proto::Attribute* out) {
  out->set_name(attribute.name);
  struct Writer {
    proto::Attribute* out;
    void operator()(int64_t v) const { out->set_int_value(v); }
    void operator()(double v) const { out->set_double_value(v); }
    void operator()(const std::string& v) const { out->set_string_value(v); }
    void operator()(const std::vector<int64_t>& v) const {
      out->mutable_ints()->mutable_items()->Add(v.begin(), v.end());
    }
    void operator()(const std::vector<double>& v) const {
      out->mutable_doubles()->mutable_items()->Add(v.begin(), v.end());
    }
    void operator()(const std::vector<std::string>& v) const {
      for (const auto& s : v) out->mutable_strings()->add_items(s);
    }
    void operator()(const TensorData& t) const { tensorDataToProto(t, out->mutable_tensor()); }
  };
  std::visit(Writer{out}, attribute.value);
}

AttributeValue Decoder::attribute(const proto::Attribute& message, const std::string& where) const {
  switch (message.value_case()) {
    case proto::Attribute::kIntValue:
      return message.int_value();
    case proto::Attribute::kDoubleValue:
      return message.double_value();
    case proto::Attribute::kStringValue:
      return message.string_value();
    case proto::Attribute::kInts:
      return std::vector<int64_t>(message.ints().items().begin(), message.ints().items().end());
    case proto::Attribute::kDoubles:
      return std::vector<double>(message.doubles().items().begin(),
                                 message.doubles().items().end());
    case proto::Attribute::kStrings:
      return std::vector<std::string>(message.strings().items().begin(),
                                      message.strings().items().end());
    case proto::Attribute::kTensor: {
      TensorData t;
      t.dtype = fromProtoEnum(kDTypes, message.tensor().dtype(), "tensor dtype", where);
      t.shape.assign(message.tensor().shape().begin(), message.tensor().shape().end());
      t.bytes = message.tensor().data();
      return t;
    }
    case proto::Attribute::VALUE_NOT_SET:
      break;
  }
  fail(where, " has no value (or one of a kind this build does not know)");
}

// Rebuilds a Graph from a message, checking every id before handing it to the builder (whose
// own checks are InternalErrors meant for our bugs, not for bad files).
class GraphBuilder {
 public:
  GraphBuilder(const proto::Graph& message, const std::string& origin)
      : message_(message), decoder_(origin), graph_(message.name()) {}

  Graph build() {
    checkValueIds();
    addInputs();
    for (int i = 0; i < message_.nodes_size(); ++i) addNode(i);
    if (next_ != message_.values_size())
      decoder_.fail("values ", next_, "..", message_.values_size() - 1,
                    " are neither graph inputs nor node outputs");
    for (int i = 0; i < message_.outputs_size(); ++i) {
      ValueId v = message_.outputs(i);
      if (v < 0 || v >= next_)
        decoder_.fail("graph output ", i, " refers to value ", v, ", expected an id in 0..",
                      next_ - 1);
      graph_.addOutput(v);
    }
    try {
      graph_.verify();
    } catch (const InternalError& e) {
      decoder_.fail("the decoded graph does not verify: ", e.what());
    }
    return std::move(graph_);
  }

 private:
  std::string valueLabel(ValueId id) const {
    return "value " + std::to_string(id) + " ('" + message_.values(id).name() + "')";
  }

  void checkValueIds() const {
    for (int i = 0; i < message_.values_size(); ++i)
      if (message_.values(i).id() != i)
        decoder_.fail("value entry ", i, " ('", message_.values(i).name(), "') has id ",
                      message_.values(i).id(), ", expected ", i,
                      " (value ids must be 0..n-1 in order: duplicate or missing id)");
  }

  void checkName(ValueId id) const {
    if (graph_.value(id).name != message_.values(id).name())
      decoder_.fail(valueLabel(id), " does not have a valid, unique value name (the builder ",
                    "would rename it '", graph_.value(id).name, "')");
  }

  void addInputs() {
    for (int i = 0; i < message_.inputs_size(); ++i) {
      if (message_.inputs(i) != i || i >= message_.values_size())
        decoder_.fail("graph input ", i, " refers to value ", message_.inputs(i), ", expected ", i,
                      " of ", message_.values_size(), " values (inputs come first)");
      const proto::Value& v = message_.values(i);
      std::string where = valueLabel(i);
      graph_.addInput(v.name(), decoder_.type(v.type(), where),
                      decoder_.fromProtoEnum(kClasses, v.cls(), "value class", where));
      checkName(i);
    }
    next_ = message_.inputs_size();
  }

  void addNode(int index) {
    const proto::Node& n = message_.nodes(index);
    std::string where = "node " + std::to_string(index) + " (" + n.kind() + ")";
    std::vector<ValueId> inputs(n.inputs().begin(), n.inputs().end());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] < 0 || inputs[i] >= next_)
        decoder_.fail(where, " input ", i, " refers to value ", inputs[i],
                      ", expected an id in 0..", next_ - 1, " (produced before this node)");
    std::vector<Type> types;
    std::vector<std::string> names;
    for (int i = 0; i < n.outputs_size(); ++i) {
      ValueId id = next_ + i;
      if (n.outputs(i) != id || id >= message_.values_size())
        decoder_.fail(where, " output ", i, " has value id ", n.outputs(i), ", expected ", id,
                      " of ", message_.values_size(), " values (output ids must be dense)");
      types.push_back(decoder_.type(message_.values(id).type(), valueLabel(id)));
      names.push_back(message_.values(id).name());
    }
    std::vector<Attribute> attributes;
    for (const proto::Attribute& a : n.attributes())
      attributes.push_back(
          {a.name(), decoder_.attribute(a, where + " attribute '" + a.name() + "'")});
    NodeId id = graph_.addNode(n.kind(), inputs, types, std::move(attributes), n.scope(), names);
    graph_.setBody(id, n.body());
    for (int i = 0; i < n.outputs_size(); ++i) {
      ValueId v = next_ + i;
      graph_.setValueClass(v, decoder_.fromProtoEnum(kClasses, message_.values(v).cls(),
                                                     "value class", valueLabel(v)));
      checkName(v);
    }
    next_ += n.outputs_size();
  }

  const proto::Graph& message_;
  Decoder decoder_;
  Graph graph_;
  ValueId next_ = 0;
};

}  // namespace

proto::Graph toProto(const Graph& graph) {
  proto::Graph out;
  out.set_name(graph.name());
  for (const Value& v : graph.values()) {
    proto::Value* value = out.add_values();
    value->set_id(v.id);
    value->set_name(v.name);
    typeToProto(v.type, value->mutable_type());
    value->set_cls(toProtoEnum(kClasses, v.cls));
  }
  for (ValueId v : graph.inputs()) out.add_inputs(v);
  for (const Node& n : graph.nodes()) {
    proto::Node* node = out.add_nodes();
    node->set_kind(n.kind);
    for (ValueId v : n.inputs) node->add_inputs(v);
    for (ValueId v : n.outputs) node->add_outputs(v);
    for (const Attribute& a : n.attributes) attributeToProto(a, node->add_attributes());
    node->set_scope(n.scope);
    node->set_body(n.body);
  }
  for (ValueId v : graph.outputs()) out.add_outputs(v);
  return out;
}

Graph fromProto(const proto::Graph& message, const std::string& origin) {
  return GraphBuilder(message, origin).build();
}

std::string encodeGraph(const Graph& graph) {
  std::string payload;
  AUTOSTAGE_CHECK_AS(FormatError, toProto(graph).SerializeToString(&payload), "graph '",
                     graph.name(),
                     "' cannot be serialized (protobuf messages are limited to 2 GiB;",
                     " move large constants out of the graph)");
  return encodeFramed(kGraphFileKind, kGraphFormatVersion, payload);
}

Graph decodeGraph(const std::string& bytes, const std::string& origin) {
  FramedPayload framed = decodeFramed(bytes, kGraphFileKind, kGraphFormatVersion, origin);
  return fromProto(parsePayload<proto::Graph>(framed, origin), origin);
}

void saveGraph(const Graph& graph, const std::string& path) {
  std::string payload;
  AUTOSTAGE_CHECK_AS(
      FormatError, toProto(graph).SerializeToString(&payload), "graph '", graph.name(),
      "' cannot be serialized to '", path,
      "' (protobuf messages are limited to 2 GiB; move large constants out of the graph)");
  writeFramedFile(path, kGraphFileKind, kGraphFormatVersion, payload);
}

Graph loadGraph(const std::string& path) {
  std::string origin = "'" + path + "'";
  FramedPayload framed = readFramedFile(path, kGraphFileKind, kGraphFormatVersion);
  return fromProto(parsePayload<proto::Graph>(framed, origin), origin);
}

}  // namespace autostage::core
