import XCTest
@testable import OamNative

final class PlanSnapshotTextTests: XCTestCase {
    /// Each snapshot's new text once, in order; a repeat or a rewrite adds nothing until the
    /// text extends what was said.
    func testEachSnapshotPushesWhatItAdds() {
        var s = PlanSnapshotText()
        XCTAssertEqual(s.delta(for: "Wel"), "Wel")
        XCTAssertEqual(s.delta(for: "Welcome"), "come")
        XCTAssertNil(s.delta(for: "Welcome"), "the same snapshot again")
        XCTAssertNil(s.delta(for: "Hello there, traveller"), "a rewrite cannot be taken back")
        XCTAssertEqual(s.delta(for: "Welcome, traveller"), ", traveller")
        XCTAssertEqual(s.said, "Welcome, traveller")
    }

    /// Multi-byte characters are never split: the pieces join to the text, scalar by scalar.
    func testPiecesAreWholeCharacters() {
        var s = PlanSnapshotText()
        let text = "héllo wörld 😀 ok"
        var pieces: [String] = []
        var sofar = ""
        for ch in text {
            sofar.append(ch)
            if let d = s.delta(for: sofar) { pieces.append(d) }
        }
        XCTAssertEqual(pieces.joined(), text)
        XCTAssertEqual(pieces.count, text.count)
    }
}
