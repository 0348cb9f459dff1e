// UNVERIFIED at run time: FoundationModels does not run on Linux. The file compiles with 0
// errors and 0 warnings against the FoundationModels modules built from the macOS 26.5 and
// 27.0 SDK interfaces (native/scripts/check_sdk_interfaces.py). Spots marked `UNVERIFIED(n)`
// are listed in native/README.md ("Apple backend"). macOS-27-only API sits behind
// `#if canImport(FoundationModels, _version: 2.0)` (the 26.5 module is version 1.5.2, the
// 27.0 module 2.0.62.1.402: building with Xcode 27 selects it by itself) plus
// `#available(macOS 27.0, *)`.
//
// Everything that does not need FoundationModels lives in platform-independent files and is
// unit-tested on Linux: PlanTranscript (request -> entries / prompt / options), PlanSchema
// (JSON Schema -> neutral schema tree + warnings), PlanToolCollector (collect tool calls,
// quiet window, cancellation) and PlanErrorNames (error case-name fallback). This file only
// maps those neutral forms onto FoundationModels types.
#if canImport(FoundationModels)
import Foundation
import FoundationModels

@available(macOS 26.0, iOS 26.0, *)
final class AppleBackend: Backend, @unchecked Sendable {
    let name = "apple"
    private let model: SystemLanguageModel
    private let guardrails: String
    private let streamUntooled: Bool                 // stream the steps that offer no tool (config "stream")
    private let warmSession: LanguageModelSession?   // kept alive so the prewarm is not dropped
    private let lock = NSLock()
    private let gate = PlanStepGate()            // one step per NPC at a time, NPCs together
    private var warmed: [AppleWarmSession] = []  // prewarm(_:step:), oldest first
    private var carried: [String: [String]] = [:]  // npc -> warnings for its next step (late tool calls)
    private static let warmLimit = 16            // NPCs whose prewarmed session is kept

    init(config: JSON) throws {
        let g = config["guardrails"]?.string ?? "default"
        let guard_: SystemLanguageModel.Guardrails
        switch g {
        case "default":
            guard_ = .default
        case "permissive":
            // Apple documents that permissive guardrails do not apply to guided (schema) generation.
            guard_ = .permissiveContentTransformations
        default:
            throw OamError("invalid_request", "guardrails must be \"default\" or \"permissive\", got \(g)")
        }
        let m: SystemLanguageModel
        if let path = try adapterPath(config) {
            // npc/create's `model` on the native engine: a fine-tuned adapter for the system
            // model (Apple's adapter training toolkit writes the .fmadapter file).
            // UNVERIFIED(13): loading a real adapter file; its errors are Adapter.AssetError.
            do {
                let adapter = try SystemLanguageModel.Adapter(fileURL: URL(fileURLWithPath: path))
                m = SystemLanguageModel(adapter: adapter, guardrails: guard_)
            } catch {
                throw OamError("model_unavailable", "adapter \(path) did not load: \(PlanErrorNames.caseLabel(error) ?? "error"): \(error.localizedDescription)")
            }
        } else {
            m = SystemLanguageModel(useCase: .general, guardrails: guard_)
        }
        model = m
        guardrails = g
        // "untooled" (default): a step that offers no tool and asks for no schema streams its
        // words as the model writes them (`streamResponse`); "never": every step answers at
        // once (`respond`). Steps with tools always use `respond`: research.md measured a rare
        // upstream crash of streamResponse with tool calls (2 of 3 runs of 16,000 turns).
        switch config["stream"]?.string ?? "untooled" {
        case "untooled": streamUntooled = true
        case "never": streamUntooled = false
        case let other: throw OamError("invalid_request", "stream must be \"untooled\" or \"never\", got \(other)")
        }
        // Load the model while the host finishes setting up; the first step's time to first
        // token drops from ~1-3 s cold to ~0.6 s (docs/design-notes.md, "Context, latency, usage"). `"prewarm": false` opts out.
        if config["prewarm"]?.bool ?? true, m.isAvailable {
            let s = LanguageModelSession(model: m)
            // UNVERIFIED(9): an Apple engineer (forums thread 844222) says a prewarm applies to
            // its session instance; this one is never used, so at best it loads the model's
            // assets. Per-NPC warm sessions come from npc/prewarm (prewarm(_:step:)).
            s.prewarm()
            warmSession = s
        } else {
            warmSession = nil
        }
    }

    private var unavailableReason: String? {
        switch model.availability {
        case .available: return nil
        case .unavailable(let r): return "\(r)"
        }
    }

    private static var supportsToolCallingMode: Bool {
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, iOS 27.0, *) { return true }
        #endif
        return false
    }

    func info() -> JSON {
        let reason = unavailableReason
        var features: [JSON] = [.string("tools"), .string("schema"), .string("transcript")]
        if AppleBackend.supportsToolCallingMode { features.append(.string("toolCallingMode")) }
        return .object([
            "name": .string("native"), "backend": .string(name), "available": .bool(reason == nil),
            "reason": reason.map { .string($0) } ?? .null, "contextSize": .int(model.contextSize),
            "features": .array(features), "guardrails": .string(guardrails),
            // BCP 47 (minimal: "en", "zh-Hans"): a game checks the player's language before a turn
            "languages": .array(model.supportedLanguages.map(\.minimalIdentifier).sorted().map { .string($0) }),
        ])
    }

    // MARK: token counts

    /// `tokenCount(for:)` is async and 26.4+. oam_count_tokens is called on a host (foreign)
    /// thread, so waiting on a semaphore here is safe (it never runs on the cooperative pool).
    /// Falls back to the estimate before 26.4, on any failure, or after 2 s.
    func countTokens(_ request: JSON) throws -> Int {
        let estimate = estimateRequestTokens(request)
        guard #available(macOS 26.4, iOS 26.4, *) else { return estimate }
        guard model.isAvailable,
              let plan = try? PlanTranscript.build(request, forCounting: true),
              let built = try? AppleMapping.session(plan, collector: nil) else { return estimate }
        let entries = built.entries
        let box = AppleResultBox()
        let done = DispatchSemaphore(value: 0)
        let model = self.model
        Task.detached {
            defer { done.signal() }
            box.set(try? await model.tokenCount(for: entries))   // UNVERIFIED(5)
        }
        guard done.wait(timeout: .now() + 2) == .success, let n = box.get() else { return estimate }
        return n
    }

    // MARK: steps

    func start(_ request: JSON, step: StepState) throws {
        if let r = unavailableReason { throw OamError("model_unavailable", r) }
        let plan = try PlanTranscript.build(request)           // invalid_request

        var warnings = plan.warnings
        let schema: GenerationSchema?
        if let s = plan.schema {
            let converted = try PlanSchema.convert(s, rootName: "Answer")   // invalid_schema
            warnings += converted.warnings.map { "schema \($0)" }
            schema = try AppleMapping.generationSchema(converted)
        } else {
            schema = nil
        }
        if plan.toolMode == .required && !AppleBackend.supportsToolCallingMode {
            // The host's steering handles it (it sees no tool call and re-prompts or moves on).
            warnings.append("toolCallingMode required unsupported before macOS 27")
        }

        let npc = request["npcId"]?.string ?? ""
        let taskBox = AppleTaskBox()
        let inputEstimate = estimateRequestTokens(request)
        // Ends a step whose tool calls were delivered, once: when the model task has ended
        // (the tools throw once the calls are collected), or after `toolDrainMs` if
        // FoundationModels takes longer; calls that arrived late are named in a warning.
        let collectorRef = AppleCollectorRef()
        let finishToolCalls: @Sendable () -> Void = {
            guard taskBox.claimFinish(), let collector = collectorRef.collector else { return }
            let late = collector.takeLateCalls()
            let w = taskBox.warnings + (late.isEmpty ? [] : [PlanToolCollector.lateWarning(late)])
            step.finish(AppleBackend.doneEvent(reason: "tool_calls", input: inputEstimate,
                                              output: taskBox.toolCallTokens, cached: 0, warnings: w))
        }
        let collector = PlanToolCollector(quietMs: 25) { calls in
            step.push(.object(["type": .string("toolCalls"), "calls": .array(calls.map(\.json))]))
            taskBox.toolCallTokens = estimateTokens(JSON.array(calls.map(\.json)).serialized())
            // The collector closes itself after this returns: the suspended Tool.call()s throw
            // and the respond ends. Cancelling as well costs nothing if it is not passed on.
            taskBox.cancel()
            Task.detached {
                try? await Task.sleep(nanoseconds: AppleBackend.toolDrainMs * 1_000_000)
                finishToolCalls()
            }
        }
        collectorRef.collector = collector
        let built = try AppleMapping.session(plan, collector: collector)   // invalid_schema (tool parameters)
        warnings += built.warnings
        warnings += takeCarried(npc: npc)
        let options = AppleMapping.options(plan.options, toolMode: plan.toolMode)
        let stepWarnings = warnings
        taskBox.warnings = stepWarnings   // set before the task exists: no tool call can fire earlier

        // One step per NPC at a time; different NPCs' steps run together, each on its own
        // session (the system model schedules them). The NPC's previous model task may still
        // be draining: its next step waits for it, `drainMs` at most (PlanStepGate).
        let gate = self.gate
        let (mine, previous) = try gate.open(npc: npc)
        let warm = takeWarmSession(npc: npc, key: PlanSessionKey(plan))
        step.whenEnded { gate.end(npc: npc, serial: mine) }   // before the host sees the step end

        let model = self.model
        let streamed = streamUntooled && schema == nil && plan.tools.isEmpty
        let task = Task.detached { [weak self] in
            _ = await PlanStepGate.drain(previous, ms: AppleBackend.drainMs)
            defer {
                gate.finished(npc: npc, serial: mine)
                collector.close()
                // Calls later still (after the done event) go to the NPC's next step.
                let late = collector.takeLateCalls()
                if !late.isEmpty { self?.carry(npc: npc, PlanToolCollector.lateWarning(late)) }
            }
            if Task.isCancelled || step.isCancelled { return }
            do {
                let session: LanguageModelSession
                if let warm {
                    // UNVERIFIED(10): the prewarmed session, its tools rebound to this step.
                    warm.slot.collector = collector
                    session = warm.session
                } else {
                    session = LanguageModelSession(model: model, tools: built.tools,
                                                   transcript: Transcript(entries: built.entries))
                }
                let text: String
                var pushedText = ""
                var usage: (input: Int, output: Int, cached: Int)? = nil
                if let schema {
                    let r = try await session.respond(to: plan.prompt, schema: schema,
                                                      includeSchemaInPrompt: true, options: options)
                    text = r.content.jsonString
                    usage = AppleBackend.usage(of: r)
                } else if streamed {
                    // UNVERIFIED(12): each snapshot's content is the whole text so far; what it
                    // adds to the text already pushed is pushed now (a snapshot that rewrites
                    // earlier text adds nothing until it extends what was said).
                    var pushed = PlanSnapshotText()
                    for try await snapshot in session.streamResponse(to: plan.prompt, options: options) {
                        if let delta = pushed.delta(for: snapshot.content) { step.pushText(delta) }
                    }
                    text = ""   // pushed as it came
                    pushedText = pushed.said
                } else {
                    let r = try await session.respond(to: plan.prompt, options: options)
                    text = r.content
                    usage = AppleBackend.usage(of: r)
                }
                collector.close()
                if collector.hasDelivered { finishToolCalls(); return }   // tool calls ended the step
                if !text.isEmpty { step.push(.object(["type": .string("text"), "delta": .string(text)])) }
                let output = usage?.output ?? estimateTokens(text + pushedText)
                var reason = "stop"
                if let max = plan.options.maximumResponseTokens, usage != nil, output >= max { reason = "length" }
                step.finish(AppleBackend.doneEvent(reason: reason, input: usage?.input ?? inputEstimate,
                                                  output: output, cached: usage?.cached ?? 0, warnings: stepWarnings))
            } catch {
                collector.close()
                if collector.hasDelivered {          // the tools threw Collected: the calls end the step
                    finishToolCalls()
                } else {
                    step.fail(AppleBackend.map(error))
                }
            }
        }
        gate.started(npc: npc, serial: mine, task: task)
        taskBox.set(task)
        step.whenCancelled {
            taskBox.cancel()
            collector.close()
        }
    }

    // MARK: prewarm

    /// `npc/prewarm`: builds the session a step after these messages would build (the
    /// instructions with the tool definitions, then the history; the history may be empty or
    /// end with a response, as for counting) and prewarms it; nothing is generated. The
    /// session is kept for the NPC (the last `warmLimit` NPCs) so the prewarm is not dropped.
    /// Not a step for `busy`: it sends no request to the model.
    func prewarm(_ request: JSON, step: StepState) throws {
        if let r = unavailableReason { throw OamError("model_unavailable", r) }
        let plan = try PlanTranscript.build(request, forCounting: true)   // invalid_request
        let slot = AppleToolSlot()
        let built = try AppleMapping.session(plan, slot: slot)             // invalid_schema (tool parameters)
        let session = LanguageModelSession(model: model, tools: built.tools,
                                           transcript: Transcript(entries: built.entries))
        // the start of the NPC's next prompt when the host knows it (npc/prewarm's speaker:
        // `Bram: `); UNVERIFIED(10): the NPC's next step takes this session over
        let prefix = try promptPrefix(request)   // invalid_request
        session.prewarm(promptPrefix: prefix.map { Prompt($0) })
        let npc = request["npcId"]?.string ?? ""
        lock.lock()
        warmed.removeAll { $0.npc == npc }
        warmed.append(AppleWarmSession(npc: npc, key: PlanSessionKey(plan), session: session, slot: slot))
        if warmed.count > AppleBackend.warmLimit { warmed.removeFirst() }
        lock.unlock()
        step.finish(prewarmedEvent(warnings: plan.warnings + built.warnings))
    }

    /// The session `npc/prewarm` prewarmed for `npc`, when it was built from `key` (the step
    /// only adds its prompt); it is taken, once: a respond grows its transcript.
    private func takeWarmSession(npc: String, key: PlanSessionKey) -> AppleWarmSession? {
        lock.lock(); defer { lock.unlock() }
        guard let i = warmed.firstIndex(where: { $0.npc == npc }) else { return nil }
        let w = warmed.remove(at: i)
        return w.key == key ? w : nil
    }

    private func carry(npc: String, _ warning: String) {
        lock.lock(); carried[npc, default: []].append(warning); lock.unlock()
    }

    private func takeCarried(npc: String) -> [String] {
        lock.lock(); defer { lock.unlock() }
        return carried.removeValue(forKey: npc) ?? []
    }

    /// How long a step whose tool calls were delivered waits for the model task to end
    /// before it ends anyway (the tools throw at delivery, so this is a backstop).
    static let toolDrainMs: UInt64 = 250

    /// How long an NPC's step waits for the NPC's previous model task (draining after that
    /// step ended for the host) before it starts anyway.
    static let drainMs: UInt64 = 2_000

    static func doneEvent(reason: String, input: Int, output: Int, cached: Int, warnings: [String]) -> JSON {
        var o: [String: JSON] = [
            "type": .string("done"), "finishReason": .string(reason),
            "usage": .object(["inputTokens": .int(input), "outputTokens": .int(output), "cachedTokens": .int(cached)]),
        ]
        if !warnings.isEmpty { o["warnings"] = .array(warnings.map { .string($0) }) }
        return .object(o)
    }

    /// Response.usage exists only in the macOS 27 SDK. UNVERIFIED(7): shape and whether it is
    /// filled for SystemLanguageModel.
    static func usage(of r: LanguageModelSession.Response<String>) -> (input: Int, output: Int, cached: Int)? {
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, iOS 27.0, *) {
            let u = r.usage
            return (u.input.totalTokenCount, u.output.totalTokenCount, u.input.cachedTokenCount)
        }
        #endif
        return nil
    }

    static func usage(of r: LanguageModelSession.Response<GeneratedContent>) -> (input: Int, output: Int, cached: Int)? {
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, iOS 27.0, *) {
            let u = r.usage
            return (u.input.totalTokenCount, u.output.totalTokenCount, u.input.cachedTokenCount)
        }
        #endif
        return nil
    }

    // MARK: errors

    static func map(_ error: Error) -> OamError {
        if error is CancellationError { return OamError("cancelled", "cancelled") }
        if let e = error as? OamError { return e }
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, iOS 27.0, *) {
            // UNVERIFIED(8): the Xcode-27 error family; case names from Apple's docs.
            if let e = error as? LanguageModelError {
                switch e {
                case .contextSizeExceeded(let c):
                    return OamError("context_size_exceeded", "\(e)",
                                    data: ["promptTokens": .int(c.tokenCount), "contextSize": .int(c.contextSize)])
                case .rateLimited(let r):
                    return OamError("rate_limited", "\(e)", data: PlanErrorNames.retryAfter(r.resetDate))
                case .refusal: return OamError("refusal", "\(e)")
                case .timeout: return OamError("generation_failed", "timeout: \(e)")
                case .guardrailViolation: return OamError("guardrail_violation", "\(e)")
                case .unsupportedCapability: return OamError("invalid_request", "\(e)")
                case .unsupportedTranscriptContent: return OamError("invalid_request", "\(e)")
                case .unsupportedGenerationGuide: return OamError("invalid_schema", "\(e)")
                case .unsupportedLanguageOrLocale: return OamError("unsupported_language", "\(e)")
                @unknown default: return OamError("generation_failed", "\(e)")
                }
            }
            if error is LanguageModelSession.Error { return OamError("busy", "\(error)") }
            if error is SystemLanguageModel.Error { return OamError("model_unavailable", "\(error)") }
        }
        #endif
        if let e = error as? LanguageModelSession.GenerationError {
            switch e {
            case .exceededContextWindowSize: return OamError("context_size_exceeded", "\(e)")
            case .assetsUnavailable: return OamError("model_unavailable", "\(e)")
            case .guardrailViolation: return OamError("guardrail_violation", "\(e)")
            case .unsupportedGuide: return OamError("invalid_schema", "\(e)")
            case .unsupportedLanguageOrLocale: return OamError("unsupported_language", "\(e)")
            case .decodingFailure: return OamError("generation_failed", "\(e)")
            case .rateLimited: return OamError("rate_limited", "\(e)")
            case .concurrentRequests: return OamError("busy", "\(e)")
            case .refusal: return OamError("refusal", "\(e)")
            @unknown default: return OamError("generation_failed", "\(e)")
            }
        }
        if let e = error as? LanguageModelSession.ToolCallError {
            if e.underlyingError is CancellationError || e.underlyingError is PlanToolCollector.Collected {
                return OamError("cancelled", "cancelled")
            }
            return OamError("tool_failed", "\(e)")
        }
        if error is GenerationSchema.SchemaError { return OamError("invalid_schema", "\(error)") }
        // The typed matches miss when SDK and OS differ (forums 831404) and for error types
        // this build cannot name: the ModelManagerError chain, the case label, the type name.
        let (code, message) = PlanErrorNames.map(error)
        return OamError(code, message)
    }
}

// MARK: - mapping the neutral plan onto FoundationModels

/// A host-executed tool: `call` records the call and suspends until the step ends; it never
/// produces an output (the host runs the tool and sends the output in the next step).
@available(macOS 26.0, iOS 26.0, *)
struct AppleHostTool: Tool {
    typealias Arguments = GeneratedContent
    typealias Output = String
    let name: String
    let description: String
    let parameters: GenerationSchema
    let slot: AppleToolSlot

    func call(arguments: GeneratedContent) async throws -> String {
        guard let collector = slot.collector else { throw CancellationError() }
        let json = (try? JSON.parse(arguments.jsonString)) ?? .object([:])
        try await collector.record(name: name, arguments: json)
    }
}

@available(macOS 26.0, iOS 26.0, *)
enum AppleMapping {
    struct Built: Sendable {
        let tools: [any Tool]
        let entries: [Transcript.Entry]
        let warnings: [String]
    }

    /// The session's tools and transcript entries for a plan.
    static func session(_ plan: PlanTranscript, collector: PlanToolCollector?) throws -> Built {
        let slot = AppleToolSlot()
        slot.collector = collector
        return try session(plan, slot: slot)
    }

    /// The same, the tools reading their collector from `slot` (a prewarmed session's tools
    /// are rebound to the step that takes it over).
    static func session(_ plan: PlanTranscript, slot: AppleToolSlot) throws -> Built {
        var warnings: [String] = []
        var tools: [any Tool] = []
        var definitions: [Transcript.ToolDefinition] = []
        for t in plan.tools {
            let converted = try PlanSchema.convert(t.parameters, rootName: t.name)
            guard case .object = converted.root else {
                throw OamError("invalid_schema", "parameters of tool \(t.name) must be an object schema")
            }
            warnings += converted.warnings.map { "tool \(t.name) \($0)" }
            let params = try generationSchema(converted)
            tools.append(AppleHostTool(name: t.name, description: t.description, parameters: params, slot: slot))
            // UNVERIFIED(2): whether a session created from a transcript also injects its tools'
            // definitions itself (then these would be duplicates).
            definitions.append(Transcript.ToolDefinition(name: t.name, description: t.description, parameters: params))
        }

        var entries: [Transcript.Entry] = []
        if !plan.instructions.isEmpty || !definitions.isEmpty {
            entries.append(.instructions(Transcript.Instructions(
                id: "instructions", segments: text(plan.instructions, id: "instructions-text"),
                toolDefinitions: definitions)))
        }
        for e in plan.history {
            switch e {
            case .prompt(let id, let t):
                entries.append(.prompt(Transcript.Prompt(id: id, segments: text(t, id: id + "-text"))))
            case .response(let id, let t):
                entries.append(.response(Transcript.Response(id: id, assetIDs: [], segments: text(t, id: id + "-text"))))
            case .toolCalls(let id, let calls):
                var out: [Transcript.ToolCall] = []
                for c in calls {
                    let args: GeneratedContent
                    do { args = try GeneratedContent(json: c.argumentsJSON) } catch {
                        throw OamError("invalid_request", "arguments of tool call \(c.id) are not valid JSON: \(error)")
                    }
                    out.append(Transcript.ToolCall(id: c.id, toolName: c.name, arguments: args))
                }
                entries.append(.toolCalls(Transcript.ToolCalls(id: id, out)))
            case .toolOutput(let id, let toolName, let t):
                // id == the ToolCall.id it answers (docs/design-notes.md, "The framework's tool loop": a mismatch fails inference).
                entries.append(.toolOutput(Transcript.ToolOutput(id: id, toolName: toolName,
                                                                 segments: text(t, id: id + "-output"))))
            }
        }
        return Built(tools: tools, entries: entries, warnings: warnings)
    }

    private static func text(_ s: String, id: String) -> [Transcript.Segment] {
        [.text(Transcript.TextSegment(id: id, content: s))]
    }

    static func options(_ o: PlanOptions, toolMode: PlanToolMode) -> GenerationOptions {
        var opts = GenerationOptions(temperature: o.temperature, maximumResponseTokens: o.maximumResponseTokens)
        let sampling: GenerationOptions.SamplingMode?
        switch o.sampling {
        case .greedy?: sampling = .greedy
        case .nucleus(let p, let seed)?: sampling = .random(probabilityThreshold: p, seed: seed)
        case nil: sampling = nil
        }
        if let sampling {
            #if canImport(FoundationModels, _version: 2.0)
            opts.samplingMode = sampling     // UNVERIFIED(6): the 27 SDK renames `sampling` (back-deployed)
            #else
            opts.sampling = sampling
            #endif
        }
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, iOS 27.0, *) {
            // UNVERIFIED(6): GenerationOptions.toolCallingMode (27 only). `.required` applies to
            // every step of Apple's internal loop, but our tools never return, so the step ends
            // at the first round of calls.
            switch toolMode {
            case .allowed: opts.toolCallingMode = .allowed
            case .required: opts.toolCallingMode = .required
            case .disallowed: opts.toolCallingMode = .disallowed
            }
        }
        #endif
        return opts
    }

    static func generationSchema(_ s: PlanSchema) throws -> GenerationSchema {
        do {
            return try GenerationSchema(root: dynamic(s.root), dependencies: s.dependencies.map(dynamic))
        } catch {
            throw OamError("invalid_schema", "\(error)")
        }
    }

    static func dynamic(_ n: PlanSchemaNode) -> DynamicGenerationSchema {
        switch n {
        case .object(let name, let description, let properties):
            return DynamicGenerationSchema(name: name, description: description, properties: properties.map {
                DynamicGenerationSchema.Property(name: $0.name, description: $0.description,
                                                 schema: dynamic($0.node), isOptional: $0.isOptional)
            })
        case .choices(let name, let description, let values):
            return DynamicGenerationSchema(name: name, description: description, anyOf: values)
        case .union(let name, let description, let members):
            return DynamicGenerationSchema(name: name, description: description, anyOf: members.map(dynamic))
        case .array(let items, let minItems, let maxItems):
            return DynamicGenerationSchema(arrayOf: dynamic(items), minimumElements: minItems, maximumElements: maxItems)
        case .string:
            return DynamicGenerationSchema(type: String.self)
        case .integer(let lo, let hi):
            var guides: [GenerationGuide<Int>] = []
            if let lo, let hi { guides.append(.range(lo...hi)) }
            else if let lo { guides.append(.minimum(lo)) }
            else if let hi { guides.append(.maximum(hi)) }
            return DynamicGenerationSchema(type: Int.self, guides: guides)
        case .number(let lo, let hi):
            var guides: [GenerationGuide<Double>] = []
            if let lo, let hi { guides.append(.range(lo...hi)) }
            else if let lo { guides.append(.minimum(lo)) }
            else if let hi { guides.append(.maximum(hi)) }
            return DynamicGenerationSchema(type: Double.self, guides: guides)
        case .boolean:
            return DynamicGenerationSchema(type: Bool.self)
        case .reference(let name):
            return DynamicGenerationSchema(referenceTo: name)
        }
    }
}

/// Holds the step's model task so the tool collector (which may fire before the task
/// handle is stored) and the cancel hook can cancel it.
final class AppleTaskBox: @unchecked Sendable {
    private let lock = NSLock()
    private var task: Task<Void, Never>?
    private var cancelled = false
    private var finishClaimed = false
    private var _toolCallTokens = 0
    private var _warnings: [String] = []
    /// True for the first caller only: who ends a step whose tool calls were delivered.
    func claimFinish() -> Bool {
        lock.lock(); defer { lock.unlock() }
        if finishClaimed { return false }
        finishClaimed = true
        return true
    }
    var toolCallTokens: Int {
        get { lock.lock(); defer { lock.unlock() }; return _toolCallTokens }
        set { lock.lock(); _toolCallTokens = newValue; lock.unlock() }
    }
    var warnings: [String] {
        get { lock.lock(); defer { lock.unlock() }; return _warnings }
        set { lock.lock(); _warnings = newValue; lock.unlock() }
    }

    func set(_ t: Task<Void, Never>) {
        lock.lock()
        task = t
        let c = cancelled
        lock.unlock()
        if c { t.cancel() }
    }

    func cancel() {
        lock.lock()
        cancelled = true
        let t = task
        lock.unlock()
        t?.cancel()
    }
}

/// The collector a session's tools hand their calls to; set by the step that uses the session.
final class AppleToolSlot: @unchecked Sendable {
    private let lock = NSLock()
    private var _collector: PlanToolCollector?
    var collector: PlanToolCollector? {
        get { lock.lock(); defer { lock.unlock() }; return _collector }
        set { lock.lock(); _collector = newValue; lock.unlock() }
    }
}

/// Lets the step's finish closure, made before the collector, reach it.
final class AppleCollectorRef: @unchecked Sendable {
    private let lock = NSLock()
    private var _collector: PlanToolCollector?
    var collector: PlanToolCollector? {
        get { lock.lock(); defer { lock.unlock() }; return _collector }
        set { lock.lock(); _collector = newValue; lock.unlock() }
    }
}

@available(macOS 26.0, iOS 26.0, *)
struct AppleWarmSession: @unchecked Sendable {   // the session is @unchecked Sendable; the slot's lock guards its collector
    let npc: String
    let key: PlanSessionKey
    let session: LanguageModelSession
    let slot: AppleToolSlot
}

final class AppleResultBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Int?
    func set(_ v: Int?) { lock.lock(); value = v; lock.unlock() }
    func get() -> Int? { lock.lock(); defer { lock.unlock() }; return value }
}
#endif
