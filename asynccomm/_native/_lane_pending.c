/* PendingBuffers: the buffers of a rank's pending recvs, to refuse a recv into memory
 * that another pending recv will write; the C twin of asynccomm/_buffers.py
 * ``PendingBuffers`` (same interface, same answers).
 *
 * Buffers are grouped by the object that owns their memory (an ndarray's ``base`` chain,
 * a memoryview's exporter, followed to the end, as ``memory_owner``): two buffers share
 * memory only if they share an owner.  Each owner's pending buffers are a sorted array
 * of (start, end, request) spans that never overlap: a check is a binary search that
 * looks at the two neighbours, and an add in ascending order (rows posted in order, the
 * common case) an append; a remove from either end (rows finished in order) moves
 * nothing.  Owners and requests are found by identity in two open-addressing tables.
 *
 * The index holds a reference to each pending request (until ``remove``) and none to
 * the buffers or their owners (a request keeps its buffer alive while it is pending).
 *
 * The module's entry file (_lane.c) adds the type to the module (``pending_add``). */
#include "_lane.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    Py_ssize_t start, end;
    PyObject *req; /* borrowed: the reference is the request table's */
} Span;

typedef struct {
    Py_ssize_t lo, hi, cap; /* live spans are e[lo:hi], sorted by start */
    Span *e;
    Span one; /* e == &one while there is room for one span only */
} Group;

/* An open-addressing table keyed by a non-zero pointer (linear probing, removal by
 * backward shift).  The owner table's slot holds its Group (a); the request table's the
 * request's owner (a) and start (b). */
typedef struct {
    uintptr_t key, a;
    Py_ssize_t b;
} Slot;

typedef struct {
    Slot *s;
    size_t mask, used; /* mask + 1 slots (a power of two), or none */
} Table;

typedef struct {
    PyObject_HEAD
    PyObject *address; /* called for each address, or NULL: the buffer's own */
    Table owners, reqs;
} Pending;

/* -- the tables ------------------------------------------------------------------------ */

static size_t
hash_of(uintptr_t key, size_t mask)
{
    return (size_t)(((uint64_t)key >> 4) * 0x9E3779B97F4A7C15ull >> 17) & mask;
}

static Slot *
table_find(Table *t, uintptr_t key)
{
    if (t->s == NULL) {
        return NULL;
    }
    for (size_t i = hash_of(key, t->mask);; i = (i + 1) & t->mask) {
        if (t->s[i].key == key) {
            return &t->s[i];
        }
        if (t->s[i].key == 0) {
            return NULL;
        }
    }
}

static int
table_grow(Table *t)
{
    size_t n = t->s == NULL ? 16 : 2 * (t->mask + 1);
    Slot *s = PyMem_Calloc(n, sizeof(Slot));
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t j = 0; t->s != NULL && j <= t->mask; j++) {
        if (t->s[j].key != 0) {
            size_t i = hash_of(t->s[j].key, n - 1);
            while (s[i].key != 0) {
                i = (i + 1) & (n - 1);
            }
            s[i] = t->s[j];
        }
    }
    PyMem_Free(t->s);
    t->s = s;
    t->mask = n - 1;
    return 0;
}

/* A new slot for key (not in the table), or NULL with an error set. */
static Slot *
table_insert(Table *t, uintptr_t key)
{
    if ((t->s == NULL || 2 * (t->used + 1) > t->mask + 1) && table_grow(t) < 0) {
        return NULL;
    }
    size_t i = hash_of(key, t->mask);
    while (t->s[i].key != 0) {
        i = (i + 1) & t->mask;
    }
    t->used++;
    t->s[i].key = key;
    return &t->s[i];
}

static void
table_delete(Table *t, Slot *slot)
{
    size_t i = (size_t)(slot - t->s);
    t->used--;
    for (size_t j = (i + 1) & t->mask; t->s[j].key != 0; j = (j + 1) & t->mask) {
        size_t home = hash_of(t->s[j].key, t->mask);
        /* move j back into the hole at i unless its home lies cyclically in (i, j] */
        if (((j - home) & t->mask) >= ((j - i) & t->mask)) {
            t->s[i] = t->s[j];
            i = j;
        }
    }
    t->s[i].key = 0;
}

/* -- an owner's spans ------------------------------------------------------------------ */

/* The first live index whose span starts at or after start. */
static Py_ssize_t
lower_bound(Group *g, Py_ssize_t start)
{
    Py_ssize_t lo = g->lo, hi = g->hi;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (g->e[mid].start < start) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static PyObject *
group_conflict(Group *g, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t i = lower_bound(g, start);
    if (i > g->lo && g->e[i - 1].end > start) {
        return g->e[i - 1].req;
    }
    if (i < g->hi && g->e[i].start < end) {
        return g->e[i].req;
    }
    return NULL;
}

static int
group_add(Group *g, Py_ssize_t start, Py_ssize_t end, PyObject *req)
{
    if (g->hi == g->cap) {
        Py_ssize_t live = g->hi - g->lo;
        if (g->lo > 0 && 2 * live <= g->cap) { /* room at the front: slide down */
            memmove(g->e, g->e + g->lo, (size_t)live * sizeof(Span));
        } else {
            Py_ssize_t cap = g->cap < 8 ? 8 : 2 * g->cap;
            Span *e = PyMem_Malloc((size_t)cap * sizeof(Span));
            if (e == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memcpy(e, g->e + g->lo, (size_t)live * sizeof(Span));
            if (g->e != &g->one) {
                PyMem_Free(g->e);
            }
            g->e = e;
            g->cap = cap;
        }
        g->lo = 0;
        g->hi = live;
    }
    Py_ssize_t i = g->hi;
    if (i > g->lo && g->e[i - 1].start > start) { /* out of order: insert */
        i = lower_bound(g, start);
        memmove(g->e + i + 1, g->e + i, (size_t)(g->hi - i) * sizeof(Span));
    }
    g->e[i] = (Span){start, end, req};
    g->hi++;
    return 0;
}

static void
group_remove(Group *g, Py_ssize_t start, PyObject *req)
{
    Py_ssize_t i = lower_bound(g, start);
    while (i < g->hi && g->e[i].req != req) {
        i++;
    }
    if (i == g->hi) {
        return;
    }
    if (i - g->lo < g->hi - 1 - i) { /* nearer the front: move the front up */
        memmove(g->e + g->lo + 1, g->e + g->lo, (size_t)(i - g->lo) * sizeof(Span));
        g->lo++;
    } else {
        memmove(g->e + i, g->e + i + 1, (size_t)(g->hi - 1 - i) * sizeof(Span));
        g->hi--;
    }
}

static void
group_free(Group *g)
{
    if (g->e != &g->one) {
        PyMem_Free(g->e);
    }
    PyMem_Free(g);
}

/* -- buffers --------------------------------------------------------------------------- */

/* The object that owns buf's memory (borrowed), as _buffers.memory_owner; NULL with an
 * error set for a released memoryview. */
static PyObject *
owner_of(PyObject *obj)
{
    for (;;) {
        if (PyArray_Check(obj)) {
            PyObject *base = PyArray_BASE((PyArrayObject *)obj);
            if (base == NULL) {
                return obj;
            }
            obj = base;
        } else if (PyMemoryView_Check(obj)) {
            Py_buffer view; /* a released one refuses: its exporter may be gone */
            if (PyObject_GetBuffer(obj, &view, PyBUF_FULL_RO) < 0) {
                return NULL;
            }
            PyBuffer_Release(&view);
            PyObject *exporter = PyMemoryView_GET_BUFFER(obj)->obj;
            if (exporter == NULL) {
                return obj;
            }
            obj = exporter;
        } else {
            return obj;
        }
    }
}

/* The address of buf's first byte (-1 with an error set). */
static Py_ssize_t
address_of(Pending *self, PyObject *buf)
{
    if (self->address != NULL) {
        PyObject *a = PyObject_CallOneArg(self->address, buf);
        if (a == NULL) {
            return -1;
        }
        Py_ssize_t at = PyLong_AsSsize_t(a);
        Py_DECREF(a);
        return at;
    }
    if (PyArray_Check(buf) && PyArray_IS_C_CONTIGUOUS((PyArrayObject *)buf)) {
        return (Py_ssize_t)PyArray_DATA((PyArrayObject *)buf);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    Py_ssize_t at = (Py_ssize_t)view.buf;
    PyBuffer_Release(&view);
    return at;
}

static int
nbytes_of(PyObject *arg, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(arg);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* -- the type -------------------------------------------------------------------------- */

static int
Pending_init(Pending *self, PyObject *args, PyObject *kwds)
{
    PyObject *address = NULL;
    static char *kwlist[] = {"address", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:PendingBuffers", kwlist, &address)) {
        return -1;
    }
    if (self->reqs.used) {
        PyErr_SetString(PyExc_RuntimeError, "PendingBuffers is initialised once");
        return -1;
    }
    /* the lane's own address is the buffer's: read here, without a call */
    if (address == Py_None || (address != NULL && PyCFunction_Check(address)
                               && PyCFunction_GET_FUNCTION(address)
                                      == (PyCFunction)buffers_address)) {
        address = NULL;
    } else if (address != NULL && !PyCallable_Check(address)) {
        PyErr_Format(PyExc_TypeError, "address must be callable, got %.100s",
                     Py_TYPE(address)->tp_name);
        return -1;
    }
    Py_XINCREF(address);
    Py_XSETREF(self->address, address);
    return 0;
}

/* The request whose pending buffer overlaps the first nbytes of buf, whose memory's
 * owner is ``owner`` (``owner_of``): borrowed (the index holds it), else NULL; -1 with an
 * error set. */
static int
conflict_of(Pending *self, PyObject *buf, PyObject *owner, Py_ssize_t nbytes, PyObject **req)
{
    *req = NULL;
    uintptr_t key = (uintptr_t)owner;
    if (nbytes <= 0 || table_find(&self->owners, key) == NULL) {
        return 0;
    }
    Py_ssize_t start = address_of(self, buf);
    if (start == -1 && PyErr_Occurred()) {
        return -1;
    }
    Slot *slot = table_find(&self->owners, key); /* again: the address may have run Python */
    *req = slot == NULL ? NULL : group_conflict((Group *)slot->a, start, start + nbytes);
    return 0;
}

/* conflict(buf, nbytes): the request whose pending buffer overlaps the first nbytes of
 * buf, or None. */
static PyObject *
Pending_conflict(Pending *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t nbytes;
    PyObject *req;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "conflict(buf, nbytes)");
        return NULL;
    }
    PyObject *owner = owner_of(args[0]);
    if (owner == NULL || nbytes_of(args[1], &nbytes) < 0
        || conflict_of(self, args[0], owner, nbytes, &req) < 0) {
        return NULL;
    }
    return Py_NewRef(req == NULL ? Py_None : req);
}

static void
forget(Pending *self, Slot *where)
{
    Slot *slot = table_find(&self->owners, where->a);
    PyObject *req = (PyObject *)where->key;
    if (slot != NULL) {
        Group *g = (Group *)slot->a;
        group_remove(g, where->b, req);
        if (g->lo == g->hi) {
            table_delete(&self->owners, slot);
            group_free(g);
        }
    }
    table_delete(&self->reqs, where);
    Py_DECREF(req);
}

/* buf's first nbytes are pending, for req (a reference kept until it is removed); its
 * memory's owner is ``owner`` (``owner_of``).  -1 with an error set. */
static int
add_of(Pending *self, PyObject *buf, PyObject *owner, Py_ssize_t nbytes, PyObject *req)
{
    uintptr_t key = (uintptr_t)owner;
    Py_ssize_t start = address_of(self, buf);
    if (start == -1 && PyErr_Occurred()) {
        return -1;
    }
    Slot *old = table_find(&self->reqs, (uintptr_t)req);
    if (old != NULL) { /* added again: where it is now */
        forget(self, old);
    }
    Slot *slot = table_find(&self->owners, key);
    Group *g;
    if (slot != NULL) {
        g = (Group *)slot->a;
    } else {
        g = PyMem_Malloc(sizeof(Group));
        if (g == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        g->lo = g->hi = 0;
        g->cap = 1;
        g->e = &g->one;
        slot = table_insert(&self->owners, key);
        if (slot == NULL) {
            group_free(g);
            return -1;
        }
        slot->a = (uintptr_t)g;
    }
    Slot *where = table_insert(&self->reqs, (uintptr_t)req);
    if (where == NULL || group_add(g, start, start + nbytes, req) < 0) {
        if (where != NULL) {
            table_delete(&self->reqs, where);
        }
        if (g->lo == g->hi) {
            table_delete(&self->owners, table_find(&self->owners, key));
            group_free(g);
        }
        return -1;
    }
    where->a = key;
    where->b = start;
    Py_INCREF(req);
    return 0;
}

/* add(buf, nbytes, req): buf's first nbytes are pending, for req (kept until remove). */
static PyObject *
Pending_add(Pending *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t nbytes;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add(buf, nbytes, req)");
        return NULL;
    }
    PyObject *owner = owner_of(args[0]);
    if (owner == NULL || nbytes_of(args[1], &nbytes) < 0
        || add_of(self, args[0], owner, nbytes, args[2]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* remove(req): req's buffer is no longer pending (nothing if it was not). */
static PyObject *
Pending_remove(Pending *self, PyObject *req)
{
    Slot *where = table_find(&self->reqs, (uintptr_t)req);
    if (where != NULL) {
        forget(self, where); /* its last reference may go: nothing of ours is used after */
    }
    Py_RETURN_NONE;
}

static Py_ssize_t
Pending_len(Pending *self)
{
    return (Py_ssize_t)self->reqs.used;
}

static int
Pending_traverse(Pending *self, visitproc visit, void *arg)
{
    Py_VISIT(self->address);
    for (size_t i = 0; self->reqs.s != NULL && i <= self->reqs.mask; i++) {
        if (self->reqs.s[i].key != 0) {
            Py_VISIT((PyObject *)self->reqs.s[i].key);
        }
    }
    return 0;
}

/* Let everything go: the tables are emptied before any request is released (a
 * request's dealloc may run Python code, which may use this index). */
static int
Pending_clear(Pending *self)
{
    Table owners = self->owners, reqs = self->reqs;
    memset(&self->owners, 0, sizeof(Table));
    memset(&self->reqs, 0, sizeof(Table));
    for (size_t i = 0; owners.s != NULL && i <= owners.mask; i++) {
        if (owners.s[i].key != 0) {
            group_free((Group *)owners.s[i].a);
        }
    }
    PyMem_Free(owners.s);
    for (size_t i = 0; reqs.s != NULL && i <= reqs.mask; i++) {
        if (reqs.s[i].key != 0) {
            Py_DECREF((PyObject *)reqs.s[i].key);
        }
    }
    PyMem_Free(reqs.s);
    Py_CLEAR(self->address);
    return 0;
}

static void
Pending_dealloc(Pending *self)
{
    PyObject_GC_UnTrack(self);
    Pending_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Pending_methods[] = {
    {"conflict", (PyCFunction)(void (*)(void))Pending_conflict, METH_FASTCALL,
     "conflict(buf, nbytes): the request whose pending buffer overlaps the first nbytes "
     "of buf, or None."},
    {"add", (PyCFunction)(void (*)(void))Pending_add, METH_FASTCALL,
     "add(buf, nbytes, req): the first nbytes of buf are pending, for req."},
    {"remove", (PyCFunction)Pending_remove, METH_O,
     "remove(req): req's buffer is no longer pending."},
    {NULL, NULL, 0, NULL}
};

static PySequenceMethods Pending_as_sequence = {
    .sq_length = (lenfunc)Pending_len,
};

static PyTypeObject PendingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.PendingBuffers",
    .tp_basicsize = sizeof(Pending),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The buffers of a rank's pending recvs: PendingBuffers(address=None).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pending_init,
    .tp_dealloc = (destructor)Pending_dealloc,
    .tp_traverse = (traverseproc)Pending_traverse,
    .tp_clear = (inquiry)Pending_clear,
    .tp_methods = Pending_methods,
    .tp_as_sequence = &Pending_as_sequence,
};

/* Add ``PendingBuffers`` to the module ``m`` (its init, _lane.c); -1 on error. */
int
pending_add(PyObject *m)
{
    if (PyType_Ready(&PendingType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "PendingBuffers", (PyObject *)&PendingType);
}

/* -- for the lane's steps (_lane.c, _lane_recv.c, _lane_steps.c) ---------------------- */

/* Whether ``index`` is a PendingBuffers (exactly: the steps then call it without its
 * methods; another index is the Python steps'). */
int
pending_exact(PyObject *index)
{
    return Py_IS_TYPE(index, &PendingType);
}

/* ``index.conflict(buf, nbytes)``, for an exact PendingBuffers: the request (borrowed),
 * or NULL; -1 with an error set. */
int
pending_conflict(PyObject *index, PyObject *buf, Py_ssize_t nbytes, PyObject **req)
{
    PyObject *owner = owner_of(buf);
    return owner == NULL ? -1 : conflict_of((Pending *)index, buf, owner, nbytes, req);
}

/* ``index.add(buf, nbytes, req)``, for an exact PendingBuffers; -1 with an error set. */
int
pending_insert(PyObject *index, PyObject *buf, Py_ssize_t nbytes, PyObject *req)
{
    PyObject *owner = owner_of(buf);
    return owner == NULL ? -1 : add_of((Pending *)index, buf, owner, nbytes, req);
}

/* ``index.remove(req)``, for an exact PendingBuffers (its reference to req goes). */
void
pending_forget(PyObject *index, PyObject *req)
{
    Pending *self = (Pending *)index;
    Slot *where = table_find(&self->reqs, (uintptr_t)req);
    if (where != NULL) {
        forget(self, where);
    }
}
