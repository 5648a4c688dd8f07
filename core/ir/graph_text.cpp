// Text form of the IR (Graph::toString / Graph::parse).
//
//   graph NAME(%x : Float(8, 16) BATCH, %fc.weight : Float(4, 16, requires_grad) PARAM):
//     %y : Float(8, 4) BATCH = aten::linear(%x, %fc.weight, %none) scope="fc"
//     %c : int CONST = prim::Constant[value=i:1]()
//     return (%y)
//
// Attributes are typed: i:INT f:FLOAT(hex float, exact) s:"STR" is:[..] fs:[..] ss:[..]
// t:DTYPE[dims]:HEX. Strings use C escapes. Value ids follow text order (see Graph invariants).

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/ir/graph.h"

namespace autostage::core {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c < 0x20 || c >= 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string hexFloat(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", d);
  return buf;
}

std::string hexBytes(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += digits[c >> 4], out += digits[c & 15];
  return out;
}

template <typename T, typename F>
std::string joinList(const std::vector<T>& items, F format) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + format(items[i]);
  return out + "]";
}

std::string attributeText(const AttributeValue& value) {
  struct Printer {
    std::string operator()(int64_t v) const { return "i:" + std::to_string(v); }
    std::string operator()(double v) const { return "f:" + hexFloat(v); }
    std::string operator()(const std::string& v) const { return "s:" + quote(v); }
    std::string operator()(const std::vector<int64_t>& v) const {
      return "is:" + joinList(v, [](int64_t x) { return std::to_string(x); });
    }
    std::string operator()(const std::vector<double>& v) const {
      return "fs:" + joinList(v, hexFloat);
    }
    std::string operator()(const std::vector<std::string>& v) const {
      return "ss:" + joinList(v, quote);
    }
    std::string operator()(const TensorData& t) const {
      return "t:" + dtypeName(t.dtype) +
             joinList(t.shape, [](int64_t x) { return std::to_string(x); }) + ":" +
             hexBytes(t.bytes);
    }
  };
  return std::visit(Printer{}, value);
}

// Character-level reader for one line of the text form.
class LineReader {
 public:
  LineReader(const std::string& line, int lineNo) : s_(line), lineNo_(lineNo) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError("IR text line " + std::to_string(lineNo_) + ", column " +
                      std::to_string(pos_ + 1) + ": " + why + " in: " + s_);
  }
  void skipSpace() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool atEnd() {
    skipSpace();
    return pos_ >= s_.size();
  }
  bool peek(char c) {
    skipSpace();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool accept(char c) { return peek(c) ? (++pos_, true) : false; }
  bool acceptWord(const std::string& w) {
    skipSpace();
    if (s_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  // Identifier-like token: letters, digits, '_', '.', ':' (qualified operator names).
  std::string token() {
    skipSpace();
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '_' || s_[pos_] == '.' || s_[pos_] == ':' ||
                                s_[pos_] == '-' || s_[pos_] == '+'))
      ++pos_;
    if (start == pos_) fail("expected a name");
    return s_.substr(start, pos_ - start);
  }
  std::string valueName() {
    expect('%');
    return token();
  }
  Type type() {
    skipSpace();
    try {
      return Type::parsePrefix(s_, &pos_);
    } catch (const FormatError& e) {
      fail(e.what());
    }
  }
  std::string quoted() {
    expect('"');
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unfinished escape");
      char e = s_[pos_++];
      if (e == 'n') out += '\n';
      else if (e == 'x') {
        bool twoHexDigits = pos_ + 2 <= s_.size() &&
                            std::isxdigit(static_cast<unsigned char>(s_[pos_])) &&
                            std::isxdigit(static_cast<unsigned char>(s_[pos_ + 1]));
        if (!twoHexDigits) fail("expected two hex digits after \\x");
        out += static_cast<char>(std::stoi(s_.substr(pos_, 2), nullptr, 16));
        pos_ += 2;
      } else {
        out += e;
      }
    }
    expect('"');
    return out;
  }
  int64_t integer() {
    std::string t = token();
    char* end = nullptr;
    long long v = std::strtoll(t.c_str(), &end, 10);
    if (*end) fail("expected an integer, got '" + t + "'");
    return v;
  }
  double real() {
    std::string t = token();
    char* end = nullptr;
    double v = std::strtod(t.c_str(), &end);
    if (*end) fail("expected a number, got '" + t + "'");
    return v;
  }
  template <typename F>
  auto list(F item) -> std::vector<decltype(item())> {
    std::vector<decltype(item())> out;
    expect('[');
    if (accept(']')) return out;
    do out.push_back(item());
    while (accept(','));
    expect(']');
    return out;
  }
  std::string hex() {
    skipSpace();
    std::string out;
    while (pos_ + 1 < s_.size() && std::isxdigit(static_cast<unsigned char>(s_[pos_])) &&
           std::isxdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
      out += static_cast<char>(std::stoi(s_.substr(pos_, 2), nullptr, 16));
      pos_ += 2;
    }
    return out;
  }
  AttributeValue attributeValue() {
    skipSpace();
    size_t colon = s_.find(':', pos_);
    if (colon == std::string::npos) fail("expected an attribute tag such as 'i:'");
    std::string tag = s_.substr(pos_, colon - pos_);
    pos_ = colon + 1;
    if (tag == "i") return integer();
    if (tag == "f") return real();
    if (tag == "s") return quoted();
    if (tag == "is") return list([&] { return integer(); });
    if (tag == "fs") return list([&] { return real(); });
    if (tag == "ss") return list([&] { return quoted(); });
    if (tag == "t") {
      TensorData t;
      try {
        t.dtype = dtypeFromName(token());
      } catch (const FormatError& e) {
        fail(e.what());
      }
      t.shape = list([&] { return integer(); });
      expect(':');
      t.bytes = hex();
      return t;
    }
    fail("unknown attribute tag '" + tag + "'");
  }

 private:
  const std::string& s_;
  int lineNo_;
  size_t pos_ = 0;
};

}  // namespace

std::string Graph::toString() const {
  std::ostringstream out;
  auto decl = [&](ValueId v) {
    const Value& val = values_[v];
    return "%" + val.name + " : " + val.type.toString() + " " + valueClassName(val.cls);
  };
  out << "graph " << name_ << '(';
  for (size_t i = 0; i < inputs_.size(); ++i) out << (i ? ", " : "") << decl(inputs_[i]);
  out << "):\n";
  for (const Node& n : nodes_) {
    out << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) out << (i ? ", " : "") << decl(n.outputs[i]);
    out << (n.outputs.empty() ? "" : " = ") << n.kind;
    if (!n.attributes.empty()) {
      out << '[';
      for (size_t i = 0; i < n.attributes.size(); ++i)
        out << (i ? ", " : "") << n.attributes[i].name << '=' << attributeText(n.attributes[i].value);
      out << ']';
    }
    out << '(';
    for (size_t i = 0; i < n.inputs.size(); ++i) out << (i ? ", %" : "%") << values_[n.inputs[i]].name;
    out << ')';
    if (!n.scope.empty()) out << " scope=" << quote(n.scope);
    if (!n.body.empty()) out << " body=" << quote(n.body);
    out << '\n';
  }
  out << "  return (";
  for (size_t i = 0; i < outputs_.size(); ++i) out << (i ? ", %" : "%") << values_[outputs_[i]].name;
  out << ")\n";
  return out.str();
}

Graph Graph::parse(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  std::unordered_map<std::string, ValueId> byName;
  auto lookup = [&](LineReader& r, const std::string& name) {
    auto it = byName.find(name);
    if (it == byName.end()) r.fail("value %" + name + " is used before it is defined");
    return it->second;
  };
  auto declare = [&](LineReader& r, ValueId id, const std::string& name) {
    if (!byName.emplace(name, id).second) r.fail("value %" + name + " is defined twice");
  };
  auto readDecl = [](LineReader& r, std::string& name, Type& type, ValueClass& cls) {
    name = r.valueName();
    r.expect(':');
    type = r.type();
    try {
      cls = valueClassFromName(r.token());
    } catch (const FormatError& e) {
      r.fail(e.what());
    }
  };

  while (std::getline(in, line) && line.find_first_not_of(' ') == std::string::npos) ++lineNo;
  ++lineNo;
  LineReader header(line, lineNo);
  if (!header.acceptWord("graph")) header.fail("expected 'graph NAME(...)'");
  Graph g(header.token());
  header.expect('(');
  if (!header.accept(')')) {
    do {
      std::string name;
      Type type;
      ValueClass cls;
      readDecl(header, name, type, cls);
      ValueId id = g.addInput(name, type, cls);
      if (g.value(id).name != name) header.fail("value name %" + name + " is not canonical");
      declare(header, id, name);
    } while (header.accept(','));
    header.expect(')');
  }
  header.expect(':');

  bool returned = false;
  while (std::getline(in, line)) {
    LineReader r(line, ++lineNo);
    if (r.atEnd()) continue;
    if (returned) r.fail("text after 'return'");
    if (r.acceptWord("return")) {
      r.expect('(');
      if (!r.accept(')')) {
        do g.addOutput(lookup(r, r.valueName()));
        while (r.accept(','));
        r.expect(')');
      }
      returned = true;
      continue;
    }
    std::vector<std::string> names;
    std::vector<Type> types;
    std::vector<ValueClass> classes;
    if (r.peek('%')) {
      do {
        names.emplace_back(), types.emplace_back(), classes.emplace_back();
        readDecl(r, names.back(), types.back(), classes.back());
      } while (r.accept(','));
      r.expect('=');
    }
    std::string kind = r.token();
    std::vector<Attribute> attributes;
    if (r.accept('[')) {
      do {
        Attribute a;
        a.name = r.token();
        r.expect('=');
        a.value = r.attributeValue();
        attributes.push_back(std::move(a));
      } while (r.accept(','));
      r.expect(']');
    }
    std::vector<ValueId> inputs;
    r.expect('(');
    if (!r.accept(')')) {
      do inputs.push_back(lookup(r, r.valueName()));
      while (r.accept(','));
      r.expect(')');
    }
    std::string scope, body;
    if (r.acceptWord("scope=")) scope = r.quoted();
    if (r.acceptWord("body=")) body = r.quoted();
    if (!r.atEnd()) r.fail("unexpected text after node");
    NodeId id = g.addNode(kind, inputs, types, std::move(attributes), scope, names);
    g.setBody(id, body);
    for (size_t i = 0; i < names.size(); ++i) {
      ValueId v = g.node(id).outputs[i];
      if (g.value(v).name != names[i]) r.fail("value name %" + names[i] + " is not canonical");
      g.setValueClass(v, classes[i]);
      declare(r, v, names[i]);
    }
  }
  if (!returned) throw FormatError("IR text ends without a 'return (...)' line (truncated?)");
  g.verify();
  return g;
}

}  // namespace autostage::core
