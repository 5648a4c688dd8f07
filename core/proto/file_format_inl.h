#pragma once
// Template part of file_format.h.

#include "core/error.h"

namespace autostage::core {

template <typename Message>
Message parsePayload(const FramedPayload& framed, const std::string& origin) {
  Message message;
  if (!message.ParseFromString(framed.payload))
    throw FormatError(origin + ": the " + framed.kind +
                      " payload does not parse although its hash matched; the file was written "
                      "by an incompatible autostage build (" + framed.writerVersion + ")");
  return message;
}

}  // namespace autostage::core
