/* The shared-memory link's per-message steps in C: ``ShmPath``, which the world of processes
 * builds for each link where the C lane is built (``ShmTransport.accelerate``).
 *
 * ``send_now`` is ``ShmTransport.send_now`` (the wire's ``eager_header``, then the record
 * put on the destination's ring: ``Ring.put``, and its doorbell rung if the receiver armed
 * it: ``Channels.ring``) with no Python frame; ``put`` is ``Channels._put`` (a control
 * record, such as an offer's ``RTS`` or its answer, put on a ring the same way); ``poll``
 * is ``Channels.poll``: the records of the incoming rings (``Ring.take``), an eager one
 * handed to the receiving engine as ``_mpi_lane``'s ``land_eager`` hands it (into a
 * posted recv, else staged in its pool, else as a ``Message``), a rendezvous fragment
 * copied into its recv (what ``Channels._handle`` does with it), the answer to this
 * rank's offer (``DATA_DONE``) completing its send (``ShmTransport._answered``, with
 * ``_lane_mpi.c``'s rendezvous steps), every other one to
 * ``Channels._handle``; then, if anything waits to go or to be read,
 * ``Channels._poll_rest``.  ``fragments`` is ``Channels._fragments``: a rendezvous payload
 * put on a ring in fragments.  While a payload moves this way both processes copy at once,
 * and each waits a little (``wait_change``) for the other's progress (room freed, the next
 * fragment) rather than turn its loop.  Every send it does not
 * judge (a dtype not seen yet, a buffer that is not one piece, a ring with no room or with
 * control messages queued, a dead peer) goes to the Python ``send_now``.  The state stays
 * where the Python steps keep it (each ring's ``_pos`` and ``_seen``, the words of the
 * segment, the wire's credit lists), so both kinds of step can run in one world.
 *
 * The accesses to the words (``tail``, ``head``, ``want``, the doorbells) are sequentially
 * consistent, as ``Words``' are: the armed-doorbell protocol of ``_shm_ring`` holds as it
 * is. */
#include "_lane.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

/* One ring as this rank sees it: the ``Ring``, its words' and records' offsets. */
typedef struct {
    PyObject *ring;
    Py_ssize_t tail, head, want, data;
    long source;
} RingAt;

typedef struct {
    PyObject_HEAD
    PyObject *link, *channels, *wire, *fields, *names, *inline_where, *words, *view, *procs;
    PyObject *node, *dead, *ctrl, *credit, *owed, *closed_by, *py_send_now, *handle;
    RingAt *out;  /* by destination (``ring`` NULL for this rank) */
    RingAt *in;
    Py_ssize_t n_in, *bells;
    long rank, size, inline_max, return_at;
    unsigned long long ring_bytes, wrap, armed;
    /* Rendezvous fragments (``fragmenting``): their record kind (-1: not set, the Python
     * steps land them), their size, the recvs they land in (``Channels._pulls``), and
     * whether the core is shared (each look for the peer's progress then yields it). */
    PyObject *pulls;
    long data_kind;
    Py_ssize_t fragment;
    int crowded;
    /* The answer to an offer (``answering``): its record kind (-1: not set, the Python
     * steps land it), the state ACTIVE, the channels' offers being copied
     * (``Channels.copying``), the wire's announced sends and the link's (``_sends``). */
    long done_kind;
    PyObject *active, *copying, *announced, *sends;
    /* An offer whose recv is posted is copied in C up to this many bytes (0: none); a
     * larger one is matched in C and its copy handed to ``take`` (``Channels.take``). */
    Py_ssize_t read_chunk;
    PyObject *take;
} ShmPath;

/* A peer that copies fragments at the same time as this process is waited for this long
 * with no progress (a fragment's copy takes a few microseconds) before the loop turns. */
#define PEER_WAIT_NS 20000

/* Wait (at most PEER_WAIT_NS) for the word ``w`` to be other than ``v``; its value.  The
 * core is given away between looks (at once if ``crowded``, else after a few looks): the
 * peer may be waiting for it. */
static uint64_t
wait_change(_Atomic uint64_t *w, uint64_t v, int crowded)
{
    uint64_t now = atomic_load(w);
    long long until = 0;
    for (unsigned i = 0; now == v && !wait_over(i, &until, PEER_WAIT_NS, crowded); i++) {
        now = atomic_load(w);
    }
    return now;
}

static _Atomic uint64_t *
word(char *base, Py_ssize_t off)
{
    return (_Atomic uint64_t *)(base + off);
}

static int
get_pos(PyObject *ring, PyObject *name, unsigned long long *v)
{
    PyObject *o = PyObject_GetAttr(ring, name);
    *v = o == NULL ? (unsigned long long)-1 : PyLong_AsUnsignedLongLong(o);
    Py_XDECREF(o);
    return *v == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

static int
set_pos(PyObject *ring, PyObject *name, unsigned long long v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    int rc = o == NULL ? -1 : PyObject_SetAttr(ring, name, o);
    Py_XDECREF(o);
    return rc;
}

/* ``Channels.ring(dest)``: wake ``dest`` if it armed its doorbell (of several senders,
 * the one whose compare-and-swap clears it). */
static int
ring_bell(ShmPath *p, char *base, long dest)
{
    _Atomic uint64_t *bell = word(base, p->bells[dest]);
    uint64_t armed = p->armed;
    if (!(atomic_load(bell) & armed) || !atomic_compare_exchange_strong(bell, &armed, 0)) {
        return 0;
    }
    PyObject *peer = Py_NewRef(PyList_GET_ITEM(p->procs, dest));
    PyObject *r = PyObject_CallMethodOneArg(p->node, a_wake, peer);
    Py_DECREF(peer);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* -- sending --------------------------------------------------------------------------- */

/* Room for a record of ``n`` bytes on the ring ``r`` (``Ring.put``'s check, ``_seen``
 * loaded again when it says there is none): 1 room (``*tail``, ``*off``, ``*skip``: where
 * it goes), 0 none, -1 error. */
static int
reserve(ShmPath *p, RingAt *r, char *base, unsigned long long n, unsigned long long *tail,
        unsigned long long *off, unsigned long long *skip)
{
    unsigned long long seen;
    if (get_pos(r->ring, a_ring_pos, tail) < 0 || get_pos(r->ring, a_ring_seen, &seen) < 0) {
        return -1;
    }
    unsigned long long rb = p->ring_bytes, need = 8 + ((n + 7) & ~7ULL);
    *off = *tail & (rb - 1);
    *skip = *off + need > rb ? rb - *off : 0;
    if (*tail + *skip + need - seen > rb) {
        seen = atomic_load(word(base, r->head));
        if (set_pos(r->ring, a_ring_seen, seen) < 0) {
            return -1;
        }
        if (*tail + *skip + need - seen > rb) {
            return 0;  /* no room: it queues */
        }
    }
    return 1;
}

/* The record of ``n`` bytes written at ``off`` of ``d``'s ring (``reserve``'s answer):
 * its length stored, its ``tail`` published, its doorbell rung.  -1 error. */
static int
publish(ShmPath *p, long d, char *base, unsigned long long tail, unsigned long long off,
        unsigned long long skip, unsigned long long n)
{
    RingAt *r = &p->out[d];
    unsigned long long end = tail + skip + 8 + ((n + 7) & ~7ULL);
    PyObject *pos = PyLong_FromUnsignedLongLong(end);
    if (pos == NULL) {
        return -1;
    }
    *(uint64_t *)(base + r->data + off) = n;
    atomic_store(word(base, r->tail), end);  /* published */
    int rc = PyObject_SetAttr(r->ring, a_ring_pos, pos);
    Py_DECREF(pos);
    return rc < 0 ? -1 : ring_bell(p, base, d);
}

/* Where a record goes at ``off`` of ring ``r`` (a ``WRAP`` written first if ``skip``). */
static char *
record_at(ShmPath *p, RingAt *r, char *base, unsigned long long *off, unsigned long long skip)
{
    char *data = base + r->data;
    if (skip) {
        *(uint64_t *)(data + *off) = p->wrap;
        *off = 0;
    }
    return data + *off + 8;
}

/* ``send_now``'s send, once judged eager with a dtype of field ``field`` (held): the record
 * on ``d``'s ring, its doorbell rung, the node kicked.  1 sent; 2 not eager now (no
 * credit: False); 0 not judged here (nothing done: the Python steps run); -1 error. */
static int
put_record(ShmPath *p, long d, long t, PyObject *const *args, Py_ssize_t nbytes,
           Py_ssize_t count, PyObject *field)
{
    PyObject *dest = args[0];
    if (p->out[d].ring == NULL) {
        return 0;  /* a rank on no ring here (another host's): the Python steps */
    }
    long long cost = charge(nbytes);
    long long have = PyLong_AsLongLong(PyList_GET_ITEM(p->credit, d));
    if (have == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (have < cost) {
        return 2;
    }
    int dead = PySet_Contains(p->dead, dest);
    Py_ssize_t queued = dead ? 0 : PyObject_Length(PyList_GET_ITEM(p->ctrl, d));
    if (dead < 0 || queued < 0) {
        return -1;
    }
    Py_ssize_t len;
    char *base = words_base(p->words, &len);
    if (dead || queued || base == NULL) {
        return 0;  /* its control messages queue in order, or it is gone */
    }
    RingAt *r = &p->out[d];
    unsigned long long tail, off, skip, n = (unsigned long long)(H_SIZE + nbytes);
    if (8 + ((n + 7) & ~7ULL) > p->ring_bytes / 2) {
        return 0;
    }
    int room = reserve(p, r, base, n, &tail, &off, &skip);
    if (room <= 0) {
        return room;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (view.len != nbytes) {
        PyBuffer_Release(&view);
        return 0;
    }
    if (list_add(p->credit, d, -cost) < 0) {
        PyBuffer_Release(&view);
        return -1;
    }
    frame_eager(record_at(p, r, base, &off, skip), p->rank, t, view.buf, nbytes, count, field);
    PyBuffer_Release(&view);
    if (publish(p, d, base, tail, off, skip, n) < 0) {
        return -1;
    }
    PyObject *k = PyObject_CallMethodNoArgs(p->node, a_kick);
    if (k == NULL) {
        return -1;
    }
    Py_DECREF(k);
    return 1;
}

/* The record of ``n`` bytes at ``raw`` on ``d``'s ring, its doorbell rung: 1 put, 0 no
 * room for it now (nothing written), -1 error. */
static int
put_raw(ShmPath *p, long d, char *base, const void *raw, Py_ssize_t len)
{
    RingAt *r = &p->out[d];
    unsigned long long tail, off, skip, n = (unsigned long long)len;
    int room = reserve(p, r, base, n, &tail, &off, &skip);
    if (room > 0) {
        memcpy(record_at(p, r, base, &off, skip), raw, (size_t)n);
        room = publish(p, d, base, tail, off, skip, n) < 0 ? -1 : 1;
    }
    return room;
}

/* put(dest, raw) -> bool: ``Channels._put``: the record ``raw`` (bytes-like) on ``dest``'s
 * ring and its doorbell rung; False (nothing written) if the ring has no room for it now. */
static PyObject *
shm_put(ShmPath *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put(dest, raw)");
        return NULL;
    }
    long d = PyLong_AsLong(args[0]);
    if (d == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (d < 0 || d >= p->size || d == p->rank || p->out[d].ring == NULL) {
        PyErr_SetString(PyExc_ValueError, "put: dest is another rank on the rings");
        return NULL;
    }
    Py_ssize_t len;
    char *base = words_base(p->words, &len);
    if (base == NULL) {
        PyErr_SetString(PyExc_ValueError, "put: the segment is released");
        return NULL;
    }
    Py_buffer raw;
    if (PyObject_GetBuffer(args[1], &raw, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int room = put_raw(p, d, base, raw.buf, raw.len);
    PyBuffer_Release(&raw);
    return room < 0 ? NULL : PyBool_FromLong(room);
}

/* fragments(dest, view, off, tag) -> int: ``Channels._fragments``: ``view[off:]`` on
 * ``dest``'s ring as data records of ``fragment`` bytes while it has room, waiting for
 * room while the receiver takes them (``wait_change``); the offset reached. */
static PyObject *
shm_fragments(ShmPath *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "fragments(dest, view, off, tag)");
        return NULL;
    }
    long d = PyLong_AsLong(args[0]);
    Py_ssize_t off = PyLong_AsSsize_t(args[2]);
    long t = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (d < 0 || d >= p->size || d == p->rank || p->out[d].ring == NULL || off < 0
        || p->data_kind < 0) {
        PyErr_SetString(PyExc_ValueError, "fragments: dest is another rank on the rings, "
                        "off >= 0, fragmenting() called");
        return NULL;
    }
    Py_ssize_t len;
    char *base = words_base(p->words, &len);
    if (base == NULL) {
        PyErr_SetString(PyExc_ValueError, "fragments: the segment is released");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    RingAt *r = &p->out[d];
    const char *from = view.buf;
    while (off < view.len) {
        Py_ssize_t k = view.len - off < p->fragment ? view.len - off : p->fragment;
        unsigned long long tail, at, skip, n = (unsigned long long)(H_SIZE + k);
        int room = reserve(p, r, base, n, &tail, &at, &skip);
        if (room == 0) {  /* the receiver may be taking them: wait for it a little */
            uint64_t head = atomic_load(word(base, r->head));
            if (wait_change(word(base, r->head), head, p->crowded) == head) {
                break;
            }
            continue;
        }
        if (room < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        char *h = record_at(p, r, base, &at, skip);
        memset(h, 0, (size_t)H_SIZE);
        h[H_KIND] = (char)p->data_kind;
        put_le(h + H_SRC, (unsigned long long)p->rank, 4);
        put_le(h + H_TAG, (unsigned long long)t, 4);
        put_le(h + H_NBYTES, (unsigned long long)k, 8);
        memcpy(h + H_SIZE, from + off, (size_t)k);
        if (publish(p, d, base, tail, at, skip, n) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        off += k;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(off);
}

/* fragmenting(kind, fragment, pulls, crowded): data records of this ``kind`` are
 * rendezvous fragments of at most ``fragment`` bytes, for the recvs ``pulls`` (by
 * (source, data tag)); ``crowded``: the ranks outnumber the cores. */
static PyObject *
shm_fragmenting(ShmPath *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "fragmenting(kind, fragment, pulls: dict, crowded)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    Py_ssize_t fragment = PyLong_AsSsize_t(args[1]);
    int crowded = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || crowded < 0) {
        return NULL;
    }
    unsigned long long most = p->ring_bytes / 2 - 8 - (unsigned long long)H_SIZE;
    if (kind < 0 || kind > 255 || fragment <= 0 || (unsigned long long)fragment > most) {
        PyErr_SetString(PyExc_ValueError, "fragmenting: a kind of one byte, and fragments "
                        "that fit in half a ring");
        return NULL;
    }
    p->data_kind = kind;
    p->fragment = fragment;
    p->crowded = crowded;
    Py_XSETREF(p->pulls, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static PyTypeObject FetchedType;

/* answering(kind, active, read_chunk, take): the answer to this rank's offer, a record of
 * ``kind`` (``DATA_DONE``), lands in C (``active``: the state ACTIVE); and an offer that
 * lands here whose recv is posted is copied in C and answered so, up to ``read_chunk``
 * bytes (``READ_CHUNK``: one turn's copy); a larger one is matched in C, and ``take``
 * (``Channels.take``) copies it, a read per turn, its recv completed in C at the end. */
static PyObject *
shm_answering(ShmPath *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "answering(kind, active, read_chunk, take)");
        return NULL;
    }
    if (!PyCallable_Check(args[3]) || PyType_Ready(&FetchedType) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "answering: take is Channels.take");
        }
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    Py_ssize_t chunk = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *copying = PyObject_GetAttr(p->channels, a_copying);
    PyObject *announced = copying == NULL ? NULL : PyObject_GetAttr(p->wire, a_announced);
    PyObject *sends = announced == NULL ? NULL : PyObject_GetAttr(p->link, a_sends);
    if (sends == NULL || kind < 0 || kind > 255 || !PyDict_CheckExact(copying)
        || !PyDict_CheckExact(announced) || !PyDict_CheckExact(sends)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "answering: a kind of one byte; the channels' "
                            "copying, the wire's announced and the link's sends dicts");
        }
        Py_XDECREF(copying);
        Py_XDECREF(announced);
        Py_XDECREF(sends);
        return NULL;
    }
    p->done_kind = kind;
    p->read_chunk = chunk < 0 ? 0 : chunk;
    Py_XSETREF(p->active, Py_NewRef(args[1]));
    Py_XSETREF(p->take, Py_NewRef(args[3]));
    Py_XSETREF(p->copying, copying);
    Py_XSETREF(p->announced, announced);
    Py_XSETREF(p->sends, sends);
    Py_RETURN_NONE;
}

/* send_now(dest, tag, array, nbytes, count, dtype) -> bool: ``ShmTransport.send_now``. */
static PyObject *
shm_send_now(ShmPath *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "send_now(dest, tag, array, nbytes, count, dtype)");
        return NULL;
    }
    PyObject *field;
    long d, t;
    Py_ssize_t nbytes, count;
    int rc = judge_send(p->link, p->closed_by, p->fields, p->inline_max, p->rank, p->size,
                        args, &d, &t, &nbytes, &count, &field);
    if (rc < 0) {
        return NULL;
    }
    if (rc == 0) {
        Py_RETURN_FALSE;
    }
    if (rc == 2) {
        goto python;
    }
    rc = put_record(p, d, t, args, nbytes, count, field);  /* (``field`` held) */
    Py_DECREF(field);
    if (rc < 0) {
        return NULL;
    }
    if (rc == 0) {
        goto python;
    }
    return PyBool_FromLong(rc == 1);
python:
    return PyObject_Vectorcall(p->py_send_now, args, nargs, NULL);
}

/* -- polling --------------------------------------------------------------------------- */

typedef struct {
    PyObject *view;
    Py_ssize_t start, end;
} Record;

/* The payload of a record (``_Slot.payload``): a view of the segment, valid only while it
 * is handed on (as the Python steps' is). */
static PyObject *
record_payload(void *arg)
{
    Record *rec = arg;
    return PySequence_GetSlice(rec->view, rec->start + H_SIZE, rec->end);
}

/* A rendezvous fragment at ``b`` (``len`` bytes with its header) landed: copied into its
 * recv (``Channels._handle``'s last steps: the recv done once it is all in).  1 landed,
 * 2 landed and its recv wants more, 0 not judged here (``Channels._handle`` takes it),
 * -1 error. */
static int
land_fragment(ShmPath *p, const char *b, Py_ssize_t len)
{
    if (p->pulls == NULL || len < H_SIZE || (unsigned char)b[H_KIND] != p->data_kind) {
        return 0;
    }
    long long nbytes = get_le(b + H_NBYTES, 8);
    if (nbytes < 0 || nbytes > len - H_SIZE) {
        return 0;
    }
    PyObject *key = Py_BuildValue("(LL)", get_le(b + H_SRC, 4), get_le(b + H_TAG, 4));
    PyObject *pull = key == NULL ? NULL : PyDict_GetItemWithError(p->pulls, key);
    if (pull == NULL) {
        Py_XDECREF(key);
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(pull);
    int rc = 0;
    Py_ssize_t off;
    Py_buffer into;
    into.obj = NULL;
    PyObject *v = PyObject_GetAttr(pull, a_pull_view);
    PyObject *o = v == NULL ? NULL : PyObject_GetAttr(pull, a_pull_off);
    if (o == NULL || (off = PyLong_AsSsize_t(o)) < 0) {
        rc = -1;
    } else if (PyObject_GetBuffer(v, &into, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) {
        PyErr_Clear();  /* (its view is not one writable piece: the Python steps) */
        into.obj = NULL;
    } else if (off + nbytes <= into.len) {
        memcpy((char *)into.buf + off, b + H_SIZE, (size_t)nbytes);
        off += (Py_ssize_t)nbytes;
        PyObject *at = PyLong_FromSsize_t(off);
        rc = at == NULL || PyObject_SetAttr(pull, a_pull_off, at) < 0 ? -1 : 2;
        Py_XDECREF(at);
        if (rc > 0 && off >= into.len) {
            rc = 1;
            PyObject *done = PyDict_DelItem(p->pulls, key) < 0 ? NULL
                : PyObject_GetAttr(pull, a_pull_done);
            PyObject *r = done == NULL ? NULL : PyObject_CallNoArgs(done);
            rc = r == NULL ? -1 : 1;
            Py_XDECREF(r);
            Py_XDECREF(done);
        }
    }
    if (into.obj != NULL) {
        PyBuffer_Release(&into);
    }
    Py_XDECREF(o);
    Py_XDECREF(v);
    Py_DECREF(pull);
    Py_DECREF(key);
    return rc;
}

/* The answer to this rank's offer landed at ``b`` (``len`` bytes): ``DATA_DONE`` with the
 * offer's ``ident`` (``Channels._handle``, then ``ShmTransport._answered``: the wire's
 * ``CTS`` steps, the send activated and complete).  1 landed, 0 not judged here (nothing
 * changed: ``Channels._handle`` takes it: a lent buffer's answer, a send being withdrawn,
 * a traced engine's), -1 error. */
static int
land_done(ShmPath *p, const char *b, Py_ssize_t len)
{
    if (p->done_kind < 0 || len < H_SIZE || (unsigned char)b[H_KIND] != p->done_kind) {
        return 0;
    }
    long long id = get_le(b + H_IDENT, 8);
    if (id == 0) {
        return 0;
    }
    PyObject *endpoint = PyObject_GetAttr(p->link, a_endpoint);
    if (endpoint == NULL) {
        return -1;
    }
    PyObject *src = NULL, *ident = NULL, *key = NULL, *sent = NULL;
    int rc = plain_engine(endpoint);
    if (rc <= 0) {
        goto done;
    }
    src = PyLong_FromLongLong(get_le(b + H_SRC, 4));
    ident = PyLong_FromLongLong(id);
    key = src == NULL || ident == NULL ? NULL : PyTuple_Pack(2, src, ident);
    if (key == NULL) {
        rc = -1;
        goto done;
    }
    sent = PyDict_GetItemWithError(p->announced, ident) == NULL ? NULL
        : PyDict_GetItemWithError(p->sends, ident);
    if (sent == NULL || Py_TYPE(sent) != RequestType) {
        sent = NULL;
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    Py_INCREF(sent);
    rc = -1;
    int copying = PyDict_Contains(p->copying, key);
    if (copying < 0 || (copying && PyDict_DelItem(p->copying, key) < 0)
        || PyDict_DelItem(p->announced, ident) < 0
        || PyDict_DelItem(p->sends, ident) < 0
        || activate_send(endpoint, sent, p->active) < 0) {
        goto done;
    }
    rc = send_complete(endpoint, sent, p->active);
    if (rc == 0) {  /* (not on the fast lane: the engine's ``sent``) */
        PyObject *r = PyObject_CallMethodOneArg(endpoint, a_engine_sent, sent);
        rc = r == NULL ? -1 : 1;
        Py_XDECREF(r);
    }
done:
    Py_XDECREF(sent);
    Py_XDECREF(key);
    Py_XDECREF(ident);
    Py_XDECREF(src);
    Py_DECREF(endpoint);
    return rc;
}

/* ``Channels._answer``: the record ``raw`` (bytes) on ``d``'s ring, or queued behind what
 * waits for it (``_ctrl``, ``_blocked``); the node kicked.  -1 error. */
static int
answer(ShmPath *p, long d, PyObject *raw)
{
    PyObject *ctrl = PyList_GET_ITEM(p->ctrl, d);
    Py_ssize_t queued = PyObject_Length(ctrl), len;
    char *base = words_base(p->words, &len);
    int rc = queued < 0 ? -1 : 0;
    if (rc == 0 && queued == 0 && base != NULL) {
        rc = put_raw(p, d, base, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw));
    }
    if (rc == 0) {  /* (no room: it waits for some) */
        PyObject *r = PyObject_CallMethodOneArg(ctrl, a_append, raw);
        PyObject *blocked = r == NULL ? NULL : PyObject_GetAttr(p->channels, a_blocked);
        PyObject *dest = blocked == NULL ? NULL : PyLong_FromLong(d);
        rc = dest == NULL || PySet_Add(blocked, dest) < 0 ? -1 : 1;
        Py_XDECREF(dest);
        Py_XDECREF(blocked);
        Py_XDECREF(r);
    }
    PyObject *k = rc < 0 ? NULL : PyObject_CallMethodNoArgs(p->node, a_kick);
    Py_XDECREF(k);
    return k == NULL ? -1 : 0;
}

/* The pid of the process of rank ``s`` (``Node.pids``), -1 none or error. */
static long
pid_of(ShmPath *p, long s)
{
    PyObject *pids = PyObject_GetAttr(p->node, a_pids);
    PyObject *pid = pids == NULL ? NULL : PyObject_GetItem(pids, PyList_GET_ITEM(p->procs, s));
    long v = pid == NULL ? -1 : PyLong_AsLong(pid);
    Py_XDECREF(pid);
    Py_XDECREF(pids);
    return v;
}

/* ``Fetched``: the ``done`` of a large offer's copy that ``take_offer`` handed to
 * ``Channels.take``: once the copy is all in (``DATA_DONE`` answered), the recv the C
 * steps matched completes (``complete``, as ``land_offer``'s does), unless it failed
 * meanwhile (a dead peer, a broken link).  It holds the recv's array: the copy's view is
 * of its bytes. */
typedef struct {
    PyObject_HEAD
    PyObject *engine, *recv, *array, *source, *tag;
    Py_ssize_t nbytes, count;
} Fetched;

static PyObject *
fetched_call(Fetched *f, PyObject *args, PyObject *kwds)
{
    double when;
    if (SLOT(f->recv, R.state) != S_DONE
        && complete(f->engine, f->recv, f->source, f->tag, f->nbytes, f->count, &when) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static int
fetched_traverse(Fetched *f, visitproc visit, void *arg)
{
    Py_VISIT(f->engine);
    Py_VISIT(f->recv);
    Py_VISIT(f->array);
    Py_VISIT(f->source);
    Py_VISIT(f->tag);
    return 0;
}

static int
fetched_clear(Fetched *f)
{
    Py_CLEAR(f->engine);
    Py_CLEAR(f->recv);
    Py_CLEAR(f->array);
    Py_CLEAR(f->source);
    Py_CLEAR(f->tag);
    return 0;
}

static void
fetched_dealloc(Fetched *f)
{
    PyObject_GC_UnTrack(f);
    fetched_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject FetchedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.Fetched",
    .tp_basicsize = sizeof(Fetched),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A large offer's recv, completed once its copy is in (made by ShmPath).",
    .tp_call = (ternaryfunc)fetched_call,
    .tp_traverse = (traverseproc)fetched_traverse,
    .tp_clear = (inquiry)fetched_clear,
    .tp_dealloc = (destructor)fetched_dealloc,
};

/* An offer of more than one read (``read_chunk``) whose recv ``at`` is posted: the
 * match is the C steps' (``posted_take``: the engine's ``arrived``, ``ShmTransport.fetch``
 * and ``wire.clear_to_send``), the copy ``Channels.take``'s (a read per turn of the loop,
 * then ``DATA_DONE``), with a ``Fetched`` for its ``done``.  1 landed, -1 error. */
static int
take_offer(ShmPath *p, PyObject *endpoint, Posted *at, PyObject *src, PyObject *tag,
           long long id, uint64_t address, Py_ssize_t nbytes, Py_ssize_t count)
{
    if (posted_take(endpoint, at, p->active) < 0) {
        return -1;
    }
    Fetched *f = PyObject_GC_New(Fetched, &FetchedType);
    if (f == NULL) {
        return -1;
    }
    f->engine = Py_NewRef(endpoint);
    f->recv = Py_NewRef(at->recv);
    f->array = Py_NewRef(SLOT(at->recv, R.array));
    f->source = Py_NewRef(src);
    f->tag = Py_NewRef(tag);
    f->nbytes = nbytes;
    f->count = count;
    PyObject_GC_Track(f);
    PyObject *data_tag = PyObject_CallMethodNoArgs(p->wire, a_next_data_tag);
    PyObject *view = data_tag == NULL ? NULL
        : PyMemoryView_FromMemory(at->dst, nbytes, PyBUF_WRITE);
    PyObject *ident = view == NULL ? NULL : PyLong_FromLongLong(id);
    PyObject *where = ident == NULL ? NULL : PyLong_FromUnsignedLongLong(address);
    PyObject *r = NULL;
    if (where != NULL) {
        PyObject *argv[6] = {view, src, ident, where, data_tag, (PyObject *)f};
        r = PyObject_Vectorcall(p->take, argv, 6, NULL);
    }
    Py_XDECREF(r);
    Py_XDECREF(where);
    Py_XDECREF(ident);
    Py_XDECREF(view);
    Py_XDECREF(data_tag);
    Py_DECREF(f);
    return r == NULL ? -1 : 1;
}

/* An offer (an ``RTS`` with its sender's buffer address) landed at ``b`` (``len`` bytes),
 * and a recv is posted for it: ``Channels._handle`` and the engine's ``arrived``
 * (the match), ``ShmTransport.fetch`` and ``Channels.take`` (the single copy, in one piece
 * of at most ``read_chunk`` bytes), ``_read`` (``DATA_DONE`` answered, the recv complete),
 * with no Python frame.  The copy is made before anything changes: where it fails (a
 * refusal, a dead peer) the Python steps take the offer and meet it again.  A larger
 * offer is matched here and copied by ``Channels.take`` (``take_offer``).  1 landed,
 * 0 not judged here (nothing changed), -1 error. */
static int
land_offer(ShmPath *p, const char *b, Py_ssize_t len)
{
    if (p->read_chunk <= 0 || len != H_SIZE + 8 || (unsigned char)b[H_KIND] != RTS) {
        return 0;
    }
    long long nbytes = get_le(b + H_NBYTES, 8), count = get_le(b + H_COUNT, 8);
    long long id = get_le(b + H_IDENT, 8);
    long s = (long)get_le(b + H_SRC, 4), t = (long)get_le(b + H_TAG, 4);
    uint64_t address;
    memcpy(&address, b + H_SIZE, 8);  /* (``OFFER``: little-endian, as this machine) */
    if (nbytes <= 0 || count < 0 || s < 0 || s >= p->size || s == p->rank) {
        return 0;
    }
    PyObject *field = PyBytes_FromStringAndSize(b + H_DTYPE, DTYPE_MAX);
    if (field == NULL) {
        return -1;
    }
    PyObject *endpoint = NULL, *src = NULL, *tag = NULL, *raw = NULL, *r = NULL;
    Posted at = {0};
    /* (copies under way: this one in order, after them; the single copy off; closing) */
    int reading = waiting(p->channels, a_reading);
    int on = reading != 0 ? 0 : waiting(p->node, a_single_copy);
    int closing = on != 1 ? 0 : waiting(p->wire, a_close_sent);
    int rc = reading < 0 || on < 0 || closing < 0 ? -1 : on == 1 && closing == 0;
    if (rc == 1) {
        src = PyLong_FromLong(s);
        int dead = src == NULL ? -1 : PySet_Contains(p->dead, src);
        endpoint = dead != 0 ? NULL : PyObject_GetAttr(p->link, a_endpoint);
        rc = endpoint == NULL ? (dead == 0 || dead < 0 ? -1 : 0) : plain_engine(endpoint);
    }
    PyObject *dtype = rc != 1 ? NULL : PyDict_GetItemWithError(p->names, field);
    if (dtype == NULL || !PyUnicode_CheckExact(dtype)
        || PyUnicode_FindChar(dtype, ';', 0, PyUnicode_GET_LENGTH(dtype), 1) != -1) {
        rc = PyErr_Occurred() ? -1 : 0;  /* (a dtype not seen yet, a shape: Python) */
        goto done;
    }
    long pid = pid_of(p, s);
    tag = pid < 0 ? NULL : PyLong_FromLong(t);
    rc = tag == NULL ? (PyErr_Occurred() ? -1 : 0)
        : posted_find(endpoint, src, tag, dtype, (Py_ssize_t)nbytes, &at);
    if (rc != 1) {
        goto done;
    }
    if (nbytes > p->read_chunk) {  /* (more than one read: a turn of the loop between) */
        rc = take_offer(p, endpoint, &at, src, tag, id, address, (Py_ssize_t)nbytes,
                        (Py_ssize_t)count);
        goto done;
    }
    struct iovec here = {at.dst, (size_t)nbytes}, there = {(void *)(uintptr_t)address,
                                                           (size_t)nbytes};
    if (process_vm_readv((pid_t)pid, &here, 1, &there, 1, 0) != (ssize_t)nbytes) {
        rc = 0;  /* (refused, gone, or short: the Python steps copy, or learn why) */
        goto done;
    }
    rc = -1;
    r = posted_take(endpoint, &at, p->active) < 0 ? NULL
        : PyObject_CallMethodNoArgs(p->wire, a_next_data_tag);  /* (``clear_to_send``) */
    raw = r == NULL ? NULL : PyBytes_FromStringAndSize(NULL, H_SIZE);
    if (raw == NULL) {
        goto done;
    }
    char *h = PyBytes_AS_STRING(raw);
    memset(h, 0, (size_t)H_SIZE);
    h[H_KIND] = (char)p->done_kind;
    put_le(h + H_SRC, (unsigned long long)p->rank, 4);
    put_le(h + H_IDENT, (unsigned long long)id, 8);
    double when;
    if (answer(p, s, raw) == 0
        && complete(endpoint, at.recv, src, tag, (Py_ssize_t)nbytes, (Py_ssize_t)count,
                    &when) == 0) {
        rc = 1;
    }
done:
    posted_clear(&at);
    Py_XDECREF(raw);
    Py_XDECREF(r);
    Py_XDECREF(tag);
    Py_XDECREF(src);
    Py_XDECREF(endpoint);
    Py_DECREF(field);
    return rc;
}

/* Whether ``channels``' (or any object's) attribute ``name`` is true (-1 error). */
int
waiting(PyObject *channels, PyObject *name)
{
    PyObject *o = PyObject_GetAttr(channels, name);
    int rc = o == NULL ? -1 : PyObject_IsTrue(o);
    Py_XDECREF(o);
    return rc;
}

/* The records of ring ``r`` before ``head`` are taken: their room is free (the sender
 * woken if it waits for it).  -1 error. */
static int
free_room(ShmPath *p, RingAt *r, char *base, unsigned long long head)
{
    atomic_store(word(base, r->head), head);
    if (atomic_load(word(base, r->want))) {  /* the sender waits for room */
        atomic_store(word(base, r->want), 0);
        return ring_bell(p, base, r->source);
    }
    return 0;
}

/* Take every record of the ring ``r`` (``Ring.take``, each handed on; while a recv takes
 * fragments, the next is waited for a little); the number taken, -1 error. */
static Py_ssize_t
take_ring(ShmPath *p, RingAt *r, char *base)
{
    uint64_t tail = atomic_load(word(base, r->tail));
    unsigned long long head;
    if (get_pos(r->ring, a_ring_pos, &head) < 0) {
        return -1;
    }
    if (tail == head) {
        return 0;
    }
    Landing l = {p->link, p->wire, p->names, p->owed, p->closed_by, p->inline_where,
                 p->return_at, 1};
    unsigned long long rb = p->ring_bytes;
    Py_ssize_t n = 0;
    while (head != tail) {
        unsigned long long off = head & (rb - 1);
        uint64_t length = *(uint64_t *)(base + r->data + off);
        if (length == p->wrap) {
            head += rb - off;
            continue;
        }
        if (off + 8 + length > rb) {
            PyErr_Format(PyExc_ValueError, "a record of %llu bytes at %llu of a ring",
                         (unsigned long long)length, off);
            return -1;
        }
        Record rec = {p->view, r->data + (Py_ssize_t)off + 8,
                      r->data + (Py_ssize_t)(off + 8 + length)};
        int rc = land_eager(&l, base + rec.start, (Py_ssize_t)length, record_payload, &rec);
        int more = 0;
        if (rc == 0) {
            rc = land_fragment(p, base + rec.start, (Py_ssize_t)length);
            more = rc == 2;
        }
        if (rc == 0) {
            rc = land_done(p, base + rec.start, (Py_ssize_t)length);
        }
        if (rc == 0) {
            rc = land_offer(p, base + rec.start, (Py_ssize_t)length);
        }
        if (rc == 0) {  /* ``Channels._handle`` */
            PyObject *v = PySequence_GetSlice(p->view, rec.start, rec.end);
            PyObject *h = v == NULL ? NULL : PyObject_CallOneArg(p->handle, v);
            rc = h == NULL ? -1 : 1;
            Py_XDECREF(h);
            Py_XDECREF(v);
        }
        if (rc < 0) {
            return -1;
        }
        head += 8 + ((length + 7) & ~7ULL);
        n++;
        if (set_pos(r->ring, a_ring_pos, head) < 0) {
            return -1;
        }
        if (words_base(p->words, &(Py_ssize_t){0}) != base) {
            return n;  /* the segment went while a record was handed on */
        }
        if (more) {  /* its room free at once (the sender waits for it), and if the
                      * sender is copying the next one, that waited for */
            if (free_room(p, r, base, head) < 0) {
                return -1;
            }
            if (head == tail) {
                tail = wait_change(word(base, r->tail), tail, p->crowded);
            }
        }
    }
    return free_room(p, r, base, head) < 0 ? -1 : n;
}

/* ``Channels.poll``: 1 if anything happened, 0 if not, -1 error. */
int
shmpath_poll(PyObject *self)
{
    ShmPath *p = (ShmPath *)self;
    int hit = 0;
    for (Py_ssize_t i = 0; i < p->n_in; i++) {
        Py_ssize_t len;
        char *base = words_base(p->words, &len);
        if (base == NULL) {
            break;  /* closed */
        }
        Py_ssize_t n = take_ring(p, &p->in[i], base);
        if (n < 0) {
            return -1;
        }
        hit |= n > 0;
    }
    int rest = waiting(p->channels, a_local);
    if (rest == 0) {
        rest = waiting(p->channels, a_blocked);
    }
    if (rest == 0) {
        rest = waiting(p->channels, a_reading);
    }
    if (rest == 0) {  /* (``Channels.copying``, held since ``answering``: never replaced) */
        rest = p->copying != NULL ? PyDict_GET_SIZE(p->copying) > 0
            : waiting(p->channels, a_copying);
    }
    if (rest < 0) {
        return -1;
    }
    if (rest) {
        PyObject *r = PyObject_CallMethodNoArgs(p->channels, a_poll_rest);
        rest = r == NULL ? -1 : PyObject_IsTrue(r);
        Py_XDECREF(r);
        if (rest < 0) {
            return -1;
        }
    }
    return hit || rest;
}

/* poll() -> bool: ``Channels.poll``. */
static PyObject *
shm_poll(ShmPath *p, PyObject *unused)
{
    int rc = shmpath_poll((PyObject *)p);
    return rc < 0 ? NULL : PyBool_FromLong(rc);
}

/* -- for the node (``_lane_node.c``) ----------------------------------------------------- */

/* The link and the channels a ``ShmPath`` steps for (borrowed). */
PyObject *
shmpath_link(PyObject *self)
{
    return ((ShmPath *)self)->link;
}

PyObject *
shmpath_channels(PyObject *self)
{
    return ((ShmPath *)self)->channels;
}

/* Whether a record waits: this rank's messages to itself, or a ring whose ``tail`` is not
 * where the receiver is (``Channels``: ``_local or any(ring.ready() ...)``; loads only; a
 * released segment has none).  -1 error. */
int
shmpath_ready(PyObject *self)
{
    ShmPath *p = (ShmPath *)self;
    int local = waiting(p->channels, a_local);
    if (local != 0) {
        return local;
    }
    Py_ssize_t len;
    char *base = words_base(p->words, &len);
    for (Py_ssize_t i = 0; base != NULL && i < p->n_in; i++) {
        unsigned long long pos;
        if (get_pos(p->in[i].ring, a_ring_pos, &pos) < 0) {
            return -1;
        }
        if (atomic_load(word(base, p->in[i].tail)) != pos) {
            return 1;
        }
    }
    return 0;
}

/* ``Channels.arm``: this rank's doorbell armed (a compare-and-swap from 0), then a look
 * again: 1 if something is here, or what waited for room went after all; -1 error. */
int
shmpath_arm(PyObject *self)
{
    ShmPath *p = (ShmPath *)self;
    Py_ssize_t len;
    char *base = words_base(p->words, &len);
    if (base != NULL) {
        uint64_t clear = 0;
        atomic_compare_exchange_strong(word(base, p->bells[p->rank]), &clear, p->armed);
    }
    int rc = shmpath_ready(self);
    if (rc != 0) {
        return rc;
    }
    rc = waiting(p->channels, a_blocked);
    if (rc <= 0) {
        return rc;
    }
    PyObject *r = PyObject_CallMethodNoArgs(p->channels, a_send_waiting);
    rc = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    return rc;
}

/* ``Channels.disarm``: this rank's doorbell cleared. */
void
shmpath_disarm(PyObject *self)
{
    ShmPath *p = (ShmPath *)self;
    Py_ssize_t len;
    char *base = words_base(p->words, &len);
    if (base != NULL) {
        atomic_store(word(base, p->bells[p->rank]), 0);
    }
}

/* -- the type ---------------------------------------------------------------------------- */

static int
offsets(PyObject *item, RingAt *r, int incoming, Py_ssize_t len, unsigned long long rb)
{
    Py_ssize_t v[5];
    PyObject *ring;
    if (incoming ? !PyArg_ParseTuple(item, "lOnnnn", &r->source, &ring, &v[0], &v[1], &v[2],
                                     &v[3])
                 : !PyArg_ParseTuple(item, "Onnnn", &ring, &v[0], &v[1], &v[2], &v[3])) {
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (v[i] < 0 || (v[i] & 7) != 0 || v[i] > len - 8) {
            PyErr_SetString(PyExc_ValueError, "ShmPath: a ring's words are not in the mapping");
            return -1;
        }
    }
    if ((unsigned long long)v[3] + rb > (unsigned long long)len) {
        PyErr_SetString(PyExc_ValueError, "ShmPath: a ring's records are not in the mapping");
        return -1;
    }
    r->ring = Py_NewRef(ring);
    r->tail = v[0];
    r->head = v[1];
    r->want = v[2];
    r->data = v[3];
    return 0;
}

static PyObject *
shmpath_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *link, *channels, *wire, *fields, *names, *inline_where, *words, *view, *procs;
    PyObject *node, *dead, *ctrl, *bells, *outs, *ins;
    unsigned long long rb, wrap, armed;
    static char *kw[] = {"link", "channels", "wire", "fields", "names", "inline", "words",
                         "view", "procs", "node", "dead", "ctrl", "bells", "outs", "ins",
                         "ring_bytes", "wrap", "armed", NULL};
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "OOOO!O!OOOO!OO!O!O!O!O!KKK:ShmPath", kw, &link, &channels, &wire,
            &PyDict_Type, &fields, &PyDict_Type, &names, &inline_where, &words, &view,
            &PyList_Type, &procs, &node, &PySet_Type, &dead, &PyList_Type, &ctrl,
            &PyList_Type, &bells, &PyList_Type, &outs, &PyList_Type, &ins, &rb, &wrap,
            &armed)) {
        return NULL;
    }
    if (!ready) {  /* the names it looks up come with the lane's configuration */
        PyErr_SetString(PyExc_TypeError, "ShmPath: the lane is not configured");
        return NULL;
    }
    Py_ssize_t len, size = PyList_GET_SIZE(procs);
    if (words_base(words, &len) == NULL) {
        PyErr_SetString(PyExc_TypeError, "ShmPath: words is the lane's Words, not released");
        return NULL;
    }
    if (rb == 0 || (rb & (rb - 1)) != 0 || PyList_GET_SIZE(ctrl) != size
        || PyList_GET_SIZE(bells) != size || PyList_GET_SIZE(outs) != size) {
        PyErr_SetString(PyExc_ValueError, "ShmPath: a list per rank, rings of 2**k bytes");
        return NULL;
    }
    ShmPath *p = (ShmPath *)type->tp_alloc(type, 0);
    if (p == NULL) {
        return NULL;
    }
    p->link = Py_NewRef(link);
    p->channels = Py_NewRef(channels);
    p->wire = Py_NewRef(wire);
    p->fields = Py_NewRef(fields);
    p->names = Py_NewRef(names);
    p->inline_where = Py_NewRef(inline_where);
    p->words = Py_NewRef(words);
    p->view = Py_NewRef(view);
    p->procs = Py_NewRef(procs);
    p->node = Py_NewRef(node);
    p->dead = Py_NewRef(dead);
    p->ctrl = Py_NewRef(ctrl);
    p->size = (long)size;
    p->ring_bytes = rb;
    p->wrap = wrap;
    p->armed = armed;
    p->n_in = PyList_GET_SIZE(ins);
    p->data_kind = -1;
    p->done_kind = -1;
    p->out = PyMem_Calloc((size_t)size, sizeof(RingAt));
    p->in = PyMem_Calloc((size_t)p->n_in + 1, sizeof(RingAt));
    p->bells = PyMem_Calloc((size_t)size, sizeof(Py_ssize_t));
    if (p->out == NULL || p->in == NULL || p->bells == NULL) {
        Py_DECREF(p);
        return PyErr_NoMemory();
    }
    p->credit = PyObject_GetAttr(wire, a_credit);
    p->owed = PyObject_GetAttr(wire, a_owed);
    p->closed_by = PyObject_GetAttr(wire, a_closed_by);
    p->py_send_now = PyObject_GetAttr(link, a_send_now);
    p->handle = PyObject_GetAttr(channels, a_handle);
    if (p->credit == NULL || p->owed == NULL || p->closed_by == NULL || p->py_send_now == NULL
        || p->handle == NULL || long_attr(link, a_rank, &p->rank) < 0
        || long_attr(wire, a_inline_max, &p->inline_max) < 0
        || long_attr(wire, a_return_at, &p->return_at) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    if (!PyList_CheckExact(p->credit) || !PyList_CheckExact(p->owed)
        || !PyDict_Check(p->closed_by) || PyList_GET_SIZE(p->credit) != size
        || PyList_GET_SIZE(p->owed) != size || p->rank < 0 || p->rank >= size) {
        PyErr_SetString(PyExc_TypeError, "ShmPath: the wire's credit lists and closed_by dict");
        Py_DECREF(p);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *o = PyList_GET_ITEM(outs, i);
        p->bells[i] = PyLong_AsSsize_t(PyList_GET_ITEM(bells, i));
        /* a rank on no ring of this segment (the hybrid link's peers on other hosts): no
         * ring, and no doorbell (-1) */
        int none = o == Py_None && i != p->rank && p->bells[i] == -1;
        if ((p->bells[i] == -1 && PyErr_Occurred())
            || (o == Py_None) != (i == p->rank || none)
            || (o != Py_None && offsets(o, &p->out[i], 0, len, rb) < 0)) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "ShmPath: a ring to every other rank with a doorbell");
            }
            Py_DECREF(p);
            return NULL;
        }
        if (!none && (p->bells[i] < 0 || (p->bells[i] & 7) != 0 || p->bells[i] > len - 8)) {
            PyErr_SetString(PyExc_ValueError, "ShmPath: a doorbell is not in the mapping");
            Py_DECREF(p);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < p->n_in; i++) {
        if (offsets(PyList_GET_ITEM(ins, i), &p->in[i], 1, len, rb) < 0) {
            Py_DECREF(p);
            return NULL;
        }
        if (p->in[i].source < 0 || p->in[i].source >= size) {
            PyErr_SetString(PyExc_ValueError, "ShmPath: a ring from an unknown rank");
            Py_DECREF(p);
            return NULL;
        }
    }
    return (PyObject *)p;
}

static int
shmpath_traverse(ShmPath *p, visitproc visit, void *arg)
{
    Py_VISIT(p->link);
    Py_VISIT(p->channels);
    Py_VISIT(p->wire);
    Py_VISIT(p->fields);
    Py_VISIT(p->names);
    Py_VISIT(p->inline_where);
    Py_VISIT(p->words);
    Py_VISIT(p->view);
    Py_VISIT(p->procs);
    Py_VISIT(p->node);
    Py_VISIT(p->dead);
    Py_VISIT(p->ctrl);
    Py_VISIT(p->credit);
    Py_VISIT(p->owed);
    Py_VISIT(p->closed_by);
    Py_VISIT(p->py_send_now);
    Py_VISIT(p->handle);
    Py_VISIT(p->pulls);
    Py_VISIT(p->active);
    Py_VISIT(p->take);
    Py_VISIT(p->copying);
    Py_VISIT(p->announced);
    Py_VISIT(p->sends);
    for (Py_ssize_t i = 0; p->out != NULL && i < p->size; i++) {
        Py_VISIT(p->out[i].ring);
    }
    for (Py_ssize_t i = 0; p->in != NULL && i < p->n_in; i++) {
        Py_VISIT(p->in[i].ring);
    }
    return 0;
}

static int
shmpath_clear(ShmPath *p)
{
    Py_CLEAR(p->link);
    Py_CLEAR(p->channels);
    Py_CLEAR(p->wire);
    Py_CLEAR(p->fields);
    Py_CLEAR(p->names);
    Py_CLEAR(p->inline_where);
    Py_CLEAR(p->words);
    Py_CLEAR(p->view);
    Py_CLEAR(p->procs);
    Py_CLEAR(p->node);
    Py_CLEAR(p->dead);
    Py_CLEAR(p->ctrl);
    Py_CLEAR(p->credit);
    Py_CLEAR(p->owed);
    Py_CLEAR(p->closed_by);
    Py_CLEAR(p->py_send_now);
    Py_CLEAR(p->handle);
    Py_CLEAR(p->pulls);
    Py_CLEAR(p->active);
    Py_CLEAR(p->take);
    Py_CLEAR(p->copying);
    Py_CLEAR(p->announced);
    Py_CLEAR(p->sends);
    for (Py_ssize_t i = 0; p->out != NULL && i < p->size; i++) {
        Py_CLEAR(p->out[i].ring);
    }
    for (Py_ssize_t i = 0; p->in != NULL && i < p->n_in; i++) {
        Py_CLEAR(p->in[i].ring);
    }
    return 0;
}

static void
shmpath_dealloc(ShmPath *p)
{
    PyObject_GC_UnTrack(p);
    shmpath_clear(p);
    PyMem_Free(p->out);
    PyMem_Free(p->in);
    PyMem_Free(p->bells);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef shmpath_methods[] = {
    {"send_now", (PyCFunction)(void (*)(void))shm_send_now, METH_FASTCALL,
     "send_now(dest, tag, array, nbytes, count, dtype) -> bool: ShmTransport.send_now"},
    {"put", (PyCFunction)(void (*)(void))shm_put, METH_FASTCALL,
     "put(dest, raw) -> bool: a control record on dest's ring, its doorbell rung "
     "(Channels._put)"},
    {"fragments", (PyCFunction)(void (*)(void))shm_fragments, METH_FASTCALL,
     "fragments(dest, view, off, tag) -> int: view[off:] on dest's ring as data records "
     "while it has room (Channels._fragments); the offset reached"},
    {"fragmenting", (PyCFunction)(void (*)(void))shm_fragmenting, METH_FASTCALL,
     "fragmenting(kind, fragment, pulls, crowded): how rendezvous fragments go and land"},
    {"answering", (PyCFunction)(void (*)(void))shm_answering, METH_FASTCALL,
     "answering(kind, active, read_chunk, take): the answer to this rank's offer "
     "(DATA_DONE) lands in C, and an offer whose recv is posted is copied and answered in "
     "C (a larger one than read_chunk matched in C and handed to take)"},
    {"poll", (PyCFunction)shm_poll, METH_NOARGS,
     "poll() -> bool: take every record that arrived, and the rest (Channels.poll)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ShmPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.ShmPath",
    .tp_basicsize = sizeof(ShmPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ShmPath(link, channels, wire, fields, names, inline, words, view, procs, node, "
              "dead, ctrl, bells, outs, ins, ring_bytes, wrap, armed): the shared-memory "
              "link's per-message steps in C.",
    .tp_new = shmpath_new,
    .tp_traverse = (traverseproc)shmpath_traverse,
    .tp_clear = (inquiry)shmpath_clear,
    .tp_dealloc = (destructor)shmpath_dealloc,
    .tp_methods = shmpath_methods,
};
