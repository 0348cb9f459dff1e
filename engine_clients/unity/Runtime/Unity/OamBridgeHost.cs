using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using UnityEngine;

namespace Oam.Bridge.Unity
{
    /// <summary>
    /// One shared, initialized bridge per command line, reference-counted by the <see cref="OamNpc"/>
    /// components that use it: the last <see cref="Release"/> (or quitting, or leaving play mode)
    /// closes the bridge's stdin and it exits. Main thread only.
    /// </summary>
    public static class OamBridgeHost
    {
        sealed class Entry
        {
            public OamBridgeClient Client;
            public Task<OamBridgeClient> Ready;
            public int References;
        }

        static readonly Dictionary<string, Entry> Entries = new Dictionary<string, Entry>();

        /// <summary>Starts (once) and initializes the bridge; each call needs one <see cref="Release"/>.</summary>
        public static Task<OamBridgeClient> AcquireAsync(string executable, string arguments, string workingDirectory)
        {
            string key = executable + "\n" + arguments + "\n" + workingDirectory;
            if (!Entries.TryGetValue(key, out Entry entry))
            {
                MainThreadDispatcher.EnsureExists();
                var client = OamBridgeClient.Start(executable, arguments, workingDirectory,
                    line => Debug.Log("[oam-bridge] " + line)); // Debug.Log is thread-safe
                client.Dispatch = MainThreadDispatcher.Post;
                entry = new Entry { Client = client, Ready = InitializeAsync(client) };
                Entries[key] = entry;
            }
            entry.References++;
            return entry.Ready;
        }

        static async Task<OamBridgeClient> InitializeAsync(OamBridgeClient client)
        {
            await client.InitializeAsync(Application.productName, Application.version);
            return client;
        }

        /// <summary>Drops one reference; the last one disposes the client (the bridge exits).</summary>
        public static void Release(OamBridgeClient client)
        {
            foreach (var kv in Entries)
            {
                if (kv.Value.Client != client) continue;
                if (--kv.Value.References <= 0)
                {
                    Entries.Remove(kv.Key);
                    client.Dispose();
                }
                return;
            }
        }

        /// <summary>Closes every bridge (called when the application quits or play mode ends).</summary>
        public static void DisposeAll()
        {
            foreach (var entry in Entries.Values) entry.Client.Dispose();
            Entries.Clear();
        }

        [RuntimeInitializeOnLoadMethod(RuntimeInitializeLoadType.SubsystemRegistration)]
        static void Hook()
        {
            Entries.Clear();
            Application.quitting -= DisposeAll;
            Application.quitting += DisposeAll;
        }
    }
}
