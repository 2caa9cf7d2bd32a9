/* The C lane's configuration (see _lane.c): what ``configure`` fills in (classes,
 * constants, slot offsets), the names it interns, and the running-loop check. */
#include "_lane.h"

#include <pthread.h>

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
    *a_check_recv_buffer, *a_append, *a_popleft, *a_done, *a_set_result, *a_cancel,
    *a_send_now, *a_received;
PyObject *deque_append, *deque_popleft;  /* deque's own methods */
static PyObject *holder_key;

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
    Py_XSETREF(*out, (PyTypeObject *)t);
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
    Py_XSETREF(*out, o);
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
    ready = 0;  /* until all of it is in place: a refused spec leaves the lane off */
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
        {&EngineType, "link", &EN.link},
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
    INTERN(a_send_now, "send_now");
    INTERN(a_received, "received");
    INTERN(holder_key, "__asyncio_running_event_loop__");
    zero = PyLong_FromLong(0);
    minus_one = PyLong_FromLong(-1);
    minus_one_f = PyFloat_FromDouble(-1.0);
    return zero == NULL || minus_one == NULL || minus_one_f == NULL ? -1 : 0;
}
