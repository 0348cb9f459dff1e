using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Threading;
using System.Threading.Tasks;

namespace Oam.Bridge
{
    /// <summary>
    /// A running turn, returned by <see cref="OamBridgeClient.RespondAsync"/>,
    /// <see cref="OamBridgeClient.DecideAsync"/> and <see cref="OamBridgeClient.PrewarmAsync"/>. Await it (or
    /// <see cref="Completion"/>) for the <see cref="TurnResult"/>; it faults with an
    /// <see cref="OamBridgeException"/> on <c>turn/failed</c> (<c>Code == "cancelled"</c> for a
    /// cancelled turn) or when the bridge exits (<c>Code == "transport"</c>). It completes through
    /// <see cref="OamBridgeClient.Dispatch"/>, after the turn's last event was raised.
    /// </summary>
    public sealed class Turn
    {
        readonly OamBridgeClient _client;
        readonly TaskCompletionSource<TurnResult> _done =
            new TaskCompletionSource<TurnResult>(TaskCreationOptions.RunContinuationsAsynchronously);
        string _text = "";
        string _json = "";
        string _speaker;

        internal Turn(OamBridgeClient client, string npcId, string turnId, string kind)
        {
            _client = client;
            NpcId = npcId;
            TurnId = turnId;
            Kind = kind;
        }

        public string NpcId { get; }
        public string TurnId { get; }
        /// <summary><c>respond</c>, <c>decide</c> or <c>prewarm</c> (<see cref="TurnKinds"/>).</summary>
        public string Kind { get; }
        /// <summary>Who said the prompt (from <c>turn/started</c>): null for the player or before the turn started.</summary>
        public string Speaker => Volatile.Read(ref _speaker);
        public Task<TurnResult> Completion => _done.Task;
        public TaskAwaiter<TurnResult> GetAwaiter() => _done.Task.GetAwaiter();

        /// <summary>The text to show so far (deltas applied, reset after a tool round). Updated on the dispatch thread.</summary>
        public string Text => Volatile.Read(ref _text);

        /// <summary>Schema turns: the JSON text streamed so far.</summary>
        public string PartialJson => Volatile.Read(ref _json);

        /// <summary><c>npc/cancel</c> for this turn's NPC: cancels this turn and every queued turn of the NPC.</summary>
        public Task<IReadOnlyList<string>> CancelAsync(CancellationToken cancellationToken = default(CancellationToken)) =>
            _client.CancelAsync(NpcId, cancellationToken);

        internal void Apply(TurnEvent e)
        {
            if (e is TurnStartedEvent s)
                Volatile.Write(ref _speaker, s.Speaker);
            else if (e is TextDeltaEvent d)
                Volatile.Write(ref _text, d.Text ?? ((d.IsReset ? "" : _text) + d.Delta));
            else if (e is PartialJsonEvent j)
                Volatile.Write(ref _json, j.Json ?? (_json + j.Delta));
            else if (e is TurnCompletedEvent c)
                Volatile.Write(ref _text, c.Result.Text);
        }

        internal void Finish(TurnEvent e)
        {
            if (e is TurnCompletedEvent c) _done.TrySetResult(c.Result);
            else if (e is TurnFailedEvent f) _done.TrySetException(f.ToException());
        }

        internal void Fail(Exception error) => _done.TrySetException(error);
    }
}
