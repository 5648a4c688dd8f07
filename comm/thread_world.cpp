#include "comm/thread_world.h"

#include "core/error.h"

namespace autostage::comm {

ThreadWorld::ThreadWorld(int worldSize, CommOptions options)
    : worldSize_(worldSize), options_(options) {
  AUTOSTAGE_CHECK(worldSize > 0, "a thread world needs at least one rank; got ", worldSize);
  options_.validate();
}

void ThreadWorld::post(const MailKey& key, Mail mail) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Box& box = boxes_[key];
    box.waiting.emplace(box.sent++, std::move(mail));
  }
  arrived_.notify_all();
}

int64_t ThreadWorld::reserve(const MailKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return boxes_[key].reserved++;
}

std::optional<Mail> ThreadWorld::extract(Box& box, int64_t ticket) {
  auto it = box.waiting.find(ticket);
  if (it == box.waiting.end()) return std::nullopt;
  Mail mail = std::move(it->second);
  box.waiting.erase(it);
  return mail;
}

std::optional<Mail> ThreadWorld::take(const MailKey& key, int64_t ticket, const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  Box& box = boxes_[key];  // std::map nodes are stable while we wait
  std::optional<Mail> mail;
  arrived_.wait_until(lock, deadline.when(), [&] { return (mail = extract(box, ticket)).has_value(); });
  return mail;
}

std::optional<Mail> ThreadWorld::tryTake(const MailKey& key, int64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  return extract(boxes_[key], ticket);
}

}  // namespace autostage::comm
