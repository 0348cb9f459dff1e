import XCTest
@testable import OamNative

final class Delivered: @unchecked Sendable {
    private let lock = NSLock()
    private var batches: [[PlanToolCall]] = []
    func add(_ c: [PlanToolCall]) { lock.lock(); batches.append(c); lock.unlock() }
    var all: [[PlanToolCall]] { lock.lock(); defer { lock.unlock() }; return batches }
}

final class PlanToolCollectorTests: XCTestCase {
    /// Parallel calls arriving within the quiet window are delivered once, together, in
    /// arrival order; delivery alone (no cancellation) ends every suspended call with
    /// `Collected`, so the model task ends even if FoundationModels never passes a cancel on.
    func testDeliveryEndsTheSuspendedCallsWithoutCancellation() async throws {
        let got = Delivered()
        let ready = expectation(description: "ready")
        let c = PlanToolCollector(quietMs: 25, idPrefix: "call_t_") { calls in got.add(calls); ready.fulfill() }
        let model = Task {
            try await withThrowingTaskGroup(of: Void.self) { g in
                for i in 0..<3 {
                    g.addTask {
                        try await Task.sleep(nanoseconds: UInt64(i) * 5_000_000)
                        try await c.record(name: "t\(i)", arguments: .object(["i": .int(i)]))
                    }
                }
                try await g.waitForAll()
            }
        }
        await fulfillment(of: [ready], timeout: 2)
        XCTAssertEqual(got.all.count, 1)
        XCTAssertEqual(got.all[0].map(\.name), ["t0", "t1", "t2"])
        XCTAssertEqual(got.all[0].map(\.id), ["call_t_0", "call_t_1", "call_t_2"])
        XCTAssertTrue(c.hasDelivered)
        // The model task is never cancelled here: it must end by itself, soon.
        let ended = expectation(description: "model task ended")
        let outcome = Task { () -> Error? in
            let r = await model.result
            ended.fulfill()
            if case .failure(let e) = r { return e }
            return nil
        }
        await fulfillment(of: [ended], timeout: 2)
        let e = await outcome.value
        XCTAssertEqual(e as? PlanToolCollector.Collected, PlanToolCollector.Collected(), "record must throw Collected")
        XCTAssertFalse(model.isCancelled)
        try await Task.sleep(nanoseconds: 60_000_000)
        XCTAssertEqual(got.all.count, 1)                 // never delivered twice
    }

    /// A call that arrives after delivery is not sent to the host, throws at once, and is
    /// kept (once) for the step's warning.
    func testACallAfterDeliveryThrowsAtOnceAndIsReportedLate() async throws {
        let got = Delivered()
        let ready = expectation(description: "ready")
        let c = PlanToolCollector(quietMs: 5, idPrefix: "call_t_") { calls in got.add(calls); ready.fulfill() }
        let first = Task { try await c.record(name: "open_door", arguments: .object([:])) }
        await fulfillment(of: [ready], timeout: 2)
        let lateEnded = expectation(description: "the late call ended")
        let late = Task { () -> Error? in
            defer { lateEnded.fulfill() }
            do { try await c.record(name: "give_item", arguments: .object([:])) } catch { return error }
        }
        await fulfillment(of: [lateEnded], timeout: 2)   // bounded: a call that suspends fails here
        let e = await late.value
        XCTAssertTrue(e is PlanToolCollector.Collected)
        first.cancel()
        XCTAssertEqual(got.all.map { $0.map(\.name) }, [["open_door"]])
        XCTAssertEqual(c.takeLateCalls(), ["give_item"])
        XCTAssertEqual(c.takeLateCalls(), [])
        XCTAssertTrue(PlanToolCollector.lateWarning(["give_item"]).contains("give_item"))
    }

    func testQuietWindowIsCappedForATrickleOfCalls() async throws {
        let got = Delivered()
        let ready = expectation(description: "ready")
        let c = PlanToolCollector(quietMs: 20, maxWindowMs: 60) { calls in got.add(calls); ready.fulfill() }
        let start = Date()
        let model = Task {
            await withTaskGroup(of: Void.self) { g in
                for i in 0..<20 {   // one call every 10 ms would restart a 20 ms window forever
                    g.addTask {
                        try? await Task.sleep(nanoseconds: UInt64(i) * 10_000_000)
                        _ = try? await c.record(name: "t", arguments: .object([:]))
                    }
                }
            }
        }
        await fulfillment(of: [ready], timeout: 2)
        XCTAssertLessThan(Date().timeIntervalSince(start), 0.5)
        XCTAssertLessThan(got.all[0].count, 20)
        c.close()
        model.cancel()
        _ = await model.value
    }

    /// close() (step cancelled, or the model answered) resumes suspended calls and suppresses
    /// delivery; calls after close fail at once.
    func testCloseBeforeTheWindowSuppressesDelivery() async throws {
        let got = Delivered()
        let c = PlanToolCollector(quietMs: 50) { calls in got.add(calls) }
        let call = Task { try await c.record(name: "t", arguments: .object([:])) }
        try await Task.sleep(nanoseconds: 10_000_000)
        c.close()
        let r = await call.result
        guard case .failure(let e) = r else { return XCTFail() }
        XCTAssertTrue(e is CancellationError)
        try await Task.sleep(nanoseconds: 80_000_000)
        XCTAssertEqual(got.all.count, 0)
        XCTAssertFalse(c.hasDelivered)
        let late = await Task { try await c.record(name: "late", arguments: .object([:])) }.result
        if case .success = late { XCTFail() }
        XCTAssertEqual(c.recorded.count, 1)
    }

    /// A task cancelled before it suspends still ends (the cancel/store race).
    func testCancelledCallerDoesNotHang() async throws {
        let c = PlanToolCollector(quietMs: 1_000) { _ in }
        let call = Task { () async throws -> Void in
            withUnsafeCurrentTask { $0?.cancel() }
            try await c.record(name: "t", arguments: .object([:]))
        }
        let r = await call.result
        guard case .failure = r else { return XCTFail() }
        c.close()
    }
}
