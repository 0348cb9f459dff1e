import Foundation

/// Collects the tool calls of one step. The Apple backend's `Tool.call(arguments:)` does not
/// run anything: it calls `record(name:arguments:)`, which stores the call and then suspends
/// until the calls are delivered or the step ends (it never returns an output). After the
/// first call the collector waits a short quiet window (parallel calls arrive together; each
/// new call restarts the window, up to `maxWindowMs` after the first) and then hands all
/// calls, in arrival order, to `onReady` exactly once.
///
/// Delivery closes the collector: every suspended `record` then throws `Collected`, and so
/// does every later one. FoundationModels ends a respond when a tool throws (Apple documents
/// that `.required` "keeps calling tools until a tool throws an error from its
/// `call(arguments:)`"), so the model task ends without depending on `Task.cancel()`
/// reaching the suspended calls (docs/design-notes.md, "The framework's tool loop": the framework's internal task is not a
/// plain child of ours). Calls that arrive after delivery are not reported to the host; their
/// tool names are kept for `takeLateCalls()` so the step can say so in a warning.
///
/// Only async waits are used (Task.sleep, checked continuations); no thread is ever blocked.
final class PlanToolCollector: @unchecked Sendable {
    typealias Ready = @Sendable ([PlanToolCall]) -> Void

    /// What a tool call throws once the step's calls have been delivered to the host.
    struct Collected: Error, Equatable {}

    private let lock = NSLock()
    private let quietNs: UInt64
    private let maxWindowNs: UInt64
    private let idPrefix: String
    private var onReady: Ready?
    private var calls: [PlanToolCall] = []
    private var waiters: [Int: CheckedContinuation<Void, Error>] = [:]
    private var cancelledWaiters = Set<Int>()
    private var nextWaiter = 0
    private var generation = 0                 // bumped by every call: restarts the quiet window
    private var firstCallAt: UInt64 = 0
    private var timer: Task<Void, Never>?
    private var delivered = false
    private var closed = false
    private var late: [String] = []             // tool names of calls after delivery or close

    /// - idPrefix: prefix of the generated call ids (unique per step), e.g. "call_3f2a_".
    init(quietMs: Int = 25, maxWindowMs: Int = 250, idPrefix: String = PlanToolCollector.randomPrefix(),
         onReady: @escaping Ready) {
        self.quietNs = UInt64(max(0, quietMs)) * 1_000_000
        self.maxWindowNs = UInt64(max(quietMs, maxWindowMs)) * 1_000_000
        self.idPrefix = idPrefix
        self.onReady = onReady
    }

    static func randomPrefix() -> String {
        "call_" + String(UInt32.random(in: 0...UInt32.max), radix: 16) + "_"
    }

    /// Calls recorded so far.
    var recorded: [PlanToolCall] { lock.lock(); defer { lock.unlock() }; return calls }
    var hasDelivered: Bool { lock.lock(); defer { lock.unlock() }; return delivered }

    /// Records one call and suspends until the calls are delivered (then throws `Collected`),
    /// `close()` or task cancellation (then throws CancellationError); never returns. A call
    /// after delivery or close is not recorded (see `takeLateCalls`) and throws at once.
    /// Returns the id assigned to the call through `assigned` first.
    func record(name: String, arguments: JSON, assigned: (@Sendable (String) -> Void)? = nil) async throws -> Never {
        let id: String? = {
            lock.lock(); defer { lock.unlock() }
            guard !closed, !delivered else { late.append(name); return nil }
            let id = idPrefix + String(calls.count)
            calls.append(PlanToolCall(id: id, name: name, arguments: arguments))
            generation += 1
            if calls.count == 1 { firstCallAt = DispatchTime.now().uptimeNanoseconds }
            scheduleLocked()
            return id
        }()
        if let id { assigned?(id) }
        try await suspendUntilClosed()
        throw CancellationError()   // not reached: suspendUntilClosed only returns by throwing
    }

    /// Tool names of the calls that arrived after delivery or close, in arrival order; each
    /// is returned once.
    func takeLateCalls() -> [String] {
        lock.lock(); defer { lock.unlock() }
        let out = late
        late.removeAll()
        return out
    }

    /// The warning a step reports for calls in `takeLateCalls()`.
    static func lateWarning(_ names: [String]) -> String {
        "tool calls made after the collection window were dropped (not sent to the host): \(names.joined(separator: ", "))"
    }

    /// Ends the collection: cancels the window timer and resumes every suspended `record`
    /// (with `Collected` once delivered, else CancellationError). Idempotent. Calls recorded
    /// after this are not recorded.
    func close() {
        lock.lock()
        closed = true
        timer?.cancel()
        timer = nil
        onReady = nil
        let ws = waiters
        waiters.removeAll()
        let error: Error = delivered ? Collected() : CancellationError()
        lock.unlock()
        for (_, c) in ws { c.resume(throwing: error) }
    }

    // MARK: private

    private func scheduleLocked() {
        timer?.cancel()
        let gen = generation
        let elapsed = DispatchTime.now().uptimeNanoseconds &- firstCallAt
        let remainingCap = maxWindowNs > elapsed ? maxWindowNs - elapsed : 0
        let wait = min(quietNs, remainingCap)
        timer = Task { [weak self] in
            if wait > 0 {
                do { try await Task.sleep(nanoseconds: wait) } catch { return }
            }
            self?.fire(generation: gen)
        }
    }

    private func fire(generation gen: Int) {
        lock.lock()
        guard !closed, !delivered, gen == generation, let ready = onReady else { lock.unlock(); return }
        delivered = true
        onReady = nil
        timer = nil
        let out = calls
        lock.unlock()
        ready(out)
        close()   // the suspended calls throw Collected: the respond ends without cancellation
    }

    private func suspendUntilClosed() async throws {
        let token: Int = { lock.lock(); defer { lock.unlock() }; nextWaiter += 1; return nextWaiter }()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, Error>) in
                lock.lock()
                if closed || cancelledWaiters.contains(token) {
                    let error: Error = delivered && !cancelledWaiters.contains(token) ? Collected() : CancellationError()
                    cancelledWaiters.remove(token)
                    lock.unlock()
                    c.resume(throwing: error)
                    return
                }
                waiters[token] = c          // stored before anything can resume it
                lock.unlock()
            }
        } onCancel: {
            lock.lock()
            let c = waiters.removeValue(forKey: token)
            if c == nil { cancelledWaiters.insert(token) }   // cancel raced ahead of the store
            lock.unlock()
            c?.resume(throwing: CancellationError())
        }
    }
}
