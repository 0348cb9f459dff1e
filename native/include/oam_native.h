/*
 * oam_native.h — the C ABI of libOamNative (single source of truth).
 *
 * The Python host (bridge/engines/native.py) reads the declarations between the
 * OAM_CDEF_BEGIN / OAM_CDEF_END markers from THIS file (preprocessor lines stripped)
 * and hands them to cffi's ffi.cdef(). Keep that region plain C: no macros, no
 * attributes, no #includes.
 *
 * Design: host pulls. The host creates an engine, starts one model step, and then
 * repeatedly calls oam_step_next() from a thread of its own (cffi releases the GIL)
 * until it returns -1. The library never calls back into the host.
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
 *   - oam_step_free() never blocks; it cancels the step if it is still running.
 *     Do not call oam_step_next() on a freed step, and do not call oam_step_free()
 *     while another thread is inside oam_step_next() on the same step.
 *
 * Thread safety:
 *   - All functions may be called from any thread. Many engines and many steps may
 *     be used concurrently. One step must be pulled (oam_step_next) by one thread at
 *     a time. oam_step_cancel() may be called from any thread at any time before
 *     oam_step_free(); it wakes a blocked oam_step_next().
 *
 * Events (JSON objects returned by oam_step_next):
 *   {"type":"text","delta":"..."}
 *   {"type":"toolCalls","calls":[{"id":"...","name":"...","arguments":{...}}]}
 *   {"type":"done","usage":{"inputTokens":N,"outputTokens":N,"cachedTokens":N},
 *    "finishReason":"stop"|"tool_calls"|"length"}
 *   {"type":"error","code":"<stable code>","message":"..."}
 * A step ends with exactly one "done" or one "error" event; after it oam_step_next()
 * returns -1. A cancelled step ends with {"type":"error","code":"cancelled"}.
 *
 * Stable error codes: model_unavailable, guardrail_violation, refusal,
 * context_size_exceeded, rate_limited, unsupported_language, invalid_schema,
 * tool_failed, cancelled, busy, invalid_request, generation_failed.
 */
#ifndef OAM_NATIVE_H
#define OAM_NATIVE_H

#ifdef __cplusplus
extern "C" {
#endif

/* OAM_CDEF_BEGIN */

/* Opaque handles. */
typedef struct oam_engine oam_engine;
typedef struct oam_step oam_step;

/* ABI version; bumped on any incompatible change. Currently 1. */
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
 * Returns NULL on failure and sets *err. */
oam_step *oam_step_start(oam_engine *engine, const char *step_request_json, char **err);

/* Waits up to timeout_ms (<0: forever) for the next event.
 * Returns 1 and sets *event_json (free with oam_string_free), 0 on timeout
 * (*event_json = NULL), or -1 when the step has finished (*event_json = NULL). */
int oam_step_next(oam_step *step, int timeout_ms, char **event_json);

/* Requests cancellation; thread-safe, idempotent, never blocks. */
void oam_step_cancel(oam_step *step);

/* Releases the step handle (cancelling it if still running). NULL is ignored. */
void oam_step_free(oam_step *step);

/* Frees a string returned by this library. NULL is ignored. */
void oam_string_free(char *s);

/* OAM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* OAM_NATIVE_H */
