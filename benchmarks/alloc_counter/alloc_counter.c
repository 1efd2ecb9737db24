/* Process-wide count of allocated bytes, for CPU memory benchmarks (LD_PRELOAD).
 *
 * Why: RSS counts touched pages, so a buffer DeepSpeed allocates but fills lazily looks free on a CPU,
 * while a GPU's allocator must provide all of it. torch's profiler misses frees made on other threads
 * (ZeRO-3's prefetch). This counts every malloc-family allocation (by its usable size) and every
 * mmap/munmap made through libc's public symbols (tensors memory-mapped from safetensors files, Python
 * arenas; not mere address-space reservations), in one atomic counter with its peak. A benchmark tool,
 * not part of the framer_ds package: build and preload it with benchmarks/alloc_counter/alloc_counter.py
 * (README.md beside it); framer_ds/lab/alloc_counter.py reads the framer_alloc_* symbols when a process
 * has them.
 *
 * POSIX shared memory (files on /dev/shm) is counted apart, in framer_alloc_shared_bytes: it is transport
 * between processes, mapped by every process that uses it, so per-rank sums would count its pages once per
 * rank. On a CPU it is DataLoader batches in flight and, under DeepSpeed's own launcher (which sets
 * LOCAL_SIZE), DeepSpeed's shared-memory allreduce workspace (66 MiB per rank, mapped by every rank, used
 * only by inference_all_reduce); on a GPU machine both are host memory, outside
 * torch.cuda.max_memory_allocated.
 *
 * Tensor bytes are counted apart as well (framer_alloc_tensor_*), in their own live/peak pair: what
 * torch.cuda.max_memory_allocated means on a GPU, where Python objects, gloo and DeepSpeed host
 * structures and video decoding never reach the allocator. Two sources:
 * - CPU tensor storage. c10::alloc_cpu (libc10.so) allocates it with posix_memalign, so an allocation is
 *   a tensor's when posix_memalign's return address lies in libc10.so's code. Its free cannot be told
 *   by the caller: DefaultCPUAllocator::ReportAndDelete tail-calls c10::free_cpu, which tail-calls free,
 *   so free's return address is wherever the storage died (libtorch_cpu, libtorch_python, ...). Each
 *   tensor allocation is therefore remembered (address -> requested bytes) and free() looks its pointer
 *   up; a counting filter answers "not a tensor" for nearly every other free without taking the lock.
 *   Counted: the requested bytes (tensor.untyped_storage().nbytes()), as a GPU allocator's caller asks.
 * - Weight files mapped into memory (file-backed mappings of *.safetensors, *.bin, *.pt, *.pth, *.ckpt,
 *   named by /proc/self/fd at mmap time): tensors served from a checkpoint's pages, which a GPU run copies
 *   to the device. They are counted in both pairs.
 * Not seen: tensors whose storage torch did not allocate (torch.from_numpy, torch.frombuffer), oneDNN's
 * scratchpads, shared-memory tensors (counted apart, above). Seen, though a GPU run has no such thing:
 * gloo's staging tensors (all_gather_into_tensor and reduce_scatter_tensor each allocate one the size of
 * the whole gathered or reduced buffer while they run; NCCL works in place).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
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

/* --- tensor bytes -------------------------------------------------------------------------------- */
static int64_t tensor_live, tensor_peak, tensor_untracked;

static void add_tensor(int64_t n) {
  int64_t now = __atomic_add_fetch(&tensor_live, n, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&tensor_peak, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&tensor_peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

/* libc10.so's code, [lo, hi): found on the first posix_memalign called from it, then cached. */
static uintptr_t c10_lo, c10_hi;

static int is_libc10(const char *path) {
  const char *base = strrchr(path, '/');
  return strcmp(base ? base + 1 : path, "libc10.so") == 0;
}

static int find_code(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  uintptr_t want = (uintptr_t)data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && want >= lo && want < lo + ph->p_memsz) {
      __atomic_store_n(&c10_hi, lo + ph->p_memsz, __ATOMIC_RELAXED);
      __atomic_store_n(&c10_lo, lo, __ATOMIC_RELEASE);
      return 1;
    }
  }
  return 0;
}

static int called_from_libc10(uintptr_t caller) {
  uintptr_t lo = __atomic_load_n(&c10_lo, __ATOMIC_ACQUIRE);
  if (lo) return caller >= lo && caller < __atomic_load_n(&c10_hi, __ATOMIC_RELAXED);
  Dl_info info; /* until libc10.so is loaded and has allocated: dladdr, which does not allocate */
  if (!dladdr((void *)caller, &info) || !info.dli_fname || !is_libc10(info.dli_fname)) return 0;
  dl_iterate_phdr(find_code, (void *)caller);
  return 1;
}

/* The live tensor allocations: open addressing with linear probing and backward-shift deletion (no
 * tombstones, so probe chains stay as short as the table is full), under one spin lock; `filter` counts
 * the live entries per hash cell, read without the lock, so a free that is not a tensor's (nearly all)
 * costs one load. A full table leaves an allocation uncounted (framer_alloc_tensor_untracked), never
 * miscounted. */
#define TENSOR_SLOTS (1u << 19)
#define FILTER_CELLS (1u << 21)
static struct { uintptr_t addr; size_t bytes; } tensors[TENSOR_SLOTS];
static uint32_t filter[FILTER_CELLS];
static int tensors_lock, tensors_held;

static void lock_tensors(void) { while (__atomic_exchange_n(&tensors_lock, 1, __ATOMIC_ACQUIRE)) {} }
static void unlock_tensors(void) { __atomic_store_n(&tensors_lock, 0, __ATOMIC_RELEASE); }
static uint64_t mix(uintptr_t addr) { return (uint64_t)(addr >> 4) * 0x9E3779B97F4A7C15ull; }
static size_t home_of(uintptr_t addr) { return (size_t)(mix(addr) >> 40) % TENSOR_SLOTS; }
static uint32_t *cell_of(uintptr_t addr) { return &filter[(size_t)(mix(addr) >> 20) % FILTER_CELLS]; }

static void remember_tensor(uintptr_t addr, size_t bytes) {
  int stored = 0;
  lock_tensors();
  if (tensors_held < (int)(TENSOR_SLOTS - TENSOR_SLOTS / 8)) { /* keep chains short */
    size_t i = home_of(addr);
    while (tensors[i].addr) i = (i + 1) % TENSOR_SLOTS;
    tensors[i].addr = addr;
    tensors[i].bytes = bytes;
    tensors_held++;
    __atomic_add_fetch(cell_of(addr), 1, __ATOMIC_RELAXED);
    stored = 1;
  }
  unlock_tensors();
  if (stored) add_tensor((int64_t)bytes);
  else __atomic_add_fetch(&tensor_untracked, 1, __ATOMIC_RELAXED);
}

static void forget_tensor(uintptr_t addr) {
  if (!__atomic_load_n(cell_of(addr), __ATOMIC_RELAXED)) return;
  size_t bytes = 0;
  lock_tensors();
  size_t i = home_of(addr);
  while (tensors[i].addr && tensors[i].addr != addr) i = (i + 1) % TENSOR_SLOTS;
  if (tensors[i].addr == addr) {
    bytes = tensors[i].bytes;
    tensors_held--;
    __atomic_sub_fetch(cell_of(addr), 1, __ATOMIC_RELAXED);
    /* backward shift: an entry later in the chain moves into the hole when the hole lies between its
     * home and where it is */
    size_t hole = i;
    tensors[hole].addr = 0;
    for (size_t j = (hole + 1) % TENSOR_SLOTS; tensors[j].addr; j = (j + 1) % TENSOR_SLOTS) {
      size_t home = home_of(tensors[j].addr);
      if ((j - home + TENSOR_SLOTS) % TENSOR_SLOTS >= (j - hole + TENSOR_SLOTS) % TENSOR_SLOTS) {
        tensors[hole] = tensors[j];
        tensors[j].addr = 0;
        hole = j;
      }
    }
  }
  unlock_tensors();
  if (bytes) add_tensor(-(int64_t)bytes);
}

void *malloc(size_t n) { return track(__libc_malloc(n)); }
void *calloc(size_t a, size_t b) { return track(__libc_calloc(a, b)); }
void free(void *p) {
  if (p) forget_tensor((uintptr_t)p);
  untrack(p);
  __libc_free(p);
}
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
  if (called_from_libc10((uintptr_t)__builtin_return_address(0))) remember_tensor((uintptr_t)p, n);
  return 0;
}
/* Mappings: counted unless they only reserve address space (PROT_NONE, MAP_NORESERVE: allocators such
 * as mimalloc reserve 1 GiB that way and commit pages as they go). munmap subtracts what was counted for
 * a mapping starting at that address, so unmapping an uncounted reservation changes nothing. */
#define SLOTS 65536
static struct { uintptr_t addr; size_t len; int kind; } slots[SLOTS];
static int64_t shared_bytes;
static int slots_lock;

static void lock(void) { while (__atomic_exchange_n(&slots_lock, 1, __ATOMIC_ACQUIRE)) {} }
static void unlock(void) { __atomic_store_n(&slots_lock, 0, __ATOMIC_RELEASE); }
static size_t slot_of(uintptr_t addr) { return (size_t)((addr >> 12) * 0x9E3779B97F4A7C15ull) % SLOTS; }

/* Call with the lock held; 0 when the table is full (the mapping then stays uncounted, not miscounted). */
static int store(uintptr_t addr, size_t len, int kind) {
  for (size_t i = slot_of(addr), n = 0; n < SLOTS; i = (i + 1) % SLOTS, n++) {
    if (slots[i].addr <= 1) { /* empty or a tombstone (1) left by munmap */
      slots[i].addr = addr;
      slots[i].len = len;
      slots[i].kind = kind;
      return 1;
    }
  }
  return 0;
}

/* What a mapping is: process memory, POSIX shared memory (counted apart) or a weight file's pages
 * (process memory that is also tensor bytes). */
enum { MAPPED_PROCESS, MAPPED_SHARED, MAPPED_WEIGHTS };

static void count(int64_t n, int kind) {
  if (kind == MAPPED_SHARED) {
    __atomic_add_fetch(&shared_bytes, n, __ATOMIC_RELAXED);
    return;
  }
  add(n);
  if (kind == MAPPED_WEIGHTS) add_tensor(n);
}

static void remember(uintptr_t addr, size_t len, int kind) {
  lock();
  int stored = store(addr, len, kind);
  unlock();
  if (stored) count((int64_t)len, kind);
}

static void forget(uintptr_t addr, size_t len) {
  size_t freed = 0;
  int kind = MAPPED_PROCESS;
  lock();
  for (size_t i = slot_of(addr), n = 0; n < SLOTS && slots[i].addr != 0; i = (i + 1) % SLOTS, n++) {
    if (slots[i].addr != addr) continue;
    size_t counted = slots[i].len;
    kind = slots[i].kind;
    slots[i].addr = 1; /* tombstone keeps probe chains intact */
    slots[i].len = 0;
    freed = counted;
    /* A partial unmap leaves the tail mapped: keep counting it, re-keyed on its new start. */
    if (len < counted && store(addr + len, counted - len, kind)) freed = len;
    break;
  }
  unlock();
  count(-(int64_t)freed, kind);
}

/* Whether `fd` is a file on the /dev/shm file system (shm_open, torch's shared tensors). */
static int on_dev_shm(int fd) {
  static dev_t shm_dev;
  static int known; /* 0 unknown, 1 found, -1 no /dev/shm */
  struct stat st;
  if (!known) known = stat("/dev/shm", &st) == 0 ? (shm_dev = st.st_dev, 1) : -1;
  return known == 1 && fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == shm_dev;
}

static int ends_with(const char *s, size_t n, const char *suffix) {
  size_t k = strlen(suffix);
  return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* Whether `fd` is a weight file, by the name /proc/self/fd/<fd> links to (no allocation on this path). */
static int is_weight_file(int fd) {
  char link[32] = "/proc/self/fd/", digits[12], name[4096];
  int n = 0;
  if (fd < 0) return 0;
  do digits[n++] = (char)('0' + fd % 10); while ((fd /= 10) && n < 11);
  size_t at = strlen(link);
  while (n) link[at++] = digits[--n];
  link[at] = 0;
  ssize_t len = readlink(link, name, sizeof name);
  if (len <= 0 || len >= (ssize_t)sizeof name) return 0;
  static const char *const suffixes[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt"};
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++)
    if (ends_with(name, (size_t)len, suffixes[i])) return 1;
  return 0;
}

static int kind_of(int flags, int fd) {
  if (flags & MAP_ANONYMOUS || fd < 0) return MAPPED_PROCESS;
  if (flags & MAP_SHARED && on_dev_shm(fd)) return MAPPED_SHARED;
  return is_weight_file(fd) ? MAPPED_WEIGHTS : MAPPED_PROCESS;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && prot != PROT_NONE && !(flags & MAP_NORESERVE))
    remember((uintptr_t)p, len, kind_of(flags, fd));
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

int64_t framer_alloc_tensor_live_bytes(void) { return __atomic_load_n(&tensor_live, __ATOMIC_RELAXED); }
int64_t framer_alloc_tensor_peak_bytes(void) { return __atomic_load_n(&tensor_peak, __ATOMIC_RELAXED); }
void framer_alloc_tensor_reset_peak(void) { __atomic_store_n(&tensor_peak, __atomic_load_n(&tensor_live, __ATOMIC_RELAXED), __ATOMIC_RELAXED); }
/* Tensor allocations left uncounted because the table was full (0 in every run so far). */
int64_t framer_alloc_tensor_untracked(void) { return __atomic_load_n(&tensor_untracked, __ATOMIC_RELAXED); }

/* fork() while another thread holds a table's lock would leave the child's copy locked forever (a
 * DataLoader worker forks from a process with running threads): hold both across the fork. */
static void hold_locks(void) { lock(); lock_tensors(); }
static void release_locks(void) { unlock_tensors(); unlock(); }
__attribute__((constructor)) static void release_locks_across_fork(void) {
  pthread_atfork(hold_locks, release_locks, release_locks);
}
