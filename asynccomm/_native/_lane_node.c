/* The shared-memory node's turn in C: ``ShmNode``, over the ``ShmPath`` of every link a
 * process has open (``transports.shm.Node``, which makes it where the C lane is built and
 * uses it while every link it polls has its steps in C).
 *
 * ``poll`` is ``Node._poll`` (each link's ``ShmPath.poll``, a link that fails failed alone,
 * a closing one checked), ``peek`` is ``Node._peek`` (loads only), ``spin`` is the burst of
 * ``Node._run`` (peek up to ``burst`` times, the core given away after each empty look when
 * ``share``), ``arm`` and ``disarm`` are ``Node._arm`` and ``Node._disarm``: the same steps
 * in the same order, so the armed-doorbell protocol of ``_shm_ring`` holds as it is.  The
 * list of paths is the node's own (read at each call: links come and go).  ``kick`` is
 * ``Node.kick``, which the node takes for its own (every send calls it). */
#include "_lane.h"

#include <sched.h>

typedef struct {
    PyObject_HEAD
    PyObject *paths, *node;
} ShmNode;

/* The paths now, as ``list(self._links)`` (a new reference). */
static PyObject *
snapshot(ShmNode *n)
{
    return PyList_GetSlice(n->paths, 0, PyList_GET_SIZE(n->paths));
}

/* One link's part of ``Node._poll``: 1 something happened, 0 nothing, -1 error (a link
 * whose poll failed with an ``Exception`` fails alone: ``ShmTransport._failed``). */
static int
poll_link(PyObject *path)
{
    PyObject *channels = shmpath_channels(path), *link = shmpath_link(path);
    int rc = waiting(channels, a_stopped);
    if (rc != 0) {
        return rc < 0 ? -1 : 0;
    }
    rc = shmpath_poll(path);
    if (rc > 0) {
        int closing = waiting(channels, a_closing);
        PyObject *r = closing <= 0 ? NULL : PyObject_CallMethodNoArgs(link, a_check_finished);
        Py_XDECREF(r);
        rc = closing < 0 || (closing && r == NULL) ? -1 : 1;
    }
    if (rc < 0) {
        return pass_failure(link) < 0 ? -1 : 1;
    }
    return rc;
}

/* poll() -> bool: ``Node._poll``. */
static PyObject *
node_poll(ShmNode *n, PyObject *unused)
{
    PyObject *paths = snapshot(n);
    if (paths == NULL) {
        return NULL;
    }
    int hit = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        int rc = poll_link(PyList_GET_ITEM(paths, i));
        if (rc < 0) {
            Py_DECREF(paths);
            return NULL;
        }
        hit |= rc;
    }
    Py_DECREF(paths);
    return PyBool_FromLong(hit);
}

/* ``Node._peek``: 1 if a record waits on any ring of the node, 0 if not, -1 error. */
static int
any_ready(ShmNode *n)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(n->paths); i++) {
        PyObject *path = Py_NewRef(PyList_GET_ITEM(n->paths, i));
        int rc = shmpath_ready(path);
        Py_DECREF(path);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* peek() -> bool: ``Node._peek``. */
static PyObject *
node_peek(ShmNode *n, PyObject *unused)
{
    int rc = any_ready(n);
    return rc < 0 ? NULL : PyBool_FromLong(rc);
}

/* spin(burst, share) -> bool: up to ``burst`` peeks, ``sched_yield`` after each that found
 * nothing when ``share``; whether one found something. */
static PyObject *
node_spin(ShmNode *n, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "spin(burst, share)");
        return NULL;
    }
    Py_ssize_t burst = PyLong_AsSsize_t(args[0]);
    int share = PyObject_IsTrue(args[1]);
    if ((burst == -1 && PyErr_Occurred()) || share < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < burst; i++) {
        int rc = any_ready(n);
        if (rc != 0) {
            return rc < 0 ? NULL : Py_NewRef(Py_True);
        }
        if (share) {
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
        }
    }
    Py_RETURN_FALSE;
}

/* ``Node._disarm`` over ``paths``: every link's doorbell that is not stopped cleared. */
static int
disarm(PyObject *paths)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        PyObject *path = PyList_GET_ITEM(paths, i);
        int stopped = waiting(shmpath_channels(path), a_stopped);
        if (stopped < 0) {
            return -1;
        }
        if (!stopped) {
            shmpath_disarm(path);
        }
    }
    return 0;
}

/* disarm(): ``Node._disarm``. */
static PyObject *
node_disarm(ShmNode *n, PyObject *unused)
{
    PyObject *paths = snapshot(n);
    int rc = paths == NULL ? -1 : disarm(paths);
    Py_XDECREF(paths);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* arm() -> bool: ``Node._arm``: every link armed and looked at again; if any found
 * something, all disarmed (stay awake). */
static PyObject *
node_arm(ShmNode *n, PyObject *unused)
{
    PyObject *paths = snapshot(n);
    if (paths == NULL) {
        return NULL;
    }
    int found = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        int rc = shmpath_arm(PyList_GET_ITEM(paths, i));
        if (rc < 0) {
            Py_DECREF(paths);
            return NULL;
        }
        found |= rc;
    }
    Py_DECREF(paths);
    if (found) {  /* (the links now: an arm may have sent what waited, and run its callbacks) */
        PyObject *now = snapshot(n);
        int rc = now == NULL ? -1 : disarm(now);
        Py_XDECREF(now);
        if (rc < 0) {
            return NULL;
        }
    }
    return PyBool_FromLong(found);
}

/* kick(): ``Node.kick``: something was sent, poll now (the poll task woken if it waits). */
static PyObject *
node_kick(ShmNode *n, PyObject *unused)
{
    if (PyObject_SetAttr(n->node, a_kicked, Py_True) < 0) {
        return NULL;
    }
    PyObject *waiter = PyObject_GetAttr(n->node, a_waiter);
    if (waiter == NULL) {
        return NULL;
    }
    int rc = 0;
    if (waiter != Py_None) {
        PyObject *done = PyObject_CallMethodNoArgs(waiter, a_done);
        rc = done == NULL ? -1 : PyObject_IsTrue(done);
        Py_XDECREF(done);
        if (rc == 0) {
            PyObject *r = PyObject_CallMethodOneArg(waiter, a_set_result, Py_None);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
    }
    Py_DECREF(waiter);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- the type ---------------------------------------------------------------------------- */

static PyObject *
shmnode_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *paths, *node;
    static char *kw[] = {"paths", "node", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O:ShmNode", kw, &PyList_Type, &paths,
                                     &node)) {
        return NULL;
    }
    if (!ready) {  /* the names it looks up come with the lane's configuration */
        PyErr_SetString(PyExc_TypeError, "ShmNode: the lane is not configured");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        if (!PyObject_TypeCheck(PyList_GET_ITEM(paths, i), &ShmPathType)) {
            PyErr_SetString(PyExc_TypeError, "ShmNode: paths is a list of ShmPath");
            return NULL;
        }
    }
    ShmNode *n = (ShmNode *)type->tp_alloc(type, 0);
    if (n != NULL) {
        n->paths = Py_NewRef(paths);
        n->node = Py_NewRef(node);
    }
    return (PyObject *)n;
}

static int
shmnode_traverse(ShmNode *n, visitproc visit, void *arg)
{
    Py_VISIT(n->paths);
    Py_VISIT(n->node);
    return 0;
}

static int
shmnode_clear(ShmNode *n)
{
    Py_CLEAR(n->paths);
    Py_CLEAR(n->node);
    return 0;
}

static void
shmnode_dealloc(ShmNode *n)
{
    PyObject_GC_UnTrack(n);
    shmnode_clear(n);
    Py_TYPE(n)->tp_free((PyObject *)n);
}

static PyMethodDef shmnode_methods[] = {
    {"poll", (PyCFunction)node_poll, METH_NOARGS,
     "poll() -> bool: every link's rings taken (Node._poll)"},
    {"peek", (PyCFunction)node_peek, METH_NOARGS,
     "peek() -> bool: whether a record waits on any ring (Node._peek)"},
    {"spin", (PyCFunction)(void (*)(void))node_spin, METH_FASTCALL,
     "spin(burst, share) -> bool: up to burst peeks, sched_yield between them if share"},
    {"arm", (PyCFunction)node_arm, METH_NOARGS,
     "arm() -> bool: the doorbells armed, the rings looked at again (Node._arm)"},
    {"disarm", (PyCFunction)node_disarm, METH_NOARGS,
     "disarm(): the doorbells of the links not stopped cleared (Node._disarm)"},
    {"kick", (PyCFunction)node_kick, METH_NOARGS,
     "kick(): something was sent: poll now (Node.kick)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ShmNodeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asynccomm._native._lane.ShmNode",
    .tp_basicsize = sizeof(ShmNode),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ShmNode(paths, node): the shared-memory node's poll, peek, spin, doorbells "
              "and kick in C, over the ShmPath of each of its links (the list is the node's "
              "own).",
    .tp_new = shmnode_new,
    .tp_traverse = (traverseproc)shmnode_traverse,
    .tp_clear = (inquiry)shmnode_clear,
    .tp_dealloc = (destructor)shmnode_dealloc,
    .tp_methods = shmnode_methods,
};
