/* The atomic accesses of the shared-memory link's rings and doorbell words
 * (asynccomm/transports/_shm_ring.py): sequentially consistent 64-bit loads, stores and
 * compare-and-swaps on a shared mapping, by byte offset, with C11 <stdatomic.h>.
 *
 * Words(buffer) holds the buffer (a writable mmap) until release(); every offset is
 * checked (8-byte aligned, inside the buffer) before it is touched.
 *
 * And the single copy of rendezvous data (asynccomm/transports/shm.py): readv(pid, into,
 * address), which copies from a send buffer in process pid (where ``address`` of
 * _lane_buffers.c found it) into a recv buffer with process_vm_readv (the loop's thread
 * lets go of the GIL); and ``share``, the same copy made by both processes at once, piece
 * by piece, each claiming the next piece from a board in the segment.
 *
 * The module's entry file (_lane.c) adds these to the module (``shm_add``). */
#include "_lane.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base;
    Py_ssize_t len;
    int held;
} Words;

/* The ``n`` words from offset ``arg`` of the mapping (checked: aligned, inside it). */
static _Atomic uint64_t *
words_at(Words *self, PyObject *arg, Py_ssize_t n)
{
    Py_ssize_t off = PyLong_AsSsize_t(arg);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "the mapping was released");
        return NULL;
    }
    if (off < 0 || off > self->len - 8 * n || (off & 7) != 0) {
        PyErr_Format(PyExc_IndexError, "offset %zd is not an aligned word of the mapping",
                     off);
        return NULL;
    }
    return (_Atomic uint64_t *)(self->base + off);
}

static _Atomic uint64_t *
word_at(Words *self, PyObject *arg)
{
    return words_at(self, arg, 1);
}

static PyObject *
Words_load(Words *self, PyObject *arg)
{
    _Atomic uint64_t *w = word_at(self, arg);
    if (w == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(atomic_load_explicit(w, memory_order_seq_cst));
}

static PyObject *
Words_store(Words *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store(offset, value)");
        return NULL;
    }
    _Atomic uint64_t *w = word_at(self, args[0]);
    if (w == NULL)
        return NULL;
    unsigned long long value = PyLong_AsUnsignedLongLong(args[1]);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    atomic_store_explicit(w, (uint64_t)value, memory_order_seq_cst);
    Py_RETURN_NONE;
}

static PyObject *
Words_cas(Words *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "cas(offset, expected, new)");
        return NULL;
    }
    _Atomic uint64_t *w = word_at(self, args[0]);
    if (w == NULL)
        return NULL;
    unsigned long long expected = PyLong_AsUnsignedLongLong(args[1]);
    if (expected == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long desired = PyLong_AsUnsignedLongLong(args[2]);
    if (desired == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    uint64_t e = (uint64_t)expected;
    if (atomic_compare_exchange_strong_explicit(w, &e, (uint64_t)desired,
                                                memory_order_seq_cst, memory_order_seq_cst))
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject *
Words_release(Words *self, PyObject *unused)
{
    if (self->held) {
        self->held = 0;
        PyBuffer_Release(&self->view);
    }
    Py_RETURN_NONE;
}

static int
Words_init(Words *self, PyObject *args, PyObject *kwds)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O:Words", &obj))
        return -1;
    if (self->held) {
        self->held = 0;
        PyBuffer_Release(&self->view);
    }
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return -1;
    if (((uintptr_t)self->view.buf & 7) != 0) {
        PyBuffer_Release(&self->view);
        PyErr_SetString(PyExc_ValueError, "the mapping is not 8-byte aligned");
        return -1;
    }
    self->held = 1;
    self->base = (char *)self->view.buf;
    self->len = self->view.len;
    return 0;
}

static void
Words_dealloc(Words *self)
{
    if (self->held)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Words_methods[] = {
    {"load", (PyCFunction)Words_load, METH_O, "load(offset): the word there."},
    {"store", (PyCFunction)(void (*)(void))Words_store, METH_FASTCALL,
     "store(offset, value)."},
    {"cas", (PyCFunction)(void (*)(void))Words_cas, METH_FASTCALL,
     "cas(offset, expected, new): True if the word was expected and is now new."},
    {"release", (PyCFunction)Words_release, METH_NOARGS, "Let go of the mapping."},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject WordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.Words",
    .tp_basicsize = sizeof(Words),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sequentially consistent 64-bit accesses to a shared mapping, by offset.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Words_init,
    .tp_dealloc = (destructor)Words_dealloc,
    .tp_methods = Words_methods,
};

/* The mapping ``w`` holds and its length (``ShmPath`` reads and writes the rings there);
 * NULL where ``w`` is no ``Words`` or was released (the Python steps run then). */
char *
words_base(PyObject *w, Py_ssize_t *len)
{
    if (Py_TYPE(w) != &WordsType || !((Words *)w)->held) {
        return NULL;
    }
    *len = ((Words *)w)->len;
    return ((Words *)w)->base;
}

static PyObject *
shm_readv(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "readv(pid, into, address)");
        return NULL;
    }
    long pid = PyLong_AsLong(args[0]);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    void *remote = PyLong_AsVoidPtr(args[2]);
    if (remote == NULL && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return NULL;
    struct iovec local = {view.buf, (size_t)view.len};
    struct iovec there = {remote, (size_t)view.len};
    ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = process_vm_readv((pid_t)pid, &local, 1, &there, 1, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromSsize_t(n);
}


/* A shared copy's board (three words of the segment, ``Channels`` sets them): the next
 * piece to claim, the pieces copied, a piece given back (its index + 1; 0: none).  Each
 * word carries the copy's generation in its upper 32 bits, so that a process still busy
 * with an older copy on the same board can neither claim nor count a piece of this one. */
#define GEN_SHIFT 32
#define LOW_MASK 0xFFFFFFFFull

static long long
clock_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Look ``i`` (from 0) of a wait for another process: the core given away first if
 * ``share``, or after 64 looks; 1 once the wait has lasted ``wait_ns`` (``*until``, 0 at
 * the start, is set at the first look). */
int
wait_over(unsigned i, long long *until, long long wait_ns, int share)
{
    if (share || i >= 64) {
        sched_yield();
    }
    if ((i & 63) == 0) {
        long long t = clock_ns();
        if (*until == 0) {
            *until = t + wait_ns;
        } else if (t > *until) {
            return 1;
        }
    }
    return 0;
}

/* Copy piece ``idx`` (``nbytes`` in all, ``piece`` each) between ``local`` here and
 * ``remote`` in ``pid``: into ``local`` (``write`` 0) or out of it.  0, or an errno. */
static int
copy_piece(pid_t pid, char *local, char *remote, size_t nbytes, size_t piece, uint64_t idx,
           int write)
{
    size_t off = (size_t)idx * piece, end = off + piece < nbytes ? off + piece : nbytes;
    while (off < end) {
        struct iovec here = {local + off, end - off}, there = {remote + off, end - off};
        ssize_t n = write ? process_vm_writev(pid, &here, 1, &there, 1, 0)
                          : process_vm_readv(pid, &here, 1, &there, 1, 0);
        if (n <= 0) {
            return n < 0 ? errno : EFAULT;  /* (none copied: the kernel copies all it can) */
        }
        off += (size_t)n;
    }
    return 0;
}

/* One more piece of generation ``gen`` copied (not counted if the board moved on). */
static void
count_piece(_Atomic uint64_t *done, uint64_t gen)
{
    uint64_t v = atomic_load(done);
    while ((v >> GEN_SHIFT) == gen && !atomic_compare_exchange_weak(done, &v, v + 1)) {
    }
}

/* share(words, board, gen, pid, local, remote, nbytes, piece, budget, wait_ns, write)
 *   -> bool: ``Channels``' shared copy (see shm.py, ``SHARE_MIN``). */
static PyObject *
shm_share(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "share(words, board, gen, pid, local, remote, "
                        "nbytes, piece, budget, wait_ns, write)");
        return NULL;
    }
    if (Py_TYPE(args[0]) != &WordsType) {
        PyErr_SetString(PyExc_TypeError, "share: words is a Words");
        return NULL;
    }
    _Atomic uint64_t *claim = words_at((Words *)args[0], args[1], 3);
    if (claim == NULL) {
        return NULL;
    }
    _Atomic uint64_t *done = claim + 1, *back = claim + 2;
    unsigned long long gen = PyLong_AsUnsignedLongLong(args[2]);
    long pid = PyLong_AsLong(args[3]);
    char *local = (char *)PyLong_AsVoidPtr(args[4]);
    char *remote = (char *)PyLong_AsVoidPtr(args[5]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[6]), piece = PyLong_AsSsize_t(args[7]);
    Py_ssize_t budget = PyLong_AsSsize_t(args[8]);
    long long wait_ns = PyLong_AsLongLong(args[9]);
    int write = PyObject_IsTrue(args[10]);
    if (PyErr_Occurred() || write < 0) {
        return NULL;
    }
    if (gen == 0 || gen > LOW_MASK || nbytes <= 0 || piece <= 0
        || (nbytes + piece - 1) / piece > (Py_ssize_t)LOW_MASK) {
        PyErr_SetString(PyExc_ValueError, "share: a generation of 1 to 2**32-1, and nbytes "
                        "and piece above 0");
        return NULL;
    }
    uint64_t pieces = (uint64_t)((nbytes + piece - 1) / piece), g = gen;
    int err = 0, finished = 0;
    uint64_t failed = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t copied = 0;
    for (;;) {  /* claim and copy pieces, up to ``budget`` bytes */
        uint64_t c = atomic_load(claim);
        if ((c >> GEN_SHIFT) != g) {
            finished = 1;  /* (the board moved on: nothing of this copy is left) */
            break;
        }
        uint64_t idx = c & LOW_MASK;
        if (idx >= pieces) {
            finished = 1;
            break;
        }
        if (copied >= budget) {
            break;
        }
        if (!atomic_compare_exchange_weak(claim, &c, c + 1)) {
            continue;
        }
        err = copy_piece((pid_t)pid, local, remote, (size_t)nbytes, (size_t)piece, idx, write);
        if (err) {
            failed = idx + 1;
            break;
        }
        count_piece(done, g);
        copied += piece;
    }
    if (err && write) {  /* the piece is given back: the receiver copies it */
        atomic_store(back, (g << GEN_SHIFT) | failed);
    }
    if (!err && finished && !write) {  /* wait for the helper's pieces (or take them back) */
        long long until = 0;
        finished = 0;
        for (unsigned i = 0;; i++) {
            uint64_t b = atomic_load(back);
            if ((b >> GEN_SHIFT) == g && (b & LOW_MASK)) {
                atomic_store(back, 0);
                err = copy_piece((pid_t)pid, local, remote, (size_t)nbytes, (size_t)piece,
                                 (b & LOW_MASK) - 1, 0);
                if (err) {
                    break;
                }
                count_piece(done, g);
            }
            if (atomic_load(done) == ((g << GEN_SHIFT) | pieces)) {
                finished = 1;
                break;
            }
            if (wait_over(i, &until, wait_ns, 0)) {
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(finished);
}

static PyMethodDef shm_methods[] = {
    {"readv", (PyCFunction)(void (*)(void))shm_readv, METH_FASTCALL,
     "readv(pid, into, address): copy len(into) bytes from process pid's address into "
     "into; the bytes copied (OSError where the kernel refuses)."},
    {"share", (PyCFunction)(void (*)(void))shm_share, METH_FASTCALL,
     "share(words, board, gen, pid, local, remote, nbytes, piece, budget, wait_ns, write): "
     "claim pieces of a shared copy from the board at offset board (generation gen) and "
     "copy them (write: from local here to remote in process pid; else the other way), "
     "up to budget bytes.  The writer: True once no piece is left to claim (a piece it "
     "could not copy is given back, and OSError raised).  The reader: True once every "
     "piece is copied (it takes back a piece given back, and waits up to wait_ns for the "
     "writer's)."},
    {NULL, NULL, 0, NULL}
};

/* Add ``Words`` and ``readv`` to the module ``m`` (its init, _lane.c); -1 on error. */
int
shm_add(PyObject *m)
{
    if (PyType_Ready(&WordsType) < 0 || PyModule_AddFunctions(m, shm_methods) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "Words", (PyObject *)&WordsType);
}
