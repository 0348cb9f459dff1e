import XCTest
@testable import OamNative

final class PlanTranscriptTests: XCTestCase {
    func req(_ s: String) throws -> JSON { try JSON.parse(s) }

    func testLastUserMessageBecomesThePrompt() throws {
        let p = try PlanTranscript.build(req("""
        {"instructions":"Be brief.","messages":[
          {"role":"user","content":"hi"},{"role":"assistant","content":"hello"},
          {"role":"user","content":"how are you?"}],
         "tools":[{"name":"look","description":"d","parameters":{"type":"object"}}],
         "toolMode":"allowed","schema":null,"options":{"temperature":null,"maxTokens":null,"seed":null,"topP":null}}
        """))
        XCTAssertEqual(p.prompt, "how are you?")
        XCTAssertFalse(p.continuesAfterToolOutput)
        XCTAssertEqual(p.history, [.prompt(id: "prompt-0", text: "hi"), .response(id: "response-1", text: "hello")])
        XCTAssertEqual(p.tools.map(\.name), ["look"])
        XCTAssertEqual(p.instructions, "Be brief.")
        XCTAssertNil(p.schema)
        XCTAssertEqual(p.options, PlanOptions())
        XCTAssertEqual(p.warnings, [])
    }

    func testTrailingToolOutputsContinueWithEmptyPrompt() throws {
        let p = try PlanTranscript.build(req("""
        {"messages":[{"role":"user","content":"weather in Paris and Rome?"},
          {"role":"assistant","toolCalls":[{"id":"c1","name":"weather","arguments":{"city":"Paris"}},
                                           {"id":"c2","name":"weather","arguments":{"city":"Rome"}}]},
          {"role":"tool","toolCallId":"c1","name":"weather","content":"20C"},
          {"role":"tool","toolCallId":"c2","content":"25C","isError":false}],
         "tools":[{"name":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],
         "toolMode":"allowed"}
        """))
        XCTAssertEqual(p.prompt, "")
        XCTAssertTrue(p.continuesAfterToolOutput)
        XCTAssertEqual(p.history.count, 4)
        guard case .toolCalls(_, let calls) = p.history[1] else { return XCTFail("expected toolCalls") }
        XCTAssertEqual(calls.map(\.id), ["c1", "c2"])
        XCTAssertEqual(calls[0].arguments, .object(["city": .string("Paris")]))
        XCTAssertEqual(calls[0].argumentsJSON, #"{"city":"Paris"}"#)
        // ToolOutput.id equals the ToolCall.id it answers; the name comes from the call.
        XCTAssertEqual(p.history[2], .toolOutput(id: "c1", toolName: "weather", text: "20C"))
        XCTAssertEqual(p.history[3], .toolOutput(id: "c2", toolName: "weather", text: "25C"))
    }

    func testPreambleTextBeforeToolCallsIsItsOwnResponse() throws {
        let p = try PlanTranscript.build(req("""
        {"messages":[{"role":"user","content":"x"},
          {"role":"assistant","content":"Let me look.","toolCalls":[{"id":"a","name":"t","arguments":"{\\"q\\":1}"}]},
          {"role":"tool","toolCallId":"a","content":"ok"}],"tools":[{"name":"t"}]}
        """))
        XCTAssertEqual(p.history[1], .response(id: "response-1", text: "Let me look."))
        guard case .toolCalls(_, let calls) = p.history[2] else { return XCTFail() }
        XCTAssertEqual(calls[0].arguments, .object(["q": .int(1)]))  // JSON-text arguments are parsed
    }

    func testToolOutputMustAnswerAKnownCall() {
        for bad in [
            #"{"messages":[{"role":"user","content":"x"},{"role":"tool","toolCallId":"nope","content":"r"}]}"#,
            #"{"messages":[{"role":"user","content":"x"},{"role":"assistant","toolCalls":[{"id":"a","name":"t","arguments":{}}]},{"role":"tool","toolCallId":"a","content":"1"},{"role":"tool","toolCallId":"a","content":"2"}]}"#,
            #"{"messages":[{"role":"user","content":"x"},{"role":"assistant","toolCalls":[{"id":"a","name":"t","arguments":{}}]},{"role":"tool","toolCallId":"a","name":"other","content":"1"}]}"#,
            #"{"messages":[{"role":"user","content":"x"},{"role":"tool","content":"r"}]}"#,
        ] {
            XCTAssertThrowsError(try PlanTranscript.build(req(bad))) { e in
                XCTAssertEqual((e as? OamError)?.code, "invalid_request", bad)
            }
        }
    }

    func testInvalidRequests() {
        for bad in [
            #"{"messages":[]}"#,
            #"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]}"#,
            #"{"messages":[{"role":"system","content":"x"}]}"#,
            #"{"messages":[{"role":"user","content":"x"}],"toolMode":"sometimes"}"#,
            #"{"messages":[{"role":"user","content":"x"}],"toolMode":"required","tools":[]}"#,
            #"{"messages":[{"role":"user","content":"x"}],"tools":[{"name":"a"},{"name":"a"}]}"#,
            #"{"messages":[{"role":"user","content":"x"}],"options":{"topP":1.5}}"#,
            #"{"messages":[{"role":"user","content":"x"}],"options":{"maxTokens":0}}"#,
            #"{"messages":[{"role":"user","content":"x"},{"role":"assistant","toolCalls":[{"id":"a","name":"t","arguments":{}},{"id":"a","name":"t","arguments":{}}]}]}"#,
        ] {
            XCTAssertThrowsError(try PlanTranscript.build(req(bad))) { e in
                XCTAssertEqual((e as? OamError)?.code, "invalid_request", bad)
            }
        }
    }

    func testDisallowedUsesTheToolsAsGiven() throws {
        // The host decides which tools a step shows; the library never filters them again.
        let p = try PlanTranscript.build(req("""
        {"messages":[{"role":"user","content":"x"}],"tools":[{"name":"a"}],"toolMode":"disallowed"}
        """))
        XCTAssertEqual(p.toolMode, .disallowed)
        XCTAssertEqual(p.tools.map(\.name), ["a"])
    }

    func testUnansweredCallsAreWarnings() throws {
        let p = try PlanTranscript.build(req("""
        {"messages":[{"role":"user","content":"x"},{"role":"assistant","toolCalls":[{"id":"a","name":"t","arguments":{}}]},
          {"role":"user","content":"never mind"}]}
        """))
        XCTAssertEqual(p.prompt, "never mind")
        XCTAssertEqual(p.warnings.count, 1)
        XCTAssertTrue(p.warnings[0].contains("a"))
    }

    func testOptions() throws {
        XCTAssertEqual(try PlanTranscript.parseOptions(req(#"{"temperature":0}"#)), PlanOptions(temperature: nil, maximumResponseTokens: nil, sampling: .greedy))
        XCTAssertEqual(try PlanTranscript.parseOptions(req(#"{"temperature":0.7,"maxTokens":64,"seed":42}"#)),
                       PlanOptions(temperature: 0.7, maximumResponseTokens: 64, sampling: .nucleus(threshold: 1.0, seed: 42)))
        XCTAssertEqual(try PlanTranscript.parseOptions(req(#"{"topP":0.9}"#)),
                       PlanOptions(temperature: nil, maximumResponseTokens: nil, sampling: .nucleus(threshold: 0.9, seed: nil)))
        XCTAssertEqual(try PlanTranscript.parseOptions(nil), PlanOptions())
    }

    /// Values that would trap in Int(_: Double), or that Apple's model does not take, are
    /// refused with invalid_params instead of taking the host process down.
    func testOutOfRangeOptionsAreRefusedNotTrapped() {
        for (bad, what) in [(#"{"maxTokens":1e300}"#, "maxTokens"), (#"{"maxTokens":3e9}"#, "maxTokens"),
                            (#"{"seed":18446744073709551615}"#, "below 1.8e19"), (#"{"seed":1.85e19}"#, "below 1.8e19"),
                            (#"{"temperature":1.5}"#, "temperature"), (#"{"temperature":1e300}"#, "temperature")] {
            XCTAssertThrowsError(try PlanTranscript.parseOptions(req(bad))) { e in
                XCTAssertEqual((e as? OamError)?.code, "invalid_params", bad)
                XCTAssertTrue((e as? OamError)?.message.contains(what) ?? false, bad)
            }
        }
        XCTAssertEqual(try PlanTranscript.parseOptions(req(#"{"temperature":1,"maxTokens":2147483647}"#)).maximumResponseTokens, 2147483647)
    }

    /// A prewarm of the NPC's history and its next step (the same history plus the new user
    /// line) are built from the same session key, so the step can take the warm session over;
    /// any difference in instructions, tools or history gives another key.
    func testAPrewarmAndTheNextStepShareTheirSessionKey() throws {
        let history = #"{"role":"user","content":"hi"},{"role":"assistant","content":"Welcome."}"#
        let warm = try PlanTranscript.build(req(#"{"instructions":"You are Greta.","tools":[{"name":"look"}],"messages":[\#(history)]}"#), forCounting: true)
        let step = try PlanTranscript.build(req(#"{"instructions":"You are Greta.","tools":[{"name":"look"}],"messages":[\#(history),{"role":"user","content":"Any ale?"}]}"#))
        XCTAssertEqual(PlanSessionKey(warm), PlanSessionKey(step))
        let other = try PlanTranscript.build(req(#"{"instructions":"You are Brom.","tools":[{"name":"look"}],"messages":[\#(history),{"role":"user","content":"Any ale?"}]}"#))
        XCTAssertNotEqual(PlanSessionKey(warm), PlanSessionKey(other))
        let moreHistory = try PlanTranscript.build(req(#"{"instructions":"You are Greta.","tools":[{"name":"look"}],"messages":[\#(history),{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"user","content":"Any ale?"}]}"#))
        XCTAssertNotEqual(PlanSessionKey(warm), PlanSessionKey(moreHistory))
    }

    func testForCountingKeepsEverything() throws {
        let p = try PlanTranscript.build(req(#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#), forCounting: true)
        XCTAssertEqual(p.history.count, 2)
        XCTAssertEqual(p.prompt, "")
        XCTAssertEqual(try PlanTranscript.build(req(#"{"instructions":"x"}"#), forCounting: true).history, [])
    }

    func testErrorNamesFallback() {
        XCTAssertEqual(PlanErrorNames.code(forDescription: "FoundationModels.LanguageModelError.contextSizeExceeded(…)"), "context_size_exceeded")
        XCTAssertEqual(PlanErrorNames.code(forDescription: "GenerationError.exceededContextWindowSize(ctx)"), "context_size_exceeded")
        XCTAssertEqual(PlanErrorNames.code(forDescription: "unsupportedGenerationGuide(x)"), "invalid_schema")
        XCTAssertEqual(PlanErrorNames.code(forDescription: "guardrailViolation"), "guardrail_violation")
        XCTAssertNil(PlanErrorNames.code(forDescription: "ModelManagerError 1012"))
        for (_, code) in PlanErrorNames.table { XCTAssertTrue(stableCodes.contains(code), code) }
    }
}
