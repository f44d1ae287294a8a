#include "transport/fabric/endpoint.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/log.hpp"
#include "transport/errc.hpp"
#include "transport/fabric/message_format.hpp"

namespace ferry::fabric_link {
namespace {

std::error_code provider_failed(const char* what, int rc) {
  log::warn("fabric: {} failed: {}", what, fi_error_text(rc));
  return transport_errc::provider_error;
}

}  // namespace

op* op_pool::take(op_kind kind, std::uint64_t owner, std::uint64_t bytes) {
  op* o;
  if (free_.empty()) {
    o = &store_.emplace_back();
  } else {
    o = free_.back();
    free_.pop_back();
  }
  std::memset(&o->ctx, 0, sizeof(o->ctx));
  o->kind = kind;
  o->owner = owner;
  o->bytes = bytes;
  return o;
}

std::error_code map_op_error(int err) {
  switch (err) {
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
    case FI_EINVAL:
    case FI_EFAULT:
    case FI_EOPNOTSUPP:
      // One-sided writes learn only that the peer's provider refused the key or the range.
      return transport_errc::key_mismatch;
    case FI_ETRUNC:
    case FI_EMSGSIZE:
      return transport_errc::limit_exceeded;
    // We never fi_cancel and fail our own ops on close, so a cancel is the provider dropping
    // the link (tcp;ofi_rxm does so when the target refuses an RMA key or range).
    case FI_ECANCELED:
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ETIMEDOUT:
    case FI_EIO:
    case FI_ESHUTDOWN:
    case ESRCH:  // shm: the target process is gone (process_vm_writev)
      return transport_errc::connection_lost;
    default:
      return transport_errc::provider_error;
  }
}

bool is_link_error(std::error_code ec) {
  return ec == transport_errc::connection_lost;
}

std::string fi_error_text(int rc) {
  return fi_strerror(rc < 0 ? -rc : rc);
}

result<std::unique_ptr<endpoint>> endpoint::open(const fabric_options& options) {
  auto e = std::make_unique<endpoint>();
  if (auto ec = e->choose_provider(options)) return fail(ec);
  if (auto ec = e->open_objects()) return fail(ec);
  return e;
}

fi_info* endpoint_hints(const fabric_options& options) {
  fi_info* hints = fi_allocinfo();
  if (!hints) return nullptr;
  // Remote CQ data is no capability bit in libfabric 1.17: domain_attr->cq_data_size says it.
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  // Frames to one peer must arrive in the order sent. (rxm still completes a large frame after
  // smaller ones sent later: the transport's `holds_order` keeps that from happening.)
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  if (!options.provider.empty()) hints->fabric_attr->prov_name = strdup(options.provider.c_str());
  return hints;
}

const char* endpoint_node(const fabric_options& options) {
  const bool is_shm = options.provider == "shm";
  return (is_shm || options.node.empty()) ? nullptr : options.node.c_str();
}

std::error_code endpoint::choose_provider(const fabric_options& options) {
  fi_info* hints = endpoint_hints(options);
  if (!hints) return transport_errc::provider_error;
  const char* node = endpoint_node(options);
  fi_info* found = nullptr;
  const int rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints, &found);
  fi_freeinfo(hints);
  if (rc != 0 || !found) {
    log::warn("fabric: no provider '{}' with RDM+RMA+remote CQ data: {}", options.provider,
              fi_error_text(rc));
    return transport_errc::peer_unreachable;
  }
  for (fi_info* i = found; i && !info; i = i->next)
    if (i->domain_attr->cq_data_size >= sizeof(write_imm)) info = fi_dupinfo(i);
  fi_freeinfo(found);
  if (!info) {
    log::warn("fabric: provider '{}' carries fewer than 4 bytes of CQ data", options.provider);
    return transport_errc::provider_error;
  }
  provider_name = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "";
  mr_mode = info->domain_attr->mr_mode;
  max_piece = info->ep_attr->max_msg_size;
  if (options.max_write_piece != 0)
    max_piece = std::min<std::uint64_t>(max_piece, options.max_write_piece);
  if (max_piece == 0) max_piece = 1u << 30;
  inject_limit = info->tx_attr->inject_size;
  inject_only = provider_name == "shm" && inject_limit > message_overhead + notice_bytes;
  return {};
}

std::error_code endpoint::open_objects() {
  int rc;
  if ((rc = fi_fabric(info->fabric_attr, &fabric, nullptr)))
    return provider_failed("fi_fabric", rc);
  if ((rc = fi_domain(fabric, info, &domain, nullptr))) return provider_failed("fi_domain", rc);
  if (auto ec = open_cq()) return ec;
  fi_av_attr av_attr{};
  av_attr.type = info->domain_attr->av_type;
  if ((rc = fi_av_open(domain, &av_attr, &av, nullptr))) return provider_failed("fi_av_open", rc);
  if ((rc = fi_endpoint(domain, info, &ep, nullptr))) return provider_failed("fi_endpoint", rc);
  if ((rc = fi_ep_bind(ep, &av->fid, 0))) return provider_failed("fi_ep_bind(av)", rc);
  if ((rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)))
    return provider_failed("fi_ep_bind(cq)", rc);
  if ((rc = fi_enable(ep))) return provider_failed("fi_enable", rc);
  name.resize(max_name_bytes);
  std::size_t len = name.size();
  if ((rc = fi_getname(&ep->fid, name.data(), &len))) return provider_failed("fi_getname", rc);
  name.resize(len);
  return {};
}

/// A CQ with a wait fd where the provider gives one (idle progress sleeps on it), else without.
std::error_code endpoint::open_cq() {
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_FD;
  cq_attr.size = 0;
  if (fi_cq_open(domain, &cq_attr, &cq, nullptr) == 0) {
    if (fi_control(&cq->fid, FI_GETWAIT, &wait_fd) == 0 && wait_fd >= 0) return {};
    wait_fd = -1;
    fi_close(&cq->fid);
    cq = nullptr;
  }
  cq_attr.wait_obj = FI_WAIT_NONE;
  if (const int rc = fi_cq_open(domain, &cq_attr, &cq, nullptr))
    return provider_failed("fi_cq_open", rc);
  return {};
}

std::error_code endpoint::register_memory(void* data, std::size_t n, std::uint64_t access,
                                          fid_mr*& out, std::uint64_t requested_key) {
  int rc = fi_mr_reg(domain, data, n, access, 0, requested_key, 0, &out, nullptr);
  if (rc) return provider_failed("fi_mr_reg", rc);
  if (mr_mode & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(out, &ep->fid, 0)) || (rc = fi_mr_enable(out))) {
      fi_close(&out->fid);
      out = nullptr;
      return provider_failed("fi_mr_bind/enable", rc);
    }
  }
  return {};
}

std::optional<fi_addr_t> endpoint::insert(std::span<const std::byte> peer_name) {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  if (fi_av_insert(av, peer_name.data(), 1, &addr, 0, nullptr) != 1) return std::nullopt;
  return addr;
}

void endpoint::remove(fi_addr_t addr) {
  fi_av_remove(av, &addr, 1, 0);
}

bool endpoint::may_sleep() {
  fid* fids[1] = {&cq->fid};
  return fi_trywait(fabric, fids, 1) == FI_SUCCESS;
}

void endpoint::close_endpoint() {
  if (ep) fi_close(&ep->fid);
  ep = nullptr;
}

void endpoint::close() {
  close_endpoint();
  if (cq) fi_close(&cq->fid);
  if (av) fi_close(&av->fid);
  if (domain) fi_close(&domain->fid);
  if (fabric) fi_close(&fabric->fid);
  cq = nullptr;
  av = nullptr;
  domain = nullptr;
  fabric = nullptr;
  wait_fd = -1;
  if (info) fi_freeinfo(info);
  info = nullptr;
}

}  // namespace ferry::fabric_link
