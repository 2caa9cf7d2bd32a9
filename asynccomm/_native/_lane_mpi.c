/* The MPI link's per-message steps in C: ``Path``, which the MPI world builds for each link
 * where the C lane is built (``MPITransport.accelerate``).
 *
 * ``send_now`` is ``MPITransport.send_now`` (the wire's ``eager_header``, then
 * ``Progress.send``) with no Python frame; ``land`` is ``Progress``'s loop over the
 * control recvs that landed, where an eager
 * message is handed to the receiving engine as ``MPITransport._on_control`` hands it: the
 * lane's ``offer`` copies it into a posted recv, or it arrives as a ``Message``.
 *
 * A rendezvous message's steps run here too: its announcement (``send``: the ``RTS``
 * sent, and an early message's data send right behind it), its ``RTS`` landing (the
 * announcement arrives at the engine as a ``REMOTE`` message), ``fetch`` (the ``CTS``,
 * then the data recv, on the data tag an early ``RTS`` named), the ``CTS`` landing (the
 * send is active, its data sent, or an early one's data send tracked), and the completion
 * of each data request (``test``, ``Progress._test_requests``: a ``Moved`` starts the next
 * chunks of a payload of more than one, and once all are in completes the recv, through
 * the engine's ``ready`` or here, or the send, here as the engine's ``sent`` does).  A ``CTS`` for a send being
 * withdrawn, a closing rank, and every other control message (``WITHDRAW``, ``CREDIT``,
 * ``CLOSE``, ...) take the Python steps, which stay the reference.  So does the progress
 * task's burst of polls between two turns of the loop (``spin``, ``Progress._spin``): the
 * head control recv tested, the message found there handed on alone, and ``test`` while
 * data moves.
 *
 * Every other control message, and every eager one this file does not judge (a closed
 * engine, a shape, a dtype not seen yet, a traced engine, a large payload), goes to the
 * link's Python ``_on_control``; every send it does not judge (a dtype not seen yet, a buffer
 * that is not one piece) to the Python ``send_now``.  The state stays where the Python
 * steps keep it (the wire's credit lists, the progress task's flags), so both kinds of
 * step can run in one world; but for two things only the steps that hand control messages
 * on need, and which only these do where they run: whether one is being handed on
 * (``_dispatching``), and how many slots ``spin`` handed on wait to be posted again at the
 * next poll (``_restart``; ``repost`` is ``Progress._repost``).
 *
 * The wire's header is ``wire.HEADER``, written and read here field by field,
 * little-endian, at the offsets ``configure`` was given (``native.NUMBERS``: H_SIZE, H_SRC,
 * ...); the field widths are those of the format ``native.HEADER_FIELDS`` declares. */
#include "_lane.h"

#include <dlfcn.h>

typedef struct {
    PyObject_HEAD
    PyObject *link, *progress, *wire, *slots, *credit, *owed, *closed_by, *fields, *names;
    PyObject *mpi_exc, *inline_where, *py_send_now, *on_control;
    /* the rendezvous steps': the wire's announced sends and unmatched announcements, the
     * link's sends and announcements by id, the Python fetch, where REMOTE payloads are */
    PyObject *announced, *unmatched, *sends, *announced_msgs, *py_fetch, *remote_where;
    PyObject *py_send;  /* the link's Python send */
    /* the peers the link reaches another way (a set of ranks: the hybrid link's rings),
     * whose sends and fetches take the link's Python steps; NULL: none */
    PyObject *ring_peers;
    /* direct calls (``direct``): the communicator they are for, its handle, and
     * ``MPI.Request.fromhandle`` for a control send that is not complete at once */
    PyObject *comm, *from_handle;
    int comm_handle;
    Py_ssize_t direct_max;  /* the largest control message sent so */
    /* early messages: the wire's data tags of this rank's (by id) and the set of them, its
     * early announcements landed and unmatched (``early_in``), the link's data sends */
    PyObject *early, *early_tags, *early_in, *link_early;
    long early_min, early_max;
    PyObject *active;  /* the state ACTIVE */
    long rank, inline_max, return_at, ctrl_slots;
    Py_ssize_t chunk_bytes;
    long max_inflight;  /* a transfer's chunks in flight at most */
    /* ``Progress._dispatching`` and ``_restart`` of the C steps, which alone hand control
     * messages on where the lane runs (``land``, ``spin``) */
    int dispatching;
    Py_ssize_t restart;
    /* the last ``land`` of the task ended its turn at a message that woke a task: the
     * next, if it finds more landed, is in a burst, and hands on every one */
    int ended_early;
} Path;

/* -- MPI's own calls, where the library mpi4py loaded can be called directly ----------
 *
 * ``mpi_calls(library, byte)`` finds ``MPI_Test``, ``MPI_Start``, ``MPI_Isend`` and
 * ``MPI_Irecv`` in the MPI library already loaded (``library``: its path; never loaded
 * here) for an MPI whose handles are C ints (MPICH's ABI, which ``_mpi_lib.direct_calls``
 * checks).  The control recvs' ``Test`` and ``Start`` and the control sends' ``Isend``
 * then call MPI with no mpi4py frame (no arguments parsed, no request object, the GIL
 * kept): on the handle an mpi4py request keeps (``Slot.addr``: its address), and, for a
 * send, on a handle of its own, wrapped in an mpi4py request only if the send is not
 * complete at once.  So do the data requests of a rendezvous payload (``start_piece``),
 * each wrapped in an mpi4py request for ``test`` (but for a data recv tested at once and
 * complete then: it is never wrapped).  Everything else, and every link whose
 * communicator is not a real one (the tests' fakes), calls mpi4py. */
typedef int (*mpi_test_fn)(int *, int *, void *);
typedef int (*mpi_start_fn)(int *);
typedef int (*mpi_isend_fn)(const void *, int, int, int, int, int, int *);
typedef int (*mpi_irecv_fn)(void *, int, int, int, int, int, int *);
static mpi_test_fn mpi_test;
static mpi_start_fn mpi_start;
static mpi_isend_fn mpi_isend;
static mpi_irecv_fn mpi_irecv;
static int mpi_byte;
/* (statuses are not read: room for any MPI_Status) */
static long long mpi_status[32];

/* An MPI error code ``rc`` raised as ``mpi_exc(rc)`` (mpi4py's ``MPI.Exception``). */
static int
mpi_failed(PyObject *mpi_exc, int rc)
{
    PyObject *e = PyObject_CallFunction(mpi_exc, "i", rc);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return -1;
}

/* The address of the handle a control slot's request keeps (``slot.addr``), or NULL
 * (none, or no direct calls); -1 in ``*err`` on error. */
static int *
slot_handle(PyObject *slot, int *err)
{
    *err = 0;
    if (mpi_test == NULL) {
        return NULL;
    }
    PyObject *a = PyObject_GetAttr(slot, a_addr);
    void *at = a == NULL ? NULL : PyLong_AsVoidPtr(a);
    Py_XDECREF(a);
    if (at == NULL && PyErr_Occurred()) {
        *err = -1;
    }
    return (int *)at;
}

/* ``req.Test()`` of a control slot, directly where it can be: 1 complete, 0 not, -1. */
static int
slot_test(Path *p, PyObject *slot)
{
    int err, flag = 0;
    int *h = slot_handle(slot, &err);
    if (err) {
        return -1;
    }
    if (h != NULL) {
        int rc = mpi_test(h, &flag, mpi_status);
        return rc != 0 ? mpi_failed(p->mpi_exc, rc) : flag != 0;
    }
    PyObject *req = PyObject_GetAttr(slot, a_req);
    PyObject *t = req == NULL ? NULL : PyObject_CallMethodNoArgs(req, a_Test);
    int done = t == NULL ? -1 : PyObject_IsTrue(t);
    Py_XDECREF(t);
    Py_XDECREF(req);
    return done;
}

/* mpi_calls(library, byte) -> bool: take ``MPI_Test``, ``MPI_Start`` and ``MPI_Isend`` from
 * ``library`` if it is loaded already (the caller checked that its handles are C ints;
 * ``byte``: ``MPI_BYTE``'s handle); False, and no direct calls, if it is not loaded or
 * lacks one. */
PyObject *
lane_mpi_calls(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "mpi_calls(library: str, byte: int)");
        return NULL;
    }
    const char *path = PyUnicode_AsUTF8(args[0]);
    /* (mpi4py gives a C int handle sign-extended, as an unsigned 64-bit number) */
    int byte = (int)PyLong_AsUnsignedLongLongMask(args[1]);
    if (path == NULL || PyErr_Occurred()) {
        return NULL;
    }
    void *lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    void *test = lib == NULL ? NULL : dlsym(lib, "MPI_Test");
    void *start = lib == NULL ? NULL : dlsym(lib, "MPI_Start");
    void *isend = lib == NULL ? NULL : dlsym(lib, "MPI_Isend");
    void *irecv = lib == NULL ? NULL : dlsym(lib, "MPI_Irecv");
    if (test == NULL || start == NULL || isend == NULL || irecv == NULL) {
        if (lib != NULL) {
            dlclose(lib);
        }
        Py_RETURN_FALSE;
    }
    /* (the handle is kept: the library stays loaded while these may be called) */
    mpi_test = (mpi_test_fn)test;
    mpi_start = (mpi_start_fn)start;
    mpi_isend = (mpi_isend_fn)isend;
    mpi_irecv = (mpi_irecv_fn)irecv;
    mpi_byte = byte;
    Py_RETURN_TRUE;
}

/* ``req.Start()`` of a control slot, directly where it can be: 0, -1 error. */
static int
slot_start(Path *p, PyObject *slot)
{
    int err;
    int *h = slot_handle(slot, &err);
    if (err) {
        return -1;
    }
    if (h != NULL) {
        int rc = mpi_start(h);
        return rc != 0 ? mpi_failed(p->mpi_exc, rc) : 0;
    }
    PyObject *req = PyObject_GetAttr(slot, a_req);
    PyObject *r = req == NULL ? NULL : PyObject_CallMethodNoArgs(req, a_Start);
    Py_XDECREF(req);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static int rendezvous(Path *p, PyObject *endpoint, const char *b, long kind);
/* Names only this file looks up (interned by ``path_new``). */
static PyObject *s_early, *s_early_tags, *s_early_in, *s_link_early, *s_early_min,
    *s_early_max, *s_next_early_tag, *s_data_tag_ub, *s_early_failed, *s_ring_peers;
static int fetch_into(Path *p, PyObject *endpoint, PyObject *msg, PyObject *into,
                      PyObject *ready_cb, PyObject *recv, long long fresh);

void
put_le(char *at, unsigned long long v, int n)
{
    for (int i = 0; i < n; i++) {
        at[i] = (char)(v >> (8 * i));
    }
}

long long
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

/* The dtype field of the last eager message landed here whose name was known: the next
 * message of that dtype looks its name up with this bytes (its hash kept), not a new one. */
static PyObject *last_field;

/* An eager message landed at ``b`` (its header, then ``len - H_SIZE`` bytes of payload),
 * for the link ``l->link``: hand it to the engine as ``_on_control`` does (the shared-memory
 * link's ``ShmPath`` lands its records here too).  With no recv posted for it, staged
 * (``l->stage``, where the pool has room), else ``payload(arg)`` makes the payload's view,
 * and it arrives as a ``Message``.  1 done, 0 not judged here (nothing done:
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
    /* (one of TIMED_COPY_MIN or more, at most the eager limit's 64 KiB, is timed by
     * ``offer`` as the Python steps time it) */
    if (nbytes < 0 || count < 0 || nbytes > len - H_SIZE) {
        return 0;
    }
    PyObject *endpoint = PyObject_GetAttr(l->link, a_endpoint);
    if (endpoint == NULL) {
        return -1;
    }
    int rc = 0;
    PyObject *field = NULL, *dtype = NULL, *src = NULL, *tag = NULL, *nb = NULL;
    PyObject *cnt = NULL, *out = NULL;
    /* (a closed engine: ``offer`` leaves it to the Python steps, which drop it) */
    if (Py_TYPE(endpoint) != DeviceEngineType || SLOT(endpoint, EN.tracer) != Py_None) {
        goto done;  /* traced: the Python steps number what arrives */
    }
    field = last_field != NULL && memcmp(PyBytes_AS_STRING(last_field), b + H_DTYPE,
                                         DTYPE_MAX) == 0
        ? Py_NewRef(last_field) : PyBytes_FromStringAndSize(b + H_DTYPE, DTYPE_MAX);
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
    if (field != last_field) {
        Py_XSETREF(last_field, Py_NewRef(field));
    }
    src = PyLong_FromLongLong(get_le(b + H_SRC, 4));
    tag = PyLong_FromLongLong(get_le(b + H_TAG, 4));
    if (src == NULL || tag == NULL) {
        rc = -1;
        goto done;
    }
    double when;
    int r = offer(endpoint, src, tag, (char *)b + H_SIZE, nbytes, count, dtype, NULL, l->stage,
                  &when);
    if (r <= 0) {
        rc = r;  /* 0: the Python steps judge */
        goto done;
    }
    rc = 1;
    if (r == 3) {  /* staged: its charge is owed back once a recv takes it (``received``) */
        goto done;
    }
    if (r == 1) {  /* taken: its charge is owed back (``wire.consumed``) */
        long s = PyLong_AsLong(src);
        if (s < 0 || s >= PyList_GET_SIZE(l->owed)) {
            PyErr_Format(PyExc_ValueError, "eager message from unknown rank %ld", s);
            rc = -1;
            goto done;
        }
        long long owed = PyLong_AsLongLong(PyList_GET_ITEM(l->owed, s));
        if (owed == -1 && PyErr_Occurred()) {
            rc = -1;
            goto done;
        }
        owed += charge(nbytes);
        /* (whether the source closed matters only once a CREDIT is due) */
        int gone = owed < l->return_at ? 0 : PyDict_Contains(l->closed_by, src);
        if (gone < 0) {
            rc = -1;
            goto done;
        }
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

/* A control message landed in ``head`` (its buffer ``buf``): an eager one ``land_eager``
 * (staged here when no recv is posted for it, as on shared memory), a rendezvous ``RTS`` or
 * ``CTS`` ``rendezvous``.  1 done, 0 not judged here (nothing done: ``_on_control`` runs),
 * -1 error. */
static int
dispatch(Path *p, PyObject *head, PyObject *buf)
{
    const char *b = PyByteArray_AS_STRING(buf);
    long kind = PyByteArray_GET_SIZE(buf) < H_SIZE ? -1 : (unsigned char)b[H_KIND];
    if (!ready || (kind != EAGER && kind != RTS && kind != CTS)) {
        return 0;
    }
    if (kind != EAGER) {
        PyObject *endpoint = PyObject_GetAttr(p->link, a_endpoint);
        if (endpoint == NULL) {
            return -1;
        }
        int rc = rendezvous(p, endpoint, b, kind);
        Py_DECREF(endpoint);
        return rc;
    }
    Landing l = {p->link, p->wire, p->names, p->owed, p->closed_by, p->inline_where,
                 p->return_at, 1};
    return land_eager(&l, b, PyByteArray_GET_SIZE(buf), slot_payload, head);
}

/* ``Progress._repost``: the last ``restart`` slots of the queue, handed on by ``spin``,
 * posted again in their order.  0 done (or none was waiting), -1 error. */
static int
repost(Path *p)
{
    Py_ssize_t size = p->restart > 0 ? PySequence_Size(p->slots) : 0;
    if (size < 0) {
        return -1;
    }
    for (Py_ssize_t i = size - p->restart; i < size; i++) {
        p->restart--;
        PyObject *slot = PySequence_GetItem(p->slots, i);
        int rc = slot == NULL ? -1 : slot_start(p, slot);
        Py_XDECREF(slot);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

/* Hand the control messages that landed to the link, head first, reposting each slot at
 * the back (``Progress._dispatch``); with ``known``, only that slot, the head, whose recv is known to be complete (not
 * tested again), and it is posted again at the next poll (``_dispatch`` with ``later``:
 * the caller reposted the waiting ones first); else the slots waiting for that are posted
 * first, and a message that woke a task (``lane_woken``) ends the turn as ``known``'s
 * does: its slot is posted again at the next poll, and the messages behind it land then,
 * so the task runs an MPI ``Start`` and ``Test`` sooner (not right after such an end, if
 * more landed meanwhile: a burst, in which a turn per message would cost more than it
 * saves).  1 if any landed, 0 if none, -1 error. */
static int
land(Path *p, PyObject *known)
{
    int hit = 0, only = known != NULL, burst = 0;
    if (!only && repost(p) < 0) {
        return -1;
    }
    if (!only) {
        burst = p->ended_early;
        p->ended_early = 0;
    }
    for (;;) {
        PyObject *head = known != NULL ? Py_NewRef(known) : PySequence_GetItem(p->slots, 0);
        int done = head == NULL ? -1 : known != NULL ? 1 : slot_test(p, head);
        known = NULL;
        PyObject *buf = done > 0 ? PyObject_GetAttr(head, a_buf) : NULL;
        if (done > 0 && (buf == NULL || !PyByteArray_Check(buf))) {
            if (buf != NULL) {
                PyErr_SetString(PyExc_TypeError, "a control slot's buffer is a bytearray");
            }
            done = -1;
        }
        int rc = done;
        unsigned long woken = lane_woken;
        if (done > 0) {
            hit = 1;
            p->dispatching = 1;  /* (errors or not, it drops after) */
            rc = dispatch(p, head, buf);
            if (rc == 0) {
                PyObject *r = PyObject_CallOneArg(p->on_control, head);
                rc = r == NULL ? -1 : 1;
                Py_XDECREF(r);
            }
            p->dispatching = 0;
            if (rc > 0) {
                if (!only && !burst && lane_woken != woken) {
                    only = p->ended_early = 1;
                }
                int s = only ? 0 : slot_start(p, head);
                PyObject *r = s < 0 ? NULL
                    : PyObject_CallMethodOneArg(p->slots, a_rotate, minus_one);
                rc = r == NULL ? -1 : 1;
                p->restart += only && r != NULL;
                Py_XDECREF(r);
            }
        }
        Py_XDECREF(buf);
        Py_XDECREF(head);
        if (rc <= 0 || only) {
            return rc < 0 ? -1 : hit;
        }
    }
}

/* The error being raised, taken (with its traceback) and handed on:
 * ``to.<name>(exc, arg, more)`` (``arg`` and ``more`` may be NULL: fewer arguments).  0 if
 * that returned, -1 if it raised. */
static int
hand_on(PyObject *to, PyObject *name, PyObject *arg, PyObject *more)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb != NULL && ev != NULL) {
        PyException_SetTraceback(ev, tb);
    }
    PyObject *r = ev == NULL ? NULL : PyObject_CallMethodObjArgs(to, name, ev, arg, more, NULL);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The error set, if an ``Exception``, handed to ``to._failed(exc)`` (its traceback kept):
 * 0; -1 (the error set) if it is not an ``Exception``, or the call failed. */
int
pass_failure(PyObject *to)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    return hand_on(to, a_failed, NULL, NULL);
}

static PyObject *
path_land(Path *p, PyObject *unused)
{
    int r = land(p, NULL);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
path_repost(Path *p, PyObject *unused)
{
    if (repost(p) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}


/* -- sending --------------------------------------------------------------------------- */

static int wake(PyObject *progress);

static int sent_control(Path *p, PyObject *req, long dest);

/* ``Progress.send`` once mpi4py's ``Isend`` made ``req``: its ``Test``, then
 * ``sent_control``. */
static int
after_isend(Path *p, PyObject *req, long dest)
{
    PyObject *t = PyObject_CallMethodNoArgs(req, a_Test);
    int done = t == NULL ? -1 : PyObject_IsTrue(t);
    Py_XDECREF(t);
    if (done < 0) {
        return -1;
    }
    return sent_control(p, done ? NULL : req, dest);
}

/* ``Progress.send`` once MPI has the message, ``raw`` (a bytes object), by a direct call:
 * a send not complete at once is kept as mpi4py's request for its handle, and ``raw``
 * with it in ``Progress._held`` (mpi4py's own requests keep their buffers). */
static int
send_direct(Path *p, PyObject *raw, long d)
{
    int req = 0, flag = 0;
    int rc = mpi_isend(PyBytes_AS_STRING(raw), (int)PyBytes_GET_SIZE(raw), mpi_byte, (int)d,
                       0, p->comm_handle, &req);
    if (rc == 0) {
        rc = mpi_test(&req, &flag, mpi_status);
    }
    if (rc != 0) {
        return mpi_failed(p->mpi_exc, rc);
    }
    if (flag) {
        return sent_control(p, NULL, d);
    }
    PyObject *obj = PyObject_CallFunction(p->from_handle, "K",
                                          (unsigned long long)(long long)req);
    PyObject *held = obj == NULL ? NULL : PyObject_GetAttr(p->progress, a_held);
    int r = -1;
    if (held != NULL && !PyList_Check(held)) {
        PyErr_SetString(PyExc_TypeError, "Progress._held is a list");
    }
    else if (held != NULL && PyList_Append(held, raw) == 0) {
        r = sent_control(p, obj, d);
    }
    Py_XDECREF(held);
    Py_XDECREF(obj);
    return r;
}

/* What ``Progress.send`` does once MPI has the message: keep an unfinished send ``req``
 * (NULL: it is complete), ring the receiver's doorbell if it dozes, and wake this rank's
 * progress task. */
static int
sent_control(Path *p, PyObject *req, long dest)
{
    if (req != NULL) {
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
    return wake(p->progress);
}

/* ``Progress.send``: the control message ``raw`` to ``dest`` (rank ``d``) on the control
 * tag, ``progress.comm`` looked up each time as the Python does (a test may put a faulty
 * one there), then ``after_isend``.  0 sent, -1 error (an MPI one is ``p->mpi_exc``). */
static int
send_control(Path *p, PyObject *raw, PyObject *dest, long d)
{
    PyObject *comm = PyObject_GetAttr(p->progress, a_comm);
    if (comm == NULL) {
        return -1;
    }
    if (comm == p->comm && mpi_isend != NULL && PyBytes_CheckExact(raw)
        && PyBytes_GET_SIZE(raw) <= p->direct_max) {
        Py_DECREF(comm);
        return send_direct(p, raw, d);
    }
    PyObject *argv[4] = {comm, raw, dest, zero};
    PyObject *req = PyObject_VectorcallMethod(a_Isend, argv, 4, NULL);
    Py_DECREF(comm);
    int rc = req == NULL ? -1 : after_isend(p, req, d);
    Py_XDECREF(req);
    return rc;
}

/* ``Progress._wake``: poll now, if the task is parked waiting for the idle tick. */
static int
wake(PyObject *progress)
{
    PyObject *parked = PyObject_GetAttr(progress, a_parked);
    if (parked == NULL) {
        return -1;
    }
    int rc = 0;
    if (parked != Py_None) {
        PyObject *d = PyObject_CallMethodNoArgs(parked, a_done);
        int finished = d == NULL ? -1 : PyObject_IsTrue(d);
        Py_XDECREF(d);
        if (finished == 0) {
            PyObject *r = set_flag(progress, a_woke, 1) < 0 ? NULL
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

/* Whether ``peer`` is one the link reaches another way (``ring_peers``): 1 yes (the
 * link's Python steps), 0 no, -1 error. */
static int
by_ring(Path *p, PyObject *peer)
{
    return p->ring_peers == NULL ? 0 : PySet_Contains(p->ring_peers, peer);
}

/* send_now(dest, tag, array, nbytes, count, dtype) -> bool: ``MPITransport.send_now``. */
static PyObject *
path_send_now(Path *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "send_now(dest, tag, array, nbytes, count, dtype)");
        return NULL;
    }
    int ring = by_ring(p, args[0]);
    if (ring != 0) {
        return ring < 0 ? NULL : PyObject_Vectorcall(p->py_send_now, args, nargs, NULL);
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
    /* a C-contiguous ndarray (the fast lane's): its bytes as they are, else its buffer */
    view.buf = array_bytes(args[2], 0, &view.len);
    view.obj = NULL;
    int eager = have == -1 && PyErr_Occurred() ? -1 : have < cost ? 0
        : view.buf != NULL ? 1
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
    int rc = send_control(p, raw, dest, d);
    Py_DECREF(raw);
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
    /* (an answer that landed meanwhile is taken by its recv's own look: ``wait_here``) */
    Py_RETURN_TRUE;
python:
    return PyObject_Vectorcall(p->py_send_now, args, nargs, NULL);
}

/* ``wire.next_early_tag()``: a data tag above ``data_tag_ub // 2``, in rotation, none of
 * ``early_tags``.  A new reference; NULL with no error set: every one is held (the message
 * goes as any other); NULL with an error: an error. */
static PyObject *
next_early_tag(Path *p)
{
    long ub, at;
    if (long_attr(p->wire, s_data_tag_ub, &ub) < 0
        || long_attr(p->wire, s_next_early_tag, &at) < 0) {
        return NULL;
    }
    long low = ub / 2, span = ub - low;
    for (long i = 0; i < span; i++) {
        at = at % span + 1;
        PyObject *tag = PyLong_FromLong(low + at);
        int busy = tag == NULL ? -1 : PySet_Contains(p->early_tags, tag);
        if (busy == 0) {
            PyObject *v = PyLong_FromLong(at);
            int rc = v == NULL ? -1 : PyObject_SetAttr(p->wire, s_next_early_tag, v);
            Py_XDECREF(v);
            if (rc == 0) {
                return tag;
            }
        }
        Py_XDECREF(tag);
        if (busy != 1) {
            return NULL;
        }
    }
    return NULL;
}

/* ``MPITransport._send_early``'s data send of the early message ``msg``, to ``dest`` on
 * ``data_tag`` (kept by the link, untested until the ``RTS`` is answered: ``path_send``
 * records it).  A new reference; NULL error (an MPI one: once ``path_send`` has
 * recorded the message, the link breaks and the send fails, ``_early_failed``). */
static PyObject *
send_early(Path *p, PyObject *msg, PyObject *dest, PyObject *data_tag)
{
    PyObject *comm = PyObject_GetAttr(p->progress, a_comm);
    if (comm == NULL) {
        return NULL;
    }
    PyObject *argv[4] = {comm, SLOT(msg, M.view), dest, data_tag};
    PyObject *req = PyObject_VectorcallMethod(a_Isend, argv, 4, NULL);
    Py_DECREF(comm);
    return req;
}

/* send(msg, dest) -> None: ``MPITransport.send`` for a message too large to go eagerly,
 * of a dtype seen already and with no shape: ``wire.announce`` (the next id, the message
 * announced to ``dest``), the link keeps it until its ``CTS``, and its ``RTS`` goes as
 * ``Progress.send`` sends it; an MPI error: ``_send_failed``.  Any other send (a broken
 * link, a closed destination, one that may go eagerly): the Python ``send``. */
static PyObject *
path_send(Path *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send(msg, dest)");
        return NULL;
    }
    PyObject *msg = args[0], *dest = args[1];
    long d = PyLong_AsLong(dest);
    int ring = d == -1 && PyErr_Occurred() ? -1 : by_ring(p, dest);
    if (ring < 0) {
        return NULL;
    }
    if (ring || !ready || !PyObject_TypeCheck(msg, MessageType) || d < 0
        || d >= PyList_GET_SIZE(p->credit) || SLOT(msg, M.shape) != Py_None
        || SLOT(msg, M.view) == NULL || SLOT(msg, M.view) == Py_None) {
        goto python;
    }
    long long n, count, next;
    if (slot_ll(msg, M.nbytes, &n) < 0 || slot_ll(msg, M.count, &count) < 0) {
        return NULL;
    }
    PyObject *broken = PyObject_GetAttr(p->link, a_link_broken);
    int no = broken == NULL ? -1 : broken != Py_None;
    Py_XDECREF(broken);
    if (no == 0) {
        no = PyDict_Contains(p->closed_by, dest);
    }
    if (no != 0 || n <= p->inline_max) {
        if (no < 0) {
            return NULL;
        }
        goto python;  /* failed at once, or it may go eagerly */
    }
    PyObject *dtype = SLOT(msg, M.dtype);
    PyObject *field = dtype == NULL ? NULL : PyDict_GetItemWithError(p->fields, dtype);
    if (field == NULL || !PyBytes_CheckExact(field) || PyBytes_GET_SIZE(field) > DTYPE_MAX) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        goto python;  /* a dtype not seen yet: the wire's encode_dtype */
    }
    Py_INCREF(field);
    int early = n > p->early_min && n <= p->early_max && n <= p->chunk_bytes;  /* (one send) */
    PyObject *data_tag = early ? next_early_tag(p) : NULL;  /* (first: it may fail) */
    if (early && data_tag == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(field);
            return NULL;
        }
        early = 0;  /* every early data tag is held: its data waits for the CTS */
    }
    PyObject *v = PyObject_GetAttr(p->wire, a_next_ident);
    next = v == NULL ? -1 : PyLong_AsLongLong(v);
    Py_XDECREF(v);
    PyObject *ident = next == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(next + 1);
    PyObject *raw = NULL;
    int rc = -1;
    if (ident == NULL || PyObject_SetAttr(p->wire, a_next_ident, ident) < 0
        || (raw = PyBytes_FromStringAndSize(NULL, H_SIZE)) == NULL) {
        goto done;
    }
    char *h = PyBytes_AS_STRING(raw);  /* wire.announce's RTS */
    Py_ssize_t flen = PyBytes_GET_SIZE(field);
    memset(h, 0, H_SIZE);
    h[H_KIND] = (char)RTS;
    h[H_DLEN] = (char)flen;
    put_le(h + H_SRC, (unsigned long long)p->rank, 4);
    put_le(h + H_TAG, (unsigned long long)PyLong_AsLongLong(SLOT(msg, M.tag)), 4);
    put_le(h + H_NBYTES, (unsigned long long)n, 8);
    put_le(h + H_COUNT, (unsigned long long)count, 8);
    put_le(h + H_IDENT, (unsigned long long)(next + 1), 8);
    memcpy(h + H_DTYPE, PyBytes_AS_STRING(field), flen);
    if (early) {  /* wire.DATA_TAG_AT: the header's last 4 bytes */
        put_le(h + H_SIZE - 4, (unsigned long long)PyLong_AsLong(data_tag), 4);
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    put_ref(msg, M.ident, ident);
    /* The RTS leaves first, an early message's data send right behind it, and the message
     * is recorded as announced after both (the wire's ``announced``, its early data tag,
     * the link's ``_sends`` and ``_early``): nothing can answer it meanwhile (control
     * messages land only in the progress task's polls), and the end state is the Python
     * steps' (one whose RTS MPI failed to send is never recorded: ``_send_failed`` finds
     * nothing to forget; one whose data send failed is, then the link breaks). */
    rc = send_control(p, raw, dest, d);
    if (rc < 0 && PyErr_ExceptionMatches(p->mpi_exc)) {
        rc = hand_on(p->link, a_send_failed, msg, dest);
        goto done;
    }
    PyObject *req = rc == 0 && early ? send_early(p, msg, dest, data_tag) : NULL;
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    int failed = rc < 0 || (early && req == NULL);  /* (any other error: recorded too) */
    if (failed) {
        PyErr_Fetch(&et, &ev, &tb);
    }
    int r = PyDict_SetItem(p->announced, ident, dest) < 0
        || (early && (PyDict_SetItem(p->early, ident, data_tag) < 0
                      || PySet_Add(p->early_tags, data_tag) < 0))
        || PyDict_SetItem(p->sends, ident, msg) < 0
        || (req != NULL && PyDict_SetItem(p->link_early, ident, req) < 0) ? -1 : 0;
    Py_XDECREF(req);
    if (failed) {
        PyErr_Restore(et, ev, tb);
        rc = rc == 0 && PyErr_ExceptionMatches(p->mpi_exc)  /* the data send's */
            ? hand_on(p->link, s_early_failed, dest, msg) : -1;
    }
    else {
        rc = r;
    }
done:
    Py_XDECREF(data_tag);
    Py_XDECREF(raw);
    Py_XDECREF(ident);
    Py_DECREF(field);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
python:
    return PyObject_Vectorcall(p->py_send, args, nargs, NULL);
}

/* -- rendezvous ------------------------------------------------------------------------ */

/* ``Moved``: a rendezvous transfer's data requests, each calling it as it completes
 * (``Mover._moved_whole`` and ``_moved`` with their ``done``): one request fewer in
 * flight.  A payload of one chunk moves in one request; a larger one in chunks of
 * ``chunk_bytes``, at most ``max_inflight`` in flight, started in order, the next as one
 * completes (``ChunkSender``'s window, ``Mover._more``).  Once every chunk is in, the recv
 * the C steps matched completes (``complete``: what the engine's ``_fetched`` and
 * ``_received`` do for a payload already in place), or the receiver's ``ready(None,
 * None)`` runs, or the sender's send completes (``send_done``, else ``engine.sent(msg)``). */
typedef struct {
    PyObject_HEAD
    PyObject *progress, *engine, *msg, *ready, *recv;  /* NULL: not that kind */
    PyObject *active;  /* the state ACTIVE */
    /* the transfer: ``comm.<start>(piece, peer, tag)`` for each chunk of ``view`` (``start``:
     * a_Isend or a_Irecv, a module-lifetime name, not held) */
    PyObject *comm, *view, *peer, *tag, *start;
    Py_ssize_t nbytes, chunk_bytes, total, next, done;
    long inflight, max_inflight;
    /* where the path calls MPI directly for ``comm``: ``MPI.Request.fromhandle`` and the
     * communicator's handle (else NULL); and the class of MPI's errors */
    PyObject *from_handle, *mpi_exc;
    int comm_handle;
} Moved;

static PyTypeObject MovedType;

static int
data_add(PyObject *progress, long delta)
{
    PyObject *v = PyObject_GetAttr(progress, a_data);
    long n = v == NULL ? -1 : PyLong_AsLong(v);
    Py_XDECREF(v);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    v = PyLong_FromLong(n + delta);
    int rc = v == NULL ? -1 : PyObject_SetAttr(progress, a_data, v);
    Py_XDECREF(v);
    return rc;
}

/* ``req.Test()``: 1 complete, 0 not, -1 error. */
static int
tested(PyObject *req)
{
    PyObject *t = PyObject_CallMethodNoArgs(req, a_Test);
    int rc = t == NULL ? -1 : PyObject_IsTrue(t);
    Py_XDECREF(t);
    return rc;
}

static int moved_finish(Moved *m);

/* ``m.comm.<start>(piece, peer, tag)``: mpi4py's request for one chunk, started by a
 * direct call where the path makes them (``piece`` one piece of bytes: ``view`` holds
 * them while the request is in flight, mpi4py's request made from the handle does not).
 * With ``*now`` set, the request is to be tested at once (``Mover.pull``'s one data
 * recv): where it was started by a direct call, by a direct ``MPI_Test``, and ``*now``
 * says what it found (1 complete: the request is never wrapped, and ``Py_None`` is
 * returned, so no request object is made or freed between the copy MPICH made, which
 * has just turned the caches over, and the recv's completion; 0 not complete); else
 * ``*now`` is -1 (not tested here).  A new reference, NULL error. */
static PyObject *
start_piece(Moved *m, PyObject *piece, int *now)
{
    int test = *now;
    *now = -1;
    Py_buffer v;
    int recv = m->start == a_Irecv;
    int got = m->from_handle == NULL ? -1
        : PyObject_GetBuffer(piece, &v, recv ? PyBUF_WRITABLE : PyBUF_SIMPLE);
    if (got < 0 && m->from_handle != NULL) {
        PyErr_Clear();  /* (not a piece of bytes: mpi4py's call) */
    }
    if (got == 0) {
        long peer = PyLong_AsLong(m->peer), tag = PyLong_AsLong(m->tag);
        int req = 0, rc = 0;
        if (!PyErr_Occurred() && v.len <= INT_MAX) {
            rc = recv ? mpi_irecv(v.buf, (int)v.len, mpi_byte, (int)peer, (int)tag,
                                  m->comm_handle, &req)
                : mpi_isend(v.buf, (int)v.len, mpi_byte, (int)peer, (int)tag, m->comm_handle,
                            &req);
            PyBuffer_Release(&v);
            if (rc == 0 && test && mpi_test != NULL) {
                int flag = 0;
                rc = mpi_test(&req, &flag, mpi_status);
                *now = flag != 0;
                if (rc == 0 && flag) {
                    Py_RETURN_NONE;
                }
            }
            return rc != 0 ? (mpi_failed(m->mpi_exc, rc), NULL)
                : PyObject_CallFunction(m->from_handle, "K", (unsigned long long)(long long)req);
        }
        PyBuffer_Release(&v);
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    PyObject *argv[4] = {m->comm, piece, m->peer, m->tag};
    return PyObject_VectorcallMethod(m->start, argv, 4, NULL);
}

/* Start the transfer's next chunks while its window has room (``Mover._more``; a payload
 * of one chunk: ``Mover._move``'s one request, for the whole view): each is one more in
 * flight, tracked with ``m``; then the task is woken.  0 done, -1 error (the chunks
 * started stay tracked, as the Python steps leave them). */
static int
moved_more(Moved *m)
{
    while (m->next < m->total && m->inflight < m->max_inflight) {
        PyObject *piece;
        if (m->total == 1) {
            piece = Py_NewRef(m->view);
        }
        else {
            Py_ssize_t off = m->next * m->chunk_bytes;
            Py_ssize_t end = off + Py_MIN(m->chunk_bytes, m->nbytes - off);
            PyObject *a = PyLong_FromSsize_t(off), *b = PyLong_FromSsize_t(end);
            PyObject *cut = a == NULL || b == NULL ? NULL : PySlice_New(a, b, NULL);
            piece = cut == NULL ? NULL : PyObject_GetItem(m->view, cut);
            Py_XDECREF(cut);
            Py_XDECREF(a);
            Py_XDECREF(b);
            if (piece == NULL) {
                return -1;
            }
        }
        /* One data recv is tested at once (``Mover.pull``): MPICH copies a transfer it
         * has seen announced in the first poll, and the recv completes here. */
        int test = m->total == 1 && m->start == a_Irecv, now = test;
        PyObject *req = start_piece(m, piece, &now);
        Py_DECREF(piece);
        if (req == NULL) {
            return -1;
        }
        if (test) {
            int t = now >= 0 ? now : tested(req);  /* (tested already, or not yet) */
            if (t != 0) {
                Py_DECREF(req);
                m->next = m->done = 1;
                return t < 0 ? -1 : moved_finish(m);
            }
        }
        m->next++;
        m->inflight++;
        PyObject *reqs = PyObject_GetAttr(m->progress, a_reqs);
        PyObject *cbs = reqs == NULL ? NULL : PyObject_GetAttr(m->progress, a_cbs);
        int rc = cbs == NULL || data_add(m->progress, 1) < 0 || PyList_Append(reqs, req) < 0
            || PyList_Append(cbs, (PyObject *)m) < 0 ? -1 : 0;
        Py_XDECREF(reqs);
        Py_XDECREF(cbs);
        Py_DECREF(req);
        if (rc < 0) {
            return -1;
        }
    }
    return wake(m->progress);
}

/* What ``engine.sent(req)`` does (``_finish``: the send DONE, its flight record and tally,
 * its waiters woken, it leaves its stream) for an ACTIVE send (``active``: the state) of an
 * untraced engine on its fast lane (no logging, not broken).  1 done, 0 not judged here
 * (nothing changed: the engine's ``sent`` runs), -1 error. */
int
send_complete(PyObject *engine, PyObject *req, PyObject *active)
{
    if (Py_TYPE(req) != RequestType || SLOT(req, R.state) != active
        || Py_TYPE(engine) != DeviceEngineType || SLOT(engine, EN.tracer) != Py_None) {
        return 0;
    }
    int f = slot_true(engine, EN.fast);
    PyObject *stream = SLOT(req, R.stream), *peer = SLOT(req, R.peer);
    if (f != 1 || stream == NULL || Py_TYPE(stream) != StreamType || peer == NULL) {
        return f < 0 ? -1 : 0;
    }
    double t_post, t_match, t;
    long long n;
    long rank = PyLong_AsLong(peer);
    if ((rank == -1 && PyErr_Occurred()) || slot_double(req, R.t_post, &t_post) < 0
        || slot_double(req, R.t_match, &t_match) < 0 || slot_ll(req, M.nbytes, &n) < 0) {
        return -1;
    }
    if (rank < 0 || t_post < 0 || t_match < 0) {
        return 0;  /* (never, for a send a CTS answered: the Python steps' arithmetic) */
    }
    Py_INCREF(stream);  /* (waking the waiters may drop the send's own reference) */
    int rc = done_at(engine, req, stream, 0, Py_None, peer, SLOT(req, M.tag), (Py_ssize_t)n,
                     t_post, t_match, &t);
    Py_DECREF(stream);
    return rc < 0 ? -1 : 1;
}

static int
send_done(Moved *m)
{
    return send_complete(m->engine, m->msg, m->active);
}

static int
moved_fire(Moved *m)
{
    if (data_add(m->progress, -1) < 0) {
        return -1;
    }
    m->inflight--;
    if (++m->done < m->total) {
        return moved_more(m);
    }
    return moved_finish(m);
}

/* The transfer's data is all moved: what follows (see ``Moved``).  0 done, -1 error. */
static int
moved_finish(Moved *m)
{
    PyObject *r;
    if (m->recv != NULL) {
        PyObject *msg = m->msg;
        Py_ssize_t n = PyLong_AsSsize_t(SLOT(msg, M.nbytes));
        Py_ssize_t c = PyLong_AsSsize_t(SLOT(msg, M.count));
        double when;
        if (PyErr_Occurred()) {
            return -1;
        }
        if (SLOT(m->recv, R.state) == S_DONE) {
            return 0;  /* failed already (the link broke) */
        }
        return complete(m->engine, m->recv, SLOT(msg, M.source), SLOT(msg, M.tag), n, c,
                        &when);
    }
    if (m->ready != NULL) {
        PyObject *argv[2] = {Py_None, Py_None};
        r = PyObject_Vectorcall(m->ready, argv, 2, NULL);
    }
    else {
        int done = send_done(m);
        if (done != 0) {
            return done < 0 ? -1 : 0;
        }
        r = PyObject_CallMethodOneArg(m->engine, a_engine_sent, m->msg);
    }
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *
moved_call(Moved *m, PyObject *args, PyObject *kwds)
{
    if (moved_fire(m) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static int
moved_traverse(Moved *m, visitproc visit, void *arg)
{
    Py_VISIT(m->progress);
    Py_VISIT(m->engine);
    Py_VISIT(m->msg);
    Py_VISIT(m->ready);
    Py_VISIT(m->recv);
    Py_VISIT(m->active);
    Py_VISIT(m->comm);
    Py_VISIT(m->view);
    Py_VISIT(m->peer);
    Py_VISIT(m->tag);
    Py_VISIT(m->from_handle);
    Py_VISIT(m->mpi_exc);
    return 0;
}

static int
moved_clear(Moved *m)
{
    Py_CLEAR(m->progress);
    Py_CLEAR(m->engine);
    Py_CLEAR(m->msg);
    Py_CLEAR(m->ready);
    Py_CLEAR(m->recv);
    Py_CLEAR(m->active);
    Py_CLEAR(m->comm);
    Py_CLEAR(m->view);
    Py_CLEAR(m->peer);
    Py_CLEAR(m->tag);
    Py_CLEAR(m->from_handle);
    Py_CLEAR(m->mpi_exc);
    return 0;
}

static void
moved_dealloc(Moved *m)
{
    PyObject_GC_UnTrack(m);
    moved_clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyTypeObject MovedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.Moved",
    .tp_basicsize = sizeof(Moved),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A rendezvous transfer's data requests, as each completes (made by Path).",
    .tp_call = (ternaryfunc)moved_call,
    .tp_traverse = (traverseproc)moved_traverse,
    .tp_clear = (inquiry)moved_clear,
    .tp_dealloc = (destructor)moved_dealloc,
};

/* ``Mover.push`` or ``pull`` (``start``: a_Isend or a_Irecv) of ``view`` with ``peer`` on
 * ``tag``, on the progress task's communicator: its first chunks started and tracked with
 * a ``Moved(engine, msg, ready, recv)``, the task woken.  0 done, -1 error. */
static Moved *
moved_new(Path *p, PyObject *start, PyObject *view, PyObject *peer, PyObject *tag,
          PyObject *engine, PyObject *msg, PyObject *ready, PyObject *recv)
{
    Py_ssize_t n = PyObject_Length(view);
    PyObject *comm = n < 0 ? NULL : PyObject_GetAttr(p->progress, a_comm);
    if (comm == NULL) {
        return NULL;
    }
    Moved *m = PyObject_GC_New(Moved, &MovedType);
    if (m == NULL) {
        Py_DECREF(comm);
        return NULL;
    }
    m->progress = Py_NewRef(p->progress);
    m->engine = Py_NewRef(engine);
    m->msg = Py_NewRef(msg);
    m->ready = Py_XNewRef(ready);
    m->recv = Py_XNewRef(recv);
    m->active = Py_NewRef(p->active);
    m->comm = comm;
    m->view = Py_NewRef(view);
    m->peer = Py_NewRef(peer);
    m->tag = Py_NewRef(tag);
    m->start = start;
    m->nbytes = n;
    m->chunk_bytes = p->chunk_bytes;
    m->total = n <= p->chunk_bytes ? 1 : (n + p->chunk_bytes - 1) / p->chunk_bytes;
    m->next = m->done = 0;
    m->inflight = 0;
    m->max_inflight = p->max_inflight;
    m->mpi_exc = Py_NewRef(p->mpi_exc);
    int direct = comm == p->comm && p->from_handle != NULL && mpi_irecv != NULL;
    m->from_handle = direct ? Py_NewRef(p->from_handle) : NULL;
    m->comm_handle = p->comm_handle;
    PyObject_GC_Track(m);
    return m;
}

static int
move(Path *p, PyObject *start, PyObject *view, PyObject *peer, PyObject *tag,
     PyObject *engine, PyObject *msg, PyObject *ready, PyObject *recv)
{
    Moved *m = moved_new(p, start, view, peer, tag, engine, msg, ready, recv);
    if (m == NULL) {
        return -1;
    }
    int rc = moved_more(m);
    Py_DECREF(m);
    return rc;
}

/* ``Mover.adopt``: the early data send ``req`` of ``sent`` (the whole of ``view``, to
 * ``dest``), posted already, tracked now as a transfer of one request in flight; the
 * send completes with it.  0 done, -1 error. */
static int
adopt(Path *p, PyObject *req, PyObject *view, PyObject *dest, PyObject *endpoint,
      PyObject *sent)
{
    Moved *m = moved_new(p, a_Isend, view, dest, zero, endpoint, sent, NULL, NULL);
    if (m == NULL) {
        return -1;
    }
    m->total = m->next = 1;
    int t = tested(req);  /* completed already: the send completes now (``Mover.adopt``) */
    if (t != 0) {
        m->done = 1;
        int rc = t < 0 ? -1 : moved_finish(m);
        Py_DECREF(m);
        return rc;
    }
    m->inflight = 1;
    PyObject *reqs = PyObject_GetAttr(p->progress, a_reqs);
    PyObject *cbs = reqs == NULL ? NULL : PyObject_GetAttr(p->progress, a_cbs);
    int rc = cbs == NULL || data_add(p->progress, 1) < 0 || PyList_Append(reqs, req) < 0
        || PyList_Append(cbs, (PyObject *)m) < 0 ? -1 : wake(p->progress);
    Py_XDECREF(reqs);
    Py_XDECREF(cbs);
    Py_DECREF(m);
    return rc;
}

/* The engine the C steps serve: the engine's own class, untraced (else the Python steps
 * number what arrives).  1 yes, 0 no, -1 error. */
int
plain_engine(PyObject *endpoint)
{
    if (Py_TYPE(endpoint) != DeviceEngineType || SLOT(endpoint, EN.tracer) != Py_None) {
        return 0;
    }
    PyObject *closed = PyObject_GetAttr(endpoint, a_closed);
    int t = closed == NULL ? -1 : PyObject_IsTrue(closed);
    Py_XDECREF(closed);
    return t < 0 ? -1 : !t;
}

/* The engine's ``activate``: a recv matched this rank's send ``sent`` (POSTED: now
 * ``active``, its match time set; a withdrawal under way, if any, lost).  -1 error. */
int
activate_send(PyObject *engine, PyObject *sent, PyObject *active)
{
    double t;
    if (SLOT(sent, R.state) == S_POSTED) {
        PyObject *tm = now_of(engine, &t) < 0 ? NULL : PyFloat_FromDouble(t);
        if (tm == NULL) {
            return -1;
        }
        put_ref(sent, R.state, active);
        put(sent, R.t_match, tm);
    }
    return 0;
}

/* A ``CTS`` landed (``_on_control``'s ``ClearToSend``): the send it answers is active, and
 * its data goes on the data tag named, in chunks.  A send the wire is withdrawing (the
 * withdrawal lost): the Python steps. */
static int
clear_to_send(Path *p, PyObject *endpoint, PyObject *ident, PyObject *data_tag)
{
    PyObject *dest = PyDict_GetItemWithError(p->announced, ident);
    PyObject *sent = dest == NULL ? NULL : PyDict_GetItemWithError(p->sends, ident);
    if (sent == NULL || Py_TYPE(sent) != RequestType) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *view = SLOT(sent, M.view);
    if (view == NULL || view == Py_None) {
        return 0;
    }
    PyObject *mv = PyMemoryView_FromObject(view);
    Py_ssize_t n = mv == NULL ? -1 : PyObject_Length(mv);
    if (n < 0) {
        Py_XDECREF(mv);
        return -1;
    }
    Py_INCREF(dest);
    Py_INCREF(sent);
    int rc = -1;
    /* an early one's data send, and its tag freed (``wire._settled``) */
    PyObject *req = PyDict_GetItemWithError(p->link_early, ident);
    PyObject *tag = PyDict_GetItemWithError(p->early, ident);
    Py_XINCREF(req);
    Py_XINCREF(tag);
    if (PyErr_Occurred()
        || PyDict_DelItem(p->announced, ident) < 0 || PyDict_DelItem(p->sends, ident) < 0
        || (req != NULL && PyDict_DelItem(p->link_early, ident) < 0)
        || (tag != NULL && (PyDict_DelItem(p->early, ident) < 0
                            || PySet_Discard(p->early_tags, tag) < 0))) {
        goto done;
    }
    if (activate_send(endpoint, sent, p->active) < 0) {
        goto done;
    }
    rc = req != NULL ? adopt(p, req, mv, dest, endpoint, sent)
        : move(p, a_Isend, mv, dest, data_tag, endpoint, sent, NULL, NULL);
done:
    Py_XDECREF(req);
    Py_XDECREF(tag);
    Py_DECREF(mv);
    Py_DECREF(sent);
    Py_DECREF(dest);
    return rc < 0 ? -1 : 1;
}

/* The recv posted for a message from ``source`` on ``tag`` (``nbytes`` of ``dtype``) on an
 * untraced engine's fast lane, where the engine's ``arrived`` would match it at once
 * (``Matcher.deliver``: the earliest posted of those that name it, wildcards included,
 * ``posted_earliest``): 1 found (``at``: the recv and its bucket's key held, its array's
 * bytes ``dst``; nothing changed yet), 0 none judged here (none posted, a misfit, a
 * recv_new, a tombstone at a head, events to drain: the Python steps), -1 error.
 * ``posted_clear`` it. */
int
posted_find(PyObject *engine, PyObject *source, PyObject *tag, PyObject *dtype,
            Py_ssize_t nbytes, Posted *at)
{
    *at = (Posted){0};
    int f = slot_true(engine, EN.fast);  /* not fast: logging, or a world not set up */
    if (f != 1) {
        return f < 0 ? -1 : 0;
    }
    PyObject *matcher = SLOT(engine, EN.matcher);
    if (matcher == NULL || Py_TYPE(matcher) != MatcherType) {
        return 0;
    }
    long long n_posted, n_wild;
    PyObject *events = SLOT(matcher, MA.events);
    if (slot_ll(matcher, MA.n_posted, &n_posted) < 0
        || slot_ll(matcher, MA.n_wild_posted, &n_wild) < 0) {
        return -1;
    }
    if (!n_posted || events == NULL || PyObject_Length(events) != 0) {
        return PyErr_Occurred() ? -1 : 0;  /* (events to drain: the Python steps) */
    }
    PyObject *index = SLOT(matcher, MA.posted);
    if (index == NULL || !PyDict_CheckExact(index)) {
        return 0;
    }
    at->matcher = matcher;
    at->index = index;
    PyObject *recv;
    int found = posted_earliest(index, NULL, source, tag, n_wild > 0, &recv, &at->key,
                                &at->bucket, &at->wild);
    if (found != 1) {
        return found < 0 ? -1 : 0;
    }
    at->recv = Py_NewRef(recv);
    at->dst = recv_fits(recv, dtype, nbytes, 0);
    if (at->dst == NULL) {
        return PyErr_Occurred() ? -1 : 0;  /* a misfit, a recv_new: the Python steps */
    }
    return 1;
}

/* The recv ``posted_find`` found is matched: it leaves the posted index, ACTIVE (the
 * state ``active``), its match time set.  -1 error. */
int
posted_take(PyObject *engine, Posted *at, PyObject *active)
{
    double t;
    PyObject *tm = NULL, *recv = at->recv;
    if (pop_head(at->index, at->key, at->bucket) < 0) {
        return -1;
    }
    put_ref(recv, M.seq, minus_one);
    if (slot_add(at->matcher, MA.n_posted, -1) < 0 || slot_add(at->matcher, MA.matched, 1) < 0
        || (at->wild && slot_add(at->matcher, MA.n_wild_posted, -1) < 0)
        || now_of(engine, &t) < 0 || (tm = PyFloat_FromDouble(t)) == NULL) {
        return -1;
    }
    put_ref(recv, R.state, active);
    put(recv, R.t_match, tm);
    return 0;
}

void
posted_clear(Posted *at)
{
    Py_CLEAR(at->recv);
    Py_CLEAR(at->key);
}

/* The engine's ``arrived`` for the announcement ``msg`` where a recv is posted
 * for it (``posted_find``), and its ``_take``: the recv is active and the data is fetched
 * straight into its array, the recv completing in C as it lands.  ``data_tag``: the one
 * its ``RTS`` named, 0 none (``fetch_into``'s ``fresh``: the announcement was never
 * recorded as unmatched).  1 done, 0 not judged here (nothing changed: the engine's
 * Python steps take it), -1 error. */
static int
match(Path *p, PyObject *engine, PyObject *msg, PyObject *tag, Py_ssize_t nbytes,
      long long data_tag)
{
    Posted at;
    int rc = posted_find(engine, SLOT(msg, M.source), tag, SLOT(msg, M.dtype), nbytes, &at);
    if (rc == 1) {
        /* The recv's array outlives the transfer: the ``Moved`` tracking it holds the recv. */
        PyObject *into = PyMemoryView_FromMemory(at.dst, nbytes, PyBUF_WRITE);
        rc = into == NULL || posted_take(engine, &at, p->active) < 0
            || fetch_into(p, engine, msg, into, NULL, at.recv, data_tag) < 0 ? -1 : 1;
        Py_XDECREF(into);
    }
    posted_clear(&at);
    return rc;
}

/* An ``RTS`` landed (``_on_control``'s ``Announced``): the announcement arrives at the
 * engine as a ``REMOTE`` message (a recv that matches it calls ``fetch``).  One that a
 * recv posted for it takes at once (``match``) is fetched without being recorded
 * as unmatched first (the wire's ``unmatched`` and ``early_in``, the link's
 * ``_announced``, which ``fetch`` would empty again at once: the state after is the
 * same, and the data recv is posted sooner).  A closing rank's, a shape's, a dtype not
 * seen yet: the Python steps. */
static int
announced(Path *p, PyObject *endpoint, const char *b, PyObject *src, PyObject *ident)
{
    Py_ssize_t nbytes = (Py_ssize_t)get_le(b + H_NBYTES, 8);
    Py_ssize_t count = (Py_ssize_t)get_le(b + H_COUNT, 8);
    if (nbytes < 0 || count < 0) {
        return 0;
    }
    PyObject *closing = PyObject_GetAttr(p->wire, a_close_sent);
    int t = closing == NULL ? -1 : PyObject_IsTrue(closing);
    Py_XDECREF(closing);
    if (t != 0) {
        return t < 0 ? -1 : 0;
    }
    PyObject *field = PyBytes_FromStringAndSize(b + H_DTYPE, DTYPE_MAX);
    PyObject *dtype = field == NULL ? NULL : PyDict_GetItemWithError(p->names, field);
    Py_XDECREF(field);
    if (dtype == NULL || !PyUnicode_CheckExact(dtype)
        || PyUnicode_FindChar(dtype, ';', 0, PyUnicode_GET_LENGTH(dtype), 1) != -1) {
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(dtype);
    PyObject *tag = PyLong_FromLongLong(get_le(b + H_TAG, 4));
    PyObject *key = NULL, *msg = NULL, *r = NULL;
    long long data_tag = get_le(b + H_SIZE - 4, 4);  /* wire.data_tag_of */
    PyObject *early = NULL;
    if (tag != NULL) {
        msg = new_message(MessageType, src, tag, nbytes, count, dtype, p->remote_where,
                          Py_None);
    }
    if (msg != NULL) {
        put_ref(msg, M.ident, ident);
        int taken = match(p, endpoint, msg, tag, nbytes, data_tag);
        if (taken != 0) {
            r = taken < 0 ? NULL : Py_NewRef(Py_None);
        }
        else if ((key = PyTuple_Pack(2, src, ident)) != NULL
                 && (data_tag == 0
                     || (early = Py_BuildValue("(Ln)", data_tag, nbytes)) != NULL)
                 && PySet_Add(p->unmatched, key) == 0
                 && (early == NULL || PyDict_SetItem(p->early_in, key, early) == 0)
                 && PyDict_SetItem(p->announced_msgs, key, msg) == 0) {
            r = PyObject_CallMethodOneArg(endpoint, a_arrived, msg);
        }
    }
    Py_XDECREF(early);
    Py_XDECREF(r);
    Py_XDECREF(msg);
    Py_XDECREF(key);
    Py_XDECREF(tag);
    Py_DECREF(dtype);
    return r == NULL ? -1 : 1;
}

/* An ``RTS`` or ``CTS`` landed in ``b``: 1 done, 0 not judged here, -1 error. */
static int
rendezvous(Path *p, PyObject *endpoint, const char *b, long kind)
{
    int rc = plain_engine(endpoint);
    if (rc <= 0) {
        return rc;
    }
    PyObject *src = PyLong_FromLongLong(get_le(b + H_SRC, 4));
    PyObject *ident = PyLong_FromLongLong(get_le(b + H_IDENT, 8));
    PyObject *tag = kind == CTS ? PyLong_FromLongLong(get_le(b + H_TAG, 4)) : NULL;
    if (src == NULL || ident == NULL || (kind == CTS && tag == NULL)) {
        rc = -1;
    }
    else {
        rc = kind == CTS ? clear_to_send(p, endpoint, ident, tag)
            : announced(p, endpoint, b, src, ident);
    }
    Py_XDECREF(src);
    Py_XDECREF(ident);
    Py_XDECREF(tag);
    return rc;
}

/* fetch(msg, rank, into, ready): ``MPITransport.fetch`` (in chunks where the payload is
 * larger than one); a traced engine's: the Python ``fetch``. */
static PyObject *
path_fetch(Path *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "fetch(msg, rank, into, ready)");
        return NULL;
    }
    PyObject *msg = args[0], *into = args[2];
    int ring = Py_TYPE(msg) == MessageType && SLOT(msg, M.source) != NULL
        ? by_ring(p, SLOT(msg, M.source)) : 0;
    if (ring != 0) {
        return ring < 0 ? NULL : PyObject_Vectorcall(p->py_fetch, args, nargs, NULL);
    }
    PyObject *endpoint = PyObject_GetAttr(p->link, a_endpoint);
    if (endpoint == NULL) {
        return NULL;
    }
    int ok = plain_engine(endpoint);
    if (ok < 0) {
        Py_DECREF(endpoint);
        return NULL;
    }
    Py_ssize_t n = ok && Py_TYPE(msg) == MessageType && PyMemoryView_Check(into)
        ? PyObject_Length(into) : -1;
    if (n < 0 || !ready) {
        Py_DECREF(endpoint);
        if (PyErr_Occurred()) {
            return NULL;
        }
        return PyObject_Vectorcall(p->py_fetch, args, nargs, NULL);
    }
    int rc = fetch_into(p, endpoint, msg, into, args[3], NULL, -1);
    Py_DECREF(endpoint);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* What ``fetch`` does for the announcement ``msg`` matched, its data going to ``into``:
 * the ``CTS`` first, then the data recv, posted while the ``CTS`` travels (the sender's
 * data leaves only once the ``CTS`` has landed there, so it all but always finds the recv
 * posted; MPI matches any that came sooner); as the recv completes, ``ready(None,
 * None)`` runs, or the C steps complete ``recv``.  An MPI error breaks the link
 * (``_fetch_failed``).  ``fresh``: -1, the announcement is recorded as unmatched (the
 * wire's ``unmatched`` and ``early_in``, the link's ``_announced``: it leaves them);
 * else it never was (``announced``, matched as it landed), and ``fresh`` is the data tag
 * its ``RTS`` named, 0 none.  0 done, -1 error. */
static int
fetch_into(Path *p, PyObject *endpoint, PyObject *msg, PyObject *into, PyObject *ready_cb,
           PyObject *recv, long long fresh)
{
    PyObject *source = SLOT(msg, M.source), *ident = SLOT(msg, M.ident);
    PyObject *key = NULL, *tag = NULL, *raw = NULL;
    int rc = -1;
    long s = PyLong_AsLong(source);
    long long id = PyLong_AsLongLong(ident);
    if (PyErr_Occurred()) {
        goto done;
    }
    if (fresh > 0) {  /* the data tag its RTS named */
        tag = PyLong_FromLongLong(fresh);
    }
    else if (fresh == 0) {
        tag = PyObject_CallMethodNoArgs(p->wire, a_next_data_tag);
    }
    else {
        key = PyTuple_Pack(2, source, ident);
        if (key == NULL) {
            goto done;
        }
        int had = PyDict_Contains(p->announced_msgs, key);
        if (had < 0 || (had && PyDict_DelItem(p->announced_msgs, key) < 0)
            || PySet_Discard(p->unmatched, key) < 0) {
            goto done;
        }
        PyObject *early = PyDict_GetItemWithError(p->early_in, key);
        if (early == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (early != NULL) {  /* the data tag its RTS named */
            tag = PyTuple_Check(early) && PyTuple_GET_SIZE(early) == 2
                ? Py_NewRef(PyTuple_GET_ITEM(early, 0)) : NULL;
            if (tag == NULL || PyDict_DelItem(p->early_in, key) < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError,
                                    "wire.early_in: (data tag, nbytes) pairs");
                }
                goto done;
            }
        }
        else {
            tag = PyObject_CallMethodNoArgs(p->wire, a_next_data_tag);
        }
    }
    long t = tag == NULL ? -1 : PyLong_AsLong(tag);
    raw = t == -1 ? NULL : PyBytes_FromStringAndSize(NULL, H_SIZE);
    if (raw == NULL) {
        goto done;
    }
    char *h = PyBytes_AS_STRING(raw);
    memset(h, 0, H_SIZE);
    h[H_KIND] = (char)CTS;
    put_le(h + H_SRC, (unsigned long long)p->rank, 4);
    put_le(h + H_TAG, (unsigned long long)t, 4);
    put_le(h + H_IDENT, (unsigned long long)id, 8);
    rc = send_control(p, raw, source, s);
    if (rc == 0) {
        rc = move(p, a_Irecv, into, source, tag, endpoint, msg, ready_cb, recv);
    }
    if (rc < 0 && PyErr_ExceptionMatches(p->mpi_exc)) {
        rc = hand_on(p->link, a_fetch_failed, source, NULL);
    }
done:
    Py_XDECREF(raw);
    Py_XDECREF(tag);
    Py_XDECREF(key);
    return rc;
}

/* test() -> bool: ``Progress._test_requests``: the data requests that completed leave the
 * lists, then each one's callback runs, in MPI's order (``Moved`` with no Python frame). */
static PyObject *
path_test(Path *p, PyObject *unused)
{
    PyObject *reqs = PyObject_GetAttr(p->progress, a_reqs);
    PyObject *testsome = reqs == NULL ? NULL : PyObject_GetAttr(p->progress, a_testsome);
    PyObject *done = testsome == NULL ? NULL : PyObject_CallOneArg(testsome, reqs);
    PyObject *cbs = NULL, *fire = NULL, *keep_r = NULL, *keep_c = NULL, *result = NULL;
    char *fin = NULL;
    int hit = done == NULL ? -1 : PyObject_IsTrue(done);
    if (hit <= 0) {
        if (hit == 0) {
            result = Py_NewRef(Py_False);
        }
        goto out;
    }
    cbs = PyObject_GetAttr(p->progress, a_cbs);
    if (cbs == NULL || !PyList_Check(reqs) || !PyList_Check(cbs) || !PyList_Check(done)
        || PyList_GET_SIZE(cbs) != PyList_GET_SIZE(reqs)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "Progress._reqs and _cbs: lists, alike");
        }
        goto out;
    }
    Py_ssize_t n = PyList_GET_SIZE(reqs), k = PyList_GET_SIZE(done);
    fin = PyMem_Calloc(n ? n : 1, 1);
    fire = PyList_New(k);
    if (fin == NULL || fire == NULL) {
        goto out;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(done, j));
        if (i < 0 || i >= n) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_IndexError, "Testsome: an index out of range");
            }
            goto out;
        }
        fin[i] = 1;
        PyList_SET_ITEM(fire, j, Py_NewRef(PyList_GET_ITEM(cbs, i)));
    }
    keep_r = PyList_New(0);
    keep_c = PyList_New(0);
    if (keep_r == NULL || keep_c == NULL) {
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!fin[i] && (PyList_Append(keep_r, PyList_GET_ITEM(reqs, i)) < 0
                        || PyList_Append(keep_c, PyList_GET_ITEM(cbs, i)) < 0)) {
            goto out;
        }
    }
    if (PyObject_SetAttr(p->progress, a_reqs, keep_r) < 0
        || PyObject_SetAttr(p->progress, a_cbs, keep_c) < 0) {
        goto out;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *cb = PyList_GET_ITEM(fire, j);
        if (cb == Py_None) {
            continue;
        }
        if (Py_TYPE(cb) == &MovedType) {
            if (moved_fire((Moved *)cb) < 0) {
                goto out;
            }
        }
        else {
            PyObject *r = PyObject_CallNoArgs(cb);
            Py_XDECREF(r);
            if (r == NULL) {
                goto out;
            }
        }
    }
    result = Py_NewRef(Py_True);
out:
    PyMem_Free(fin);
    Py_XDECREF(keep_r);
    Py_XDECREF(keep_c);
    Py_XDECREF(fire);
    Py_XDECREF(cbs);
    Py_XDECREF(done);
    Py_XDECREF(testsome);
    Py_XDECREF(reqs);
    return result;
}

/* spin(until, share) -> bool: ``Progress._spin``: poll back to back (the head control
 * recv's ``Test``; then, if it landed, that message handed on, and if data requests are in
 * flight, ``test``) until something completed (True) or the clock passes ``until``
 * (False); ``share`` (None, or ``sched_yield``) is called between two polls. */
static PyObject *
path_spin(Path *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "spin(until, share)");
        return NULL;
    }
    double until = PyFloat_AsDouble(args[0]), now;
    PyObject *share = args[1];
    if ((until == -1.0 && PyErr_Occurred()) || repost(p) < 0) {
        return NULL;
    }
    /* The head's ``Test``, and whether data moves, found once: between two polls nothing
     * but ``share`` runs, and a poll that changes either ends the burst. */
    PyObject *head = PySequence_GetItem(p->slots, 0), *test = NULL;
    int err = head == NULL ? -1 : 0;
    int *handle = err ? NULL : slot_handle(head, &err);
    if (!err && handle == NULL) {  /* mpi4py's Test, bound once */
        PyObject *req = PyObject_GetAttr(head, a_req);
        test = req == NULL ? NULL : PyObject_GetAttr(req, a_Test);
        Py_XDECREF(req);
        err = test == NULL ? -1 : 0;
    }
    PyObject *reqs = err ? NULL : PyObject_GetAttr(p->progress, a_reqs);
    int moving = reqs == NULL ? -1 : PyObject_IsTrue(reqs);
    Py_XDECREF(reqs);
    PyObject *result = NULL;
    if (moving < 0) {
        goto out;
    }
    for (;;) {
        int landed;
        if (handle != NULL) {
            int flag = 0, rc = mpi_test(handle, &flag, mpi_status);
            landed = rc != 0 ? mpi_failed(p->mpi_exc, rc) : flag != 0;
        }
        else {
            PyObject *t = PyObject_CallNoArgs(test);
            landed = t == NULL ? -1 : PyObject_IsTrue(t);
            Py_XDECREF(t);
        }
        if (landed < 0) {
            goto out;
        }
        if (landed || moving) {
            if (landed && land(p, head) < 0) {
                goto out;
            }
            /* the data requests, if any (a landing may have added some) */
            reqs = PyObject_GetAttr(p->progress, a_reqs);
            moving = reqs == NULL ? -1 : PyObject_IsTrue(reqs);
            Py_XDECREF(reqs);
            PyObject *r = moving > 0 ? path_test(p, NULL) : NULL;
            int tested = moving <= 0 ? moving : r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
            if (tested < 0) {
                goto out;
            }
            if (landed || tested) {
                result = Py_NewRef(Py_True);
                goto out;
            }
        }
        if (share != Py_None) {
            PyObject *r = PyObject_CallNoArgs(share);
            if (r == NULL) {
                goto out;
            }
            Py_DECREF(r);
        }
        if (perf_clock(&now) < 0) {
            goto out;
        }
        if (now >= until) {
            result = Py_NewRef(Py_False);
            goto out;
        }
    }
out:
    Py_XDECREF(test);
    Py_XDECREF(head);
    return result;
}

/* direct(comm, handle, from_handle, max_bytes) -> bool: the control sends on ``comm`` (the
 * progress task's, ``handle`` its MPI handle) of at most ``max_bytes`` call MPI directly,
 * as do the data requests, where ``mpi_calls`` found it (``from_handle``:
 * ``MPI.Request.fromhandle``); False where it did not. */
static PyObject *
path_direct(Path *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "direct(comm, handle, from_handle, max_bytes)");
        return NULL;
    }
    int h = (int)PyLong_AsUnsignedLongLongMask(args[1]);
    Py_ssize_t most = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (mpi_isend == NULL) {
        Py_RETURN_FALSE;
    }
    Py_XSETREF(p->comm, Py_NewRef(args[0]));
    Py_XSETREF(p->from_handle, Py_NewRef(args[2]));
    p->comm_handle = h;
    p->direct_max = most;
    Py_RETURN_TRUE;
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
    PyObject *link, *progress, *wire, *fields, *names, *mpi_exc, *inline_where, *remote;
    PyObject *active;
    long ctrl_slots, max_inflight = 2;
    Py_ssize_t chunk_bytes;
    static char *kw[] = {"link", "progress", "wire", "fields", "names", "mpi_exception",
                         "inline", "ctrl_slots", "remote", "chunk_bytes", "active",
                         "max_inflight", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!O!OOlOnO|l:Path", kw, &link, &progress,
                                     &wire, &PyDict_Type, &fields, &PyDict_Type, &names,
                                     &mpi_exc, &inline_where, &ctrl_slots, &remote,
                                     &chunk_bytes, &active, &max_inflight)) {
        return NULL;
    }
    if (chunk_bytes < 1 || max_inflight < 1) {
        PyErr_SetString(PyExc_ValueError, "Path: chunk_bytes and max_inflight are at least 1");
        return NULL;
    }
    if (!ready) {  /* the names it looks up come with the lane's configuration */
        PyErr_SetString(PyExc_TypeError, "Path: the lane is not configured");
        return NULL;
    }
    if (PyType_Ready(&MovedType) < 0) {
        return NULL;
    }
    if (s_early == NULL) {
        struct { PyObject **at; const char *name; } names[] = {
            {&s_early, "early"}, {&s_early_tags, "early_tags"}, {&s_early_in, "early_in"},
            {&s_link_early, "_early"}, {&s_early_min, "early_min"},
            {&s_early_max, "early_max"}, {&s_next_early_tag, "_next_early_tag"},
            {&s_data_tag_ub, "data_tag_ub"}, {&s_early_failed, "_early_failed"},
            {&s_ring_peers, "ring_peers"}};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            if (*names[i].at == NULL
                && (*names[i].at = PyUnicode_InternFromString(names[i].name)) == NULL) {
                return NULL;
            }
        }
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
    p->remote_where = Py_NewRef(remote);
    p->active = Py_NewRef(active);
    p->chunk_bytes = chunk_bytes;
    p->max_inflight = max_inflight;
    p->announced = PyObject_GetAttr(wire, a_announced);
    p->unmatched = PyObject_GetAttr(wire, a_unmatched);
    p->sends = PyObject_GetAttr(link, a_sends);
    p->announced_msgs = PyObject_GetAttr(link, a_announced_msgs);
    p->py_fetch = PyObject_GetAttr(link, a_fetch);
    p->py_send = PyObject_GetAttr(link, a_link_send);
    p->slots = PyObject_GetAttr(progress, a_slots);
    p->credit = PyObject_GetAttr(wire, a_credit);
    p->owed = PyObject_GetAttr(wire, a_owed);
    p->closed_by = PyObject_GetAttr(wire, a_closed_by);
    p->py_send_now = PyObject_GetAttr(link, a_send_now);
    p->on_control = PyObject_GetAttr(link, a_on_control);
    p->early = PyObject_GetAttr(wire, s_early);
    p->early_tags = PyObject_GetAttr(wire, s_early_tags);
    p->early_in = PyObject_GetAttr(wire, s_early_in);
    p->link_early = PyObject_GetAttr(link, s_link_early);
    p->ring_peers = PyObject_GetAttr(link, s_ring_peers);
    if (p->ring_peers == Py_None) {
        Py_CLEAR(p->ring_peers);
    }
    else if (p->ring_peers != NULL && !PyAnySet_Check(p->ring_peers)) {
        PyErr_SetString(PyExc_TypeError, "Path: the link's ring_peers is a set or None");
        Py_DECREF(p);
        return NULL;
    }
    if (p->ring_peers == NULL && PyErr_Occurred()) {
        Py_DECREF(p);
        return NULL;
    }
    if (p->early == NULL || p->early_tags == NULL || p->early_in == NULL
        || p->link_early == NULL || long_attr(link, s_early_min, &p->early_min) < 0
        || long_attr(link, s_early_max, &p->early_max) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    if (p->slots == NULL || p->credit == NULL || p->owed == NULL
        || p->closed_by == NULL || p->py_send_now == NULL || p->on_control == NULL
        || p->announced == NULL || p->unmatched == NULL || p->sends == NULL
        || p->announced_msgs == NULL || p->py_fetch == NULL || p->py_send == NULL
        || long_attr(link, a_rank, &p->rank) < 0
        || long_attr(wire, a_inline_max, &p->inline_max) < 0
        || long_attr(wire, a_return_at, &p->return_at) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    if (!PyList_CheckExact(p->credit) || !PyList_CheckExact(p->owed)
        || !PyDict_Check(p->closed_by) || PyList_GET_SIZE(p->owed) != PyList_GET_SIZE(p->credit)
        || !PyDict_Check(p->announced) || !PySet_Check(p->unmatched) || !PyDict_Check(p->sends)
        || !PyDict_Check(p->announced_msgs) || !PyDict_Check(p->early)
        || !PySet_Check(p->early_tags) || !PyDict_Check(p->early_in)
        || !PyDict_Check(p->link_early)) {
        PyErr_SetString(PyExc_TypeError, "Path: the wire's credit lists, closed_by, announced "
                        "and unmatched, and the link's sends and announcements");
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
    Py_VISIT(p->announced);
    Py_VISIT(p->unmatched);
    Py_VISIT(p->sends);
    Py_VISIT(p->announced_msgs);
    Py_VISIT(p->py_fetch);
    Py_VISIT(p->py_send);
    Py_VISIT(p->ring_peers);
    Py_VISIT(p->remote_where);
    Py_VISIT(p->active);
    Py_VISIT(p->early);
    Py_VISIT(p->early_tags);
    Py_VISIT(p->early_in);
    Py_VISIT(p->link_early);
    Py_VISIT(p->comm);
    Py_VISIT(p->from_handle);
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
    Py_CLEAR(p->announced);
    Py_CLEAR(p->unmatched);
    Py_CLEAR(p->sends);
    Py_CLEAR(p->announced_msgs);
    Py_CLEAR(p->py_fetch);
    Py_CLEAR(p->py_send);
    Py_CLEAR(p->ring_peers);
    Py_CLEAR(p->remote_where);
    Py_CLEAR(p->active);
    Py_CLEAR(p->early);
    Py_CLEAR(p->early_tags);
    Py_CLEAR(p->early_in);
    Py_CLEAR(p->link_early);
    Py_CLEAR(p->comm);
    Py_CLEAR(p->from_handle);
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
    {"repost", (PyCFunction)path_repost, METH_NOARGS,
     "repost(): post again the slots spin handed on (Progress._repost)"},
    {"send", (PyCFunction)(void (*)(void))path_send, METH_FASTCALL,
     "send(msg, dest): MPITransport.send"},
    {"fetch", (PyCFunction)(void (*)(void))path_fetch, METH_FASTCALL,
     "fetch(msg, rank, into, ready): MPITransport.fetch"},
    {"test", (PyCFunction)path_test, METH_NOARGS,
     "test() -> bool: the data requests that completed, and their callbacks "
     "(Progress._test_requests)"},
    {"direct", (PyCFunction)(void (*)(void))path_direct, METH_FASTCALL,
     "direct(comm, handle, from_handle, max_bytes) -> bool: control sends on comm of at "
     "most max_bytes, and data requests, call MPI directly"},
    {"spin", (PyCFunction)(void (*)(void))path_spin, METH_FASTCALL,
     "spin(until, share) -> bool: poll back to back until something completed or the "
     "clock passed until (Progress._spin)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.Path",
    .tp_basicsize = sizeof(Path),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Path(link, progress, wire, fields, names, mpi_exception, inline, ctrl_slots, "
              "remote, chunk_bytes, active, max_inflight=2): "
              "the MPI link's per-message steps in C.",
    .tp_new = path_new,
    .tp_traverse = (traverseproc)path_traverse,
    .tp_clear = (inquiry)path_clear,
    .tp_dealloc = (destructor)path_dealloc,
    .tp_methods = path_methods,
};
