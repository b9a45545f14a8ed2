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
 *
 * records(), the second half, is the consumer's: it makes poll()'s ConsumerRecords from the
 * columns protocol/columnar.py decoded (client/_fetcher.py falls back to making them in
 * Python where this module could not be built).
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

/* --- ConsumerRecords from decoded columns -------------------------------------------------
 *
 * The consumer's poll() hands out one ConsumerRecord (a named tuple) per record. Made in
 * Python from the columns (zip, tolist, tuple.__new__ per row), that was ~40% of the client's
 * loop thread, and as many again in the young collections that walked the new tuples.
 * records() makes the whole list in one call from what protocol/columnar.py decoded: the
 * record's bytes are copied out of the fetched buffer, the headers read here (with the checks
 * columnar's header decoder makes), and no bytecode runs per record.
 *
 * The tuples hold only ints, str, bytes, None and tuples of those: they cannot be part of a
 * cycle, so they are untracked by the collector at birth (CPython untracks such plain tuples
 * itself, lazily, but never those of a subclass). Every position is checked against the
 * buffer and its record's end: columns that do not fit the buffer are a RecordError. */

enum column {
    C_OFFSET, C_TIMESTAMP, C_LOG_APPEND, C_KEY_START, C_KEY_END, C_KEY_NULL,
    C_VALUE_START, C_VALUE_END, C_VALUE_NULL, C_HEADER_AT, C_HEADER_COUNT, C_END,
    C_PRODUCER_ID, C_LEADER_EPOCH, N_COLUMNS,
};
/* item size of each column: int64, or one byte for the flags (numpy bool) */
static const Py_ssize_t column_size[N_COLUMNS] = {8, 8, 1, 8, 8, 1, 8, 8, 1, 8, 8, 8, 8, 8};
#define FIRST_COLUMN 4 /* records()'s arguments before the columns */
#define RECORD_FIELDS 10

/* Item k of a record just allocated, or to fail (the items not yet set stay NULL). */
#define SET(rec, k, make)                                                                     \
    do {                                                                                      \
        PyObject *made_ = (make);                                                             \
        if (made_ == NULL)                                                                    \
            goto fail;                                                                        \
        PyTuple_SET_ITEM((rec), (k), made_);                                                  \
    } while (0)

/* A run of equal ints (a batch's producer id, epoch, often timestamps) shares one object. */
typedef struct {
    int64_t value;
    PyObject *obj;
} shared_t;

static inline PyObject *
shared_int(shared_t *s, int64_t v)
{
    if (s->obj == NULL || s->value != v) {
        PyObject *o = PyLong_FromLongLong(v);
        if (o == NULL)
            return NULL;
        Py_XSETREF(s->obj, o);
        s->value = v;
    }
    return Py_NewRef(s->obj);
}

typedef struct {
    const uint8_t *buf;
    Py_ssize_t len;
    PyObject *topic, *partition; /* for messages */
} source_t;

static PyObject *
corrupt(const source_t *src, const char *what, long long row)
{
    PyErr_Format(RecordError, "%U-%S: %s (row %lld)", src->topic, src->partition, what, row);
    return NULL;
}

/* buf[start:end] as bytes, or None; the span must lie in the record (which is in buf). */
static PyObject *
bytes_field(const source_t *src, int64_t start, int64_t end, int null, int64_t rec_end,
            long long row)
{
    if (null)
        return Py_NewRef(Py_None);
    if (start < 0 || start > end || end > rec_end)
        return corrupt(src, "record field overruns its record", row);
    return PyBytes_FromStringAndSize((const char *)src->buf + start, (Py_ssize_t)(end - start));
}

/* A header length at *p: read as columnar's numpy reader does (up to 10 bytes, 64 bits). */
static int
header_length(const source_t *src, const uint8_t **p, const uint8_t *end, int64_t *n,
              long long row)
{
    int got = read_varlong(p, end, n);
    if (got < 0) {
        corrupt(src, "record varint longer than 10 bytes", row);
        return -1;
    }
    if (got == 0) {
        corrupt(src, "header overruns its record", row);
        return -1;
    }
    return 0;
}

/* The headers of a record, ((key, value), ...), read from at up to its end. */
static PyObject *
headers_of(const source_t *src, int64_t count, int64_t at, int64_t rec_end, long long row)
{
    if (count < 0 || at < 0 || at > rec_end || count > (rec_end - at) / 2)
        return corrupt(src, "bad header count", row);
    if (count == 0) {
        if (at != rec_end)
            return corrupt(src, "record length does not match its fields", row);
        return PyTuple_New(0); /* the empty tuple, shared */
    }
    const uint8_t *p = src->buf + at, *end = src->buf + rec_end;
    PyObject *out = PyTuple_New((Py_ssize_t)count);
    if (out == NULL)
        return NULL;
    for (int64_t h = 0; h < count; h++) {
        int64_t n;
        if (header_length(src, &p, end, &n, row) < 0)
            goto fail;
        if (n < 0) {
            corrupt(src, "null header key", row);
            goto fail;
        }
        if (n > end - p) {
            corrupt(src, "header overruns its record", row);
            goto fail;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)n, NULL);
        if (key == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto fail;
            PyErr_Clear();
            corrupt(src, "header key is not UTF-8", row);
            goto fail;
        }
        p += n;
        PyObject *value = NULL;
        if (header_length(src, &p, end, &n, row) < 0) {
            Py_DECREF(key);
            goto fail;
        }
        if (n < -1 || n > end - p) {
            corrupt(src, n < -1 ? "negative header length" : "header overruns its record", row);
            Py_DECREF(key);
            goto fail;
        }
        if (n < 0) {
            value = Py_NewRef(Py_None);
        } else {
            value = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
            p += n;
        }
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, key, value);
        Py_DECREF(key);
        Py_XDECREF(value);
        if (pair == NULL)
            goto fail;
        PyObject_GC_UnTrack(pair);
        PyTuple_SET_ITEM(out, (Py_ssize_t)h, pair);
    }
    if (p != end) {
        corrupt(src, "record length does not match its fields", row);
        goto fail;
    }
    PyObject_GC_UnTrack(out);
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(records_doc,
"records(cls, topic, partition, buf, offset, timestamp, log_append, key_start, key_end,\n"
"        key_null, value_start, value_end, value_null, header_at, header_count, end,\n"
"        producer_id, leader_epoch)\n"
"--\n\n"
"One cls (a tuple type of ConsumerRecord's fields) per row of the columns decoded from\n"
"the fetched bytes buf: contiguous int64 columns, but the null flags and log_append (one\n"
"byte a row). A record's bytes fields are buf[start:end] (None where null); its headers are\n"
"read from header_at to end. RecordError if a position is outside buf or its record, or a\n"
"header is malformed; TypeError if the columns' lengths differ.");

static PyObject *
records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != FIRST_COLUMN + N_COLUMNS) {
        PyErr_Format(PyExc_TypeError, "records() takes %d arguments", FIRST_COLUMN + N_COLUMNS);
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    /* a tuple subclass with no storage of its own (a named tuple): nothing but the items to
     * fill, and nothing that could make a cycle once untracked */
    if (!PyType_Check(args[0]) || !PyType_IsSubtype(cls, &PyTuple_Type) ||
        cls->tp_basicsize != PyTuple_Type.tp_basicsize || cls->tp_dictoffset != 0 ||
        cls->tp_weaklistoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "records(): cls must be a named tuple type");
        return NULL;
    }
    if (!PyUnicode_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "records(): topic must be a str, partition an int");
        return NULL;
    }
    source_t src = {NULL, 0, args[1], args[2]};
    Py_buffer data, cols[N_COLUMNS];
    int held = 0; /* columns acquired */
    PyObject *out = NULL;
    shared_t stamp = {0, NULL}, pid = {0, NULL}, epoch = {0, NULL};
    if (PyObject_GetBuffer(args[3], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    src.buf = data.buf;
    src.len = data.len;
    Py_ssize_t n = -1;
    for (; held < N_COLUMNS; held++) {
        if (PyObject_GetBuffer(args[FIRST_COLUMN + held], &cols[held], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        Py_ssize_t rows = cols[held].len / column_size[held];
        if (n < 0)
            n = rows;
        if (cols[held].len != rows * column_size[held] || rows != n) {
            held++;
            PyErr_SetString(PyExc_TypeError, "records(): columns of different lengths");
            goto done;
        }
    }
    const int64_t *offset = cols[C_OFFSET].buf, *timestamp = cols[C_TIMESTAMP].buf,
                  *key_start = cols[C_KEY_START].buf, *key_end = cols[C_KEY_END].buf,
                  *value_start = cols[C_VALUE_START].buf, *value_end = cols[C_VALUE_END].buf,
                  *header_at = cols[C_HEADER_AT].buf, *header_count = cols[C_HEADER_COUNT].buf,
                  *rec_end = cols[C_END].buf, *producer_id = cols[C_PRODUCER_ID].buf,
                  *leader_epoch = cols[C_LEADER_EPOCH].buf;
    const uint8_t *log_append = cols[C_LOG_APPEND].buf, *key_null = cols[C_KEY_NULL].buf,
                  *value_null = cols[C_VALUE_NULL].buf;
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (rec_end[i] < 0 || rec_end[i] > src.len) {
            corrupt(&src, "record ends outside the fetched data", i);
            goto fail;
        }
        PyObject *rec = cls->tp_alloc(cls, RECORD_FIELDS); /* its items NULL till set */
        if (rec == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, rec); /* the list owns it: a failure below frees it */
        int64_t e = rec_end[i];
        SET(rec, 0, Py_NewRef(src.topic));
        SET(rec, 1, Py_NewRef(src.partition));
        SET(rec, 2, PyLong_FromLongLong(offset[i]));
        SET(rec, 3, shared_int(&stamp, timestamp[i]));
        SET(rec, 4, bytes_field(&src, key_start[i], key_end[i], key_null[i], e, i));
        SET(rec, 5, bytes_field(&src, value_start[i], value_end[i], value_null[i], e, i));
        SET(rec, 6, headers_of(&src, header_count[i], header_at[i], e, i));
        SET(rec, 7, PyLong_FromLong(log_append[i] != 0));
        SET(rec, 8, shared_int(&pid, producer_id[i]));
        SET(rec, 9, shared_int(&epoch, leader_epoch[i]));
        PyObject_GC_UnTrack(rec);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(stamp.obj);
    Py_XDECREF(pid.obj);
    Py_XDECREF(epoch.obj);
    while (held > 0)
        PyBuffer_Release(&cols[--held]);
    PyBuffer_Release(&data);
    return out;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, walk_doc},
    {"records", (PyCFunction)(void (*)(void))records, METH_FASTCALL, records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "samsa.protocol._records",
    .m_doc = "Kafka v2 records walked in C (protocol/record_check.py's fast path) and "
             "ConsumerRecords made in C (client/_fetcher.py's).",
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
