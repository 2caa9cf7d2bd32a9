/* Whether a buffer can take the fast lane: shared by ``inspect`` (_lane_buffers.c) and the
 * entry points ``send`` and ``recv`` (_lane.c).  Include after numpy's arrayobject.h. */
#ifndef ASYNCCOMM_JUDGE_H
#define ASYNCCOMM_JUDGE_H

/* An exact 1-D C-contiguous (writeable if asked) ndarray whose dtype ``names`` knows: its
 * name (borrowed from ``names``), byte size and element count, 1; 0 when it is not one;
 * -1 on an error. */
static inline int
judge_array(PyObject *names, PyObject *buf, int writable, PyObject **name,
            Py_ssize_t *nbytes, Py_ssize_t *count)
{
    if (names == NULL || Py_TYPE(buf) != &PyArray_Type) {
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

#endif
