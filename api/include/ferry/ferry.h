/* ferry's C ABI (C99) over the C++ API of ferry/ferry.hpp: opaque handles, a status from every
 * call and a thread-local message for the last failure, versioned option structs (initialise
 * them with their *_INIT macro, which sets struct_size), waits with timeouts, and an event fd
 * per member for other event loops. No C++ exception crosses it. */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FERRY_BUILDING_LIBRARY)
#define FERRY_C_API __attribute__((visibility("default")))
#else
#define FERRY_C_API
#endif

#define FERRY_C_VERSION_MAJOR 0
#define FERRY_C_VERSION_MINOR 2
#define FERRY_C_VERSION_PATCH 0

typedef enum ferry_status {
  FERRY_OK = 0,
  FERRY_INVALID_ARGUMENT = 1, /* a bad option, tensor, version, address or handle */
  FERRY_CLOSED,               /* the handle was closed, or the job stopped */
  FERRY_NOT_JOINED,
  FERRY_ALREADY_JOINED, /* registering after join */
  FERRY_BUSY,           /* the previous version is still offloading */
  FERRY_TIMED_OUT,
  FERRY_UNREACHABLE,
  FERRY_JOB_FAILED,
  FERRY_UPDATE_FAILED, /* this version cannot be delivered */
  FERRY_INTERNAL       /* a bug in ferry: the message says what */
} ferry_status;

/* A constant name for `s`. */
FERRY_C_API const char* ferry_status_string(ferry_status s);
/* What the calling thread's last failed call said (empty after a success); valid until its next
 * call. */
FERRY_C_API const char* ferry_last_error(void);
/* "major.minor.patch" of the library loaded. */
FERRY_C_API const char* ferry_version(void);
/* How much ferry writes to stderr, process-wide: "debug", "info" (default), "warn", "error", "off".
 */
FERRY_C_API ferry_status ferry_set_log_level(const char* level);
/* Removes the /dev/shm files (libfabric shm's queues) of member process `pid`, killed by SIGKILL:
 * call it once the process died and before reaping it. `removed` (may be NULL): how many went.
 * Refuses a process that still runs. */
FERRY_C_API ferry_status ferry_clean_up_killed_process(int32_t pid, size_t* removed);

typedef struct ferry_coordinator ferry_coordinator;
typedef struct ferry_trainer ferry_trainer;
typedef struct ferry_rollout ferry_rollout;

typedef struct ferry_coordinator_options {
  uint32_t struct_size;
  const char* listen; /* "tcp://127.0.0.1:0" */
  const char* secret; /* NULL: FERRY_SECRET_FILE / FERRY_SECRET */
  uint32_t trainers;
  const uint32_t* instance_sizes; /* workers per instance */
  uint32_t instances;
  uint64_t chunk_bytes;
  uint32_t depth;
  uint32_t stripes;
  const char* p2p; /* "auto" (NULL too), "device" or "host": GPU to GPU or through host memory */
} ferry_coordinator_options;
#define FERRY_COORDINATOR_OPTIONS_INIT                                                         \
  {                                                                                            \
    sizeof(ferry_coordinator_options), "tcp://127.0.0.1:0", NULL, 1, NULL, 0, 64u << 20, 2, 0, \
        "auto"                                                                                 \
  }

typedef struct ferry_member_options {
  uint32_t struct_size;
  const char* coordinator; /* the coordinator's address */
  const char* secret;      /* NULL: FERRY_SECRET_FILE / FERRY_SECRET */
  uint32_t node_id;        /* 0: derived from the shard or (instance, rank) */
  uint32_t shard;          /* trainers */
  uint32_t instance;       /* rollouts */
  uint32_t rank;           /* rollouts */
  /* Since 0.2 (a struct of 0.1's size leaves them NULL): the local address other members reach
   * this one at (NULL: over tcp and cma the address this host reaches the coordinator from), and
   * where the member writes its timeline as it closes (Chrome trace JSON; NULL: none). */
  const char* listen_host;
  const char* trace_file;
} ferry_member_options;
#define FERRY_MEMBER_OPTIONS_INIT \
  { sizeof(ferry_member_options), NULL, NULL, 0, 0, 0, 0, NULL, NULL }

FERRY_C_API ferry_status ferry_coordinator_open(const ferry_coordinator_options* options,
                                                ferry_coordinator** out);
/* Writes the address members pass (NUL-terminated) into `buffer`. */
FERRY_C_API ferry_status ferry_coordinator_address(ferry_coordinator* c, char* buffer, size_t size);
FERRY_C_API ferry_status ferry_coordinator_wait_delivered(ferry_coordinator* c, uint64_t version,
                                                          int64_t timeout_ms);
/* Stops the job and frees the handle (NULL is ignored). */
FERRY_C_API void ferry_coordinator_close(ferry_coordinator* c);

FERRY_C_API ferry_status ferry_trainer_open(const ferry_member_options* options,
                                            ferry_trainer** out);
/* Before join: a tensor of `ndim` dimensions whose bytes are at `data` (dtype: "f32", "bf16", ...).
 */
FERRY_C_API ferry_status ferry_trainer_register_tensor(ferry_trainer* t, const char* name,
                                                       const char* dtype, const int64_t* shape,
                                                       size_t ndim, void* data);
/* Since 0.2: the same, for a tensor in the memory of CUDA device `device` (CUDA builds; every
 * tensor of one member on one device). */
FERRY_C_API ferry_status ferry_trainer_register_device_tensor(ferry_trainer* t, const char* name,
                                                              const char* dtype,
                                                              const int64_t* shape, size_t ndim,
                                                              void* data, int device);
FERRY_C_API ferry_status ferry_trainer_join(ferry_trainer* t);
/* Until the coordinator admitted this shard and the job is ready for a version from it. */
FERRY_C_API ferry_status ferry_trainer_wait_ready(ferry_trainer* t, int64_t timeout_ms);
/* The lowest version the job takes next from this shard (a replacement continues from there). */
FERRY_C_API uint64_t ferry_trainer_next_version(ferry_trainer* t);
/* Until the coordinator ends the job (FERRY_OK), the job fails, or the timeout. */
FERRY_C_API ferry_status ferry_trainer_wait_end(ferry_trainer* t, int64_t timeout_ms);
FERRY_C_API ferry_status ferry_trainer_publish(ferry_trainer* t, uint64_t version);
/* Publishes `version` from bytes given to ferry_trainer_write instead of the registered tensors
   (host memory): each chunk leaves once every tensor in it is written. */
FERRY_C_API ferry_status ferry_trainer_publish_written(ferry_trainer* t, uint64_t version);
/* Copies tensor `name`'s bytes (`bytes`, its registered size) from `data` into the version being
   published written, once ferry's copy may be written; FERRY_TIMED_OUT: nothing written. Each
   tensor once. */
FERRY_C_API ferry_status ferry_trainer_write(ferry_trainer* t, const char* name, const void* data,
                                             size_t bytes, int64_t timeout_ms);
/* Until `version` is offloaded (its tensors may be written again) or delivered, or the timeout. */
FERRY_C_API ferry_status ferry_trainer_wait_offloaded(ferry_trainer* t, uint64_t version,
                                                      int64_t timeout_ms);
FERRY_C_API ferry_status ferry_trainer_wait_delivered(ferry_trainer* t, uint64_t version,
                                                      int64_t timeout_ms);
/* Readable (an eventfd counter) whenever a published version is offloaded, delivered or failed. */
FERRY_C_API int ferry_trainer_event_fd(ferry_trainer* t);
/* Leaves the job and frees the handle (NULL is ignored). */
FERRY_C_API void ferry_trainer_close(ferry_trainer* t);

FERRY_C_API ferry_status ferry_rollout_open(const ferry_member_options* options,
                                            ferry_rollout** out);
/* Before join: where the tensor lands. */
FERRY_C_API ferry_status ferry_rollout_register_tensor(ferry_rollout* r, const char* name,
                                                       const char* dtype, const int64_t* shape,
                                                       size_t ndim, void* data);
/* Before join: rows [first_row, first_row + rows) of the tensor of `shape` (its first dimension)
 * land at `data`, which holds those rows only; only their bytes are sent here. */
FERRY_C_API ferry_status ferry_rollout_register_rows(ferry_rollout* r, const char* name,
                                                     const char* dtype, const int64_t* shape,
                                                     size_t ndim, int64_t first_row, int64_t rows,
                                                     void* data);
/* Since 0.2: where the tensor lands in the memory of CUDA device `device` (CUDA builds). */
FERRY_C_API ferry_status ferry_rollout_register_device_tensor(ferry_rollout* r, const char* name,
                                                              const char* dtype,
                                                              const int64_t* shape, size_t ndim,
                                                              void* data, int device);
FERRY_C_API ferry_status ferry_rollout_join(ferry_rollout* r);
/* The newest version applied here (0: none). */
FERRY_C_API uint64_t ferry_rollout_version(ferry_rollout* r);
FERRY_C_API ferry_status ferry_rollout_wait_version(ferry_rollout* r, uint64_t version,
                                                    int64_t timeout_ms);
/* Until the coordinator ends the job (FERRY_OK), the job fails, or the timeout. */
FERRY_C_API ferry_status ferry_rollout_wait_end(ferry_rollout* r, int64_t timeout_ms);
/* Readable (an eventfd counter) whenever a version is applied here. */
FERRY_C_API int ferry_rollout_event_fd(ferry_rollout* r);
FERRY_C_API void ferry_rollout_close(ferry_rollout* r);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_H */
