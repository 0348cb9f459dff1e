import Foundation

// Platform-independent half of the Apple backend: StepRequest JSON -> a neutral plan
// (transcript entries, enabled tools, tool mode, options, respond prompt). AppleBackend.swift
// only maps this plan onto FoundationModels types. Compiled and tested on every platform.

enum PlanToolMode: String, Sendable, Equatable {
    case allowed, required, disallowed
}

/// A tool call as the host sees it: `arguments` is a JSON object.
struct PlanToolCall: Sendable, Equatable {
    let id: String
    let name: String
    let arguments: JSON

    /// The arguments as JSON text (what `GeneratedContent(json:)` takes).
    var argumentsJSON: String { arguments.serialized() }

    var json: JSON {
        .object(["id": .string(id), "name": .string(name), "arguments": arguments])
    }
}

struct PlanTool: Sendable, Equatable {
    let name: String
    let description: String
    let parameters: JSON
}

/// One transcript entry, in a form that maps 1:1 onto `Transcript.Entry`.
enum PlanEntry: Sendable, Equatable {
    case prompt(id: String, text: String)
    case response(id: String, text: String)
    case toolCalls(id: String, calls: [PlanToolCall])
    /// `id` is the id of the tool call this output answers (Transcript.ToolOutput.id must
    /// equal Transcript.ToolCall.id, or inference fails).
    case toolOutput(id: String, toolName: String, text: String)
}

enum PlanSampling: Sendable, Equatable {
    case greedy
    case nucleus(threshold: Double, seed: UInt64?)
}

struct PlanOptions: Sendable, Equatable {
    var temperature: Double?
    var maximumResponseTokens: Int?
    var sampling: PlanSampling?
}

struct PlanTranscript: Sendable {
    /// Largest `options.maxTokens` taken (larger: invalid_params; the context is far smaller).
    static let maxMaxTokens = Int(Int32.max)
    var instructions: String
    /// The step's tools as the host gave them (their definitions go into the instructions
    /// entry and into the session). The host sends none on a disallowed step.
    var tools: [PlanTool]
    var toolMode: PlanToolMode
    /// Every entry before the respond prompt (the instructions entry is not included).
    var history: [PlanEntry]
    /// The text passed to `respond(to:)`: the last user message, or "" when the history ends
    /// with tool outputs (the model continues from them).
    var prompt: String
    var continuesAfterToolOutput: Bool
    var schema: JSON?
    var options: PlanOptions
    var warnings: [String]

    /// Builds the plan, validating the request. Throws `OamError("invalid_request", …)`.
    /// `forCounting`: for token counts (oam_count_tokens) — the history may be empty or end
    /// with any message, and nothing is taken out of it as the respond prompt.
    static func build(_ request: JSON, forCounting: Bool = false) throws -> PlanTranscript {
        guard request.object != nil else { throw OamError("invalid_request", "step request must be a JSON object") }
        var warnings: [String] = []

        let instructions: String
        switch request["instructions"] {
        case nil, .some(.null): instructions = ""
        case .some(.string(let s)): instructions = s
        default: throw OamError("invalid_request", "instructions must be a string")
        }

        let modeText = request["toolMode"]?.string ?? "allowed"
        guard let mode = PlanToolMode(rawValue: modeText) else {
            throw OamError("invalid_request", "unknown toolMode \(modeText)")
        }

        // Tools
        var tools: [PlanTool] = []
        var toolNames = Set<String>()
        switch request["tools"] {
        case nil, .some(.null): break
        case .some(.array(let arr)):
            for t in arr {
                guard let name = t["name"]?.string, !name.isEmpty else {
                    throw OamError("invalid_request", "every tool needs a non-empty name")
                }
                guard toolNames.insert(name).inserted else {
                    throw OamError("invalid_request", "duplicate tool name \(name)")
                }
                let params = t["parameters"] ?? .object(["type": .string("object")])
                guard params.object != nil else {
                    throw OamError("invalid_request", "parameters of tool \(name) must be a JSON Schema object")
                }
                tools.append(PlanTool(name: name, description: t["description"]?.string ?? "", parameters: params))
            }
        default: throw OamError("invalid_request", "tools must be an array")
        }
        // Tools are used as the host gives them, also on a disallowed step: the host decides
        // what a step shows (it sends none there), and a call the model makes anyway is
        // reported as made; the host's agent ignores it with a warning.
        if mode == .required && tools.isEmpty {
            throw OamError("invalid_request", "toolMode required needs at least one tool")
        }

        // Messages -> entries
        let messages: [JSON]
        switch request["messages"] {
        case .some(.array(let a)) where !a.isEmpty || forCounting: messages = a
        case nil where forCounting, .some(.null) where forCounting: messages = []
        default: throw OamError("invalid_request", "messages must be a non-empty array")
        }
        var entries: [PlanEntry] = []
        var callNames: [String: String] = [:]  // call id -> tool name, for every call seen
        var answered = Set<String>()
        var pending: [String] = []            // call ids of the latest toolCalls entry not yet answered
        func flushPending(before what: String) {
            if !pending.isEmpty {
                warnings.append("tool calls \(pending.joined(separator: ", ")) have no tool output before the \(what)")
                pending = []
            }
        }

        for (i, m) in messages.enumerated() {
            guard m.object != nil, let role = m["role"]?.string else {
                throw OamError("invalid_request", "message \(i) needs a role")
            }
            let content: String
            switch m["content"] {
            case nil, .some(.null): content = ""
            case .some(.string(let s)): content = s
            default: throw OamError("invalid_request", "message \(i): content must be a string")
            }
            switch role {
            case "user":
                flushPending(before: "user message \(i)")
                entries.append(.prompt(id: "prompt-\(i)", text: content))
            case "assistant":
                flushPending(before: "assistant message \(i)")
                var calls: [PlanToolCall] = []
                for (j, c) in (m["toolCalls"]?.array ?? []).enumerated() {
                    guard let id = c["id"]?.string, !id.isEmpty else {
                        throw OamError("invalid_request", "message \(i): tool call \(j) needs an id")
                    }
                    guard let name = c["name"]?.string, !name.isEmpty else {
                        throw OamError("invalid_request", "message \(i): tool call \(id) needs a name")
                    }
                    guard callNames[id] == nil else {
                        throw OamError("invalid_request", "message \(i): duplicate tool call id \(id)")
                    }
                    var args = c["arguments"] ?? .object([:])
                    if args == .null { args = .object([:]) }
                    if case .string(let text) = args, let parsed = try? JSON.parse(text) { args = parsed }
                    guard args.object != nil else {
                        throw OamError("invalid_request", "message \(i): arguments of tool call \(id) must be an object")
                    }
                    callNames[id] = name
                    calls.append(PlanToolCall(id: id, name: name, arguments: args))
                }
                // A text preamble before the calls becomes its own Response entry.
                if !content.isEmpty || calls.isEmpty {
                    entries.append(.response(id: "response-\(i)", text: content))
                }
                if !calls.isEmpty {
                    entries.append(.toolCalls(id: "calls-\(i)", calls: calls))
                    pending = calls.map(\.id)
                }
            case "tool":
                guard let callId = m["toolCallId"]?.string, !callId.isEmpty else {
                    throw OamError("invalid_request", "message \(i): tool message needs toolCallId")
                }
                guard let callName = callNames[callId] else {
                    throw OamError("invalid_request", "message \(i): toolCallId \(callId) answers no earlier tool call")
                }
                guard answered.insert(callId).inserted else {
                    throw OamError("invalid_request", "message \(i): tool call \(callId) already has an output")
                }
                if let n = m["name"]?.string, !n.isEmpty, n != callName {
                    throw OamError("invalid_request", "message \(i): tool output name \(n) does not match call \(callId) (\(callName))")
                }
                pending.removeAll { $0 == callId }
                entries.append(.toolOutput(id: callId, toolName: callName, text: content))
            default:
                throw OamError("invalid_request", "message \(i): unknown role \(role)")
            }
        }

        // Choose the respond prompt.
        let prompt: String
        let continues: Bool
        switch entries.last {
        case _ where forCounting:
            prompt = ""
            continues = false
        case .prompt(_, let text)?:
            entries.removeLast()
            prompt = text
            continues = false
        case .toolOutput?:
            if !pending.isEmpty {
                warnings.append("tool calls \(pending.joined(separator: ", ")) have no tool output; continuing anyway")
            }
            prompt = ""
            continues = true
        default:
            throw OamError("invalid_request", "the last message must be a user message or a tool output")
        }

        return PlanTranscript(instructions: instructions, tools: tools, toolMode: mode, history: entries,
                              prompt: prompt, continuesAfterToolOutput: continues,
                              schema: { if let s = request["schema"], s != .null { return s }; return nil }(),
                              options: try parseOptions(request["options"]), warnings: warnings)
    }

    static func parseOptions(_ o: JSON?) throws -> PlanOptions {
        var out = PlanOptions()
        guard let o, o != .null else { return out }
        guard o.object != nil else { throw OamError("invalid_request", "options must be an object") }
        func number(_ key: String) throws -> Double? {
            switch o[key] {
            case nil, .some(.null): return nil
            case .some(let v):
                guard let d = v.double else { throw OamError("invalid_request", "options.\(key) must be a number") }
                return d
            }
        }
        if let t = try number("temperature") {
            // Apple documents 0...1 for GenerationOptions.temperature.
            guard t >= 0, t <= 1 else { throw OamError("invalid_params", "options.temperature must be in [0, 1] on Apple's model, got \(t)") }
            out.temperature = t
        }
        if let m = try number("maxTokens") {
            guard m >= 1, m == m.rounded() else { throw OamError("invalid_request", "options.maxTokens must be a positive integer") }
            // Int(_: Double) traps beyond Int's range: refuse before converting.
            guard m <= Double(PlanTranscript.maxMaxTokens) else {
                throw OamError("invalid_params", "options.maxTokens must be at most \(PlanTranscript.maxMaxTokens), got \(m)")
            }
            out.maximumResponseTokens = Int(m)
        }
        var seed: UInt64?
        if let s = try number("seed") {
            guard s >= 0, s == s.rounded() else { throw OamError("invalid_request", "options.seed must be a non-negative integer") }
            // UInt64(_: Double) traps at 2^64 and beyond; a Double that large is no exact seed anyway.
            guard s < 1.8e19 else { throw OamError("invalid_params", "options.seed must be below 1.8e19 on Apple's model, got \(s)") }
            seed = o["seed"]?.int.map { UInt64($0) } ?? UInt64(s)
        }
        if let p = try number("topP") {
            guard p > 0, p <= 1 else { throw OamError("invalid_request", "options.topP must be in (0, 1]") }
            out.sampling = .nucleus(threshold: p, seed: seed)
        } else if out.temperature == 0 {
            out.sampling = .greedy       // temperature 0: deterministic decoding
            out.temperature = nil
        } else if let seed {
            out.sampling = .nucleus(threshold: 1.0, seed: seed)
        }
        return out
    }
}

/// What a session is built from: the instructions, the tools and the history before the
/// respond prompt. The Apple backend keeps the session an `npc/prewarm` prewarmed (Apple: a
/// prewarm applies to that session instance) and lets the NPC's next step take it over when
/// the step's key equals the prewarm's, i.e. the step only adds its prompt.
struct PlanSessionKey: Sendable, Equatable {
    let instructions: String
    let tools: [PlanTool]
    let history: [PlanEntry]

    init(_ plan: PlanTranscript) {
        instructions = plan.instructions
        tools = plan.tools
        history = plan.history
    }
}
