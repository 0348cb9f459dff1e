import Foundation

/// Maps a FoundationModels error to a stable code without naming its type: the fallback when
/// the typed matches in AppleBackend.swift miss. They miss when SDK and OS differ (Apple
/// forums 831404), and for an app built with the 27 SDK whose errors arrive as
/// `LanguageModelError`, `SystemLanguageModel.Error` or `LanguageModelSession.Error` where
/// the code was compiled for `GenerationError` only.
///
/// Order: the framework's `ModelManagerError` codes anywhere in the NSError underlying-error
/// chain (`modelManagerCode`), then the enum case label (`Mirror`: a case with a payload, as
/// most FoundationModels error cases have, is labelled with its name whatever the type's
/// `description` says; a case without one, as 27's `LanguageModelSession.Error.concurrentRequests`,
/// has no label and is named by its plain description), then the type name, then a case name
/// found in the reflected text.
enum PlanErrorNames {
    /// (case name, stable code), most specific first.
    static let table: [(String, String)] = [
        ("exceededContextWindowSize", "context_size_exceeded"),
        ("contextSizeExceeded", "context_size_exceeded"),
        ("guardrailViolation", "guardrail_violation"),
        ("refusal", "refusal"),
        ("rateLimited", "rate_limited"),
        ("quotaLimitReached", "rate_limited"),
        ("concurrentRequests", "busy"),
        ("transcriptMutationWhileResponding", "busy"),
        ("unsupportedLanguageOrLocale", "unsupported_language"),
        ("unsupportedGenerationGuide", "invalid_schema"),
        ("unsupportedGuide", "invalid_schema"),
        ("undefinedReferences", "invalid_schema"),
        ("duplicateProperty", "invalid_schema"),
        ("duplicateType", "invalid_schema"),
        ("emptyTypeChoices", "invalid_schema"),
        ("unsupportedTranscriptContent", "invalid_request"),
        ("unsupportedCapability", "invalid_request"),
        ("assetsUnavailable", "model_unavailable"),
        ("serviceUnavailable", "model_unavailable"),
        ("networkFailure", "model_unavailable"),
        ("decodingFailure", "generation_failed"),
        ("timeout", "generation_failed"),
    ]

    /// Error types (as `String(reflecting:)` ends) whose every case means one code. The
    /// 27 SDK's `LanguageModelSession.Error` has only busy cases (`concurrentRequests`,
    /// `transcriptMutationWhileResponding`); `SystemLanguageModel.Error` only `assetsUnavailable`.
    static let types: [(String, String)] = [
        ("LanguageModelSession.Error", "busy"),
        ("SystemLanguageModel.Error", "model_unavailable"),
    ]

    /// `ModelManagerError` codes seen wrapped as underlying errors of an NSError: (stable code,
    /// the case name, what the game can do). Names as another public binding decoded them from
    /// ModelManagerServices on macOS 27.0 (issue 34); 1042 and 1046 have no name there.
    /// docs/design-notes.md ("Context, latency, usage") records 1012 under load. The system
    /// refusing work for a while is `busy` (retry later), a failure of one request is
    /// `generation_failed` (retry now); a code not listed maps to `generation_failed`, its
    /// domain and code kept in the message. UNVERIFIED(11): not seen on a Mac by this project.
    static let modelManagerCodes: [Int: (code: String, name: String, hint: String)] = [
        1012: ("busy", "insufficientSystemResources", "the system is short of resources; retry later"),
        1013: ("busy", "deniedDueToSystemState", "denied by the system's state (memory pressure); free memory, retry later"),
        1026: ("model_unavailable", "unknown", "the model is not available"),
        1032: ("generation_failed", "inferenceProviderCrashed", "the inference service crashed and restarts; retry"),
        1041: ("generation_failed", "ipcError", "the connection to the inference service failed; retry"),
        1042: ("busy", "unknown", "retry later"),
        1046: ("generation_failed", "unknown", "retry"),
    ]

    /// `retryAfterMs` for a rate limit that says when it resets (27's `RateLimited.resetDate`):
    /// the milliseconds from `now`, at least 0; nothing without a date or past a day.
    static func retryAfter(_ reset: Date?, now: Date = Date()) -> [String: JSON] {
        guard let reset else { return [:] }
        let ms = max(0, reset.timeIntervalSince(now) * 1000)
        guard ms <= 86_400_000 else { return [:] }
        return ["retryAfterMs": .int(Int(ms.rounded()))]
    }

    /// How deep `modelManagerError` follows underlying errors (chains are short; a cycle
    /// must not loop forever).
    static let maxChainDepth = 8

    /// The stable code for a reflected error description, or nil when no case name matches.
    static func code(forDescription text: String) -> String? {
        for (name, code) in table where text.contains(name) { return code }
        return nil
    }

    /// The enum case name of `error`: the label of a case with a payload, else the plain
    /// description of a case without one when it is just a name; nil for a non-enum.
    static func caseLabel(_ error: Error) -> String? {
        let m = Mirror(reflecting: error)
        guard m.displayStyle == .enum else { return nil }
        if let label = m.children.first?.label { return label }
        let plain = String(describing: error)
        return !plain.isEmpty && plain.allSatisfy({ $0.isLetter || $0.isNumber }) ? plain : nil
    }

    /// The first NSError in `error`'s underlying-error chain (itself included;
    /// `NSUnderlyingErrorKey`, then each of `NSMultipleUnderlyingErrorsKey`, depth first)
    /// whose domain names `ModelManagerError`, with its domain and code.
    static func modelManagerError(_ error: Error) -> (domain: String, code: Int)? {
        func walk(_ e: NSError, _ depth: Int) -> (String, Int)? {
            if e.domain.contains("ModelManager") { return (e.domain, e.code) }
            guard depth < maxChainDepth else { return nil }
            var next: [NSError] = []
            if let u = e.userInfo[NSUnderlyingErrorKey] as? NSError { next.append(u) }
            if let us = e.userInfo["NSMultipleUnderlyingErrorsKey"] as? [NSError] { next += us }
            for u in next { if let hit = walk(u, depth + 1) { return hit } }
            return nil
        }
        return walk(error as NSError, 0).map { (domain: $0.0, code: $0.1) }
    }

    /// (stable code, message) for an error the typed matches did not name.
    static func map(_ error: Error) -> (code: String, message: String) {
        if let (domain, n) = modelManagerError(error) {
            guard let known = modelManagerCodes[n] else {
                return ("generation_failed", "\(domain) \(n) (unknown code): \(error.localizedDescription)")
            }
            return (known.code, "\(domain) \(n) \(known.name) (\(known.hint)): \(error.localizedDescription)")
        }
        let typeName = String(reflecting: type(of: error))
        if let label = caseLabel(error), let hit = table.first(where: { $0.0 == label }) {
            return (hit.1, "\(typeName).\(label): \(error.localizedDescription)")
        }
        if let hit = types.first(where: { typeName.hasSuffix($0.0) }) {
            return (hit.1, "\(typeName): \(error.localizedDescription)")
        }
        let text = String(reflecting: error)
        return (code(forDescription: text) ?? "generation_failed", text)
    }
}
