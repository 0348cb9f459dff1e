import Foundation

/// Deterministic backend for tests and for platforms without an on-device model.
///
/// config: {"backend":"scripted","script":[step...]} where a step is one of
///   {"text":"Hello there"}                      streamed word by word
///   {"toolCalls":[{"name":"x","arguments":{}}]} ("id" optional; generated if absent)
///   {"json":{...}}                              the JSON answer, in 16-character text deltas
///   {"error":"guardrail_violation","message":"..."}
/// each with optional "delayMs" (a wait before the step) and "chunkMs" (before each chunk); both cancellable.
/// Each oam_step_start consumes the next script step; with none left, the step echoes
/// "You said: <last user message>".
final class ScriptedBackend: Backend, @unchecked Sendable {
    let name = "scripted"
    private let lock = NSLock()
    private var script: [JSON]
    private var cursor = 0
    private var callCounter = 0
    let contextSize: Int

    init(config: JSON) throws {
        if let s = config["script"], s != .null {
            guard let arr = s.array else { throw OamError("invalid_request", "script must be an array") }
            for step in arr where step.object == nil {
                throw OamError("invalid_request", "script steps must be objects")
            }
            script = arr
        } else {
            script = []
        }
        contextSize = config["contextSize"]?.int ?? 4096
    }

    func info() -> JSON {
        .object([
            "name": .string("native"), "backend": .string(name), "available": .bool(true),
            "reason": .null, "contextSize": .int(contextSize),
            "features": .array([.string("streaming"), .string("tools"), .string("schema"), .string("scripted")]),
        ])
    }

    func countTokens(_ request: JSON) throws -> Int { estimateRequestTokens(request) }

    private func nextScriptStep() -> (JSON?, Int) {
        lock.lock(); defer { lock.unlock() }
        let base = callCounter
        callCounter += 1
        guard cursor < script.count else { return (nil, base) }
        defer { cursor += 1 }
        return (script[cursor], base)
    }

    func start(_ request: JSON, step: StepState) throws {
        let toolMode = request["toolMode"]?.string ?? "allowed"
        guard ["allowed", "required", "disallowed"].contains(toolMode) else {
            throw OamError("invalid_request", "unknown toolMode \(toolMode)")
        }
        let (scripted, serial) = nextScriptStep()
        let inputTokens = estimateRequestTokens(request)
        let thread = Thread {
            ScriptedBackend.run(scripted, serial: serial, request: request, toolMode: toolMode,
                                inputTokens: inputTokens, step: step)
        }
        thread.stackSize = 512 * 1024
        thread.start()
    }

    private static func done(_ step: StepState, input: Int, output: Int, reason: String) {
        step.finish(.object([
            "type": .string("done"),
            "usage": .object(["inputTokens": .int(input), "outputTokens": .int(output), "cachedTokens": .int(0)]),
            "finishReason": .string(reason),
        ]))
    }

    /// Splits "Hello big world" into ["Hello", " big", " world"] (whitespace kept).
    static func words(_ text: String) -> [String] {
        var out: [String] = []
        var cur = ""
        var inWord = false
        for ch in text {
            if ch.isWhitespace {
                if inWord { out.append(cur); cur = ""; inWord = false }
                cur.append(ch)
            } else {
                inWord = true
                cur.append(ch)
            }
        }
        if !cur.isEmpty { out.append(cur) }
        return out
    }

    private static func run(_ scripted: JSON?, serial: Int, request: JSON, toolMode: String,
                            inputTokens: Int, step: StepState) {
        let delay = scripted?["delayMs"]?.int ?? 0
        let chunkDelay = scripted?["chunkMs"]?.int ?? 0
        func wait() -> Bool { delay <= 0 ? !step.isCancelled : step.sleep(ms: delay) }

        guard let s = scripted else {
            streamText("You said: " + lastUserMessage(request), delay: 0, input: inputTokens, step: step)
            return
        }
        guard wait() else { return }
        if let code = s["error"]?.string {
            let c = stableCodes.contains(code) ? code : "generation_failed"
            step.fail(OamError(c, s["message"]?.string ?? "scripted error: \(code)"))
            return
        }
        if let calls = s["toolCalls"]?.array {
            if toolMode == "disallowed" {
                step.fail(OamError("invalid_request", "script step has tool calls but toolMode is disallowed"))
                return
            }
            var out: [JSON] = []
            for (i, c) in calls.enumerated() {
                guard let name = c["name"]?.string else {
                    step.fail(OamError("invalid_request", "scripted tool call without name")); return
                }
                let id = c["id"]?.string ?? "call_\(serial)_\(i)"
                out.append(.object(["id": .string(id), "name": .string(name),
                                    "arguments": c["arguments"] ?? .object([:])]))
            }
            if let pre = s["text"]?.string, !pre.isEmpty {  // a preamble before the calls
                for p in words(pre) { step.push(.object(["type": .string("text"), "delta": .string(p)])) }
            }
            step.push(.object(["type": .string("toolCalls"), "calls": .array(out)]))
            done(step, input: inputTokens, output: estimateTokens(JSON.array(out).serialized()), reason: "tool_calls")
            return
        }
        if let j = s["json"] {
            // 16-character chunks, as the Python scripted engine streams JSON
            let chars = Array(j.serialized())
            var parts: [String] = []
            var i = 0
            while i < chars.count { parts.append(String(chars[i..<min(i + 16, chars.count)])); i += 16 }
            streamParts(parts, delay: chunkDelay, input: inputTokens, step: step)
            return
        }
        streamText(s["text"]?.string ?? "", delay: chunkDelay, input: inputTokens, step: step)
    }

    private static func streamText(_ text: String, delay: Int, input: Int, step: StepState) {
        streamParts(words(text), delay: delay, input: input, step: step)
    }

    private static func streamParts(_ parts: [String], delay: Int, input: Int, step: StepState) {
        for p in parts {
            if delay > 0 { guard step.sleep(ms: delay) else { return } }
            else if step.isCancelled { return }
            step.push(.object(["type": .string("text"), "delta": .string(p)]))
        }
        done(step, input: input, output: parts.count, reason: "stop")
    }
}
