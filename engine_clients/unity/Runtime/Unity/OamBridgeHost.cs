using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading.Tasks;
using UnityEngine;

namespace Oam.Bridge.Unity
{
    /// <summary>
    /// One shared, initialized bridge per command line, reference-counted by the <see cref="OamNpc"/>
    /// components that use it: the last <see cref="Release"/> (or quitting, or leaving play mode)
    /// closes the bridge's stdin and it exits. A start that fails is not kept (the next acquire
    /// starts the bridge again), and neither is a bridge that exited or crashed. Main thread only.
    /// </summary>
    public static class OamBridgeHost
    {
        sealed class Entry
        {
            public string Key;
            public OamBridgeClient Client;
            public Task<OamBridgeClient> Ready;
            public int References;
        }

        // the bridge each command line gets now; a failed or exited bridge leaves it at once
        static readonly Dictionary<string, Entry> Current = new Dictionary<string, Entry>();
        // every bridge still referenced (or current), to release and dispose
        static readonly Dictionary<OamBridgeClient, Entry> Live = new Dictionary<OamBridgeClient, Entry>();

        /// <summary>How many bridges this host has running (started and not yet released or exited).</summary>
        public static int Count => Live.Keys.Count(c => c.IsRunning);

        /// <summary>
        /// Starts (once) and initializes the bridge for this command; each successful call needs one
        /// <see cref="Release"/>. If the start fails, the reference is already dropped and the
        /// failure is not cached.
        /// </summary>
        public static async Task<OamBridgeClient> AcquireAsync(string executable, string arguments, string workingDirectory)
        {
            string key = executable + "\n" + arguments + "\n" + workingDirectory;
            if (Current.TryGetValue(key, out Entry entry) && (!entry.Client.IsRunning || entry.Ready.IsFaulted || entry.Ready.IsCanceled))
            {
                Current.Remove(key); // crashed or failed: the next one starts afresh
                entry = null;
            }
            if (entry == null)
            {
                MainThreadDispatcher.EnsureExists();
                var client = OamBridgeClient.Start(executable, arguments, workingDirectory,
                    line => Debug.Log("[oam-bridge] " + line)); // Debug.Log is thread-safe
                client.Dispatch = MainThreadDispatcher.Post;
                entry = new Entry { Key = key, Client = client };
                Current[key] = entry;
                Live[client] = entry;
                entry.Ready = InitializeAsync(entry);
                _ = client.WaitForExitAsync().ContinueWith(_ => MainThreadDispatcher.Post(() => Exited(entry)),
                    TaskScheduler.Default);
            }
            entry.References++;
            try
            {
                return await entry.Ready;
            }
            catch
            {
                Release(entry.Client);
                throw;
            }
        }

        static async Task<OamBridgeClient> InitializeAsync(Entry entry)
        {
            try
            {
                await entry.Client.InitializeAsync(Application.productName, Application.version);
                return entry.Client;
            }
            catch
            {
                Forget(entry);
                throw;
            }
        }

        // the bridge exited: new acquires start a new one; its users see IsRunning false and release it
        static void Exited(Entry entry) => Forget(entry);

        static void Forget(Entry entry)
        {
            if (Current.TryGetValue(entry.Key, out Entry current) && current == entry) Current.Remove(entry.Key);
        }

        /// <summary>Drops one reference; the last one disposes the client (the bridge exits).</summary>
        public static void Release(OamBridgeClient client)
        {
            if (client == null || !Live.TryGetValue(client, out Entry entry)) return;
            if (--entry.References > 0) return;
            Live.Remove(client);
            Forget(entry);
            client.Dispose();
        }

        /// <summary>Closes every bridge (called when the application quits or play mode ends).</summary>
        public static void DisposeAll()
        {
            foreach (var client in Live.Keys.ToList()) client.Dispose();
            Live.Clear();
            Current.Clear();
        }

        [RuntimeInitializeOnLoadMethod(RuntimeInitializeLoadType.SubsystemRegistration)]
        static void Hook()
        {
            DisposeAll(); // "Enter Play Mode" without a domain reload keeps statics
            Application.quitting -= DisposeAll;
            Application.quitting += DisposeAll;
        }
    }
}
