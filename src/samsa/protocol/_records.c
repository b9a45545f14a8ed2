/* The records of a v2 batch read once, record after record, as Kafka's DefaultRecord reads
 * them: the C half of protocol/record_check.py's RecordChecker, which falls back to its numpy
 * path where this module could not be built.
 *
 * A record's start depends on the length varint of the one before it, so finding the records
 * of changing sizes is a serial walk: cheap here (a few ns a field), costly as Python bytecode.
 * walk() reads every field the checker checks and answers with what the checker needs to
 * apply a topic's rules (the span of timestamp deltas, how many keys are null), and only when
 * asked the per-record values (into arrays the caller owns): the rules usually pass on the
 * span alone. Nothing is allocated per record; every read is bounded by the record's end.
 *
 * Varints are read as Java's ByteUtils does: at most 5 bytes for an int, 10 for a long, the
 * bits past 32 (64) dropped before the zigzag is undone, so a length wraps as Kafka's does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Below this many bytes the GIL stays held: giving it up costs little, but taking it back
 * waits for any thread that took it meanwhile (up to the switch interval), which a small
 * batch checked on the event loop must not. */
#define RELEASE_GIL_BYTES (64 * 1024)
#define MIN_BODY 6 /* attributes, two deltas, key and value lengths, header count */

enum fault {
    OK,
    VARINT_TOO_LONG,
    RECORD_SIZE,          /* length below MIN_BODY */
    OFFSET_DELTA,         /* not the record's index in the batch */
    KEY_OVERRUN,
    VALUE_OVERRUN,
    HEADER_COUNT_NEGATIVE,
    HEADER_COUNT_TOO_BIG, /* more than two bytes a header would need */
    HEADER_KEY_NEGATIVE,
    HEADER_KEY_OVERRUN,
    HEADER_VALUE_OVERRUN,
    PAYLOAD,              /* the fields end before the record, or run past it */
};

typedef struct {
    enum fault fault;
    int64_t record;   /* batch index of the faulty record */
    int64_t value;    /* the length or count that is wrong */
    int64_t expected; /* PAYLOAD: the record's length */
    int64_t read;     /* PAYLOAD: bytes its fields took (-1: more than it holds) */
} fault_t;

/* The bits of a varint of at most max bytes at *p, before end: 1 with *raw set and *p
 * advanced, 0 if cut by end, -1 if longer than max bytes. */
static inline int
read_raw(const uint8_t **p, const uint8_t *end, int max, uint64_t *raw)
{
    const uint8_t *q = *p;
    uint64_t v = 0;
    for (int i = 0; i < max; i++) {
        if (q >= end)
            return 0;
        uint8_t b = *q++;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *raw = v;
            *p = q;
            return 1;
        }
    }
    return -1;
}

static inline int
read_varint(const uint8_t **p, const uint8_t *end, int32_t *out)
{
    uint64_t raw = 0;
    int got = read_raw(p, end, 5, &raw);
    uint32_t v = (uint32_t)raw; /* a fifth byte's bits past 32 fall off, as in Java's int */
    *out = (int32_t)((v >> 1) ^ (0u - (v & 1)));
    return got;
}

static inline int
read_varlong(const uint8_t **p, const uint8_t *end, int64_t *out)
{
    uint64_t v = 0;
    int got = read_raw(p, end, 10, &v);
    *out = (int64_t)((v >> 1) ^ (0u - (v & 1)));
    return got;
}

typedef struct {
    int64_t count;
    Py_ssize_t used;
    int64_t ts_min, ts_max;
    int64_t null_keys;
} walked_t;

#define FAIL(kind, v)                                                                         \
    do {                                                                                      \
        f->fault = (kind);                                                                    \
        f->value = (v);                                                                       \
        return -1;                                                                            \
    } while (0)

/* A field's varint within the record: a varint cut by the record's end is a payload fault. */
#define FIELD(reader, var)                                                                    \
    do {                                                                                      \
        int got_ = reader(&p, rec_end, &(var));                                               \
        if (got_ < 0)                                                                         \
            FAIL(VARINT_TOO_LONG, 0);                                                         \
        if (got_ == 0) {                                                                      \
            f->read = -1;                                                                     \
            FAIL(PAYLOAD, 0);                                                                 \
        }                                                                                     \
    } while (0)

/* Skip a length's bytes (a negative length is a null: nothing to skip). */
#define SKIP(n, what)                                                                         \
    do {                                                                                      \
        if ((n) > 0) {                                                                        \
            if ((n) > rec_end - p)                                                            \
                FAIL(what, n);                                                                \
            p += (n);                                                                         \
        }                                                                                     \
    } while (0)

static int
walk_records(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, int64_t first, int64_t room,
             int64_t *ts_out, uint8_t *null_out, walked_t *w, fault_t *f)
{
    const uint8_t *p = buf + pos, *stop = buf + end;
    int64_t i = 0;
    w->ts_min = INT64_MAX;
    w->ts_max = INT64_MIN;
    w->null_keys = 0;
    while (i < room && p < stop) {
        const uint8_t *start = p;
        int32_t length;
        f->record = first + i;
        int got = read_varint(&p, stop, &length);
        if (got < 0)
            FAIL(VARINT_TOO_LONG, 0);
        if (got == 0) { /* the chunk ends inside the length: the caller keeps the tail */
            p = start;
            break;
        }
        if (length < MIN_BODY)
            FAIL(RECORD_SIZE, length);
        if (length > stop - p) { /* the rest of the record is in a later chunk */
            p = start;
            break;
        }
        const uint8_t *body = p, *rec_end = p + length;
        int64_t ts_delta;
        int32_t offset_delta, key_len, value_len, headers;
        p++; /* attributes: Kafka does not look at a record's */
        FIELD(read_varlong, ts_delta);
        FIELD(read_varint, offset_delta);
        if (offset_delta != first + i)
            FAIL(OFFSET_DELTA, offset_delta);
        FIELD(read_varint, key_len);
        SKIP(key_len, KEY_OVERRUN);
        FIELD(read_varint, value_len);
        SKIP(value_len, VALUE_OVERRUN);
        FIELD(read_varint, headers);
        if (headers < 0)
            FAIL(HEADER_COUNT_NEGATIVE, headers);
        if (2 * (int64_t)headers > rec_end - p) /* a header takes two bytes at least */
            FAIL(HEADER_COUNT_TOO_BIG, headers);
        for (int32_t h = 0; h < headers; h++) {
            int32_t n;
            FIELD(read_varint, n);
            if (n < 0)
                FAIL(HEADER_KEY_NEGATIVE, n);
            SKIP(n, HEADER_KEY_OVERRUN);
            FIELD(read_varint, n);
            SKIP(n, HEADER_VALUE_OVERRUN);
        }
        if (p != rec_end) {
            f->fault = PAYLOAD;
            f->expected = length;
            f->read = p - body;
            return -1;
        }
        if (ts_delta < w->ts_min)
            w->ts_min = ts_delta;
        if (ts_delta > w->ts_max)
            w->ts_max = ts_delta;
        w->null_keys += key_len < 0;
        if (ts_out != NULL) {
            ts_out[i] = ts_delta;
            null_out[i] = key_len < 0;
        }
        i++;
    }
    w->count = i;
    w->used = p - buf;
    return 0;
}

static PyObject *RecordError;

static void
raise_fault(const fault_t *f)
{
    const char *structure = "Found invalid record structure: ";
    switch (f->fault) {
    case VARINT_TOO_LONG:
        PyErr_Format(RecordError, "%svarint too long", structure);
        break;
    case RECORD_SIZE:
        PyErr_Format(RecordError, "Invalid record size: %lld", (long long)f->value);
        break;
    case OFFSET_DELTA:
        PyErr_Format(RecordError,
                     "record %lld has offset delta %lld: a batch's offset deltas must be 0, 1, ...",
                     (long long)f->record, (long long)f->value);
        break;
    case KEY_OVERRUN:
    case VALUE_OVERRUN:
    case HEADER_KEY_OVERRUN:
    case HEADER_VALUE_OVERRUN:
        PyErr_Format(RecordError, "%s%s length beyond its record", structure,
                     f->fault == KEY_OVERRUN            ? "key"
                     : f->fault == VALUE_OVERRUN        ? "value"
                     : f->fault == HEADER_KEY_OVERRUN   ? "header key"
                                                        : "header value");
        break;
    case HEADER_COUNT_NEGATIVE:
        PyErr_Format(RecordError, "Found invalid number of record headers %lld",
                     (long long)f->value);
        break;
    case HEADER_COUNT_TOO_BIG:
        PyErr_SetString(RecordError,
                        "Found invalid number of record headers: more than the record holds");
        break;
    case HEADER_KEY_NEGATIVE:
        PyErr_Format(RecordError, "Invalid negative header key size %lld", (long long)f->value);
        break;
    case PAYLOAD:
        if (f->read < 0)
            PyErr_Format(RecordError, "%sa field of record %lld runs past its end", structure,
                         (long long)f->record);
        else
            PyErr_Format(RecordError,
                         "Invalid record size: expected to read %lld bytes in record payload, "
                         "but instead read %lld",
                         (long long)f->expected, (long long)f->read);
        break;
    default:
        PyErr_SetString(PyExc_SystemError, "record walker: unknown fault");
    }
}

PyDoc_STRVAR(walk_doc,
"walk(buf, pos, end, first, room, ts_out=None, null_out=None)\n"
"--\n\n"
"Read the complete records of buf[pos:end], at most room of them, the first at batch index\n"
"first. Returns (count, used, ts_min, ts_max, null_keys): used is where the first record not\n"
"read starts (cut by end, or past room). ts_out (int64) and null_out (uint8) writable buffers\n"
"of room items, if given, get each record's timestamp delta and whether its key is null.\n"
"RecordError for the first malformed record.");

static PyObject *
walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "walk() takes 5 or 7 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    long long first = PyLong_AsLongLong(args[3]);
    long long room = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view, ts_view = {0}, null_view = {0};
    int want = nargs == 7 && args[5] != Py_None;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    if (pos < 0 || end < pos || end > view.len || first < 0 || room < 0) {
        PyErr_SetString(PyExc_ValueError, "walk(): pos, end, first or room out of range");
        goto done;
    }
    if (want) {
        if (PyObject_GetBuffer(args[5], &ts_view, PyBUF_WRITABLE) < 0)
            goto done;
        if (PyObject_GetBuffer(args[6], &null_view, PyBUF_WRITABLE) < 0)
            goto done;
        if (ts_view.len < room * (Py_ssize_t)sizeof(int64_t) || null_view.len < room) {
            PyErr_SetString(PyExc_ValueError, "walk(): ts_out or null_out smaller than room");
            goto done;
        }
    }
    walked_t w;
    fault_t f = {OK, 0, 0, 0, 0};
    int rc;
    int64_t *ts_out = want ? (int64_t *)ts_view.buf : NULL;
    uint8_t *null_out = want ? (uint8_t *)null_view.buf : NULL;
    if (end - pos >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        rc = walk_records(view.buf, pos, end, first, room, ts_out, null_out, &w, &f);
        Py_END_ALLOW_THREADS
    } else {
        rc = walk_records(view.buf, pos, end, first, room, ts_out, null_out, &w, &f);
    }
    if (rc < 0)
        raise_fault(&f);
    else
        result = Py_BuildValue("(LnLLL)", (long long)w.count, w.used, (long long)w.ts_min,
                               (long long)w.ts_max, (long long)w.null_keys);
done:
    if (null_view.obj != NULL)
        PyBuffer_Release(&null_view);
    if (ts_view.obj != NULL)
        PyBuffer_Release(&ts_view);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "samsa.protocol._records",
    .m_doc = "Kafka v2 records walked in C (protocol/record_check.py's fast path).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    RecordError = PyErr_NewException("samsa.protocol._records.RecordError", PyExc_ValueError,
                                     NULL);
    if (RecordError == NULL || PyModule_AddObjectRef(m, "RecordError", RecordError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
