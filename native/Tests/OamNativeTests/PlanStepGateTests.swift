import XCTest
@testable import OamNative

final class PlanStepGateTests: XCTestCase {
    /// Two NPCs' steps open at once (issue 34: the engine-wide check ended NPC b's turn
    /// `busy` while NPC a spoke); a second step of the same NPC is `busy` until the first ends.
    func testStepsOfDifferentNpcsRunTogetherAndOneNpcsStepsFollowEachOther() throws {
        let gate = PlanStepGate()
        let a = try gate.open(npc: "a")
        let b = try gate.open(npc: "b")
        XCTAssertNotEqual(a.serial, b.serial)
        XCTAssertEqual(gate.counts.open, 2)
        XCTAssertThrowsError(try gate.open(npc: "a")) { error in
            XCTAssertEqual((error as? OamError)?.code, "busy")
        }
        gate.end(npc: "a", serial: a.serial)
        gate.end(npc: "a", serial: a.serial)  // idempotent
        let again = try gate.open(npc: "a")
        gate.end(npc: "a", serial: a.serial)  // the old step's late end leaves the new one open
        XCTAssertThrowsError(try gate.open(npc: "a"))
        gate.end(npc: "a", serial: again.serial)
        gate.end(npc: "b", serial: b.serial)
        XCTAssertEqual(gate.counts.open, 0)
    }

    /// The NPC's next step gets its previous model task to wait for, and only that NPC's;
    /// a finished task is forgotten (the table does not grow with NPCs that spoke once).
    func testTheNextStepWaitsForItsOwnNpcsDrainingTaskOnly() async throws {
        let gate = PlanStepGate()
        let a = try gate.open(npc: "a")
        let task = Task<Void, Never> { try? await Task.sleep(nanoseconds: 50_000_000) }
        gate.started(npc: "a", serial: a.serial, task: task)
        gate.end(npc: "a", serial: a.serial)
        let b = try gate.open(npc: "b")
        XCTAssertNil(b.previous, "another NPC's task is not waited for")
        let next = try gate.open(npc: "a")
        XCTAssertNotNil(next.previous)
        let ended = await PlanStepGate.drain(next.previous, ms: 5_000)
        XCTAssertTrue(ended)
        gate.finished(npc: "a", serial: a.serial)
        XCTAssertEqual(gate.counts.running, 0)
    }

    /// A previous task that never ends holds the next step `drainMs` at most.
    func testDrainingIsBounded() async {
        let stuck = Task<Void, Never> {
            while !Task.isCancelled { try? await Task.sleep(nanoseconds: 10_000_000) }
        }
        let t0 = Date()
        let ended = await PlanStepGate.drain(stuck, ms: 100)
        let waited = Date().timeIntervalSince(t0)
        XCTAssertFalse(ended)
        XCTAssertGreaterThanOrEqual(waited, 0.09)
        XCTAssertLessThan(waited, 5, "the wait is bounded, not the task's")
        stuck.cancel()
        let none = await PlanStepGate.drain(nil, ms: 100)
        XCTAssertTrue(none)
    }
}
