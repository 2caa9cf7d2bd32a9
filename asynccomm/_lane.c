/* Optional accelerator: the in-process fast lane's whole per-message path in C.
 *
 * ``send(comm, buf, dst, tag)`` and ``recv(comm, buf, src, tag)`` do what
 * ``Communicator._send_op``/``_recv_op`` and ``FastLane.offer``/``take_now``/``post_now``/
 * ``_complete_fast`` (asynccomm/_engine_fast.py) do for the commonest case: an awaited op
 * on the default stream of an untraced in-process world, an exact 1-D ndarray, an exact
 * source or destination and tag, a message under ``TIMED_COPY_MIN``.  Anything else, and
 * any state the Python steps would judge (a tombstone, a misfit, a wildcard recv posted,
 * a full pool, a closed peer), returns "not handled" having changed nothing, and the
 * Python path runs from the start.  The Python steps are the reference: this file writes
 * the same fields in the same order, and the test suite runs both.
 *
 * Slotted objects (Request, Message, Stream, FlightRecorder, Tally) are read and written
 * at the offsets of their ``__slots__`` (``configure`` looks them up by name); the engine,
 * matcher and staging pool keep instance dicts and go through getattr/setattr.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

/* -- what configure() fills in ------------------------------------------------------- */

static int ready = 0;
static PyObject *names;           /* dtype -> name */
static PyObject *get_running_loop, *perf_counter;
static PyTypeObject *RequestType, *MessageType, *StatusType, *StreamType, *FlightType;
static PyTypeObject *TallyType, *MatcherType, *PoolType, *CommType, *EngineType;
static PyObject *deque_type;
static PyObject *K_SEND, *K_RECV, *S_QUEUED, *S_POSTED, *S_DONE;
static PyObject *W_AT_SENDER, *W_STAGED;
static long TAG_UB, MIN_BUCKET, MESSAGE_OVERHEAD;
static Py_ssize_t TIMED_COPY_MIN;
static PyObject *zero, *minus_one, *minus_one_f;

/* slot offsets */
static Py_ssize_t M_source, M_tag, M_nbytes, M_count, M_dtype, M_seq, M_where, M_view,
    M_ident, M_shape;
static Py_ssize_t R_array, R_owner, R_kind, R_peer, R_stream, R_timeout, R_record, R_t_post,
    R_t_match, R_state, R_result, R_exc, R_waiters, R_timer, R_tracked, R_t_fin, R_sseq;
static Py_ssize_t S_queue, S_events, S_pending, S_seq, S_sid;
static Py_ssize_t F_ring, F_sends, F_recvs;
static Py_ssize_t T_n, T_nbytes, T_w, T_c;
static Py_ssize_t MA_by_source, MA_events, MA_matched, MA_n_posted, MA_n_unexp,
    MA_n_wild_posted, MA_posted, MA_probes, MA_seq, MA_unexp, MA_unexp_bytes, MA_waited;
static Py_ssize_t CO_default_timeout, CO_engine, CO_loop, CO_rank, CO_size;
static Py_ssize_t EN_closed, EN_default_stream, EN_eager_limit, EN_engine_loop, EN_fast, EN_flight,
    EN_gone, EN_idle, EN_instant, EN_matcher, EN_n_pending, EN_now,
    EN_peers, EN_pending_recvs, EN_pool, EN_recv_buffers, EN_tracer;
static Py_ssize_t PO_acquired, PO_cached, PO_capacity_bytes, PO_free, PO_in_use, PO_peak,
    PO_reused;

/* interned attribute names */
static PyObject *a_engine, *a_loop, *a_engine_loop, *a_size, *a_rank, *a_default_timeout, *a_closed, *a_fast,
    *a_default_stream, *a_peers, *a_matcher, *a_pool, *a_flight, *a_now, *a_tracer,
    *a_eager_limit, *a_instant, *a_recv_buffers, *a_idle, *a_n_pending, *a_pending_recvs,
    *a_untrack, *a_drain, *a_n_posted, *a_n_wild_posted, *a_posted, *a_matched, *a_seq,
    *a_n_unexp, *a_unexp, *a_unexp_bytes, *a_by_source, *a_probes, *a_events, *a_index_add,
    *a_fire_probes, *a_unindex, *a_waited, *a_first_wait, *a_in_use, *a_capacity_bytes,
    *a_acquired, *a_peak, *a_free, *a_reused, *a_cached, *a_gone, *a_unreachable,
    *a_withdraw, *a_broken, *a_on_timeout, *a_call_later, *a_add_buffer,
    *a_check_recv_buffer, *a_append, *a_popleft, *a_done, *a_set_result, *a_cancel;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* Store a new reference in a slot (stolen). */
static inline void
put(PyObject *o, Py_ssize_t off, PyObject *v)
{
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = v;
    Py_XDECREF(old);
}

static inline void
put_ref(PyObject *o, Py_ssize_t off, PyObject *v)
{
    Py_INCREF(v);
    put(o, off, v);
}

/* A slot's value as a C double / long long (-1 with an error set when it is not one). */
static inline int
slot_double(PyObject *o, Py_ssize_t off, double *out)
{
    PyObject *v = SLOT(o, off);
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "unset slot");
        return -1;
    }
    *out = PyFloat_AsDouble(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static inline int
slot_ll(PyObject *o, Py_ssize_t off, long long *out)
{
    PyObject *v = SLOT(o, off);
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "unset slot");
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* The same for slots: a new reference (AttributeError when unset), o.slot += delta, the
 * slot's truthiness, whether it is None. */
static inline PyObject *
slot_get(PyObject *o, Py_ssize_t off)
{
    PyObject *v = SLOT(o, off);
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "unset slot");
        return NULL;
    }
    return Py_NewRef(v);
}

static int
slot_set_ll(PyObject *o, Py_ssize_t off, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) {
        return -1;
    }
    put(o, off, v);
    return 0;
}

static int
slot_add(PyObject *o, Py_ssize_t off, long long delta)
{
    long long v;
    if (slot_ll(o, off, &v) < 0) {
        return -1;
    }
    return slot_set_ll(o, off, v + delta);
}

static inline int
slot_true(PyObject *o, Py_ssize_t off)
{
    PyObject *v = SLOT(o, off);
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "unset slot");
        return -1;
    }
    return PyObject_IsTrue(v);
}

static inline int
slot_is_none(PyObject *o, Py_ssize_t off)
{
    PyObject *v = SLOT(o, off);
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "unset slot");
        return -1;
    }
    return v == Py_None;
}

/* engine.now() as a double.  When that is time.perf_counter, the same reading is made
 * here: CLOCK_MONOTONIC in nanoseconds, as a double divided by 1e9 (what CPython does). */
static int
now_of(PyObject *engine, double *t)
{
    PyObject *now = slot_get(engine, EN_now);
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
static int
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
static char *
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
static PyObject *
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

/* flight.ring.append((kind, peer, tag, nbytes, sid, 0, t_post, t_match, t_fin)) and the
 * tally of (kind, peer): what FlightRecorder.add does for a finished send or recv. */
static int
record(PyObject *flight, int kind, PyObject *peer, PyObject *tag, Py_ssize_t nbytes,
       PyObject *sid, double t_post, double t_match, double t_fin)
{
    if (Py_TYPE(flight) != FlightType) {
        PyErr_SetString(PyExc_TypeError, "the engine's flight recorder");
        return -1;
    }
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
    PyObject *ring = SLOT(flight, F_ring);
    PyObject *r = ring == NULL ? NULL : PyObject_CallMethodOneArg(ring, a_append, entry);
    Py_DECREF(entry);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    PyObject *tallies = SLOT(flight, kind ? F_recvs : F_sends);
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
    int rc = -1;
    long long tn, tb;
    double tw, tc;
    if (Py_TYPE(tally) != TallyType) {
        PyErr_SetString(PyExc_TypeError, "a flight tally");
        goto done;
    }
    if (slot_ll(tally, T_n, &tn) < 0 || slot_ll(tally, T_nbytes, &tb) < 0
        || slot_double(tally, T_w, &tw) < 0 || slot_double(tally, T_c, &tc) < 0) {
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
    put(tally, T_n, vn);
    put(tally, T_nbytes, vb);
    if (vw != NULL) {
        put(tally, T_w, vw);
    }
    if (vc != NULL) {
        put(tally, T_c, vc);
    }
    rc = 0;
done:
    Py_DECREF(tally);
    return rc;
}

/* The live head of deque ``bucket`` (borrowed through the deque), or NULL (no error) when
 * the first item is a tombstone (seq <= 0): the Python steps judge those. */
static PyObject *
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
    PyObject *seq = SLOT(head, M_seq);
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
static int
pop_head(PyObject *index, PyObject *key, PyObject *bucket)
{
    PyObject *r = PyObject_CallMethodNoArgs(bucket, a_popleft);
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
static int
push(PyObject *index, PyObject *key, PyObject *item)
{
    PyObject *bucket = PyDict_GetItemWithError(index, key);
    if (bucket == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        if (n_spare) {
            bucket = spare[--n_spare];
            PyObject *r = PyObject_CallMethodOneArg(bucket, a_append, item);
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
    PyObject *r = PyObject_CallMethodOneArg(bucket, a_append, item);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static PyObject *
call_method1(PyObject *o, PyObject *name, PyObject *arg)
{
    return PyObject_CallMethodOneArg(o, name, arg);
}

/* -- the receiving engine: a message offered, a recv completed ------------------------ */

/* What ``_complete_fast`` does for a posted ``recv`` (state POSTED, tracer None) that the
 * message (source, tag, nbytes, count) just filled. */
static int
complete(PyObject *engine, PyObject *recv, PyObject *source, PyObject *tag,
         Py_ssize_t nbytes, Py_ssize_t count)
{
    PyObject *status = new_status(source, tag, nbytes, count, NULL);
    if (status == NULL) {
        return -1;
    }
    PyObject *prev = SLOT(recv, R_result);
    if (prev == NULL || prev == Py_None) {
        put(recv, R_result, status);
    } else {
        PyObject *pair = PyTuple_Pack(2, prev, status);
        Py_DECREF(status);
        if (pair == NULL) {
            return -1;
        }
        put(recv, R_result, pair);
    }
    put_ref(recv, R_state, S_DONE);
    double t, t_post, t_match;
    if (now_of(engine, &t) < 0) {
        return -1;
    }
    PyObject *tf = PyFloat_FromDouble(t);
    if (tf == NULL) {
        return -1;
    }
    put(recv, R_t_fin, tf);
    if (slot_double(recv, R_t_post, &t_post) < 0 || slot_double(recv, R_t_match, &t_match) < 0) {
        return -1;
    }
    if (t_match < 0) {
        t_match = t;
    }
    PyObject *stream = SLOT(recv, R_stream);
    if (stream == NULL || Py_TYPE(stream) != StreamType) {
        PyErr_SetString(PyExc_TypeError, "a fast-lane recv's stream");
        return -1;
    }
    PyObject *flight = slot_get(engine, EN_flight);
    if (flight == NULL) {
        return -1;
    }
    int rc = record(flight, 1, source, tag, nbytes, SLOT(stream, S_sid), t_post, t_match, t);
    Py_DECREF(flight);
    if (rc < 0) {
        return -1;
    }
    PyObject *waiters = SLOT(recv, R_waiters);
    if (waiters != NULL && waiters != Py_None) {
        Py_INCREF(waiters);
        put_ref(recv, R_waiters, Py_None);
        if (!PyList_Check(waiters)) {
            Py_DECREF(waiters);
            PyErr_SetString(PyExc_TypeError, "a request's waiters");
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(waiters); i++) {
            PyObject *fut = PyList_GET_ITEM(waiters, i);
            PyObject *d = PyObject_CallMethodNoArgs(fut, a_done);
            int is_done = d == NULL ? -1 : PyObject_IsTrue(d);
            Py_XDECREF(d);
            PyObject *r = is_done ? NULL : call_method1(fut, a_set_result, Py_None);
            if (is_done < 0 || (!is_done && r == NULL)) {
                Py_DECREF(waiters);
                return -1;
            }
            Py_XDECREF(r);
        }
        Py_DECREF(waiters);
    }
    PyObject *timer = SLOT(recv, R_timer);
    if (timer != NULL && timer != Py_None) {
        PyObject *r = PyObject_CallMethodNoArgs(timer, a_cancel);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
        put_ref(recv, R_timer, Py_None);
    }
    if (SLOT(recv, R_tracked) != Py_True) {
        return 0;
    }
    /* what _untrack does, inlined when nothing else needs telling */
    int plain = slot_is_none(engine, EN_recv_buffers);
    if (plain < 0) {
        return -1;
    }
    PyObject *q = SLOT(stream, S_queue), *ev = SLOT(stream, S_events);
    if (plain && q != NULL && PySequence_Size(q) == 0 && ev != NULL
        && PySequence_Size(ev) == 0) {
        plain = slot_is_none(engine, EN_idle);
        if (plain < 0) {
            return -1;
        }
    } else {
        plain = 0;
    }
    if (!plain) {
        PyObject *r = call_method1(engine, a_untrack, recv);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
        return 0;
    }
    put_ref(recv, R_tracked, Py_False);
    if (slot_add(engine, EN_n_pending, -1) < 0) {
        return -1;
    }
    long long rn;
    if (slot_ll(recv, M_nbytes, &rn) < 0) {
        return -1;
    }
    if (rn > 0 && slot_add(engine, EN_pending_recvs, -1) < 0) {
        return -1;
    }
    PyObject *sseq = SLOT(recv, R_sseq), *pending = SLOT(stream, S_pending);
    if (sseq == NULL || pending == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a tracked recv's sseq");
        return -1;
    }
    return PyObject_DelItem(pending, sseq);
}

/* What ``FastLane.offer`` does (flow 0, tracer None, under TIMED_COPY_MIN): 1 if a posted
 * recv took the message or the pool staged it, 0 if not handled (nothing changed). */
static int
offer(PyObject *peer, PyObject *source, PyObject *tag, PyObject *array, char *data,
      Py_ssize_t nbytes, Py_ssize_t count, PyObject *dtype)
{
    int t = slot_true(peer, EN_closed);
    if (t != 0) {
        return t < 0 ? -1 : 0;  /* closed: the Python steps say what follows */
    }
    t = slot_is_none(peer, EN_tracer);
    if (t <= 0) {
        return t;
    }
    PyObject *matcher = slot_get(peer, EN_matcher);
    if (matcher == NULL) {
        return -1;
    }
    if (Py_TYPE(matcher) != MatcherType) {
        Py_DECREF(matcher);
        return 0;
    }
    int rc = -1;
    PyObject *key = NULL, *index = NULL, *pool = NULL, *msg = NULL, *buf = NULL;
    long long n_posted, n_wild;
    if (slot_ll(matcher, MA_n_posted, &n_posted) < 0) {
        goto done;
    }
    key = PyTuple_Pack(2, source, tag);
    if (key == NULL) {
        goto done;
    }
    if (n_posted) {
        if (slot_ll(matcher, MA_n_wild_posted, &n_wild) < 0) {
            goto done;
        }
        if (n_wild) {
            rc = 0;  /* the earliest of four buckets: Python's */
            goto done;
        }
        index = slot_get(matcher, MA_posted);
        if (index == NULL || !PyDict_CheckExact(index)) {
            goto done;
        }
        PyObject *bucket = PyDict_GetItemWithError(index, key);
        if (bucket == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (bucket != NULL && PySequence_Size(bucket) > 0) {
            PyObject *recv = live_head(bucket);
            if (recv == NULL) {
                rc = PyErr_Occurred() ? -1 : 0;
                goto done;
            }
            PyObject *rd = SLOT(recv, M_dtype);
            long long rn;
            Py_ssize_t cap;
            char *dst;
            if (!PyObject_TypeCheck(recv, RequestType) || SLOT(recv, R_state) != S_POSTED
                || rd == NULL || (rd != Py_None && rd != dtype
                                  && PyObject_RichCompareBool(rd, dtype, Py_EQ) != 1)
                || slot_ll(recv, M_nbytes, &rn) < 0 || (0 <= rn && rn < nbytes)
                || (dst = array_bytes(SLOT(recv, R_array), 1, &cap)) == NULL
                || cap < nbytes) {
                rc = PyErr_Occurred() ? -1 : 0;
                goto done;
            }
            Py_INCREF(recv);
            if (pop_head(index, key, bucket) < 0) {
                Py_DECREF(recv);
                goto done;
            }
            put_ref(recv, M_seq, minus_one);
            if (slot_add(matcher, MA_n_posted, -1) < 0 || slot_add(matcher, MA_matched, 1) < 0) {
                Py_DECREF(recv);
                goto done;
            }
            if (nbytes) {
                memmove(dst, data, (size_t)nbytes);
            }
            rc = complete(peer, recv, source, tag, nbytes, count) < 0 ? -1 : 1;
            Py_DECREF(recv);
            goto done;
        }
    }
    /* staging: StagingPool.acquire(nbytes, tentative=True), inlined */
    long long limit;
    if (slot_ll(peer, EN_eager_limit, &limit) < 0) {
        goto done;
    }
    if (nbytes > limit) {
        rc = 0;
        goto done;
    }
    pool = slot_get(peer, EN_pool);
    if (pool == NULL || Py_TYPE(pool) != PoolType) {
        rc = pool == NULL ? -1 : 0;
        goto done;
    }
    long long size = 0, in_use, capacity, peak;
    if (nbytes) {
        size = 1;
        while (size < nbytes) {
            size <<= 1;
        }
        if (size < MIN_BUCKET) {
            size = MIN_BUCKET;
        }
    }
    long long cost = size + MESSAGE_OVERHEAD;
    if (slot_ll(pool, PO_in_use, &in_use) < 0 || slot_ll(pool, PO_capacity_bytes, &capacity) < 0
        || slot_ll(pool, PO_peak, &peak) < 0) {
        goto done;
    }
    if (in_use + cost > capacity || !size) {
        rc = 0;  /* refused (not counted: tentative), or empty: the Python steps */
        goto done;
    }
    PyObject *free = slot_get(pool, PO_free);
    if (free == NULL) {
        goto done;
    }
    PyObject *sz = PyLong_FromLongLong(size);
    PyObject *list = sz == NULL ? NULL : PyDict_GetItemWithError(free, sz);
    Py_XDECREF(sz);
    Py_DECREF(free);
    if (list == NULL && PyErr_Occurred()) {
        goto done;
    }
    long long cached = 0;
    int reuse = list != NULL && PyList_Check(list) && PyList_GET_SIZE(list) > 0;
    if (reuse) {
        if (slot_ll(pool, PO_cached, &cached) < 0) {
            goto done;
        }
        Py_ssize_t last = PyList_GET_SIZE(list) - 1;
        buf = PyList_GET_ITEM(list, last);
        Py_INCREF(buf);
        if (PyList_SetSlice(list, last, last + 1, NULL) < 0) {
            goto done;
        }
    } else {
        PyObject *ba = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (ba == NULL) {
            goto done;
        }
        memset(PyByteArray_AS_STRING(ba), 0, (size_t)size);
        buf = PyMemoryView_FromObject(ba);
        Py_DECREF(ba);
        if (buf == NULL) {
            goto done;
        }
    }
    if (slot_add(pool, PO_acquired, 1) < 0 || slot_set_ll(pool, PO_in_use, in_use + cost) < 0
        || (in_use + cost > peak && slot_set_ll(pool, PO_peak, in_use + cost) < 0)
        || (reuse && (slot_add(pool, PO_reused, 1) < 0
                      || slot_set_ll(pool, PO_cached, cached - size) < 0))) {
        goto done;
    }
    if (!PyMemoryView_Check(buf) || PyMemoryView_GET_BUFFER(buf)->len < nbytes) {
        PyErr_SetString(PyExc_TypeError, "a staging buffer");
        goto done;
    }
    memmove(PyMemoryView_GET_BUFFER(buf)->buf, data, (size_t)nbytes);
    /* Message(source, tag, nbytes, count, dtype, STAGED, buf) */
    msg = MessageType->tp_alloc(MessageType, 0);
    if (msg == NULL) {
        goto done;
    }
    PyObject *vn = PyLong_FromSsize_t(nbytes), *vc = PyLong_FromSsize_t(count);
    if (vn == NULL || vc == NULL) {
        Py_XDECREF(vn);
        Py_XDECREF(vc);
        goto done;
    }
    put_ref(msg, M_source, source);
    put_ref(msg, M_tag, tag);
    put(msg, M_nbytes, vn);
    put(msg, M_count, vc);
    put_ref(msg, M_dtype, dtype);
    put_ref(msg, M_seq, minus_one);
    put_ref(msg, M_where, W_STAGED);
    put_ref(msg, M_view, buf);
    put_ref(msg, M_ident, zero);
    put_ref(msg, M_shape, Py_None);
    /* matcher.enqueue(msg), inlined */
    long long seq;
    if (slot_ll(matcher, MA_seq, &seq) < 0 || slot_set_ll(matcher, MA_seq, seq + 1) < 0) {
        goto done;
    }
    PyObject *vs = PyLong_FromLongLong(seq + 1);
    if (vs == NULL) {
        goto done;
    }
    put(msg, M_seq, vs);
    index = slot_get(matcher, MA_unexp);
    if (index == NULL || !PyDict_CheckExact(index) || push(index, key, msg) < 0
        || slot_add(matcher, MA_n_unexp, 1) < 0 || slot_add(matcher, MA_unexp_bytes, nbytes) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "the matcher's unexpected messages");
        }
        goto done;
    }
    PyObject *by_source = slot_get(matcher, MA_by_source);
    if (by_source == NULL) {
        goto done;
    }
    if (by_source != Py_None) {
        PyObject *r = PyObject_CallMethodObjArgs(matcher, a_index_add, by_source, msg, NULL);
        Py_DECREF(by_source);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    } else {
        Py_DECREF(by_source);
    }
    t = slot_true(matcher, MA_probes);
    if (t < 0) {
        goto done;
    }
    if (t) {
        PyObject *r = call_method1(matcher, a_fire_probes, msg);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    t = slot_true(matcher, MA_events);
    if (t < 0) {
        goto done;
    }
    if (t) {  /* a probe saw it */
        PyObject *r = PyObject_CallMethodNoArgs(peer, a_drain);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    rc = 1;
done:
    Py_XDECREF(buf);
    Py_XDECREF(msg);
    Py_XDECREF(pool);
    Py_XDECREF(index);
    Py_XDECREF(key);
    Py_DECREF(matcher);
    return rc;
}

/* A new Request, as Request(engine, kind, peer, tag, None, nbytes, count, dtype, stream,
 * timeout, array) makes it (its source: the engine's rank for a send, else ``peer``). */
static PyObject *
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
    put_ref(req, M_source, source);
    put_ref(req, M_tag, tag);
    put(req, M_nbytes, vn);
    put(req, M_count, vc);
    put_ref(req, M_dtype, dtype);
    put_ref(req, M_seq, minus_one);
    put_ref(req, M_where, W_AT_SENDER);
    put_ref(req, M_view, Py_None);
    put_ref(req, M_ident, zero);
    put_ref(req, M_shape, Py_None);
    put_ref(req, R_array, array);
    put_ref(req, R_owner, engine);
    put_ref(req, R_kind, kind);
    put_ref(req, R_peer, peer);
    put_ref(req, R_stream, stream);
    put_ref(req, R_timeout, timeout);
    put_ref(req, R_record, Py_None);
    put_ref(req, R_t_post, minus_one_f);
    put_ref(req, R_t_match, minus_one_f);
    put_ref(req, R_state, S_QUEUED);
    put_ref(req, R_result, Py_None);
    put_ref(req, R_exc, Py_None);
    put_ref(req, R_waiters, Py_None);
    put_ref(req, R_timer, Py_None);
    put_ref(req, R_tracked, Py_False);
    return req;
}

/* ``FastLane.finished``'s fields for a request done as it was made, at ``t`` (its record
 * is already made): DONE, ``result`` (stolen), posted, matched and finished at ``t``. */
static int
finish_now(PyObject *req, PyObject *result, double t)
{
    PyObject *tf = PyFloat_FromDouble(t);
    if (tf == NULL) {
        Py_DECREF(result);
        return -1;
    }
    put_ref(req, R_state, S_DONE);
    put(req, R_result, result);
    put_ref(req, R_t_post, tf);
    put_ref(req, R_t_match, tf);
    put(req, R_t_fin, tf);
    return 0;
}

/* -- entry points -------------------------------------------------------------------- */

/* Whether ``loop`` is this thread's running loop, as ``asyncio._get_running_loop()``
 * says; 1, 0, -1 (error).  That call costs a getpid() system call each time (it guards
 * against a forked child), so its answer is kept with the thread's running-loop holder
 * (the object asyncio keeps in the thread state while a loop runs, a new one each time a
 * loop starts): while the same holder is there, in the same process, the same loop runs.
 * Where that holder is not found, every call asks asyncio. */
static PyObject *held;         /* the holder seen with ``held_loop`` running */
static PyObject *held_loop;    /* borrowed: compared, never used */
static unsigned long held_thread;
static PyObject *holder_key;

static PyObject *
holder(void)
{
    PyObject *d = PyThreadState_GetDict();
    return d == NULL ? NULL : PyDict_GetItemWithError(d, holder_key);  /* borrowed */
}

static int
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
static void
forget_in_child(void)
{
    held = NULL;  /* leaked in the child: it may not be safe to free here */
    held_loop = NULL;
}

/* comm's engine, if this runs on comm's loop and the engine is open, fast, with nothing
 * queued on its default stream (new reference; *stream borrowed through the engine);
 * NULL without an error when not. */
static PyObject *
fast_engine(PyObject *comm, PyObject **stream)
{
    PyObject *own = slot_get(comm, CO_loop);
    if (own == NULL) {
        return NULL;
    }
    int same = running(own);
    Py_DECREF(own);
    if (same <= 0) {
        return NULL;
    }
    PyObject *engine = slot_get(comm, CO_engine);
    if (engine == NULL || Py_TYPE(engine) != EngineType) {
        Py_XDECREF(engine);
        return NULL;
    }
    int t = slot_true(engine, EN_closed);
    int f = t == 0 ? slot_true(engine, EN_fast) : 0;
    if (t != 0 || f != 1) {
        Py_DECREF(engine);
        return NULL;
    }
    PyObject *s = slot_get(engine, EN_default_stream);
    if (s == NULL) {
        Py_DECREF(engine);
        return NULL;
    }
    Py_DECREF(s);  /* the engine keeps it */
    PyObject *q = Py_TYPE(s) == StreamType ? SLOT(s, S_queue) : NULL;
    if (q == NULL || PySequence_Size(q) != 0) {
        PyErr_Clear();
        Py_DECREF(engine);
        return NULL;
    }
    *stream = s;
    return engine;
}

/* An exact int in [lo, hi) (hi < 0: no upper bound but TAG_UB). */
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

/* send(comm, buf, dst, tag, handle) -> bool | Request: once the message went the fast
 * lane (the send is done, and recorded), True, or with ``handle`` its Request; False,
 * having done nothing, when the Python path must run. */
static PyObject *
lane_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !ready) {
        if (nargs != 5) {
            PyErr_SetString(PyExc_TypeError, "send(comm, buf, dst, tag, handle)");
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    PyObject *comm = args[0], *buf = args[1], *dst = args[2], *tag = args[3];
    int handle = PyObject_IsTrue(args[4]);
    if (handle < 0) {
        return NULL;
    }
    if (Py_TYPE(comm) != CommType) {
        Py_RETURN_FALSE;
    }
    PyObject *name;
    Py_ssize_t nbytes, count;
    int j = judge(buf, 0, &name, &nbytes, &count);
    if (j <= 0) {
        if (j < 0) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    if (nbytes >= TIMED_COPY_MIN || !in_range(tag, TAG_UB + 1)) {
        Py_RETURN_FALSE;
    }
    long long size;
    if (slot_ll(comm, CO_size, &size) < 0) {
        return NULL;
    }
    if (!in_range(dst, (long)size)) {
        Py_RETURN_FALSE;
    }
    PyObject *stream;
    PyObject *engine = fast_engine(comm, &stream);
    if (engine == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    PyObject *result = NULL, *peers = NULL, *rank = NULL;
    peers = slot_get(engine, EN_peers);
    if (peers == NULL) {
        goto done;
    }
    if (peers == Py_None) {  /* across processes: the link's send_now, in Python */
        result = Py_NewRef(Py_False);
        goto done;
    }
    PyObject *peer = PyObject_GetItem(peers, dst);
    if (peer == NULL) {
        goto done;
    }
    if (Py_TYPE(peer) != EngineType) {
        Py_DECREF(peer);
        result = Py_NewRef(Py_False);
        goto done;
    }
    rank = slot_get(comm, CO_rank);
    int r = rank == NULL ? -1 : offer(peer, rank, tag, buf,
                                      PyArray_BYTES((PyArrayObject *)buf), nbytes, count, name);
    Py_DECREF(peer);
    if (r <= 0) {
        if (r == 0) {
            result = Py_NewRef(Py_False);
        }
        goto done;
    }
    double t;
    PyObject *flight = now_of(engine, &t) < 0 ? NULL : slot_get(engine, EN_flight);
    if (flight == NULL) {
        goto done;
    }
    r = record(flight, 0, dst, tag, nbytes, zero, t, t, t);
    Py_DECREF(flight);
    if (r < 0) {
        goto done;
    }
    if (!handle) {
        result = Py_NewRef(Py_True);
        goto done;
    }
    PyObject *timeout = slot_get(comm, CO_default_timeout);
    PyObject *req = timeout == NULL ? NULL : new_request(
        engine, K_SEND, rank, dst, tag, nbytes, count, name, stream, timeout, buf);
    Py_XDECREF(timeout);
    if (req != NULL && finish_now(req, Py_NewRef(Py_None), t) < 0) {
        Py_CLEAR(req);
    }
    result = req;
done:
    Py_XDECREF(rank);
    Py_XDECREF(peers);
    Py_DECREF(engine);
    return result;
}

/* A message waiting in ``matcher`` for (src, tag), taken into ``data`` (``take_now`` and
 * the receiver's record): its Status, Py_None when not handled (nothing changed). */
static PyObject *
take(PyObject *engine, PyObject *matcher, PyObject *key, PyObject *src, PyObject *tag,
     char *data, Py_ssize_t nbytes, PyObject *dtype, double *when)
{
    PyObject *pool = slot_get(engine, EN_pool);
    if (pool == NULL) {
        return NULL;
    }
    if (Py_TYPE(pool) != PoolType) {
        Py_DECREF(pool);
        Py_RETURN_NONE;
    }
    PyObject *index = slot_get(matcher, MA_unexp);
    if (index == NULL) {
        Py_DECREF(pool);
        return NULL;
    }
    PyObject *result = NULL, *msg = NULL, *view = NULL;
    PyObject *bucket = PyDict_CheckExact(index) ? PyDict_GetItemWithError(index, key) : NULL;
    if (bucket == NULL) {
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    msg = live_head(bucket);
    if (msg == NULL) {
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    Py_INCREF(msg);
    PyObject *md = SLOT(msg, M_dtype);
    long long n;
    view = SLOT(msg, M_view);
    if (SLOT(msg, M_where) != W_STAGED || md == NULL
        || (md != dtype && PyObject_RichCompareBool(md, dtype, Py_EQ) != 1)
        || slot_ll(msg, M_nbytes, &n) < 0 || n > nbytes || n >= TIMED_COPY_MIN
        || view == NULL || !PyMemoryView_Check(view)
        || PyMemoryView_GET_BUFFER(view)->len < n) {
        view = NULL;
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    Py_INCREF(view);
    /* matcher.take(msg): _pop_unexpected, inlined */
    if (pop_head(index, key, bucket) < 0 || slot_add(matcher, MA_n_unexp, -1) < 0
        || slot_add(matcher, MA_unexp_bytes, -n) < 0) {
        goto done;
    }
    int t = slot_is_none(matcher, MA_by_source);
    if (t < 0) {
        goto done;
    }
    if (!t) {
        PyObject *r = call_method1(matcher, a_unindex, msg);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    put_ref(msg, M_seq, minus_one);
    if (slot_add(matcher, MA_matched, 1) < 0) {
        goto done;
    }
    if (n) {
        memmove(data, PyMemoryView_GET_BUFFER(view)->buf, (size_t)n);
    }
    /* pool.release(view), inlined */
    Py_ssize_t size = PyMemoryView_GET_BUFFER(view)->len;
    long long cached, capacity;
    if (slot_add(pool, PO_in_use, -(size + MESSAGE_OVERHEAD)) < 0
        || slot_ll(pool, PO_cached, &cached) < 0 || slot_ll(pool, PO_capacity_bytes, &capacity) < 0) {
        goto done;
    }
    if (size && cached + size <= capacity) {
        PyObject *free = slot_get(pool, PO_free);
        PyObject *sz = free == NULL ? NULL : PyLong_FromSsize_t(size);
        PyObject *list = sz == NULL ? NULL : PyDict_GetItemWithError(free, sz);
        int rc = -1;
        if (sz != NULL && list == NULL && !PyErr_Occurred()) {
            list = PyList_New(0);
            if (list != NULL) {
                rc = PyDict_SetItem(free, sz, list);
                Py_DECREF(list);  /* the dict holds it */
            }
        } else {
            rc = list == NULL ? -1 : 0;
        }
        if (rc == 0) {
            rc = PyList_Append(list, view);
        }
        Py_XDECREF(sz);
        Py_XDECREF(free);
        if (rc < 0 || slot_set_ll(pool, PO_cached, cached + size) < 0) {
            goto done;
        }
    }
    /* (LocalLink.received does nothing for a staged message on an instant link) */
    long long mc;
    if (slot_ll(msg, M_count, &mc) < 0) {
        goto done;
    }
    /* the source, tag, count and shape are the message's own */
    PyObject *status = new_status(SLOT(msg, M_source), SLOT(msg, M_tag), (Py_ssize_t)n,
                                  (Py_ssize_t)mc, SLOT(msg, M_shape));
    if (status == NULL) {
        goto done;
    }
    double now;
    PyObject *flight = now_of(engine, &now) < 0 ? NULL : slot_get(engine, EN_flight);
    if (flight == NULL || record(flight, 1, PyTuple_GET_ITEM(status, 0),
                                 PyTuple_GET_ITEM(status, 1), (Py_ssize_t)n, zero, now, now,
                                 now) < 0) {
        Py_XDECREF(flight);
        Py_DECREF(status);
        goto done;
    }
    Py_DECREF(flight);
    *when = now;
    result = status;
done:
    Py_XDECREF(pool);
    Py_XDECREF(view);
    Py_XDECREF(msg);
    Py_DECREF(index);
    return result;
}

/* What ``post_now`` does for a new exact recv with no message waiting for it. */
static int
post(PyObject *engine, PyObject *matcher, PyObject *key, PyObject *req, PyObject *stream,
     Py_ssize_t nbytes, PyObject *timeout)
{
    double t;
    put_ref(req, R_state, S_POSTED);
    if (now_of(engine, &t) < 0) {
        return -1;
    }
    PyObject *tp = PyFloat_FromDouble(t);
    if (tp == NULL) {
        return -1;
    }
    put(req, R_t_post, tp);
    /* matcher.post_recv -> _queue_recv, inlined */
    long long seq;
    if (slot_ll(matcher, MA_seq, &seq) < 0 || slot_set_ll(matcher, MA_seq, seq + 1) < 0) {
        return -1;
    }
    PyObject *vs = PyLong_FromLongLong(seq + 1);
    if (vs == NULL) {
        return -1;
    }
    put(req, M_seq, vs);
    PyObject *index = slot_get(matcher, MA_posted);
    if (index == NULL) {
        return -1;
    }
    int rc = PyDict_CheckExact(index) ? push(index, key, req) : -1;
    Py_DECREF(index);
    if (rc < 0 || slot_add(matcher, MA_n_posted, 1) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "the matcher's posted recvs");
        }
        return -1;
    }
    PyObject *waited = slot_get(matcher, MA_waited);
    if (waited == NULL) {
        return -1;
    }
    PyObject *src = SLOT(req, M_source);
    int seen = PySet_Contains(waited, src);
    Py_DECREF(waited);
    if (seen < 0) {
        return -1;
    }
    if (!seen) {
        PyObject *r = call_method1(matcher, a_first_wait, src);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    int t1 = slot_true(matcher, MA_events);
    if (t1 < 0) {
        return -1;
    }
    if (t1) {
        PyObject *r = PyObject_CallMethodNoArgs(engine, a_drain);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
        if (SLOT(req, R_state) != S_POSTED) {
            return 0;
        }
    }
    /* Stream._track and track, inlined */
    long long sseq;
    if (slot_ll(stream, S_seq, &sseq) < 0) {
        return -1;
    }
    PyObject *vq = PyLong_FromLongLong(sseq + 1);
    if (vq == NULL) {
        return -1;
    }
    put(stream, S_seq, vq);
    put_ref(req, R_sseq, vq);
    PyObject *pending = SLOT(stream, S_pending);
    if (pending == NULL || PyObject_SetItem(pending, vq, req) < 0) {
        return -1;
    }
    put_ref(req, R_tracked, Py_True);
    if (slot_add(engine, EN_n_pending, 1) < 0) {
        return -1;
    }
    if (nbytes > 0) {
        if (slot_add(engine, EN_pending_recvs, 1) < 0) {
            return -1;
        }
        PyObject *rb = slot_get(engine, EN_recv_buffers);
        if (rb == NULL) {
            return -1;
        }
        if (rb != Py_None) {
            PyObject *r = PyObject_CallMethodObjArgs(engine, a_add_buffer, rb, req, NULL);
            Py_DECREF(rb);
            if (r == NULL) {
                return -1;
            }
            Py_DECREF(r);
        } else {
            Py_DECREF(rb);
        }
    }
    if (timeout != Py_None) {
        PyObject *loop = slot_get(engine, EN_engine_loop);
        PyObject *cb = loop == NULL ? NULL : PyObject_GetAttr(engine, a_on_timeout);
        PyObject *timer = cb == NULL ? NULL : PyObject_CallMethodObjArgs(
            loop, a_call_later, timeout, cb, req, NULL);
        Py_XDECREF(cb);
        Py_XDECREF(loop);
        if (timer == NULL) {
            return -1;
        }
        put(req, R_timer, timer);
    }
    int gone = slot_true(engine, EN_gone);
    if (gone < 0) {
        return -1;
    }
    if (gone) {
        PyObject *peer = SLOT(req, R_peer);
        PyObject *u = call_method1(engine, a_unreachable, peer);
        int yes = u == NULL ? -1 : PyObject_IsTrue(u);
        Py_XDECREF(u);
        if (yes < 0) {
            return -1;
        }
        if (yes) {
            PyObject *exc = call_method1(engine, a_broken, peer);
            PyObject *r = exc == NULL ? NULL
                : PyObject_CallMethodObjArgs(engine, a_withdraw, req, exc, NULL);
            Py_XDECREF(exc);
            if (r == NULL) {
                return -1;
            }
            Py_DECREF(r);
        }
    }
    return 0;
}

/* recv(comm, buf, src, tag, handle) -> Status | Request | None: the Status of a message
 * already waiting (taken; with ``handle``, its done Request); else the posted Request to
 * await; None, having done nothing, when the Python path must run. */
static PyObject *
lane_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "recv(comm, buf, src, tag, handle)");
        return NULL;
    }
    if (!ready) {
        Py_RETURN_NONE;
    }
    PyObject *comm = args[0], *buf = args[1], *src = args[2], *tag = args[3];
    int handle = PyObject_IsTrue(args[4]);
    if (handle < 0) {
        return NULL;
    }
    if (Py_TYPE(comm) != CommType) {
        Py_RETURN_NONE;
    }
    PyObject *name;
    Py_ssize_t nbytes, count;
    int j = judge(buf, 1, &name, &nbytes, &count);
    if (j <= 0) {
        if (j < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (!in_range(tag, TAG_UB + 1)) {
        Py_RETURN_NONE;
    }
    long long size;
    if (slot_ll(comm, CO_size, &size) < 0) {
        return NULL;
    }
    if (!in_range(src, (long)size)) {
        Py_RETURN_NONE;
    }
    PyObject *stream;
    PyObject *engine = fast_engine(comm, &stream);
    if (engine == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *result = NULL, *matcher = NULL, *key = NULL, *timeout = NULL, *req = NULL;
    int t = slot_true(engine, EN_pending_recvs);
    if (t < 0) {
        goto done;
    }
    if (t) {  /* another recv is pending: its buffer must not overlap this one */
        PyObject *n = PyLong_FromSsize_t(nbytes);
        PyObject *r = n == NULL ? NULL : PyObject_CallMethodObjArgs(
            engine, a_check_recv_buffer, buf, n, NULL);
        Py_XDECREF(n);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    PyObject *peers = slot_get(engine, EN_peers);
    if (peers == NULL) {
        goto done;
    }
    int local = peers != Py_None;
    Py_DECREF(peers);
    t = local ? slot_true(engine, EN_instant) : 0;
    int untraced = t == 1 ? slot_is_none(engine, EN_tracer) : 0;
    if (t < 0 || untraced < 0) {
        goto done;
    }
    if (!untraced) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    matcher = slot_get(engine, EN_matcher);
    if (matcher != NULL && Py_TYPE(matcher) != MatcherType) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    key = matcher == NULL ? NULL : PyTuple_Pack(2, src, tag);
    if (key == NULL) {
        goto done;
    }
    long long n_unexp;
    if (slot_ll(matcher, MA_n_unexp, &n_unexp) < 0) {
        goto done;
    }
    char *data = PyArray_BYTES((PyArrayObject *)buf);
    if (n_unexp) {
        PyObject *index = slot_get(matcher, MA_unexp);
        if (index == NULL) {
            goto done;
        }
        int has = PyDict_CheckExact(index) ? PyDict_Contains(index, key) : -1;
        Py_DECREF(index);
        if (has < 0) {
            if (!PyErr_Occurred()) {
                result = Py_NewRef(Py_None);
            }
            goto done;
        }
        if (has) {  /* taken, or not handled: nothing else is tried here */
            double when = 0.0;
            result = take(engine, matcher, key, src, tag, data, nbytes, name, &when);
            if (result == NULL || result == Py_None || !handle) {
                goto done;
            }
            timeout = slot_get(comm, CO_default_timeout);
            req = timeout == NULL ? NULL : new_request(
                engine, K_RECV, src, src, tag, nbytes, count, name, stream, timeout, buf);
            if (req == NULL || finish_now(req, result, when) < 0) {
                if (req == NULL) {
                    Py_DECREF(result);
                }
                result = NULL;
                goto done;
            }
            result = Py_NewRef(req);
            goto done;
        }
    }
    timeout = slot_get(comm, CO_default_timeout);
    if (timeout == NULL) {
        goto done;
    }
    req = new_request(engine, K_RECV, src, src, tag, nbytes, count, name, stream, timeout,
                      buf);
    if (req == NULL || post(engine, matcher, key, req, stream, nbytes, timeout) < 0) {
        goto done;
    }
    result = Py_NewRef(req);
done:
    Py_XDECREF(req);
    Py_XDECREF(timeout);
    Py_XDECREF(key);
    Py_XDECREF(matcher);
    Py_DECREF(engine);
    return result;
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
static PyObject *
configure(PyObject *self, PyObject *spec)
{
    if (!PyDict_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "configure(spec: dict)");
        return NULL;
    }
    long timed;
    if (obj_of(spec, "names", &names) < 0 || obj_of(spec, "get_running_loop", &get_running_loop) < 0
        || obj_of(spec, "perf_counter", &perf_counter) < 0
        || type_of(spec, "Request", &RequestType) < 0 || type_of(spec, "Message", &MessageType) < 0
        || type_of(spec, "Status", &StatusType) < 0 || type_of(spec, "Stream", &StreamType) < 0
        || type_of(spec, "FlightRecorder", &FlightType) < 0
        || type_of(spec, "Tally", &TallyType) < 0 || type_of(spec, "Matcher", &MatcherType) < 0
        || type_of(spec, "StagingPool", &PoolType) < 0
        || type_of(spec, "Communicator", &CommType) < 0
        || type_of(spec, "DeviceEngine", &EngineType) < 0 || obj_of(spec, "deque", &deque_type) < 0
        || obj_of(spec, "SEND", &K_SEND) < 0 || obj_of(spec, "RECV", &K_RECV) < 0 || obj_of(spec, "QUEUED", &S_QUEUED) < 0
        || obj_of(spec, "POSTED", &S_POSTED) < 0 || obj_of(spec, "DONE", &S_DONE) < 0
        || obj_of(spec, "AT_SENDER", &W_AT_SENDER) < 0 || obj_of(spec, "STAGED", &W_STAGED) < 0
        || long_of(spec, "TAG_UB", &TAG_UB) < 0 || long_of(spec, "MIN_BUCKET", &MIN_BUCKET) < 0
        || long_of(spec, "MESSAGE_OVERHEAD", &MESSAGE_OVERHEAD) < 0
        || long_of(spec, "TIMED_COPY_MIN", &timed) < 0) {
        return NULL;
    }
    TIMED_COPY_MIN = timed;
    PyObject *M = (PyObject *)MessageType, *R = (PyObject *)RequestType;
    PyObject *S = (PyObject *)StreamType, *F = (PyObject *)FlightType;
    PyObject *T = (PyObject *)TallyType;
    if (offset_of(M, "source", &M_source) < 0 || offset_of(M, "tag", &M_tag) < 0
        || offset_of(M, "nbytes", &M_nbytes) < 0 || offset_of(M, "count", &M_count) < 0
        || offset_of(M, "dtype", &M_dtype) < 0 || offset_of(M, "seq", &M_seq) < 0
        || offset_of(M, "where", &M_where) < 0 || offset_of(M, "view", &M_view) < 0
        || offset_of(M, "ident", &M_ident) < 0 || offset_of(M, "shape", &M_shape) < 0
        || offset_of(R, "array", &R_array) < 0 || offset_of(R, "_owner", &R_owner) < 0
        || offset_of(R, "kind", &R_kind) < 0 || offset_of(R, "peer", &R_peer) < 0
        || offset_of(R, "stream", &R_stream) < 0 || offset_of(R, "timeout", &R_timeout) < 0
        || offset_of(R, "_record", &R_record) < 0 || offset_of(R, "t_post", &R_t_post) < 0
        || offset_of(R, "t_match", &R_t_match) < 0 || offset_of(R, "_state", &R_state) < 0
        || offset_of(R, "_result", &R_result) < 0 || offset_of(R, "_exc", &R_exc) < 0
        || offset_of(R, "_waiters", &R_waiters) < 0 || offset_of(R, "_timer", &R_timer) < 0
        || offset_of(R, "_tracked", &R_tracked) < 0 || offset_of(R, "t_fin", &R_t_fin) < 0
        || offset_of(R, "sseq", &R_sseq) < 0
        || offset_of(S, "_queue", &S_queue) < 0 || offset_of(S, "_events", &S_events) < 0
        || offset_of(S, "_pending", &S_pending) < 0 || offset_of(S, "_seq", &S_seq) < 0
        || offset_of(S, "sid", &S_sid) < 0
        || offset_of(F, "ring", &F_ring) < 0 || offset_of(F, "sends", &F_sends) < 0
        || offset_of(F, "recvs", &F_recvs) < 0
        || offset_of(T, "n", &T_n) < 0 || offset_of(T, "nbytes", &T_nbytes) < 0
        || offset_of(T, "w", &T_w) < 0 || offset_of(T, "c", &T_c) < 0) {
        return NULL;
    }
    PyObject *A = (PyObject *)MatcherType, *P = (PyObject *)PoolType;
    if (offset_of(A, "_by_source", &MA_by_source) < 0 || offset_of(A, "events", &MA_events) < 0
        || offset_of(A, "_matched", &MA_matched) < 0 || offset_of(A, "_n_posted", &MA_n_posted) < 0
        || offset_of(A, "_n_unexp", &MA_n_unexp) < 0
        || offset_of(A, "_n_wild_posted", &MA_n_wild_posted) < 0
        || offset_of(A, "_posted", &MA_posted) < 0 || offset_of(A, "_probes", &MA_probes) < 0
        || offset_of(A, "_seq", &MA_seq) < 0 || offset_of(A, "_unexp", &MA_unexp) < 0
        || offset_of(A, "_unexp_bytes", &MA_unexp_bytes) < 0
        || offset_of(A, "_waited", &MA_waited) < 0
        || offset_of(P, "_acquired", &PO_acquired) < 0 || offset_of(P, "_cached", &PO_cached) < 0
        || offset_of(P, "capacity_bytes", &PO_capacity_bytes) < 0
        || offset_of(P, "_free", &PO_free) < 0 || offset_of(P, "_in_use", &PO_in_use) < 0
        || offset_of(P, "_peak", &PO_peak) < 0 || offset_of(P, "_reused", &PO_reused) < 0) {
        return NULL;
    }
    PyObject *C = (PyObject *)CommType, *E = (PyObject *)EngineType;
    if (offset_of(C, "_default_timeout", &CO_default_timeout) < 0
        || offset_of(C, "_engine", &CO_engine) < 0
        || offset_of(C, "_loop", &CO_loop) < 0
        || offset_of(C, "rank", &CO_rank) < 0
        || offset_of(C, "size", &CO_size) < 0
        || offset_of(E, "closed", &EN_closed) < 0
        || offset_of(E, "default_stream", &EN_default_stream) < 0
        || offset_of(E, "eager_limit", &EN_eager_limit) < 0
        || offset_of(E, "loop", &EN_engine_loop) < 0
        || offset_of(E, "fast", &EN_fast) < 0
        || offset_of(E, "flight", &EN_flight) < 0
        || offset_of(E, "gone", &EN_gone) < 0
        || offset_of(E, "_idle", &EN_idle) < 0
        || offset_of(E, "instant", &EN_instant) < 0
        || offset_of(E, "matcher", &EN_matcher) < 0
        || offset_of(E, "_n_pending", &EN_n_pending) < 0
        || offset_of(E, "now", &EN_now) < 0
        || offset_of(E, "peers", &EN_peers) < 0
        || offset_of(E, "_pending_recvs", &EN_pending_recvs) < 0
        || offset_of(E, "pool", &EN_pool) < 0
        || offset_of(E, "_recv_buffers", &EN_recv_buffers) < 0
        || offset_of(E, "tracer", &EN_tracer) < 0) {
        return NULL;
    }
    if (!PyType_IsSubtype(StatusType, &PyTuple_Type) || StatusType->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "configure: Status must be a tuple");
        return NULL;
    }
    ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"send", (PyCFunction)(void (*)(void))lane_send, METH_FASTCALL,
     "send(comm, buf, dst, tag, handle) -> bool | Request"},
    {"recv", (PyCFunction)(void (*)(void))lane_recv, METH_FASTCALL,
     "recv(comm, buf, src, tag, handle) -> Status | Request | None"},
    {"configure", configure, METH_O, "configure(spec): what the lane works with"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lane",
    "Optional accelerator: asynccomm's in-process fast lane, per message, in C.", -1, methods,
};

#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__lane(void)
{
    import_array();
    INTERN(a_engine, "_engine"); INTERN(a_loop, "_loop"); INTERN(a_engine_loop, "loop"); INTERN(a_size, "size");
    INTERN(a_rank, "rank"); INTERN(a_default_timeout, "_default_timeout");
    INTERN(a_closed, "closed"); INTERN(a_fast, "fast"); INTERN(a_default_stream, "default_stream");
    INTERN(a_peers, "peers"); INTERN(a_matcher, "matcher"); INTERN(a_pool, "pool");
    INTERN(a_flight, "flight"); INTERN(a_now, "now"); INTERN(a_tracer, "tracer");
    INTERN(a_eager_limit, "eager_limit"); INTERN(a_instant, "instant");
    INTERN(a_recv_buffers, "_recv_buffers"); INTERN(a_idle, "_idle");
    INTERN(a_n_pending, "_n_pending"); INTERN(a_pending_recvs, "_pending_recvs");
    INTERN(a_untrack, "_untrack"); INTERN(a_drain, "_drain"); INTERN(a_n_posted, "_n_posted");
    INTERN(a_n_wild_posted, "_n_wild_posted"); INTERN(a_posted, "_posted");
    INTERN(a_matched, "_matched"); INTERN(a_seq, "_seq"); INTERN(a_n_unexp, "_n_unexp");
    INTERN(a_unexp, "_unexp"); INTERN(a_unexp_bytes, "_unexp_bytes");
    INTERN(a_by_source, "_by_source"); INTERN(a_probes, "_probes"); INTERN(a_events, "events");
    INTERN(a_index_add, "_index_add"); INTERN(a_fire_probes, "_fire_probes");
    INTERN(a_unindex, "_unindex"); INTERN(a_waited, "_waited"); INTERN(a_first_wait, "_first_wait");
    INTERN(a_in_use, "_in_use"); INTERN(a_capacity_bytes, "capacity_bytes");
    INTERN(a_acquired, "_acquired"); INTERN(a_peak, "_peak"); INTERN(a_free, "_free");
    INTERN(a_reused, "_reused"); INTERN(a_cached, "_cached"); INTERN(a_gone, "gone");
    INTERN(a_unreachable, "_unreachable"); INTERN(a_withdraw, "withdraw");
    INTERN(a_broken, "broken"); INTERN(a_on_timeout, "_on_timeout");
    INTERN(a_call_later, "call_later"); INTERN(a_add_buffer, "_add_buffer");
    INTERN(a_check_recv_buffer, "check_recv_buffer"); INTERN(a_append, "append");
    INTERN(a_popleft, "popleft"); INTERN(a_done, "done"); INTERN(a_set_result, "set_result");
    INTERN(a_cancel, "cancel");
    INTERN(holder_key, "__asyncio_running_event_loop__");
    if (pthread_atfork(NULL, NULL, forget_in_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork");
        return NULL;
    }
    zero = PyLong_FromLong(0);
    minus_one = PyLong_FromLong(-1);
    minus_one_f = PyFloat_FromDouble(-1.0);
    if (zero == NULL || minus_one == NULL || minus_one_f == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("[sss]", "configure", "recv", "send");
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
