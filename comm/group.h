#pragma once
// A set of world ranks that takes part in a collective together.
//
// A Group is a plain value: its ranks, sorted ascending and unique. Backends create the
// communicator behind a group lazily, on the first collective that uses it, and cache it by rank
// list. That first use is collective over the group's members only: a rank not in the group is
// never required to participate. Members of overlapping groups must first-use them in the same
// order (as with MPI_Comm_create_group); otherwise the creation times out with a CommError.

#include <string>
#include <vector>

namespace autostage::comm {

class Group {
 public:
  // Throws Error when `ranks` is empty, has a negative rank or a duplicate.
  explicit Group(std::vector<int> ranks);
  // Ranks 0 .. worldSize-1.
  static Group world(int worldSize);

  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  bool contains(int rank) const;
  // Position of `rank` in ranks() (its rank inside the group); -1 when not a member.
  int indexOf(int rank) const;
  // The lowest member; roots internal gathers and group creation.
  int leader() const { return ranks_.front(); }
  // `{0,1,3}`: used in error messages and as the cache key of backend communicators.
  std::string toString() const;

  bool operator==(const Group& other) const { return ranks_ == other.ranks_; }
  bool operator!=(const Group& other) const { return !(*this == other); }
  bool operator<(const Group& other) const { return ranks_ < other.ranks_; }

 private:
  std::vector<int> ranks_;
};

}  // namespace autostage::comm
