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
    /// Ships the bridge with a desktop player build. Before the build it checks that the project
    /// holds a dist for the target (<c>OamBridge/&lt;os&gt;-&lt;arch&gt;/oam-bridge[.exe]</c> beside
    /// <c>Assets</c>, i.e. <c>make dist</c>'s <c>dist/oam-bridge</c> folder, one per platform; the
    /// environment variable <c>OAM_BRIDGE_DIST_ROOT</c> names another folder of that shape) and fails
    /// the build with instructions if not; after the build it copies every dist of the target's OS
    /// (e.g. <c>windows-x64</c> and <c>windows-arm64</c>) into the player's
    /// <c>StreamingAssets/oam-bridge/</c>, where <see cref="OamBridgeLocation"/> finds it at run time.
    /// Dists already under <c>Assets/StreamingAssets/oam-bridge</c> are shipped by Unity itself and
    /// are not copied again. <c>OAM_BRIDGE_SKIP_DIST=1</c> turns the step off (a game that starts the
    /// bridge some other way). Mobile, web and console targets only get a warning: they cannot start
    /// subprocesses.
    /// </summary>
    public sealed class OamBridgeBuildProcessor : IPreprocessBuildWithReport, IPostprocessBuildWithReport
    {
        public int callbackOrder => 0;

        public void OnPreprocessBuild(BuildReport report)
        {
            if (Skipped()) return;
            BuildTarget target = report.summary.platform;
            string os = OsOf(target);
            if (os == null)
            {
                Debug.LogWarning("oam-bridge: " + target + " cannot start subprocesses (only Windows, macOS and Linux "
                                 + "desktops can), so OamNpc will not work in this build");
                return;
            }
            if (DistsFor(os, SourceRoot()).Count == 0 && DistsFor(os, ProjectStreamingAssets()).Count == 0)
                throw new BuildFailedException("oam-bridge: no bridge for " + target + ": run `make dist` on " + os
                    + " and copy dist/oam-bridge/ to " + Path.Combine(SourceRoot(), os + "-<arch>") + " (e.g. " + os
                    + "-x64), so that " + Path.Combine(SourceRoot(), os + "-x64", OamBridgeLocation.ExecutableName(os + "-x64"))
                    + " exists; or set OAM_BRIDGE_SKIP_DIST=1 if the game starts the bridge another way");
        }

        public void OnPostprocessBuild(BuildReport report)
        {
            if (Skipped()) return;
            BuildTarget target = report.summary.platform;
            string os = OsOf(target);
            if (os == null) return;
            List<string> dists = DistsFor(os, SourceRoot());
            if (dists.Count == 0) return; // shipped from Assets/StreamingAssets (checked before the build)
            string streamingAssets = PlayerStreamingAssets(target, report.summary.outputPath);
            if (streamingAssets == null)
            {
                Debug.LogWarning("oam-bridge: cannot tell where " + report.summary.outputPath + " keeps StreamingAssets; "
                                 + "copy the dist to StreamingAssets/oam-bridge/<platform>/ yourself");
                return;
            }
            foreach (string dist in dists)
            {
                string platform = Path.GetFileName(dist);
                string destination = Path.Combine(streamingAssets, OamBridgeLocation.FolderName, platform);
                if (Directory.Exists(destination)) Directory.Delete(destination, true);
                CopyDirectory(dist, destination);
                MakeExecutable(Path.Combine(destination, OamBridgeLocation.ExecutableName(platform)));
                Debug.Log("oam-bridge: shipped " + dist + " as " + destination);
            }
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

        static void CopyDirectory(string source, string destination)
        {
            Directory.CreateDirectory(destination);
            foreach (string file in Directory.GetFiles(source))
                File.Copy(file, Path.Combine(destination, Path.GetFileName(file)), true);
            foreach (string dir in Directory.GetDirectories(source))
                CopyDirectory(dir, Path.Combine(destination, Path.GetFileName(dir)));
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
