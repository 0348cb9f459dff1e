// Runs the Unity layer (Runtime/Unity, Editor/, Samples~) compiled against Tests~/Stubs, with the
// components' messages played by StubRuntime on a single-threaded "main thread", against the real
// bridge. Built and run by ../../run_tests.sh.
//
//   mono UnityLayerTest.exe REPO_ROOT PACKAGE_DIR          the checks
//   mono UnityLayerTest.exe --game PIDFILE REPO_ROOT       a "game" for the SIGKILL test: starts the
//                                                         bridge through OamNpc, writes its pid, runs on
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Text.RegularExpressions;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json.Linq;
using Oam.Bridge;
using Oam.Bridge.Unity;
using Oam.Bridge.Unity.EditorBuild;
using UnityEditor;
using UnityEditor.Build;
using UnityEditor.Build.Reporting;
using UnityEngine;
using Debug = UnityEngine.Debug;
using Object = UnityEngine.Object;

static class UnityLayerTest
{
    static int _failures;
    static string _root, _package, _python, _tmp;

    static void Ok(string what) => Console.WriteLine("ok   - " + what);
    static void Fail(string what) { Console.WriteLine("FAIL - " + what); _failures++; }
    static void Check(string what, bool condition, Func<string> detail = null)
    {
        if (condition) Ok(what);
        else Fail(what + (detail != null ? ": " + detail() : ""));
    }

    static int Main(string[] args)
    {
        if (args.Length == 3 && args[0] == "--game") return Game(args[1], args[2]);
        if (args.Length != 2) { Console.Error.WriteLine("usage: UnityLayerTest.exe REPO_ROOT PACKAGE_DIR"); return 2; }
        _root = args[0];
        _package = args[1];
        _python = Path.Combine(_root, ".venv", "bin", "python");
        _tmp = Path.Combine(Path.GetTempPath(), "oam-unity-test-" + Process.GetCurrentProcess().Id);
        Directory.CreateDirectory(_tmp);
        try
        {
            Player.Run(RunAsync);
        }
        catch (Exception e)
        {
            Fail("test aborted: " + e.GetBaseException());
        }
        finally
        {
            try { Directory.Delete(_tmp, true); } catch (Exception) { }
        }
        Console.WriteLine(_failures == 0 ? "unity layer: PASS" : "unity layer: FAIL (" + _failures + ")");
        return _failures == 0 ? 0 : 1;
    }

    static async Task RunAsync()
    {
        await Test("a failed start is not cached", FailedStartIsNotCached);
        await Test("a crashed bridge is started again", CrashedBridgeRestarts);
        await Test("default npcIds are unique per component", DefaultIdsAreUnique);
        await Test("save and load history", SaveAndLoad);
        await Test("the last NPC destroyed, or quitting, ends the bridge", Lifetime);
        await Test("shipping: build step and StreamingAssets", Shipping, 150); // copies the real dist (~250 MB)
        await Test("sample: the innkeeper scene with a tool", Sample);
        await Test("prewarm for the player, or for another NPC's line", Prewarm);
    }

    static async Task Test(string name, Func<Task> body, int seconds = 40)
    {
        Console.WriteLine("# " + name);
        Reset();
        var run = body();
        if (await Task.WhenAny(run, Task.Delay(TimeSpan.FromSeconds(seconds))) != run) { Fail(name + ": timed out"); return; }
        try { await run; }
        catch (Exception e) { Fail(name + ": " + e); }
        StubRuntime.DestroyAll();
        await Frames(3);
    }

    // a fresh "play mode": no objects, statics reset, editor on Linux
    static void Reset()
    {
        StubRuntime.DestroyAll();
        StubRuntime.IsEditor = true;
        StubRuntime.Platform = RuntimePlatform.LinuxEditor;
        StubRuntime.DataPath = Path.Combine(_tmp, "no-project", "Assets");
        StubRuntime.StreamingAssetsPath = Path.Combine(StubRuntime.DataPath, "StreamingAssets");
        StubRuntime.PersistentDataPath = Path.Combine(_tmp, "persistent");
        StubRuntime.Errors.Clear();
        StubRuntime.RunInitializeOnLoadMethods(RuntimeInitializeLoadType.SubsystemRegistration);
        StubRuntime.RunInitializeOnLoadMethods(RuntimeInitializeLoadType.BeforeSceneLoad);
    }

    static Task Frames(int n) => Player.Frames(n);

    static async Task<T> Within<T>(Task<T> task, string what, int seconds = 20)
    {
        if (await Task.WhenAny(task, Task.Delay(TimeSpan.FromSeconds(seconds))) != task) throw new TimeoutException(what);
        return await task;
    }

    static async Task Within(Task task, string what, int seconds = 20)
    {
        if (await Task.WhenAny(task, Task.Delay(TimeSpan.FromSeconds(seconds))) != task) throw new TimeoutException(what);
        await task;
    }

    static OamNpc Npc(string name, string npcId = "", Action<OamNpc> set = null)
    {
        var npc = new GameObject(name).AddComponent<OamNpc>();
        // what the scene would hold: the venv's bridge, the scripted engine
        npc.bridgeExecutable = _python;
        npc.bridgeArguments = "-m bridge --engine scripted";
        npc.bridgeWorkingDirectory = _root;
        npc.engine = "scripted";
        npc.npcId = npcId;
        set?.Invoke(npc);
        return npc;
    }

    static bool Gone(int pid)
    {
        string stat = "/proc/" + pid + "/stat";
        if (!File.Exists(stat)) return true;
        try
        {
            string s = File.ReadAllText(stat);
            return s.Substring(s.LastIndexOf(')') + 2, 1) == "Z"; // a zombie has exited
        }
        catch (IOException) { return true; }
    }

    static async Task<bool> GoneWithin(int pid, int ms)
    {
        var sw = Stopwatch.StartNew();
        while (sw.ElapsedMilliseconds < ms)
        {
            if (Gone(pid)) return true;
            await Task.Delay(20);
        }
        return Gone(pid);
    }

    // ------------------------------------------------------------------ bug fixes

    static async Task FailedStartIsNotCached()
    {
        // fails on its first start (exit 3 before answering initialize), works from the second
        string flag = Path.Combine(_tmp, "flaky-started");
        string script = Path.Combine(_tmp, "flaky.sh");
        File.WriteAllText(script, "[ -e \"$1\" ] || { : > \"$1\"; exit 3; }\nexec \"$2\" -m bridge --engine scripted\n");
        OamNpc npc = Npc("flaky", "flaky", n =>
        {
            n.bridgeExecutable = "/bin/sh";
            n.bridgeArguments = "\"" + script + "\" \"" + flag + "\" \"" + _python + "\"";
        });
        try
        {
            await Within(npc.ReadyAsync(), "first start");
            Fail("the first start fails");
        }
        catch (OamBridgeException e)
        {
            Check("the first start fails with transport", e.Code == ErrorCodes.Transport, () => e.ToString());
        }
        Check("a failed start keeps no bridge and no reference", OamBridgeHost.Count == 0, () => OamBridgeHost.Count + " bridges");
        string text = await Within(npc.SayAsync("again"), "second start");
        Check("the next call starts the bridge again and the NPC answers", text == "You said: again", () => text);
        Check("one bridge", OamBridgeHost.Count == 1, () => OamBridgeHost.Count + " bridges");
    }

    static async Task CrashedBridgeRestarts()
    {
        OamNpc a = Npc("a", "a"), b = Npc("b", "b");
        await Within(a.ReadyAsync(), "a ready");
        await Within(b.ReadyAsync(), "b ready");
        Check("two NPCs share one bridge", a.Client == b.Client && OamBridgeHost.Count == 1);
        int pid = a.Client.ProcessId;
        Process.GetProcessById(pid).Kill(); // the bridge crashes
        await Within(a.Client.WaitForExitAsync(), "bridge exit");
        await Frames(2);
        Check("the crashed bridge is no longer counted", OamBridgeHost.Count == 0, () => OamBridgeHost.Count.ToString());
        string text = await Within(a.SayAsync("after the crash"), "a after the crash");
        Check("the NPC answers after its bridge crashed", text == "You said: after the crash", () => text);
        Check("on a new bridge process", a.Client.ProcessId != pid && a.Client.IsRunning);
        text = await Within(b.SayAsync("me too"), "b after the crash");
        Check("the other NPC moves to the same new bridge", text == "You said: me too" && b.Client == a.Client
            && OamBridgeHost.Count == 1, () => text + " " + OamBridgeHost.Count);
        var npcs = await Within(a.Client.ListAsync(), "list");
        Check("both NPCs exist on the new bridge", npcs.Count == 2, () => npcs.Count.ToString());
    }

    static async Task DefaultIdsAreUnique()
    {
        OamNpc one = Npc("Guard"), two = Npc("Guard"); // same GameObject name, npcId left empty
        OamNpc fresh = new GameObject("x").AddComponent<OamNpc>();
        Check("npcId is empty by default", fresh.npcId == "");
        Object.Destroy(fresh.gameObject);
        await Within(one.ReadyAsync(), "one ready");
        await Within(two.ReadyAsync(), "two ready");
        Check("the two ids differ and start with the GameObject's name",
            one.NpcId != two.NpcId && one.NpcId.StartsWith("Guard-") && two.NpcId.StartsWith("Guard-"),
            () => one.NpcId + " " + two.NpcId);
        Check("the id stays the same", one.NpcId == one.NpcId);
        var npcs = await Within(one.Client.ListAsync(), "list");
        Check("both are on the bridge", npcs.Select(n => n.NpcId).OrderBy(s => s).SequenceEqual(new[] { one.NpcId, two.NpcId }.OrderBy(s => s)),
            () => string.Join(",", npcs.Select(n => n.NpcId)));
        string text = await Within(two.SayAsync("hello"), "two says");
        Check("the second answers", text == "You said: hello", () => text);
    }

    static async Task SaveAndLoad()
    {
        StubRuntime.PersistentDataPath = Path.Combine(_tmp, "persistent");
        OamNpc keeper = Npc("Keeper", "keeper", n => n.instructions = "Be brief.");
        await Within(keeper.SayAsync("The password is swordfish."), "say");
        string save = await Within(keeper.SaveHistoryAsync(), "save");
        JObject parsed = JObject.Parse(save);
        Check("SaveHistoryAsync returns the transcript", (int)parsed["version"] == 1 && ((JArray)parsed["turns"]).Count == 1
            && (string)parsed["config"]["instructions"] == "Be brief.", () => save);
        string path = await Within(keeper.SaveHistoryToFileAsync(), "save to file");
        Check("the default path is persistentDataPath/oam-bridge/<npcId>.json",
            path == Path.Combine(StubRuntime.PersistentDataPath, "oam-bridge", "keeper.json") && File.Exists(path), () => path);
        string custom = await Within(keeper.SaveHistoryToFileAsync(Path.Combine(_tmp, "saves", "slot1.json")), "save to a path");
        Check("a save to a path writes the same JSON", File.ReadAllText(custom) == save && !File.Exists(custom + ".tmp"));

        Object.Destroy(keeper.gameObject);
        await Frames(2);
        // next session: a new component loads it (under its own id, here a generated one)
        OamNpc loaded = Npc("Keeper");
        int turns = await Within(loaded.LoadHistoryFromFileAsync(custom), "load");
        Check("LoadHistoryFromFileAsync restores the turns", turns == 1, () => turns.ToString());
        JObject after = await Within(loaded.Client.GetTranscriptAsync(loaded.NpcId), "transcript");
        Check("the history and settings came back under the component's id",
            after["turns"][0][0]["content"].ToString() == "The password is swordfish."
            && (string)after["config"]["npcId"] == loaded.NpcId && (string)after["config"]["instructions"] == "Be brief.",
            () => after.ToString());
        turns = await Within(loaded.LoadHistoryAsync(save), "load from a string");
        Check("LoadHistoryAsync from the string", turns == 1);
        try
        {
            loaded.DefaultSavePath();
            Fail("the default path needs an npcId");
        }
        catch (InvalidOperationException) { Ok("the default path needs an npcId (a generated one changes every run)"); }
    }

    static async Task Prewarm()
    {
        OamNpc bram = Npc("Bram", "bram"), greta = Npc("Greta", "greta", n => n.personaName = "Greta");
        var started = new List<TurnStartedEvent>();
        bram.TurnStarted += started.Add;
        await Within(greta.ReadyAsync(), "greta ready");
        await Within(bram.PrewarmAsync(), "prewarm");
        await Within(bram.PrewarmAsync("", ""), "prewarm with empty strings (an inspector's unset fields)");
        await Within(bram.PrewarmAsync(greta.NpcId, "Quiet"), "prewarm with a speaker and a promptPrefix");
        Check("PrewarmAsync() and PrewarmAsync(\"\", \"\"): for the player; PrewarmAsync(speaker, promptPrefix): for Greta's line",
            started.Count == 3 && started.All(e => e.Kind == TurnKinds.Prewarm)
            && started[0].Speaker == null && started[0].Prompt == "" && started[1].Speaker == null && started[1].Prompt == ""
            && started[2].Speaker == "Greta" && started[2].Prompt == "Quiet",
            () => string.Join(" ", started.Select(e => e.Params.ToString(Newtonsoft.Json.Formatting.None))));
    }

    static async Task Lifetime()
    {
        OamNpc a = Npc("a", "a"), b = Npc("b", "b");
        await Within(a.ReadyAsync(), "ready");
        await Within(b.ReadyAsync(), "ready");
        int pid = a.Client.ProcessId;
        Object.Destroy(a.gameObject);
        await Frames(2);
        Check("one NPC destroyed: the bridge keeps running", !Gone(pid) && OamBridgeHost.Count == 1);
        Object.Destroy(b.gameObject);
        await Frames(2);
        Check("the last NPC destroyed: the bridge exits within 3 s", await GoneWithin(pid, 3000));
        Check("and the host holds nothing", OamBridgeHost.Count == 0);

        // destroyed while the bridge starts: the start releases its own reference
        OamNpc c = Npc("c", "c");
        Task ready = c.ReadyAsync();
        Object.Destroy(c.gameObject);
        await Frames(1);
        try { await Within(ready, "ready of a destroyed NPC"); }
        catch (OperationCanceledException) { }
        await Frames(2);
        Check("an NPC destroyed during the start leaves no bridge", OamBridgeHost.Count == 0, () => OamBridgeHost.Count.ToString());

        OamNpc d = Npc("d", "d");
        await Within(d.ReadyAsync(), "ready");
        pid = d.Client.ProcessId;
        StubRuntime.Quit();
        Check("quitting: the bridge exits within 3 s", await GoneWithin(pid, 3000));
    }

    // ------------------------------------------------------------------ shipping

    static string Sh(string args)
    {
        var p = Process.Start(new ProcessStartInfo("/bin/sh", args) { UseShellExecute = false, RedirectStandardOutput = true });
        string output = p.StandardOutput.ReadToEnd();
        p.WaitForExit();
        return p.ExitCode == 0 ? output : null;
    }

    static void WriteExecutable(string path, string text)
    {
        Directory.CreateDirectory(Path.GetDirectoryName(path));
        File.WriteAllText(path, text);
        Sh("-c \"chmod +x '" + path + "'\"");
    }

    static async Task Shipping()
    {
        // a project with `make dist`'s folder per platform beside Assets (README "Shipping your game",
        // step 1): the Linux one is the real PyInstaller build in the checkout's dist/oam-bridge when
        // it is built (else a script that runs the venv's bridge stands in for it: a FAIL with
        // CI=true), the others are placeholders
        string project = Path.Combine(_tmp, "project");
        Directory.CreateDirectory(Path.Combine(project, "Assets"));
        StubRuntime.DataPath = Path.Combine(project, "Assets");
        StubRuntime.StreamingAssetsPath = Path.Combine(project, "Assets", "StreamingAssets");
        string dists = Path.Combine(project, "OamBridge");
        string realDist = Path.Combine(_root, "dist", "oam-bridge");
        bool real = File.Exists(Path.Combine(realDist, "oam-bridge"));
        string marker = real ? "base_library.zip" : "libllama.so"; // a file of _internal/
        if (real)
        {
            // hard links where the file system allows (a copy of ~250 MB otherwise); never a link to
            // the folder itself, which the clean-up at the end would walk into
            Directory.CreateDirectory(dists);
            string linux = Path.Combine(dists, "linux-x64");
            Check("the real dist (make dist) copied to OamBridge/linux-x64",
                Sh("-c \"cp -al '" + realDist + "' '" + linux + "' 2>/dev/null || { rm -rf '" + linux + "'; cp -a '"
                   + realDist + "' '" + linux + "'; }\"") != null && File.Exists(Path.Combine(linux, "oam-bridge")));
        }
        else
        {
            if (Environment.GetEnvironmentVariable("CI") == "true")
                Fail("dist/oam-bridge/oam-bridge is not built (make dist; tests/shipping/test_dist.py builds it in make test): "
                     + "CI=true needs the real dist shipped");
            else
                Console.WriteLine("skip - the real dist: dist/oam-bridge not built (make dist); a script stands in for it");
            WriteExecutable(Path.Combine(dists, "linux-x64", "oam-bridge"), "#!/bin/sh\nexec '" + _python + "' -m bridge \"$@\"\n");
            Directory.CreateDirectory(Path.Combine(dists, "linux-x64", "_internal"));
            File.WriteAllText(Path.Combine(dists, "linux-x64", "_internal", "libllama.so"), "placeholder");
        }
        WriteExecutable(Path.Combine(dists, "windows-x64", "oam-bridge.exe"), "placeholder");
        WriteExecutable(Path.Combine(dists, "macos-arm64", "oam-bridge"), "placeholder");
        WriteExecutable(Path.Combine(dists, "macos-x64", "oam-bridge"), "placeholder");

        var processor = new OamBridgeBuildProcessor();
        Check("the build step prepares the player build (BuildPlayerProcessor) and fixes modes after it",
            processor is BuildPlayerProcessor && processor is IPostprocessBuildWithReport);

        // Linux player: the dists are handed to Unity, which copies them into the player (StubBuild
        // plays Unity's part, copying what the context was given); then the post-build step
        string build = Path.Combine(_tmp, "build-linux", "Game.x86_64");
        string streaming = Path.Combine(_tmp, "build-linux", "Game_Data", "StreamingAssets");
        BuildPlayerContext context = StubBuild.Context(BuildTarget.StandaloneLinux64, build);
        processor.PrepareForBuild(context);
        StubBuild.CopyStreamingAssets(context, streaming);
        foreach (string f in Directory.GetFiles(Path.Combine(streaming, "oam-bridge", "linux-x64")))
            Sh("-c \"chmod -x '" + f + "'\"");  // as a copy that lost the mode
        processor.OnPostprocessBuild(StubBuild.Report(BuildTarget.StandaloneLinux64, build));
        string shipped = Path.Combine(streaming, "oam-bridge", "linux-x64", "oam-bridge");
        Check("Linux: the dist is shipped as StreamingAssets/oam-bridge/linux-x64", File.Exists(shipped)
            && File.Exists(Path.Combine(streaming, "oam-bridge", "linux-x64", "_internal", marker)));
        Check("Linux: it is executable after the build", Sh("-c \"test -x '" + shipped + "'\"") != null);
        Check("Linux: no other OS's dist is shipped", Directory.GetDirectories(Path.Combine(streaming, "oam-bridge")).Length == 1);

        // Windows, and macOS (an app, and an Xcode project export: Unity copies streaming assets into both)
        context = StubBuild.Context(BuildTarget.StandaloneWindows64, Path.Combine(_tmp, "build-win", "Game.exe"));
        processor.PrepareForBuild(context);
        Check("Windows: windows-x64 as StreamingAssets/oam-bridge/windows-x64",
            context.Added.Count == 1 && context.Added[0].Value == "oam-bridge/windows-x64"
            && File.Exists(Path.Combine(context.Added[0].Key, "oam-bridge.exe")));
        context = StubBuild.Context(BuildTarget.StandaloneOSX, Path.Combine(_tmp, "build-mac", "GameXcode"));
        processor.PrepareForBuild(context);
        Check("macOS (also an Xcode project export): oam-bridge/macos-{arm64,x64}",
            context.Added.Count == 2 && context.Added[0].Value == "oam-bridge/macos-arm64" && context.Added[1].Value == "oam-bridge/macos-x64");
        processor.OnPostprocessBuild(StubBuild.Report(BuildTarget.StandaloneOSX, Path.Combine(_tmp, "build-mac", "GameXcode")));
        Ok("macOS Xcode export: the post-build step leaves the project alone");

        // no dist for the target: the build fails with instructions; mobile only warns
        Directory.Delete(Path.Combine(dists, "windows-x64"), true);
        try
        {
            processor.PrepareForBuild(StubBuild.Context(BuildTarget.StandaloneWindows64, Path.Combine(_tmp, "w2", "Game.exe")));
            Fail("a Windows build without a Windows dist fails");
        }
        catch (BuildFailedException e)
        {
            Check("a Windows build without a Windows dist fails, naming the folder", e.Message.Contains("windows-x64"), () => e.Message);
        }
        processor.PrepareForBuild(StubBuild.Context(BuildTarget.Android, Path.Combine(_tmp, "a", "Game.apk")));
        Ok("an Android build only warns (no subprocesses there)");

        // the built player finds the shipped bridge
        StubRuntime.IsEditor = false;
        StubRuntime.Platform = RuntimePlatform.LinuxPlayer;
        StubRuntime.StreamingAssetsPath = streaming;
        StubRuntime.DataPath = Path.Combine(_tmp, "build-linux", "Game_Data");
        OamBridgeCommand command = OamBridgeLocation.Resolve("", "--engine scripted", "");
        Check("player: resolves the shipped bridge in its own folder", command.Source == "shipped"
            && command.Executable == shipped && command.WorkingDirectory == Path.GetDirectoryName(shipped), () => command.ToString());
        OamNpc npc = new GameObject("Innkeeper").AddComponent<OamNpc>(); // the defaults, as a scene leaves them
        npc.bridgeArguments = "--engine scripted";
        npc.engine = "scripted";
        string text = await Within(npc.SayAsync("shipped?"), "shipped bridge", real ? 60 : 20);
        Check("player: OamNpc with default settings talks to the shipped bridge" + (real ? " (the real dist)" : ""),
            text == "You said: shipped?", () => text);
        string exe = Sh("-c \"readlink /proc/" + npc.Client.ProcessId + "/exe\"")?.Trim();
        Check("player: the bridge process is the shipped executable", real ? exe == shipped : exe != null, () => exe);
        Object.Destroy(npc.gameObject);
        await Frames(2);
        if (real)
        {
            // every default, engine "auto" too: the dist's bundled model (llama) answers
            OamNpc guard = new GameObject("Guard").AddComponent<OamNpc>();
            guard.instructions = "You guard the gate. Answer in one short sentence.";
            var sw = Stopwatch.StartNew();
            text = await Within(guard.SayAsync("Who goes there?"), "the shipped bridge's bundled model", 90);
            Check("player: an OamNpc with every default (engine auto) gets an answer from the dist's bundled model",
                !string.IsNullOrWhiteSpace(text), () => "\"" + text + "\"");
            string line = text.Trim();
            Console.WriteLine("       (" + sw.ElapsedMilliseconds + " ms with the model loading: \""
                              + (line.Length > 70 ? line.Substring(0, 70) + "..." : line) + "\")");
            Object.Destroy(guard.gameObject);
            await Frames(2);
        }

        StubRuntime.StreamingAssetsPath = Path.Combine(_tmp, "empty-streaming");
        OamNpc lost = new GameObject("Lost").AddComponent<OamNpc>();
        try
        {
            await Within(lost.ReadyAsync(), "missing bridge");
            Fail("player without the shipped bridge fails");
        }
        catch (FileNotFoundException e)
        {
            Check("player without the shipped bridge: a clear error with the expected path",
                e.Message.Contains(Path.Combine("empty-streaming", "oam-bridge", "linux-x64", "oam-bridge")), () => e.Message);
        }
        Object.Destroy(lost.gameObject);
        await Frames(2);
        StubRuntime.Platform = RuntimePlatform.Android;
        try
        {
            OamBridgeLocation.Resolve("", "", "");
            Fail("Android is refused");
        }
        catch (PlatformNotSupportedException) { Ok("Android: PlatformNotSupportedException"); }

        // the editor: the project's dist, else python -m bridge
        StubRuntime.IsEditor = true;
        StubRuntime.Platform = RuntimePlatform.LinuxEditor;
        StubRuntime.DataPath = Path.Combine(project, "Assets");
        StubRuntime.StreamingAssetsPath = Path.Combine(project, "Assets", "StreamingAssets");
        command = OamBridgeLocation.Resolve("", "", "");
        Check("editor: the project's OamBridge/linux-x64 dist", command.Source == "project"
            && command.Executable == Path.Combine(dists, "linux-x64", "oam-bridge"), () => command.ToString());
        StubRuntime.DataPath = Path.Combine(_tmp, "no-project", "Assets");
        command = OamBridgeLocation.Resolve("", "--engine scripted", "/work");
        Check("editor without a dist: python3 -m bridge", command.Source == "python" && command.Executable == "python3"
            && command.Arguments == "-m bridge --engine scripted" && command.WorkingDirectory == "/work", () => command.ToString());
        OamNpc dev = new GameObject("Dev").AddComponent<OamNpc>();
        dev.editorPython = _python;
        dev.bridgeArguments = "--engine scripted";
        dev.bridgeWorkingDirectory = _root;
        dev.engine = "scripted";
        text = await Within(dev.SayAsync("from the editor"), "editor python");
        Check("editor: OamNpc runs editorPython -m bridge", text == "You said: from the editor", () => text);
    }

    // ------------------------------------------------------------------ sample

    static async Task Sample()
    {
        string dir = Path.Combine(_package, "Samples~", "ToolDemo");
        string scene = File.ReadAllText(Path.Combine(dir, "ToolDemo.unity"));
        Func<string, string> Guid = meta => Regex.Match(File.ReadAllText(meta), @"guid: ([0-9a-f]{32})").Groups[1].Value;
        var scripts = new Dictionary<string, Type>
        {
            [Guid(Path.Combine(_package, "Runtime", "Unity", "OamNpc.cs.meta"))] = typeof(OamNpc),
            [Guid(Path.Combine(dir, "InnkeeperDemo.cs.meta"))] = typeof(InnkeeperDemo),
        };
        var blocks = Regex.Split(scene, @"^--- ", RegexOptions.Multiline).Where(b => b.Contains("MonoBehaviour:")).ToList();
        Check("the scene has the two components", blocks.Count == 2, () => blocks.Count.ToString());
        foreach (string block in blocks)
        {
            string guid = Regex.Match(block, @"m_Script: \{fileID: 11500000, guid: ([0-9a-f]{32}), type: 3\}").Groups[1].Value;
            if (!scripts.TryGetValue(guid, out Type type)) { Fail("the scene's script guid " + guid + " is no script's .meta"); continue; }
            var fields = Regex.Matches(block, @"^  ([A-Za-z_][A-Za-z0-9_]*):", RegexOptions.Multiline).Cast<Match>()
                .Select(m => m.Groups[1].Value).Where(f => !f.StartsWith("m_")).ToList();
            var missing = fields.Where(f => type.GetField(f) == null).ToList();
            Check("scene: every field of " + type.Name + " exists (" + fields.Count + ")", missing.Count == 0 && fields.Count > 3,
                () => string.Join(",", missing));
        }
        string toolJson = Regex.Match(scene, @"parametersJson: '(.*)'").Groups[1].Value;
        Check("scene: the tool's schema parses", JObject.Parse(toolJson)["properties"]["item"] != null);

        // the scene's objects, as Unity loads them (fields before Awake), with the scripted engine
        var go = new GameObject("Innkeeper");
        OamNpc npc = go.AddComponent<OamNpc>();
        npc.bridgeExecutable = _python;
        npc.bridgeArguments = "-m bridge --engine scripted";
        npc.bridgeWorkingDirectory = _root;
        npc.npcId = "innkeeper";
        npc.engine = "scripted";
        npc.instructions = "You run the inn.";
        npc.tools = new[] { new OamToolSpec { name = "check_inventory", description = "How many of an item", parametersJson = toolJson } };
        npc.prewarmOnStart = true;
        npc.scriptJson = "[{\"toolCalls\": [{\"name\": \"check_inventory\", \"arguments\": {\"item\": \"ale\"}}]},"
                         + " {\"text\": \"Three barrels left.\"}, {\"text\": \"Still three.\"}]";
        InnkeeperDemo demo = go.AddComponent<InnkeeperDemo>();
        var sw = Stopwatch.StartNew();
        while (demo.lastAnswer == "" && sw.ElapsedMilliseconds < 20000) await Frames(1);
        Check("sample: the innkeeper answers after the game ran its tool", demo.lastAnswer == "Three barrels left." && demo.toolCalls == 1,
            () => demo.lastAnswer + " / tool calls " + demo.toolCalls);
        StubRuntime.Click("Ask");
        sw.Restart();
        while (demo.lastAnswer == "Three barrels left." && sw.ElapsedMilliseconds < 20000) await Frames(1);
        Check("sample: the Ask button asks again", demo.lastAnswer == "Still three.", () => demo.lastAnswer);
        Check("sample: no errors logged", StubRuntime.Errors.Count == 0, () => string.Join(" | ", StubRuntime.Errors));
    }

    // ------------------------------------------------------------------ the game for the SIGKILL test

    static int Game(string pidFile, string root)
    {
        _root = root;
        _python = Path.Combine(root, ".venv", "bin", "python");
        _tmp = Path.GetTempPath();
        Player.Run(async () =>
        {
            Reset();
            OamNpc npc = Npc("Victim", "victim");
            await npc.ReadyAsync();
            string text = await npc.SayAsync("hello");
            File.WriteAllText(pidFile + ".tmp", npc.Client.ProcessId + "\n");
            File.Move(pidFile + ".tmp", pidFile);
            Console.WriteLine("game: bridge " + npc.Client.ProcessId + " said " + text + "; running until killed");
            await new TaskCompletionSource<bool>().Task; // runs frames until SIGKILL
        });
        return 0;
    }
}

/// <summary>The "main thread": a SynchronizationContext drained between frames, like Unity's player loop.</summary>
static class Player
{
    static readonly BlockingCollection<Action> Queue = new BlockingCollection<Action>();
    static readonly List<(int left, TaskCompletionSource<bool> done)> Waiting = new List<(int, TaskCompletionSource<bool>)>();

    sealed class Context : SynchronizationContext
    {
        public override void Post(SendOrPostCallback d, object state) => Queue.Add(() => d(state));
        public override void Send(SendOrPostCallback d, object state) => throw new NotSupportedException();
    }

    public static Task Frames(int n)
    {
        var tcs = new TaskCompletionSource<bool>();
        Waiting.Add((n, tcs));
        return tcs.Task;
    }

    public static void Run(Func<Task> body)
    {
        SynchronizationContext.SetSynchronizationContext(new Context());
        Task task = body();
        while (!task.IsCompleted)
        {
            while (Queue.TryTake(out Action a, 5)) a();
            StubRuntime.Frame();
            for (int i = Waiting.Count - 1; i >= 0; i--)
            {
                var (left, done) = Waiting[i];
                if (left <= 1) { Waiting.RemoveAt(i); done.SetResult(true); }
                else Waiting[i] = (left - 1, done);
            }
        }
        while (Queue.TryTake(out Action rest)) rest();
        task.GetAwaiter().GetResult();
    }
}
