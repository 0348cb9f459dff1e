using System;
using System.Collections.Concurrent;
using UnityEngine;

namespace Oam.Bridge.Unity
{
    /// <summary>
    /// Runs actions posted from any thread on Unity's main thread, in order, in <c>Update</c>.
    /// <see cref="OamBridgeHost"/> sets <c>OamBridgeClient.Dispatch = MainThreadDispatcher.Post</c>.
    /// </summary>
    [DefaultExecutionOrder(-1000)]
    public sealed class MainThreadDispatcher : MonoBehaviour
    {
        static readonly ConcurrentQueue<Action> Queue = new ConcurrentQueue<Action>();
        static MainThreadDispatcher _instance;

        /// <summary>Queues an action for the main thread; safe from any thread.</summary>
        public static void Post(Action action)
        {
            if (action == null) throw new ArgumentNullException(nameof(action));
            Queue.Enqueue(action);
        }

        /// <summary>Creates the dispatcher's GameObject if needed. Main thread only.</summary>
        public static void EnsureExists()
        {
            if (_instance != null) return;
            var go = new GameObject("OamBridge MainThreadDispatcher");
            DontDestroyOnLoad(go);
            _instance = go.AddComponent<MainThreadDispatcher>();
        }

        [RuntimeInitializeOnLoadMethod(RuntimeInitializeLoadType.SubsystemRegistration)]
        static void ResetStatics() // for "Enter Play Mode" without a domain reload
        {
            _instance = null;
            while (Queue.TryDequeue(out _)) { }
        }

        [RuntimeInitializeOnLoadMethod(RuntimeInitializeLoadType.BeforeSceneLoad)]
        static void CreateAtStartup() => EnsureExists();

        void Update()
        {
            // only what was queued before this frame's drain began: actions that post more run next frame
            for (int n = Queue.Count; n > 0 && Queue.TryDequeue(out Action action); n--)
            {
                try { action(); }
                catch (Exception e) { Debug.LogException(e, this); }
            }
        }

        void OnDestroy()
        {
            if (_instance == this) _instance = null;
        }
    }
}
