// Runs engine_clients/scenario.json against the real bridge with OamBridgeClient; the same
// checks as engine_clients/shell/test.sh, plus a few for the rest of the API. Built and run by
// ../run_tests.sh together with the README's csharp blocks (extracted to .build/Readme*.g.cs:
// QuickStart and GameLayer).
//
//   mono ScenarioTest.exe SCENARIO_JSON REPO_ROOT      (OAM_BRIDGE_CMD overrides the bridge command)
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;
using Oam.Bridge;

static class ScenarioTest
{
    static readonly TimeSpan StepTimeout = TimeSpan.FromSeconds(20);
    // the game-layer steps of scenario.json, run between restore and unknown_npc by GameLayerSteps
    static readonly string[] NewSteps =
    {
        "world_set", "create_guard", "world_set_scoped", "world_get_for_npc", "decide", "guardrail_fallback",
        "npc_to_npc", "prewarm", "set_tags", "world_get_after_tags", "world_delete",
    };
    static int _failures;

    static void Ok(string what) => Console.WriteLine("ok   - " + what);

    static void Fail(string what)
    {
        Console.WriteLine("FAIL - " + what);
        _failures++;
    }

    static void Check(string what, bool condition, Func<string> detail = null)
    {
        if (condition) Ok(what);
        else Fail(what + (detail != null ? ": " + detail() : ""));
    }

    static string J(JToken t) => t == null ? "null" : t.ToString(Formatting.None);

    static async Task<T> Within<T>(Task<T> task, string what)
    {
        if (await Task.WhenAny(task, Task.Delay(StepTimeout)) != task)
            throw new TimeoutException(what + ": no answer within " + StepTimeout.TotalSeconds + " s");
        return await task;
    }

    static async Task Within(Task task, string what)
    {
        if (await Task.WhenAny(task, Task.Delay(StepTimeout)) != task)
            throw new TimeoutException(what + ": no answer within " + StepTimeout.TotalSeconds + " s");
        await task;
    }

    static int Main(string[] args)
    {
        if (args.Length != 2)
        {
            Console.Error.WriteLine("usage: ScenarioTest.exe SCENARIO_JSON REPO_ROOT");
            return 2;
        }
        try
        {
            MainLoop.Run(() => RunAsync(args[0], args[1]));
        }
        catch (Exception e)
        {
            Fail("test aborted: " + e.GetBaseException());
        }
        Console.WriteLine(_failures == 0 ? "unity client: PASS" : "unity client: FAIL (" + _failures + ")");
        return _failures == 0 ? 0 : 1;
    }

    static async Task RunAsync(string scenarioPath, string root)
    {
        var scenario = JObject.Parse(File.ReadAllText(scenarioPath));
        Func<string, JObject> step = name =>
            (JObject)scenario["steps"].First(s => (string)s["name"] == name)["request"]["params"];
        foreach (string name in NewSteps)
            if (!scenario["steps"].Any(s => (string)s["name"] == name)) Fail("scenario.json has no step " + name);

        string cmd = Environment.GetEnvironmentVariable("OAM_BRIDGE_CMD");
        bool overridden = !string.IsNullOrWhiteSpace(cmd);
        if (!overridden) cmd = Path.Combine(root, ".venv/bin/python") + " -m bridge --engine scripted";
        string[] parts = cmd.Trim().Split(new[] { ' ' }, 2, StringSplitOptions.RemoveEmptyEntries);

        var stderr = new ConcurrentQueue<string>();
        int mainThread = Thread.CurrentThread.ManagedThreadId;
        using (var bridge = OamBridgeClient.Start(parts[0], parts.Length > 1 ? parts[1] : "", root, stderr.Enqueue))
        {
            // like the Unity layer: events, handlers and turn completions run on the "main" thread
            bridge.Dispatch = MainLoop.Post;
            try
            {
                await Scenario(bridge, step, mainThread);
            }
            finally
            {
                if (_failures > 0)
                    foreach (var line in stderr) Console.WriteLine("# bridge stderr: " + line);
            }
        }

        await TransportFailure();
        // the exe lives in engine_clients/unity/.build/
        await EarlyEvents(Path.Combine(AppDomain.CurrentDomain.BaseDirectory, "..", "Tests~", "early_events_bridge.sh"));

        if (overridden) Console.WriteLine("skip - README quick start and game layer (OAM_BRIDGE_CMD is set; they use .venv)");
        else
        {
            string text = await Within(QuickStart.RunAsync(root), "quick start");
            Check("README quick start returns the echo", text == "You said: Let me in", () => text);
            string game = await Within(GameLayer.RunAsync(root), "README game layer");
            const string expected = "prewarmed | question | fallback: Let's talk about something else. | "
                                    + "Quiet, Greta. (world revision 4) | ale price, gate, history of the keep, season";
            Check("README game layer runs as printed", game == expected, () => game);
        }
    }

    static async Task Scenario(OamBridgeClient bridge, Func<string, JObject> step, int mainThread)
    {
        // ---- initialize
        JObject init = step("initialize");
        var info = await Within(bridge.InitializeAsync((string)init["clientInfo"]["name"], (string)init["clientInfo"]["version"]),
            "initialize");
        Check("initialize", info.ProtocolVersion == 1 && info.ServerName != null, () => J(info.Raw));

        // ---- create the keeper from the scenario's params
        JObject create = step("create_keeper");
        var config = new NpcConfig((string)create["npcId"])
        {
            Engine = (string)create["engine"],
            Instructions = (string)create["instructions"],
            Script = (JArray)create["script"],
        };
        foreach (JObject t in create["tools"])
            config.Tools.Add(new ToolDefinition((string)t["name"], (string)t["description"], (JObject)t["parameters"]));
        var npc = await Within(bridge.CreateNpcAsync(config), "npc/create");
        Check("create", npc.NpcId == "keeper" && npc.Engine == "scripted", () => npc.NpcId + " " + npc.Engine);

        // expected values come from the keeper's script
        JArray script = config.Script;
        JObject scriptedCall = (JObject)script[0]["toolCalls"][0];
        string toolText = (string)script[1]["text"];
        JToken schemaJson = script[2]["json"];
        var toolOutput = new JObject { ["count"] = 3 };

        // the tool handler answers turn/toolCallRequested; the client submits its output
        var handlerThreads = new List<int>();
        bridge.RegisterTool(config.NpcId, (string)scriptedCall["name"], args =>
        {
            handlerThreads.Add(Thread.CurrentThread.ManagedThreadId);
            return toolOutput;
        });
        var submissions = new List<ToolCallSubmission>();
        var firstSubmission = new TaskCompletionSource<bool>();
        bridge.ToolCallSubmitted += s =>
        {
            submissions.Add(s);
            firstSubmission.TrySetResult(true);
        };

        var events = new List<TurnEvent>();
        var eventThreads = new HashSet<int>();
        bridge.EventReceived += e =>
        {
            events.Add(e);
            eventThreads.Add(Thread.CurrentThread.ManagedThreadId);
        };

        // ---- respond_with_tool
        events.Clear();
        Turn turn = await Within(bridge.RespondAsync("keeper", (string)step("respond_with_tool")["prompt"]), "npc/respond");
        TurnResult result = await Within(turn.Completion, "tool turn");
        CheckSequence("tool turn", events, turn.TurnId, "keeper");
        Check("tool turn: started first", events.FirstOrDefault() is TurnStartedEvent);
        var requested = events.OfType<ToolCallRequestedEvent>().FirstOrDefault();
        Check("tool turn: toolCallRequested check_inventory(ale)",
            requested != null && requested.Name == (string)scriptedCall["name"]
                              && JToken.DeepEquals(requested.Arguments, scriptedCall["arguments"]),
            () => J(requested?.Params));
        // ToolCallSubmitted follows the npc/submit response, which may be read after the turn's last event
        await Task.WhenAny(firstSubmission.Task, Task.Delay(StepTimeout));
        Check("submit accepted", submissions.Count == 1 && submissions[0].Accepted && submissions[0].Call.CallId == requested?.CallId,
            () => submissions.Count + " submissions, " + submissions.FirstOrDefault()?.SubmitError);
        Check("tool handler ran on the dispatch thread", handlerThreads.Count == 1 && handlerThreads[0] == mainThread,
            () => string.Join(",", handlerThreads));
        var completedCall = events.OfType<ToolCallCompletedEvent>().FirstOrDefault();
        Check("tool turn: toolCallCompleted output",
            completedCall != null && completedCall.CallId == requested?.CallId && JToken.DeepEquals(completedCall.Output, toolOutput),
            () => J(completedCall?.Params));
        string deltas = string.Concat(events.OfType<TextDeltaEvent>().Select(d => d.Delta));
        Check("tool turn: deltas concatenate to text", deltas == toolText && turn.Text == toolText, () => deltas);
        var last = events.LastOrDefault() as TurnCompletedEvent;
        Check("tool turn: completed",
            last != null && last.Result.Text == toolText && result.Text == toolText
            && result.ToolCalls.Count > 0 && result.ToolCalls[0].Name == (string)scriptedCall["name"]
            && JToken.DeepEquals(result.ToolCalls[0].Output, toolOutput),
            () => J(events.LastOrDefault()?.Params));

        // ---- schema_turn
        events.Clear();
        JObject schemaParams = step("schema_turn");
        turn = await Within(bridge.RespondAsync("keeper", (string)schemaParams["prompt"],
            new RespondOptions { Schema = (JObject)schemaParams["schema"] }), "npc/respond (schema)");
        result = await Within(turn.Completion, "schema turn");
        CheckSequence("schema turn", events, turn.TurnId, "keeper");
        Check("schema turn: completed json",
            events.LastOrDefault() is TurnCompletedEvent && JToken.DeepEquals(result.Json, schemaJson), () => J(result.Json));

        // ---- cancel_turn: npc/cancel after the first delta
        events.Clear();
        Task<IReadOnlyList<string>> cancel = null;
        string deltaTurn = null;
        Action<TextDeltaEvent> cancelOnFirstDelta = d =>
        {
            if (cancel != null) return;
            deltaTurn = d.TurnId;
            cancel = bridge.CancelAsync("keeper");
        };
        bridge.TextDelta += cancelOnFirstDelta;
        turn = await Within(bridge.RespondAsync("keeper", (string)step("cancel_turn")["prompt"]), "npc/respond (cancel)");
        OamBridgeException failure = null;
        try
        {
            await Within(turn.Completion, "cancelled turn");
        }
        catch (OamBridgeException e)
        {
            failure = e;
        }
        bridge.TextDelta -= cancelOnFirstDelta;
        CheckSequence("cancel turn", events, turn.TurnId, "keeper");
        if (cancel == null) Fail("cancel lists turn: no textDelta arrived");
        else
        {
            var cancelled = await Within(cancel, "npc/cancel");
            Check("cancel lists turn", cancelled.Contains(turn.TurnId) && deltaTurn == turn.TurnId, () => string.Join(",", cancelled));
        }
        Check("cancel turn: failed cancelled",
            events.LastOrDefault() is TurnFailedEvent f && f.Code == "cancelled" && !events.OfType<TurnCompletedEvent>().Any()
            && events.OfType<TextDeltaEvent>().Any(),
            () => J(events.LastOrDefault()?.Params));
        Check("cancel turn: the Turn task faults with OamBridgeException cancelled",
            failure != null && failure.Code == ErrorCodes.Cancelled && failure.RpcCode == -31009 && !failure.Retryable,
            () => failure?.ToString() ?? "no exception");
        Check("events were raised on the dispatch thread", eventThreads.Count == 1 && eventThreads.Contains(mainThread),
            () => string.Join(",", eventThreads));

        // ---- transcript + restore
        JObject save = await Within(bridge.GetTranscriptAsync("keeper"), "npc/transcript");
        Check("transcript is an object", save != null && save.Type == JTokenType.Object);
        var restored = await Within(bridge.RestoreAsync(save, "keeper2"), "npc/restore");
        Check("restore", restored.NpcId == "keeper2" && restored.Turns >= 2, () => restored.NpcId + " " + restored.Turns);

        // ---- the game layer: world facts, a decision, guardrail fallback, NPC-to-NPC, prewarm, tags
        await GameLayerSteps(bridge, step, events);

        // ---- unknown npc
        try
        {
            var t = await Within(bridge.RespondAsync("nobody", "hi"), "npc/respond (unknown npc)");
            Fail("unknown npc accepted: " + t.TurnId);
        }
        catch (OamBridgeException e)
        {
            Check("unknown_npc error", e.RpcCode == -31020 && e.Code == "unknown_npc", () => e.ToString());
        }

        // ---- extra: the rest of the API
        var list = await Within(bridge.ListAsync(), "npc/list");
        Check("extra: list has keeper and keeper2",
            list.Any(n => n.NpcId == "keeper" && n.Turns >= 2) && list.Any(n => n.NpcId == "keeper2"),
            () => string.Join(",", list.Select(n => n.NpcId + ":" + n.Turns)));
        var count = await Within(bridge.CountTokensAsync("How much for a room?", npcId: "keeper"), "tokens/count");
        Check("extra: tokens/count", count.Tokens > 0 && count.PromptTokens.HasValue && count.ContextSize > 0,
            () => count.Tokens + " " + count.PromptTokens + " " + count.ContextSize);
        var status = await Within(bridge.GetEngineStatusAsync(), "engine/status");
        Check("extra: engine/status lists scripted", status.Engines.Any(e => e.Name == "scripted" && e.Available),
            () => J(status.Raw));
        await Within(bridge.ResetAsync("keeper2"), "npc/reset");
        await Within(bridge.DeleteAsync("keeper2"), "npc/delete");
        list = await Within(bridge.ListAsync(), "npc/list");
        Check("extra: reset + delete keeper2", list.All(n => n.NpcId != "keeper2"));
        var sentry = await Within(bridge.CreateNpcAsync(new NpcConfig("sentry")
        {
            Persona = new Persona("Greta") { Role = "guard", Traits = { "gruff" }, SpeechStyle = "short" },
            Options = new GenerationOptions { Temperature = 0.5, Seed = 7 },
        }), "npc/create (sentry)");
        const string unicode = "Grüß dich — 你好 \"🍺\"";
        var echo = await Within(bridge.AskAsync(sentry.NpcId, unicode,
            new RespondOptions { ToolChoice = ToolChoice.None, MaxToolRounds = 1, MaxToolCalls = 1, ToolTimeoutMs = 1000, FullText = false }),
            "AskAsync");
        Check("extra: AskAsync with every respond option, non-ASCII text both ways", echo.Text == "You said: " + unicode,
            () => echo.Text);

        // prewarm with who speaks next and how that line starts (keeper has no persona: its id is its name)
        events.Clear();
        turn = await Within(bridge.PrewarmAsync(sentry.NpcId, speaker: "keeper", promptPrefix: "Heard about"),
            "npc/prewarm (speaker, promptPrefix)");
        result = await Within(turn.Completion, "prewarm turn (speaker, promptPrefix)");
        CheckSequence("extra: prewarm with a speaker", events, turn.TurnId, sentry.NpcId);
        Check("extra: prewarm with a speaker: turn/started has the promptPrefix and the speaker's name, then prewarmed",
            events.FirstOrDefault() is TurnStartedEvent ws && ws.Kind == TurnKinds.Prewarm && ws.Prompt == "Heard about"
            && ws.Speaker == "keeper" && turn.Speaker == "keeper" && result.FinishReason == FinishReasons.Prewarmed,
            () => string.Join(" ", events.Select(e => J(e.Params))));
        events.Clear();
        turn = await Within(bridge.PrewarmAsync(sentry.NpcId, promptPrefix: "Well,"), "npc/prewarm (promptPrefix)");
        result = await Within(turn.Completion, "prewarm turn (promptPrefix)");
        Check("extra: prewarm with a promptPrefix only: the player speaks next",
            events.FirstOrDefault() is TurnStartedEvent wp && wp.Prompt == "Well," && wp.Speaker == null
            && result.FinishReason == FinishReasons.Prewarmed, () => string.Join(" ", events.Select(e => J(e.Params))));
        events.Clear();
        using (var token = new CancellationTokenSource())
            turn = await Within(bridge.PrewarmAsync(sentry.NpcId, token.Token), "npc/prewarm (token)");
        result = await Within(turn.Completion, "prewarm turn (token)");
        Check("extra: PrewarmAsync(npcId, token) still prewarms for the player",
            events.FirstOrDefault() is TurnStartedEvent wt && wt.Prompt == "" && wt.Speaker == null
            && result.FinishReason == FinishReasons.Prewarmed, () => string.Join(" ", events.Select(e => J(e.Params))));

        var slow = await Within(bridge.CreateNpcAsync(new NpcConfig("slow")
        {
            Engine = "scripted",
            Script = new JArray(new JObject { ["text"] = "one two three four five six seven eight", ["chunkMs"] = 200 }),
        }), "npc/create (slow)");
        try
        {
            using (var soon = new CancellationTokenSource(TimeSpan.FromMilliseconds(300)))
                await Within(bridge.AskAsync(slow.NpcId, "talk", null, soon.Token), "AskAsync (cancelled)");
            Fail("extra: cancelling AskAsync's token cancels the turn: it completed");
        }
        catch (OamBridgeException e)
        {
            Check("extra: cancelling AskAsync's token cancels the turn", e.Code == ErrorCodes.Cancelled, () => e.ToString());
        }

        using (var cancelled = new CancellationTokenSource())
        {
            cancelled.Cancel();
            Task<IReadOnlyList<NpcSummary>> never = bridge.ListAsync(cancelled.Token);
            try { await never; }
            catch (OperationCanceledException) { }
            Check("extra: a cancelled token cancels the request's task", never.IsCanceled);
        }

        // ---- shutdown + exit
        await Within(bridge.ShutdownAsync(), "shutdown");
        Ok("shutdown");
        int code = await Within(bridge.ExitAsync(), "exit");
        Check("bridge exited 0", code == 0, () => "exit code " + code);
        try
        {
            await Within(bridge.ListAsync(), "request after exit");
            Fail("extra: a request after exit faults");
        }
        catch (OamBridgeException e)
        {
            Check("extra: a request after exit faults with transport", e.Code == ErrorCodes.Transport, () => e.ToString());
        }
    }

    // scenario.json's steps world_set ... world_delete, each with the checks its "expect" describes
    static async Task GameLayerSteps(OamBridgeClient bridge, Func<string, JObject> step, List<TurnEvent> events)
    {
        // ---- world_set: a fact scoped to the tag "tavern"
        JObject set = step("world_set");
        int revision = await Within(bridge.SetWorldFactAsync((string)set["key"], set["value"], Strings(set["tags"])), "world/set");
        Check("world_set: revision 1", revision == 1, () => revision.ToString());

        // ---- create_guard: persona, tags, fallbacks, script
        JObject create = step("create_guard");
        var config = new NpcConfig((string)create["npcId"])
        {
            Engine = (string)create["engine"],
            Persona = new Persona((string)create["persona"]["name"]) { Role = (string)create["persona"]["role"] },
            Tags = Strings(create["tags"]),
            Fallbacks = new NpcFallbacks { GuardrailViolation = Strings(create["fallbacks"]["guardrailViolation"]) },
            Script = (JArray)create["script"],
        };
        var guard = await Within(bridge.CreateNpcAsync(config), "npc/create (guard)");
        Check("create_guard", guard.NpcId == "guard" && guard.Engine == "scripted", () => guard.NpcId + " " + guard.Engine);
        // expected values come from the guard's script and fallbacks
        JObject decisionJson = (JObject)config.Script[0]["json"];
        string fallbackLine = config.Fallbacks.GuardrailViolation[0];
        string guardLine = (string)config.Script[2]["text"];

        // ---- world_set_scoped: WorldFact form, scoped to "gate"
        JObject scoped = step("world_set_scoped");
        revision = await Within(bridge.SetWorldFactAsync(new WorldFact((string)scoped["key"], scoped["value"])
        {
            Tags = Strings(scoped["tags"]),
        }), "world/set (scoped)");
        Check("world_set_scoped: revision 2", revision == 2, () => revision.ToString());

        // ---- world_get_for_npc: only the fact the guard can see
        WorldState world = await Within(bridge.GetWorldAsync((string)step("world_get_for_npc")["npcId"]), "world/get (guard)");
        WorldFact gate = world.Facts.FirstOrDefault();
        Check("world_get_for_npc: revision 2, exactly the gate fact (gate=closed, tags [gate], npcIds null, lore false)",
            world.Revision == 2 && world.Facts.Count == 1 && gate.Key == "gate" && (string)gate.Value == "closed"
            && gate.Tags != null && gate.Tags.SequenceEqual(new[] { "gate" }) && gate.NpcIds == null && !gate.Lore,
            () => J(world.Raw));

        // ---- decide: a decision turn of the guard
        events.Clear();
        JObject decide = step("decide");
        var choices = decide["options"].Select(o => new DecisionOption((string)o["name"], (string)o["description"],
            o["parameters"] as JObject)).ToList();
        Turn turn = await Within(bridge.DecideAsync((string)decide["npcId"], (string)decide["situation"], choices), "npc/decide");
        Check("decide: result has a turnId", !string.IsNullOrEmpty(turn.TurnId) && turn.Kind == TurnKinds.Decide, () => turn.TurnId);
        TurnResult result = await Within(turn.Completion, "decision turn");
        var decision = new Decision(result);
        CheckSequence("decide", events, turn.TurnId, "guard");
        Check("decide: turn/started kind=decide", events.FirstOrDefault() is TurnStartedEvent st && st.Kind == TurnKinds.Decide,
            () => J(events.FirstOrDefault()?.Params));
        Check("decide: only partialJson streams", events.Skip(1).Take(events.Count - 2).All(e => e is PartialJsonEvent),
            () => string.Join(",", events.Select(e => e.Method)));
        Check("decide: completed json.choice=question, json.reasoning, worldRevision=2",
            decision.Choice == (string)decisionJson["choice"] && decision.Reasoning == (string)decisionJson["reasoning"]
            && decision.Arguments == null && JToken.DeepEquals(result.Json, decisionJson) && result.WorldRevision == 2,
            () => J(result.Raw));

        // ---- guardrail_fallback: the scripted guardrail_violation becomes the fallback line
        events.Clear();
        JObject guarded = step("guardrail_fallback");
        turn = await Within(bridge.RespondAsync((string)guarded["npcId"], (string)guarded["prompt"],
            new RespondOptions { Guardrail = ParsePolicy((string)guarded["guardrail"]) }), "npc/respond (guardrail)");
        result = await Within(turn.Completion, "guardrail turn");
        CheckSequence("guardrail_fallback", events, turn.TurnId, "guard");
        Check("guardrail_fallback: turn/started kind=respond",
            events.FirstOrDefault() is TurnStartedEvent gs && gs.Kind == TurnKinds.Respond && gs.Speaker == null,
            () => J(events.FirstOrDefault()?.Params));
        Check("guardrail_fallback: completed with the fallback line, finishReason fallback, warning guardrail_violation",
            result.Text == fallbackLine && result.FinishReason == FinishReasons.Fallback && result.Warnings.Count > 0
            && result.Warnings[0].StartsWith("guardrail_violation", StringComparison.Ordinal) && turn.Text == fallbackLine,
            () => J(result.Raw));

        // ---- npc_to_npc: the keeper speaks to the guard
        events.Clear();
        JObject spoken = step("npc_to_npc");
        turn = await Within(bridge.RespondAsync((string)spoken["npcId"], (string)spoken["prompt"],
            new RespondOptions { Speaker = (string)spoken["speaker"] }), "npc/respond (speaker)");
        result = await Within(turn.Completion, "npc-to-npc turn");
        CheckSequence("npc_to_npc", events, turn.TurnId, "guard");
        // keeper has no persona: its id is its name
        Check("npc_to_npc: turn/started speaker=keeper",
            events.FirstOrDefault() is TurnStartedEvent ss && ss.Speaker == "keeper" && ss.Kind == TurnKinds.Respond
            && turn.Speaker == "keeper",
            () => J(events.FirstOrDefault()?.Params));
        string deltas = string.Concat(events.OfType<TextDeltaEvent>().Select(d => d.Delta));
        Check("npc_to_npc: completed text, deltas concatenate to it", result.Text == guardLine && deltas == guardLine,
            () => J(result.Raw));

        // ---- prewarm
        events.Clear();
        turn = await Within(bridge.PrewarmAsync((string)step("prewarm")["npcId"]), "npc/prewarm");
        Check("prewarm: result has a turnId", !string.IsNullOrEmpty(turn.TurnId) && turn.Kind == TurnKinds.Prewarm, () => turn.TurnId);
        result = await Within(turn.Completion, "prewarm turn");
        CheckSequence("prewarm", events, turn.TurnId, "guard");
        Check("prewarm: turn/started kind=prewarm, then turn/completed",
            events.Count == 2 && events[0] is TurnStartedEvent ps && ps.Kind == TurnKinds.Prewarm && ps.Prompt == "",
            () => string.Join(" ", events.Select(e => J(e.Params))));
        Check("prewarm: finishReason prewarmed, steps 0, text \"\"",
            result.FinishReason == FinishReasons.Prewarmed && result.Steps == 0 && result.Text == "", () => J(result.Raw));

        // ---- set_tags, then the guard sees the tavern's fact too
        JObject tags = step("set_tags");
        await Within(bridge.SetTagsAsync((string)tags["npcId"], Strings(tags["tags"])), "npc/setTags");
        Ok("set_tags");
        world = await Within(bridge.GetWorldAsync((string)step("world_get_after_tags")["npcId"]), "world/get (after tags)");
        Check("world_get_after_tags: two facts, sorted by key: gate, weather",
            world.Facts.Select(f => f.Key).SequenceEqual(new[] { "gate", "weather" }), () => J(world.Raw));

        // ---- world_delete
        WorldDeleteResult deleted = await Within(bridge.DeleteWorldFactAsync((string)step("world_delete")["key"]), "world/delete");
        Check("world_delete: revision 3, deleted", deleted.Revision == 3 && deleted.Deleted,
            () => deleted.Revision + " " + deleted.Deleted);
    }

    static List<string> Strings(JToken array) => array?.Select(t => (string)t).ToList();

    static GuardrailPolicy ParsePolicy(string name) => (GuardrailPolicy)Enum.Parse(typeof(GuardrailPolicy), name, true);

    // every event of the turn has its turnId and npcId; seq runs 0, 1, 2, ... without gaps; one terminal, last
    static void CheckSequence(string what, List<TurnEvent> events, string turnId, string npcId)
    {
        var wrong = events.Where((e, i) => e.TurnId != turnId || e.NpcId != npcId || e.Seq != i).ToList();
        Check(what + ": " + events.Count + " events, seq gap-free, same turnId",
            events.Count > 0 && wrong.Count == 0 && events.Count(e => e.IsTerminal) == 1 && events.Last().IsTerminal,
            () => "wrong: " + string.Join(" ", wrong.Select(e => e.Method + "#" + e.Seq + "@" + e.TurnId)));
    }

    // a fake bridge that writes a turn's events before the npc/respond result
    static async Task EarlyEvents(string fakeBridge)
    {
        using (var fake = OamBridgeClient.Start("/bin/sh", "\"" + fakeBridge + "\""))
        {
            fake.Dispatch = MainLoop.Post;
            Turn turn = await Within(fake.RespondAsync("x", "hi"), "npc/respond (fake)");
            TurnResult result = await Within(turn.Completion, "fake turn");
            Check("extra: events before the respond result still reach the Turn", result.Text == "early" && turn.Text == "early",
                () => result.Text);
            int code = await Within(fake.ExitAsync(), "fake exit");
            Check("extra: the fake bridge exits 0 after stdin closes", code == 0, () => code.ToString());
        }
    }

    // a bridge that dies with a request pending: the request faults, the exit code is reported
    static async Task TransportFailure()
    {
        using (var dead = OamBridgeClient.Start("/bin/sh", "-c \"read line; exit 3\""))
        {
            try
            {
                await Within(dead.ListAsync(), "request to a dying bridge");
                Fail("extra: a pending request faults when the bridge exits");
            }
            catch (OamBridgeException e)
            {
                Check("extra: a pending request faults when the bridge exits",
                    e.Code == ErrorCodes.Transport && e.Message.Contains("exit code 3"), () => e.ToString());
            }
            int code = await Within(dead.WaitForExitAsync(), "exit of the dying bridge");
            Check("extra: WaitForExitAsync reports the exit code", code == 3, () => code.ToString());
        }
    }
}

/// <summary>A single-threaded loop with a SynchronizationContext, like Unity's main thread.</summary>
static class MainLoop
{
    static readonly BlockingCollection<Action> Queue = new BlockingCollection<Action>();

    public static void Post(Action action) => Queue.Add(action);

    sealed class Context : SynchronizationContext
    {
        public override void Post(SendOrPostCallback d, object state) => Queue.Add(() => d(state));
        public override void Send(SendOrPostCallback d, object state) => throw new NotSupportedException();
    }

    public static void Run(Func<Task> body)
    {
        SynchronizationContext.SetSynchronizationContext(new Context());
        Task task = body();
        task.ContinueWith(_ => Queue.CompleteAdding(), TaskScheduler.Default);
        foreach (var action in Queue.GetConsumingEnumerable()) action();
        task.GetAwaiter().GetResult();
    }
}
