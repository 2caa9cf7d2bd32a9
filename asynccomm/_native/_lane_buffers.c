/* The fast lane's buffer steps (see _lane.c): ``inspect``, the judge of a buffer the
 * Python steps ask on every message, and ``copy``, the bytes of a small message.  The
 * pure-Python fast lane (asynccomm/_engine/lane.py) holds versions of both that behave the
 * same, used where the extension is not built. */
#include "_lane.h"

#include <string.h>

/* inspect(buf, writable) -> (name, nbytes, count) | None
 *
 * The fast lane's view of ``buf``: its dtype's name, size in bytes and element count when
 * it is an exact, 1-D, C-contiguous (and, if asked, writeable) ndarray of a dtype already
 * known to travel; None when it must go the general way.
 */
PyObject *
buffers_inspect(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "inspect(buf, writable)");
        return NULL;
    }
    int writable = PyObject_IsTrue(args[1]);
    if (writable < 0) {
        return NULL;
    }
    PyObject *name;
    Py_ssize_t nbytes, count;
    int j = judge_array(names, args[0], writable, &name, &nbytes, &count);
    if (j <= 0) {
        if (j < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    Py_INCREF(name);  /* ours before anything below can run other code */
    PyObject *out = PyTuple_New(3);
    PyObject *n = PyLong_FromSsize_t((Py_ssize_t)nbytes);
    PyObject *c = PyLong_FromSsize_t((Py_ssize_t)count);
    if (out == NULL || n == NULL || c == NULL) {
        Py_DECREF(name);
        Py_XDECREF(n);
        Py_XDECREF(c);
        Py_XDECREF(out);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, name);
    PyTuple_SET_ITEM(out, 1, n);
    PyTuple_SET_ITEM(out, 2, c);
    return out;
}

/* The bytes of ``obj`` for a copy: an exact C-contiguous ndarray directly, anything else
 * through the buffer protocol (released by the caller when ``view->obj`` is set). */
static int
bytes_of(PyObject *obj, int writable, char **data, Py_ssize_t *len, Py_buffer *view)
{
    view->obj = NULL;
    if (Py_TYPE(obj) == &PyArray_Type) {
        PyArrayObject *arr = (PyArrayObject *)obj;
        int need = NPY_ARRAY_C_CONTIGUOUS | (writable ? NPY_ARRAY_WRITEABLE : 0);
        if ((PyArray_FLAGS(arr) & need) == need) {
            *data = PyArray_BYTES(arr);
            *len = (Py_ssize_t)PyArray_NBYTES(arr);
            return 0;
        }
        if (writable && !PyArray_ISWRITEABLE(arr)) {
            PyErr_SetString(PyExc_BufferError, "the destination array is read-only");
            return -1;
        }
    }
    if (PyObject_GetBuffer(obj, view, writable ? (PyBUF_SIMPLE | PyBUF_WRITABLE)
                                               : PyBUF_SIMPLE) < 0) {
        return -1;
    }
    *data = (char *)view->buf;
    *len = view->len;
    return 0;
}

/* copy(dst, src, nbytes): the first ``nbytes`` bytes of ``src`` into ``dst``. */
PyObject *
buffers_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "copy(dst, src, nbytes)");
        return NULL;
    }
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[2]);
    if (nbytes == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer dview, sview;
    char *dst, *src;
    Py_ssize_t dlen, slen;
    if (bytes_of(args[0], 1, &dst, &dlen, &dview) < 0) {
        return NULL;
    }
    if (bytes_of(args[1], 0, &src, &slen, &sview) < 0) {
        if (dview.obj != NULL) {
            PyBuffer_Release(&dview);
        }
        return NULL;
    }
    int ok = 0 <= nbytes && nbytes <= dlen && nbytes <= slen;
    if (ok && nbytes) {
        memmove(dst, src, (size_t)nbytes);
    }
    if (dview.obj != NULL) {
        PyBuffer_Release(&dview);
    }
    if (sview.obj != NULL) {
        PyBuffer_Release(&sview);
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "copy of %zd bytes between buffers of %zd and %zd",
                     nbytes, dlen, slen);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* address(buf): the address of the first byte of a contiguous buffer, as an int (the
 * check that pending recvs never share memory, asynccomm/_buffers.py ``PendingBuffers``). */
PyObject *
buffers_address(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return result;
}

/* set_dtype_names(names): the dtype -> name dict that ``inspect`` and the lane consult. */
PyObject *
set_dtype_names(PyObject *self, PyObject *arg)
{
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_dtype_names(names: dict)");
        return NULL;
    }
    Py_INCREF(arg);
    Py_XSETREF(names, arg);
    Py_RETURN_NONE;
}
