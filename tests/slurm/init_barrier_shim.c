/* LD_PRELOAD shim for tests/slurm/init_barrier.sh (not linked into anything else).
 *
 * It shows whether MPI_Init is a barrier across nodes. On the second node (SLURM_NODEID=1) it
 * stalls each rank for INIT_BARRIER_DELAY seconds between Open MPI's first PMIx fence (the address
 * exchange) and its last one: libmpi calls mca_pml_base_bsend_init through its PLT right after the
 * first fence, so the preload wins. Every rank then notes when MPI_Init_thread returned. If the
 * last fence really waits for every node, no rank leaves MPI_Init before that stall has ended.
 * Notes go to $INIT_BARRIER_DIR/{stalled,init_done}.<rank>, one CLOCK_REALTIME time each (the two
 * emulated nodes share one host, so one clock). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void note(const char *what) {
  const char *dir = getenv("INIT_BARRIER_DIR"), *rank = getenv("SLURM_PROCID");
  if (!dir || !rank) return;
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%s", dir, what, rank);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "%lld.%09ld\n", (long long)t.tv_sec, t.tv_nsec);
  fclose(f);
}

int mca_pml_base_bsend_init(bool thread_safe) {
  static int (*real)(bool);
  if (!real) real = (int (*)(bool))dlsym(RTLD_NEXT, "mca_pml_base_bsend_init");
  const char *node = getenv("SLURM_NODEID"), *delay = getenv("INIT_BARRIER_DELAY");
  if (node && delay && atoi(node) == 1) {
    sleep((unsigned)atoi(delay));
    note("stalled");
  }
  return real(thread_safe);
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
  static int (*real)(int *, char ***, int, int *);
  if (!real) real = (int (*)(int *, char ***, int, int *))dlsym(RTLD_NEXT, "MPI_Init_thread");
  int rc = real(argc, argv, required, provided);
  note("init_done");
  return rc;
}
