/* The C lane's configuration (see _lane.c): what ``configure`` fills in (classes, slot
 * offsets, objects, numbers and names, all from ``asynccomm._comm.native``), the
 * constants, and the running-loop check.  It calls no other file of the lane. */
#include "_lane.h"

/* -- what configure() fills in ------------------------------------------------------- */

int ready = 0;
PyObject *names;
PyObject *deque_append, *deque_popleft;
PyObject *zero, *minus_one, *minus_one_f;
PyTypeObject *RequestType, *MessageType, *StatusType, *StreamType, *FlightRecorderType,
    *TallyType, *MatcherType, *StagingPoolType, *CommunicatorType, *DeviceEngineType,
    *RankTraceType, *DeadlinesType;
PyObject *get_running_loop, *perf_counter, *deque_type, *heappush;
PyObject *K_SEND, *K_RECV, *S_QUEUED, *S_POSTED, *S_DONE, *W_AT_SENDER, *W_STAGED;
long TAG_UB, MIN_BUCKET, MESSAGE_OVERHEAD, TIMED_COPY_MIN, THREAD_COPY_MIN, EAGER;
long H_SIZE, H_KIND, H_DLEN, H_SRC, H_TAG, H_NBYTES, H_COUNT, H_DTYPE, DTYPE_MAX;
long RTS, CTS, H_IDENT;
struct message_slots M;
struct trace_slots TR;
struct request_slots R;
struct stream_slots S;
struct flight_slots F;
struct tally_slots T;
struct matcher_slots MA;
struct pool_slots PO;
struct comm_slots CO;
struct engine_slots EN;
struct deadline_slots D;
PyObject *a_untrack, *a_drain, *a_index_add, *a_fire_probes, *a_unindex, *a_first_wait,
    *a_unreachable, *a_withdraw, *a_broken, *a_arm_at, *a_compact, *a_add_buffer,
    *a_check_recv_buffer, *a_append, *a_popleft, *a_done, *a_set_result,
    *a_send_now, *a_received;
PyObject *a_Isend, *a_comm, *a_Test, *a_Start, *a_rotate, *a_req, *a_buf, *a_payload,
    *a_link_broken, *a_ctrl, *a_reap, *a_bells, *a_flag, *a_ring, *a_sent, *a_parked,
    *a_woke, *a_stopped, *a_failed, *a_endpoint, *a_closed, *a_arrived,
    *a_consumed, *a_send_ctl, *a_slots, *a_credit, *a_owed, *a_closed_by, *a_on_control,
    *a_rank, *a_inline_max, *a_return_at;
PyObject *a_Irecv, *a_announced, *a_unmatched, *a_close_sent, *a_next_data_tag,
    *a_sends, *a_announced_msgs, *a_fetch, *a_fetch_failed, *a_engine_sent, *a_reqs, *a_cbs,
    *a_data, *a_testsome, *a_addr, *a_held;
PyObject *a_next_ident, *a_send_failed, *a_link_send;
PyObject *a_ring_pos, *a_ring_seen, *a_wake, *a_kick, *a_handle, *a_poll_rest, *a_local,
    *a_blocked, *a_reading;
PyObject *a_closing, *a_check_finished, *a_send_waiting, *a_kicked, *a_waiter;
PyObject *a_pull_view, *a_pull_off, *a_pull_done, *a_copying, *a_single_copy, *a_pids;
PyObject *a_cast;

/* The tables ``configure`` fills, each in the order of its part of the declaration
 * (``asynccomm._comm.native``): CLASSES, SLOTS (a class and the struct of its slots'
 * offsets), OBJECTS, NUMBERS, NAMES. */
static PyTypeObject **const class_vars[] = {
    &RequestType, &MessageType, &StatusType, &StreamType, &FlightRecorderType, &TallyType,
    &MatcherType, &StagingPoolType, &CommunicatorType, &DeviceEngineType, &RankTraceType,
    &DeadlinesType,
};

#define LAYOUT(cls, s) {&cls, (Py_ssize_t *)&s, sizeof(s) / sizeof(Py_ssize_t)}
static const struct layout {
    PyTypeObject **cls;
    Py_ssize_t *offsets;
    size_t n;
} layouts[] = {
    LAYOUT(MessageType, M),
    LAYOUT(RankTraceType, TR),
    LAYOUT(RequestType, R),
    LAYOUT(StreamType, S),
    LAYOUT(FlightRecorderType, F),
    LAYOUT(TallyType, T),
    LAYOUT(MatcherType, MA),
    LAYOUT(StagingPoolType, PO),
    LAYOUT(CommunicatorType, CO),
    LAYOUT(DeviceEngineType, EN),
    LAYOUT(DeadlinesType, D),
};

static PyObject **const object_vars[] = {
    &get_running_loop, &perf_counter, &deque_type, &heappush, &K_SEND, &K_RECV, &S_QUEUED, &S_POSTED,
    &S_DONE, &W_AT_SENDER, &W_STAGED,
};

static long *const number_vars[] = {
    &TAG_UB, &MIN_BUCKET, &MESSAGE_OVERHEAD, &TIMED_COPY_MIN, &THREAD_COPY_MIN, &EAGER,
    &H_SIZE, &H_KIND, &H_DLEN, &H_SRC, &H_TAG, &H_NBYTES, &H_COUNT, &H_DTYPE, &DTYPE_MAX,
    &RTS, &CTS, &H_IDENT,
};

static PyObject **const name_vars[] = {
    &a_untrack, &a_drain, &a_index_add, &a_fire_probes, &a_unindex, &a_first_wait,
    &a_unreachable, &a_withdraw, &a_broken, &a_arm_at, &a_compact, &a_add_buffer,
    &a_check_recv_buffer, &a_append, &a_popleft, &a_done, &a_set_result,
    &a_send_now, &a_received,
    &a_Isend, &a_comm, &a_Test, &a_Start, &a_rotate, &a_req, &a_buf, &a_payload,
    &a_link_broken, &a_ctrl, &a_reap, &a_bells, &a_flag, &a_ring, &a_sent, &a_parked,
    &a_woke, &a_stopped, &a_failed, &a_endpoint, &a_closed, &a_arrived,
    &a_consumed, &a_send_ctl, &a_slots, &a_credit, &a_owed, &a_closed_by, &a_on_control,
    &a_rank, &a_inline_max, &a_return_at,
    &a_Irecv, &a_announced, &a_unmatched, &a_close_sent, &a_next_data_tag, &a_sends,
    &a_announced_msgs, &a_fetch, &a_fetch_failed, &a_engine_sent, &a_reqs, &a_cbs,
    &a_data, &a_testsome, &a_addr, &a_held,
    &a_next_ident, &a_send_failed, &a_link_send,
    &a_ring_pos, &a_ring_seen, &a_wake, &a_kick, &a_handle, &a_poll_rest, &a_local,
    &a_blocked, &a_reading,
    &a_closing, &a_check_finished, &a_send_waiting, &a_kicked, &a_waiter,
    &a_pull_view, &a_pull_off, &a_pull_done, &a_copying, &a_single_copy, &a_pids,
    &a_cast,
};

#define COUNT(table) (sizeof(table) / sizeof((table)[0]))

/* -- the running loop --------------------------------------------------------------- */

/* Whether ``loop`` is this thread's running loop, as ``asyncio._get_running_loop()``
 * says; 1, 0, -1 (error).
 *
 * On CPython 3.11 that call costs a getpid() system call each time (it guards against a
 * forked child), so its answer is kept with the thread's running-loop holder (the object
 * 3.11's ``_asyncio`` keeps in the thread state's dict while a loop runs, a new one each
 * time a loop starts): while the same holder is there, in the same process, the same loop
 * runs.  That holder is 3.11's own internal: on every other version (and where it is not
 * found) every call asks asyncio. */
#ifndef RUNNING_LOOP_CACHE  /* (-DRUNNING_LOOP_CACHE=0 builds the public way here too) */
#define RUNNING_LOOP_CACHE (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)
#endif

static int
asks_asyncio(PyObject *loop)
{
    PyObject *now = PyObject_CallNoArgs(get_running_loop);
    if (now == NULL) {
        return -1;
    }
    int same = now == loop;
    Py_DECREF(now);
    return same;
}

#if RUNNING_LOOP_CACHE
static PyObject *holder_key;   /* "__asyncio_running_event_loop__" */
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
    int same = asks_asyncio(loop);
    if (same == 1 && h != NULL) {
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
#else
int
running(PyObject *loop)
{
    return asks_asyncio(loop);
}

void
forget_in_child(void)
{
}
#endif

/* -- configuration ------------------------------------------------------------------- */

static int
offset_of(PyObject *cls, PyObject *name, Py_ssize_t *off)
{
    PyObject *d = PyObject_GetAttr(cls, name);
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
        PyErr_Format(PyExc_TypeError, "%R.%U is not a slot", cls, name);
        return -1;
    }
    return 0;
}

/* spec[key]: a tuple of ``n`` items (borrowed), or NULL with a TypeError. */
static PyObject *
part(PyObject *spec, const char *key, size_t n)
{
    PyObject *t = PyDict_GetItemString(spec, key);
    if (t == NULL || !PyTuple_CheckExact(t) || (size_t)PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_TypeError, "configure: spec['%s'] must be a tuple of %zu items, "
                     "in the order of the lane's table", key, n);
        return NULL;
    }
    return t;
}

/* configure(spec: dict): what the lane works with, as ``asynccomm._comm.native`` declares
 * it: spec["classes"], spec["slots"] (a tuple of slot names per class), spec["objects"],
 * spec["numbers"] and spec["names"], each a tuple in the order of the tables above.  All
 * of it is checked before any of it is kept: a refused spec leaves the lane off. */
PyObject *
configure(PyObject *self, PyObject *spec)
{
    if (!PyDict_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "configure(spec: dict)");
        return NULL;
    }
    ready = 0;
    PyObject *classes = part(spec, "classes", COUNT(class_vars));
    PyObject *slots = classes == NULL ? NULL : part(spec, "slots", COUNT(layouts));
    PyObject *objects = slots == NULL ? NULL : part(spec, "objects", COUNT(object_vars));
    PyObject *numbers = objects == NULL ? NULL : part(spec, "numbers", COUNT(number_vars));
    PyObject *strings = numbers == NULL ? NULL : part(spec, "names", COUNT(name_vars));
    if (strings == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < COUNT(class_vars); i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(classes, i))) {
            PyErr_Format(PyExc_TypeError, "configure: classes[%zu] is not a class", i);
            return NULL;
        }
    }
    for (size_t i = 0; i < COUNT(name_vars); i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(strings, i))) {
            PyErr_Format(PyExc_TypeError, "configure: names[%zu] is not a str", i);
            return NULL;
        }
    }
    long values[COUNT(number_vars)];
    for (size_t i = 0; i < COUNT(number_vars); i++) {
        values[i] = PyLong_AsLong(PyTuple_GET_ITEM(numbers, i));
        if (values[i] == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    for (size_t i = 0; i < COUNT(class_vars); i++) {
        Py_XSETREF(*class_vars[i], (PyTypeObject *)Py_NewRef(PyTuple_GET_ITEM(classes, i)));
    }
    if (!PyType_IsSubtype(StatusType, &PyTuple_Type)
        || StatusType->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "configure: Status must be a tuple");
        return NULL;
    }
    /* Where each field the lane touches lives in its class. */
    for (size_t i = 0; i < COUNT(layouts); i++) {
        PyObject *fields = PyTuple_GET_ITEM(slots, i);
        if (!PyTuple_CheckExact(fields) || (size_t)PyTuple_GET_SIZE(fields) != layouts[i].n) {
            PyErr_Format(PyExc_TypeError, "configure: slots[%zu] must be a tuple of the %zu "
                         "slots of %R the lane reads", i, layouts[i].n, *layouts[i].cls);
            return NULL;
        }
        for (size_t j = 0; j < layouts[i].n; j++) {
            PyObject *name = PyTuple_GET_ITEM(fields, j);
            if (!PyUnicode_Check(name)
                || offset_of((PyObject *)*layouts[i].cls, name, &layouts[i].offsets[j]) < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError, "configure: a slot's name is a str");
                }
                return NULL;
            }
        }
    }
    for (size_t i = 0; i < COUNT(object_vars); i++) {
        Py_XSETREF(*object_vars[i], Py_NewRef(PyTuple_GET_ITEM(objects, i)));
    }
    for (size_t i = 0; i < COUNT(number_vars); i++) {
        *number_vars[i] = values[i];
    }
    for (size_t i = 0; i < COUNT(name_vars); i++) {
        PyObject *name = Py_NewRef(PyTuple_GET_ITEM(strings, i));
        PyUnicode_InternInPlace(&name);
        Py_XSETREF(*name_vars[i], name);
    }
    Py_XSETREF(deque_append, PyObject_GetAttr(deque_type, a_append));
    Py_XSETREF(deque_popleft, PyObject_GetAttr(deque_type, a_popleft));
    if (deque_append == NULL || deque_popleft == NULL) {
        return NULL;
    }
    ready = 1;
    Py_RETURN_NONE;
}

/* The constants the lane shares, made once. */
int
make_constants(void)
{
#if RUNNING_LOOP_CACHE
    holder_key = PyUnicode_InternFromString("__asyncio_running_event_loop__");
    if (holder_key == NULL) {
        return -1;
    }
#endif
    zero = PyLong_FromLong(0);
    minus_one = PyLong_FromLong(-1);
    minus_one_f = PyFloat_FromDouble(-1.0);
    return zero == NULL || minus_one == NULL || minus_one_f == NULL ? -1 : 0;
}
