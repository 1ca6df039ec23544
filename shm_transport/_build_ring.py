"""cffi (API mode) build of the C ring in csrc/ as the extension module ``shm_transport._ring``.

Run by setuptools through ``cffi_modules`` in setup.py. API mode compiles a real extension, so
every call is a direct C call, and cffi releases the GIL around each one (the default, kept on
purpose: blocking waits must let other Python threads run).
"""
import os

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(__file__))
_CSRC = os.path.join(os.path.dirname(_HERE), "csrc")


def _rel(path):
    """setuptools wants source paths relative to setup.py's folder (the cwd of a build)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


_SOURCES = ("ring.c", "producer.c", "consumer.c", "wake.c")
_HEADERS = ("ring.h", "ring_atomic.h", "ring_internal.h", "ring_wake.h")

CDEF = """
#define RING_HEADER_SIZE 1024
#define RING_MIN_CAPACITY 4096
#define RING_RECORD_HEADER 8
#define RING_VERSION 1
#define RING_REC_MSG 1
#define RING_REC_PAD 2
#define RING_REC_FRAG_FIRST 3
#define RING_REC_FRAG_MORE 4
#define RING_REC_FRAG_LAST 5
#define RING_READY 1
#define RING_WOKEN 2
#define RING_TIMEOUT 0
#define RING_FULL -1
#define RING_CLOSED -2
#define RING_E_CORRUPT -3
#define RING_E_TOO_BIG -4
#define RING_E_MAGIC -5
#define RING_E_VERSION -6
#define RING_E_CAPACITY -7

typedef struct ring_producer ring_producer;
typedef struct ring_consumer ring_consumer;

uint64_t ring_segment_size(uint64_t capacity);
int ring_capacity_ok(uint64_t capacity);
void *ring_map(int fd, uint64_t size, int *err);
int ring_unmap(void *base, uint64_t size);
int ring_init(void *base, uint64_t capacity, uint32_t creator_pid);
int ring_check(const void *base, uint64_t size, uint64_t capacity);
int ring_is_closed(const void *base);
void ring_close(void *base, int data_efd, int space_efd);

ring_producer *ring_producer_new(void *base, int data_efd, int space_efd);
void ring_producer_free(ring_producer *p);
int ring_claim(ring_producer *p, uint32_t length, char **payload);
void ring_commit(ring_producer *p);
int64_t ring_write(ring_producer *p, int prefix, const char *data, uint64_t length, uint64_t done);
int ring_wait_space(ring_producer *p, int64_t spin_ns, int64_t timeout_ns);
int ring_arm_space(ring_producer *p);
void ring_disarm_space(ring_producer *p);
uint64_t ring_free_bytes(ring_producer *p);
void ring_producer_stats(const ring_producer *p, uint64_t out[4]);

ring_consumer *ring_consumer_new(void *base, int data_efd, int space_efd);
void ring_consumer_free(ring_consumer *c);
int ring_read(ring_consumer *c, uint64_t *records, int max_records);
void ring_release(ring_consumer *c);
int ring_next(ring_consumer *c, uint64_t *records, int max_records, int64_t spin_ns, int64_t timeout_ns);
int ring_wait_data(ring_consumer *c, int64_t spin_ns, int64_t timeout_ns);
int ring_arm_data(ring_consumer *c);
void ring_disarm_data(ring_consumer *c);
void ring_kick(ring_consumer *c);
uint64_t ring_used_bytes(ring_consumer *c);
void ring_consumer_stats(const ring_consumer *c, uint64_t out[4]);

int ring_set_pdeathsig(int sig);
int ring_set_child_subreaper(int on);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "shm_transport._ring",
    '#include "ring.h"\n',
    sources=[_rel(os.path.join(_CSRC, name)) for name in _SOURCES],
    include_dirs=[_rel(_CSRC)],
    depends=[_rel(os.path.join(_CSRC, name)) for name in _SOURCES + _HEADERS],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
