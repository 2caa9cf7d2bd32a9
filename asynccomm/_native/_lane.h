/* The C lane's shared declarations (see _lane.c): what ``configure`` fills in (the
 * classes, constants and slot offsets), the slot accessors, and what each file gives the
 * others. */
#ifndef ASYNCCOMM_LANE_H
#define ASYNCCOMM_LANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL asynccomm_lane_ARRAY_API
#ifndef LANE_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "_judge.h"

#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* -- what configure() fills in (_lane_config.c) --------------------------------------- */

/* Everything here comes from ``asynccomm._comm.native`` (the declaration of what the lane
 * takes), by position: each table in _lane_config.c lists these variables in the order of
 * the declaration, and tests/api/test_native_contract.py checks that they agree. */

extern int ready;
extern PyObject *names;  /* dtype -> name (``set_dtype_names``) */
extern PyObject *deque_append, *deque_popleft;  /* deque's own methods */
extern PyObject *zero, *minus_one, *minus_one_f;

/* native.CLASSES: <name>Type */
extern PyTypeObject *RequestType, *MessageType, *StatusType, *StreamType,
    *FlightRecorderType, *TallyType, *MatcherType, *StagingPoolType, *CommunicatorType,
    *DeviceEngineType, *RankTraceType, *DeadlinesType;
/* native.OBJECTS */
extern PyObject *get_running_loop, *perf_counter, *deque_type, *heappush;
extern PyObject *K_SEND, *K_RECV, *S_QUEUED, *S_POSTED, *S_DONE, *W_AT_SENDER, *W_STAGED;
/* native.NUMBERS: constants, and where the wire header's fields are (``wire.HEADER``) */
extern long TAG_UB, MIN_BUCKET, MESSAGE_OVERHEAD, TIMED_COPY_MIN, THREAD_COPY_MIN, EAGER;
extern long H_SIZE, H_KIND, H_DLEN, H_SRC, H_TAG, H_NBYTES, H_COUNT, H_DTYPE, DTYPE_MAX;
extern long RTS, CTS, H_IDENT;
/* native.STATUS_FIELDS: the fields of a Status tuple the lane builds */
#define STATUS_FIELDS 5

/* native.SLOTS: the offsets of the slots the lane reads and writes, per class, in the
 * order of the declaration (a member is the slot's name without its leading ``_``). */
extern struct message_slots {
    Py_ssize_t source, tag, nbytes, count, dtype, seq, where, view, ident, shape, flow;
} M;
extern struct trace_slots { Py_ssize_t ops, sent, label, size; } TR;
extern struct request_slots {
    Py_ssize_t array, owner, kind, peer, stream, timeout, record, t_post, t_match, state,
        result, exc, waiters, timer, tracked, t_fin, sseq;
} R;
extern struct stream_slots {
    Py_ssize_t queue, events, pending, seq, sid, owner, queued, in_order;
} S;
extern struct flight_slots { Py_ssize_t ring, sends, recvs; } F;
extern struct tally_slots { Py_ssize_t n, nbytes, w, c; } T;
extern struct matcher_slots {
    Py_ssize_t all, by_source, by_tag, events, matched, n_posted, n_unexp, n_wild_posted,
        posted, probes, seq, unexp, unexp_bytes, waited;
} MA;
extern struct pool_slots {
    Py_ssize_t acquired, cached, capacity_bytes, free, in_use, peak, reused;
} PO;
extern struct comm_slots { Py_ssize_t default_timeout, engine, loop, rank, size; } CO;
extern struct engine_slots {
    Py_ssize_t closed, default_stream, eager_limit, loop, fast, flight, gone, idle,
        instant, link, matcher, n_pending, now, peers, pending_recvs, pool, rank, recv_buffers,
        traced, tracer, deadlines;
} EN;
extern struct deadline_slots { Py_ssize_t time, seq, heap, handle, at, limit; } D;

/* native.NAMES: a_<key>, the interned names of the methods and attributes the lane calls
 * or reads by name. */
extern PyObject *a_untrack, *a_drain, *a_index_add, *a_fire_probes, *a_unindex,
    *a_first_wait, *a_unreachable, *a_withdraw, *a_broken, *a_arm_at, *a_compact,
    *a_add_buffer, *a_check_recv_buffer, *a_append, *a_popleft, *a_done, *a_set_result,
    *a_send_now, *a_received;
extern PyObject *a_Isend, *a_comm, *a_Test, *a_Start, *a_rotate, *a_req, *a_buf, *a_payload,
    *a_link_broken, *a_ctrl, *a_reap, *a_bells, *a_flag, *a_ring, *a_sent, *a_parked,
    *a_woke, *a_stopped, *a_failed, *a_endpoint, *a_closed, *a_arrived,
    *a_consumed, *a_send_ctl, *a_slots, *a_credit, *a_owed, *a_closed_by, *a_on_control,
    *a_rank, *a_inline_max, *a_return_at;
extern PyObject *a_Irecv, *a_announced, *a_unmatched, *a_close_sent, *a_next_data_tag,
    *a_sends, *a_announced_msgs, *a_fetch, *a_fetch_failed, *a_engine_sent, *a_reqs, *a_cbs,
    *a_data, *a_testsome, *a_addr, *a_held;
extern PyObject *a_next_ident, *a_send_failed, *a_link_send;
extern PyObject *a_ring_pos, *a_ring_seen, *a_wake, *a_kick, *a_handle, *a_poll_rest,
    *a_local, *a_blocked, *a_reading;
extern PyObject *a_closing, *a_check_finished, *a_send_waiting, *a_kicked, *a_waiter;
extern PyObject *a_pull_view, *a_pull_off, *a_pull_done, *a_copying, *a_single_copy,
    *a_pids;
extern PyObject *a_cast;

/* -- slots ---------------------------------------------------------------------------- */

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

static inline int
slot_set_ll(PyObject *o, Py_ssize_t off, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) {
        return -1;
    }
    put(o, off, v);
    return 0;
}

static inline int
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

/* -- what each file gives the others ------------------------------------------------- */

/* The files make a DAG: _lane.c (the module: its init, ``send`` and ``recv``) calls down
 * into the others; _lane_mpi.c into _lane_steps.c; the steps (_lane_steps.c,
 * _lane_recv.c) into _lane_objects.c; that into _lane_flight.c; and all of them read
 * what _lane_config.c holds, which calls none of them.  No file calls back up
 * (tests/api/test_native_contract.py checks it). */

/* _lane_config.c: configuration, the constants, the running-loop check. */
int running(PyObject *loop);
void forget_in_child(void);
PyObject *configure(PyObject *self, PyObject *spec);
int make_constants(void);

/* _lane_buffers.c: the Python steps' buffer judge and copy. */
PyObject *buffers_inspect(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *buffers_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *buffers_address(PyObject *self, PyObject *arg);

/* _lane_shm.c: the shared-memory link's atomic words and single copy */
int shm_add(PyObject *m);
char *words_base(PyObject *w, Py_ssize_t *len);
/* One look of a bounded wait for another process (the shared-memory link's). */
int wait_over(unsigned i, long long *until, long long wait_ns, int share);
PyObject *set_dtype_names(PyObject *self, PyObject *arg);

/* _lane_pending.c: the pending recv buffers' index (``PendingBuffers``); for the steps,
 * what its ``conflict``, ``add`` and ``remove`` do, without a call, on an index that is
 * exactly one (``pending_exact``). */
int pending_add(PyObject *m);
int pending_exact(PyObject *index);
int pending_conflict(PyObject *index, PyObject *buf, Py_ssize_t nbytes, PyObject **req);
int pending_insert(PyObject *index, PyObject *buf, Py_ssize_t nbytes, PyObject *req);
void pending_forget(PyObject *index, PyObject *req);

/* _lane_flight.c: the flight recorder's ring and tallies. */
extern PyTypeObject RingType, TallyCType;
void ring_push(PyObject *ring, long long kind, long long peer, long long tag,
               long long nbytes, long long sid, long long how, double t_post,
               double t_match, double t_fin);
void tally_add(PyObject *tally, long long nbytes, double w, double c);

/* _lane_objects.c: the clock, buffers, builders, the matcher's deques, the wire's
 * charge. */
int perf_clock(double *t);
int now_of(PyObject *engine, double *t);
long long bucket_size(Py_ssize_t nbytes);
long long charge(Py_ssize_t nbytes);
char *array_bytes(PyObject *a, int writable, Py_ssize_t *len);
PyObject *new_status(PyObject *source, PyObject *tag, Py_ssize_t nbytes, Py_ssize_t count,
                     PyObject *shape);
int record(PyObject *engine, int kind, PyObject *peer, PyObject *tag, Py_ssize_t nbytes,
           PyObject *sid, double t_post, double t_match, double t_fin, PyObject *flow);
int trace_ok(PyObject *engine);
PyObject *next_flow(PyObject *engine, PyObject *dst, PyObject **k);
PyObject *live_head(PyObject *bucket);
int pop_head(PyObject *index, PyObject *key, PyObject *bucket);
int posted_earliest(PyObject *index, PyObject *exact, PyObject *source, PyObject *tag, int wild,
                    PyObject **recv, PyObject **key, PyObject **bucket, int *named_wild);
int waiting_wild(PyObject *matcher, PyObject *source, PyObject *tag, PyObject **key);
int push(PyObject *index, PyObject *key, PyObject *item);
int queue_numbered(PyObject *matcher, Py_ssize_t index_at, Py_ssize_t count_at, PyObject *key,
                   PyObject *obj, const char *what);
PyObject *new_message(PyTypeObject *type, PyObject *source, PyObject *tag, Py_ssize_t nbytes,
                      Py_ssize_t count, PyObject *dtype, PyObject *where, PyObject *view);
PyObject *new_request(PyObject *engine, PyObject *kind, PyObject *source, PyObject *peer,
                      PyObject *tag, Py_ssize_t nbytes, Py_ssize_t count, PyObject *dtype,
                      PyObject *stream, PyObject *timeout, PyObject *array);
int finish_now(PyObject *req, PyObject *result, double t0, double t);

/* _lane_steps.c and _lane_recv.c: the receiving engine's steps. */
int offer(PyObject *peer, PyObject *source, PyObject *tag, char *data, Py_ssize_t nbytes,
          Py_ssize_t count, PyObject *dtype, PyObject *flow, int stage, double *when);
PyObject *take(PyObject *engine, PyObject *matcher, PyObject *key, PyObject *src,
               PyObject *tag, char *data, Py_ssize_t nbytes, PyObject *dtype, double *started,
               double *when, PyObject **flow);
int post(PyObject *engine, PyObject *matcher, PyObject *key, PyObject *req,
         PyObject *stream, Py_ssize_t nbytes, PyObject *timeout, int wild);
int track_on(PyObject *engine, PyObject *stream, PyObject *req);
int start_now(PyObject *engine, PyObject *req);
int track_unless_done(PyObject *engine, PyObject *stream, PyObject *req);
int arm_timer(PyObject *engine, PyObject *req, PyObject *timeout);
int complete(PyObject *engine, PyObject *recv, PyObject *source, PyObject *tag,
             Py_ssize_t nbytes, Py_ssize_t count, double *when);
int settle(PyObject *engine, PyObject *req, PyObject *stream, int is_recv);
/* How many waiting tasks ``settle`` has woken (a request's waiter future resolved): a poll
 * that sees it move has woken a task, which runs once the poll yields. */
extern unsigned long lane_woken;
int done_at(PyObject *engine, PyObject *req, PyObject *stream, int is_recv, PyObject *exc,
            PyObject *peer, PyObject *tag, Py_ssize_t nbytes, double t_post, double t_match,
            double *when);
char *recv_fits(PyObject *recv, PyObject *dtype, Py_ssize_t nbytes, int new_ok);
/* (a rendezvous send in this process: announced at its receiver; completed when taken) */
int announce(PyObject *peer, PyObject *req);
int sent_here(PyObject *engine, PyObject *msg);

/* _lane_mpi.c: the MPI link's per-message steps; an eager message that landed, handed to
 * its engine (for the MPI and the shared-memory link alike). */
extern PyTypeObject PathType;
PyObject *lane_mpi_calls(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
typedef struct {
    PyObject *link, *wire, *names, *owed, *closed_by, *inline_where;
    long return_at;
    int stage;  /* (no recv posted for it: staged here, where the pool has room; else the
                 * engine's ``arrived`` stages it) */
} Landing;
int land_eager(const Landing *l, const char *b, Py_ssize_t len, PyObject *(*payload)(void *),
               void *arg);
int list_add(PyObject *list, Py_ssize_t i, long long delta);
/* The wire header's little-endian fields: ``n`` bytes at ``at``. */
void put_le(char *at, unsigned long long v, int n);
long long get_le(const char *at, int n);
int long_attr(PyObject *o, PyObject *name, long *out);
int pass_failure(PyObject *to);
int judge_send(PyObject *link, PyObject *closed_by, PyObject *fields, long inline_max, long self,
               Py_ssize_t size, PyObject *const *args, long *d, long *t, Py_ssize_t *nbytes,
               Py_ssize_t *count, PyObject **field);
void frame_eager(char *h, long rank, long tag, const void *data, Py_ssize_t nbytes,
                 Py_ssize_t count, PyObject *field);
/* (a rendezvous send's steps: the engine's own untraced class; ``activate``; ``sent``) */
int plain_engine(PyObject *endpoint);
int activate_send(PyObject *engine, PyObject *sent, PyObject *active);
int send_complete(PyObject *engine, PyObject *req, PyObject *active);
/* (the exact recv posted for a rendezvous message: found, then taken) */
typedef struct {
    PyObject *matcher, *index, *key, *bucket, *recv;  /* (key and recv held) */
    char *dst;
    int wild;  /* the recv names a wildcard */
} Posted;
int posted_find(PyObject *engine, PyObject *source, PyObject *tag, PyObject *dtype,
                Py_ssize_t nbytes, Posted *at);
int posted_take(PyObject *engine, Posted *at, PyObject *active);
void posted_clear(Posted *at);

/* _lane_shmpath.c: the shared-memory link's per-message steps. */
extern PyTypeObject ShmPathType;
int waiting(PyObject *channels, PyObject *name);
/* (for the node: a ShmPath's poll, look, doorbell; its link and channels, borrowed) */
int shmpath_poll(PyObject *path);
int shmpath_ready(PyObject *path);
int shmpath_arm(PyObject *path);
void shmpath_disarm(PyObject *path);
PyObject *shmpath_link(PyObject *path);
PyObject *shmpath_channels(PyObject *path);

/* _lane_node.c: the shared-memory node's turn. */
extern PyTypeObject ShmNodeType;

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
