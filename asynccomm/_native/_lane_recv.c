/* The C lane's steps for a new recv (see _lane.c): a message already waiting taken
 * (``take_now``), or the recv posted (``post_now``), with the steps every request the
 * lane posts takes (``start_now``, ``track_unless_done``, ``track_on``: a send to
 * another process too).  Each writes the fields its Python step writes, in the same
 * order; each returns "not handled", having changed nothing, wherever that step would
 * take another way. */
#include "_lane.h"

#include <string.h>

/* ``StagingPool.release(view)``, inlined: a staged message's bytearray back to ``pool``
 * (kept for reuse while the cache has room).  0 done, -1 error. */
static int
release(PyObject *pool, PyObject *view)
{
    Py_ssize_t size = PyByteArray_GET_SIZE(view);
    long long cached, capacity;
    if (slot_add(pool, PO.in_use, -(size + MESSAGE_OVERHEAD)) < 0
        || slot_ll(pool, PO.cached, &cached) < 0
        || slot_ll(pool, PO.capacity_bytes, &capacity) < 0) {
        return -1;
    }
    if (!size || cached + size > capacity) {
        return 0;
    }
    PyObject *free = slot_get(pool, PO.free);
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
    if (rc < 0 || slot_set_ll(pool, PO.cached, cached + size) < 0) {
        return -1;
    }
    return 0;
}

/* A message waiting in ``matcher`` for (src, tag), taken into ``data`` (``take_now`` and
 * the receiver's record, traced with the message's flow): staged, or in this process
 * waiting at its sender (a rendezvous: the copy comes from the send's buffer, and the
 * link's ``received`` completes the send): its Status, with when its
 * timed copy began (``*started``: one of ``TIMED_COPY_MIN`` or more; else when it was
 * taken), when it was taken (``*when``) and its flow (0 if it has none; a new reference),
 * or Py_None when not handled (nothing changed). */
PyObject *
take(PyObject *engine, PyObject *matcher, PyObject *key, PyObject *src, PyObject *tag,
     char *data, Py_ssize_t nbytes, PyObject *dtype, double *started, double *when,
     PyObject **flow)
{
    PyObject *pool = slot_get(engine, EN.pool);
    if (pool == NULL) {
        return NULL;
    }
    if (Py_TYPE(pool) != StagingPoolType) {
        Py_DECREF(pool);
        Py_RETURN_NONE;
    }
    PyObject *index = slot_get(matcher, MA.unexp);
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
    PyObject *md = SLOT(msg, M.dtype), *where = SLOT(msg, M.where);
    long long n;
    view = SLOT(msg, M.view);
    /* staged here, or (in this process) a send waiting at its sender, its bytes' view
     * (the rendezvous of an instant link: ``take_now``'s direct copy) */
    int at_sender = where == W_AT_SENDER && SLOT(engine, EN.peers) != Py_None;
    if ((where != W_STAGED && !at_sender) || md == NULL
        || (md != dtype && PyObject_RichCompareBool(md, dtype, Py_EQ) != 1)
        || slot_ll(msg, M.nbytes, &n) < 0 || n > nbytes || n >= THREAD_COPY_MIN
        || view == NULL || (at_sender ? !PyMemoryView_Check(view)
                            || PyMemoryView_GET_BUFFER(view)->len < n
                            || !PyBuffer_IsContiguous(PyMemoryView_GET_BUFFER(view), 'C')
                            : !PyByteArray_CheckExact(view)
                            || PyByteArray_GET_SIZE(view) < n)) {
        view = NULL;
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    Py_INCREF(view);
    /* matcher.take(msg): _pop_unexpected, inlined */
    if (pop_head(index, key, bucket) < 0 || slot_add(matcher, MA.n_unexp, -1) < 0
        || slot_add(matcher, MA.unexp_bytes, -n) < 0) {
        goto done;
    }
    int t = slot_is_none(matcher, MA.by_source);
    if (t < 0) {
        goto done;
    }
    if (!t) {
        PyObject *r = PyObject_CallMethodOneArg(matcher, a_unindex, msg);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    put_ref(msg, M.seq, minus_one);
    if (slot_add(matcher, MA.matched, 1) < 0) {
        goto done;
    }
    double t0 = -1.0;  /* ``taken_at`` */
    if (n >= TIMED_COPY_MIN && now_of(engine, &t0) < 0) {
        goto done;
    }
    if (n) {
        memmove(data, at_sender ? PyMemoryView_GET_BUFFER(view)->buf
                : PyByteArray_AS_STRING(view), (size_t)n);
    }
    if (!at_sender && release(pool, view) < 0) {
        goto done;
    }
    /* the link's received(msg, rank): across processes (MPI) its credit goes back to its
     * sender; in this process it completes the send waiting at its sender (here, where
     * ``sent_here`` can), and does nothing for a staged message on an instant link */
    int here = at_sender ? sent_here(engine, msg) : 0;  /* (the send completed in C) */
    if (here < 0) {
        goto done;
    }
    if (!here && (SLOT(engine, EN.peers) == Py_None || at_sender)) {
        PyObject *link = SLOT(engine, EN.link), *rank = SLOT(engine, EN.rank);
        PyObject *r = link == NULL || rank == NULL ? NULL
            : PyObject_CallMethodObjArgs(link, a_received, msg, rank, NULL);
        if (r == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_AttributeError, "unset slot");
            }
            goto done;
        }
        Py_DECREF(r);
    }
    long long mc;
    if (slot_ll(msg, M.count, &mc) < 0) {
        goto done;
    }
    /* the source, tag, count and shape are the message's own */
    PyObject *status = new_status(SLOT(msg, M.source), SLOT(msg, M.tag), (Py_ssize_t)n,
                                  (Py_ssize_t)mc, SLOT(msg, M.shape));
    if (status == NULL) {
        goto done;
    }
    double now;
    PyObject *mflow = SLOT(msg, M.flow);  /* a traced world's id for it, if any */
    if (now_of(engine, &now) < 0) {
        Py_DECREF(status);
        goto done;
    }
    *started = t0 < 0 ? now : t0;  /* (not timed: posted, matched and taken now) */
    if (record(engine, 1, PyTuple_GET_ITEM(status, 0), PyTuple_GET_ITEM(status, 1),
               (Py_ssize_t)n, zero, *started, *started, now, mflow) < 0) {
        Py_DECREF(status);
        goto done;
    }
    *when = now;
    *flow = mflow == NULL ? Py_NewRef(zero) : Py_NewRef(mflow);
    result = status;
done:
    Py_XDECREF(pool);
    Py_XDECREF(view);
    Py_XDECREF(msg);
    Py_DECREF(index);
    return result;
}

/* ``Stream._track`` and the engine's ``track`` for a new request on ``stream`` (the parts
 * every kind shares: its place in the stream, tracked, one more pending).  0 done, -1
 * error. */
int
track_on(PyObject *engine, PyObject *stream, PyObject *req)
{
    long long sseq;
    if (slot_ll(stream, S.seq, &sseq) < 0) {
        return -1;
    }
    PyObject *vq = PyLong_FromLongLong(sseq + 1);
    if (vq == NULL) {
        return -1;
    }
    put(stream, S.seq, vq);
    put_ref(req, R.sseq, vq);
    PyObject *pending = SLOT(stream, S.pending);
    if (pending == NULL || PyObject_SetItem(pending, vq, req) < 0) {
        return -1;
    }
    put_ref(req, R.tracked, Py_True);
    return slot_add(engine, EN.n_pending, 1);
}

/* What the engine's ``start`` does first for any request: POSTED, posted now.  0 done,
 * -1 error.  (This one and the next are ``inline`` so that ``post``, on the hot path of
 * every recv, takes them without a call: the same instructions as when each was written
 * out there.) */
inline int
start_now(PyObject *engine, PyObject *req)
{
    double t;
    put_ref(req, R.state, S_POSTED);
    if (now_of(engine, &t) < 0) {
        return -1;
    }
    PyObject *tp = PyFloat_FromDouble(t);
    if (tp == NULL) {
        return -1;
    }
    put(req, R.t_post, tp);
    return 0;
}

/* What ``Stream._submit`` does for a request its engine just started on ``stream``: one
 * that finished as it was posted is never tracked, any other is (``track_on``).  1
 * finished, 0 tracked, -1 error. */
inline int
track_unless_done(PyObject *engine, PyObject *stream, PyObject *req)
{
    PyObject *state = SLOT(req, R.state);
    if (state != S_POSTED) {  /* (the common case needs no comparison) */
        int finished = state == NULL ? -1 : PyObject_RichCompareBool(state, S_DONE, Py_GE);
        if (finished != 0) {
            if (state == NULL) {
                PyErr_SetString(PyExc_AttributeError, "unset slot");
            }
            return finished < 0 ? -1 : 1;
        }
    }
    return track_on(engine, stream, req) < 0 ? -1 : 0;
}

/* ``heapq.heappush(heap, entry)`` for a deadline heap, whose entries are [when, seq,
 * req] with ``when`` a float and ``seq`` an int unique to the entry (so two compare as
 * (when, seq) do, as lists compare them): appended where it is no less than its
 * parent-to-be (a deadline no earlier than those armed before, the common case), else
 * handed to ``heappush`` (as is an entry whose parent has another shape).  0 done, -1
 * error. */
static int
heap_push(PyObject *heap, PyObject *entry, double when, PyObject *seq)
{
    Py_ssize_t pos = PyList_GET_SIZE(heap);
    if (pos > 0) {
        PyObject *parent = PyList_GET_ITEM(heap, (pos - 1) >> 1);
        int less = -2;  /* not known: heappush decides */
        if (PyList_CheckExact(parent) && PyList_GET_SIZE(parent) == 3
            && PyFloat_CheckExact(PyList_GET_ITEM(parent, 0))) {
            double p = PyFloat_AS_DOUBLE(PyList_GET_ITEM(parent, 0));
            less = when < p;
            if (when == p
                && (less = PyObject_RichCompareBool(seq, PyList_GET_ITEM(parent, 1),
                                                    Py_LT)) < 0) {
                return -1;
            }
        }
        if (less != 0) {  /* it moves up (or may): heappush moves it */
            PyObject *argv[2] = {heap, entry};
            Py_INCREF(heap);  /* (heappush compares in Python: the slot may change) */
            PyObject *r = PyObject_Vectorcall(heappush, argv, 2, NULL);
            Py_DECREF(heap);
            Py_XDECREF(r);
            return r == NULL ? -1 : 0;
        }
    }
    return PyList_Append(heap, entry);  /* its place: the heap holds with it at the end */
}

/* What the engine's ``track`` does last for a tracked request with a ``timeout`` (not
 * None): its deadline armed, as ``Deadlines.arm(req, timeout)`` does (``_deadlines``):
 * the entry [loop.time() + timeout, seq, req] pushed on the loop's heap and kept as the
 * request's ``_timer``; the shared timer armed (``_arm_at``) when none is or the deadline
 * is earlier, else the heap compacted when it holds too many dead entries.  0 done, -1
 * error. */
int
arm_timer(PyObject *engine, PyObject *req, PyObject *timeout)
{
    PyObject *dl = SLOT(engine, EN.deadlines);
    if (dl == NULL || Py_TYPE(dl) != DeadlinesType) {
        PyErr_SetString(PyExc_TypeError, "the engine's deadlines");
        return -1;
    }
    /* each slot read where it is used (a call between may run Python code) */
    PyObject *clock = SLOT(dl, D.time);
    if (clock == NULL) {
        PyErr_SetString(PyExc_TypeError, "a deadline heap's slots");
        return -1;
    }
    double delay = PyFloat_AsDouble(timeout);
    if (delay == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    Py_INCREF(clock);
    PyObject *now = PyObject_CallNoArgs(clock);  /* loop.time() */
    Py_DECREF(clock);
    double t = now == NULL ? -1.0 : PyFloat_AsDouble(now);
    Py_XDECREF(now);
    if (now == NULL || (t == -1.0 && PyErr_Occurred())) {
        return -1;
    }
    PyObject *count = SLOT(dl, D.seq);
    if (count == NULL) {
        PyErr_SetString(PyExc_TypeError, "a deadline heap's slots");
        return -1;
    }
    Py_INCREF(count);
    PyObject *seq = PyIter_Next(count);
    Py_DECREF(count);
    if (seq == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "a deadline sequence ended");
        }
        return -1;
    }
    PyObject *when = PyFloat_FromDouble(t + delay);
    PyObject *entry = when == NULL ? NULL : PyList_New(3);
    if (entry == NULL) {
        Py_XDECREF(when);
        Py_DECREF(seq);
        return -1;
    }
    PyList_SET_ITEM(entry, 0, when);  /* stolen, as the next two */
    PyList_SET_ITEM(entry, 1, seq);
    PyList_SET_ITEM(entry, 2, Py_NewRef(req));
    PyObject *heap = SLOT(dl, D.heap);
    if (heap == NULL || !PyList_CheckExact(heap)) {
        Py_DECREF(entry);
        PyErr_SetString(PyExc_TypeError, "a deadline heap's slots");
        return -1;
    }
    if (heap_push(heap, entry, t + delay, seq) < 0) {
        Py_DECREF(entry);
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(heap);
    put(req, R.timer, entry);  /* stolen */
    /* the shared timer: armed at the first entry when none is armed or this deadline is
     * earlier, else the heap compacted when it holds too many dead entries */
    PyObject *handle = SLOT(dl, D.handle), *at = SLOT(dl, D.at), *lim = SLOT(dl, D.limit);
    PyObject *step = NULL;  /* the Deadlines method to call, if any */
    if (handle == NULL || handle == Py_None) {
        step = a_arm_at;
    } else if (at == NULL || !PyFloat_CheckExact(at) || lim == NULL || !PyLong_CheckExact(lim)) {
        PyErr_SetString(PyExc_TypeError, "a deadline heap's timer");
        return -1;
    } else if (t + delay < PyFloat_AS_DOUBLE(at)) {
        step = a_arm_at;
    } else {
        Py_ssize_t limit = PyLong_AsSsize_t(lim);
        if (limit == -1 && PyErr_Occurred()) {
            return -1;
        }
        step = n > limit ? a_compact : NULL;
    }
    if (step == NULL) {
        return 0;
    }
    PyObject *r = PyObject_CallMethodNoArgs(dl, step);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* What ``post_now`` does for a new recv with no message waiting for it (``wild``: it names
 * ``ANY_SOURCE`` or ``ANY_TAG``, and no waiting message is one it names). */
int
post(PyObject *engine, PyObject *matcher, PyObject *key, PyObject *req, PyObject *stream,
     Py_ssize_t nbytes, PyObject *timeout, int wild)
{
    if (start_now(engine, req) < 0) {
        return -1;
    }
    /* matcher.post_recv -> _queue_recv, inlined */
    if (queue_numbered(matcher, MA.posted, MA.n_posted, key, req, "posted recvs") < 0
        || (wild && slot_add(matcher, MA.n_wild_posted, 1) < 0)) {
        return -1;
    }
    PyObject *waited = slot_get(matcher, MA.waited);
    if (waited == NULL) {
        return -1;
    }
    PyObject *src = SLOT(req, M.source);
    int seen = PySet_Contains(waited, src);
    Py_DECREF(waited);
    if (seen < 0) {
        return -1;
    }
    if (!seen) {
        PyObject *r = PyObject_CallMethodOneArg(matcher, a_first_wait, src);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    int t1 = slot_true(matcher, MA.events);
    if (t1 < 0) {
        return -1;
    }
    if (t1) {
        PyObject *r = PyObject_CallMethodNoArgs(engine, a_drain);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    /* Finished: not tracked.  Matched (its data on the way): pending, tracked. */
    int finished = track_unless_done(engine, stream, req);
    if (finished != 0) {
        return finished < 0 ? -1 : 0;
    }
    if (nbytes > 0) {
        if (slot_add(engine, EN.pending_recvs, 1) < 0) {
            return -1;
        }
        PyObject *rb = slot_get(engine, EN.recv_buffers);
        if (rb == NULL) {
            return -1;
        }
        if (rb != Py_None && pending_exact(rb)) {  /* the engine's _add_buffer, inlined */
            PyObject *at = SLOT(req, R.array);
            if (at == Py_None) {
                at = SLOT(req, M.view);
            }
            int rc = at == NULL ? -1 : pending_insert(rb, at, nbytes, req);
            Py_DECREF(rb);
            if (rc < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_AttributeError, "unset slot");
                }
                return -1;
            }
        } else if (rb != Py_None) {
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
    if (timeout != Py_None && arm_timer(engine, req, timeout) < 0) {
        return -1;
    }
    int gone = slot_true(engine, EN.gone);
    if (gone < 0) {
        return -1;
    }
    if (gone) {
        PyObject *peer = SLOT(req, R.peer);
        PyObject *u = PyObject_CallMethodOneArg(engine, a_unreachable, peer);
        int yes = u == NULL ? -1 : PyObject_IsTrue(u);
        Py_XDECREF(u);
        if (yes < 0) {
            return -1;
        }
        if (yes) {
            PyObject *exc = PyObject_CallMethodOneArg(engine, a_broken, peer);
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
