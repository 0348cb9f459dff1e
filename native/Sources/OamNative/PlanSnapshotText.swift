import Foundation

/// The words a streamed step pushes: FoundationModels' `streamResponse` hands out snapshots,
/// each the whole text so far; the host wants each piece once, in order. `delta(for:)` gives
/// what a snapshot adds to the text already pushed, or nil when it adds nothing or rewrites
/// earlier text (nothing can be taken back from the host: the step waits until a snapshot
/// extends what was said). Cut on UTF-8 bytes of whole strings, so never inside a character's
/// scalars.
///
/// Platform-independent: the Apple backend's streamed steps and the scripted backend's timed
/// ones (`chunkMs`) push through it, so Linux tests cover the code the Mac runs.
struct PlanSnapshotText {
    private(set) var said = ""

    mutating func delta(for snapshot: String) -> String? {
        guard snapshot.utf8.count > said.utf8.count, snapshot.utf8.starts(with: said.utf8) else { return nil }
        let added = String(decoding: snapshot.utf8.dropFirst(said.utf8.count), as: UTF8.self)
        said = snapshot
        return added
    }
}
