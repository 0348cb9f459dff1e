import Foundation

/// A failure with one of the stable codes listed in oam_native.h.
struct OamError: Error {
    let code: String
    let message: String
    init(_ code: String, _ message: String) { self.code = code; self.message = message }
    var json: JSON { .object(["code": .string(code), "message": .string(message)]) }
}

/// A model backend: runs one step at a time per call to `start`, pushing events into `step`.
protocol Backend: AnyObject, Sendable {
    var name: String { get }
    func info() -> JSON
    func countTokens(_ request: JSON) throws -> Int
    /// Must return quickly; the work runs on a thread/task of the backend's own and
    /// reports through `step.push` / `step.finish`. It must poll `step.isCancelled`.
    func start(_ request: JSON, step: StepState) throws
}

/// Event queue shared by one producer (backend) and one consumer (oam_step_next).
/// Guarded by an NSCondition; never uses Swift concurrency for blocking.
final class StepState: @unchecked Sendable {
    private let cond = NSCondition()
    private var queue: [String] = []
    private var terminalQueued = false   // "done"/"error" pushed
    private var terminalDelivered = false
    private var cancelled = false
    private var onCancel: [() -> Void] = []
    let engine: EngineBox                // keeps the engine alive while the step lives

    init(engine: EngineBox) { self.engine = engine }

    var isCancelled: Bool { cond.lock(); defer { cond.unlock() }; return cancelled }

    /// Registers a hook run once on cancel (e.g. Task.cancel for the Apple backend).
    func whenCancelled(_ f: @escaping () -> Void) {
        cond.lock()
        if cancelled { cond.unlock(); f(); return }
        onCancel.append(f)
        cond.unlock()
    }

    /// Pushes a non-terminal event. Ignored after the terminal event or cancel.
    func push(_ event: JSON) {
        cond.lock(); defer { cond.unlock() }
        guard !terminalQueued, !cancelled else { return }
        queue.append(event.serialized())
        cond.broadcast()
    }

    /// Pushes the terminal event (done or error). Only the first terminal event counts.
    func finish(_ event: JSON) {
        cond.lock(); defer { cond.unlock() }
        guard !terminalQueued else { return }
        if cancelled {
            // Cancel wins: the consumer sees "cancelled" regardless of what the model did.
            queue.append(StepState.cancelledEvent)
        } else {
            queue.append(event.serialized())
        }
        terminalQueued = true
        cond.broadcast()
    }

    func fail(_ error: OamError) {
        finish(.object(["type": .string("error"), "code": .string(error.code),
                        "message": .string(error.message)]))
    }

    static let cancelledEvent = JSON.object([
        "type": .string("error"), "code": .string("cancelled"),
        "message": .string("step cancelled"),
    ]).serialized()

    func cancel() {
        cond.lock()
        if cancelled { cond.unlock(); return }
        cancelled = true
        if !terminalQueued {
            // Drop undelivered deltas; the consumer gets the cancelled error next.
            queue.removeAll()
            queue.append(StepState.cancelledEvent)
            terminalQueued = true
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

    /// 1 = event, 0 = timeout, -1 = finished.
    func next(timeoutMs: Int) -> (Int32, String?) {
        let deadline: Date? = timeoutMs < 0 ? nil : Date(timeIntervalSinceNow: Double(timeoutMs) / 1000)
        cond.lock(); defer { cond.unlock() }
        while true {
            if !queue.isEmpty {
                let ev = queue.removeFirst()
                if queue.isEmpty && terminalQueued { terminalDelivered = true }
                return (1, ev)
            }
            if terminalDelivered || terminalQueued { terminalDelivered = true; return (-1, nil) }
            if let d = deadline {
                if !cond.wait(until: d) && queue.isEmpty && !terminalQueued { return (0, nil) }
            } else {
                cond.wait()
            }
        }
    }
}

/// What an `oam_engine *` points at (retained +1 by the host).
final class EngineBox: @unchecked Sendable {
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
