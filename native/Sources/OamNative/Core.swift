import Foundation
import COamNative
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A failure with one of the stable codes listed in oam_native.h.
struct OamError: Error {
    let code: String
    let message: String
    /// Figures a game acts on, passed to the host as the error event's `data`: `retryAfterMs`
    /// (rate_limited), `promptTokens` and `contextSize` (context_size_exceeded).
    var data: [String: JSON] = [:]
    init(_ code: String, _ message: String, data: [String: JSON] = [:]) {
        self.code = code; self.message = message; self.data = data
    }
    var json: JSON {
        var o: [String: JSON] = ["code": .string(code), "message": .string(message)]
        if !data.isEmpty { o["data"] = .object(data) }
        return .object(o)
    }
}

/// A model backend: runs one step at a time per call to `start`, pushing events into `step`.
protocol Backend: AnyObject, Sendable {
    var name: String { get }
    func info() -> JSON
    /// Called on any host thread, concurrently with other counts and with running steps
    /// (the Python host counts in worker threads): it must only read immutable state.
    func countTokens(_ request: JSON) throws -> Int
    /// Must return quickly; the work runs on a thread/task of the backend's own and
    /// reports through `step.push` / `step.finish`. It must poll `step.isCancelled`.
    /// A step whose whole output is known at once may push it (and finish) before
    /// returning: the events wait in the step's queue for the first pull.
    func start(_ request: JSON, step: StepState) throws
    /// A prewarm request (`"prewarm": true`, the host's `npc/prewarm`): prepares the step
    /// these messages lead to (the history, and the start of the new prompt when the host
    /// knows it: `promptPrefix`) and generates nothing; ends `step` with a done event. Same
    /// threading rules as `start`. The default checks the request and does nothing else (the
    /// scripted backend: no script step is consumed); its done event counts what a prewarm
    /// would prepare, as `estimateRequestTokens` estimates it.
    func prewarm(_ request: JSON, step: StepState) throws
}

extension Backend {
    func prewarm(_ request: JSON, step: StepState) throws {
        _ = try promptPrefix(request)   // invalid_request
        step.finish(prewarmedEvent(warnings: [], inputTokens: estimateRequestTokens(request)))
    }

    /// oam_step_start: a prewarm request goes to `prewarm`, any other to `start`.
    func begin(_ request: JSON, step: StepState) throws {
        if isPrewarmRequest(request) {
            try prewarm(request, step: step)
        } else {
            try start(request, step: step)
        }
    }
}

/// Whether a step request asks for a prewarm (`"prewarm": true`: a field of the request
/// JSON, so the ABI is unchanged).
func isPrewarmRequest(_ request: JSON) -> Bool { request["prewarm"]?.bool ?? false }

/// A prewarm request's `"promptPrefix"`: how the NPC's next prompt starts, when the host
/// knows (`npc/prewarm`'s `speaker` and `promptPrefix`: `Bram: `); nil when absent, null or
/// empty. The Apple backend passes it to `prewarm(promptPrefix:)`.
func promptPrefix(_ request: JSON) throws -> String? {
    switch request["promptPrefix"] {
    case nil, .some(.null): return nil
    case .some(.string(let s)): return s.isEmpty ? nil : s
    default: throw OamError("invalid_request", "promptPrefix must be a string")
    }
}

/// An engine config's `"adapter"`: the path of an Apple adapter file (`.fmadapter`), which
/// must exist; nil when absent or null.
func adapterPath(_ config: JSON) throws -> String? {
    switch config["adapter"] {
    case nil, .some(.null): return nil
    case .some(.string(let path)) where !path.isEmpty:
        guard FileManager.default.fileExists(atPath: path) else {
            throw OamError("model_unavailable", "adapter file not found: \(path)")
        }
        return path
    default: throw OamError("invalid_request", "adapter must be a file path")
    }
}

/// The done event that ends a prewarm: nothing generated; `inputTokens` what was prepared
/// where the backend knows it (else 0).
func prewarmedEvent(warnings: [String], inputTokens: Int = 0) -> JSON {
    var o: [String: JSON] = [
        "type": .string("done"), "finishReason": .string("prewarmed"),
        "usage": .object(["inputTokens": .int(inputTokens), "outputTokens": .int(0), "cachedTokens": .int(0)]),
    ]
    if !warnings.isEmpty { o["warnings"] = .array(warnings.map { .string($0) }) }
    return .object(o)
}

/// Event kinds of oam_native.h (oam_event_kind), as stored in a batch's `kinds` array.
enum EventKind {
    static let text = UInt8(OAM_EVENT_TEXT.rawValue)
    static let toolCalls = UInt8(OAM_EVENT_TOOL_CALLS.rawValue)
    static let done = UInt8(OAM_EVENT_DONE.rawValue)
    static let error = UInt8(OAM_EVENT_ERROR.rawValue)
}

/// A growable malloc'd array of plain values whose address the C host may read. Not
/// thread-safe; always used under the owning step's lock (or by the host between pulls).
struct RawBuf<T: BitwiseCopyable> {
    private(set) var base: UnsafeMutablePointer<T>?
    private(set) var count = 0
    private var capacity = 0

    mutating func reserve(_ extra: Int) {
        let need = count + extra
        if need <= capacity && base != nil { return }
        var c = Swift.max(capacity * 2, 64)
        while c < need { c *= 2 }
        guard let p = realloc(base, c * MemoryLayout<T>.stride) else { fatalError("libOamNative: out of memory") }
        base = p.bindMemory(to: T.self, capacity: c)
        capacity = c
    }

    mutating func append(_ v: T) {
        reserve(1)
        base![count] = v
        count += 1
    }

    mutating func append(_ v: T, times n: Int) {
        guard n > 0 else { return }
        reserve(n)
        (base! + count).initialize(repeating: v, count: n)
        count += n
    }

    /// Appends `n` values written by `fill` into uninitialised room.
    mutating func appendWith(_ n: Int, _ fill: (UnsafeMutablePointer<T>) -> Void) {
        reserve(n)
        fill(base! + count)
        count += n
    }

    mutating func removeAll() { count = 0 }
    mutating func deallocate() { free(base); base = nil; count = 0; capacity = 0 }
}

/// Number of Unicode scalar values in valid UTF-8: the bytes that are not continuation bytes.
@inline(__always)
func scalarCount(_ p: UnsafePointer<UInt8>, _ n: Int) -> Int {
    var c = 0
    for i in 0..<n where p[i] & 0xC0 != 0x80 { c += 1 }
    return c
}

/// The events of one batch in the ABI layout: kinds, byte ends, scalar ends, payload bytes.
struct EventBuffers {
    var kinds = RawBuf<UInt8>()
    var ends = RawBuf<UInt32>()
    var charEnds = RawBuf<UInt32>()
    var data = RawBuf<UInt8>()
    var chars = 0
    var textCount = 0

    var isEmpty: Bool { kinds.count == 0 }
    static let limit = Int(UInt32.max) - 1

    /// Appends one event; false (nothing appended) if the batch would outgrow 32-bit offsets.
    mutating func append(kind: UInt8, _ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let n = bytes.count
        guard data.count + n <= EventBuffers.limit, kinds.count < EventBuffers.limit else { return false }
        if n > 0 { data.appendWith(n) { $0.update(from: bytes.baseAddress!, count: n) } } else { data.reserve(0) }
        if n > 0 { chars += scalarCount(bytes.baseAddress!, n) }
        kinds.append(kind)
        ends.append(UInt32(data.count))
        charEnds.append(UInt32(chars))
        if kind == EventKind.text { textCount += 1 }
        return true
    }

    mutating func append(kind: UInt8, _ s: String) -> Bool {
        var s = s
        return s.withUTF8 { append(kind: kind, $0) }
    }

    /// Appends many text deltas at once: delta i is utf8[cuts[i-1] ..< cuts[i]] (cuts[-1] = 0).
    mutating func appendTexts(_ utf8: UnsafeBufferPointer<UInt8>, cuts: ArraySlice<Int>, from start: Int) -> Bool {
        guard let last = cuts.last else { return true }
        let n = last - start, k = cuts.count
        guard data.count + n <= EventBuffers.limit, kinds.count + k <= EventBuffers.limit else { return false }
        let base = data.count
        let src = utf8.baseAddress!
        data.appendWith(n) { $0.update(from: src + start, count: n) }
        kinds.append(EventKind.text, times: k)
        ends.appendWith(k) { out in
            for (j, c) in cuts.enumerated() { out[j] = UInt32(base + c - start) }
        }
        var ch = chars, prev = start
        charEnds.appendWith(k) { out in
            for (j, c) in cuts.enumerated() {
                ch += scalarCount(src + prev, c - prev)
                out[j] = UInt32(ch)
                prev = c
            }
        }
        chars = ch
        textCount += k
        return true
    }

    mutating func removeAll() {
        kinds.removeAll(); ends.removeAll(); charEnds.removeAll(); data.removeAll()
        chars = 0; textCount = 0
    }

    mutating func deallocate() {
        kinds.deallocate(); ends.deallocate(); charEnds.deallocate(); data.deallocate()
        chars = 0; textCount = 0
    }
}

/// Event queue shared by one producer (backend) and one consumer (oam_step_pull).
/// Guarded by an NSCondition; never uses Swift concurrency for blocking.
///
/// Double-buffered: the producer appends to `pending`; a pull swaps `pending` with
/// `delivered` (O(1)) and points the C batch record at `delivered`, which then stays
/// untouched until the next pull (that is what the header promises the host).
final class StepState: @unchecked Sendable {
    private let cond = NSCondition()
    private var pending = EventBuffers()
    private var delivered = EventBuffers()   // read by the host between pulls; never touched by producers
    private let batch: UnsafeMutablePointer<oam_batch>
    private var terminalQueued = false   // "done"/"error" pushed
    private var terminalDelivered = false
    private var cancelled = false
    private var onCancel: [() -> Void] = []
    private var onEnd: [() -> Void] = []
    let engine: EngineBox                // keeps the engine alive while the step lives

    init(engine: EngineBox) {
        self.engine = engine
        batch = .allocate(capacity: 1)
        batch.initialize(to: oam_batch())
    }

    deinit {
        pending.deallocate()
        delivered.deallocate()
        batch.deallocate()
    }

    var isCancelled: Bool { cond.lock(); defer { cond.unlock() }; return cancelled }

    /// Registers a hook run once on cancel (e.g. Task.cancel for the Apple backend).
    func whenCancelled(_ f: @escaping () -> Void) {
        cond.lock()
        if cancelled { cond.unlock(); f(); return }
        onCancel.append(f)
        cond.unlock()
    }

    /// Registers a hook run once when the step's terminal event is queued (done, error or
    /// cancelled), under the step's lock: it has run before the host can pull that event (a
    /// backend's "the NPC may start its next step"). Hooks must not call back into the step.
    func whenEnded(_ f: @escaping () -> Void) {
        cond.lock()
        if terminalQueued { cond.unlock(); f(); return }
        onEnd.append(f)
        cond.unlock()
    }

    private func endedLocked() {
        let hooks = onEnd
        onEnd.removeAll()
        for h in hooks { h() }
    }

    /// Queues one event; the caller holds the lock. Fails the step if the batch is full.
    private func enqueueLocked(kind: UInt8, _ payload: String) {
        if !pending.append(kind: kind, payload) { overflowLocked() }
        cond.broadcast()
    }

    private func overflowLocked() {
        pending.removeAll()
        _ = pending.append(kind: EventKind.error, OamError("generation_failed", "event backlog exceeds 4 GiB").errorEvent)
        terminalQueued = true
    }

    /// Pushes a non-terminal event. Ignored after the terminal event or cancel.
    /// `{"type":"text","delta":...}` becomes a raw text event, `{"type":"toolCalls",...}` a
    /// JSON event; "done"/"error" are passed to `finish`; other types are dropped.
    func push(_ event: JSON) {
        if event["type"]?.string == "text", let d = event["delta"]?.string {
            pushText(d)
            return
        }
        switch event["type"]?.string {
        case "toolCalls": break
        case "done", "error": finish(event); return   // terminal kinds always end the step
        default: return                              // not an ABI event kind: dropped
        }
        let payload = event.serialized()
        cond.lock(); defer { cond.unlock() }
        guard !terminalQueued, !cancelled else { return }
        enqueueLocked(kind: EventKind.toolCalls, payload)
    }

    /// Pushes one text delta (raw UTF-8 on the wire). Ignored after the terminal event or cancel.
    func pushText(_ delta: String) {
        cond.lock(); defer { cond.unlock() }
        guard !terminalQueued, !cancelled else { return }
        enqueueLocked(kind: EventKind.text, delta)
    }

    /// Pushes many text deltas under one lock: delta i is utf8[cuts[i-1] ..< cuts[i]]
    /// (cuts[-1] = 0; cuts ascending, each on a UTF-8 scalar boundary).
    func pushTexts(_ utf8: UnsafeBufferPointer<UInt8>, cuts: ArraySlice<Int>, from start: Int = 0) {
        cond.lock(); defer { cond.unlock() }
        guard !terminalQueued, !cancelled, !cuts.isEmpty else { return }
        if !pending.appendTexts(utf8, cuts: cuts, from: start) { overflowLocked() }
        cond.broadcast()
    }

    /// Pushes the terminal event (done or error). Only the first terminal event counts.
    func finish(_ event: JSON) {
        let kind = event["type"]?.string == "done" ? EventKind.done : EventKind.error
        let payload = event.serialized()
        cond.lock(); defer { cond.unlock() }
        guard !terminalQueued else { return }
        if cancelled {
            // Cancel wins: the consumer sees "cancelled" regardless of what the model did.
            enqueueLocked(kind: EventKind.error, StepState.cancelledEvent)
        } else {
            enqueueLocked(kind: kind, payload)
        }
        terminalQueued = true
        endedLocked()
    }

    func fail(_ error: OamError) {
        var o: [String: JSON] = ["type": .string("error"), "code": .string(error.code), "message": .string(error.message)]
        if !error.data.isEmpty { o["data"] = .object(error.data) }
        finish(.object(o))
    }

    static let cancelledEvent = OamError("cancelled", "step cancelled").errorEvent

    func cancel() {
        cond.lock()
        if cancelled { cond.unlock(); return }
        cancelled = true
        if !terminalQueued {
            // Drop undelivered deltas; the consumer gets the cancelled error next.
            pending.removeAll()
            enqueueLocked(kind: EventKind.error, StepState.cancelledEvent)
            terminalQueued = true
            endedLocked()
        }
        let hooks = onCancel
        onCancel.removeAll()
        cond.broadcast()
        cond.unlock()
        for h in hooks { h() }
    }

    /// Sleeps up to `ms` unless cancelled first. Returns false if cancelled.
    func sleep(ms: Int) -> Bool {
        let deadline = Date(timeIntervalSinceNow: Double(ms) / 1000)
        cond.lock(); defer { cond.unlock() }
        while !cancelled {
            if !cond.wait(until: deadline) { break }
        }
        return !cancelled
    }

    /// oam_step_pull: 1 = batch, 0 = timeout, -1 = finished. Returns the batch record.
    func pull(timeoutMs: Int) -> (Int32, UnsafePointer<oam_batch>) {
        cond.lock(); defer { cond.unlock() }
        // The host has given the previous batch back.
        delivered.removeAll()
        batch.pointee = oam_batch()
        var deadline: Date?
        while true {
            if !pending.isEmpty {
                swap(&pending, &delivered)
                // The terminal event is always the last one queued, so if it has been
                // queued it is in this batch.
                if terminalQueued { terminalDelivered = true }
                let d = delivered
                batch.pointee = oam_batch(
                    count: UInt32(d.kinds.count), text_count: UInt32(d.textCount),
                    size: UInt32(d.data.count), chars: UInt32(d.chars),
                    kinds: UnsafePointer(d.kinds.base), ends: UnsafePointer(d.ends.base),
                    char_ends: UnsafePointer(d.charEnds.base),
                    data: UnsafeRawPointer(d.data.base).map { $0.assumingMemoryBound(to: CChar.self) })
                return (1, UnsafePointer(batch))
            }
            if terminalDelivered || terminalQueued { terminalDelivered = true; return (-1, UnsafePointer(batch)) }
            if timeoutMs == 0 { return (0, UnsafePointer(batch)) }
            if timeoutMs < 0 {
                cond.wait()
            } else {
                let d = deadline ?? Date(timeIntervalSinceNow: Double(timeoutMs) / 1000)
                deadline = d
                if !cond.wait(until: d) && pending.isEmpty && !terminalQueued { return (0, UnsafePointer(batch)) }
            }
        }
    }
}

extension OamError {
    /// The error event's JSON text.
    var errorEvent: String {
        var o: [String: JSON] = ["type": .string("error"), "code": .string(code), "message": .string(message)]
        if !data.isEmpty { o["data"] = .object(data) }
        return JSON.object(o).serialized()
    }
}

/// What an `oam_engine *` points at (retained +1 by the host).
final class EngineBox: Sendable {
    let backend: Backend
    init(backend: Backend) { self.backend = backend }
}

/// Rough, backend-independent token estimate: ~4 UTF-8 bytes per token.
func estimateTokens(_ text: String) -> Int {
    let n = text.utf8.count
    return n == 0 ? 0 : (n + 3) / 4
}

func estimateRequestTokens(_ request: JSON) -> Int {
    var total = 0
    if let s = request["instructions"]?.string { total += estimateTokens(s) }
    for m in request["messages"]?.array ?? [] {
        total += 4  // per-message framing
        if let c = m["content"]?.string { total += estimateTokens(c) }
        if let calls = m["toolCalls"]?.array { total += estimateTokens(JSON.array(calls).serialized()) }
    }
    for t in request["tools"]?.array ?? [] { total += estimateTokens(t.serialized()) }
    if let schema = request["schema"], schema != .null { total += estimateTokens(schema.serialized()) }
    if let prefix = request["promptPrefix"]?.string { total += 4 + estimateTokens(prefix) }  // a prewarm's
    return total
}

/// Text of the last user message in a StepRequest, or "".
func lastUserMessage(_ request: JSON) -> String {
    for m in (request["messages"]?.array ?? []).reversed() where m["role"]?.string == "user" {
        return m["content"]?.string ?? ""
    }
    return ""
}

let stableCodes: Set<String> = [
    "model_unavailable", "guardrail_violation", "refusal", "context_size_exceeded",
    "rate_limited", "unsupported_language", "invalid_schema", "tool_failed", "cancelled",
    "busy", "invalid_request", "generation_failed",
]
