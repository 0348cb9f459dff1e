import XCTest
@testable import OamNative

/// A prewarm request (`"prewarm": true`, the host's `npc/prewarm`) on the scripted backend:
/// nothing is generated, no script step is consumed, the step ends with one done event.
final class ScriptedPrewarmTests: XCTestCase {
    /// Every event of a step, as (kind, payload), until the step is finished.
    func events(_ backend: Backend, _ request: String) throws -> [(UInt8, String)] {
        let step = StepState(engine: EngineBox(backend: backend))
        try backend.begin(try JSON.parse(request), step: step)
        var out: [(UInt8, String)] = []
        while true {
            let (rc, b) = step.pull(timeoutMs: 2000)
            if rc == -1 { return out }
            XCTAssertEqual(rc, 1, "the step timed out")
            if rc != 1 { return out }
            let batch = b.pointee
            var start = 0
            for i in 0..<Int(batch.count) {
                let end = Int(batch.ends[i])
                let bytes = UnsafeRawBufferPointer(start: UnsafeRawPointer(batch.data!) + start, count: end - start)
                out.append((batch.kinds[i], String(decoding: bytes, as: UTF8.self)))
                start = end
            }
        }
    }

    func text(_ events: [(UInt8, String)]) -> String {
        events.filter { $0.0 == EventKind.text }.map(\.1).joined()
    }

    let history = #"{"npcId":"keeper","instructions":"You are Greta.","messages":[],"tools":[{"name":"check_inventory"}],"toolMode":"allowed","schema":null,"options":{},"stepIndex":0"#

    func testAPrewarmConsumesNoScriptStepAndEndsWithADoneEvent() throws {
        let backend = try ScriptedBackend(config: try JSON.parse(#"{"script":[{"text":"first line"},{"text":"second line"}]}"#))
        let warm = try events(backend, history + #","prewarm":true}"#)
        XCTAssertEqual(warm.count, 1)
        XCTAssertEqual(warm[0].0, EventKind.done)
        let done = try JSON.parse(warm[0].1)
        XCTAssertEqual(done["finishReason"]?.string, "prewarmed")
        let estimate = estimateRequestTokens(try JSON.parse(history + "}"))
        XCTAssertGreaterThan(estimate, 0)
        XCTAssertEqual(done["usage"], .object(["inputTokens": .int(estimate), "outputTokens": .int(0), "cachedTokens": .int(0)]))

        let step = #"{"npcId":"keeper","instructions":"You are Greta.","messages":[{"role":"user","content":"Any ale?"}],"toolMode":"allowed"}"#
        XCTAssertEqual(text(try events(backend, step)), "first line")
        _ = try events(backend, history + #","prewarm":true}"#)
        _ = try events(backend, history + #","prewarm":true}"#)
        XCTAssertEqual(text(try events(backend, step)), "second line")
        XCTAssertEqual(text(try events(backend, step)), "You said: Any ale?")   // the script is used up
    }

    func testAPrewarmWithAHistoryEndingInTheNpcsLineIsAccepted() throws {
        // A prewarm's messages are the history: empty, or ending with the NPC's own line.
        let backend = try ScriptedBackend(config: try JSON.parse(#"{"script":[{"text":"hello"}]}"#))
        let request = #"{"npcId":"keeper","instructions":"","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Welcome."}],"toolMode":"disallowed","prewarm":true}"#
        let warm = try events(backend, request)
        XCTAssertEqual(warm.map(\.0), [EventKind.done])
        XCTAssertEqual(text(try events(backend, #"{"messages":[{"role":"user","content":"hi"}]}"#)), "hello")
    }

    func testAPrewarmsPromptPrefixIsPreparedTooAndMustBeAString() throws {
        // npc/prewarm's lead-in (`Bram: `): Apple's prewarm(promptPrefix:) gets it; here it
        // counts in what was prepared. Empty or null is no prefix.
        let backend = try ScriptedBackend(config: try JSON.parse("{}"))
        func input(_ extra: String) throws -> Int? {
            let warm = try events(backend, history + #","prewarm":true"# + extra + "}")
            return try JSON.parse(warm[0].1)["usage"]?["inputTokens"]?.int
        }
        let plain = try XCTUnwrap(try input(""))
        XCTAssertGreaterThan(try XCTUnwrap(try input(#","promptPrefix":"Bram: ""#)), plain)
        XCTAssertEqual(try input(#","promptPrefix":null"#), plain)
        XCTAssertEqual(try promptPrefix(try JSON.parse(#"{"promptPrefix":""}"#)), nil)
        XCTAssertEqual(try promptPrefix(try JSON.parse(#"{"promptPrefix":"Bram: "}"#)), "Bram: ")
        XCTAssertThrowsError(try backend.begin(try JSON.parse(history + #","prewarm":true,"promptPrefix":5}"#),
                                               step: StepState(engine: EngineBox(backend: backend)))) { error in
            XCTAssertEqual((error as? OamError)?.code, "invalid_request")
        }
    }

    func testAnAdapterMustBeAFileThatIsThere() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("oam-\(UUID().uuidString).fmadapter")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: dir) }
        let backend = try ScriptedBackend(config: .object(["adapter": .string(dir.path)]))
        XCTAssertEqual(backend.info()["adapter"]?.string, dir.path)
        XCTAssertEqual(try ScriptedBackend(config: .object([:])).info()["adapter"], .null)
        XCTAssertThrowsError(try ScriptedBackend(config: .object(["adapter": .string(dir.path + "-gone")]))) { error in
            XCTAssertEqual((error as? OamError)?.code, "model_unavailable")
        }
        XCTAssertThrowsError(try ScriptedBackend(config: .object(["adapter": .int(5)]))) { error in
            XCTAssertEqual((error as? OamError)?.code, "invalid_request")
        }
    }

    func testPrewarmFalseIsAStep() throws {
        let backend = try ScriptedBackend(config: try JSON.parse(#"{"script":[{"text":"hello"}]}"#))
        let out = try events(backend, #"{"messages":[{"role":"user","content":"hi"}],"prewarm":false}"#)
        XCTAssertEqual(text(out), "hello")
    }
}
