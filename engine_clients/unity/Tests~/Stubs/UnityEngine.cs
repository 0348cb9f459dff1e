// Stubs of the UnityEngine API that Runtime/Unity, Editor/ and Samples~ use, so run_tests.sh can
// compile them with Mono. Declarations are copied in shape (names, namespaces, signatures,
// attribute targets, obsolete-as-error members) from Unity's C# reference source
// (github.com/Unity-Technologies/UnityCsReference, 6000.x: Runtime/Export/Scripting/*.bindings.cs,
// Runtime/Export/Application/Application*.cs, Runtime/Export/Debug/Debug.bindings.cs,
// Runtime/Export/PropertyDrawer/PropertyAttribute.cs, Runtime/Export/Serialization/Serialization.cs,
// Runtime/Export/Scripting/RuntimeInitializeOnLoadAttribute.cs, artifacts/generated/UnityEvent,
// Modules/IMGUI/GUILayout.cs). Bodies are not Unity's: they are just enough to play a component's
// life (Awake, OnEnable, Start, Update, OnApplicationQuit, OnDestroy) from StubRuntime, which is
// NOT Unity API and exists only for the tests.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Reflection;

namespace UnityEngine.Scripting
{
    [AttributeUsage(AttributeTargets.Assembly | AttributeTargets.Class | AttributeTargets.Struct | AttributeTargets.Enum
                    | AttributeTargets.Constructor | AttributeTargets.Method | AttributeTargets.Property | AttributeTargets.Field
                    | AttributeTargets.Event | AttributeTargets.Interface | AttributeTargets.Delegate, Inherited = false)]
    public class PreserveAttribute : Attribute { }
}

namespace UnityEngine.Events
{
    public delegate void UnityAction();
    public delegate void UnityAction<T0>(T0 arg0);

    [Serializable]
    public abstract class UnityEventBase
    {
        public void RemoveAllListeners() => Calls.Clear();
        internal readonly List<Delegate> Calls = new List<Delegate>();
    }

    [Serializable]
    public class UnityEvent : UnityEventBase
    {
        public UnityEvent() { }
        public void AddListener(UnityAction call) => Calls.Add(call);
        public void RemoveListener(UnityAction call) => Calls.Remove(call);
        public void Invoke() { foreach (UnityAction c in Calls.ToArray()) c(); }
    }

    [Serializable]
    public class UnityEvent<T0> : UnityEventBase
    {
        public UnityEvent() { }
        public void AddListener(UnityAction<T0> call) => Calls.Add(call);
        public void RemoveListener(UnityAction<T0> call) => Calls.Remove(call);
        public void Invoke(T0 arg0) { foreach (UnityAction<T0> c in Calls.ToArray()) c(arg0); }
    }
}

namespace UnityEngine
{
    // ---------------------------------------------------------------- attributes

    [AttributeUsage(AttributeTargets.Field)]
    public sealed partial class SerializeField : Attribute { }

    [AttributeUsage(AttributeTargets.Field, Inherited = true, AllowMultiple = false)]
    public sealed class HideInInspector : Attribute { }

    [AttributeUsage(AttributeTargets.Field | AttributeTargets.Property, Inherited = true, AllowMultiple = false)]
    public abstract class PropertyAttribute : Attribute
    {
        protected PropertyAttribute() { }
        protected PropertyAttribute(bool applyToCollection) { this.applyToCollection = applyToCollection; }
        public int order { get; set; }
        public bool applyToCollection { get; }
    }

    [AttributeUsage(AttributeTargets.All, Inherited = true, AllowMultiple = false)]
    public class TooltipAttribute : PropertyAttribute
    {
        public readonly string tooltip;
        public TooltipAttribute(string tooltip) { this.tooltip = tooltip; }
    }

    [AttributeUsage(AttributeTargets.Field | AttributeTargets.Property, Inherited = true, AllowMultiple = true)]
    public class HeaderAttribute : PropertyAttribute
    {
        public readonly string header;
        public HeaderAttribute(string header) : base(applyToCollection: true) { this.header = header; }
    }

    [AttributeUsage(AttributeTargets.Field | AttributeTargets.Property, Inherited = true, AllowMultiple = false)]
    public sealed class TextAreaAttribute : PropertyAttribute
    {
        public readonly int minLines;
        public readonly int maxLines;
        public TextAreaAttribute() { minLines = 3; maxLines = 3; }
        public TextAreaAttribute(int minLines, int maxLines) { this.minLines = minLines; this.maxLines = maxLines; }
    }

    [AttributeUsage(AttributeTargets.Class)]
    public class DefaultExecutionOrder : Attribute
    {
        public DefaultExecutionOrder(int order) { m_Order = order; }
        public int order { get { return m_Order; } }
        int m_Order;
    }

    [AttributeUsage(AttributeTargets.Class, Inherited = false)]
    public sealed class DisallowMultipleComponent : Attribute { }

    public sealed class AddComponentMenu : Attribute
    {
        public AddComponentMenu(string menuName) { componentMenu = menuName; }
        public AddComponentMenu(string menuName, int order) { componentMenu = menuName; componentOrder = order; }
        public string componentMenu { get; }
        public int componentOrder { get; }
    }

    public enum RuntimeInitializeLoadType
    {
        AfterSceneLoad = 0,
        BeforeSceneLoad,
        AfterAssembliesLoaded,
        BeforeSplashScreen,
        SubsystemRegistration
    }

    [AttributeUsage(AttributeTargets.Method, AllowMultiple = false)]
    public class RuntimeInitializeOnLoadMethodAttribute : Scripting.PreserveAttribute
    {
        public RuntimeInitializeOnLoadMethodAttribute() { this.loadType = RuntimeInitializeLoadType.AfterSceneLoad; }
        public RuntimeInitializeOnLoadMethodAttribute(RuntimeInitializeLoadType loadType) { this.loadType = loadType; }
        public RuntimeInitializeLoadType loadType { get { return m_LoadType; } private set { m_LoadType = value; } }
        RuntimeInitializeLoadType m_LoadType;
    }

    // ---------------------------------------------------------------- objects

    public partial class Object
    {
        internal bool m_Destroyed;
        string m_Name = "";

        [Obsolete("GetInstanceID is deprecated. Use GetEntityId instead. This will be removed in a future version.", true)]
        public int GetInstanceID() => 0;

        public virtual string name { get { return m_Name; } set { m_Name = value; } }

        public override int GetHashCode() => base.GetHashCode();
        public override bool Equals(object other) => other is Object o ? this == o : other == null && m_Destroyed;
        public override string ToString() => name;

        public static implicit operator bool(Object exists) => !ReferenceEquals(exists, null) && !exists.m_Destroyed;

        public static bool operator ==(Object x, Object y)
        {
            bool xNull = ReferenceEquals(x, null) || x.m_Destroyed, yNull = ReferenceEquals(y, null) || y.m_Destroyed;
            if (xNull || yNull) return xNull && yNull;
            return ReferenceEquals(x, y);
        }

        public static bool operator !=(Object x, Object y) => !(x == y);

        public static void Destroy(Object obj) => StubRuntime.Destroy(obj);
        public static void Destroy(Object obj, float t) => StubRuntime.Destroy(obj);
        public static void DestroyImmediate(Object obj) => StubRuntime.Destroy(obj);
        public static void DontDestroyOnLoad(Object target) { }
    }

    public partial class Component : Object
    {
        internal GameObject m_GameObject;
        public GameObject gameObject { get { return m_GameObject; } }
        public override string name { get { return m_GameObject.name; } set { m_GameObject.name = value; } }
        public T GetComponent<T>() => m_GameObject.GetComponent<T>();
    }

    public class Behaviour : Component
    {
        public bool enabled { get; set; } = true;
        public bool isActiveAndEnabled => enabled && !m_Destroyed;
    }

    public class MonoBehaviour : Behaviour
    {
        public bool useGUILayout { get; set; } = true;
    }

    public sealed partial class GameObject : Object
    {
        internal readonly List<Component> m_Components = new List<Component>();

        public GameObject() : this("New Game Object") { }
        public GameObject(string name) { this.name = name; StubRuntime.Register(this); }

        public Component AddComponent(Type componentType)
        {
            var c = (Component)Activator.CreateInstance(componentType);
            c.m_GameObject = this;
            m_Components.Add(c);
            StubRuntime.Added(c);
            return c;
        }

        public T AddComponent<T>() where T : Component => (T)AddComponent(typeof(T));

        public T GetComponent<T>() => m_Components.Where(c => !c.m_Destroyed).OfType<T>().FirstOrDefault();
    }

    // ---------------------------------------------------------------- application, platform, logging

    public enum RuntimePlatform
    {
        OSXEditor = 0,
        OSXPlayer = 1,
        WindowsPlayer = 2,
        WindowsEditor = 7,
        IPhonePlayer = 8,
        Android = 11,
        LinuxPlayer = 13,
        LinuxEditor = 16,
        WebGLPlayer = 17,
        PS4 = 25,
        XboxOne = 27,
        tvOS = 31,
        Switch = 32,
        PS5 = 44,
    }

    public partial class Application
    {
        public static bool isPlaying => true;
        public static bool isEditor => StubRuntime.IsEditor;
        public static string dataPath => StubRuntime.DataPath;
        public static string streamingAssetsPath => StubRuntime.StreamingAssetsPath;
        public static string persistentDataPath => StubRuntime.PersistentDataPath;
        public static string version => "1.0";
        public static string productName => "StubGame";
        public static RuntimePlatform platform => StubRuntime.Platform;
        public static event Action quitting;
        public static void Quit() => StubRuntime.Quit();
        internal static void RaiseQuitting() => quitting?.Invoke();
    }

    public enum LogType { Error = 0, Assert = 1, Warning = 2, Log = 3, Exception = 4 }

    public partial class Debug
    {
        public static void Log(object message) => StubRuntime.Write(LogType.Log, message, null);
        public static void Log(object message, Object context) => StubRuntime.Write(LogType.Log, message, context);
        public static void LogWarning(object message) => StubRuntime.Write(LogType.Warning, message, null);
        public static void LogWarning(object message, Object context) => StubRuntime.Write(LogType.Warning, message, context);
        public static void LogError(object message) => StubRuntime.Write(LogType.Error, message, null);
        public static void LogError(object message, Object context) => StubRuntime.Write(LogType.Error, message, context);
        public static void LogException(Exception exception) => StubRuntime.Write(LogType.Exception, exception, null);
        public static void LogException(Exception exception, Object context) => StubRuntime.Write(LogType.Exception, exception, context);
    }

    // ---------------------------------------------------------------- IMGUI (the sample's UI)

    public partial struct Rect
    {
        public Rect(float x, float y, float width, float height) { m_XMin = x; m_YMin = y; m_Width = width; m_Height = height; }
        float m_XMin, m_YMin, m_Width, m_Height;
    }

    public sealed class GUILayoutOption { internal GUILayoutOption() { } }

    public class GUILayout
    {
        static public void Label(string text, params GUILayoutOption[] options) { }
        static public bool Button(string text, params GUILayoutOption[] options) => StubRuntime.PressButton(text);
        public static string TextField(string text, params GUILayoutOption[] options) => text;
        public static void BeginArea(Rect screenRect) { }
        public static void EndArea() { }
        public static GUILayoutOption Width(float width) => new GUILayoutOption();
    }

    // ---------------------------------------------------------------- the test's player loop (not Unity API)

    /// <summary>Plays components' messages the way the player loop does. Test-only; not in Unity.</summary>
    public static class StubRuntime
    {
        static readonly List<GameObject> Objects = new List<GameObject>();
        static readonly List<MonoBehaviour> Behaviours = new List<MonoBehaviour>();
        static readonly List<MonoBehaviour> NotStarted = new List<MonoBehaviour>();
        static readonly List<Object> ToDestroy = new List<Object>();
        static readonly HashSet<string> Pressed = new HashSet<string>();
        public static readonly List<string> Errors = new List<string>();
        public static readonly List<string> Logs = new List<string>();
        public static bool Verbose;

        public static bool IsEditor = true;
        public static RuntimePlatform Platform = RuntimePlatform.LinuxEditor;
        public static string DataPath = "/nonexistent/Assets";
        public static string StreamingAssetsPath = "/nonexistent/Assets/StreamingAssets";
        public static string PersistentDataPath = "/nonexistent/persistent";

        internal static void Register(GameObject go) => Objects.Add(go);

        internal static void Added(Component c)
        {
            if (!(c is MonoBehaviour b)) return;
            Behaviours.Add(b);
            Send(b, "Awake");
            Send(b, "OnEnable");
            NotStarted.Add(b);
        }

        /// <summary>Runs every loaded [RuntimeInitializeOnLoadMethod] of this load type.</summary>
        public static void RunInitializeOnLoadMethods(RuntimeInitializeLoadType type)
        {
            foreach (Assembly a in AppDomain.CurrentDomain.GetAssemblies())
            {
                Type[] types;
                try { types = a.GetTypes(); }
                catch (ReflectionTypeLoadException e) { types = e.Types.Where(t => t != null).ToArray(); }
                foreach (Type t in types)
                foreach (MethodInfo m in t.GetMethods(BindingFlags.Static | BindingFlags.Public | BindingFlags.NonPublic))
                {
                    var attr = m.GetCustomAttribute<RuntimeInitializeOnLoadMethodAttribute>();
                    if (attr != null && attr.loadType == type) m.Invoke(null, null);
                }
            }
        }

        /// <summary>One frame: Start for new behaviours, Update (by DefaultExecutionOrder), OnGUI, then deferred destroys.</summary>
        public static void Frame()
        {
            foreach (var b in NotStarted.ToArray())
            {
                NotStarted.Remove(b);
                if (!b.m_Destroyed) Send(b, "Start");
            }
            foreach (var b in Behaviours.Where(b => !b.m_Destroyed && b.enabled).OrderBy(Order).ToArray()) Send(b, "Update");
            foreach (var b in Behaviours.Where(b => !b.m_Destroyed && b.enabled).ToArray()) Send(b, "OnGUI");
            Pressed.Clear();
            foreach (var o in ToDestroy.ToArray()) DestroyNow(o);
            ToDestroy.Clear();
        }

        /// <summary>The next frame's OnGUI sees a click on the button with this text.</summary>
        public static void Click(string button) => Pressed.Add(button);
        internal static bool PressButton(string text) => Pressed.Remove(text);

        static int Order(MonoBehaviour b) => b.GetType().GetCustomAttribute<DefaultExecutionOrder>()?.order ?? 0;

        internal static void Destroy(Object obj)
        {
            if (!ReferenceEquals(obj, null) && !ToDestroy.Contains(obj)) ToDestroy.Add(obj);
        }

        static void DestroyNow(Object obj)
        {
            if (obj.m_Destroyed) return;
            if (obj is GameObject go)
            {
                foreach (var c in go.m_Components.ToArray()) DestroyNow(c);
                go.m_Destroyed = true;
                Objects.Remove(go);
                return;
            }
            if (obj is MonoBehaviour b)
            {
                Send(b, "OnDisable");
                Send(b, "OnDestroy");
                Behaviours.Remove(b);
                NotStarted.Remove(b);
            }
            obj.m_Destroyed = true;
        }

        /// <summary>Quitting: OnApplicationQuit on every behaviour, Application.quitting, then every object is destroyed.</summary>
        public static void Quit()
        {
            foreach (var b in Behaviours.ToArray()) Send(b, "OnApplicationQuit");
            Application.RaiseQuitting();
            foreach (var go in Objects.ToArray()) DestroyNow(go);
        }

        /// <summary>Leaves play mode / resets the domain-less statics between tests: destroys everything.</summary>
        public static void DestroyAll()
        {
            foreach (var go in Objects.ToArray()) DestroyNow(go);
            ToDestroy.Clear();
        }

        static void Send(MonoBehaviour b, string message)
        {
            MethodInfo m = null;
            for (Type t = b.GetType(); t != null && m == null && t != typeof(MonoBehaviour); t = t.BaseType)
                m = t.GetMethod(message, BindingFlags.Instance | BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.DeclaredOnly,
                    null, Type.EmptyTypes, null);
            if (m == null) return;
            try { m.Invoke(b, null); }
            catch (TargetInvocationException e) { Write(LogType.Exception, e.InnerException, b); }
        }

        internal static void Write(LogType type, object message, Object context)
        {
            string line = "[" + type + "] " + message;
            if (type == LogType.Error || type == LogType.Exception) lock (Errors) Errors.Add(line);
            lock (Logs) Logs.Add(line);
            if (Verbose || type != LogType.Log) Console.WriteLine("#   unity " + line);
        }
    }
}
