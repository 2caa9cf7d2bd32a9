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
 * lets go of the GIL).
 *
 * The module's entry file (_lane.c) adds these to the module (``shm_add``). */
#include "_lane.h"

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base;
    Py_ssize_t len;
    int held;
} Words;

static _Atomic uint64_t *
word_at(Words *self, PyObject *arg)
{
    Py_ssize_t off = PyLong_AsSsize_t(arg);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    if (!self->held) {
        PyErr_SetString(PyExc_ValueError, "the mapping was released");
        return NULL;
    }
    if (off < 0 || off > self->len - 8 || (off & 7) != 0) {
        PyErr_Format(PyExc_IndexError, "offset %zd is not an aligned word of the mapping",
                     off);
        return NULL;
    }
    return (_Atomic uint64_t *)(self->base + off);
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

static PyMethodDef shm_methods[] = {
    {"readv", (PyCFunction)(void (*)(void))shm_readv, METH_FASTCALL,
     "readv(pid, into, address): copy len(into) bytes from process pid's address into "
     "into; the bytes copied (OSError where the kernel refuses)."},
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
