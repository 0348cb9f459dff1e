// Runs engine_clients/scenario.json against the real bridge with OamBridgeClient; the same
// checks as engine_clients/shell/test.sh, plus a few for the rest of the API. Built and run by
// ../run_tests.sh together with the README's quick start (extracted to .build/QuickStart.g.cs).
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

        if (overridden) Console.WriteLine("skip - README quick start (OAM_BRIDGE_CMD is set; it uses .venv)");
        else
        {
            string text = await Within(QuickStart.RunAsync(root), "quick start");
            Check("README quick start returns the echo", text == "You said: Let me in", () => text);
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
        bridge.ToolCallSubmitted += s => submissions.Add(s);

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
        CheckSequence("tool turn", events, turn.TurnId);
        Check("tool turn: started first", events.FirstOrDefault() is TurnStartedEvent);
        var requested = events.OfType<ToolCallRequestedEvent>().FirstOrDefault();
        Check("tool turn: toolCallRequested check_inventory(ale)",
            requested != null && requested.Name == (string)scriptedCall["name"]
                              && JToken.DeepEquals(requested.Arguments, scriptedCall["arguments"]),
            () => J(requested?.Params));
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
        CheckSequence("schema turn", events, turn.TurnId);
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
        CheckSequence("cancel turn", events, turn.TurnId);
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
        var guard = await Within(bridge.CreateNpcAsync(new NpcConfig("guard")
        {
            Persona = new Persona("Greta") { Role = "guard", Traits = { "gruff" }, SpeechStyle = "short" },
            Options = new GenerationOptions { Temperature = 0.5, Seed = 7 },
        }), "npc/create (guard)");
        const string unicode = "Grüß dich — 你好 \"🍺\"";
        var echo = await Within(bridge.AskAsync(guard.NpcId, unicode,
            new RespondOptions { ToolChoice = ToolChoice.None, MaxToolRounds = 1, MaxToolCalls = 1, ToolTimeoutMs = 1000, FullText = false }),
            "AskAsync");
        Check("extra: AskAsync with every respond option, non-ASCII text both ways", echo.Text == "You said: " + unicode,
            () => echo.Text);

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

    // every event of the turn has its turnId and npcId; seq runs 0, 1, 2, ... without gaps; one terminal, last
    static void CheckSequence(string what, List<TurnEvent> events, string turnId)
    {
        var wrong = events.Where((e, i) => e.TurnId != turnId || e.NpcId != "keeper" || e.Seq != i).ToList();
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
