// Stubs of the UnityEditor build API that Editor/ uses, copied in shape from Unity's C# reference
// source (github.com/Unity-Technologies/UnityCsReference, 6000.x: Editor/Mono/BuildPipeline/
// BuildTarget.cs, BuildTargetGroup.cs, BuildPipelineInterfaces.cs, BuildFailedException.cs;
// Modules/BuildReportingEditor/Managed/BuildReport.bindings.cs, BuildSummary.cs, BuildResult.cs;
// Editor/Mono/BuildPlayerWindowBuildMethods.cs's BuildPlayerOptions; Editor/Mono/BuildPipeline/
// BuildPlayerContext.cs and BuildPlayerProcessor (2021.2+)). Enum values are Unity's. StubBuild is
// NOT Unity API: the tests use it to make a report and to play Unity's part of a build.
using System;
using System.Collections.Generic;
using System.IO;
using UnityEditor.Build.Reporting;

namespace UnityEditor
{
    public enum BuildTarget
    {
        StandaloneOSX = 2,
        StandaloneWindows = 5,
        iOS = 9,
        Android = 13,
        StandaloneWindows64 = 19,
        WebGL = 20,
        WSAPlayer = 21,
        StandaloneLinux64 = 24,
        PS4 = 31,
        XboxOne = 33,
        tvOS = 37,
        Switch = 38,
        GameCoreXboxSeries = 42,
        GameCoreXboxOne = 43,
        PS5 = 44,
        EmbeddedLinux = 45,
        QNX = 46,
        VisionOS = 47,
        NoTarget = -2,
    }

    public enum BuildTargetGroup
    {
        Unknown = 0,
        Standalone = 1,
        iOS = 4,
        Android = 7,
        WebGL = 13,
    }
}

namespace UnityEditor
{
    public struct BuildPlayerOptions
    {
        public string[] scenes { get; set; }
        public string locationPathName { get; set; }
        public BuildTarget target { get; set; }
    }
}

namespace UnityEditor.Build
{
    public interface IOrderedCallback
    {
        int callbackOrder { get; }
    }

    /// <summary>Unity 2021.2+: a callback before a player build starts.</summary>
    public abstract class BuildPlayerProcessor : IOrderedCallback
    {
        public virtual int callbackOrder => 0;
        public abstract void PrepareForBuild(BuildPlayerContext buildPlayerContext);
    }

    public sealed class BuildPlayerContext
    {
        internal BuildPlayerContext(BuildPlayerOptions options) { BuildPlayerOptions = options; }
        public BuildPlayerOptions BuildPlayerOptions { get; }
        // NOT Unity API (test-only): (path, pathInStreamingAssets) as Unity keeps them for the build
        public readonly List<KeyValuePair<string, string>> Added = new List<KeyValuePair<string, string>>();

        public void AddAdditionalPathToStreamingAssets(string directoryOrFile, string pathInStreamingAssets = "")
        {
            if (!File.Exists(directoryOrFile) && !Directory.Exists(directoryOrFile))
                throw new ArgumentException("Path " + directoryOrFile + " does not exist");
            Added.Add(new KeyValuePair<string, string>(directoryOrFile, pathInStreamingAssets));
        }
    }

    public interface IPreprocessBuildWithReport : IOrderedCallback
    {
        void OnPreprocessBuild(BuildReport report);
    }

    public interface IPostprocessBuildWithReport : IOrderedCallback
    {
        void OnPostprocessBuild(BuildReport report);
    }

    public class BuildFailedException : Exception
    {
        public BuildFailedException(string message) : base(message) { }
        public BuildFailedException(Exception innerException) : base(null, innerException) { }
    }
}

namespace UnityEditor.Build.Reporting
{
    public enum BuildResult
    {
        Unknown = 0,
        Succeeded = 1,
        Failed = 2,
        Cancelled = 3,
        Pending = 4
    }

    public struct BuildSummary
    {
        internal BuildTarget m_Platform;
        internal BuildTargetGroup m_PlatformGroup;
        internal string m_OutputPath;
        internal BuildResult m_Result;

        public BuildTarget platform { get { return m_Platform; } }
        public BuildTargetGroup platformGroup { get { return m_PlatformGroup; } }
        public string outputPath { get { return m_OutputPath; } }
        public BuildResult result { get { return m_Result; } }
    }

    public sealed class BuildReport : UnityEngine.Object
    {
        private BuildReport() { }
        internal BuildSummary m_Summary;
        public BuildSummary summary { get { return m_Summary; } }

        internal static BuildReport Make(BuildSummary summary) => new BuildReport { m_Summary = summary };
    }

    /// <summary>Test-only (not Unity API): a report as a player build of this target to this path passes it.</summary>
    public static class StubBuild
    {
        public static UnityEditor.Build.BuildPlayerContext Context(BuildTarget platform, string outputPath) =>
            new UnityEditor.Build.BuildPlayerContext(new BuildPlayerOptions { target = platform, locationPathName = outputPath });

        /// <summary>Unity's part: the paths the context was given, copied into the player's StreamingAssets.</summary>
        public static void CopyStreamingAssets(UnityEditor.Build.BuildPlayerContext context, string streamingAssets)
        {
            foreach (var added in context.Added)
            {
                string to = Path.Combine(streamingAssets, added.Value);
                if (File.Exists(added.Key)) { Directory.CreateDirectory(Path.GetDirectoryName(to)); File.Copy(added.Key, to, true); }
                else CopyTree(added.Key, to);
            }
        }

        static void CopyTree(string from, string to)
        {
            Directory.CreateDirectory(to);
            foreach (string f in Directory.GetFiles(from)) File.Copy(f, Path.Combine(to, Path.GetFileName(f)), true);
            foreach (string d in Directory.GetDirectories(from)) CopyTree(d, Path.Combine(to, Path.GetFileName(d)));
        }

        public static BuildReport Report(BuildTarget platform, string outputPath, BuildResult result = BuildResult.Unknown) =>
            BuildReport.Make(new BuildSummary
            {
                m_Platform = platform,
                m_PlatformGroup = platform == BuildTarget.Android ? BuildTargetGroup.Android
                    : platform == BuildTarget.WebGL ? BuildTargetGroup.WebGL
                    : platform == BuildTarget.iOS ? BuildTargetGroup.iOS : BuildTargetGroup.Standalone,
                m_OutputPath = outputPath,
                m_Result = result,
            });
    }
}
