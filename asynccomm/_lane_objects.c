/* The C lane's objects (see _lane.c): what ``configure`` fills in, the clock, buffers,
 * the builders of Status tuples, requests and flight records, the matcher's deques, and
 * the running-loop check. */
#include "_lane.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

/* -- what configure() fills in ------------------------------------------------------- */

int ready = 0;
PyObject *names, *get_running_loop, *perf_counter, *deque_type;
PyTypeObject *RequestType, *MessageType, *StatusType, *StreamType, *FlightType, *TallyType,
    *MatcherType, *PoolType, *CommType, *EngineType, *TraceType;
PyObject *K_SEND, *K_RECV, *S_QUEUED, *S_POSTED, *S_DONE, *W_AT_SENDER, *W_STAGED;
long TAG_UB, MIN_BUCKET, MESSAGE_OVERHEAD;
Py_ssize_t TIMED_COPY_MIN;
PyObject *zero, *minus_one, *minus_one_f;
struct message_slots M;
struct request_slots R;
struct stream_slots S;
struct flight_slots F;
struct tally_slots T;
struct trace_slots TR;
struct matcher_slots MA;
struct comm_slots CO;
struct engine_slots EN;
struct pool_slots PO;
PyObject *a_untrack, *a_drain, *a_index_add, *a_fire_probes, *a_unindex, *a_first_wait,
    *a_unreachable, *a_withdraw, *a_broken, *a_on_timeout, *a_call_later, *a_add_buffer,
    *a_check_recv_buffer, *a_append, *a_popleft, *a_done, *a_set_result, *a_cancel;
static PyObject *holder_key;
static PyObject *deque_append, *deque_popleft;  /* deque's own methods */

/* deque.append(d, item) or deque.popleft(d) (item NULL) called as the unbound method (no
 * lookup on the instance); a subclass of deque is called by name. */
static PyObject *
deque_call(PyObject *method, PyObject *d, PyObject *item)
{
    if (Py_TYPE(d) != (PyTypeObject *)deque_type) {
        return item == NULL ? PyObject_CallMethodNoArgs(d, a_popleft)
                            : PyObject_CallMethodOneArg(d, a_append, item);
    }
    PyObject *args[2] = {d, item};
    return PyObject_Vectorcall(method, args, item == NULL ? 1 : 2, NULL);
}

/* -- the clock ----------------------------------------------------------------------- */

/* engine.now() as a double.  When that is time.perf_counter, the same reading is made
 * here: CLOCK_MONOTONIC in nanoseconds, as a double divided by 1e9 (what CPython does). */
int
now_of(PyObject *engine, double *t)
{
    PyObject *now = slot_get(engine, EN.now);
    if (now == NULL) {
        return -1;
    }
    if (now == perf_counter) {
        struct timespec ts;
        Py_DECREF(now);
        if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        *t = (double)((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec) / 1e9;
        return 0;
    }
    PyObject *v = PyObject_CallNoArgs(now);
    Py_DECREF(now);
    if (v == NULL) {
        return -1;
    }
    *t = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*t == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* -- buffers ------------------------------------------------------------------------- */

/* An exact 1-D C-contiguous (writeable if asked) ndarray of a known dtype: its name
 * (borrowed), byte size and element count; 0 when it is not one. */
int
judge(PyObject *buf, int writable, PyObject **name, Py_ssize_t *nbytes, Py_ssize_t *count)
{
    if (Py_TYPE(buf) != &PyArray_Type) {
        return 0;
    }
    PyArrayObject *arr = (PyArrayObject *)buf;
    int need = NPY_ARRAY_C_CONTIGUOUS | (writable ? NPY_ARRAY_WRITEABLE : 0);
    if (PyArray_NDIM(arr) != 1 || (PyArray_FLAGS(arr) & need) != need) {
        return 0;
    }
    PyObject *n = PyDict_GetItemWithError(names, (PyObject *)PyArray_DESCR(arr));
    if (n == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    *name = n;
    *count = (Py_ssize_t)PyArray_DIM(arr, 0);
    *nbytes = *count * (Py_ssize_t)PyArray_ITEMSIZE(arr);
    return 1;
}

/* The writable bytes of a recv's array (an exact C-contiguous writeable ndarray), or
 * NULL. */
char *
array_bytes(PyObject *a, int writable, Py_ssize_t *len)
{
    if (a == NULL || Py_TYPE(a) != &PyArray_Type) {
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)a;
    int need = NPY_ARRAY_C_CONTIGUOUS | (writable ? NPY_ARRAY_WRITEABLE : 0);
    if ((PyArray_FLAGS(arr) & need) != need) {
        return NULL;
    }
    *len = (Py_ssize_t)PyArray_NBYTES(arr);
    return PyArray_BYTES(arr);
}

/* -- small builders ------------------------------------------------------------------ */

/* Status(source, tag, nbytes, count, shape): what tuple.__new__(Status, ...) makes. */
PyObject *
new_status(PyObject *source, PyObject *tag, Py_ssize_t nbytes, Py_ssize_t count,
           PyObject *shape)
{
    PyObject *st = StatusType->tp_alloc(StatusType, 5);
    if (st == NULL) {
        return NULL;
    }
    PyObject *n = PyLong_FromSsize_t(nbytes);
    PyObject *c = PyLong_FromSsize_t(count);
    if (shape == NULL || shape == Py_None) {
        shape = c == NULL ? NULL : PyTuple_Pack(1, c);
    } else {
        Py_INCREF(shape);
    }
    if (n == NULL || c == NULL || shape == NULL) {
        Py_XDECREF(n);
        Py_XDECREF(c);
        Py_XDECREF(shape);
        Py_DECREF(st);
        return NULL;
    }
    Py_INCREF(source);
    Py_INCREF(tag);
    PyTuple_SET_ITEM(st, 0, source);
    PyTuple_SET_ITEM(st, 1, tag);
    PyTuple_SET_ITEM(st, 2, n);
    PyTuple_SET_ITEM(st, 3, c);
    PyTuple_SET_ITEM(st, 4, shape);
    return st;
}

/* The entry as a tuple, appended to ``ring`` (a deque, or a Ring) and, in a traced world,
 * to the rank's trace with the message's flow (``RankTrace.add``; trace_ok vetted it). */
static int
append_entry(PyObject *ring, PyObject *tracer, int kind, PyObject *peer, PyObject *tag,
             Py_ssize_t nbytes, PyObject *sid, double t_post, double t_match, double t_fin,
             PyObject *flow)
{
    PyObject *entry = PyTuple_New(9);
    if (entry == NULL) {
        return -1;
    }
    PyObject *k = PyLong_FromLong(kind), *n = PyLong_FromSsize_t(nbytes);
    PyObject *tp = PyFloat_FromDouble(t_post);
    PyObject *tm = t_match == t_post ? (Py_XINCREF(tp), tp) : PyFloat_FromDouble(t_match);
    PyObject *tf = t_fin == t_match ? (Py_XINCREF(tm), tm) : PyFloat_FromDouble(t_fin);
    Py_INCREF(peer);
    Py_INCREF(tag);
    Py_INCREF(sid);
    Py_INCREF(zero);
    PyTuple_SET_ITEM(entry, 0, k);
    PyTuple_SET_ITEM(entry, 1, peer);
    PyTuple_SET_ITEM(entry, 2, tag);
    PyTuple_SET_ITEM(entry, 3, n);
    PyTuple_SET_ITEM(entry, 4, sid);
    PyTuple_SET_ITEM(entry, 5, zero);
    PyTuple_SET_ITEM(entry, 6, tp);
    PyTuple_SET_ITEM(entry, 7, tm);
    PyTuple_SET_ITEM(entry, 8, tf);
    if (k == NULL || n == NULL || tp == NULL || tm == NULL || tf == NULL) {
        Py_DECREF(entry);
        return -1;
    }
    PyObject *r = Py_TYPE(ring) == (PyTypeObject *)deque_type
        ? deque_call(deque_append, ring, entry) : PyObject_CallMethodOneArg(ring, a_append, entry);
    if (r == NULL) {
        Py_DECREF(entry);
        return -1;
    }
    Py_DECREF(r);
    if (tracer != Py_None) {
        PyObject *op = PyTuple_Pack(3, entry, flow == NULL ? zero : flow, Py_None);
        PyObject *ops = SLOT(tracer, TR.ops);
        int rc = op == NULL || ops == NULL || !PyList_Check(ops) ? -1 : PyList_Append(ops, op);
        Py_XDECREF(op);
        if (rc < 0) {
            Py_DECREF(entry);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "a rank trace's ops");
            }
            return -1;
        }
    }
    Py_DECREF(entry);
    return 0;
}

/* flight.ring.append((kind, peer, tag, nbytes, sid, 0, t_post, t_match, t_fin)) and the
 * tally of (kind, peer): what FlightRecorder.add does for a finished send or recv. */
int
record(PyObject *engine, int kind, PyObject *peer, PyObject *tag, Py_ssize_t nbytes,
       PyObject *sid, double t_post, double t_match, double t_fin, PyObject *flow)
{
    PyObject *flight = SLOT(engine, EN.flight);
    if (flight == NULL || Py_TYPE(flight) != FlightType) {
        PyErr_SetString(PyExc_TypeError, "the engine's flight recorder");
        return -1;
    }
    PyObject *ring = SLOT(flight, F.ring), *tracer = SLOT(engine, EN.tracer);
    if (ring == NULL || tracer == NULL) {
        PyErr_SetString(PyExc_TypeError, "the engine's flight recorder");
        return -1;
    }
    if (Py_TYPE(ring) == &RingType && tracer == Py_None) {  /* numbers, straight in */
        long long p = PyLong_AsLongLong(peer), g = PyLong_AsLongLong(tag);
        long long s = PyLong_AsLongLong(sid);
        if (PyErr_Occurred()) {
            return -1;
        }
        ring_push(ring, kind, p, g, nbytes, s, 0, t_post, t_match, t_fin);
    } else if (append_entry(ring, tracer, kind, peer, tag, nbytes, sid, t_post, t_match,
                            t_fin, flow) < 0) {
        return -1;
    }
    PyObject *tallies = SLOT(flight, kind ? F.recvs : F.sends);
    if (tallies == NULL || !PyDict_Check(tallies)) {
        PyErr_SetString(PyExc_TypeError, "the flight recorder's tallies");
        return -1;
    }
    PyObject *tally = PyDict_GetItemWithError(tallies, peer);
    if (tally != NULL) {
        Py_INCREF(tally);
    } else if (PyErr_Occurred()
               || (tally = PyObject_GetItem(tallies, peer)) == NULL) {  /* __missing__ */
        return -1;
    }
    if (Py_TYPE(tally) == &TallyCType) {
        tally_add(tally, nbytes, t_match - t_post, t_fin - t_match);
        Py_DECREF(tally);
        return 0;
    }
    int rc = -1;
    long long tn, tb;
    double tw, tc;
    if (Py_TYPE(tally) != TallyType) {
        PyErr_SetString(PyExc_TypeError, "a flight tally");
        goto done;
    }
    if (slot_ll(tally, T.n, &tn) < 0 || slot_ll(tally, T.nbytes, &tb) < 0
        || slot_double(tally, T.w, &tw) < 0 || slot_double(tally, T.c, &tc) < 0) {
        goto done;
    }
    PyObject *vn = PyLong_FromLongLong(tn + 1), *vb = PyLong_FromLongLong(tb + nbytes);
    PyObject *vw = t_match == t_post ? NULL : PyFloat_FromDouble(tw + (t_match - t_post));
    PyObject *vc = t_fin == t_match ? NULL : PyFloat_FromDouble(tc + (t_fin - t_match));
    if (vn == NULL || vb == NULL || (t_match != t_post && vw == NULL)
        || (t_fin != t_match && vc == NULL)) {
        Py_XDECREF(vn);
        Py_XDECREF(vb);
        Py_XDECREF(vw);
        Py_XDECREF(vc);
        goto done;
    }
    put(tally, T.n, vn);
    put(tally, T.nbytes, vb);
    if (vw != NULL) {
        put(tally, T.w, vw);
    }
    if (vc != NULL) {
        put(tally, T.c, vc);
    }
    rc = 0;
done:
    Py_DECREF(tally);
    return rc;
}

/* Whether the lane can trace for ``engine``: no tracer, or the world's own RankTrace
 * (a sub-communicator's, labelled, numbers its messages with strings: Python's; so do
 * worlds too large for a flow id in 64 bits here). */
int
trace_ok(PyObject *engine)
{
    PyObject *tracer = SLOT(engine, EN.tracer);
    if (tracer == Py_None) {
        return 1;
    }
    if (tracer == NULL || Py_TYPE(tracer) != TraceType) {
        return 0;
    }
    PyObject *label = SLOT(tracer, TR.label), *size = SLOT(tracer, TR.size);
    if (size == NULL || !PyLong_CheckExact(size)) {
        return 0;
    }
    long n = PyLong_AsLong(size);
    if (n == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return label != NULL && PyUnicode_CheckExact(label) && PyUnicode_GET_LENGTH(label) == 0
        && n >= 0 && n < 32768;
}

/* The flow id of the next message from ``engine``'s rank to ``dst`` (``RankTrace.fid`` of
 * ``sent[dst] + 1``, which is *k), in a world trace_ok allowed; NULL on an error. */
PyObject *
next_flow(PyObject *engine, PyObject *dst, PyObject **k)
{
    PyObject *tracer = SLOT(engine, EN.tracer);
    PyObject *sent = SLOT(tracer, TR.sent), *size = SLOT(tracer, TR.size);
    long long rank, n = 0, s, d;
    if (sent == NULL || !PyDict_Check(sent) || size == NULL
        || slot_ll(engine, EN.rank, &rank) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "a rank trace");
        }
        return NULL;
    }
    PyObject *have = PyDict_GetItemWithError(sent, dst);  /* a defaultdict(int): 0 if absent */
    if ((have == NULL && PyErr_Occurred()) || (have != NULL && (n = PyLong_AsLongLong(have)) == -1
                                                && PyErr_Occurred())) {
        return NULL;
    }
    s = PyLong_AsLongLong(size);
    d = PyLong_AsLongLong(dst);
    if (PyErr_Occurred()) {
        return NULL;
    }
    *k = PyLong_FromLongLong(n + 1);
    PyObject *flow = PyLong_FromLongLong(((rank * s + d) << 32) + n + 1);
    if (*k == NULL || flow == NULL) {
        Py_CLEAR(*k);
        Py_XDECREF(flow);
        return NULL;
    }
    return flow;
}

/* -- the matcher's deques ----------------------------------------------------------- */


/* The live head of deque ``bucket`` (borrowed through the deque), or NULL (no error) when
 * the first item is a tombstone (seq <= 0): the Python steps judge those. */
PyObject *
live_head(PyObject *bucket)
{
    if (PySequence_Size(bucket) <= 0) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *head = PySequence_GetItem(bucket, 0);
    if (head == NULL) {
        return NULL;
    }
    Py_DECREF(head);  /* the deque holds it */
    if (!PyObject_TypeCheck(head, MessageType)) {
        return NULL;
    }
    PyObject *seq = SLOT(head, M.seq);
    if (seq == NULL || !PyLong_CheckExact(seq) || PyLong_AsLong(seq) <= 0) {
        return NULL;
    }
    return head;
}

/* Empty deques kept for the next bucket: a bucket is dropped once empty (as the matcher
 * does), and a ping-pong makes and drops one per message. */
#define SPARE_MAX 16
static PyObject *spare[SPARE_MAX];
static int n_spare;

/* bucket.popleft(); del index[key] once it is empty. */
int
pop_head(PyObject *index, PyObject *key, PyObject *bucket)
{
    PyObject *r = deque_call(deque_popleft, bucket, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    Py_ssize_t left = PySequence_Size(bucket);
    if (left < 0) {
        return -1;
    }
    if (left) {
        return 0;
    }
    Py_INCREF(bucket);
    int rc = PyDict_DelItem(index, key);
    if (rc == 0 && Py_REFCNT(bucket) == 1 && n_spare < SPARE_MAX
        && Py_TYPE(bucket) == (PyTypeObject *)deque_type) {
        spare[n_spare++] = bucket;  /* ours alone: nothing else can see it again */
    } else {
        Py_DECREF(bucket);
    }
    return rc;
}

/* index.setdefault(key, deque()).append(item) */
int
push(PyObject *index, PyObject *key, PyObject *item)
{
    PyObject *bucket = PyDict_GetItemWithError(index, key);
    if (bucket == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        if (n_spare) {
            bucket = spare[--n_spare];
            PyObject *r = deque_call(deque_append, bucket, item);
            if (r == NULL) {
                Py_DECREF(bucket);
                return -1;
            }
            Py_DECREF(r);
        } else {
            PyObject *one = PyTuple_Pack(1, item);
            bucket = one == NULL ? NULL : PyObject_CallOneArg(deque_type, one);
            Py_XDECREF(one);
            if (bucket == NULL) {
                return -1;
            }
        }
        int rc = PyDict_SetItem(index, key, bucket);
        Py_DECREF(bucket);
        return rc;
    }
    PyObject *r = deque_call(deque_append, bucket, item);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

PyObject *
call_method1(PyObject *o, PyObject *name, PyObject *arg)
{
    return PyObject_CallMethodOneArg(o, name, arg);
}

/* -- requests done as they are made --------------------------------------------------- */

/* A new Request, as Request(engine, kind, peer, tag, None, nbytes, count, dtype, stream,
 * timeout, array) makes it (its source: the engine's rank for a send, else ``peer``). */
PyObject *
new_request(PyObject *engine, PyObject *kind, PyObject *source, PyObject *peer,
            PyObject *tag, Py_ssize_t nbytes, Py_ssize_t count, PyObject *dtype,
            PyObject *stream, PyObject *timeout, PyObject *array)
{
    PyObject *req = RequestType->tp_alloc(RequestType, 0);
    if (req == NULL) {
        return NULL;
    }
    PyObject *vn = PyLong_FromSsize_t(nbytes), *vc = PyLong_FromSsize_t(count);
    if (vn == NULL || vc == NULL) {
        Py_XDECREF(vn);
        Py_XDECREF(vc);
        Py_DECREF(req);
        return NULL;
    }
    put_ref(req, M.source, source);
    put_ref(req, M.tag, tag);
    put(req, M.nbytes, vn);
    put(req, M.count, vc);
    put_ref(req, M.dtype, dtype);
    put_ref(req, M.seq, minus_one);
    put_ref(req, M.where, W_AT_SENDER);
    put_ref(req, M.view, Py_None);
    put_ref(req, M.ident, zero);
    put_ref(req, M.shape, Py_None);
    put_ref(req, R.array, array);
    put_ref(req, R.owner, engine);
    put_ref(req, R.kind, kind);
    put_ref(req, R.peer, peer);
    put_ref(req, R.stream, stream);
    put_ref(req, R.timeout, timeout);
    put_ref(req, R.record, Py_None);
    put_ref(req, R.t_post, minus_one_f);
    put_ref(req, R.t_match, minus_one_f);
    put_ref(req, R.state, S_QUEUED);
    put_ref(req, R.result, Py_None);
    put_ref(req, R.exc, Py_None);
    put_ref(req, R.waiters, Py_None);
    put_ref(req, R.timer, Py_None);
    put_ref(req, R.tracked, Py_False);
    return req;
}

/* ``FastLane.finished``'s fields for a request done as it was made, at ``t`` (its record
 * is already made): DONE, ``result`` (stolen), posted, matched and finished at ``t``. */
int
finish_now(PyObject *req, PyObject *result, double t)
{
    PyObject *tf = PyFloat_FromDouble(t);
    if (tf == NULL) {
        Py_DECREF(result);
        return -1;
    }
    put_ref(req, R.state, S_DONE);
    put(req, R.result, result);
    put_ref(req, R.t_post, tf);
    put_ref(req, R.t_match, tf);
    put(req, R.t_fin, tf);
    return 0;
}

/* -- the running loop --------------------------------------------------------------- */

/* Whether ``loop`` is this thread's running loop, as ``asyncio._get_running_loop()``
 * says; 1, 0, -1 (error).  That call costs a getpid() system call each time (it guards
 * against a forked child), so its answer is kept with the thread's running-loop holder
 * (the object asyncio keeps in the thread state while a loop runs, a new one each time a
 * loop starts): while the same holder is there, in the same process, the same loop runs.
 * Where that holder is not found, every call asks asyncio. */
static PyObject *held;         /* the holder seen with ``held_loop`` running */
static PyObject *held_loop;    /* borrowed: compared, never used */
static unsigned long held_thread;

static PyObject *
holder(void)
{
    PyObject *d = PyThreadState_GetDict();
    return d == NULL ? NULL : PyDict_GetItemWithError(d, holder_key);  /* borrowed */
}

int
running(PyObject *loop)
{
    PyObject *h = holder();
    if (h != NULL && h == held && loop == held_loop
        && PyThread_get_thread_ident() == held_thread) {
        return 1;
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *now = PyObject_CallNoArgs(get_running_loop);
    if (now == NULL) {
        return -1;
    }
    int same = now == loop;
    Py_DECREF(now);
    if (same && h != NULL) {
        Py_INCREF(h);
        Py_XSETREF(held, h);
        held_loop = loop;
        held_thread = PyThread_get_thread_ident();
    }
    return same;
}

/* A forked child asks asyncio again (its holder is its parent's). */
void
forget_in_child(void)
{
    held = NULL;  /* leaked in the child: it may not be safe to free here */
    held_loop = NULL;
}

/* -- configuration ------------------------------------------------------------------- */

static int
offset_of(PyObject *cls, const char *name, Py_ssize_t *off)
{
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL) {
        return -1;
    }
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type)
        && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok) {
        *off = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    Py_DECREF(d);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", cls, name);
        return -1;
    }
    return 0;
}

#define GET(name) (PyDict_GetItemString(spec, name))

static int
type_of(PyObject *spec, const char *name, PyTypeObject **out)
{
    PyObject *t = GET(name);
    if (t == NULL || !PyType_Check(t)) {
        PyErr_Format(PyExc_TypeError, "configure: %s must be a class", name);
        return -1;
    }
    Py_INCREF(t);
    *out = (PyTypeObject *)t;
    return 0;
}

static int
obj_of(PyObject *spec, const char *name, PyObject **out)
{
    PyObject *o = GET(name);
    if (o == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s", name);
        return -1;
    }
    Py_INCREF(o);
    *out = o;
    return 0;
}

static int
long_of(PyObject *spec, const char *name, long *out)
{
    PyObject *o = GET(name);
    if (o == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s", name);
        return -1;
    }
    *out = PyLong_AsLong(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* configure(spec: dict): the classes, constants and functions the lane works with. */
PyObject *
configure(PyObject *self, PyObject *spec)
{
    if (!PyDict_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "configure(spec: dict)");
        return NULL;
    }
    long timed;
    if (obj_of(spec, "names", &names) < 0
        || obj_of(spec, "get_running_loop", &get_running_loop) < 0
        || obj_of(spec, "perf_counter", &perf_counter) < 0
        || type_of(spec, "Request", &RequestType) < 0
        || type_of(spec, "Message", &MessageType) < 0
        || type_of(spec, "Status", &StatusType) < 0 || type_of(spec, "Stream", &StreamType) < 0
        || type_of(spec, "FlightRecorder", &FlightType) < 0
        || type_of(spec, "Tally", &TallyType) < 0 || type_of(spec, "Matcher", &MatcherType) < 0
        || type_of(spec, "StagingPool", &PoolType) < 0
        || type_of(spec, "Communicator", &CommType) < 0
        || type_of(spec, "DeviceEngine", &EngineType) < 0
        || type_of(spec, "RankTrace", &TraceType) < 0
        || obj_of(spec, "deque", &deque_type) < 0
        || obj_of(spec, "SEND", &K_SEND) < 0 || obj_of(spec, "RECV", &K_RECV) < 0
        || obj_of(spec, "QUEUED", &S_QUEUED) < 0
        || obj_of(spec, "POSTED", &S_POSTED) < 0 || obj_of(spec, "DONE", &S_DONE) < 0
        || obj_of(spec, "AT_SENDER", &W_AT_SENDER) < 0 || obj_of(spec, "STAGED", &W_STAGED) < 0
        || long_of(spec, "TAG_UB", &TAG_UB) < 0 || long_of(spec, "MIN_BUCKET", &MIN_BUCKET) < 0
        || long_of(spec, "MESSAGE_OVERHEAD", &MESSAGE_OVERHEAD) < 0
        || long_of(spec, "TIMED_COPY_MIN", &timed) < 0) {
        return NULL;
    }
    TIMED_COPY_MIN = timed;
    Py_XSETREF(deque_append, PyObject_GetAttrString(deque_type, "append"));
    Py_XSETREF(deque_popleft, PyObject_GetAttrString(deque_type, "popleft"));
    if (deque_append == NULL || deque_popleft == NULL) {
        return NULL;
    }
    /* Where each field the lane touches lives in its class. */
    const struct { PyTypeObject **cls; const char *name; Py_ssize_t *off; } slots[] = {
        {&MessageType, "source", &M.source},
        {&MessageType, "tag", &M.tag},
        {&MessageType, "nbytes", &M.nbytes},
        {&MessageType, "count", &M.count},
        {&MessageType, "dtype", &M.dtype},
        {&MessageType, "seq", &M.seq},
        {&MessageType, "where", &M.where},
        {&MessageType, "view", &M.view},
        {&MessageType, "ident", &M.ident},
        {&MessageType, "shape", &M.shape},
        {&MessageType, "flow", &M.flow},
        {&TraceType, "ops", &TR.ops},
        {&TraceType, "sent", &TR.sent},
        {&TraceType, "label", &TR.label},
        {&TraceType, "size", &TR.size},
        {&RequestType, "array", &R.array},
        {&RequestType, "_owner", &R.owner},
        {&RequestType, "kind", &R.kind},
        {&RequestType, "peer", &R.peer},
        {&RequestType, "stream", &R.stream},
        {&RequestType, "timeout", &R.timeout},
        {&RequestType, "_record", &R.record},
        {&RequestType, "t_post", &R.t_post},
        {&RequestType, "t_match", &R.t_match},
        {&RequestType, "_state", &R.state},
        {&RequestType, "_result", &R.result},
        {&RequestType, "_exc", &R.exc},
        {&RequestType, "_waiters", &R.waiters},
        {&RequestType, "_timer", &R.timer},
        {&RequestType, "_tracked", &R.tracked},
        {&RequestType, "t_fin", &R.t_fin},
        {&RequestType, "sseq", &R.sseq},
        {&StreamType, "_queue", &S.queue},
        {&StreamType, "_events", &S.events},
        {&StreamType, "_pending", &S.pending},
        {&StreamType, "_seq", &S.seq},
        {&StreamType, "sid", &S.sid},
        {&FlightType, "ring", &F.ring},
        {&FlightType, "sends", &F.sends},
        {&FlightType, "recvs", &F.recvs},
        {&TallyType, "n", &T.n},
        {&TallyType, "nbytes", &T.nbytes},
        {&TallyType, "w", &T.w},
        {&TallyType, "c", &T.c},
        {&MatcherType, "_by_source", &MA.by_source},
        {&MatcherType, "events", &MA.events},
        {&MatcherType, "_matched", &MA.matched},
        {&MatcherType, "_n_posted", &MA.n_posted},
        {&MatcherType, "_n_unexp", &MA.n_unexp},
        {&MatcherType, "_n_wild_posted", &MA.n_wild_posted},
        {&MatcherType, "_posted", &MA.posted},
        {&MatcherType, "_probes", &MA.probes},
        {&MatcherType, "_seq", &MA.seq},
        {&MatcherType, "_unexp", &MA.unexp},
        {&MatcherType, "_unexp_bytes", &MA.unexp_bytes},
        {&MatcherType, "_waited", &MA.waited},
        {&PoolType, "_acquired", &PO.acquired},
        {&PoolType, "_cached", &PO.cached},
        {&PoolType, "capacity_bytes", &PO.capacity_bytes},
        {&PoolType, "_free", &PO.free},
        {&PoolType, "_in_use", &PO.in_use},
        {&PoolType, "_peak", &PO.peak},
        {&PoolType, "_reused", &PO.reused},
        {&CommType, "_default_timeout", &CO.default_timeout},
        {&CommType, "_engine", &CO.engine},
        {&CommType, "_loop", &CO.loop},
        {&CommType, "rank", &CO.rank},
        {&CommType, "size", &CO.size},
        {&EngineType, "closed", &EN.closed},
        {&EngineType, "default_stream", &EN.default_stream},
        {&EngineType, "eager_limit", &EN.eager_limit},
        {&EngineType, "loop", &EN.engine_loop},
        {&EngineType, "fast", &EN.fast},
        {&EngineType, "flight", &EN.flight},
        {&EngineType, "gone", &EN.gone},
        {&EngineType, "_idle", &EN.idle},
        {&EngineType, "instant", &EN.instant},
        {&EngineType, "matcher", &EN.matcher},
        {&EngineType, "_n_pending", &EN.n_pending},
        {&EngineType, "now", &EN.now},
        {&EngineType, "peers", &EN.peers},
        {&EngineType, "_pending_recvs", &EN.pending_recvs},
        {&EngineType, "pool", &EN.pool},
        {&EngineType, "_recv_buffers", &EN.recv_buffers},
        {&EngineType, "tracer", &EN.tracer},
        {&EngineType, "rank", &EN.rank},
        {&EngineType, "traced", &EN.traced},
    };
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        if (offset_of((PyObject *)*slots[i].cls, slots[i].name, slots[i].off) < 0) {
            return NULL;
        }
    }
    if (!PyType_IsSubtype(StatusType, &PyTuple_Type)
        || StatusType->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "configure: Status must be a tuple");
        return NULL;
    }
    ready = 1;
    Py_RETURN_NONE;
}

#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return -1

/* The method names and constants, made once. */
int
intern_names(void)
{
    INTERN(a_untrack, "_untrack");
    INTERN(a_drain, "_drain");
    INTERN(a_index_add, "_index_add");
    INTERN(a_fire_probes, "_fire_probes");
    INTERN(a_unindex, "_unindex");
    INTERN(a_first_wait, "_first_wait");
    INTERN(a_unreachable, "_unreachable");
    INTERN(a_withdraw, "withdraw");
    INTERN(a_broken, "broken");
    INTERN(a_on_timeout, "_on_timeout");
    INTERN(a_call_later, "call_later");
    INTERN(a_add_buffer, "_add_buffer");
    INTERN(a_check_recv_buffer, "check_recv_buffer");
    INTERN(a_append, "append");
    INTERN(a_popleft, "popleft");
    INTERN(a_done, "done");
    INTERN(a_set_result, "set_result");
    INTERN(a_cancel, "cancel");
    INTERN(holder_key, "__asyncio_running_event_loop__");
    zero = PyLong_FromLong(0);
    minus_one = PyLong_FromLong(-1);
    minus_one_f = PyFloat_FromDouble(-1.0);
    return zero == NULL || minus_one == NULL || minus_one_f == NULL ? -1 : 0;
}
