/// ferry's fabric bulk path against plain libfabric loops on the same provider, same sizes, same
/// window of writes in flight, in one run. Each measurement writes from this process into a
/// target process (this binary re-executed with --role target), which drives its provider's
/// progress: a busy fi_cq_read loop for the plain loops, ferry's event loop for ferry.
///   - plain write: fi_write with the provider's default completion (the issue's reference);
///   - plain writedata: fi_writemsg with remote CQ data and FI_DELIVERY_COMPLETE, what ferry's
///     contract needs (the target learns of each write by its imm; the writer's completion means
///     "landed"), so this pair isolates ferry's own cost.
/// Each repetition runs the three phases in a rotating order; the table gives the best and the
/// median over the repetitions of each (figures on a shared host vary a lot).
///
///   fabric_bench [--providers "tcp;ofi_rxm,shm"] [--sizes-mib 1,4,16,64] [--window 4]
///                [--bytes-mib 1024] [--reps 5] [--csv out.csv]
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/read.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/event_loop.hpp"
#include "transport/fabric/endpoint.hpp"
#include "transport/fabric/fabric_transport.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fabric_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string hex(const void* data, std::size_t n) {
  std::string out;
  const auto* p = static_cast<const unsigned char*>(data);
  char buf[3];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", p[i]);
    out += buf;
  }
  return out;
}

std::vector<unsigned char> unhex(const std::string& s) {
  std::vector<unsigned char> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::stoi(s.substr(2 * i, 2), nullptr, 16);
  return out;
}

/// A raw RDM endpoint asked of libfabric with ferry's hints, driven without ferry.
struct raw_endpoint {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;

  explicit raw_endpoint(const std::string& provider) {
    const ferry::fabric_options options{.provider = provider};
    fi_info* hints = ferry::fabric_link::endpoint_hints(options);
    if (!hints) die("fi_allocinfo");
    const char* node = ferry::fabric_link::endpoint_node(options);
    check(fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints, &info),
          "fi_getinfo");
    fi_freeinfo(hints);
    check(fi_fabric(info->fabric_attr, &fabric, nullptr), "fi_fabric");
    check(fi_domain(fabric, info, &domain, nullptr), "fi_domain");
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_NONE;
    check(fi_cq_open(domain, &cq_attr, &cq, nullptr), "fi_cq_open");
    fi_av_attr av_attr{};
    av_attr.type = info->domain_attr->av_type;
    check(fi_av_open(domain, &av_attr, &av, nullptr), "fi_av_open");
    check(fi_endpoint(domain, info, &ep, nullptr), "fi_endpoint");
    check(fi_ep_bind(ep, &av->fid, 0), "bind av");
    check(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), "bind cq");
    check(fi_enable(ep), "fi_enable");
  }
  ~raw_endpoint() {
    fi_close(&ep->fid);
    fi_close(&av->fid);
    fi_close(&cq->fid);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    fi_freeinfo(info);
  }
  static void check(int rc, const char* what) {
    if (rc) die(std::string(what) + ": " + fi_strerror(-rc));
  }
  std::string name() const {
    char buf[256];
    std::size_t len = sizeof(buf);
    check(fi_getname(&ep->fid, buf, &len), "fi_getname");
    return hex(buf, len);
  }
  fid_mr* reg(void* p, std::size_t n, std::uint64_t access) {
    fid_mr* mr = nullptr;
    check(fi_mr_reg(domain, p, n, access, 0, 0x1234, 0, &mr, nullptr), "fi_mr_reg");
    if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
      check(fi_mr_bind(mr, &ep->fid, 0), "fi_mr_bind");
      check(fi_mr_enable(mr), "fi_mr_enable");
    }
    return mr;
  }
  fi_addr_t insert(const std::string& address) {
    auto blob = unhex(address);
    fi_addr_t a = FI_ADDR_UNSPEC;
    if (fi_av_insert(av, blob.data(), 1, &a, 0, nullptr) != 1) die("fi_av_insert");
    return a;
  }
};

/// Where the target's region is: its address, the remote address base and key.
struct target_info {
  std::string address;
  std::uint64_t addr = 0;
  std::uint64_t key = 0;
  std::uint64_t region_id = 0;
};

/// True once a line is readable on stdin (the driver's "stop") or stdin closed.
bool stop_requested() {
  pollfd p{.fd = 0, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) > 0;
}

int run_plain_target(const std::string& provider, const std::string& peer, std::size_t bytes) {
  raw_endpoint e(provider);
  e.insert(peer);
  std::vector<std::byte> buf(bytes);
  fid_mr* mr = e.reg(buf.data(), buf.size(), FI_REMOTE_WRITE);
  const std::uint64_t base = (e.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
                                 ? reinterpret_cast<std::uint64_t>(buf.data())
                                 : 0;
  // Under FI_RX_CQ_DATA a write with remote CQ data consumes a posted receive: keep some posted.
  constexpr std::size_t receives = 64;
  std::vector<fi_context2> rx(receives);
  std::vector<std::array<std::byte, 64>> rx_buf(receives);
  auto post = [&](std::size_t i) {
    const ssize_t rc =
        fi_recv(e.ep, rx_buf[i].data(), rx_buf[i].size(), nullptr, FI_ADDR_UNSPEC, &rx[i]);
    if (rc) die(std::string("plain target fi_recv: ") + fi_strerror(static_cast<int>(-rc)));
  };
  for (std::size_t i = 0; i < receives; ++i) post(i);
  std::printf("%s %llu %llu 0\n", e.name().c_str(), static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(fi_mr_key(mr)));
  std::fflush(stdout);
  fi_cq_data_entry entries[16];
  for (std::uint64_t spins = 0;; ++spins) {
    // rxm and shm move bytes only while the target polls: poll like any plain RMA target.
    const ssize_t n = fi_cq_read(e.cq, entries, 16);
    for (ssize_t i = 0; i < n; ++i) {
      auto* ctx = static_cast<fi_context2*>(entries[i].op_context);
      if (ctx >= rx.data() && ctx < rx.data() + rx.size())
        post(static_cast<std::size_t>(ctx - rx.data()));
    }
    if ((spins & 1023) == 0 && stop_requested()) break;
  }
  fi_close(&mr->fid);
  return 0;
}

int run_ferry_target(const std::string& provider, const std::string& peer, std::size_t bytes) {
  ferry::event_loop loop;
  // Measures bulk writes, which carry no seal: control frames go unauthenticated here.
  auto made =
      ferry::fabric_transport::make(loop, 2, {.allow_unauthenticated = true, .provider = provider});
  if (!made) die("ferry target: " + made.error().message());
  auto t = *made;
  std::uint64_t notices = 0;
  t->start({.on_frame = {},
            .on_write = [&](const ferry::write_notice&) { ++notices; },
            .on_peer_lost = {}});
  if (t->add_peer(1, peer)) die("ferry target: add_peer");
  std::vector<std::byte> buf(bytes);
  auto region = t->register_region(buf);
  if (!region) die("ferry target: register_region");
  std::printf("%s %llu %llu %llu\n", t->local_address().c_str(),
              static_cast<unsigned long long>(region->addr),
              static_cast<unsigned long long>(region->key),
              static_cast<unsigned long long>(region->id));
  std::fflush(stdout);
  bool stop = false;
  boost::asio::posix::stream_descriptor in(loop.io(), ::dup(0));
  char byte;
  in.async_read_some(boost::asio::buffer(&byte, 1),
                     [&](const boost::system::error_code&, std::size_t) { stop = true; });
  loop.run_until([&] { return stop; });
  t->close();
  return 0;
}

/// A running target process and the pipes to it.
struct target_process {
  pid_t pid = -1;
  int to_child = -1;
  FILE* from_child = nullptr;
  target_info info;

  target_process(const std::string& self, const std::string& impl, const std::string& provider,
                 const std::string& my_address, std::size_t bytes) {
    int in[2], out[2];
    if (pipe(in) || pipe(out)) die("pipe");
    pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      const std::string b = std::to_string(bytes);
      execl(self.c_str(), self.c_str(), "--role", "target", "--impl", impl.c_str(), "--providers",
            provider.c_str(), "--peer", my_address.c_str(), "--bytes", b.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_child = in[1];
    from_child = fdopen(out[0], "r");
    char line[1024];
    if (!std::fgets(line, sizeof(line), from_child)) die("target did not start");
    std::istringstream s(line);
    s >> info.address >> info.addr >> info.key >> info.region_id;
  }
  ~target_process() {
    if (::write(to_child, "s", 1) != 1) kill(pid, SIGTERM);
    ::close(to_child);
    int status = 0;
    waitpid(pid, &status, 0);
    std::fclose(from_child);
  }
};

/// How a plain loop writes.
enum class plain_kind { write, writedata };

/// Plain: a loop of writes with `window` in flight; returns GB/s over `count` writes.
double plain_run(raw_endpoint& e, fi_addr_t dest, const target_info& t, std::vector<std::byte>& src,
                 fid_mr* mr, plain_kind kind, std::size_t size, std::size_t window,
                 std::size_t count) {
  std::vector<fi_context2> ctx(window);
  void* desc = fi_mr_desc(mr);
  std::size_t issued = 0, done = 0;
  fi_cq_data_entry entries[16];
  auto issue = [&](std::size_t slot) -> ssize_t {
    void* local = src.data() + slot * size;
    if (kind == plain_kind::write)
      return fi_write(e.ep, local, size, desc, dest, t.addr + slot * size, t.key, &ctx[slot]);
    iovec iov{local, size};
    fi_rma_iov rma{t.addr + slot * size, size, t.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = dest;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &ctx[slot];
    msg.data = slot;
    return fi_writemsg(e.ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE | FI_REMOTE_CQ_DATA);
  };
  const auto start = clock_type::now();
  while (done < count) {
    while (issued < count && issued - done < window) {
      const ssize_t rc = issue(issued % window);
      if (rc == -FI_EAGAIN) break;
      if (rc) die(std::string("plain write: ") + fi_strerror(static_cast<int>(-rc)));
      ++issued;
    }
    const ssize_t n = fi_cq_read(e.cq, entries, 16);
    if (n > 0) done += static_cast<std::size_t>(n);
    if (n == -FI_EAVAIL) die("plain write failed");
  }
  const double secs = std::chrono::duration<double>(clock_type::now() - start).count();
  return static_cast<double>(size) * static_cast<double>(count) / secs / 1e9;
}

/// ferry: fabric_transport::async_write with `window` in flight, chained from completions.
double ferry_run(ferry::event_loop& loop, ferry::fabric_transport& t,
                 const ferry::region_desc& remote, std::vector<std::byte>& src, std::size_t size,
                 std::size_t window, std::size_t count) {
  std::size_t issued = 0, done = 0;
  std::error_code failure;
  std::function<void()> issue = [&] {
    const std::size_t slot = issued % window;
    ++issued;
    t.async_write(std::span(src).subspan(slot * size, size), remote, slot * size,
                  ferry::make_imm(1, slot), [&](std::error_code ec) {
                    if (ec) failure = ec;
                    ++done;
                    if (issued < count) issue();
                  });
  };
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < window && i < count; ++i) issue();
  loop.run_until([&] { return done == count || failure; });
  if (failure) die("ferry write failed: " + failure.message());
  const double secs = std::chrono::duration<double>(clock_type::now() - start).count();
  return static_cast<double>(size) * static_cast<double>(count) / secs / 1e9;
}

/// One figure per repetition.
struct samples {
  std::vector<double> gbps;
  double best() const { return *std::max_element(gbps.begin(), gbps.end()); }
  double median() const {
    auto v = gbps;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry fabric bulk path vs plain fi_write and fi_writedata loops"};
  std::string providers = "tcp;ofi_rxm,shm", sizes_mib = "1,4,16,64", csv, role = "driver", impl,
              peer;
  std::size_t window = 4, bytes_mib = 1024, reps = 5, bytes = 0;
  app.add_option("--providers", providers, "comma-separated libfabric providers");
  app.add_option("--sizes-mib", sizes_mib, "write sizes in MiB, comma-separated");
  app.add_option("--window", window, "writes in flight");
  app.add_option("--bytes-mib", bytes_mib, "bytes written per measurement (at least 8 writes)");
  app.add_option("--reps", reps, "repetitions of every phase; best and median are reported")
      ->check(CLI::PositiveNumber);
  app.add_option("--csv", csv, "also write the table as CSV here");
  app.add_option("--role", role, "internal: driver or target");
  app.add_option("--impl", impl, "internal: plain or ferry target");
  app.add_option("--peer", peer, "internal: the driver's address");
  app.add_option("--bytes", bytes, "internal: target region size");
  CLI11_PARSE(app, argc, argv);

  if (role == "target")
    return impl == "plain" ? run_plain_target(providers, peer, bytes)
                           : run_ferry_target(providers, peer, bytes);

  std::vector<std::size_t> sizes;
  for (const auto& s : split(sizes_mib, ',')) sizes.push_back(std::stoull(s) << 20);
  const std::size_t max_size = *std::max_element(sizes.begin(), sizes.end());
  const std::size_t region = max_size * window;
  const std::string self = "/proc/self/exe";
  char exe[4096];
  const ssize_t n = readlink(self.c_str(), exe, sizeof(exe) - 1);
  if (n <= 0) die("readlink");
  exe[n] = 0;

  std::vector<std::byte> src(region);
  for (std::size_t i = 0; i < src.size(); i += 4096) src[i] = static_cast<std::byte>(i >> 12);
  auto count_for = [&](std::size_t size) {
    return std::max<std::size_t>(8, (bytes_mib << 20) / size);
  };

  // One set of samples per size and way of writing.
  const std::vector<std::string> ways = {"plain write", "plain writedata", "ferry"};
  struct row {
    std::string provider;
    std::size_t size;
    std::map<std::string, samples> by_way;
  };
  std::vector<row> rows;
  for (const auto& provider : split(providers, ',')) {
    std::map<std::size_t, row> by_size;
    auto run_plain = [&](plain_kind kind, const std::string& way) {
      raw_endpoint e(provider);
      fid_mr* mr = e.reg(src.data(), src.size(), FI_WRITE);
      target_process target(exe, "plain", provider, e.name(), region);
      const fi_addr_t dest = e.insert(target.info.address);
      plain_run(e, dest, target.info, src, mr, kind, max_size, window,
                2 * window);  // warm-up: rxm connects lazily
      for (auto size : sizes) {
        by_size[size].by_way[way].gbps.push_back(
            plain_run(e, dest, target.info, src, mr, kind, size, window, count_for(size)));
      }
      fi_close(&mr->fid);
    };
    auto run_ferry = [&] {
      ferry::event_loop loop;
      auto made = ferry::fabric_transport::make(
          loop, 1, {.allow_unauthenticated = true, .provider = provider});
      if (!made) die("ferry: " + made.error().message());
      auto t = *made;
      t->start({});
      if (!t->register_region(src)) die("ferry: register_region");
      target_process target(exe, "ferry", provider, t->local_address(), region);
      if (t->add_peer(2, target.info.address)) die("ferry: add_peer");
      const ferry::region_desc remote{.owner = 2,
                                      .id = target.info.region_id,
                                      .addr = target.info.addr,
                                      .key = target.info.key,
                                      .length = region};
      ferry_run(loop, *t, remote, src, max_size, window, 2 * window);
      for (auto size : sizes) {
        by_size[size].by_way[ways[2]].gbps.push_back(
            ferry_run(loop, *t, remote, src, size, window, count_for(size)));
      }
      t->close();
    };
    const std::vector<std::function<void()>> phases = {
        [&] { run_plain(plain_kind::write, ways[0]); },
        [&] { run_plain(plain_kind::writedata, ways[1]); }, run_ferry};
    for (std::size_t rep = 0; rep < reps; ++rep) {
      // Rotate which phase goes first, so a drift in the machine's speed favours none.
      for (std::size_t i = 0; i < phases.size(); ++i) phases[(rep + i) % phases.size()]();
    }
    for (auto& [size, r] : by_size) {
      r.provider = provider;
      r.size = size;
      rows.push_back(r);
    }
  }

  // GB/s as best / median; ratios of ferry to each plain loop, of bests and of medians.
  std::printf("%-12s %5s %6s %16s %16s %16s %14s %14s\n", "provider", "size", "window",
              "plain write", "plain writedata", "ferry", "ferry/write", "ferry/wdata");
  for (const auto& r : rows) {
    const auto& w = r.by_way.at(ways[0]);
    const auto& d = r.by_way.at(ways[1]);
    const auto& f = r.by_way.at(ways[2]);
    std::printf(
        "%-12s %3zuMi %6zu %7.2f / %6.2f %7.2f / %6.2f %7.2f / %6.2f %6.2f / %5.2f %6.2f / %5.2f\n",
        r.provider.c_str(), r.size >> 20, window, w.best(), w.median(), d.best(), d.median(),
        f.best(), f.median(), f.best() / w.best(), f.median() / w.median(), f.best() / d.best(),
        f.median() / d.median());
  }
  std::printf("(GB/s best / median of %zu repetitions; ratios: of bests / of medians)\n", reps);
  if (!csv.empty()) {
    std::ofstream out(csv);
    out << "provider,size_bytes,window,reps,way,best_gbps,median_gbps\n";
    for (const auto& r : rows)
      for (const auto& way : ways)
        out << '"' << r.provider << "\"," << r.size << ',' << window << ',' << reps << ",\"" << way
            << "\"," << r.by_way.at(way).best() << ',' << r.by_way.at(way).median() << '\n';
  }
  return 0;
}
