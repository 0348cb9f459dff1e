/*
 * oam_native.h — the C ABI of libOamNative (single source of truth). ABI version 2.
 *
 * The Python host (bridge/engines/native.py) reads the declarations between the
 * OAM_CDEF_BEGIN / OAM_CDEF_END markers from THIS file (preprocessor lines stripped)
 * and hands them to cffi's ffi.cdef(). Keep that region plain C: no macros, no
 * attributes, no #includes (uint8_t / uint32_t are known to cffi).
 *
 * Design: host pulls. The host creates an engine, starts one model step, and then
 * repeatedly calls oam_step_pull() until it returns -1. Each successful pull hands over
 * a BATCH: every event queued since the previous pull, in order, in one set of buffers
 * the library owns. The library never calls back into the host.
 *
 * Batch layout (struct oam_batch below). Event i of a batch with n = count events:
 *   kind      kinds[i]                        one of oam_event_kind
 *   payload   data[ends[i-1] .. ends[i])      bytes; ends[-1] is taken as 0
 *   in scalars            [char_ends[i-1] .. char_ends[i])  the same boundaries counted
 *             in Unicode scalar values (code points), so a host that decodes `data`
 *             once (e.g. Python str) can slice it without re-decoding per event.
 *   size == ends[n-1], chars == char_ends[n-1]. `data` is valid UTF-8 as a whole and at
 *   every boundary; it is NOT NUL-terminated.
 *   Payloads: OAM_EVENT_TEXT        the raw UTF-8 text delta (no JSON, no escaping)
 *             OAM_EVENT_TOOL_CALLS  JSON {"type":"toolCalls","calls":[{"id","name","arguments"}]}
 *             OAM_EVENT_DONE        JSON {"type":"done","usage":{"inputTokens":N,
 *                                   "outputTokens":N,"cachedTokens":N},
 *                                   "finishReason":"stop"|"tool_calls"|"length"}
 *             OAM_EVENT_ERROR       JSON {"type":"error","code":"<stable code>","message":"..."}
 *   text_count counts the OAM_EVENT_TEXT entries: text_count == count means "all text".
 * A step ends with exactly one DONE or one ERROR event; it is the last event of the last
 * batch, and oam_step_pull() returns -1 afterwards. A cancelled step ends with an ERROR
 * event whose code is "cancelled" (undelivered text is dropped).
 *
 * Ownership of batches:
 *   - oam_step_pull() stores in *batch a pointer to the step's batch record. That record
 *     and every buffer it points to (kinds, ends, char_ends, data) belong to the step.
 *     They stay valid and unchanged until the NEXT oam_step_pull() or oam_step_free() on
 *     the same step, whichever comes first; then they are invalid (reused or freed).
 *     The host never frees them. oam_step_cancel() does not touch them.
 *   - When oam_step_pull() returns 0 or -1, (*batch)->count is 0 and the buffer
 *     pointers must not be read.
 *   - The record may be read on another host thread than the one that pulled, provided
 *     the host orders that read before its next pull/free (its own synchronization).
 *
 * Ownership of strings:
 *   - Every `const char *` INPUT is UTF-8, NUL-terminated, owned by the caller, and
 *     copied before the function returns. The caller may free it right away.
 *   - Every `char *` OUTPUT (return values and `char **` out-params) is allocated by
 *     the library with malloc (strdup) and must be freed by the host exactly once with
 *     oam_string_free(). An out-param is set to NULL when nothing is returned.
 *   - `char **err` out-params receive a JSON object {"code": "...", "message": "..."}
 *     whose code is one of the stable codes below. Passing err == NULL is allowed.
 *
 * Ownership of handles:
 *   - oam_engine_create() returns a handle the host releases exactly once with
 *     oam_engine_destroy(). oam_step_start() returns a handle the host releases
 *     exactly once with oam_step_free(). A step keeps its engine alive internally, so
 *     destroying an engine while a step is still open is safe.
 *   - oam_step_free() never blocks; it cancels the step if it is still running and
 *     invalidates the step's batch. Do not call oam_step_pull() on a freed step, and do
 *     not call oam_step_free() while another thread is inside oam_step_pull() on the
 *     same step.
 *
 * Thread safety:
 *   - All functions may be called from any thread. Many engines and many steps may
 *     be used concurrently. One step must be pulled (oam_step_pull) by one thread at a
 *     time (successive pulls may come from different threads). oam_step_cancel() may be
 *     called from any thread at any time before oam_step_free(); it wakes a blocked
 *     oam_step_pull(), which then returns the "cancelled" ERROR event.
 *   - oam_count_tokens() only reads the request and the engine's immutable state: hosts
 *     may count on worker threads while steps of the same engine stream.
 *   - oam_step_pull(step, 0, ...) never waits: it only takes the step's lock briefly,
 *     so a host may call it on a latency-sensitive thread (e.g. an event loop) and fall
 *     back to a blocking pull on a worker thread only when it returns 0.
 *
 * Stable error codes: model_unavailable, guardrail_violation, refusal,
 * context_size_exceeded, rate_limited, unsupported_language, invalid_schema,
 * tool_failed, cancelled, busy, invalid_request, generation_failed.
 */
#ifndef OAM_NATIVE_H
#define OAM_NATIVE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* OAM_CDEF_BEGIN */

/* Opaque handles. */
typedef struct oam_engine oam_engine;
typedef struct oam_step oam_step;

/* Event kinds (the values of oam_batch.kinds[i]). */
typedef enum oam_event_kind {
    OAM_EVENT_TEXT = 1,
    OAM_EVENT_TOOL_CALLS = 2,
    OAM_EVENT_DONE = 3,
    OAM_EVENT_ERROR = 4
} oam_event_kind;

/* One batch of events; see "Batch layout" and "Ownership of batches" above. */
typedef struct oam_batch {
    uint32_t count;              /* events in the batch; >= 1 when oam_step_pull returned 1 */
    uint32_t text_count;         /* how many of them are OAM_EVENT_TEXT */
    uint32_t size;               /* bytes in data (== ends[count-1]) */
    uint32_t chars;              /* Unicode scalar values in data (== char_ends[count-1]) */
    const uint8_t *kinds;        /* count entries */
    const uint32_t *ends;        /* count entries: end byte offset of each payload */
    const uint32_t *char_ends;   /* count entries: end offset in Unicode scalar values */
    const char *data;            /* size bytes: the payloads back to back, UTF-8 */
} oam_batch;

/* ABI version; bumped on any incompatible change. Currently 2
 * (1 had oam_step_next: one malloc'd JSON string per event). */
int oam_abi_version(void);

/* config_json: {"backend":"scripted"|"apple"|"auto", "script":[step...]}.
 * Returns NULL on failure and sets *err. */
oam_engine *oam_engine_create(const char *config_json, char **err);

/* Releases the host's reference. Safe with open steps. NULL is ignored. */
void oam_engine_destroy(oam_engine *engine);

/* JSON {"name","backend","available","reason","contextSize","features"}; free with
 * oam_string_free. */
char *oam_engine_info(oam_engine *engine);

/* json: {"instructions":"...","messages":[...],"tools":[...]} (StepRequest subset).
 * Returns the token estimate, or -1 on invalid input. */
int oam_count_tokens(oam_engine *engine, const char *json);

/* Starts one model step. step_request_json is the StepRequest:
 * {"instructions","messages","tools","toolMode","schema","options"}.
 * With "prewarm":true the step generates nothing: it prepares the step these messages
 * (the history, no new prompt) lead to (Apple: the session is built and prewarmed; the
 * scripted backend does nothing and consumes no script step) and ends with a done event
 * whose usage is zero and finishReason "prewarmed".
 * Returns NULL on failure and sets *err. */
oam_step *oam_step_start(oam_engine *engine, const char *step_request_json, char **err);

/* Waits up to timeout_ms (0: do not wait; <0: forever) for events. Invalidates the
 * previous batch of this step, then sets *batch (if batch != NULL) to the step's batch
 * record and returns
 *    1  the record holds >= 1 events: everything queued, ending with the terminal
 *       event if it has been queued;
 *    0  timeout, nothing queued (count == 0);
 *   -1  the terminal event was delivered by an earlier pull (count == 0), or step is NULL
 *       (then *batch = NULL). */
int oam_step_pull(oam_step *step, int timeout_ms, const oam_batch **batch);

/* Requests cancellation; thread-safe, idempotent, never blocks. */
void oam_step_cancel(oam_step *step);

/* Releases the step handle (cancelling it if still running) and its batch buffers.
 * NULL is ignored. */
void oam_step_free(oam_step *step);

/* Frees a string returned by this library. NULL is ignored. */
void oam_string_free(char *s);

/* OAM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* OAM_NATIVE_H */
