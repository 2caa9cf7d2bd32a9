/* The C lane's steps on the receiving engine when a message arrives (see _lane.c): a
 * small message offered (``steps.offer``, asynccomm/_engine/steps.py) and the posted recv it completes
 * (``steps.complete``).  Each writes the fields its Python step writes, in the same
 * order; each returns "not handled", having changed nothing, wherever that step would
 * take another way. */
#include "_lane.h"

#include <string.h>

unsigned long lane_woken;  /* (see _lane.h) */

/* -- the receiving engine: a message offered, a recv completed ------------------------ */

static int complete_on(PyObject *engine, PyObject *recv, PyObject *stream, PyObject *source,
                       PyObject *tag, Py_ssize_t nbytes, Py_ssize_t count, double *when);
static int untrack_plain(PyObject *engine, PyObject *req, PyObject *stream, int is_recv);
static inline int finish_done(PyObject *engine, PyObject *req, PyObject *stream, int is_recv,
                              PyObject *exc, PyObject *peer, PyObject *tag, Py_ssize_t nbytes,
                              double t_post, double t_match, double *when);

/* What ``steps.complete`` does for a posted ``recv`` (state POSTED) that the message
 * (source, tag, nbytes, count) just filled (matched at its ``t_match`` if a timed copy set
 * it, else now); traced with the recv's flow, if it has one.
 * The recv's stream is held for the whole step: it calls back into Python (waiters,
 * the timer), which could drop the recv's own reference. */
int
complete(PyObject *engine, PyObject *recv, PyObject *source, PyObject *tag,
         Py_ssize_t nbytes, Py_ssize_t count, double *when)
{
    PyObject *stream = SLOT(recv, R.stream);
    if (stream == NULL || Py_TYPE(stream) != StreamType) {
        PyErr_SetString(PyExc_TypeError, "a fast-lane recv's stream");
        return -1;
    }
    Py_INCREF(stream);
    int r = complete_on(engine, recv, stream, source, tag, nbytes, count, when);
    Py_DECREF(stream);
    return r;
}

static int
complete_on(PyObject *engine, PyObject *recv, PyObject *stream, PyObject *source,
            PyObject *tag, Py_ssize_t nbytes, Py_ssize_t count, double *when)
{
    PyObject *status = new_status(source, tag, nbytes, count, NULL);
    if (status == NULL) {
        return -1;
    }
    PyObject *prev = SLOT(recv, R.result);
    if (prev == NULL || prev == Py_None) {
        put(recv, R.result, status);
    } else {
        PyObject *pair = PyTuple_Pack(2, prev, status);
        Py_DECREF(status);
        if (pair == NULL) {
            return -1;
        }
        put(recv, R.result, pair);
    }
    double t_post, t_match;
    if (slot_double(recv, R.t_post, &t_post) < 0 || slot_double(recv, R.t_match, &t_match) < 0) {
        return -1;
    }
    return finish_done(engine, recv, stream, 1, NULL, source, tag, nbytes, t_post, t_match,
                       when);
}

/* The step that ends a request whose outcome is set, a recv (``is_recv``) or a send, as the
 * engine's ``_finish`` does: DONE (and its ``exc``, unless NULL), finished at the engine's
 * time now (``*when``), its flight record and tally (a recv's with its flow; not matched
 * yet: matched now), then ``settle``.  The caller holds ``stream``.  (``finish_done``,
 * inlined in the recv's completion here, the hot path of every small message.) */
int
done_at(PyObject *engine, PyObject *req, PyObject *stream, int is_recv, PyObject *exc,
        PyObject *peer, PyObject *tag, Py_ssize_t nbytes, double t_post, double t_match,
        double *when)
{
    return finish_done(engine, req, stream, is_recv, exc, peer, tag, nbytes, t_post, t_match,
                       when);
}

static inline int
finish_done(PyObject *engine, PyObject *req, PyObject *stream, int is_recv, PyObject *exc,
            PyObject *peer, PyObject *tag, Py_ssize_t nbytes, double t_post, double t_match,
            double *when)
{
    double t;
    put_ref(req, R.state, S_DONE);
    if (exc != NULL) {
        put_ref(req, R.exc, exc);
    }
    if (now_of(engine, &t) < 0) {
        return -1;
    }
    *when = t;
    PyObject *tf = PyFloat_FromDouble(t);
    if (tf == NULL) {
        return -1;
    }
    put(req, R.t_fin, tf);
    if (record(engine, is_recv, peer, tag, nbytes, SLOT(stream, S.sid), t_post,
               t_match < 0 ? t : t_match, t, is_recv ? SLOT(req, M.flow) : NULL) < 0) {
        return -1;
    }
    return settle(engine, req, stream, is_recv);
}

/* What the instant link's ``received`` does for ``msg``, a send of this process that
 * waited at its sender and that a recv of ``engine`` just took (``take``): the sending
 * engine's ``sent``, its ``_finish``: DONE, finished now, its flight record and tally (as
 * ``flight.finish`` makes them: the send was not matched before), then ``settle``.  1
 * done, 0 not handled (nothing changed: the link's ``received`` runs), -1 error.  Not
 * handled wherever the sending engine would do more: not the fast lane's (traced,
 * logging, broken, revoked), another link's, a request not POSTED. */
int
sent_here(PyObject *engine, PyObject *msg)
{
    if (Py_TYPE(msg) != RequestType || SLOT(msg, R.kind) != K_SEND
        || SLOT(msg, R.state) != S_POSTED) {
        return 0;
    }
    PyObject *owner = SLOT(msg, R.owner), *peers = SLOT(engine, EN.peers);
    PyObject *source = SLOT(msg, M.source), *stream = SLOT(msg, R.stream);
    if (owner == NULL || Py_TYPE(owner) != DeviceEngineType || peers == NULL
        || !PyList_CheckExact(peers) || source == NULL || !PyLong_CheckExact(source)
        || stream == NULL || Py_TYPE(stream) != StreamType) {
        return 0;
    }
    Py_ssize_t s = PyLong_AsSsize_t(source);
    if (s < 0 || s >= PyList_GET_SIZE(peers) || PyList_GET_ITEM(peers, s) != owner) {
        PyErr_Clear();
        return 0;  /* (the link's endpoint for the source is the sending engine) */
    }
    int fast = SLOT(owner, EN.tracer) == Py_None ? slot_true(owner, EN.fast) : 0;
    if (fast <= 0) {
        return fast;
    }
    PyObject *flight = SLOT(owner, EN.flight);
    PyObject *ring = flight != NULL && Py_TYPE(flight) == FlightRecorderType
        ? SLOT(flight, F.ring) : NULL;
    PyObject *tallies = ring != NULL && Py_TYPE(ring) == &RingType ? SLOT(flight, F.sends)
        : NULL;
    PyObject *peer = SLOT(msg, R.peer), *tag = SLOT(msg, M.tag), *sid = SLOT(stream, S.sid);
    if (tallies == NULL || !PyDict_Check(tallies) || peer == NULL || tag == NULL
        || sid == NULL) {
        return 0;
    }
    long long p = PyLong_AsLongLong(peer), g = PyLong_AsLongLong(tag), d = PyLong_AsLongLong(sid);
    long long n;
    double t_post, t_match, t;
    if ((p == -1 || g == -1 || d == -1) && PyErr_Occurred()) {
        return -1;
    }
    if (slot_ll(msg, M.nbytes, &n) < 0 || slot_double(msg, R.t_post, &t_post) < 0
        || slot_double(msg, R.t_match, &t_match) < 0) {
        return -1;
    }
    PyObject *tally = PyDict_GetItemWithError(tallies, peer);  /* (made on first use) */
    if (tally != NULL) {
        Py_INCREF(tally);
    } else if (PyErr_Occurred() || (tally = PyObject_GetItem(tallies, peer)) == NULL) {
        return -1;
    }
    if (Py_TYPE(tally) != &TallyCType) {
        Py_DECREF(tally);
        return 0;
    }
    Py_INCREF(msg);  /* (held while its waiters and stream hear of it) */
    Py_INCREF(stream);
    Py_INCREF(owner);
    int rc = -1;
    put_ref(msg, R.state, S_DONE);
    put_ref(msg, R.exc, Py_None);
    PyObject *tf = now_of(owner, &t) < 0 ? NULL : PyFloat_FromDouble(t);
    if (tf != NULL) {
        put(msg, R.t_fin, tf);
        ring_push(ring, 0, p, g, n, d, 0, t_post, t_match, t);
        double since = t_post >= 0 ? t_post : t;
        if (t_match >= 0) {
            tally_add(tally, n, t_match - since, t - t_match);
        } else {
            tally_add(tally, n, 0.0, t - since);
        }
        rc = settle(owner, msg, stream, 0) < 0 ? -1 : 1;
    }
    Py_DECREF(owner);
    Py_DECREF(stream);
    Py_DECREF(msg);
    Py_DECREF(tally);
    return rc;
}

/* Where ``recv``, the head of an exact bucket, takes a payload of ``nbytes`` of ``dtype``
 * here: a POSTED ``Request`` of that dtype (or none) whose writable array has room for it.
 * A recv with no size of its own (``recv_new``) fits only if ``new_ok``.  NULL: it does not
 * fit (the Python steps take it), or an error is set. */
char *
recv_fits(PyObject *recv, PyObject *dtype, Py_ssize_t nbytes, int new_ok)
{
    PyObject *rd = SLOT(recv, M.dtype);
    long long rn;
    Py_ssize_t cap;
    char *dst;
    if (!PyObject_TypeCheck(recv, RequestType) || SLOT(recv, R.state) != S_POSTED
        || rd == NULL || (rd != Py_None && rd != dtype
                          && PyObject_RichCompareBool(rd, dtype, Py_EQ) != 1)
        || slot_ll(recv, M.nbytes, &rn) < 0 || (rn < nbytes && (rn >= 0 || !new_ok))
        || (dst = array_bytes(SLOT(recv, R.array), 1, &cap)) == NULL || cap < nbytes) {
        return NULL;
    }
    return dst;
}

/* What ends a request whose outcome is set (``Request._wake``, then the engine's
 * ``_untrack``, inlined where nothing else needs telling): its waiters woken, its deadline
 * ended, and it leaves its stream's pending ops.  ``is_recv``: a recv (one pending recv
 * buffer fewer), else a send.  The caller holds ``stream``. */
int
settle(PyObject *engine, PyObject *req, PyObject *stream, int is_recv)
{
    PyObject *waiters = SLOT(req, R.waiters);
    if (waiters != NULL && waiters != Py_None) {
        Py_INCREF(waiters);
        put_ref(req, R.waiters, Py_None);
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
            PyObject *r = is_done ? NULL : PyObject_CallMethodOneArg(fut, a_set_result, Py_None);
            if (is_done < 0 || (!is_done && r == NULL)) {
                Py_DECREF(waiters);
                return -1;
            }
            lane_woken += !is_done;
            Py_XDECREF(r);
        }
        Py_DECREF(waiters);
    }
    PyObject *timer = SLOT(req, R.timer);
    if (timer != NULL && timer != Py_None) {
        /* its deadline's entry ends (``_deadlines.end``): [when, seq, req] */
        if (!PyList_CheckExact(timer) || PyList_GET_SIZE(timer) != 3) {
            PyErr_SetString(PyExc_TypeError, "a request's deadline entry");
            return -1;
        }
        Py_INCREF(timer);
        Py_INCREF(Py_None);
        PyList_SetItem(timer, 2, Py_None);  /* drops the entry's reference to req */
        put_ref(req, R.timer, Py_None);
        Py_DECREF(timer);
    }
    if (SLOT(req, R.tracked) != Py_True) {
        return 0;
    }
    /* what _untrack does, inlined when nothing else needs telling (no index of pending
     * recv buffers, or the C one) */
    PyObject *rb = SLOT(engine, EN.recv_buffers);
    int plain = rb != NULL && (rb == Py_None || pending_exact(rb));
    PyObject *q = SLOT(stream, S.queue), *ev = SLOT(stream, S.events);
    if (plain && q != NULL && PySequence_Size(q) == 0 && ev != NULL
        && PySequence_Size(ev) == 0) {
        plain = slot_is_none(engine, EN.idle);
        if (plain < 0) {
            return -1;
        }
    } else {
        plain = 0;
    }
    if (!plain) {
        PyObject *r = PyObject_CallMethodOneArg(engine, a_untrack, req);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
        return 0;
    }
    Py_INCREF(req);  /* (the index may hold its last reference) */
    int rc = untrack_plain(engine, req, stream, is_recv);
    Py_DECREF(req);
    return rc;
}

/* ``_untrack`` for ``req`` on ``stream`` where nothing else needs telling (``settle``). */
static int
untrack_plain(PyObject *engine, PyObject *req, PyObject *stream, int is_recv)
{
    put_ref(req, R.tracked, Py_False);
    if (slot_add(engine, EN.n_pending, -1) < 0) {
        return -1;
    }
    long long rn = 0, left;
    if (is_recv && slot_ll(req, M.nbytes, &rn) < 0) {
        return -1;
    }
    if (rn > 0) {
        if (slot_ll(engine, EN.pending_recvs, &left) < 0
            || slot_set_ll(engine, EN.pending_recvs, --left) < 0) {
            return -1;
        }
        PyObject *rb = SLOT(engine, EN.recv_buffers);
        if (rb != NULL && rb != Py_None && pending_exact(rb)) {
            if (left) {
                pending_forget(rb, req);
            } else {  /* none pending: the index goes (built again on need) */
                put_ref(engine, EN.recv_buffers, Py_None);
            }
        }
    }
    PyObject *sseq = SLOT(req, R.sseq), *pending = SLOT(stream, S.pending);
    if (sseq == NULL || pending == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a tracked request's sseq");
        return -1;
    }
    return PyObject_DelItem(pending, sseq);
}

/* ``matcher.enqueue(msg)`` at ``peer``, inlined (``key``: the message's (source, tag)),
 * then ``peer._drain()`` if a probe saw it: what the receiving engine's ``arrived`` does
 * for a message no recv is posted for.  0 done, -1 error. */
static int
enqueue(PyObject *peer, PyObject *matcher, PyObject *key, PyObject *msg, Py_ssize_t nbytes)
{
    if (queue_numbered(matcher, MA.unexp, MA.n_unexp, key, msg, "unexpected messages") < 0
        || slot_add(matcher, MA.unexp_bytes, nbytes) < 0) {
        return -1;
    }
    PyObject *by_source = slot_get(matcher, MA.by_source);
    if (by_source == NULL) {
        return -1;
    }
    if (by_source != Py_None) {
        PyObject *r = PyObject_CallMethodObjArgs(matcher, a_index_add, by_source, msg, NULL);
        Py_DECREF(by_source);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    } else {
        Py_DECREF(by_source);
    }
    int t = slot_true(matcher, MA.probes);
    if (t < 0) {
        return -1;
    }
    if (t) {
        PyObject *r = PyObject_CallMethodOneArg(matcher, a_fire_probes, msg);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    t = slot_true(matcher, MA.events);
    if (t < 0) {
        return -1;
    }
    if (t) {  /* a probe saw it */
        PyObject *r = PyObject_CallMethodNoArgs(peer, a_drain);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    return 0;
}

/* What the instant link's ``send`` and the receiving engine's ``arrived`` do for a
 * rendezvous send ``req`` (POSTED, its bytes' view set) that ``offer`` said waits at its
 * sender (4): announced at ``peer``, an unexpected message there (``enqueue``).  0 done,
 * -1 error. */
int
announce(PyObject *peer, PyObject *req)
{
    PyObject *matcher = slot_get(peer, EN.matcher);
    if (matcher == NULL) {
        return -1;
    }
    long long n;
    PyObject *key = slot_ll(req, M.nbytes, &n) < 0 ? NULL
        : PyTuple_Pack(2, SLOT(req, M.source), SLOT(req, M.tag));
    int rc = key == NULL ? -1 : enqueue(peer, matcher, key, req, (Py_ssize_t)n);
    Py_XDECREF(key);
    Py_DECREF(matcher);
    return rc;
}

/* What ``steps.offer`` does (under THREAD_COPY_MIN, the caller's check: a copy of
 * TIMED_COPY_MIN or more is timed, the recv matched before it; ``flow``: the message's id
 * in a traced world, else NULL): 1 if a posted recv took the message, 3 if the pool staged it,
 * 0 if not handled (nothing changed).  Without ``stage``, what ``offer_bytes`` does: only
 * a posted recv may take it, and 2 says that none is posted that could (no recv, exact or
 * wildcard, names its source and tag), having changed nothing.  With ``stage`` 2 (an
 * untraced in-process send), 4 says that the message is a rendezvous (over the peer's
 * eager limit) that no recv, exact or wildcard, is posted for: it would wait at its
 * sender (``announce``), nothing changed; with ``stage`` 2, a message of
 * ``THREAD_COPY_MIN`` or more (its copy is the worker thread's) is only ever answered 4 or
 * 0. */
int
offer(PyObject *peer, PyObject *source, PyObject *tag, char *data, Py_ssize_t nbytes,
      Py_ssize_t count, PyObject *dtype, PyObject *flow, int stage, double *when)
{
    int t = slot_true(peer, EN.closed);
    if (t != 0) {
        return t < 0 ? -1 : 0;  /* closed: the Python steps say what follows */
    }
    if (!trace_ok(peer)) {
        return 0;
    }
    PyObject *matcher = slot_get(peer, EN.matcher);
    if (matcher == NULL) {
        return -1;
    }
    if (Py_TYPE(matcher) != MatcherType) {
        Py_DECREF(matcher);
        return 0;
    }
    int rc = -1;
    PyObject *key = NULL, *rkey = NULL, *index = NULL, *pool = NULL, *msg = NULL, *buf = NULL;
    long long n_posted, n_wild;
    if (slot_ll(matcher, MA.n_posted, &n_posted) < 0) {
        goto done;
    }
    key = PyTuple_Pack(2, source, tag);
    if (key == NULL) {
        goto done;
    }
    if (n_posted) {
        if (slot_ll(matcher, MA.n_wild_posted, &n_wild) < 0) {
            goto done;
        }
        index = slot_get(matcher, MA.posted);
        if (index == NULL || !PyDict_CheckExact(index)) {
            goto done;
        }
        /* the recv posted first among those that name the message (with wildcard recvs
         * posted, the earliest of four buckets' heads) */
        PyObject *recv, *bucket;
        int wild;
        int found = posted_earliest(index, key, source, tag, n_wild > 0, &recv, &rkey,
                                    &bucket, &wild);
        if (found < 0) {
            goto done;
        }
        if (found == 2) {  /* (a tombstone at a head: the Python steps drop it) */
            rc = 0;
            goto done;
        }
        if (found) {
            char *dst = stage == 2 && nbytes >= THREAD_COPY_MIN ? NULL
                : recv_fits(recv, dtype, nbytes, 1);
            if (dst == NULL) {
                rc = PyErr_Occurred() ? -1 : 0;
                goto done;
            }
            Py_INCREF(recv);
            if (pop_head(index, rkey, bucket) < 0) {
                Py_DECREF(recv);
                goto done;
            }
            put_ref(recv, M.seq, minus_one);
            if (slot_add(matcher, MA.n_posted, -1) < 0 || slot_add(matcher, MA.matched, 1) < 0
                || (wild && slot_add(matcher, MA.n_wild_posted, -1) < 0)) {
                Py_DECREF(recv);
                goto done;
            }
            if (nbytes >= TIMED_COPY_MIN) {  /* a timed copy: matched before it */
                double t;
                PyObject *tm = now_of(peer, &t) < 0 ? NULL : PyFloat_FromDouble(t);
                if (tm == NULL) {
                    Py_DECREF(recv);
                    goto done;
                }
                put(recv, R.t_match, tm);
            }
            if (nbytes) {
                memmove(dst, data, (size_t)nbytes);
            }
            if (flow != NULL) {
                put_ref(recv, M.flow, flow);
            }
            rc = complete(peer, recv, source, tag, nbytes, count, when) < 0 ? -1 : 1;
            Py_DECREF(recv);
            goto done;
        }
    }
    if (!stage) {  /* (here no recv, exact or wildcard, is posted that could take it) */
        rc = 2;
        goto done;
    }
    /* staging: StagingPool.acquire(nbytes, tentative=True), inlined */
    long long limit;
    if (slot_ll(peer, EN.eager_limit, &limit) < 0) {
        goto done;
    }
    if (nbytes > limit || (stage == 2 && nbytes >= THREAD_COPY_MIN)) {
        rc = stage == 2 && nbytes > limit ? 4 : 0;
        goto done;
    }
    pool = slot_get(peer, EN.pool);
    if (pool == NULL || Py_TYPE(pool) != StagingPoolType) {
        rc = pool == NULL ? -1 : 0;
        goto done;
    }
    long long size = bucket_size(nbytes), in_use, capacity, peak;
    long long cost = size + MESSAGE_OVERHEAD;
    if (slot_ll(pool, PO.in_use, &in_use) < 0 || slot_ll(pool, PO.capacity_bytes, &capacity) < 0
        || slot_ll(pool, PO.peak, &peak) < 0) {
        goto done;
    }
    if (in_use + cost > capacity || !size) {
        rc = 0;  /* refused (not counted: tentative), or empty: the Python steps */
        goto done;
    }
    PyObject *free = slot_get(pool, PO.free);
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
        if (slot_ll(pool, PO.cached, &cached) < 0) {
            goto done;
        }
        Py_ssize_t last = PyList_GET_SIZE(list) - 1;
        buf = PyList_GET_ITEM(list, last);
        Py_INCREF(buf);
        if (PyList_SetSlice(list, last, last + 1, NULL) < 0) {
            goto done;
        }
    } else {
        buf = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (buf == NULL) {
            goto done;
        }
        memset(PyByteArray_AS_STRING(buf), 0, (size_t)size);
    }
    if (slot_add(pool, PO.acquired, 1) < 0 || slot_set_ll(pool, PO.in_use, in_use + cost) < 0
        || (in_use + cost > peak && slot_set_ll(pool, PO.peak, in_use + cost) < 0)
        || (reuse && (slot_add(pool, PO.reused, 1) < 0
                      || slot_set_ll(pool, PO.cached, cached - size) < 0))) {
        goto done;
    }
    if (!PyByteArray_CheckExact(buf) || PyByteArray_GET_SIZE(buf) < nbytes) {
        PyErr_SetString(PyExc_TypeError, "a staging buffer");
        goto done;
    }
    memmove(PyByteArray_AS_STRING(buf), data, (size_t)nbytes);
    msg = new_message(MessageType, source, tag, nbytes, count, dtype, W_STAGED, buf);
    if (msg == NULL) {
        goto done;
    }
    /* Left out of the cyclic collector's walks, as CPython leaves out tuples of numbers:
     * a staged Message holds numbers, strings, a shape tuple and its bytearray, and can
     * be part of no cycle.  A burst staged ahead of its recvs otherwise makes every full
     * collection walk all of it (reference counting frees it as before). */
    PyObject_GC_UnTrack(msg);
    if (flow != NULL) {
        put_ref(msg, M.flow, flow);
    }
    if (enqueue(peer, matcher, key, msg, nbytes) < 0) {
        goto done;
    }
    rc = 3;
done:
    Py_XDECREF(buf);
    Py_XDECREF(msg);
    Py_XDECREF(pool);
    Py_XDECREF(index);
    Py_XDECREF(rkey);
    Py_XDECREF(key);
    Py_DECREF(matcher);
    return rc;
}
