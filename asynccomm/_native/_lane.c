/* Optional accelerator: the fast lane's per-message path in C.
 *
 * ``send(comm, buf, dst, tag, handle, stream, timeout)`` and ``recv(comm, buf, src, tag,
 * handle, stream, timeout)`` (``ENTRY_ARGS``, as ``native.ENTRIES`` declares them) do what
 * ``Communicator._send_op``/``_recv_op`` and the Python steps (asynccomm/_engine/steps.py
 * ``offer``/``complete``, take.py ``take_now``/``post_now``) do for the commonest case: an
 * awaited op (or ``isend``/``irecv``) on the default stream or on an idle stream of the
 * user's (``stream.idle``: then on the fast lane only, never traced), with no timeout or
 * a valid one (``check_timeout``'s), an exact 1-D ndarray, an
 * exact destination and tag (a recv's source and tag may be wildcards, below), a message
 * under ``THREAD_COPY_MIN`` (one of
 * ``TIMED_COPY_MIN`` or more timed as the Python steps time it: matched before its copy,
 * finished after it).  In-process (traced or not) it does all of it; untraced, it also
 * posts a rendezvous send (past the eager limit, any size) that no recv is posted for
 * (``post_local``: announced at its receiver, waiting at its sender), which the recv that
 * takes it completes (_lane_steps.c ``sent_here``).  Across processes (an untraced MPI world) a send goes to the link's
 * ``send_now``, any size it takes (the C ``Path.send_now`` of _lane_mpi.c, which frames
 * it and hands it to MPI); a recv takes a staged message (the link's ``received`` sends
 * its credit back) or is posted here; and ``Path``'s landing of control messages hands
 * an eager message that lands to the recv posted for it.
 * A recv may name ``ANY_SOURCE`` or ``ANY_TAG``: it takes the earliest waiting message it
 * names (the matcher's wildcard indexes, ``waiting_wild``) or is posted, and a message
 * meets the earliest posted of the recvs that name it, exact or wildcard
 * (``posted_earliest``; both in _lane_objects.c).
 * Anything else, and any state the Python steps would judge (a tombstone, a misfit, a
 * rank's first wildcard recv to find messages waiting (its wildcard indexes are built
 * then), a full pool, a closed peer), returns "not handled"
 * having changed nothing, and the Python path runs from the start.  The Python steps are
 * the reference: this file writes the same fields in the same order, and the test suite
 * runs both.
 *
 * Every object it touches is slotted (the communicator, the engine, the matcher, the
 * staging pool, Request, Message, Stream, the flight recorder and its tallies), of the
 * exact class ``configure`` was given; its fields are read and written at the offsets of
 * their ``__slots__``, looked up by name once.  An object of any other class is not
 * handled.
 *
 * What it works with (the classes, the slots it reads and writes, the names it calls, the
 * constants, the wire header's layout) is declared once, in Python:
 * ``asynccomm._comm.native``, which checks it and hands it to ``configure``.
 *
 * The files (a DAG, see _lane.h): this one (the module: ``send``, ``recv`` and the module
 * table), _lane_mpi.c (the MPI link's per-message steps), _lane_steps.c and _lane_recv.c
 * (the receiving engine's steps), _lane_objects.c (builders, the matcher's deques, the
 * clock, the wire's charge), _lane_flight.c (the flight recorder's ring and tallies),
 * _lane_buffers.c (the Python steps' buffer judge and copy), _lane_config.c
 * (configuration and the running-loop check), _lane.h (what they share).
 */
#define LANE_IMPORTS_NUMPY
#include "_lane.h"

#include <math.h>
#include <pthread.h>

/* -- entry points -------------------------------------------------------------------- */

/* Whether ``s``, a Stream (exact class), would start an op posted on it now
 * (``stream.idle``): a stream of ``engine``, with nothing queued, nor pending where it
 * keeps its order.  1 or 0 (never an error: anything odd is "not idle", and the Python
 * steps say what is wrong). */
static int
stream_idle(PyObject *s, PyObject *engine)
{
    if (SLOT(s, S.owner) != engine) {
        return 0;
    }
    PyObject *q = SLOT(s, S.queue);
    Py_ssize_t n = q == NULL ? -1 : PySequence_Size(q);
    if (n != 0) {
        PyErr_Clear();
        return 0;
    }
    int ordered = slot_true(s, S.in_order);
    if (ordered <= 0) {
        PyErr_Clear();
        return ordered == 0;
    }
    PyObject *pending = SLOT(s, S.pending);
    long long queued;
    if (pending == NULL || slot_ll(s, S.queued, &queued) < 0
        || (n = PyObject_Size(pending)) < 0) {
        PyErr_Clear();
        return 0;
    }
    return n <= queued;
}

/* comm's engine, if this runs on comm's loop, the engine is open and on the fast lane (in
 * this process: traced or not, with a tracer the lane can keep; across processes, an MPI
 * link's ``send_now``: untraced only, a traced one numbers what arrives in Python), with
 * nothing queued on its default stream (new reference; *stream borrowed through the
 * engine; *remote: whether its peers are in other processes); NULL without an error when
 * not.  With ``user`` (a Stream of the caller's, not None): the engine on the fast lane
 * itself (never a traced one: its Python steps take a user's stream the general way) and
 * ``user`` idle (``stream_idle``), then *stream is ``user``. */
static PyObject *
fast_engine(PyObject *comm, PyObject *user, PyObject **stream, int *remote)
{
    PyObject *engine = slot_get(comm, CO.engine);
    if (engine == NULL || Py_TYPE(engine) != DeviceEngineType) {
        Py_XDECREF(engine);
        return NULL;
    }
    *remote = SLOT(engine, EN.peers) == Py_None;
    if (*remote && SLOT(engine, EN.tracer) != Py_None) {
        Py_DECREF(engine);
        return NULL;
    }
    PyObject *own = SLOT(comm, CO.loop);
    int same = own == NULL ? -1 : running(own);
    if (same <= 0) {
        Py_DECREF(engine);
        if (own == NULL) {
            PyErr_SetString(PyExc_AttributeError, "unset slot");
        }
        return NULL;
    }
    int t = slot_true(engine, EN.closed);
    int f = t == 0 ? slot_true(engine, EN.fast) : 0;
    if (f == 0 && t == 0 && !*remote && user == NULL) {
        f = slot_true(engine, EN.traced);
    }
    if (t != 0 || f != 1 || !trace_ok(engine)) {
        if (t < 0 || f < 0) {
            PyErr_Clear();
        }
        Py_DECREF(engine);
        return NULL;
    }
    if (user != NULL) {
        if (!stream_idle(user, engine)) {
            Py_DECREF(engine);
            return NULL;
        }
        *stream = user;
        return engine;
    }
    PyObject *s = slot_get(engine, EN.default_stream);
    if (s == NULL) {
        Py_DECREF(engine);
        return NULL;
    }
    Py_DECREF(s);  /* the engine keeps it */
    PyObject *q = Py_TYPE(s) == StreamType ? SLOT(s, S.queue) : NULL;
    if (q == NULL || PySequence_Size(q) != 0) {
        PyErr_Clear();
        Py_DECREF(engine);
        return NULL;
    }
    *stream = s;
    return engine;
}

/* An exact int in [0, hi). */
static int
in_range(PyObject *v, long hi)
{
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    int overflow;
    long x = PyLong_AsLongAndOverflow(v, &overflow);
    return !overflow && x >= 0 && x < hi;
}

/* Whether ``v`` is the int -1: ``ANY_SOURCE`` or ``ANY_TAG``, which a recv may name. */
static inline int
is_any(PyObject *v)
{
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    int overflow;
    return PyLong_AsLongAndOverflow(v, &overflow) == -1 && !overflow;
}

/* The arguments of ``send`` and ``recv`` (``native.ENTRIES``). */
#define ENTRY_ARGS 7

/* Whether ``v``, a ``timeout=`` that is not None, is one ``check_timeout`` accepts as it
 * is: an exact float or int, finite and >= 0 (an int a float can hold); its seconds in
 * *out.  Anything else (a subclass, a bool, a bad value) is left to the Python steps,
 * which raise the typed error.  1 or 0, never an error. */
static int
timeout_ok(PyObject *v, double *out)
{
    double x;
    if (PyFloat_CheckExact(v)) {
        x = PyFloat_AS_DOUBLE(v);
    } else if (PyLong_CheckExact(v)) {
        x = PyLong_AsDouble(v);
        if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();  /* (too large for a float: check_timeout says so) */
            return 0;
        }
    } else {
        return 0;
    }
    if (!(x >= 0) || isinf(x)) {
        return 0;
    }
    *out = x;
    return 1;
}

/* A call of send or recv: its arguments, the engine it runs on, the stream it goes on (the
 * default one, or the user's) and its own timeout (a float, new reference; NULL: None,
 * the communicator's default applies). */
struct call {
    PyObject *comm, *buf, *peer, *tag, *name, *engine, *stream, *timeout;
    Py_ssize_t nbytes, count;
    int handle, remote, user;
    int wild;  /* a recv from ANY_SOURCE or with ANY_TAG */
};

/* What a call that fits holds: its engine and its timeout. */
static void
call_release(struct call *c)
{
    Py_DECREF(c->engine);
    Py_XDECREF(c->timeout);
}

/* Whether a call fits the lane: 1 when ``comm`` is a Communicator, ``buf`` an exact 1-D
 * array of a known dtype (writable for a recv), the peer and tag exact ints in range (for a
 * recv either may be the wildcard -1: ``c->wild``), the
 * stream None or a Stream, the timeout None or a valid one (``timeout_ok``), and the
 * engine on the fast lane (``fast_engine``: c->engine and c->timeout are then held,
 * ``call_release``); 0 when not; -1 on an error. */
static int
accept_call(PyObject *const *args, Py_ssize_t nargs, int writable, const char *usage,
            struct call *c)
{
    if (nargs != ENTRY_ARGS) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (!ready) {
        return 0;
    }
    c->comm = args[0];
    c->buf = args[1];
    c->peer = args[2];
    c->tag = args[3];
    c->handle = PyObject_IsTrue(args[4]);
    if (c->handle < 0) {
        return -1;
    }
    if (Py_TYPE(c->comm) != CommunicatorType) {
        return 0;
    }
    PyObject *user = args[5], *timeout = args[6];
    double seconds = 0.0;
    c->user = user != Py_None;
    if ((c->user && Py_TYPE(user) != StreamType)
        || (timeout != Py_None && !timeout_ok(timeout, &seconds))) {
        return 0;
    }
    int j = judge_array(names, c->buf, writable, &c->name, &c->nbytes, &c->count);
    if (j <= 0) {
        return j;
    }
    long long size;
    c->wild = 0;
    if (!in_range(c->tag, TAG_UB + 1)) {
        if (!writable || !is_any(c->tag)) {
            return 0;
        }
        c->wild = 1;
    }
    if (slot_ll(c->comm, CO.size, &size) < 0) {
        return -1;
    }
    if (!in_range(c->peer, (long)size)) {
        if (!writable || !is_any(c->peer)) {
            return 0;
        }
        c->wild = 1;
    }
    c->engine = fast_engine(c->comm, c->user ? user : NULL, &c->stream, &c->remote);
    if (c->engine == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    c->timeout = NULL;
    if (timeout != Py_None) {  /* float(timeout), as check_timeout returns it */
        c->timeout = PyFloat_CheckExact(timeout) ? Py_NewRef(timeout)
            : PyFloat_FromDouble(seconds);
        if (c->timeout == NULL) {
            Py_CLEAR(c->engine);
            return -1;
        }
    }
    return 1;
}

/* The call's timeout: its own, else the communicator's default (None: none); a new
 * reference, NULL on an error. */
static inline PyObject *
call_timeout(struct call *c)
{
    return c->timeout != NULL ? Py_NewRef(c->timeout) : slot_get(c->comm, CO.default_timeout);
}

/* The call's new Request of ``kind`` (from ``source``) on the default stream, as
 * ``_send_op`` and ``_recv_op`` make it, with ``timeout``; NULL on an error.  (This one
 * and the next are ``inline``: the per-message paths take them without a call.) */
static inline PyObject *
call_request(struct call *c, PyObject *kind, PyObject *source, PyObject *timeout)
{
    return new_request(c->engine, kind, source, c->peer, c->tag, c->nbytes, c->count, c->name,
                       c->stream, timeout, c->buf);
}

/* The call's Request of ``kind`` done as it was made, as ``_send_op`` and ``_recv_op``
 * hand it back (``finished``): with the call's timeout (``call_timeout``), its ``flow`` (a
 * traced world's id, else NULL), DONE with ``result`` (stolen), posted and matched at
 * ``t0`` (a timed copy's start, else ``t``) and finished at ``t``; NULL on an error. */
static inline PyObject *
done_request(struct call *c, PyObject *kind, PyObject *source, PyObject *flow,
             PyObject *result, double t0, double t)
{
    PyObject *timeout = call_timeout(c);
    PyObject *req = timeout == NULL ? NULL : call_request(c, kind, source, timeout);
    Py_XDECREF(timeout);
    if (req == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    if (flow != NULL) {
        put_ref(req, M.flow, flow);
    }
    if (finish_now(req, result, t0, t) < 0) {
        Py_CLEAR(req);
    }
    return req;
}

/* What ``_send_op`` does for a send the fast lane finished as it was posted, at ``t``:
 * record it, then True, or with ``handle`` its done Request (from ``rank``, with ``flow``
 * in a traced world, else NULL); NULL on an error. */
static PyObject *
sent_as_posted(struct call *c, PyObject *rank, double t, PyObject *flow)
{
    if (record(c->engine, 0, c->peer, c->tag, c->nbytes, zero, t, t, t, flow) < 0) {
        return NULL;
    }
    if (!c->handle) {
        Py_RETURN_TRUE;
    }
    return done_request(c, K_SEND, rank, flow, Py_NewRef(Py_None), t, t);
}

/* A send to another process (``c->remote``): the MPI link's ``send_now`` (Python) sends it
 * eagerly, or refuses having done nothing (False: the Python path must run); then
 * ``sent_as_posted``. */
static PyObject *
send_remote(struct call *c)
{
    PyObject *link = slot_get(c->engine, EN.link);
    PyObject *nb = PyLong_FromSsize_t(c->nbytes), *cnt = PyLong_FromSsize_t(c->count);
    PyObject *r = NULL;
    if (link != NULL && nb != NULL && cnt != NULL) {
        PyObject *argv[7] = {link, c->peer, c->tag, c->buf, nb, cnt, c->name};
        r = PyObject_VectorcallMethod(a_send_now, argv, 7, NULL);
    }
    Py_XDECREF(nb);
    Py_XDECREF(cnt);
    Py_XDECREF(link);
    int sent = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (sent <= 0) {
        return sent < 0 ? NULL : Py_NewRef(Py_False);
    }
    double t;
    PyObject *rank = now_of(c->engine, &t) < 0 ? NULL : slot_get(c->comm, CO.rank);
    PyObject *out = rank == NULL ? NULL : sent_as_posted(c, rank, t, NULL);
    Py_XDECREF(rank);
    return out;
}

/* ``fast.bytes_of``: a 1-D array's bytes (a memoryview of format "B"); NULL on an
 * error. */
static PyObject *
bytes_of(PyObject *buf)
{
    PyObject *view = PyMemoryView_FromObject(buf);
    if (view != NULL) {
        const char *f = PyMemoryView_GET_BUFFER(view)->format;
        if (f != NULL && strcmp(f, "B") != 0) {
            PyObject *b = PyUnicode_FromStringAndSize("B", 1);
            PyObject *argv[2] = {view, b};
            Py_SETREF(view, b == NULL ? NULL : PyObject_VectorcallMethod(a_cast, argv, 2, NULL));
            Py_XDECREF(b);
        }
    }
    return view;
}

/* What ``_send_op``, ``Stream._submit``, the engine's ``start`` and ``track``, the instant
 * link's ``send`` and the receiving engine's ``arrived`` do for a rendezvous send in this
 * process that no recv is posted for (``offer`` said 4): a Request (from ``rank``),
 * POSTED with its bytes' view, announced at ``peer`` (it waits there, at its sender, for
 * its recv: ``announce``), tracked on its stream (the default one or the user's idle one)
 * and its timer armed where it has a timeout.  The Request; NULL on an error. */
static PyObject *
post_local(struct call *c, PyObject *rank, PyObject *peer)
{
    PyObject *timeout = call_timeout(c);
    if (timeout == NULL) {
        return NULL;
    }
    PyObject *engine = c->engine;
    PyObject *req = call_request(c, K_SEND, rank, timeout);
    PyObject *view = req == NULL || start_now(engine, req) < 0 ? NULL : bytes_of(c->buf);
    if (view == NULL) {
        Py_XDECREF(req);
        Py_DECREF(timeout);
        return NULL;
    }
    put(req, M.view, view);
    int done = announce(peer, req) < 0 ? -1 : track_unless_done(engine, c->stream, req);
    if (done < 0 || (done == 0 && timeout != Py_None && arm_timer(engine, req, timeout) < 0)) {
        Py_CLEAR(req);
    }
    Py_DECREF(timeout);
    return req;
}

/* What ``_send_op``, ``Stream._submit`` and the engine's ``start`` and ``track`` do for a
 * send to another process that ``send_now`` refused (a message the link announces, or one
 * waiting for credit): a Request, POSTED with its bytes' view, handed to the link's
 * ``send``, then, unless that finished it, tracked on its stream (the default one or the
 * user's idle one) and its timer armed where it has a timeout.  The Request; NULL on an
 * error. */
static PyObject *
post_remote(struct call *c)
{
    PyObject *timeout = call_timeout(c);
    if (timeout == NULL) {
        return NULL;
    }
    PyObject *engine = c->engine;
    PyObject *rank = slot_get(c->comm, CO.rank);
    PyObject *req = rank == NULL ? NULL : call_request(c, K_SEND, rank, timeout);
    Py_XDECREF(rank);
    if (req == NULL || start_now(engine, req) < 0) {
        Py_XDECREF(req);
        Py_DECREF(timeout);
        return NULL;
    }
    PyObject *view = bytes_of(c->buf);
    PyObject *link = view == NULL ? NULL : slot_get(engine, EN.link);
    if (link == NULL) {
        Py_XDECREF(view);
        Py_DECREF(req);
        Py_DECREF(timeout);
        return NULL;
    }
    put(req, M.view, view);
    PyObject *argv[3] = {link, req, c->peer};
    PyObject *r = PyObject_VectorcallMethod(a_link_send, argv, 3, NULL);
    Py_DECREF(link);
    /* failed at once: never tracked; else tracked, and its timer armed (the engine's
     * ``track``) */
    int done = r == NULL ? -1 : track_unless_done(engine, c->stream, req);
    if (done < 0 || (done == 0 && timeout != Py_None && arm_timer(engine, req, timeout) < 0)) {
        Py_CLEAR(req);
    }
    Py_XDECREF(r);
    Py_DECREF(timeout);
    return req;
}

/* send(comm, buf, dst, tag, handle, stream, timeout) -> bool | Request: once the
 * message went the fast lane (the send is done, and recorded), True, or with ``handle``
 * its Request; a send to another process that waits for its recv: its posted Request
 * (``post_remote``); False, having done nothing, when the Python path must run. */
static PyObject *
lane_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct call c;
    int fits = accept_call(args, nargs, 0, "send(comm, buf, dst, tag, handle, stream, timeout)",
                           &c);
    if (fits > 0 && c.remote) {
        PyObject *out = send_remote(&c);
        if (out == Py_False) {  /* not sent eagerly: posted as the Python steps post it */
            Py_SETREF(out, post_remote(&c));
        }
        call_release(&c);
        return out;
    }
    if (fits <= 0 || (c.nbytes >= THREAD_COPY_MIN && SLOT(c.engine, EN.tracer) != Py_None)) {
        if (fits > 0) {  /* (copied on the worker thread: only posted here, untraced) */
            call_release(&c);
        }
        if (fits < 0) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    PyObject *comm = c.comm, *buf = c.buf, *dst = c.peer, *tag = c.tag, *name = c.name;
    PyObject *engine = c.engine;
    Py_ssize_t nbytes = c.nbytes, count = c.count;
    PyObject *result = NULL, *peers = NULL, *rank = NULL, *flow = NULL, *k = NULL;
    PyObject *tracer = NULL;
    peers = slot_get(engine, EN.peers);  /* a list: fast_engine saw it */
    if (peers == NULL) {
        goto done;
    }
    PyObject *peer = PyObject_GetItem(peers, dst);
    if (peer == NULL) {
        goto done;
    }
    if (Py_TYPE(peer) != DeviceEngineType) {
        Py_DECREF(peer);
        result = Py_NewRef(Py_False);
        goto done;
    }
    rank = slot_get(comm, CO.rank);
    if (SLOT(engine, EN.tracer) != Py_None) {  /* traced: number the message */
        tracer = Py_NewRef(SLOT(engine, EN.tracer));  /* (offer() may run Python code) */
        flow = rank == NULL ? NULL : next_flow(engine, dst, &k);
        if (flow == NULL) {
            Py_DECREF(peer);
            goto done;
        }
    }
    double t = -1.0;  /* when a recv the message completed finished: the send's time too */
    /* (untraced, a rendezvous no recv is posted for is posted here: 4) */
    int r = rank == NULL ? -1 : offer(peer, rank, tag, PyArray_BYTES((PyArrayObject *)buf),
                                      nbytes, count, name, flow, tracer == NULL ? 2 : 1, &t);
    if (r == 4) {
        result = post_local(&c, rank, peer);
        Py_DECREF(peer);
        goto done;
    }
    Py_DECREF(peer);
    if (r <= 0) {
        if (r == 0) {
            result = Py_NewRef(Py_False);
        }
        goto done;
    }
    if (flow != NULL && PyObject_SetItem(SLOT(tracer, TR.sent), dst, k) < 0) {
        goto done;  /* (the number is kept once the message went) */
    }
    if (t < 0 && now_of(engine, &t) < 0) {
        goto done;
    }
    result = sent_as_posted(&c, rank, t, flow);
done:
    Py_XDECREF(flow);
    Py_XDECREF(k);
    Py_XDECREF(tracer);
    Py_XDECREF(rank);
    Py_XDECREF(peers);
    call_release(&c);
    return result;
}

/* recv(comm, buf, src, tag, handle, stream, timeout) -> Status | Request | None: the
 * Status of a message already waiting (taken; with ``handle``, its done Request); else the
 * posted Request to await (tracked on its stream, its timer armed); None, having done
 * nothing, when the Python path must run. */
static PyObject *
lane_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct call c;
    int fits = accept_call(args, nargs, 1, "recv(comm, buf, src, tag, handle, stream, timeout)",
                           &c);
    if (fits <= 0) {
        if (fits < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *buf = c.buf, *src = c.peer, *tag = c.tag, *name = c.name;
    PyObject *engine = c.engine, *stream = c.stream;
    Py_ssize_t nbytes = c.nbytes;
    int handle = c.handle;
    PyObject *result = NULL, *matcher = NULL, *key = NULL, *timeout = NULL, *req = NULL;
    int t = slot_true(engine, EN.pending_recvs);
    if (t < 0) {
        goto done;
    }
    if (t) {  /* another recv is pending: its buffer must not overlap this one */
        /* The engine's check_recv_buffer, inlined where its index is built (the C one)
         * and finds no overlap; else it runs (it builds the index, or says which). */
        PyObject *rb = SLOT(engine, EN.recv_buffers), *owner = NULL;
        if (rb != NULL && pending_exact(rb)) {
            if (pending_conflict(rb, buf, nbytes, &owner) < 0) {
                goto done;
            }
            t = owner != NULL;
        }
    }
    if (t) {
        PyObject *n = PyLong_FromSsize_t(nbytes);
        PyObject *r = n == NULL ? NULL : PyObject_CallMethodObjArgs(
            engine, a_check_recv_buffer, buf, n, NULL);
        Py_XDECREF(n);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    t = c.remote ? 1 : slot_true(engine, EN.instant);
    if (t <= 0) {
        result = t < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    matcher = slot_get(engine, EN.matcher);
    if (matcher != NULL && Py_TYPE(matcher) != MatcherType) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    key = matcher == NULL ? NULL : PyTuple_Pack(2, src, tag);
    if (key == NULL) {
        goto done;
    }
    long long n_unexp;
    if (slot_ll(matcher, MA.n_unexp, &n_unexp) < 0) {
        goto done;
    }
    char *data = PyArray_BYTES((PyArrayObject *)buf);
    if (n_unexp) {
        /* the (source, tag) of the message it takes: its own, or a wildcard's earliest */
        PyObject *wkey = NULL;
        int has;
        if (c.wild) {
            has = waiting_wild(matcher, src, tag, &wkey);
            if (has == 2) {  /* (the wildcard indexes not built: the Python steps build them) */
                result = Py_NewRef(Py_None);
                goto done;
            }
        } else {
            PyObject *index = slot_get(matcher, MA.unexp);
            if (index == NULL) {
                goto done;
            }
            has = PyDict_CheckExact(index) ? PyDict_Contains(index, key) : -1;
            Py_DECREF(index);
        }
        if (has < 0) {
            if (!PyErr_Occurred()) {
                result = Py_NewRef(Py_None);
            }
            goto done;
        }
        if (has) {  /* taken, or not handled: nothing else is tried here */
            double started = 0.0, when = 0.0;
            PyObject *flow = NULL, *at = wkey != NULL ? wkey : key;
            result = take(engine, matcher, at, PyTuple_GET_ITEM(at, 0), PyTuple_GET_ITEM(at, 1),
                          data, nbytes, name, &started, &when, &flow);
            Py_XDECREF(wkey);
            if (result == NULL || result == Py_None || !handle) {
                Py_XDECREF(flow);
                goto done;
            }
            /* (its flow: what recv_traced sets) */
            req = done_request(&c, K_RECV, src,
                               SLOT(engine, EN.tracer) != Py_None ? flow : NULL, result,
                               started, when);
            Py_DECREF(flow);
            result = req == NULL ? NULL : Py_NewRef(req);
            goto done;
        }
    }
    if (c.user) {
        /* A peer gone: the engine's ``start`` withdraws the recv before its stream tracks
         * it, ``post`` after: the Python steps take it. */
        int gone = slot_true(engine, EN.gone);
        if (gone != 0) {
            result = gone < 0 ? NULL : Py_NewRef(Py_None);
            goto done;
        }
    }
    timeout = call_timeout(&c);
    if (timeout == NULL) {
        goto done;
    }
    req = call_request(&c, K_RECV, src, timeout);
    if (req == NULL || post(engine, matcher, key, req, stream, nbytes, timeout, c.wild) < 0) {
        goto done;
    }
    result = Py_NewRef(req);
done:
    Py_XDECREF(req);
    Py_XDECREF(timeout);
    Py_XDECREF(key);
    Py_XDECREF(matcher);
    call_release(&c);
    return result;
}

/* charge(nbytes) -> int: ``wire.charge``, as the lane counts it. */
static PyObject *
lane_charge(PyObject *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "charge(nbytes): nbytes >= 0");
        return NULL;
    }
    return PyLong_FromLongLong(charge(n));
}

/* perf_counter() -> float: the lane's reading of ``time.perf_counter``. */
static PyObject *
lane_perf_counter(PyObject *self, PyObject *unused)
{
    double t;
    return perf_clock(&t) < 0 ? NULL : PyFloat_FromDouble(t);
}

/* woken() -> int: how many waiting tasks the lane has woken so far (``lane_woken``): a
 * poll that sees it move has made a task ready (``Progress.wait_here``). */
static PyObject *
lane_woken_count(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLong(lane_woken);
}

static PyMethodDef methods[] = {
    {"send", (PyCFunction)(void (*)(void))lane_send, METH_FASTCALL,
     "send(comm, buf, dst, tag, handle, stream, timeout) -> bool | Request"},
    {"recv", (PyCFunction)(void (*)(void))lane_recv, METH_FASTCALL,
     "recv(comm, buf, src, tag, handle, stream, timeout) -> Status | Request | None"},
    {"configure", configure, METH_O, "configure(spec): what the lane works with"},
    {"inspect", (PyCFunction)(void (*)(void))buffers_inspect, METH_FASTCALL,
     "inspect(buf, writable) -> (name, nbytes, count) or None"},
    {"copy", (PyCFunction)(void (*)(void))buffers_copy, METH_FASTCALL,
     "copy(dst, src, nbytes): copy the first nbytes bytes of src into dst"},
    {"address", buffers_address, METH_O, "address(buf) -> int: the address of its first byte"},
    {"set_dtype_names", set_dtype_names, METH_O,
     "set_dtype_names(names): the dtype -> name dict of inspect and the lane"},
    {"charge", lane_charge, METH_O, "charge(nbytes) -> int: wire.charge, as the lane counts"},
    {"mpi_calls", (PyCFunction)(void (*)(void))lane_mpi_calls, METH_FASTCALL,
     "mpi_calls(library, byte) -> bool: call MPI_Test, MPI_Start, MPI_Isend, MPI_Irecv "
     "directly"},
    {"perf_counter", lane_perf_counter, METH_NOARGS,
     "perf_counter() -> float: the lane's reading of time.perf_counter"},
    {"woken", lane_woken_count, METH_NOARGS,
     "woken() -> int: how many waiting tasks the lane has woken so far"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lane",
    "Optional accelerator: asynccomm's fast lane, per message, in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__lane(void)
{
    import_array();
    if (make_constants() < 0) {
        return NULL;
    }
    if (pthread_atfork(NULL, NULL, forget_in_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork");
        return NULL;
    }
    if (PyType_Ready(&RingType) < 0 || PyType_Ready(&TallyCType) < 0
        || PyType_Ready(&PathType) < 0 || PyType_Ready(&ShmPathType) < 0
        || PyType_Ready(&ShmNodeType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (shm_add(m) < 0 || pending_add(m) < 0
        || PyModule_AddObjectRef(m, "Path", (PyObject *)&PathType) < 0
        || PyModule_AddObjectRef(m, "ShmPath", (PyObject *)&ShmPathType) < 0
        || PyModule_AddObjectRef(m, "ShmNode", (PyObject *)&ShmNodeType) < 0
        || PyModule_AddObjectRef(m, "Ring", (PyObject *)&RingType) < 0
        || PyModule_AddObjectRef(m, "Tally", (PyObject *)&TallyCType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *all = Py_BuildValue("[sssssssssssssssss]", "Path", "PendingBuffers", "Ring",
                                  "ShmNode", "ShmPath", "Tally", "Words",
                                  "address", "charge", "configure", "copy", "inspect",
                                  "perf_counter", "readv", "recv", "send", "set_dtype_names");
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
