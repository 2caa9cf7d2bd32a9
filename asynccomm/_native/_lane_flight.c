/* The flight recorder's ring and tallies in C (see asynccomm/_flight.py): the same
 * entries and totals, without the Python objects each op's record would make.
 *
 * ``Ring(maxlen)`` keeps the last ``maxlen`` entries, as ``deque(maxlen=...)`` does, each
 * stored as numbers: ``append`` takes the entry tuple ``(kind, peer, tag, nbytes, sid, how,
 * t_post, t_match, t_fin)`` and iterating gives such tuples back, oldest first (the times
 * as floats).  ``Tally()`` holds ``n``, ``nbytes`` (ints) and ``w``, ``c`` (floats).  The
 * lane's ``record`` writes both directly (``ring_push``, ``tally_add``).  Where the lane is
 * not built, _flight.py uses a deque and its own Tally, which behave the same.
 */
#include "_lane.h"

#include <stddef.h>

/* -- Ring ---------------------------------------------------------------------------- */

typedef struct {
    long long kind, peer, tag, nbytes, sid, how;
    double t_post, t_match, t_fin;
} Entry;

typedef struct {
    PyObject_HEAD
    Py_ssize_t maxlen;  /* capacity */
    Py_ssize_t len;     /* entries held */
    Py_ssize_t next;    /* where the next one goes */
    Entry *items;
} RingObject;

static PyObject *
ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"maxlen", NULL};
    Py_ssize_t maxlen;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:Ring", kwlist, &maxlen)) {
        return NULL;
    }
    if (maxlen < 0) {
        PyErr_SetString(PyExc_ValueError, "maxlen must be non-negative");
        return NULL;
    }
    RingObject *self = (RingObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->maxlen = maxlen;
    self->items = maxlen ? PyMem_Calloc((size_t)maxlen, sizeof(Entry)) : NULL;
    if (maxlen && self->items == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void
ring_dealloc(RingObject *self)
{
    PyMem_Free(self->items);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

void
ring_push(PyObject *ring, long long kind, long long peer, long long tag, long long nbytes,
          long long sid, long long how, double t_post, double t_match, double t_fin)
{
    RingObject *self = (RingObject *)ring;
    if (self->maxlen == 0) {
        return;
    }
    Entry *e = &self->items[self->next];
    e->kind = kind;
    e->peer = peer;
    e->tag = tag;
    e->nbytes = nbytes;
    e->sid = sid;
    e->how = how;
    e->t_post = t_post;
    e->t_match = t_match;
    e->t_fin = t_fin;
    self->next = (self->next + 1) % self->maxlen;
    if (self->len < self->maxlen) {
        self->len++;
    }
}

/* ring.append(entry): a 9-tuple of six ints and three numbers. */
static PyObject *
ring_append(RingObject *self, PyObject *entry)
{
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 9) {
        PyErr_SetString(PyExc_TypeError, "a flight entry is a tuple of 9 numbers");
        return NULL;
    }
    long long v[6];
    double t[3];
    for (int i = 0; i < 6; i++) {
        v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, i));
        if (v[i] == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    for (int i = 0; i < 3; i++) {
        t[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(entry, 6 + i));
        if (t[i] == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
    }
    ring_push((PyObject *)self, v[0], v[1], v[2], v[3], v[4], v[5], t[0], t[1], t[2]);
    Py_RETURN_NONE;
}

static PyObject *
entry_tuple(const Entry *e)
{
    return Py_BuildValue("(LLLLLLddd)", e->kind, e->peer, e->tag, e->nbytes, e->sid, e->how,
                         e->t_post, e->t_match, e->t_fin);
}

/* The entries as a list of tuples, oldest first. */
static PyObject *
ring_list(RingObject *self)
{
    PyObject *out = PyList_New(self->len);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t first = (self->next - self->len + self->maxlen) % (self->maxlen ? self->maxlen : 1);
    for (Py_ssize_t i = 0; i < self->len; i++) {
        PyObject *t = entry_tuple(&self->items[(first + i) % self->maxlen]);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static PyObject *
ring_iter(RingObject *self)
{
    PyObject *items = ring_list(self);
    if (items == NULL) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(items);
    Py_DECREF(items);
    return it;
}

static Py_ssize_t
ring_len(RingObject *self)
{
    return self->len;
}

static PyObject *
ring_clear(RingObject *self, PyObject *unused)
{
    self->len = 0;
    self->next = 0;
    Py_RETURN_NONE;
}

static PyObject *
ring_maxlen(RingObject *self, void *closure)
{
    return PyLong_FromSsize_t(self->maxlen);
}

static PyMethodDef ring_methods[] = {
    {"append", (PyCFunction)ring_append, METH_O, "append(entry): the newest entry"},
    {"clear", (PyCFunction)ring_clear, METH_NOARGS, "clear(): forget every entry"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_getset[] = {
    {"maxlen", (getter)ring_maxlen, NULL, "the most entries kept", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods ring_as_sequence = {
    .sq_length = (lenfunc)ring_len,
};

PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.Ring",
    .tp_doc = "Ring(maxlen): the last maxlen flight entries, oldest first (as a deque).",
    .tp_basicsize = sizeof(RingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = ring_new,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_iter = (getiterfunc)ring_iter,
    .tp_as_sequence = &ring_as_sequence,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
};

/* -- Tally --------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    long long n, nbytes;
    double w, c;
} TallyObject;

static PyObject *
tally_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Tally() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);  /* zeroed: no ops yet */
}

void
tally_add(PyObject *tally, long long nbytes, double w, double c)
{
    TallyObject *t = (TallyObject *)tally;
    t->n += 1;
    t->nbytes += nbytes;
    t->w += w;
    t->c += c;
}

static PyObject *
tally_repr(TallyObject *self)
{
    PyObject *w = PyFloat_FromDouble(self->w), *c = PyFloat_FromDouble(self->c);
    PyObject *r = w == NULL || c == NULL ? NULL : PyUnicode_FromFormat(
        "Tally(n=%lld, nbytes=%lld, w=%R, c=%R)", self->n, self->nbytes, w, c);
    Py_XDECREF(w);
    Py_XDECREF(c);
    return r;
}

static PyMemberDef tally_members[] = {
    {"n", T_LONGLONG, offsetof(TallyObject, n), 0, "ops"},
    {"nbytes", T_LONGLONG, offsetof(TallyObject, nbytes), 0, "bytes"},
    {"w", T_DOUBLE, offsetof(TallyObject, w), 0, "seconds from post to match"},
    {"c", T_DOUBLE, offsetof(TallyObject, c), 0, "seconds from match to finish"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject TallyCType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.Tally",
    .tp_doc = "Tally(): running totals of one kind of op with one peer (n, nbytes, w, c).",
    .tp_basicsize = sizeof(TallyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = tally_new,
    .tp_repr = (reprfunc)tally_repr,
    .tp_members = tally_members,
};
