/* The C ABI in one process: a coordinator, a trainer, a rollout worker holding the tensor, and an
 * instance of two row-sharded workers holding half of its rows each, over tcp; three versions of
 * one tensor (two copied from the registered one, one written into ferry's copy), each checked
 * byte for byte on the rollout side. */
#include <ferry/ferry.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                        \
  do {                                                                                     \
    ferry_status s_ = (call);                                                              \
    if (s_ != FERRY_OK) {                                                                  \
      fprintf(stderr, "%s: %s: %s\n", #call, ferry_status_string(s_), ferry_last_error()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

enum { N = 100000 };
static float sent[N], next[N], received[N], halves[2][N / 2];

int main(void) {
  const char* secret = "minimal-example-secret-32-bytes!";
  const uint32_t sizes[] = {1, 2};
  ferry_coordinator_options co = FERRY_COORDINATOR_OPTIONS_INIT;
  co.secret = secret;
  co.instance_sizes = sizes;
  co.instances = 2;
  co.chunk_bytes = 64 * 1024;
  ferry_coordinator* coordinator = NULL;
  CHECK(ferry_coordinator_open(&co, &coordinator));
  char address[256];
  CHECK(ferry_coordinator_address(coordinator, address, sizeof address));

  ferry_member_options mo = FERRY_MEMBER_OPTIONS_INIT;
  mo.coordinator = address;
  mo.secret = secret;
  const int64_t shape[] = {N};
  ferry_trainer* trainer = NULL;
  ferry_rollout* rollout = NULL;
  CHECK(ferry_trainer_open(&mo, &trainer));
  CHECK(ferry_rollout_open(&mo, &rollout));
  CHECK(ferry_trainer_register_tensor(trainer, "w", "f32", shape, 1, sent));
  CHECK(ferry_rollout_register_tensor(rollout, "w", "f32", shape, 1, received));
  ferry_rollout* sharded[2] = {NULL, NULL};
  for (uint32_t r = 0; r < 2; ++r) { /* instance 1: rank r holds rows [r N/2, (r + 1) N/2) */
    ferry_member_options so = mo;
    so.instance = 1;
    so.rank = r;
    CHECK(ferry_rollout_open(&so, &sharded[r]));
    CHECK(ferry_rollout_register_rows(sharded[r], "w", "f32", shape, 1, r * (N / 2), N / 2,
                                      halves[r]));
  }
  CHECK(ferry_trainer_join(trainer));
  CHECK(ferry_rollout_join(rollout));
  for (int r = 0; r < 2; ++r) CHECK(ferry_rollout_join(sharded[r]));
  CHECK(ferry_trainer_wait_ready(trainer, 30000));

  for (uint64_t v = ferry_trainer_next_version(trainer); v <= 3; ++v) {
    /* Version 3 is written straight into ferry's copy from `next` (each chunk leaves once
       written); the others are copied from the registered `sent`. */
    float* from = v == 3 ? next : sent;
    for (int i = 0; i < N; ++i) from[i] = (float)v + (float)i * 0.5f;
    if (v == 3) {
      CHECK(ferry_trainer_publish_written(trainer, v));
      CHECK(ferry_trainer_write(trainer, "w", next, sizeof next, 30000));
    } else {
      CHECK(ferry_trainer_publish(trainer, v));
    }
    CHECK(ferry_trainer_wait_delivered(trainer, v, 30000));
    CHECK(ferry_rollout_wait_version(rollout, v, 30000));
    for (int r = 0; r < 2; ++r) CHECK(ferry_rollout_wait_version(sharded[r], v, 30000));
    if (memcmp(from, received, sizeof sent) != 0 ||
        memcmp(from, halves[0], sizeof halves[0]) != 0 ||
        memcmp(from + N / 2, halves[1], sizeof halves[1]) != 0) {
      fprintf(stderr, "version %llu differs\n", (unsigned long long)v);
      return 1;
    }
    printf("minimal: version %llu verified\n", (unsigned long long)v);
  }
  /* Bad input gets a status and a message, never a crash. */
  if (ferry_trainer_publish(trainer, 1) != FERRY_INVALID_ARGUMENT) return 1;
  printf("minimal: publishing an old version: %s\n", ferry_last_error());
  ferry_trainer* split =
      NULL; /* one tensor in host memory, one on device 1: one device per member */
  CHECK(ferry_trainer_open(&mo, &split));
  CHECK(ferry_trainer_register_tensor(split, "a", "f32", shape, 1, sent));
  CHECK(ferry_trainer_register_device_tensor(split, "b", "f32", shape, 1, sent, 1));
  if (ferry_trainer_join(split) != FERRY_INVALID_ARGUMENT) return 1;
  printf("minimal: tensors on two devices: %s\n", ferry_last_error());
  ferry_trainer_close(split);
  /* The coordinator ends the job; every member hears it. */
  ferry_coordinator_close(coordinator);
  CHECK(ferry_trainer_wait_end(trainer, 30000));
  CHECK(ferry_rollout_wait_end(rollout, 30000));
  for (int r = 0; r < 2; ++r) {
    CHECK(ferry_rollout_wait_end(sharded[r], 30000));
    ferry_rollout_close(sharded[r]);
  }
  ferry_rollout_close(rollout);
  ferry_trainer_close(trainer);
  printf("minimal: ferry %s, done\n", ferry_version());
  return 0;
}
