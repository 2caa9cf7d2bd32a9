/* The C lane's objects (see _lane.c): the clock, buffers, the builders of Status
 * tuples, flight records and requests, and the matcher's deques. */
#include "_lane.h"

#include <string.h>

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

/* time.perf_counter(), read as CPython reads it: its clock (``PyTime_PerfCounter``,
 * ``_PyTime_GetPerfCounter`` before 3.13) and its conversion to seconds. */
int
perf_clock(double *t)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t ns;
    if (PyTime_PerfCounter(&ns) < 0) {
        return -1;
    }
    *t = PyTime_AsSecondsDouble(ns);
#else
    *t = _PyTime_AsSecondsDouble(_PyTime_GetPerfCounter());
#endif
    return 0;
}

/* engine.now() as a double: when that is time.perf_counter, the same reading is made
 * here (``perf_clock``). */
int
now_of(PyObject *engine, double *t)
{
    PyObject *now = slot_get(engine, EN.now);
    if (now == NULL) {
        return -1;
    }
    if (now == perf_counter) {
        Py_DECREF(now);
        return perf_clock(t);
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

/* -- the wire's sizes ------------------------------------------------------------------ */

/* ``wire.bucket(nbytes)``: the staging buffer for a message (0 for an empty one). */
long long
bucket_size(Py_ssize_t nbytes)
{
    if (nbytes <= 0) {
        return 0;
    }
    unsigned long long m = (unsigned long long)nbytes - 1;
    int bits = m == 0 ? 0 : 64 - __builtin_clzll(m);
    long long size = 1LL << bits;
    return size < MIN_BUCKET ? MIN_BUCKET : size;
}

/* ``wire.charge(nbytes)``: the message's staging bucket plus its overhead. */
long long
charge(Py_ssize_t nbytes)
{
    return bucket_size(nbytes) + MESSAGE_OVERHEAD;
}

/* -- buffers (judging one: _judge.h) -------------------------------------------------- */

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
    if (flight == NULL || Py_TYPE(flight) != FlightRecorderType) {
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
    if (tracer == NULL || Py_TYPE(tracer) != RankTraceType) {
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

/* The recv posted in the index ``index`` (a matcher's ``_posted``) that a message from
 * ``source`` with ``tag`` meets first (``Matcher._earliest_posted``): the live head of the
 * bucket of (source, tag), or where wildcard recvs are posted (``wild``) the earliest posted
 * (smallest ``seq``) of the live heads of (source, tag), (source, ANY_TAG), (ANY_SOURCE,
 * tag) and (ANY_SOURCE, ANY_TAG) (``exact``: the first key, made already, or NULL).  1
 * found: ``*recv`` and ``*bucket`` (borrowed, through the index), ``*key`` (its bucket's,
 * a new reference) and ``*named_wild`` (1 where that bucket is a wildcard one: the recv
 * leaving it counts one wildcard recv fewer, ``_n_wild_posted``) set; 0 none (no bucket
 * for it); 2 a bucket whose head is not live (a tombstone: the Python steps judge it, and
 * drop it); -1 error. */
int
posted_earliest(PyObject *index, PyObject *exact, PyObject *source, PyObject *tag, int wild,
                PyObject **recv, PyObject **key, PyObject **bucket, int *named_wild)
{
    *recv = *key = *bucket = NULL;
    *named_wild = 0;
    PyObject *const keys[4][2] = {{source, tag}, {source, minus_one}, {minus_one, tag},
                                  {minus_one, minus_one}};
    long long best = 0;
    for (int i = 0; i < (wild ? 4 : 1); i++) {
        PyObject *k = i == 0 && exact != NULL ? Py_NewRef(exact)
            : PyTuple_Pack(2, keys[i][0], keys[i][1]);
        PyObject *b = k == NULL ? NULL : PyDict_GetItemWithError(index, k);
        if (b == NULL) {
            Py_XDECREF(k);
            if (PyErr_Occurred()) {
                goto fail;
            }
            continue;
        }
        PyObject *head = live_head(b);
        long long seq = head == NULL ? -1 : PyLong_AsLongLong(SLOT(head, M.seq));
        if (head == NULL || seq <= 0) {  /* (live_head read it: an exact int) */
            Py_DECREF(k);
            if (PyErr_Occurred()) {
                goto fail;
            }
            Py_CLEAR(*key);
            *recv = *bucket = NULL;
            return 2;
        }
        if (*recv == NULL || seq < best) {
            Py_XSETREF(*key, k);
            *recv = head;
            *bucket = b;
            *named_wild = i > 0;
            best = seq;
        } else {
            Py_DECREF(k);
        }
    }
    return *recv != NULL;
fail:
    Py_CLEAR(*key);
    *recv = *bucket = NULL;
    return -1;
}

/* The (source, tag) of the earliest message waiting in ``matcher`` that a recv from
 * ``source`` with ``tag``, one of them or both a wildcard, names
 * (``Matcher._earliest_unexpected``: the head of its wildcard index, ``_all``, ``_by_tag``
 * or ``_by_source``; that message is the live head of its own (source, tag) bucket).  1
 * found (``*key`` a new reference), 0 none waits that it names, 2 not judged here (the
 * wildcard indexes not built yet: the Python steps build them), -1 error. */
int
waiting_wild(PyObject *matcher, PyObject *source, PyObject *tag, PyObject **key)
{
    *key = NULL;
    PyObject *by_source = SLOT(matcher, MA.by_source);
    if (by_source == NULL || by_source == Py_None) {
        return 2;
    }
    long s = PyLong_AsLong(source), t = s == -1 && PyErr_Occurred() ? 0 : PyLong_AsLong(tag);
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *queue;
    if (s == -1 && t == -1) {
        queue = SLOT(matcher, MA.all);
    } else {
        PyObject *index = s == -1 ? SLOT(matcher, MA.by_tag) : by_source;
        if (index == NULL || !PyDict_Check(index)) {
            return 2;
        }
        queue = PyDict_GetItemWithError(index, s == -1 ? tag : source);
        if (queue == NULL) {
            return PyErr_Occurred() ? -1 : 0;
        }
    }
    if (queue == NULL || !PyDict_Check(queue)) {  /* (an OrderedDict: seq -> message) */
        return 2;
    }
    if (PyDict_GET_SIZE(queue) == 0) {
        return 0;
    }
    PyObject *it = PyObject_GetIter(queue);  /* (its own order: the order of arrival) */
    PyObject *seq = it == NULL ? NULL : PyIter_Next(it);
    Py_XDECREF(it);
    if (seq == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *env = PyDict_GetItemWithError(queue, seq);
    Py_DECREF(seq);
    if (env == NULL || !PyObject_TypeCheck(env, MessageType)) {
        return PyErr_Occurred() ? -1 : 2;
    }
    PyObject *es = SLOT(env, M.source), *et = SLOT(env, M.tag);
    if (es == NULL || et == NULL) {
        return 2;
    }
    *key = PyTuple_Pack(2, es, et);
    return *key == NULL ? -1 : 1;
}

/* ``obj`` given ``matcher``'s next sequence number (its ``seq``), appended under ``key``
 * to the matcher's index in slot ``index_at`` (``push``), and that index's count (slot
 * ``count_at``) one more: what ``Matcher._queue_recv`` and ``Matcher.enqueue`` both do
 * first.  0 done, -1 error (a TypeError naming ``what`` where the index is no dict). */
int
queue_numbered(PyObject *matcher, Py_ssize_t index_at, Py_ssize_t count_at, PyObject *key,
               PyObject *obj, const char *what)
{
    long long seq;
    if (slot_ll(matcher, MA.seq, &seq) < 0 || slot_set_ll(matcher, MA.seq, seq + 1) < 0) {
        return -1;
    }
    PyObject *vs = PyLong_FromLongLong(seq + 1);
    if (vs == NULL) {
        return -1;
    }
    put(obj, M.seq, vs);
    PyObject *index = slot_get(matcher, index_at);
    int rc = index == NULL || !PyDict_CheckExact(index) ? -1 : push(index, key, obj);
    Py_XDECREF(index);
    if (rc < 0 || slot_add(matcher, count_at, 1) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "the matcher's %s", what);
        }
        return -1;
    }
    return 0;
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

/* -- requests done as they are made --------------------------------------------------- */

/* A new Message (or Request: ``type``) with its Message fields set as Message.__init__
 * sets them: (source, tag, nbytes, count, dtype, where, view), seq -1, ident 0, no shape,
 * no flow. */
PyObject *
new_message(PyTypeObject *type, PyObject *source, PyObject *tag, Py_ssize_t nbytes,
            Py_ssize_t count, PyObject *dtype, PyObject *where, PyObject *view)
{
    PyObject *msg = type->tp_alloc(type, 0);
    PyObject *vn = PyLong_FromSsize_t(nbytes), *vc = PyLong_FromSsize_t(count);
    if (msg == NULL || vn == NULL || vc == NULL) {
        Py_XDECREF(vn);
        Py_XDECREF(vc);
        Py_XDECREF(msg);
        return NULL;
    }
    put_ref(msg, M.source, source);
    put_ref(msg, M.tag, tag);
    put(msg, M.nbytes, vn);
    put(msg, M.count, vc);
    put_ref(msg, M.dtype, dtype);
    put_ref(msg, M.seq, minus_one);
    put_ref(msg, M.where, where);
    put_ref(msg, M.view, view);
    put_ref(msg, M.ident, zero);
    put_ref(msg, M.shape, Py_None);
    return msg;
}

/* A new Request, as Request(engine, kind, peer, tag, None, nbytes, count, dtype, stream,
 * timeout, array) makes it (its source: the engine's rank for a send, else ``peer``). */
PyObject *
new_request(PyObject *engine, PyObject *kind, PyObject *source, PyObject *peer,
            PyObject *tag, Py_ssize_t nbytes, Py_ssize_t count, PyObject *dtype,
            PyObject *stream, PyObject *timeout, PyObject *array)
{
    PyObject *req = new_message(RequestType, source, tag, nbytes, count, dtype, W_AT_SENDER,
                                Py_None);
    if (req == NULL) {
        return NULL;
    }
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

/* ``steps.finished``'s fields for a request done as it was made (its record is already
 * made): DONE, ``result`` (stolen), posted and matched at ``t0`` (when its timed copy
 * began; else ``t``), finished at ``t``. */
int
finish_now(PyObject *req, PyObject *result, double t0, double t)
{
    PyObject *tf = PyFloat_FromDouble(t);
    PyObject *ts = tf == NULL || t0 == t ? Py_XNewRef(tf) : PyFloat_FromDouble(t0);
    if (ts == NULL) {
        Py_XDECREF(tf);
        Py_DECREF(result);
        return -1;
    }
    put_ref(req, R.state, S_DONE);
    put(req, R.result, result);
    put_ref(req, R.t_post, ts);
    put(req, R.t_match, ts);
    put(req, R.t_fin, tf);
    return 0;
}
