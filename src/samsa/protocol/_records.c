/* The records of a v2 batch read once, record after record, as Kafka's DefaultRecord reads
 * them: for the broker, the C half of protocol/record_check.py's RecordChecker (which falls
 * back to its numpy path where this module could not be built); for the consumer, the
 * ConsumerRecords of fetched batches (batch_records(), below).
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

/* --- ConsumerRecords, straight from the fetched batches ------------------------------------
 *
 * The consumer's poll() hands out one ConsumerRecord (a named tuple) per record. Made in
 * Python from numpy columns (zip, tolist, tuple.__new__ per row), that was ~40% of the client's
 * loop thread, and as much again went to the young collections that walked the new tuples.
 * batch_records() reads the records of the batches the caller kept (CRC checked, control and
 * aborted batches left out, decompressed) one after another, as Kafka's DefaultRecord.readFrom
 * does, and makes the ConsumerRecords of those at or after the position in the same pass: no
 * bytecode and no column per record. It checks what protocol/columnar.py's decoder (the
 * fallback) checks: records filling their batch exactly, fields and headers inside their
 * record, a record ending with its headers, header keys UTF-8; every varint is read as that
 * decoder reads it (up to 10 bytes, 64 bits), so the two hand out the same records and find
 * the same batches corrupt (a record before the position is only walked past, by both).
 *
 * The tuples hold only ints, str, bytes, None and tuples of those: they cannot be part of a
 * cycle, so they are untracked by the collector at birth (CPython untracks such plain tuples
 * itself, lazily, but never those of a subclass). */

#define RECORD_FIELDS 10

/* Item k of a record just allocated, or to fail (the items not yet set stay NULL). */
#define SET(rec, k, make)                                                                     \
    do {                                                                                      \
        PyObject *made_ = (make);                                                             \
        if (made_ == NULL)                                                                    \
            goto fail;                                                                        \
        PyTuple_SET_ITEM((rec), (k), made_);                                                  \
    } while (0)

/* A run of equal timestamps (a producer stamps many records in a millisecond) shares one int. */
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
corrupt(const source_t *src, const char *what, long long at)
{
    PyErr_Format(RecordError, "%U-%S: %s (the record at offset %lld)", src->topic,
                 src->partition, what, at);
    return NULL;
}

#define MSG_HEADER_OVERRUN "header overruns its record"
#define MSG_FIELD_OVERRUN "record field overruns its record"

/* A varint field at *p inside its record, read as columnar's numpy reader does (up to 10
 * bytes, 64 bits): longer, or cut by the record's end (overrun says which field), is corrupt. */
static int
record_varint(const source_t *src, const uint8_t **p, const uint8_t *end, int64_t *v,
              long long at, const char *overrun)
{
    int got = read_varlong(p, end, v);
    if (got > 0)
        return 0;
    corrupt(src, got < 0 ? "record varint longer than 10 bytes" : overrun, at);
    return -1;
}

/* The count headers of a record, ((key, value), ...), read from p; they end the record. */
static PyObject *
headers_of(const source_t *src, int64_t count, const uint8_t *p, const uint8_t *end,
           long long at)
{
    if (count < 0 || count > (end - p) / 2) /* a header takes two bytes at least */
        return corrupt(src, "bad header count", at);
    if (count == 0) {
        if (p != end)
            return corrupt(src, "record length does not match its fields", at);
        return PyTuple_New(0); /* the empty tuple, shared */
    }
    PyObject *out = PyTuple_New((Py_ssize_t)count);
    if (out == NULL)
        return NULL;
    for (int64_t h = 0; h < count; h++) {
        int64_t n;
        if (record_varint(src, &p, end, &n, at, MSG_HEADER_OVERRUN) < 0)
            goto fail;
        if (n < 0) {
            corrupt(src, "null header key", at);
            goto fail;
        }
        if (n > end - p) {
            corrupt(src, "header overruns its record", at);
            goto fail;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)n, NULL);
        if (key == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto fail;
            PyErr_Clear();
            corrupt(src, "header key is not UTF-8", at);
            goto fail;
        }
        p += n;
        PyObject *value = NULL;
        if (record_varint(src, &p, end, &n, at, MSG_HEADER_OVERRUN) < 0) {
            Py_DECREF(key);
            goto fail;
        }
        if (n < -1 || n > end - p) {
            corrupt(src, n < -1 ? "negative header length" : "header overruns its record", at);
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
        corrupt(src, "record length does not match its fields", at);
        goto fail;
    }
    PyObject_GC_UnTrack(out);
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

#define MIN_RECORD 7 /* length, attributes, two deltas, key and value lengths, header count */

/* A bytes field (a length, then as many bytes; -1 is null) at *p, inside its record. */
static PyObject *
record_bytes(const source_t *src, const uint8_t **p, const uint8_t *end, long long at)
{
    int64_t n;
    if (record_varint(src, p, end, &n, at, MSG_FIELD_OVERRUN) < 0)
        return NULL;
    if (n < -1)
        return corrupt(src, "negative record field length", at);
    if (n < 0)
        return Py_NewRef(Py_None);
    if (n > end - *p)
        return corrupt(src, "record field overruns its record", at);
    PyObject *out = PyBytes_FromStringAndSize((const char *)*p, (Py_ssize_t)n);
    *p += n;
    return out;
}

typedef struct {
    int64_t base_offset, timestamp, count;
    int log_append;
    PyObject *producer_id, *leader_epoch; /* shared by its records */
} batch_t;

/* The records of one batch's section at or after position, appended to out. */
static int
walk_batch(PyTypeObject *cls, const source_t *src, const batch_t *b, int64_t position,
           shared_t *stamp, PyObject *out)
{
    const uint8_t *p = src->buf, *stop = src->buf + src->len;
    long long at = (long long)b->base_offset;
    if (b->count <= 0 || b->count > src->len / MIN_RECORD) {
        corrupt(src, "record count does not fit the batch", at);
        return -1;
    }
    for (int64_t i = 0; i < b->count; i++) {
        int64_t length, ts_delta, off_delta, headers;
        int got = read_varlong(&p, stop, &length);
        if (got <= 0 || length < MIN_RECORD - 1 || length > stop - p) {
            corrupt(src, got < 0 ? "record varint longer than 10 bytes"
                         : got == 0 || length > stop - p ? "record lengths run past the batch"
                                                         : "record length too small",
                    at);
            return -1;
        }
        const uint8_t *end = p + length;
        p++; /* attributes: Kafka does not look at a record's */
        if (record_varint(src, &p, end, &ts_delta, at, MSG_FIELD_OVERRUN) < 0 ||
            record_varint(src, &p, end, &off_delta, at, MSG_FIELD_OVERRUN) < 0)
            return -1;
        /* as int64 arithmetic in numpy: wrapping, not undefined */
        int64_t offset = (int64_t)((uint64_t)b->base_offset + (uint64_t)off_delta);
        at = (long long)offset;
        if (offset < position) { /* before the position (a fetch may start inside a batch) */
            p = end;
            continue;
        }
        PyObject *rec = cls->tp_alloc(cls, RECORD_FIELDS);
        if (rec == NULL)
            return -1;
        if (PyList_Append(out, rec) < 0) {
            Py_DECREF(rec);
            return -1;
        }
        Py_DECREF(rec); /* the list's now: a failure below frees it with the list */
        int64_t ts = b->log_append ? b->timestamp
                                   : (int64_t)((uint64_t)b->timestamp + (uint64_t)ts_delta);
        SET(rec, 0, Py_NewRef(src->topic));
        SET(rec, 1, Py_NewRef(src->partition));
        SET(rec, 2, PyLong_FromLongLong(offset));
        SET(rec, 3, shared_int(stamp, ts));
        SET(rec, 4, record_bytes(src, &p, end, at));
        SET(rec, 5, record_bytes(src, &p, end, at));
        if (record_varint(src, &p, end, &headers, at, MSG_FIELD_OVERRUN) < 0)
            return -1;
        SET(rec, 6, headers_of(src, headers, p, end, at));
        SET(rec, 7, PyLong_FromLong(b->log_append));
        SET(rec, 8, Py_NewRef(b->producer_id));
        SET(rec, 9, Py_NewRef(b->leader_epoch));
        PyObject_GC_UnTrack(rec);
        p = end; /* headers_of checked that they end the record */
    }
    if (p != stop) {
        corrupt(src, "record lengths do not match their batch", at);
        return -1;
    }
    return 0;
fail:
    return -1;
}

PyDoc_STRVAR(batch_records_doc,
"batch_records(cls, topic, partition, position, batches)\n"
"--\n\n"
"One cls (a tuple type of ConsumerRecord's fields) per record at or after position in\n"
"batches: (records, base_offset, timestamp, log_append, record_count, producer_id,\n"
"leader_epoch) tuples, records being the batch's (decompressed) records section and\n"
"timestamp its base timestamp, or its max timestamp under LogAppendTime. RecordError for\n"
"the first malformed record.");

static PyObject *
batch_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "batch_records() takes 5 arguments");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    if (!PyType_Check(args[0]) || !PyType_IsSubtype(cls, &PyTuple_Type) ||
        cls->tp_basicsize != PyTuple_Type.tp_basicsize || cls->tp_dictoffset != 0 ||
        cls->tp_weaklistoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "batch_records(): cls must be a named tuple type");
        return NULL;
    }
    if (!PyUnicode_Check(args[1]) || !PyLong_Check(args[2]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "batch_records(): topic must be a str, partition an int, batches a list");
        return NULL;
    }
    long long position = PyLong_AsLongLong(args[3]);
    if (position == -1 && PyErr_Occurred())
        return NULL;
    PyObject *batches = args[4];
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    shared_t stamp = {0, NULL};
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(batches); k++) {
        PyObject *section;
        batch_t b;
        long long base, ts, count;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(batches, k), "OLLpLOO;batch_records(): a batch",
                              &section, &base, &ts, &b.log_append, &count, &b.producer_id,
                              &b.leader_epoch))
            goto fail;
        if (!PyLong_Check(b.producer_id) || !PyLong_Check(b.leader_epoch)) {
            PyErr_SetString(PyExc_TypeError, "batch_records(): producer id and epoch: ints");
            goto fail;
        }
        b.base_offset = base;
        b.timestamp = ts;
        b.count = count;
        Py_buffer view;
        if (PyObject_GetBuffer(section, &view, PyBUF_SIMPLE) < 0)
            goto fail;
        source_t src = {view.buf, view.len, args[1], args[2]};
        int rc = walk_batch(cls, &src, &b, position, &stamp, out);
        PyBuffer_Release(&view);
        if (rc < 0)
            goto fail;
    }
    Py_XDECREF(stamp.obj);
    return out;
fail:
    Py_XDECREF(stamp.obj);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, walk_doc},
    {"batch_records", (PyCFunction)(void (*)(void))batch_records, METH_FASTCALL,
     batch_records_doc},
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
