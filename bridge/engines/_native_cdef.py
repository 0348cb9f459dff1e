"""Generated from native/include/oam_native.h (its OAM_CDEF region) by
``python -m bridge.engines.native``; do not edit. tests/native/test_native_engine.py fails
when this copy and the header differ."""

CDEF = """

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
"""
