/* Process-wide count of allocated bytes, for CPU memory benchmarks (LD_PRELOAD).
 *
 * Why: RSS counts touched pages, so a buffer DeepSpeed allocates but fills lazily looks free on a CPU,
 * while a GPU's allocator must provide all of it. torch's profiler misses frees made on other threads
 * (ZeRO-3's prefetch). This counts every malloc-family allocation (by its usable size) and every
 * mmap/munmap made through libc's public symbols (tensors memory-mapped from safetensors files, Python
 * arenas), in one atomic counter with its peak. Build and use: framer_ds/lab/alloc_counter.py;
 * framer_ds.engine.metrics reads the peak through the framer_alloc_* symbols.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static int64_t live_bytes, peak_bytes;

static void add(int64_t n) {
  int64_t now = __atomic_add_fetch(&live_bytes, n, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}
static void *track(void *p) { if (p) add((int64_t)malloc_usable_size(p)); return p; }
static void untrack(void *p) { if (p) add(-(int64_t)malloc_usable_size(p)); }

void *malloc(size_t n) { return track(__libc_malloc(n)); }
void *calloc(size_t a, size_t b) { return track(__libc_calloc(a, b)); }
void free(void *p) { untrack(p); __libc_free(p); }
void *realloc(void *p, size_t n) {
  size_t before = p ? malloc_usable_size(p) : 0;
  void *q = __libc_realloc(p, n);
  if (q) { add(-(int64_t)before); add((int64_t)malloc_usable_size(q)); }
  else if (n == 0) add(-(int64_t)before);
  return q;
}
void *memalign(size_t align, size_t n) { return track(__libc_memalign(align, n)); }
void *aligned_alloc(size_t align, size_t n) { return track(__libc_memalign(align, n)); }
void *valloc(size_t n) { return track(__libc_memalign((size_t)sysconf(_SC_PAGESIZE), n)); }
int posix_memalign(void **out, size_t align, size_t n) {
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = track(p);
  return 0;
}
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED) add((int64_t)len);
  return p;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) { return mmap(addr, len, prot, flags, fd, off); }
int munmap(void *addr, size_t len) {
  int rc = (int)syscall(SYS_munmap, addr, len);
  if (rc == 0) add(-(int64_t)len);
  return rc;
}

int64_t framer_alloc_live_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
int64_t framer_alloc_peak_bytes(void) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED); }
void framer_alloc_reset_peak(void) { __atomic_store_n(&peak_bytes, __atomic_load_n(&live_bytes, __ATOMIC_RELAXED), __ATOMIC_RELAXED); }
