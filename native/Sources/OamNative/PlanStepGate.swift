import Foundation

/// Which steps of a backend may run at once: one per NPC, any number of NPCs together.
///
/// A `LanguageModelSession` takes one request at a time and an NPC's steps follow each other,
/// but separate sessions run concurrently (the system model schedules them), so two NPCs
/// speaking at once, an NPC-to-NPC exchange or a bark during a dialogue never wait on each
/// other here. The host runs one turn per NPC at a time, so a second open step of the same NPC
/// is a host's bug: `busy`.
///
/// A step that has ended for the host (done, error, cancelled) may still have a model task
/// draining; the NPC's next step waits for it (its late tool calls are carried to that step),
/// but at most `drainMs`: a task that never ends does not stall the NPC for ever.
///
/// Platform-independent: used by the Apple backend, unit-tested on Linux.
final class PlanStepGate: @unchecked Sendable {
    private let lock = NSLock()
    private var open: [String: Int] = [:]  // npc -> serial of its step that has not ended
    private var running: [String: (serial: Int, task: Task<Void, Never>)] = [:]  // npc -> its latest model task
    private var serial = 0

    /// Opens a step of `npc`: its serial and the NPC's previous model task (nil: none running).
    func open(npc: String) throws -> (serial: Int, previous: Task<Void, Never>?) {
        lock.lock(); defer { lock.unlock() }
        if open[npc] != nil {
            throw OamError("busy", "a step of NPC \(npc) is already running on this engine")
        }
        serial += 1
        open[npc] = serial
        return (serial, running[npc]?.task)
    }

    /// The model task of step `serial` of `npc`: the one its next step waits for.
    func started(npc: String, serial: Int, task: Task<Void, Never>) {
        lock.lock(); defer { lock.unlock() }
        if (running[npc]?.serial ?? 0) < serial { running[npc] = (serial, task) }
    }

    /// Step `serial` of `npc` has ended for the host (idempotent; a later step is left alone).
    func end(npc: String, serial: Int) {
        lock.lock(); defer { lock.unlock() }
        if open[npc] == serial { open[npc] = nil }
    }

    /// The model task of step `serial` of `npc` has returned: nothing to wait for any more.
    func finished(npc: String, serial: Int) {
        lock.lock(); defer { lock.unlock() }
        if running[npc]?.serial == serial { running[npc] = nil }
    }

    /// NPCs with a step open, and NPCs with a model task still running (for tests).
    var counts: (open: Int, running: Int) {
        lock.lock(); defer { lock.unlock() }
        return (open.count, running.count)
    }

    /// Waits for `previous` to end, at most `ms` milliseconds: true if it ended in time.
    static func drain(_ previous: Task<Void, Never>?, ms: UInt64) async -> Bool {
        guard let previous else { return true }
        return await withCheckedContinuation { (done: CheckedContinuation<Bool, Never>) in
            let once = ResumeOnce(done)
            Task.detached { await previous.value; once.resume(true) }
            Task.detached {
                try? await Task.sleep(nanoseconds: ms * 1_000_000)
                once.resume(false)
            }
        }
    }
}

/// A continuation resumed by whichever of two racers comes first.
private final class ResumeOnce: @unchecked Sendable {
    private let lock = NSLock()
    private var continuation: CheckedContinuation<Bool, Never>?
    init(_ c: CheckedContinuation<Bool, Never>) { continuation = c }
    func resume(_ value: Bool) {
        lock.lock()
        let c = continuation
        continuation = nil
        lock.unlock()
        c?.resume(returning: value)
    }
}
