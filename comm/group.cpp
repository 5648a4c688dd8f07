#include "comm/group.h"

#include <algorithm>

#include "core/error.h"

namespace autostage::comm {

Group::Group(std::vector<int> ranks) : ranks_(std::move(ranks)) {
  AUTOSTAGE_CHECK(!ranks_.empty(), "a comm group needs at least one rank; got an empty rank list");
  std::sort(ranks_.begin(), ranks_.end());
  AUTOSTAGE_CHECK(ranks_.front() >= 0, "comm group ranks must be >= 0; got ", toString());
  auto dup = std::adjacent_find(ranks_.begin(), ranks_.end());
  AUTOSTAGE_CHECK(dup == ranks_.end(), "comm group ranks must be unique; rank ", *dup,
                  " appears twice in ", toString());
}

Group Group::world(int worldSize) {
  AUTOSTAGE_CHECK(worldSize > 0, "world size must be positive; got ", worldSize);
  std::vector<int> ranks(worldSize);
  for (int i = 0; i < worldSize; ++i) ranks[i] = i;
  return Group(std::move(ranks));
}

bool Group::contains(int rank) const { return indexOf(rank) >= 0; }

int Group::indexOf(int rank) const {
  auto it = std::lower_bound(ranks_.begin(), ranks_.end(), rank);
  return it != ranks_.end() && *it == rank ? static_cast<int>(it - ranks_.begin()) : -1;
}

std::string Group::toString() const {
  std::string out = "{";
  for (size_t i = 0; i < ranks_.size(); ++i) out += (i ? "," : "") + std::to_string(ranks_[i]);
  return out + "}";
}

}  // namespace autostage::comm
