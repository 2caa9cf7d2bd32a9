/* The MPI link's per-message steps in C: ``Path``, which the MPI world builds for each link
 * where the C lane is built (``MPITransport.accelerate``).
 *
 * ``send_now`` is ``MPITransport.send_now`` (the wire's ``eager_header``, then
 * ``Progress.send`` and ``Progress.deliver``) with no Python frame; ``land`` and
 * ``deliver`` are ``Progress``'s loop over the control recvs that landed, where an eager
 * message is handed to the receiving engine as ``MPITransport._on_control`` hands it: the
 * lane's ``offer`` copies it into a posted recv, or it arrives as a ``Message``.  Every
 * other control message, and every eager one this file does not judge (a closed engine, a
 * shape, a dtype not seen yet, a traced engine, a large payload), goes to the link's
 * Python ``_on_control``; every send it does not judge (a dtype not seen yet, a buffer
 * that is not one piece) to the Python ``send_now``.  The state stays where the Python
 * steps keep it (the wire's credit lists, the progress task's flags), so both kinds of
 * step can run in one world.
 *
 * The wire's header is ``wire.HEADER``, written and read here field by field,
 * little-endian, at the offsets ``configure`` was given (``native.NUMBERS``: H_SIZE, H_SRC,
 * ...); the field widths are those of the format ``native.HEADER_FIELDS`` declares. */
#include "_lane.h"

typedef struct {
    PyObject_HEAD
    PyObject *link, *progress, *wire, *slots, *credit, *owed, *closed_by, *fields, *names;
    PyObject *mpi_exc, *inline_where, *py_send_now, *on_control;
    long rank, inline_max, return_at, ctrl_slots;
} Path;

static void
put_le(char *at, unsigned long long v, int n)
{
    for (int i = 0; i < n; i++) {
        at[i] = (char)(v >> (8 * i));
    }
}

static long long
get_le(const char *at, int n)
{
    unsigned long long v = 0;
    for (int i = 0; i < n; i++) {
        v |= (unsigned long long)(unsigned char)at[i] << (8 * i);
    }
    return n == 4 ? (long long)(int)(unsigned int)v : (long long)v;
}

/* list[i] += delta, for the wire's credit lists (ints). */
int
list_add(PyObject *list, Py_ssize_t i, long long delta)
{
    long long v = PyLong_AsLongLong(PyList_GET_ITEM(list, i));
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *n = PyLong_FromLongLong(v + delta);
    return n == NULL ? -1 : PyList_SetItem(list, i, n);
}

static int
set_flag(PyObject *o, PyObject *name, int value)
{
    return PyObject_SetAttr(o, name, value ? Py_True : Py_False);
}

/* Write an eager message at ``h``: the header (``wire.eager_header``'s: from ``rank``, on
 * ``tag``, the dtype's field ``field``, a bytes of at most DTYPE_MAX), then the payload
 * (``nbytes`` at ``data``); H_SIZE + nbytes bytes in all. */
void
frame_eager(char *h, long rank, long tag, const void *data, Py_ssize_t nbytes,
            Py_ssize_t count, PyObject *field)
{
    memset(h, 0, H_SIZE);
    Py_ssize_t flen = PyBytes_GET_SIZE(field);
    h[H_KIND] = (char)EAGER;
    h[H_DLEN] = (char)flen;
    put_le(h + H_SRC, (unsigned long long)rank, 4);
    put_le(h + H_TAG, (unsigned long long)tag, 4);
    put_le(h + H_NBYTES, (unsigned long long)nbytes, 8);
    put_le(h + H_COUNT, (unsigned long long)count, 8);
    memcpy(h + H_DTYPE, PyBytes_AS_STRING(field), flen);
    memcpy(h + H_SIZE, data, nbytes);
}

/* -- receiving ------------------------------------------------------------------------- */

/* An eager message landed at ``b`` (its header, then ``len - H_SIZE`` bytes of payload),
 * for the link ``l->link``: hand it to the engine as ``_on_control`` does (the shared-memory
 * link's ``ShmPath`` lands its records here too).  ``payload(arg)`` makes the payload's
 * view, only where it arrives as a ``Message``.  1 done, 0 not judged here (nothing done:
 * ``_on_control`` runs), -1 error. */
int
land_eager(const Landing *l, const char *b, Py_ssize_t len, PyObject *(*payload)(void *),
           void *arg)
{
    if (!ready || len < H_SIZE || b[H_KIND] != EAGER) {
        return 0;
    }
    Py_ssize_t nbytes = (Py_ssize_t)get_le(b + H_NBYTES, 8);
    Py_ssize_t count = (Py_ssize_t)get_le(b + H_COUNT, 8);
    if (nbytes < 0 || count < 0 || nbytes >= TIMED_COPY_MIN || nbytes > len - H_SIZE) {
        return 0;
    }
    PyObject *endpoint = PyObject_GetAttr(l->link, a_endpoint);
    if (endpoint == NULL) {
        return -1;
    }
    int rc = 0;
    PyObject *field = NULL, *dtype = NULL, *src = NULL, *tag = NULL, *nb = NULL;
    PyObject *cnt = NULL, *closed = NULL, *out = NULL;
    if (Py_TYPE(endpoint) != DeviceEngineType || SLOT(endpoint, EN.tracer) != Py_None) {
        goto done;  /* traced: the Python steps number what arrives */
    }
    closed = PyObject_GetAttr(endpoint, a_closed);
    if (closed == NULL || (rc = PyObject_IsTrue(closed)) != 0) {
        rc = closed == NULL || rc < 0 ? -1 : 0;  /* closed: the Python steps drop it */
        goto done;
    }
    field = PyBytes_FromStringAndSize(b + H_DTYPE, DTYPE_MAX);
    if (field == NULL) {
        rc = -1;
        goto done;
    }
    dtype = PyDict_GetItemWithError(l->names, field);
    if (dtype == NULL || !PyUnicode_CheckExact(dtype)
        || PyUnicode_FindChar(dtype, ';', 0, PyUnicode_GET_LENGTH(dtype), 1) != -1) {
        dtype = NULL;
        rc = PyErr_Occurred() ? -1 : 0;  /* new, or with a shape: the Python steps */
        goto done;
    }
    Py_INCREF(dtype);
    src = PyLong_FromLongLong(get_le(b + H_SRC, 4));
    tag = PyLong_FromLongLong(get_le(b + H_TAG, 4));
    if (src == NULL || tag == NULL) {
        rc = -1;
        goto done;
    }
    double when;
    int r = offer(endpoint, src, tag, (char *)b + H_SIZE, nbytes, count, dtype, NULL, 0, &when);
    if (r <= 0) {
        rc = r;  /* 0: the Python steps judge */
        goto done;
    }
    rc = 1;
    if (r == 1) {  /* taken: its charge is owed back (``wire.consumed``) */
        long s = PyLong_AsLong(src);
        if (s < 0 || s >= PyList_GET_SIZE(l->owed)) {
            PyErr_Format(PyExc_ValueError, "eager message from unknown rank %ld", s);
            rc = -1;
            goto done;
        }
        long long owed = PyLong_AsLongLong(PyList_GET_ITEM(l->owed, s));
        int gone = PyDict_Contains(l->closed_by, src);
        if ((owed == -1 && PyErr_Occurred()) || gone < 0) {
            rc = -1;
            goto done;
        }
        owed += charge(nbytes);
        if (owed < l->return_at || gone) {
            PyObject *v = PyLong_FromLongLong(owed);
            rc = v == NULL || PyList_SetItem(l->owed, s, v) < 0 ? -1 : 1;
            goto done;
        }
        nb = PyLong_FromSsize_t(nbytes);  /* a CREDIT is due: the wire makes it */
        out = nb == NULL ? NULL : PyObject_CallMethodObjArgs(l->wire, a_consumed, src, nb, NULL);
        if (out != NULL && out != Py_None) {
            PyObject *sent = PyObject_CallMethodObjArgs(l->link, a_send_ctl, src, out, NULL);
            Py_XDECREF(sent);
            rc = sent == NULL ? -1 : 1;
        }
        else if (out == NULL) {
            rc = -1;
        }
        goto done;
    }
    /* No recv is posted that could take it: it arrives as a message. */
    PyObject *view = payload(arg);
    nb = PyLong_FromSsize_t(nbytes);
    cnt = PyLong_FromSsize_t(count);
    if (view != NULL && nb != NULL && cnt != NULL) {
        PyObject *argv[7] = {src, tag, nb, cnt, dtype, l->inline_where, view};
        PyObject *msg = PyObject_Vectorcall((PyObject *)MessageType, argv, 7, NULL);
        out = msg == NULL ? NULL : PyObject_CallMethodOneArg(endpoint, a_arrived, msg);
        Py_XDECREF(msg);
    }
    Py_XDECREF(view);
    rc = out == NULL ? -1 : 1;
done:
    Py_XDECREF(out);
    Py_XDECREF(closed);
    Py_XDECREF(field);
    Py_XDECREF(dtype);
    Py_XDECREF(src);
    Py_XDECREF(tag);
    Py_XDECREF(nb);
    Py_XDECREF(cnt);
    Py_DECREF(endpoint);
    return rc;
}

static PyObject *
slot_payload(void *head)
{
    return PyObject_GetAttr((PyObject *)head, a_payload);
}

/* An eager message landed in ``head`` (its buffer ``buf``): ``land_eager``. */
static int
dispatch(Path *p, PyObject *head, PyObject *buf)
{
    Landing l = {p->link, p->wire, p->names, p->owed, p->closed_by, p->inline_where,
                 p->return_at};
    return land_eager(&l, PyByteArray_AS_STRING(buf), PyByteArray_GET_SIZE(buf),
                      slot_payload, head);
}

/* Hand the control messages that landed to the link, head first, reposting each slot at
 * the back (``Progress._dispatch``); with ``eager_only``, stop at the first that is not
 * eager.  1 if any landed, 0 if none, -1 error. */
static int
land(Path *p, int eager_only)
{
    int hit = 0;
    for (;;) {
        PyObject *head = PySequence_GetItem(p->slots, 0);
        PyObject *req = head == NULL ? NULL : PyObject_GetAttr(head, a_req);
        PyObject *t = req == NULL ? NULL : PyObject_CallMethodNoArgs(req, a_Test);
        int done = t == NULL ? -1 : PyObject_IsTrue(t);
        Py_XDECREF(t);
        PyObject *buf = done > 0 ? PyObject_GetAttr(head, a_buf) : NULL;
        if (done > 0 && (buf == NULL || !PyByteArray_Check(buf))) {
            if (buf != NULL) {
                PyErr_SetString(PyExc_TypeError, "a control slot's buffer is a bytearray");
            }
            done = -1;
        }
        if (done > 0 && eager_only && PyByteArray_AS_STRING(buf)[H_KIND] != EAGER) {
            done = 0;  /* left for the task */
        }
        int rc = done;
        if (done > 0) {
            hit = 1;
            rc = set_flag(p->progress, a_dispatching, 1);
            if (rc == 0) {
                rc = dispatch(p, head, buf);
                if (rc == 0) {
                    PyObject *r = PyObject_CallOneArg(p->on_control, head);
                    rc = r == NULL ? -1 : 1;
                    Py_XDECREF(r);
                }
                PyObject *et, *ev, *tb;  /* finally: the flag drops, errors or not */
                PyErr_Fetch(&et, &ev, &tb);
                if (set_flag(p->progress, a_dispatching, 0) < 0) {
                    rc = -1;
                    Py_XDECREF(et);
                    Py_XDECREF(ev);
                    Py_XDECREF(tb);
                }
                else {
                    PyErr_Restore(et, ev, tb);
                }
            }
            if (rc > 0) {
                PyObject *s = PyObject_CallMethodNoArgs(req, a_Start);
                PyObject *r = s == NULL ? NULL
                    : PyObject_CallMethodOneArg(p->slots, a_rotate, minus_one);
                rc = r == NULL ? -1 : 1;
                Py_XDECREF(s);
                Py_XDECREF(r);
            }
        }
        Py_XDECREF(buf);
        Py_XDECREF(req);
        Py_XDECREF(head);
        if (rc <= 0) {
            return rc < 0 ? -1 : hit;
        }
    }
}

/* ``Progress.deliver``: the eager messages that already landed, now; an error fails the
 * link (``Progress._failed``). */
static int
deliver(Path *p)
{
    PyObject *v = PyObject_GetAttr(p->progress, a_dispatching);
    int busy = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    if (busy == 0) {
        v = PyObject_GetAttr(p->progress, a_stopped);
        busy = v == NULL ? -1 : PyObject_IsTrue(v);
        Py_XDECREF(v);
    }
    if (busy != 0) {
        return busy < 0 ? -1 : 0;
    }
    if (land(p, 1) >= 0) {
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb != NULL && ev != NULL) {
        PyException_SetTraceback(ev, tb);
    }
    PyObject *r = PyObject_CallMethodOneArg(p->progress, a_failed, ev);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *
path_land(Path *p, PyObject *unused)
{
    int r = land(p, 0);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
path_deliver(Path *p, PyObject *unused)
{
    if (deliver(p) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- sending --------------------------------------------------------------------------- */

/* What ``Progress.send`` does once MPI has the message: keep an unfinished send, ring the
 * receiver's doorbell if it dozes, and wake this rank's progress task. */
static int
after_isend(Path *p, PyObject *req, long dest)
{
    PyObject *t = PyObject_CallMethodNoArgs(req, a_Test);
    int done = t == NULL ? -1 : PyObject_IsTrue(t);
    Py_XDECREF(t);
    if (done < 0) {
        return -1;
    }
    if (!done) {
        PyObject *ctrl = PyObject_GetAttr(p->progress, a_ctrl);  /* _reap replaces it */
        int rc = ctrl == NULL || !PyList_Check(ctrl) ? -1 : PyList_Append(ctrl, req);
        Py_ssize_t n = rc < 0 ? 0 : PyList_GET_SIZE(ctrl);
        Py_XDECREF(ctrl);
        if (rc < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "Progress._ctrl is a list");
            }
            return -1;
        }
        if (n >= p->ctrl_slots) {
            PyObject *r = PyObject_CallMethodNoArgs(p->progress, a_reap);
            Py_XDECREF(r);
            if (r == NULL) {
                return -1;
            }
        }
    }
    PyObject *bells = PyObject_GetAttr(p->progress, a_bells);
    if (bells == NULL) {
        return -1;
    }
    if (bells != Py_None) {
        PyObject *bell = PySequence_GetItem(bells, dest);
        PyObject *flag = bell == NULL || bell == Py_None ? NULL : PyObject_GetAttr(bell, a_flag);
        /* flag[0] as Python reads it: an mmap's sequence item is a byte string */
        PyObject *up = flag == NULL ? NULL : PyObject_GetItem(flag, zero);
        int rings = up == NULL ? 0 : PyObject_IsTrue(up);
        PyObject *r = rings > 0 ? PyObject_CallMethodNoArgs(bell, a_ring) : NULL;
        int failed = bell == NULL || (bell != Py_None && (up == NULL || rings < 0))
            || (rings > 0 && r == NULL);
        Py_XDECREF(r);
        Py_XDECREF(up);
        Py_XDECREF(flag);
        Py_XDECREF(bell);
        if (failed) {
            Py_DECREF(bells);
            return -1;
        }
    }
    Py_DECREF(bells);
    if (set_flag(p->progress, a_sent, 1) < 0) {
        return -1;
    }
    PyObject *parked = PyObject_GetAttr(p->progress, a_parked);
    if (parked == NULL) {
        return -1;
    }
    int rc = 0;
    if (parked != Py_None) {
        PyObject *d = PyObject_CallMethodNoArgs(parked, a_done);
        int finished = d == NULL ? -1 : PyObject_IsTrue(d);
        Py_XDECREF(d);
        if (finished == 0) {
            PyObject *r = set_flag(p->progress, a_woke, 1) < 0 ? NULL
                : PyObject_CallMethodOneArg(parked, a_set_result, Py_None);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        else if (finished < 0) {
            rc = -1;
        }
    }
    Py_DECREF(parked);
    return rc;
}

/* ``send_now(dest, tag, array, nbytes, count, dtype)``'s arguments judged as the link's
 * ``send_now`` and the wire's ``eager_header`` judge them, for a link of ``size`` ranks
 * (``self``: this rank, which sends to itself the Python way; -1: any rank may be a
 * destination): 1 eager, with ``*field`` the dtype's field (a new reference); 0 not eager
 * (the link broke, ``dest`` closed, too large: False); 2 not judged here (a dtype not seen
 * yet, numbers out of range: the Python steps); -1 error.  The credit is the caller's. */
int
judge_send(PyObject *link, PyObject *closed_by, PyObject *fields, long inline_max, long self,
           Py_ssize_t size, PyObject *const *args, long *d, long *t, Py_ssize_t *nbytes,
           Py_ssize_t *count, PyObject **field)
{
    *d = PyLong_AsLong(args[0]);
    *t = PyLong_AsLong(args[1]);
    *nbytes = PyLong_AsSsize_t(args[3]);
    *count = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (!ready || *d < 0 || *d >= size || *d == self || *t < INT32_MIN || *t > INT32_MAX
        || *nbytes < 0) {
        return 2;
    }
    PyObject *broken = PyObject_GetAttr(link, a_link_broken);
    if (broken == NULL) {
        return -1;
    }
    int no = broken != Py_None;
    Py_DECREF(broken);
    if (!no && (no = PyDict_Contains(closed_by, args[0])) < 0) {
        return -1;
    }
    if (no || *nbytes > inline_max) {
        return 0;
    }
    *field = PyDict_GetItemWithError(fields, args[5]);
    if (*field == NULL || !PyBytes_CheckExact(*field) || PyBytes_GET_SIZE(*field) > DTYPE_MAX) {
        return PyErr_Occurred() ? -1 : 2;  /* a dtype not seen yet: the wire's encode_dtype */
    }
    Py_INCREF(*field);
    return 1;
}

/* send_now(dest, tag, array, nbytes, count, dtype) -> bool: ``MPITransport.send_now``. */
static PyObject *
path_send_now(Path *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "send_now(dest, tag, array, nbytes, count, dtype)");
        return NULL;
    }
    PyObject *dest = args[0], *field;
    long d, t;
    Py_ssize_t nbytes, count;
    int judged = judge_send(p->link, p->closed_by, p->fields, p->inline_max, -1,
                            PyList_GET_SIZE(p->credit), args, &d, &t, &nbytes, &count, &field);
    if (judged < 0) {
        return NULL;
    }
    if (judged == 0) {
        Py_RETURN_FALSE;
    }
    if (judged == 2) {
        goto python;
    }
    long long cost = charge(nbytes);  /* (``field`` held: a collection may run) */
    long long have = PyLong_AsLongLong(PyList_GET_ITEM(p->credit, d));
    Py_buffer view;
    int eager = have == -1 && PyErr_Occurred() ? -1 : have < cost ? 0
        : PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0 ? 2 : 1;
    if (eager == 1 && view.len != nbytes) {
        PyBuffer_Release(&view);
        eager = 2;
    }
    if (eager != 1) {
        Py_DECREF(field);
        if (eager == 2) {
            PyErr_Clear();
            goto python;
        }
        return eager < 0 ? NULL : Py_NewRef(Py_False);
    }
    PyObject *raw = PyBytes_FromStringAndSize(NULL, H_SIZE + nbytes);
    if (raw == NULL || list_add(p->credit, d, -cost) < 0) {
        Py_XDECREF(raw);
        Py_DECREF(field);
        PyBuffer_Release(&view);
        return NULL;
    }
    frame_eager(PyBytes_AS_STRING(raw), p->rank, t, view.buf, nbytes, count, field);
    Py_DECREF(field);
    PyBuffer_Release(&view);
    /* progress.comm.Isend(raw, dest, 0): the control tag; the communicator looked up each
     * time, as Progress.send does (a test may put a faulty one there) */
    PyObject *comm = PyObject_GetAttr(p->progress, a_comm);
    PyObject *req = NULL;
    if (comm != NULL) {
        PyObject *argv[4] = {comm, raw, dest, zero};
        req = PyObject_VectorcallMethod(a_Isend, argv, 4, NULL);
        Py_DECREF(comm);
    }
    Py_DECREF(raw);
    int rc = req == NULL ? -1 : after_isend(p, req, d);
    Py_XDECREF(req);
    if (rc < 0) {
        if (!PyErr_ExceptionMatches(p->mpi_exc)) {
            return NULL;
        }
        PyErr_Clear();  /* the usual way reports the error on a request */
        if (list_add(p->credit, d, cost) < 0) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    if (deliver(p) < 0) {  /* the answer may be here: a recv waiting for it completes now */
        return NULL;
    }
    Py_RETURN_TRUE;
python:
    return PyObject_Vectorcall(p->py_send_now, args, nargs, NULL);
}

/* -- the type ---------------------------------------------------------------------------- */

/* ``*out = o.<name>``, an int; -1 error. */
int
long_attr(PyObject *o, PyObject *name, long *out)
{
    PyObject *v = PyObject_GetAttr(o, name);
    *out = v == NULL ? -1 : PyLong_AsLong(v);
    Py_XDECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *
path_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *link, *progress, *wire, *fields, *names, *mpi_exc, *inline_where;
    long ctrl_slots;
    static char *kw[] = {"link", "progress", "wire", "fields", "names", "mpi_exception",
                         "inline", "ctrl_slots", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!O!OOl:Path", kw, &link, &progress,
                                     &wire, &PyDict_Type, &fields, &PyDict_Type, &names,
                                     &mpi_exc, &inline_where, &ctrl_slots)) {
        return NULL;
    }
    if (!ready) {  /* the names it looks up come with the lane's configuration */
        PyErr_SetString(PyExc_TypeError, "Path: the lane is not configured");
        return NULL;
    }
    Path *p = (Path *)type->tp_alloc(type, 0);
    if (p == NULL) {
        return NULL;
    }
    p->link = Py_NewRef(link);
    p->progress = Py_NewRef(progress);
    p->wire = Py_NewRef(wire);
    p->fields = Py_NewRef(fields);
    p->names = Py_NewRef(names);
    p->mpi_exc = Py_NewRef(mpi_exc);
    p->inline_where = Py_NewRef(inline_where);
    p->ctrl_slots = ctrl_slots;
    p->slots = PyObject_GetAttr(progress, a_slots);
    p->credit = PyObject_GetAttr(wire, a_credit);
    p->owed = PyObject_GetAttr(wire, a_owed);
    p->closed_by = PyObject_GetAttr(wire, a_closed_by);
    p->py_send_now = PyObject_GetAttr(link, a_send_now);
    p->on_control = PyObject_GetAttr(link, a_on_control);
    if (p->slots == NULL || p->credit == NULL || p->owed == NULL
        || p->closed_by == NULL || p->py_send_now == NULL || p->on_control == NULL
        || long_attr(link, a_rank, &p->rank) < 0
        || long_attr(wire, a_inline_max, &p->inline_max) < 0
        || long_attr(wire, a_return_at, &p->return_at) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    if (!PyList_CheckExact(p->credit) || !PyList_CheckExact(p->owed)
        || !PyDict_Check(p->closed_by) || PyList_GET_SIZE(p->owed) != PyList_GET_SIZE(p->credit)) {
        PyErr_SetString(PyExc_TypeError, "Path: the wire's credit lists and closed_by dict");
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

static int
path_traverse(Path *p, visitproc visit, void *arg)
{
    Py_VISIT(p->link);
    Py_VISIT(p->progress);
    Py_VISIT(p->wire);
    Py_VISIT(p->slots);
    Py_VISIT(p->credit);
    Py_VISIT(p->owed);
    Py_VISIT(p->closed_by);
    Py_VISIT(p->fields);
    Py_VISIT(p->names);
    Py_VISIT(p->mpi_exc);
    Py_VISIT(p->inline_where);
    Py_VISIT(p->py_send_now);
    Py_VISIT(p->on_control);
    return 0;
}

static int
path_clear(Path *p)
{
    Py_CLEAR(p->link);
    Py_CLEAR(p->progress);
    Py_CLEAR(p->wire);
    Py_CLEAR(p->slots);
    Py_CLEAR(p->credit);
    Py_CLEAR(p->owed);
    Py_CLEAR(p->closed_by);
    Py_CLEAR(p->fields);
    Py_CLEAR(p->names);
    Py_CLEAR(p->mpi_exc);
    Py_CLEAR(p->inline_where);
    Py_CLEAR(p->py_send_now);
    Py_CLEAR(p->on_control);
    return 0;
}

static void
path_dealloc(Path *p)
{
    PyObject_GC_UnTrack(p);
    path_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef path_methods[] = {
    {"send_now", (PyCFunction)(void (*)(void))path_send_now, METH_FASTCALL,
     "send_now(dest, tag, array, nbytes, count, dtype) -> bool: MPITransport.send_now"},
    {"land", (PyCFunction)path_land, METH_NOARGS,
     "land() -> bool: hand the control messages that landed to the link (Progress._land)"},
    {"deliver", (PyCFunction)path_deliver, METH_NOARGS,
     "deliver(): the eager messages that landed, now (Progress.deliver)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.Path",
    .tp_basicsize = sizeof(Path),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Path(link, progress, wire, fields, names, mpi_exception, inline, ctrl_slots): "
              "the MPI link's per-message steps in C.",
    .tp_new = path_new,
    .tp_traverse = (traverseproc)path_traverse,
    .tp_clear = (inquiry)path_clear,
    .tp_dealloc = (destructor)path_dealloc,
    .tp_methods = path_methods,
};
