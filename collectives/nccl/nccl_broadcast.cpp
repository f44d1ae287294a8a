#include "collectives/nccl/nccl_broadcast.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "platform/cuda/cuda_error.hpp"
#include "runtime/log.hpp"
#include "runtime/node.hpp"

namespace ferry {
namespace {

class nccl_error_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "nccl"; }
  std::string message(int value) const override {
    return ncclGetErrorString(static_cast<ncclResult_t>(value));
  }
};

std::error_code make_nccl_error(ncclResult_t r) {
  static const nccl_error_category category;
  return r == ncclSuccess ? std::error_code{} : std::error_code{static_cast<int>(r), category};
}

/// Non-blocking communicators may answer ncclInProgress: wait until the call settled.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

}  // namespace

/// What the loop, the init thread and the stream's host functions share.
struct nccl_broadcast::state {
  event_loop* loop = nullptr;
  nccl_broadcast* self = nullptr;  ///< loop thread only; null once the group is gone
  std::atomic<bool> stop{false};   ///< asks the init thread to give up
  ncclComm_t comm = nullptr;       ///< written by the init thread before it posts; loop afterwards
  std::error_code init_error;      ///< likewise
  cudaStream_t stream = nullptr;
  bool initializing = false;  ///< loop only: the communicator is being made on a blocking thread
  bool up = false;            ///< loop only: the communicator is usable
  bool aborted = false;       ///< loop only
  std::error_code failure;    ///< loop only: why every operation fails
  std::uint64_t next_op = 0;
  std::map<std::uint64_t, completion> outstanding;  ///< loop only: issued, not yet finished
};

namespace {

/// Heap state of one operation's host function; the host function owns it.
struct op_finished {
  event_loop* loop = nullptr;
  std::function<void()> on_loop;
};

/// Runs on a CUDA-owned thread after the operation: only posts to the loop (no CUDA here).
void CUDART_CB finished(void* user) {
  auto* f = static_cast<op_finished*>(user);
  f->loop->post(std::move(f->on_loop));
  delete f;
}

}  // namespace

nccl_broadcast::nccl_broadcast(actor& owner, std::vector<address> members, std::uint32_t epoch,
                               int device)
    : owner_(owner),
      members_(std::move(members)),
      epoch_(epoch),
      device_(device),
      state_(std::make_shared<state>()) {
  state_->loop = &owner_.host().loop();
  state_->self = this;
  rank_ = static_cast<std::uint32_t>(std::find(members_.begin(), members_.end(), owner.self()) -
                                     members_.begin());
  if (rank_ >= members_.size()) {
    state_->failure = errc::invalid_argument;
    return;
  }
  if (auto ec = make_cuda_error(cudaSetDevice(device_))) {
    state_->failure = ec;
    return;
  }
  if (auto ec =
          make_cuda_error(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking))) {
    state_->failure = ec;
    return;
  }
  // Handlers hold the state, not `this`: a message for a group already gone finds self == null.
  auto st = state_;
  owner_.on<nccl_group_id>([st](const envelope_header&, const nccl_group_id& m) {
    if (st->self) st->self->on_id(m);
  });
  owner_.on<nccl_group_join>([st](const envelope_header& h, const nccl_group_join& m) {
    auto* self = st->self;
    if (!self || self->rank_ != 0 || m.epoch != self->epoch_ || self->id_.empty()) return;
    self->owner_.send(h.from,
                      nccl_group_id{.epoch = self->epoch_, .size = self->size(), .id = self->id_});
  });
  if (rank_ == 0) {  // makes the group's id (a group of one starts at once)
    ncclUniqueId uid;
    if (auto ec = make_nccl_error(ncclGetUniqueId(&uid))) {
      state_->failure = ec;
      return;
    }
    id_.assign(reinterpret_cast<const std::uint8_t*>(&uid),
               reinterpret_cast<const std::uint8_t*>(&uid) + sizeof uid);
    for (std::uint32_t r = 1; r < size(); ++r) {
      owner_.send(members_[r], nccl_group_id{.epoch = epoch_, .size = size(), .id = id_});
    }
    start_init(id_);
  } else {
    owner_.send(members_[0], nccl_group_join{.epoch = epoch_, .rank = rank_});
  }
}

nccl_broadcast::~nccl_broadcast() {
  abort();
  // A communicator still being made is released by its completion (`start_init`).
  if (!state_->initializing && state_->comm) {
    ncclCommAbort(state_->comm);
    state_->comm = nullptr;
  }
  if (state_->stream) {
    // Host functions still queued post into the loop; let them run before the stream goes.
    cudaStreamSynchronize(state_->stream);
    cudaStreamDestroy(state_->stream);
    state_->stream = nullptr;
  }
  state_->self = nullptr;
}

void nccl_broadcast::on_id(const nccl_group_id& m) {
  if (rank_ == 0 || m.epoch != epoch_ || m.size != size() || state_->initializing || state_->up)
    return;
  if (m.id.size() != sizeof(ncclUniqueId)) {
    log::warn("nccl group {}: an id of {} bytes, expected {}", epoch_, m.id.size(),
              sizeof(ncclUniqueId));
    return;
  }
  start_init(m.id);
}

void nccl_broadcast::start_init(std::vector<std::uint8_t> id) {
  if (state_->initializing || state_->up || state_->aborted) return;
  auto st = state_;
  st->initializing = true;
  owner_.host().env().platform().async_blocking(
      [st, id = std::move(id), device = device_, ranks = static_cast<int>(size()),
       rank = static_cast<int>(rank_)] {
        ncclUniqueId uid;
        std::memcpy(&uid, id.data(), sizeof uid);
        ncclComm_t comm = nullptr;
        std::error_code ec = make_cuda_error(cudaSetDevice(device));
        if (!ec) {
          // Non-blocking, so the wait can be abandoned (abort) instead of hanging on a dead peer.
          ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
          config.blocking = 0;
          ncclResult_t r = ncclCommInitRankConfig(&comm, ranks, uid, rank, &config);
          while (r == ncclInProgress && !st->stop) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
          }
          if (st->stop)
            ec = errc::stopped;
          else if (r != ncclSuccess)
            ec = make_nccl_error(r);
          if (ec && comm) {
            ncclCommAbort(comm);
            comm = nullptr;
          }
        }
        st->comm = comm;
        return ec;
      },
      [st](std::error_code ec) {
        st->initializing = false;
        st->init_error = ec;
        if (st->self) return st->self->on_init_done();
        if (st->comm) {  // the group went while its communicator was being made
          ncclCommAbort(st->comm);
          st->comm = nullptr;
        }
      });
}

void nccl_broadcast::on_init_done() {
  auto& s = *state_;
  if (s.aborted) return;  // the destructor releases the communicator
  if (s.init_error) {
    log::error("nccl group of epoch {}: rank {} of {} cannot start: {}", epoch_, rank_, size(),
               s.init_error.message());
    s.failure = s.init_error;
    return fail_all(s.failure);
  }
  s.up = true;
  auto queued = std::move(queued_);
  queued_.clear();
  for (auto& o : queued) issue(std::move(o));
}

bool nccl_broadcast::ready() const {
  return state_->up;
}
std::error_code nccl_broadcast::error() const {
  return state_->failure;
}

void nccl_broadcast::async_broadcast(buffer_ref data, completion done) {
  submit({.data = data.bytes.data(), .stripes = {{0, data.bytes.size()}}, .done = std::move(done)});
}

void nccl_broadcast::async_all_gather(buffer_ref data, std::uint32_t stripes, completion done) {
  op o{.data = data.bytes.data(), .done = std::move(done)};
  for (std::uint32_t s = 0; s < stripes; ++s)
    o.stripes.push_back(stripe_of(data.bytes.size(), stripes, s));
  submit(std::move(o));
}

void nccl_broadcast::submit(op o) {
  auto& s = *state_;
  if (s.aborted || s.failure) {
    const auto ec = s.aborted ? std::error_code(errc::stopped) : s.failure;
    return s.loop->post([done = std::move(o.done), ec] { done(ec); });
  }
  if (!s.up) return queued_.push_back(std::move(o));
  issue(std::move(o));
}

void nccl_broadcast::issue(op o) {
  auto& s = *state_;
  auto failed = [&](std::error_code ec) {
    s.loop->post([done = std::move(o.done), ec] { done(ec); });
  };
  if (auto ec = make_cuda_error(cudaSetDevice(device_))) return failed(ec);
  // A group: the stripes' broadcasts run at once, each over its root's links.
  ncclResult_t r = ncclGroupStart();
  for (std::size_t root = 0; r == ncclSuccess && root < o.stripes.size(); ++root) {
    const auto& part = o.stripes[root];
    if (part.bytes == 0) continue;
    r = ncclBroadcast(o.data + part.offset, o.data + part.offset, part.bytes, ncclUint8,
                      static_cast<int>(root), s.comm, s.stream);
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (r == ncclSuccess) r = ended;
  if (auto ec = make_nccl_error(settle(s.comm, r))) return failed(ec);
  const auto id = s.next_op++;
  s.outstanding.emplace(id, std::move(o.done));
  auto st = state_;
  auto* f = new op_finished{.loop = s.loop, .on_loop = [st, id] {
                              auto it = st->outstanding.find(id);
                              if (it == st->outstanding.end()) return;  // aborted meanwhile
                              auto done = std::move(it->second);
                              st->outstanding.erase(it);
                              done({});
                            }};
  if (auto ec = make_cuda_error(cudaLaunchHostFunc(s.stream, finished, f))) {
    delete f;
    auto it = s.outstanding.find(id);
    auto done = std::move(it->second);
    s.outstanding.erase(it);
    s.loop->post([done = std::move(done), ec] { done(ec); });
  }
}

void nccl_broadcast::fail_all(std::error_code ec) {
  auto& s = *state_;
  auto queued = std::move(queued_);
  queued_.clear();
  auto outstanding = std::move(s.outstanding);
  s.outstanding.clear();
  for (auto& o : queued) s.loop->post([done = std::move(o.done), ec] { done(ec); });
  for (auto& [id, done] : outstanding) s.loop->post([done = std::move(done), ec] { done(ec); });
}

void nccl_broadcast::abort() {
  auto& s = *state_;
  if (s.aborted) return;
  s.aborted = true;
  s.stop = true;
  if (s.up && s.comm) {
    ncclCommAbort(s.comm);
    s.comm = nullptr;
  }
  fail_all(errc::stopped);
}

std::function<std::unique_ptr<broadcast_group>(actor&, const std::vector<address>&, std::uint32_t)>
nccl_broadcast_factory(int device) {
  return [device](actor& owner, const std::vector<address>& members, std::uint32_t epoch) {
    return std::make_unique<nccl_broadcast>(owner, members, epoch, device);
  };
}

}  // namespace ferry
