import Foundation

/// Deterministic backend for tests and for platforms without an on-device model.
///
/// config: {"backend":"scripted","script":[step...]} where a step is one of
///   {"text":"Hello there"}                      streamed word by word
///   {"toolCalls":[{"name":"x","arguments":{}}]} ("id" optional; generated if absent)
///   {"json":{...}}                              the JSON answer, in 16-character text deltas
///   {"error":"guardrail_violation","message":"...","data":{"retryAfterMs":1500}}   (data optional)
///   {"echo":"instructions"} / {"echo":"prompt"}    says the step's instructions, or its last user
///                                               message, as the model was given them
/// each with optional "delayMs" (a wait before the step) and "chunkMs" (before each chunk); both cancellable.
/// Each oam_step_start consumes the next script step; with none left, the step echoes
/// "You said: <last user message>" (or answers `{}` when the request has a schema).
///
/// Chunking is the Python scripted engine's (`\S+\s*|\s+`): each word keeps the whitespace
/// that follows it; leading whitespace is a chunk of its own. JSON answers are cut every
/// 16 Unicode scalars (Python's `body[i:i+16]`).
///
/// A step without delayMs/chunkMs is produced inline in `start`: its deltas are cut on
/// UTF-8 bytes and queued 4096 per lock (no thread, no per-delta allocation); the first
/// oam_step_pull takes them all. A step with a delay runs on a thread of its own.
final class ScriptedBackend: Backend, @unchecked Sendable {
    let name = "scripted"
    private let lock = NSLock()
    private var script: [JSON]   // immutable after init
    private var cursor = 0       // guarded by lock
    private var callCounter = 0  // guarded by lock
    private let gate = PlanStepGate()  // one step per NPC at a time, NPCs together (as the Apple backend)
    let contextSize: Int
    private let languages: JSON
    private let adapter: String?

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
        // "adapter": the Apple backend's fine-tuned adapter file (npc/create's `model` on the
        // native engine). Here the file must exist, as Apple's loader needs it to; what it
        // holds is not read (Apple's loader checks it: AppleBackend).
        adapter = try adapterPath(config)
        if let l = config["languages"], l != .null {
            guard let arr = l.array, arr.allSatisfy({ $0.string != nil }) else {
                throw OamError("invalid_request", "languages must be an array of strings")
            }
            languages = .array(arr)
        } else {
            languages = .null
        }
    }

    func info() -> JSON {
        .object([
            "name": .string("native"), "backend": .string(name), "available": .bool(true),
            "reason": .null, "contextSize": .int(contextSize),
            "features": .array([.string("streaming"), .string("tools"), .string("schema"), .string("scripted")]),
            "languages": languages,   // config "languages" (tests); null: not known
            "adapter": adapter.map { .string($0) } ?? .null,
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
        let npc = request["npcId"]?.string ?? ""
        let gate = self.gate
        let opened = try gate.open(npc: npc)
        step.whenEnded { gate.end(npc: npc, serial: opened.serial) }
        let (scripted, serial) = nextScriptStep()
        let inputTokens = estimateRequestTokens(request)
        let delayed = (scripted?["delayMs"]?.int ?? 0) > 0 || (scripted?["chunkMs"]?.int ?? 0) > 0
        if !delayed {
            ScriptedBackend.run(scripted, serial: serial, request: request, toolMode: toolMode,
                                inputTokens: inputTokens, step: step)
            return
        }
        let thread = Thread {
            ScriptedBackend.run(scripted, serial: serial, request: request, toolMode: toolMode,
                                inputTokens: inputTokens, step: step)
        }
        thread.stackSize = 512 * 1024
        thread.start()
    }

    private static func done(_ step: StepState, input: Int, output: Int, reason: String, warnings: JSON?) {
        var event: [String: JSON] = [
            "type": .string("done"),
            "usage": .object(["inputTokens": .int(input), "outputTokens": .int(output), "cachedTokens": .int(0)]),
            "finishReason": .string(reason),
        ]
        if let w = warnings?.array { event["warnings"] = .array(w) }  // a step's scripted warnings
        step.finish(.object(event))
    }

    /// Python's str.isspace() (what `\s` matches in a str pattern).
    @inline(__always)
    static func isSpace(_ v: UInt32) -> Bool {
        switch v {
        case 0x09...0x0D, 0x1C...0x20, 0x85, 0xA0, 0x1680, 0x2000...0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
            return true
        default:
            return false
        }
    }

    /// Word cuts (end offsets) in UTF-8 bytes: a delta ends where a non-space follows a space,
    /// and at the end of the text.
    static func wordCuts(_ b: UnsafeBufferPointer<UInt8>) -> [Int] {
        var cuts: [Int] = []
        cuts.reserveCapacity(b.count / 4 + 1)
        var i = 0
        var prevSpace = false
        let n = b.count
        while i < n {
            let c = b[i]
            let v: UInt32, len: Int
            if c < 0x80 {
                v = UInt32(c); len = 1
            } else if c < 0xE0 {
                v = (UInt32(c & 0x1F) << 6) | UInt32(b[i + 1] & 0x3F); len = 2
            } else if c < 0xF0 {
                v = (UInt32(c & 0x0F) << 12) | (UInt32(b[i + 1] & 0x3F) << 6) | UInt32(b[i + 2] & 0x3F); len = 3
            } else {
                v = 0x10000; len = 4  // never a space
            }
            let space = isSpace(v)
            if !space && prevSpace && i > 0 { cuts.append(i) }
            prevSpace = space
            i += len
        }
        if n > 0 { cuts.append(n) }
        return cuts
    }

    /// Cuts every `every` Unicode scalars (and at the end).
    static func scalarCuts(_ b: UnsafeBufferPointer<UInt8>, every: Int) -> [Int] {
        var cuts: [Int] = []
        var k = 0
        for i in 0..<b.count where b[i] & 0xC0 != 0x80 {
            if k > 0 && k % every == 0 { cuts.append(i) }
            k += 1
        }
        if b.count > 0 { cuts.append(b.count) }
        return cuts
    }

    /// Splits "Hello big world" into ["Hello ", "big ", "world"] (the Python engine's chunks).
    static func words(_ text: String) -> [String] {
        var text = text
        return text.withUTF8 { b in
            var prev = 0
            return wordCuts(b).map { c in
                defer { prev = c }
                return String(decoding: UnsafeBufferPointer(rebasing: b[prev..<c]), as: UTF8.self)
            }
        }
    }

    private static func run(_ scripted: JSON?, serial: Int, request: JSON, toolMode: String,
                            inputTokens: Int, step: StepState) {
        let delay = scripted?["delayMs"]?.int ?? 0
        let chunkDelay = scripted?["chunkMs"]?.int ?? 0
        func wait() -> Bool { delay <= 0 ? !step.isCancelled : step.sleep(ms: delay) }

        guard let s = scripted else {
            if let schema = request["schema"], schema != .null {
                stream("{}", cutter: { scalarCuts($0, every: 16) }, delay: 0, input: inputTokens, warnings: nil, step: step)
            } else {
                stream("You said: " + lastUserMessage(request), cutter: wordCuts, delay: 0, input: inputTokens,
                       warnings: nil, step: step)
            }
            return
        }
        guard wait() else { return }
        if let code = s["error"]?.string {
            let c = stableCodes.contains(code) ? code : "generation_failed"
            var data: [String: JSON] = [:]
            for key in ["retryAfterMs", "promptTokens", "contextSize"] {
                if let v = s["data"]?[key]?.int, v >= 0 { data[key] = .int(v) }
            }
            step.fail(OamError(c, s["message"]?.string ?? "scripted error: \(code)", data: data))
            return
        }
        if let calls = s["toolCalls"]?.array {
            // Reported whatever the step's toolMode: the engine says what the model did, and
            // the host's agent decides (a call on a disallowed step is ignored with a warning).
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
                for p in words(pre) { step.pushText(p) }
            }
            step.push(.object(["type": .string("toolCalls"), "calls": .array(out)]))
            done(step, input: inputTokens, output: estimateTokens(JSON.array(out).serialized()), reason: "tool_calls",
                 warnings: s["warnings"])
            return
        }
        if let echo = s["echo"]?.string {
            let said = echo == "instructions" ? (request["instructions"]?.string ?? "") : lastUserMessage(request)
            stream(said, cutter: wordCuts, delay: chunkDelay, input: inputTokens, warnings: s["warnings"], step: step)
            return
        }
        if let j = s["json"] {
            stream(j.serialized(), cutter: { scalarCuts($0, every: 16) }, delay: chunkDelay, input: inputTokens,
                   warnings: s["warnings"], step: step)
            return
        }
        stream(s["text"]?.string ?? "", cutter: wordCuts, delay: chunkDelay, input: inputTokens,
               warnings: s["warnings"], step: step)
    }

    /// Streams `text` cut by `cutter`: without a delay, 4096 deltas per lock (bytes copied
    /// straight into the step's batch buffers), else one delta per `delay` ms.
    private static func stream(_ text: String, cutter: (UnsafeBufferPointer<UInt8>) -> [Int], delay: Int,
                               input: Int, warnings: JSON?, step: StepState) {
        var text = text
        let parts: Int? = text.withUTF8 { b in
            let cuts = cutter(b)
            if delay <= 0 {
                // In slices, so the step's lock is never held for long.
                var k = 0, prev = 0
                while k < cuts.count {
                    if step.isCancelled { return nil }
                    let m = min(k + 4096, cuts.count)
                    step.pushTexts(b, cuts: cuts[k..<m], from: prev)
                    prev = cuts[m - 1]
                    k = m
                }
                return cuts.count
            }
            // Timed: each chunk as a snapshot of the text so far, pushed through the diff the
            // Apple backend's streamed steps use (PlanSnapshotText), so Linux tests cover it.
            var pushed = PlanSnapshotText()
            for c in cuts {
                guard step.sleep(ms: delay) else { return nil }
                if let d = pushed.delta(for: String(decoding: UnsafeBufferPointer(rebasing: b[0..<c]), as: UTF8.self)) {
                    step.pushText(d)
                }
            }
            return cuts.count
        }
        if let parts { done(step, input: input, output: parts, reason: "stop", warnings: warnings) }
    }
}
