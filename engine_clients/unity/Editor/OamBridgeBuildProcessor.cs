using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using Oam.Bridge.Unity;
using UnityEditor;
using UnityEditor.Build;
using UnityEditor.Build.Reporting;
using Debug = UnityEngine.Debug;

namespace Oam.Bridge.Unity.EditorBuild
{
    /// <summary>
    /// Ships the bridge with a desktop player build (Unity 2021.2+). Before the build
    /// (<see cref="PrepareForBuild"/>) it checks that the project holds a dist for the target
    /// (<c>OamBridge/&lt;os&gt;-&lt;arch&gt;/oam-bridge[.exe]</c> beside <c>Assets</c>, i.e. <c>make dist</c>'s
    /// <c>dist/oam-bridge</c> folder, one per platform; the environment variable
    /// <c>OAM_BRIDGE_DIST_ROOT</c> names another folder of that shape) and fails the build with
    /// instructions if not; then it hands every dist of the target's OS (e.g. <c>windows-x64</c> and
    /// <c>windows-arm64</c>) to Unity with <c>BuildPlayerContext.AddAdditionalPathToStreamingAssets</c>, as
    /// <c>StreamingAssets/oam-bridge/&lt;platform&gt;/</c>, where <see cref="OamBridgeLocation"/> finds it at run
    /// time: Unity copies it into the player itself, before it signs a macOS app, and into an Xcode
    /// project export too. After the build (<see cref="OnPostprocessBuild"/>) the shipped executables get
    /// their executable bit back where the player's StreamingAssets can be found (a build made on macOS
    /// or Linux). Dists already under <c>Assets/StreamingAssets/oam-bridge</c> are shipped by Unity as
    /// assets and are not added again. <c>OAM_BRIDGE_SKIP_DIST=1</c> turns the step off (a game that
    /// starts the bridge some other way). Mobile, web and console targets only get a warning: they
    /// cannot start subprocesses.
    /// </summary>
    public sealed class OamBridgeBuildProcessor : BuildPlayerProcessor, IPostprocessBuildWithReport
    {
        public override int callbackOrder => 0;

        public override void PrepareForBuild(BuildPlayerContext context)
        {
            if (Skipped()) return;
            BuildTarget target = context.BuildPlayerOptions.target;
            string os = OsOf(target);
            if (os == null)
            {
                Debug.LogWarning("oam-bridge: " + target + " cannot start subprocesses (only Windows, macOS and Linux "
                                 + "desktops can), so OamNpc will not work in this build");
                return;
            }
            List<string> dists = DistsFor(os, SourceRoot());
            if (dists.Count == 0 && DistsFor(os, ProjectStreamingAssets()).Count == 0)
                throw new BuildFailedException("oam-bridge: no bridge for " + target + ": run `make dist` on " + os
                    + " and copy dist/oam-bridge/ to " + Path.Combine(SourceRoot(), os + "-<arch>") + " (e.g. " + os
                    + "-x64), so that " + Path.Combine(SourceRoot(), os + "-x64", OamBridgeLocation.ExecutableName(os + "-x64"))
                    + " exists; or set OAM_BRIDGE_SKIP_DIST=1 if the game starts the bridge another way");
            foreach (string dist in dists)
            {
                string inStreamingAssets = OamBridgeLocation.FolderName + "/" + Path.GetFileName(dist);
                context.AddAdditionalPathToStreamingAssets(dist, inStreamingAssets);
                Debug.Log("oam-bridge: shipping " + dist + " as StreamingAssets/" + inStreamingAssets);
            }
        }

        public void OnPostprocessBuild(BuildReport report)
        {
            if (Skipped()) return;
            BuildTarget target = report.summary.platform;
            string os = OsOf(target);
            if (os == null) return;
            string streamingAssets = PlayerStreamingAssets(target, report.summary.outputPath);
            if (streamingAssets == null) return; // an Xcode project: its build keeps the files' modes
            foreach (string dist in DistsFor(os, Path.Combine(streamingAssets, OamBridgeLocation.FolderName)))
                MakeExecutable(Path.Combine(dist, OamBridgeLocation.ExecutableName(Path.GetFileName(dist))));
        }

        static bool Skipped() => Environment.GetEnvironmentVariable("OAM_BRIDGE_SKIP_DIST") == "1";

        /// <summary><c>windows</c>, <c>macos</c>, <c>linux</c> for desktop targets; null for the rest.</summary>
        public static string OsOf(BuildTarget target)
        {
            switch (target)
            {
                case BuildTarget.StandaloneWindows:
                case BuildTarget.StandaloneWindows64: return "windows";
                case BuildTarget.StandaloneOSX: return "macos";
                case BuildTarget.StandaloneLinux64: return "linux";
                default: return null;
            }
        }

        /// <summary>Where the dists come from: <c>OAM_BRIDGE_DIST_ROOT</c>, else the project's <c>OamBridge</c> folder.</summary>
        public static string SourceRoot()
        {
            string root = Environment.GetEnvironmentVariable("OAM_BRIDGE_DIST_ROOT");
            if (!string.IsNullOrEmpty(root)) return root;
            string project = Path.GetDirectoryName(UnityEngine.Application.dataPath.TrimEnd('/', '\\'));
            return Path.Combine(project ?? "", OamBridgeLocation.ProjectDistFolder);
        }

        static string ProjectStreamingAssets() =>
            Path.Combine(UnityEngine.Application.dataPath, "StreamingAssets", OamBridgeLocation.FolderName);

        /// <summary>Folders <c>root/&lt;os&gt;-*</c> that hold the executable.</summary>
        public static List<string> DistsFor(string os, string root)
        {
            if (string.IsNullOrEmpty(root) || !Directory.Exists(root)) return new List<string>();
            return Directory.GetDirectories(root, os + "-*")
                .Where(d => File.Exists(Path.Combine(d, OamBridgeLocation.ExecutableName(Path.GetFileName(d)))))
                .OrderBy(d => d, StringComparer.Ordinal).ToList();
        }

        /// <summary>
        /// The built player's StreamingAssets folder: <c>Game_Data/StreamingAssets</c> beside
        /// <c>Game.exe</c> / <c>Game.x86_64</c>, <c>Game.app/Contents/Resources/Data/StreamingAssets</c> on
        /// macOS; null for an Xcode project export.
        /// </summary>
        public static string PlayerStreamingAssets(BuildTarget target, string outputPath)
        {
            if (string.IsNullOrEmpty(outputPath)) return null;
            string path = outputPath.TrimEnd('/', '\\');
            if (target == BuildTarget.StandaloneOSX)
                return path.EndsWith(".app", StringComparison.OrdinalIgnoreCase)
                    ? Path.Combine(path, "Contents", "Resources", "Data", "StreamingAssets") : null;
            string dir = Path.GetDirectoryName(path) ?? "";
            return Path.Combine(dir, Path.GetFileNameWithoutExtension(path) + "_Data", "StreamingAssets");
        }

        // a build made on macOS or Linux: keep the executable bit (Windows targets do not need it)
        static void MakeExecutable(string path)
        {
            if (Path.DirectorySeparatorChar == '\\' || !File.Exists("/bin/chmod")) return;
            using (var chmod = Process.Start(new ProcessStartInfo("/bin/chmod", "+x \"" + path + "\"") { UseShellExecute = false }))
                chmod?.WaitForExit();
        }
    }
}
