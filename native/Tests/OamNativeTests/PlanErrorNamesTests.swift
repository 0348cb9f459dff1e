import Foundation
import XCTest
@testable import OamNative

// Stand-ins shaped like FoundationModels' 27 SDK errors (most cases carry a payload; the
// session's busy cases do not) whose descriptions do not contain the case name, as
// LocalizedError types' debug text need not.
struct FakeContext: Sendable { let debugDescription = "details" }
enum LanguageModelError: LocalizedError {
    case contextSizeExceeded(FakeContext)
    case guardrailViolation(FakeContext)
    case rateLimited(FakeContext)
    var errorDescription: String? { "The operation couldn't be completed." }
}
enum LanguageModelSession {
    enum Error: LocalizedError {
        case concurrentRequests(FakeContext)
        case somethingNew(FakeContext)
        var errorDescription: String? { "Session error." }
    }
}
/// 27's `LanguageModelSession.Error` shape: cases without a payload.
enum PayloadFree: LocalizedError {
    case transcriptMutationWhileResponding
    case refusal
    var errorDescription: String? { "Something happened." }
}
enum SystemLanguageModel {
    enum Error: LocalizedError {
        case unknownFutureCase(FakeContext)
        var errorDescription: String? { "Model error." }
    }
}

final class PlanErrorNamesTests: XCTestCase {
    /// The case label, not the description, names the error: what the 27 SDK's errors need
    /// when the code was compiled for GenerationError only.
    func testTheCaseLabelNamesAnErrorWhoseTextDoesNot() {
        XCTAssertNil(PlanErrorNames.code(forDescription: LanguageModelError.guardrailViolation(FakeContext()).localizedDescription))
        XCTAssertEqual(PlanErrorNames.map(LanguageModelError.guardrailViolation(FakeContext())).code, "guardrail_violation")
        XCTAssertEqual(PlanErrorNames.map(LanguageModelError.contextSizeExceeded(FakeContext())).code, "context_size_exceeded")
        XCTAssertEqual(PlanErrorNames.map(LanguageModelError.rateLimited(FakeContext())).code, "rate_limited")
        XCTAssertEqual(PlanErrorNames.map(LanguageModelSession.Error.concurrentRequests(FakeContext())).code, "busy")
    }

    /// A case without a payload has no Mirror label: its plain description is its name.
    func testACaseWithoutAPayloadIsNamedToo() {
        XCTAssertEqual(PlanErrorNames.caseLabel(PayloadFree.transcriptMutationWhileResponding), "transcriptMutationWhileResponding")
        XCTAssertEqual(PlanErrorNames.map(PayloadFree.transcriptMutationWhileResponding).code, "busy")
        XCTAssertEqual(PlanErrorNames.map(PayloadFree.refusal).code, "refusal")
    }

    /// A case the table does not know is named by its type where the whole type means one code.
    func testTheTypeNameNamesAnUnknownCase() {
        XCTAssertEqual(PlanErrorNames.map(LanguageModelSession.Error.somethingNew(FakeContext())).code, "busy")
        XCTAssertEqual(PlanErrorNames.map(SystemLanguageModel.Error.unknownFutureCase(FakeContext())).code, "model_unavailable")
        XCTAssertEqual(PlanErrorNames.caseLabel(SystemLanguageModel.Error.unknownFutureCase(FakeContext())), "unknownFutureCase")
    }

    /// ModelManagerError codes wrapped as underlying errors (single or multiple) are found.
    func testModelManagerCodesAreFoundInTheUnderlyingErrorChain() {
        let mm = NSError(domain: "ModelManagerServices.ModelManagerError", code: 1012)
        let wrapped = NSError(domain: "FoundationModels.GenerationError", code: -1,
                              userInfo: [NSUnderlyingErrorKey: NSError(domain: "com.apple.inference", code: 7,
                                                                       userInfo: [NSUnderlyingErrorKey: mm])])
        XCTAssertEqual(PlanErrorNames.modelManagerError(wrapped)?.code, 1012)
        let r = PlanErrorNames.map(wrapped)
        XCTAssertEqual(r.code, "busy", "insufficientSystemResources: the system refuses for a while")
        XCTAssertTrue(r.message.contains("1012 insufficientSystemResources") && r.message.contains("retry later"), r.message)

        let multi = NSError(domain: "x", code: 1, userInfo: ["NSMultipleUnderlyingErrorsKey": [
            NSError(domain: "y", code: 2), NSError(domain: "ModelManagerServices.ModelManagerError", code: 1026)]])
        XCTAssertEqual(PlanErrorNames.map(multi).code, "model_unavailable")
        func manager(_ n: Int) -> (code: String, message: String) {
            PlanErrorNames.map(NSError(domain: "ModelManagerServices.ModelManagerError", code: n))
        }
        XCTAssertEqual(manager(1013).code, "busy")
        XCTAssertTrue(manager(1013).message.contains("free memory"), manager(1013).message)
        XCTAssertEqual(manager(1032).code, "generation_failed", "inferenceProviderCrashed: retry now")
        XCTAssertEqual(manager(1041).code, "generation_failed", "ipcError is no rate limit")
        XCTAssertEqual(manager(1042).code, "busy")
        XCTAssertEqual(manager(1046).code, "generation_failed", "retryable until its meaning is known")
        XCTAssertEqual(manager(4242).code, "generation_failed")
        XCTAssertTrue(manager(4242).message.contains("4242 (unknown code)"), manager(4242).message)
    }

    /// A chain deeper than maxChainDepth (or a cycle) ends the walk.
    func testTheChainWalkIsBounded() {
        var e = NSError(domain: "ModelManagerServices.ModelManagerError", code: 1012)
        for i in 0...PlanErrorNames.maxChainDepth { e = NSError(domain: "wrap", code: i, userInfo: [NSUnderlyingErrorKey: e]) }
        XCTAssertNil(PlanErrorNames.modelManagerError(e))
        XCTAssertEqual(PlanErrorNames.map(e).code, "generation_failed")
    }

    /// An error that is none of these keeps the description fallback.
    func testTheDescriptionIsTheLastResort() {
        struct Opaque: Error, CustomStringConvertible { var description: String { "GenerationError.rateLimited(...)" } }
        XCTAssertEqual(PlanErrorNames.map(Opaque()).code, "rate_limited")
        XCTAssertEqual(PlanErrorNames.map(NSError(domain: "x", code: 1)).code, "generation_failed")
    }

    /// A rate limit's reset date is passed on as `retryAfterMs` (27's `RateLimited.resetDate`).
    func testARateLimitsResetDateIsRetryAfterMs() {
        let now = Date()
        XCTAssertEqual(PlanErrorNames.retryAfter(now.addingTimeInterval(2.5), now: now), ["retryAfterMs": .int(2500)])
        XCTAssertEqual(PlanErrorNames.retryAfter(now.addingTimeInterval(-1), now: now), ["retryAfterMs": .int(0)])
        XCTAssertEqual(PlanErrorNames.retryAfter(nil, now: now), [:])
        XCTAssertEqual(PlanErrorNames.retryAfter(now.addingTimeInterval(2 * 86_400), now: now), [:])
        let e = OamError("rate_limited", "slow down", data: PlanErrorNames.retryAfter(now.addingTimeInterval(1), now: now))
        XCTAssertTrue(e.errorEvent.contains("\"retryAfterMs\":1000"), e.errorEvent)
    }
}
