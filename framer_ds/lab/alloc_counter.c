/* Process-wide count of allocated bytes, for CPU memory benchmarks (LD_PRELOAD).
 *
 * Why: RSS counts touched pages, so a buffer DeepSpeed allocates but fills lazily looks free on a CPU,
 * while a GPU's allocator must provide all of it. torch's profiler misses frees made on other threads
 * (ZeRO-3's prefetch). This counts every malloc-family allocation (by its usable size) and every
 * mmap/munmap made through libc's public symbols (tensors memory-mapped from safetensors files, Python
 * arenas; not mere address-space reservations), in one atomic counter with its peak. Build and use:
 * framer_ds/lab/alloc_counter.py; framer_ds.engine.metrics reads the peak through the framer_alloc_*
 * symbols.
 *
 * POSIX shared memory (files on /dev/shm) is counted apart, in framer_alloc_shared_bytes: it is transport
 * between processes, mapped by every process that uses it, so per-rank sums would count its pages once per
 * rank. On a CPU it is DataLoader batches in flight and, under DeepSpeed's own launcher (which sets
 * LOCAL_SIZE), DeepSpeed's shared-memory allreduce workspace (66 MiB per rank, mapped by every rank, used
 * only by inference_all_reduce); on a GPU machine both are host memory, outside
 * torch.cuda.max_memory_allocated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
/* Mappings: counted unless they only reserve address space (PROT_NONE, MAP_NORESERVE: allocators such
 * as mimalloc reserve 1 GiB that way and commit pages as they go). munmap subtracts what was counted for
 * a mapping starting at that address, so unmapping an uncounted reservation changes nothing. */
#define SLOTS 65536
static struct { uintptr_t addr; size_t len; int shared; } slots[SLOTS];
static int64_t shared_bytes;
static int slots_lock;

static void lock(void) { while (__atomic_exchange_n(&slots_lock, 1, __ATOMIC_ACQUIRE)) {} }
static void unlock(void) { __atomic_store_n(&slots_lock, 0, __ATOMIC_RELEASE); }
static size_t slot_of(uintptr_t addr) { return (size_t)((addr >> 12) * 0x9E3779B97F4A7C15ull) % SLOTS; }

/* Call with the lock held; 0 when the table is full (the mapping then stays uncounted, not miscounted). */
static int store(uintptr_t addr, size_t len, int shared) {
  for (size_t i = slot_of(addr), n = 0; n < SLOTS; i = (i + 1) % SLOTS, n++) {
    if (slots[i].addr <= 1) { /* empty or a tombstone (1) left by munmap */
      slots[i].addr = addr;
      slots[i].len = len;
      slots[i].shared = shared;
      return 1;
    }
  }
  return 0;
}

static void count(int64_t n, int shared) {
  if (shared) __atomic_add_fetch(&shared_bytes, n, __ATOMIC_RELAXED);
  else add(n);
}

static void remember(uintptr_t addr, size_t len, int shared) {
  lock();
  int stored = store(addr, len, shared);
  unlock();
  if (stored) count((int64_t)len, shared);
}

static void forget(uintptr_t addr, size_t len) {
  size_t freed = 0;
  int shared = 0;
  lock();
  for (size_t i = slot_of(addr), n = 0; n < SLOTS && slots[i].addr != 0; i = (i + 1) % SLOTS, n++) {
    if (slots[i].addr != addr) continue;
    size_t counted = slots[i].len;
    shared = slots[i].shared;
    slots[i].addr = 1; /* tombstone keeps probe chains intact */
    slots[i].len = 0;
    freed = counted;
    /* A partial unmap leaves the tail mapped: keep counting it, re-keyed on its new start. */
    if (len < counted && store(addr + len, counted - len, shared)) freed = len;
    break;
  }
  unlock();
  count(-(int64_t)freed, shared);
}

/* Whether `fd` is a file on the /dev/shm file system (shm_open, torch's shared tensors). */
static int on_dev_shm(int fd) {
  static dev_t shm_dev;
  static int known; /* 0 unknown, 1 found, -1 no /dev/shm */
  struct stat st;
  if (!known) known = stat("/dev/shm", &st) == 0 ? (shm_dev = st.st_dev, 1) : -1;
  return known == 1 && fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == shm_dev;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && prot != PROT_NONE && !(flags & MAP_NORESERVE))
    remember((uintptr_t)p, len, (flags & MAP_SHARED) && on_dev_shm(fd));
  return p;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}
int munmap(void *addr, size_t len) {
  int rc = (int)syscall(SYS_munmap, addr, len);
  if (rc == 0) forget((uintptr_t)addr, len);
  return rc;
}

int64_t framer_alloc_live_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
int64_t framer_alloc_shared_bytes(void) { return __atomic_load_n(&shared_bytes, __ATOMIC_RELAXED); }
int64_t framer_alloc_peak_bytes(void) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED); }
void framer_alloc_reset_peak(void) { __atomic_store_n(&peak_bytes, __atomic_load_n(&live_bytes, __ATOMIC_RELAXED), __ATOMIC_RELAXED); }
