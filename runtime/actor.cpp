#include "runtime/actor.hpp"

#include <boost/fiber/operations.hpp>

#include "runtime/node.hpp"
#include "runtime/trace.hpp"

namespace ferry {

actor::actor(node& host, actor_id id) : host_(host), self_{host.id(), id} {
  host_.attach(*this);
}

actor::~actor() {
  stop();
  // The mailbox fiber refers to this actor: let it see the closed mailbox and end.
  if (!finished_) host_.loop().run_until([this] { return finished_; });
  host_.detach(*this);
}

void actor::note(std::string what) {
  const auto now = host_.clock().now().time_since_epoch().count();
  host_.env().trace().record({.node = self_.node,
                              .instant = true,
                              .start_ns = now,
                              .end_ns = now,
                              .label = std::move(what)});
}

void actor::start() {
  if (open_) return;
  open_ = true;
  finished_ = false;
  host_.loop().spawn([this] { serve(); });
}

void actor::stop() {
  open_ = false;
  mailbox_.clear();
  cv_.notify_all();
}

void actor::enqueue(decoded_message m) {
  if (!open_) return;
  if (waiting_ && mailbox_.empty()) {  // no handler runs or is suspended: this message is next
    if (auto it = handlers_.find(m.head.kind); it != handlers_.end() && it->second.at_once) {
      return handle_at_once(it->second, m);
    }
  }
  mailbox_.push_back(std::move(m));
  if (waiting_) cv_.notify_one();
}

void actor::handle_at_once(const registered_handler& h, const decoded_message& m) {
  waiting_ = false;  // what arrives meanwhile queues behind this message
  try {
    h.run(m);
  } catch (...) {
    host_.loop().fail(std::current_exception());  // as if thrown on the mailbox fiber
  }
  waiting_ = true;
  if (!mailbox_.empty()) cv_.notify_one();
}

void actor::serve() {
  try {
    serve_mailbox();
  } catch (...) {
    stop();  // nothing serves the mailbox now; the loop fails with this exception
    finished_ = true;
    throw;
  }
  finished_ = true;
}

void actor::serve_mailbox() {
  for (;;) {
    decoded_message m;
    {
      std::unique_lock lock(confined_);
      while (open_ && mailbox_.empty()) {
        waiting_ = true;
        cv_.wait(lock);
        waiting_ = false;
      }
      if (!open_) break;
      m = std::move(mailbox_.front());
      mailbox_.pop_front();
    }
    auto it = handlers_.find(m.head.kind);
    if (it == handlers_.end()) {
      log::debug("actor {}.{}: no handler for kind {}", self_.node, self_.actor, m.head.kind);
      continue;
    }
    it->second.run(m);
  }
}

void actor::send(address to, const encoded_body& body, std::function<void(std::error_code)> sent) {
  const envelope_header head{.kind = body.kind, .from = self_, .to = to, .epoch = epoch_};
  if (hands_over() && body.object) {
    return hand_over(to,
                     {.message = {head, body.object}, .frame_bytes = frame_size(head, body).bytes},
                     std::move(sent));
  }
  send_frame(to, encode(head, body), std::move(sent));
}

bool actor::hands_over() const {
  return host_.hands_over_messages();
}

void actor::hand_over(address to, handed_message m, std::function<void(std::error_code)> sent) {
  host_.route(to, std::move(m), std::move(sent));
}

void actor::send_frame(address to, frame f, std::function<void(std::error_code)> sent) {
  host_.route(to, std::move(f), std::move(sent));
}

}  // namespace ferry
